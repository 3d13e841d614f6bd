"""MongoDB as it runs in production: a 3-member replica set whose primary steps down or dies
during a build and during a read, and a server with access control (SCRAM user, authSource).

Each test starts its own mongod processes (scripts/mongo_server.sh with ``--dir``), so these run
only where the test server's binary is installed (``bash scripts/mongo_server.sh install``);
they skip otherwise, or fail under ``PACKER_REQUIRE_MONGO=1`` (scripts/test.sh).
"""
from __future__ import annotations

import time
import urllib.parse

import pytest

pytest.importorskip("pymongo")

import packer  # noqa: E402
from packer.core.errors import PackerError  # noqa: E402
from packer.stores import mongo as mongo_mod  # noqa: E402
from packer.stores import open_store  # noqa: E402
from tests import corpus, mongo_support  # noqa: E402

pytestmark = [pytest.mark.mongo, pytest.mark.slow]

N_IMAGES = 40


@pytest.fixture(scope="module")
def replica_set(tmp_path_factory):
    """One 3-member replica set for the module (starting one takes seconds to tens of seconds)."""
    mongo_support.mongo_uri_or_skip()
    mongo_support.require_server_script()
    srv = mongo_support.PrivateServer(tmp_path_factory.mktemp("rs"), members=3).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """N_IMAGES small JPEGs in two class folders."""
    root = tmp_path_factory.mktemp("imgs") / "images"
    for i in range(N_IMAGES):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:03d}.jpg").write_bytes(corpus.jpeg_of_shape(24 + i % 5, 32, seed=i))
    return root


def _step_down(srv) -> int:
    """Ask the primary to step down (as a maintenance or a failover does); returns its port."""
    import pymongo

    port = srv.primary_port()
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", serverSelectionTimeoutMS=5000)
    try:
        c.admin.command("replSetStepDown", 10, secondaryCatchUpPeriodSecs=5)
    except pymongo.errors.AutoReconnect:
        pass  # servers before 4.2 dropped the connection here
    finally:
        c.close()
    return port


def _kill_primary(srv) -> int:
    port = srv.primary_port()
    srv.kill(srv.pids[srv.ports.index(port)])
    return port


def _all_keys(srv, loc) -> list[str]:
    with open_store(loc, timeout=30) as r:
        return [r.get(i).key for i in range(len(r))]


def _build_with_failover(srv, images, loc, tmp_path, monkeypatch, failover):
    """Build with one record per batch; after the 5th batch is committed, ``failover(srv)``."""
    real = mongo_mod.MongoWriter._write_batch
    calls = []

    def write_batch(self, records, state):
        real(self, records, state)
        calls.append(len(records))
        if len(calls) == 5:
            calls.append(failover(srv))

    monkeypatch.setattr(mongo_mod.MongoWriter, "_write_batch", write_batch)
    t0 = time.monotonic()
    rep = packer.build(images, None, loc, format="mongo", workers=1, commit_bytes=1,
                    report_path=tmp_path / "r.json")
    return rep, time.monotonic() - t0, calls


@pytest.mark.timeout(240)
@pytest.mark.parametrize("failover", [_step_down, _kill_primary], ids=["stepdown", "kill"])
def test_build_continues_through_a_failover(replica_set, images, tmp_path, monkeypatch, failover):
    loc = f"{replica_set.uri.split('/?')[0]}/pk_test_rs/build_{failover.__name__}?replicaSet=rs0"
    try:
        rep, elapsed, calls = _build_with_failover(replica_set, images, loc, tmp_path, monkeypatch, failover)
        assert isinstance(calls[5], int), calls      # the failover happened mid-build
        assert len(calls) > 10, calls                 # ... with batches after it
        assert rep.published and rep.records == N_IMAGES
        monkeypatch.undo()
        keys = _all_keys(replica_set, loc)
        want = sorted(f"c{i % 2}/{i:03d}.jpg" for i in range(N_IMAGES))
        assert sorted(keys) == want and len(set(keys)) == N_IMAGES   # nothing lost, nothing doubled
        assert packer.verify(loc, deep=True, timeout=30).ok
    finally:
        if failover is _kill_primary:
            dead = [p for p, pid in zip(replica_set.ports, replica_set.pids)
                    if not mongo_support.alive(pid)]
            for port in dead:
                replica_set.restart_member(port)


