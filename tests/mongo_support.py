"""Test helpers for the MongoDB store: find the test server, make and drop unique locations,
and start private server instances.

The server comes from ``scripts/mongo_server.sh start`` (MongoDB's own mongod 6.0.5, see the
script); its URI
is passed in ``PACKER_TEST_MONGO_URI``. Without it, Mongo tests skip, unless
``PACKER_REQUIRE_MONGO=1`` (CI, scripts/test.sh), where they fail.

Example (what the contract suite's ``store_location`` fixture does)::

    loc = mongo_support.new_store_location("roundtrip")   # mongodb://127.0.0.1:PORT/pk_.../roundtrip
    ...
    mongo_support.drop_location(loc)
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest

URI_ENV = "PACKER_TEST_MONGO_URI"
REQUIRE_ENV = "PACKER_REQUIRE_MONGO"
DB_PREFIX = "pk_test_"
REPO = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = REPO / "scripts" / "mongo_server.sh"

_checked: dict[str, str | None] = {}   # uri -> None when reachable, else why not
_counter = itertools.count()
_RUN = uuid.uuid4().hex[:8]


def _unavailable(reason: str):
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"MongoDB test server required ({REQUIRE_ENV}=1) but {reason}", pytrace=False)
    pytest.skip(f"no MongoDB test server: {reason} (start one with "
                f"`export {URI_ENV}=$(bash scripts/mongo_server.sh start)`)")


def _ping(uri: str, timeout_ms: int = 2000) -> str | None:
    try:
        import pymongo
    except ImportError:
        return "pymongo is not installed (pip install 'packer-vision[mongo]')"
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms)
    try:
        client.admin.command("ping")
        return None
    except pymongo.errors.PyMongoError as exc:
        return f"{uri} does not answer a ping: {str(exc).split(', Topology Description:')[0]}"
    finally:
        client.close()


def mongo_uri_or_skip() -> str:
    """The test server's URI (``mongodb://127.0.0.1:PORT``), after a quick ping.

    Skips the calling test when there is none, or fails it when ``PACKER_REQUIRE_MONGO=1``.
    """
    uri = os.environ.get(URI_ENV, "").strip().rstrip("/")
    if not uri:
        _unavailable(f"{URI_ENV} is not set")
    if uri not in _checked:
        _checked[uri] = _ping(uri)
    if _checked[uri] is not None:
        _unavailable(_checked[uri])
    return uri


#: How long a test waits for the shared test server to answer before it starts. The product's
#: own calls give a server 10 s (``packer.stores.mongo.ASK_TIMEOUT_MS``); a 2-core CI VM once
#: had the server answer nothing for longer than that at the start of a test, between two
#: tests that never touched it. A stall found here waits and is reported as a warning.
PATIENT_PING_MS = 60_000
SLOW_PING_S = 2.0


def _wait_until_answering(uri: str) -> None:
    """Ping the server with a patient timeout before a test uses it; a slow answer warns, none
    fails this test and every later one at once (the server is gone)."""
    t0 = time.monotonic()
    why = _ping(uri, PATIENT_PING_MS)
    took = time.monotonic() - t0
    if why is not None:
        _checked[uri] = why
        _unavailable(why)
    if took > SLOW_PING_S:
        warnings.warn(f"the MongoDB test server {uri} took {took:.1f} s to answer a ping "
                      "(a stalled machine or server: see its log)", stacklevel=3)


def new_store_location(name_hint: str = "store") -> str:
    """``<uri>/<unique db>/<collection>``: a fresh location no other test uses, on a server
    that has just answered a ping."""
    uri = mongo_uri_or_skip()
    _wait_until_answering(uri)
    coll = re.sub(r"[^A-Za-z0-9_]", "_", name_hint)[:40] or "store"
    db = f"{DB_PREFIX}{_RUN}_{next(_counter)}"
    return f"{uri}/{db}/{coll}"


def split_location(location: str) -> tuple[str, str, str]:
    """(server uri, db, collection) of a test location."""
    head, db, coll = location.rsplit("/", 2)
    return head, db, coll.split("?")[0]


def client_for(location: str):
    """A pymongo client on the location's server (close it when done), as patient as packer's
    administrative calls (``$PACKER_MONGO_TIMEOUT_MS``, else 5 s)."""
    import pymongo

    from packer.stores.mongo.connection import admin_timeout_ms

    timeout_ms = admin_timeout_ms(5000)   # $PACKER_MONGO_TIMEOUT_MS: scripts/test.sh gives 60 s
    return pymongo.MongoClient(split_location(location)[0], serverSelectionTimeoutMS=timeout_ms)


def drop_location(location: str) -> None:
    """Drop the database a location from :func:`new_store_location` lives in."""
    uri, db, _ = split_location(location)
    if not db.startswith(DB_PREFIX):
        raise ValueError(f"refusing to drop {db!r}: not a test database")
    if _ping(uri, 1000) is not None:
        return  # server already gone (e.g. a private instance that a test stopped)
    client = client_for(location)
    try:
        client.drop_database(db)
    finally:
        client.close()


class PrivateServer:
    """A mongod of its own (own ports, state dir and data), via the server script: a standalone
    server, a replica set (``members=3``) or one with access control (``auth_user``; the
    password comes from ``password``, passed through the environment, never the command line).

    Example::

        with PrivateServer(tmp_path / "srv") as srv:
            loc = f"{srv.uri}/db/coll"
            ...
            srv.kill()      # SIGKILL: the server "goes away"
    """

    def __init__(self, state_dir, members: int = 1, auth_user: str | None = None,
                 password: str | None = None):
        self.state_dir = Path(state_dir)
        self.members = members
        self.auth_user = auth_user
        self.password = password
        self.uri: str | None = None

    def _script(self, *args: str, timeout: float = 120) -> str:
        env = dict(os.environ)
        if self.password is not None:
            env["MONGO_PASSWORD"] = self.password
        proc = subprocess.run(["bash", str(SERVER_SCRIPT), "--dir", str(self.state_dir), *args],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"mongo_server.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc.stdout.strip()

    def start(self) -> "PrivateServer":
        args = ["start"]
        if self.members > 1:
            args += ["--replset", str(self.members)]
        if self.auth_user:
            args += ["--auth", self.auth_user]
        self.uri = self._script(*args)
        return self

    @property
    def pids(self) -> list[int]:
        return [int(p) for p in (self.state_dir / "server.pid").read_text().split()]

    @property
    def ports(self) -> list[int]:
        return [int(p) for p in (self.state_dir / "server.ports").read_text().split()]

    @property
    def pid(self) -> int:
        return self.pids[0]

    def kill(self, pid: int | None = None) -> None:
        """SIGKILL the server, or one member (no clean shutdown), as a crash or a lost host would."""
        import signal
        import time

        pid = self.pid if pid is None else pid
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ", 1)[1].startswith("Z"):
                        return
            except (FileNotFoundError, IndexError):
                return
            time.sleep(0.05)

    def primary_port(self, timeout: float = 30) -> int:
        """The port of the replica set's primary (waits for one, up to ``timeout`` s)."""
        import time

        import pymongo

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for port in self.ports:
                c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                        serverSelectionTimeoutMS=500, connectTimeoutMS=500)
                try:
                    if c.admin.command("hello").get("isWritablePrimary"):
                        return port
                except pymongo.errors.PyMongoError:
                    pass
                finally:
                    c.close()
            time.sleep(0.2)
        raise RuntimeError(f"no primary among {self.ports} within {timeout} s")

    def restart_member(self, port: int, timeout: float = 60) -> None:
        """Start a killed member again on its port and data (it rejoins the set)."""
        rundir = (self.state_dir / "server.rundir").read_text().strip()
        helper = [sys.executable, str(REPO / "scripts" / "mongo_server_helper.py")]
        pid = int(subprocess.run(
            helper + ["launch", str(MONGOD), rundir, str(port), "--replset", "rs0"],
            capture_output=True, text=True, timeout=timeout, check=True).stdout)
        pids = [pid if p == port else old for p, old in zip(self.ports, self.pids)]
        (self.state_dir / "server.pid").write_text("".join(f"{p}\n" for p in pids))
        subprocess.run(helper + ["wait-ready", str(port), str(timeout), str(pid)], timeout=timeout + 10,
                       check=True)

    def stop(self) -> None:
        if (self.state_dir / "server.pid").exists():
            self._script("stop")

    def __enter__(self) -> "PrivateServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().split(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return False


MONGOD = Path(os.environ.get("MONGOD") or REPO / ".mongod" / "bin" / "mongod")


def require_server_script() -> None:
    """Skip (or fail, when required) if the private-server script cannot run here."""
    if not os.access(MONGOD, os.X_OK):
        _unavailable(f"{MONGOD} is missing (run `bash scripts/mongo_server.sh install`)")
