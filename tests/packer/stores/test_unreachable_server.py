"""A server that cannot be reached is not a damaged store.

``verify`` of a MongoDB store whose server is down says so in one line (exit code 1, a failure,
never ``BAD`` records or a problem count), within one read timeout (no second round of retries
through the salvage reader), and writes no verify sidecar claiming damage. A server lost in the
middle of a verify or a repair stops it; nothing read so far is turned into damage.

The closed port is found by binding a socket and closing it: nothing listens there, no network.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packer
from packer.core.errors import StoreError, UnreachableError
from packer.sample import make_dataset
from tests import REPO

pytest.importorskip("pymongo")



def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "MONGODB_URI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "packer", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    return proc, time.monotonic() - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_verify_says_the_server_cannot_be_reached(tmp_path, as_json):
    from packer.stores.mongo.reader import DEFAULT_READ_TIMEOUT_S

    loc = f"mongodb://127.0.0.1:{closed_port()}/db/train"
    proc, took = run_cli(tmp_path, "verify", loc, *(["--json"] if as_json else []))
    assert proc.returncode == 1, proc
    # one read timeout, plus the interpreter's start; the salvage reader's second round is gone
    assert took < DEFAULT_READ_TIMEOUT_S + 7, f"{took:.1f} s"
    text = proc.stdout + proc.stderr
    assert "BAD" not in text and "problem(s)" not in text, text
    if as_json:
        shown = json.loads(proc.stdout)
        assert shown["ok"] is False and shown["problems"] == [] and "cannot reach the MongoDB server" in shown["error"]
    else:
        assert proc.stdout == "", proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {loc}: cannot reach the MongoDB server"), lines
    assert not list(tmp_path.glob("*.verify.json")), "a verify sidecar was written for a store never read"


@pytest.mark.timeout(60)
def test_verify_raises_unreachable_within_one_timeout():
    loc = f"mongodb://127.0.0.1:{closed_port()}/db/train"
    t0 = time.monotonic()
    with pytest.raises(UnreachableError, match="cannot reach the MongoDB server") as err:
        packer.verify(loc, timeout=2, retries=1)
    took = time.monotonic() - t0
    assert isinstance(err.value, StoreError)      # a failure (exit code 1), as every StoreError
    assert took < 2 + 1.5, f"{took:.1f} s: more than one read timeout"


@pytest.fixture
def lmdb_store(tmp_path) -> str:
    images, _ = make_dataset(tmp_path / "src", 6, kind="classes", sizes=((32, 48),))
    out = str(tmp_path / "s.lmdb")
    packer.build(str(images), None, out, format="lmdb", workers=1)
    return out


def _server_lost(monkeypatch, after: int):
    """Make the LMDB reader behave as a server store whose server goes away after ``after`` reads."""
    from packer.stores.lmdb.reader import LMDBReader

    calls = {"n": 0}
    get, get_many = LMDBReader.get, LMDBReader.get_many

    def lost(*_):
        raise UnreachableError("mongodb://h/db/c: cannot reach the MongoDB server (injected)")

    def counted(fn):
        def wrapper(self, *args, **kwargs):
            calls["n"] += 1
            return fn(self, *args, **kwargs) if calls["n"] <= after else lost()
        return wrapper

    monkeypatch.setattr(LMDBReader, "get", counted(get))
    monkeypatch.setattr(LMDBReader, "get_many", counted(get_many))


@pytest.mark.timeout(120)
def test_server_lost_during_verify_is_no_damage(lmdb_store, monkeypatch):
    _server_lost(monkeypatch, after=0)
    with pytest.raises(UnreachableError):
        packer.verify(lmdb_store, batch=2)


@pytest.mark.timeout(120)
def test_server_lost_during_repair_loses_no_record(lmdb_store, monkeypatch):
    before = sorted(p.name for p in Path(lmdb_store).parent.iterdir())
    _server_lost(monkeypatch, after=2)
    with pytest.raises(UnreachableError):
        packer.repair(lmdb_store)
    monkeypatch.undo()
    assert sorted(p.name for p in Path(lmdb_store).parent.iterdir()) == before, "repair acted on a lost server"
    assert packer.verify(lmdb_store).ok
