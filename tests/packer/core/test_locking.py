"""One writer per output: concurrent builds are refused with the holder named; stale locks of
killed builds are taken over. Real processes, bounded in time."""
from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packer
from packer.core.errors import LockedError
from packer.core.locking import DocumentLock, file_lock, lock_path, output_lock
from packer.stores import get_store, open_store
from tests import REPO, corpus


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def slow_images(tmp_path_factory):
    """~150 large JPEGs: a build of them lasts a few seconds."""
    images = tmp_path_factory.mktemp("lock") / "images"
    big = corpus.jpeg_of_shape(1000, 1000, seed=9)
    for i in range(150):
        p = images / f"c{i % 3}" / f"img_{i:04d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(big)
    return images


def _build_cmd(images, out, fmt, *extra):
    return [sys.executable, "-m", "packer", "build", str(images), "-o", str(out), "--format", fmt,
            "-j", "1", "-q", "--commit-mb", "1", *extra]


def _has_holder(path) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _wait_for(pred, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,suffix", [("lmdb", ".lmdb"), ("hdf5", ".h5")])
def test_second_concurrent_build_is_refused_naming_the_holder(slow_images, tmp_path, fmt, suffix):
    out = tmp_path / ("out" + suffix)
    first = subprocess.Popen(_build_cmd(slow_images, out, fmt), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=_env(), cwd=tmp_path)
    try:
        # The lock file with its holder's record in it (the file exists a moment before the
        # record is written: stopped in between, the holder would be "unknown" by design).
        assert _wait_for(lambda: _has_holder(lock_path(out)) or first.poll() is not None)
        assert first.poll() is None, "the first build ended before the second could start"
        # Hold the first build still (it keeps its lock) so that, however fast this machine,
        # the second really runs while the first is under way; then let it finish.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = subprocess.run(_build_cmd(slow_images, out, fmt), capture_output=True, text=True,
                                    timeout=120, env=_env(), cwd=tmp_path)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        _, err1 = first.communicate(timeout=200)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err1.decode()[-2000:]
    assert second.returncode == 1, second.stderr[-2000:]
    msg = second.stderr
    assert "is writing this output" in msg
    assert f"pid {first.pid} on {socket.gethostname()}" in msg and "since 20" in msg
    assert "Traceback" not in msg
    assert packer.verify(out, deep=True).ok
    with open_store(out) as s:
        assert len(s) == 150
    assert not os.path.exists(lock_path(out))  # released at the end


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,suffix", [("lmdb", ".lmdb"), ("hdf5", ".h5")])
def test_killed_builds_lock_is_taken_over(slow_images, tmp_path, fmt, suffix):
    out = tmp_path / ("out" + suffix)
    r = subprocess.run(_build_cmd(slow_images, out, fmt), capture_output=True, text=True, timeout=120,
                       env=_env(PACKER_FAULT_KILL_AFTER_COMMITS="2"), cwd=tmp_path)
    assert r.returncode == -9, r.stderr[-2000:]
    left = json.loads(Path(lock_path(out)).read_text())   # the dead build's lock file stays
    assert left["pid"] and left["purpose"] == "build"
    rerun = [a for a in _build_cmd(slow_images, out, fmt, "-v") if a != "-q"]
    r = subprocess.run(rerun, capture_output=True, text=True,
                       timeout=200, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(Path(f"{out}.report.json").read_text())["resumed_from"] > 0
    assert f"taking over the lock left by build by pid {left['pid']}" in r.stderr
    assert packer.verify(out).ok


def test_file_lock_refuses_a_second_holder_and_names_it(tmp_path):
    loc = str(tmp_path / "x.lmdb")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from packer.core.locking import file_lock\n"
        f"with file_lock({loc!r}, purpose='repair'):\n"
        "    print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, env=_env())
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(LockedError) as ei:
            with file_lock(loc):
                pass
        assert f"repair by pid {holder.pid} on {socket.gethostname()}" in str(ei.value)
        assert ei.value.holder["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with file_lock(loc) as me:   # the kernel released the killed holder's lock
        assert me["pid"] == os.getpid()
    assert not os.path.exists(lock_path(loc))


@pytest.mark.timeout(60)
def test_the_lock_file_and_the_refusal_mask_passwords_in_the_holders_command(tmp_path):
    """The holder's command line goes into the lock file and the refused writer's message: a
    password in it (a server URL given on the command line) is masked in both."""
    loc = str(tmp_path / "x.lmdb")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from packer.core.locking import file_lock\n"
        f"with file_lock({loc!r}, purpose='build'):\n"
        "    print('held', flush=True); time.sleep(60)\n"), "--uri", "mongodb://u:sEcReT-pw@h/db"],
        stdout=subprocess.PIPE, env=_env())
    try:
        assert holder.stdout.readline().strip() == b"held"
        on_disk = Path(lock_path(loc)).read_text()
        with pytest.raises(LockedError) as ei:
            with file_lock(loc):
                pass
        assert "mongodb://u:" in on_disk and "mongodb://u:" in str(ei.value)
        assert "sEcReT-pw" not in on_disk + str(ei.value) + json.dumps(ei.value.holder)
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay_s, named", [(0.1, True), (None, False)])
def test_a_writer_refused_before_the_holder_wrote_its_record_still_names_it(tmp_path, delay_s, named):
    """The holder takes the lock, then writes who it is: a writer refused in between waits a
    moment for that record; a holder that never writes one is an "unknown writer"."""
    import fcntl
    import threading

    loc = str(tmp_path / "x.lmdb")
    fd = os.open(lock_path(loc), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # flock is per open file: file_lock's own open conflicts
    info = {"host": "host-a", "pid": 4242, "purpose": "build", "since": "2026-11-27T00:00:00+00:00"}
    writer = threading.Timer(delay_s, lambda: os.pwrite(fd, json.dumps(info).encode(), 0)) if delay_s else None
    try:
        if writer:
            writer.start()
        t0 = time.monotonic()
        with pytest.raises(LockedError) as ei:
            with file_lock(loc):
                pass
        waited = time.monotonic() - t0
    finally:
        if writer:
            writer.join()
        os.close(fd)
    if named:
        assert "build by pid 4242 on host-a since 2026-11-27" in str(ei.value)
        assert ei.value.holder["pid"] == 4242
    else:
        assert "another unknown writer (it left no details) is writing" in str(ei.value) and not ei.value.holder
        assert 0.4 < waited < 5.0, waited


def test_output_lock_uses_the_file_lock_for_path_stores(tmp_path):
    loc = str(tmp_path / "y.h5")
    with output_lock(loc, get_store("hdf5"), purpose="convert") as held:
        assert json.loads(Path(lock_path(loc)).read_text())["purpose"] == "convert"
        assert held.info["host"] == socket.gethostname()
        held.check()  # a flock cannot be lost


# ---------------------------------------------------------------------------------------
# MongoDB: a lock document with heartbeat
# ---------------------------------------------------------------------------------------
@pytest.fixture
def lock_coll():
    from tests import mongo_support

    uri = mongo_support.mongo_uri_or_skip()
    import pymongo

    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
    db = client[f"{mongo_support.DB_PREFIX}lock_{os.getpid()}_{time.monotonic_ns()}"]
    yield db["store.lock"]
    client.drop_database(db.name)
    client.close()


@pytest.mark.mongo
@pytest.mark.timeout(60)
def test_document_lock_exclusive_and_stale_takeover(lock_coll):
    a = DocumentLock(lock_coll, "db/store", purpose="build", ttl=2)
    a.acquire()
    try:
        with pytest.raises(LockedError, match=f"build by pid {os.getpid()} on {socket.gethostname()}"):
            DocumentLock(lock_coll, "db/store").acquire()
    finally:
        a.release()
    assert lock_coll.count_documents({}) == 0

    # Same host, dead pid: taken over at once.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, timeout=30)
    now = datetime.datetime.now(datetime.timezone.utc)
    lock_coll.insert_one({"_id": "output", "host": socket.gethostname(), "pid": int(dead.stdout),
                          "purpose": "build", "since": "x", "heartbeat": now, "token": "old"})
    b = DocumentLock(lock_coll, "db/store", ttl=2)
    b.acquire()
    b.release()

    # Same host, a live pid (ours, standing in for a reused pid) but a heartbeat past ttl: stale.
    lock_coll.insert_one({"_id": "output", "host": socket.gethostname(), "pid": os.getpid(),
                          "purpose": "build", "since": "x", "token": "reused",
                          "heartbeat": now - datetime.timedelta(seconds=120)})
    b = DocumentLock(lock_coll, "db/store", ttl=30)
    b.acquire()
    b.release()

    # Another host with a fresh heartbeat: refused; once its heartbeat is older than ttl: taken over.
    lock_coll.insert_one({"_id": "output", "host": "elsewhere", "pid": 1, "purpose": "build",
                          "since": "x", "heartbeat": now, "token": "remote"})
    with pytest.raises(LockedError, match="on elsewhere"):
        DocumentLock(lock_coll, "db/store", ttl=30).acquire()
    lock_coll.update_one({"_id": "output"}, {"$set": {"heartbeat": now - datetime.timedelta(seconds=120)}})
    c = DocumentLock(lock_coll, "db/store", ttl=30)
    info = c.acquire()
    assert lock_coll.find_one({"_id": "output"})["token"] == info["token"]
    c.release()


@pytest.mark.mongo
@pytest.mark.timeout(60)
def test_document_lock_taken_over_is_noticed_before_publishing(lock_coll):
    a = DocumentLock(lock_coll, "db/store", ttl=30)
    a.acquire()
    a.check()
    # Another host decided our heartbeat had expired and replaced the document.
    lock_coll.replace_one({"_id": "output"}, {"host": "elsewhere", "pid": 7, "purpose": "build",
                                              "since": "x", "token": "theirs"})
    with pytest.raises(LockedError, match="lost the output lock .* build by pid 7 on elsewhere"):
        a.check()
    a.release()
    assert lock_coll.find_one({"_id": "output"})["token"] == "theirs"   # theirs is left alone


@pytest.mark.mongo
@pytest.mark.timeout(60)
def test_document_lock_heartbeat_keeps_it_fresh(lock_coll):
    a = DocumentLock(lock_coll, "db/store", ttl=0.8)
    a.acquire()
    try:
        first = lock_coll.find_one({"_id": "output"})["heartbeat"]
        time.sleep(1.0)
        assert lock_coll.find_one({"_id": "output"})["heartbeat"] > first
        with pytest.raises(LockedError):  # past ttl since it was taken, but still beating
            DocumentLock(lock_coll, "db/store", ttl=0.8).acquire()
    finally:
        a.release()


@pytest.mark.mongo
@pytest.mark.timeout(300)
def test_second_concurrent_mongo_build_is_refused(slow_images, tmp_path):
    from tests import mongo_support

    out = mongo_support.new_store_location("locked")
    first = subprocess.Popen(_build_cmd(slow_images, out, "mongo"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=_env(), cwd=tmp_path)
    try:
        import pymongo

        uri, db, coll = out.rsplit("/", 2)
        client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
        assert _wait_for(lambda: client[db][coll + ".lock"].find_one() is not None or first.poll() is not None)
        assert first.poll() is None
        os.kill(first.pid, signal.SIGSTOP)   # as above; well within the lock's 60 s heartbeat ttl
        try:
            second = subprocess.run(_build_cmd(slow_images, out, "mongo"), capture_output=True,
                                    text=True, timeout=120, env=_env(), cwd=tmp_path)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        _, err1 = first.communicate(timeout=200)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err1.decode()[-2000:]
    assert second.returncode == 1 and f"pid {first.pid}" in second.stderr, second.stderr[-2000:]
    assert packer.verify(out).ok
    assert client[db][coll + ".lock"].count_documents({}) == 0
    client.close()
    mongo_support.drop_location(out)


def test_output_in_a_new_folder_still_builds(tmp_path):
    images = tmp_path / "images" / "c"
    images.mkdir(parents=True)
    (images / "a.jpg").write_bytes(corpus.good_jpeg(1))
    out = tmp_path / "new" / "sub" / "x.h5"
    assert packer.build(tmp_path / "images", None, out, workers=1).published
    assert not os.path.exists(lock_path(out))


@pytest.mark.timeout(120)
def test_repair_convert_append_merge_take_the_build_lock(tmp_path):
    """Every writer of an output takes the build's lock: with it held by another writer, repair,
    convert, append and merge --copy are refused naming the holder, and change nothing."""
    from packer import convert, repair
    from packer.jobs.append import append
    from packer.jobs.merge import merge

    images = tmp_path / "images"
    for i in range(4):
        p = images / f"c{i % 2}" / f"img_{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(corpus.jpeg_of_shape(32, 48, seed=i))
    store = tmp_path / "s.lmdb"
    packer.build(images, None, store, workers=1)
    more = tmp_path / "more" / "c0"
    more.mkdir(parents=True)
    (more / "new.jpg").write_bytes(corpus.jpeg_of_shape(32, 48, seed=99))
    # The holder is another process: flock excludes other open files, held by a child here.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from packer.core.locking import output_lock; "
         "from packer.stores import get_store\n"
         "with output_lock(sys.argv[1], get_store('lmdb'), purpose='build'):\n"
         "    print('held', flush=True); time.sleep(60)", str(store)],
        env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = open_store(store).metadata.index_checksum
        with pytest.raises(LockedError, match=str(holder.pid)):
            repair(store)
        with pytest.raises(LockedError, match=str(holder.pid)):
            append(store, tmp_path / "more")
        dst = tmp_path / "d.h5"
        with output_lock(dst, get_store("hdf5"), purpose="build"):
            with pytest.raises(LockedError):   # same process, other open file: still excluded
                convert(store, dst, "hdf5")
        assert not dst.exists()
        copy = tmp_path / "m.lmdb"
        with output_lock(copy, get_store("lmdb"), purpose="build"):
            with pytest.raises(LockedError):
                merge([str(store)], copy, copy=True, format="lmdb")
        assert open_store(store).metadata.index_checksum == before
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert repair(store).nothing_to_repair   # the lock went with its holder