def _fail_next_inserts(srv, times: int, **data) -> None:
    """Server-side fault injection (failCommand): the primary fails the next ``times`` inserts."""
    import pymongo

    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{srv.primary_port()}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
    try:
        c.admin.command("configureFailPoint", "failCommand", mode={"times": times},
                        data={"failCommands": ["insert"], **data})
    finally:
        c.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", [
    {"closeConnection": True},                                         # connection dropped mid-write
    {"errorCode": 10107, "errorLabels": ["RetryableWriteError"]},     # NotWritablePrimary
], ids=["connection-dropped", "not-primary"])
def test_writer_redoes_a_batch_the_driver_gave_up_on(replica_set, images, tmp_path, monkeypatch, caplog, fault):
    """Three failures in a row outlast pymongo's one retry of a retryable write: the error reaches
    the writer, which redoes the batch (after deleting what it may have written)."""
    loc = f"{replica_set.uri.split('/?')[0]}/pk_test_rs/fault_{len(fault)}?replicaSet=rs0"
    with caplog.at_level("WARNING", logger="packer.stores.mongo"):
        rep, _, calls = _build_with_failover(replica_set, images, loc, tmp_path, monkeypatch,
                                             lambda srv: _fail_next_inserts(srv, 3, **fault))
    assert "while writing a batch" in caplog.text and "retrying" in caplog.text, caplog.text
    assert rep.published and rep.records == N_IMAGES
    monkeypatch.undo()
    keys = _all_keys(replica_set, loc)
    assert sorted(keys) == sorted(f"c{i % 2}/{i:03d}.jpg" for i in range(N_IMAGES))
    assert packer.verify(loc, deep=True, timeout=30).ok


@pytest.mark.timeout(240)
@pytest.mark.parametrize("failover", [_step_down, _kill_primary], ids=["stepdown", "kill"])
def test_reader_recovers_from_a_failover_within_its_timeout(replica_set, images, tmp_path, failover):
    loc = f"{replica_set.uri.split('/?')[0]}/pk_test_rs/read_{failover.__name__}?replicaSet=rs0"
    assert packer.build(images, None, loc, format="mongo", workers=1, report_path=tmp_path / "r.json").published
    timeout = 20.0
    try:
        with open_store(loc, timeout=timeout, retries=20) as reader:
            want = [reader.get(i) for i in range(N_IMAGES)]
            replica_set.primary_port()
            failover(replica_set)
            t0 = time.monotonic()
            got = reader.get_many(list(range(N_IMAGES)))    # first read after the failover
            stall = time.monotonic() - t0
            assert stall < timeout, stall
            assert [(r.key, r.checksum) for r in got] == [(r.key, r.checksum) for r in want]
            assert all(r.data_ok() for r in got)
    finally:
        if failover is _kill_primary:
            for port, pid in zip(replica_set.ports, replica_set.pids):
                if not mongo_support.alive(pid):
                    replica_set.restart_member(port)


# ---------------------------------------------------------------------------------------
# access control: a SCRAM user, authSource
# ---------------------------------------------------------------------------------------
PASSWORD = "p@ss:w/rd#1 long-Secret"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    mongo_support.mongo_uri_or_skip()
    mongo_support.require_server_script()
    srv = mongo_support.PrivateServer(tmp_path_factory.mktemp("auth"), auth_user="packer_user",
                                      password=PASSWORD).start()
    yield srv
    srv.stop()


def _with_credentials(uri: str, user: str, password: str, db: str, coll: str) -> str:
    host, _, query = uri.partition("/?")
    creds = f"{urllib.parse.quote_plus(user)}:{urllib.parse.quote_plus(password)}@"
    return host.replace("mongodb://", "mongodb://" + creds) + f"/{db}/{coll}?{query}"


@pytest.mark.timeout(180)
def test_build_and_read_with_scram_credentials(auth_server, images, tmp_path):
    loc = _with_credentials(auth_server.uri, "packer_user", PASSWORD, "pk_test_auth", "train")
    assert "authSource=admin" in loc
    rep = packer.build(images, None, loc, format="mongo", workers=1, report_path=tmp_path / "r.json")
    assert rep.published and rep.records == N_IMAGES
    assert packer.verify(loc, deep=True).ok
    with open_store(loc) as r:
        assert len(r) == N_IMAGES and r.get(3).data_ok()
    assert PASSWORD not in (tmp_path / "r.json").read_text()
    assert urllib.parse.quote_plus(PASSWORD) not in (tmp_path / "r.json").read_text()


@pytest.mark.timeout(180)
def test_wrong_password_is_a_clear_error_that_never_shows_it(auth_server, images, tmp_path):
    wrong = "not-the-Password-42"
    loc = _with_credentials(auth_server.uri, "packer_user", wrong, "pk_test_auth", "denied")
    t0 = time.monotonic()
    with pytest.raises(PackerError) as err:
        packer.build(images, None, loc, format="mongo", workers=1, report_path=tmp_path / "r.json")
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "auth" in msg.lower(), msg
    assert wrong not in msg and urllib.parse.quote_plus(wrong) not in msg
    with pytest.raises(PackerError) as err:
        open_store(_with_credentials(auth_server.uri, "packer_user", wrong, "pk_test_auth", "train"))
    assert wrong not in str(err.value) and "auth" in str(err.value).lower()
    # No credentials at all: the server refuses, and the error says so.
    with pytest.raises(PackerError) as err:
        packer.build(images, None, f"{auth_server.uri.split('/?')[0]}/pk_test_auth/anon", format="mongo",
                  workers=1, report_path=tmp_path / "r2.json")
    assert "auth" in str(err.value).lower() or "unauthorized" in str(err.value).lower(), str(err.value)

