"""MongoDB-specific tests against a live server: GridFS records, resume, publish atomicity,
error messages, a server that goes away mid-read, and reads from DataLoader workers.

The generic guarantees are also covered for every backend by
tests/packer/stores/test_store_contract.py. Server tests are marked ``mongo`` and use the server
named by ``PACKER_TEST_MONGO_URI`` (scripts/mongo_server.sh); a few tests of location parsing and
messages need no server.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("pymongo")
cv2 = pytest.importorskip("cv2")

from packer.core.errors import RecordError, ResumeMismatchError, StoreError, UsageError  # noqa: E402
from packer.core.records import Record, StoreMetadata, checksum, index_checksum, labels_equal  # noqa: E402
from packer.stores import detect_format, get_store, open_store  # noqa: E402
from packer.stores.mongo import MongoStore, parse_location, redact  # noqa: E402
from tests import REPO, corpus, mongo_support  # noqa: E402

mongo = pytest.mark.mongo
make_jpeg = corpus.jpeg_of_shape


def make_records(n: int = 12, schema: str = "class") -> list[Record]:
    # Unicode and a space in keys; one record with a recorded EXIF orientation.
    return corpus.make_records(n, schema, key_template="cls{c}/ímg {i:03d}.jpg", box_scale=7.0,
                               orientations={6: 6})






def big_record(index: int, nbytes: int) -> Record:
    """A record whose bytes exceed what fits in one document (stored bytes need not decode here)."""
    data = make_jpeg(64, 64, seed=99) + np.random.default_rng(index).bytes(nbytes)
    return Record(index=index, key=f"big/{index}.jpg", data=data, label=1, width=64, height=64, channels=3,
                  source_format="jpeg", converted="", orientation=1, checksum=checksum(data),
                  source_checksum=checksum(data), source_size=len(data), notes=["huge"])


def add_all(writer, state, records):
    """The build loop of packer.jobs.build, as base.py describes it."""
    for rec in records:
        assert rec.index == state.next_index
        writer.add(rec)
        state.next_index += 1
        state.next_input += 1
        writer.checkpoint(state)


def build(location, records, schema="class", fingerprint="fp", commit_bytes=8 << 10, overwrite=False, **options):
    with MongoStore.create_writer(location, commit_bytes=commit_bytes, **options) as writer:
        state = writer.open(fingerprint, resume=True)
        add_all(writer, state, records[state.next_index:])
        writer.flush()
        meta = StoreMetadata(format="mongo", count=len(records), label_schema=schema,
                             class_names=["a", "b", "c", "d"], build_options={},
                             index_checksum=index_checksum(writer.iter_index()))
        writer.publish(meta, overwrite=overwrite)
    return location


def assert_same(got: Record, want: Record):
    for name in Record.META_FIELDS:
        if name == "label":
            assert labels_equal(got.label, want.label), (got.key, got.label, want.label)
        elif name == "meta_checksum":  # written by the store: covers every field of what was added
            assert got.meta_checksum == want.meta_digest() and got.meta_ok(), got.key
        else:
            assert getattr(got, name) == getattr(want, name), (got.key, name)
    assert bytes(got.data) == bytes(want.data)


def collections(location):
    _, db, _ = mongo_support.split_location(location)
    client = mongo_support.client_for(location)
    try:
        return sorted(client[db].list_collection_names())
    finally:
        client.close()


def raw_collection(client, location, suffix=""):
    _, db, coll = mongo_support.split_location(location)
    return client[db][coll + suffix]


@pytest.fixture
def loc(request):
    location = mongo_support.new_store_location(request.node.originalname)
    yield location
    mongo_support.drop_location(location)


@pytest.fixture
def records():
    return make_records()


@pytest.fixture
def store(loc, records):
    return build(loc, records)


# ---------------------------------------------------------------------------------------
# locations and options (no server needed)
# ---------------------------------------------------------------------------------------
def test_location_parsing_and_uri_override(monkeypatch):
    monkeypatch.delenv("MONGODB_URI", raising=False)
    loc = parse_location("mongodb://alice:s3cret@h1:27017,h2/data/train.v2?replicaSet=rs&tls=true")
    assert (loc.client_uri, loc.db, loc.collection) == \
        ("mongodb://alice:s3cret@h1:27017,h2/?replicaSet=rs&tls=true", "data", "train.v2")
    assert loc.name == "mongodb://alice:***@h1:27017,h2/data/train.v2" and "s3cret" not in loc.server
    over = parse_location("mongodb:///data/train", uri="mongodb+srv://bob:pw@cluster.example/?w=1")
    assert over.client_uri == "mongodb+srv://bob:pw@cluster.example/?w=1" and over.name.startswith("mongodb+srv://bob:***@")
    monkeypatch.setenv("MONGODB_URI", "mongodb://envhost:1")
    assert parse_location("mongodb:///d/c").client_uri == "mongodb://envhost:1"
    assert parse_location("mongodb://x/d/c", uri="mongodb://opt:2").client_uri == "mongodb://opt:2"
    monkeypatch.delenv("MONGODB_URI")
    for bad, words in [("mongodb:///d/c", "no server"), ("mongodb://h/d", "DATABASE/COLLECTION"),
                       ("mongodb://h/d/c/x", "DATABASE/COLLECTION"), ("mongodb://h/d.b/c", "database name"),
                       ("mongodb://h/d/system.x", "collection"), ("http://h/d/c", "mongodb://")]:
        with pytest.raises(UsageError, match=re.escape(words)):
            parse_location(bad)
    assert redact("mongodb://u:p@h/?a=b") == "mongodb://u:***@h/?a=b" and redact("mongodb://h") == "mongodb://h"


def test_registry_claims_and_options(monkeypatch):
    assert get_store("mongo") is MongoStore
    assert MongoStore.claims("mongodb://h/d/c") and MongoStore.claims("mongodb+srv://h/d/c")
    assert not MongoStore.claims("/tmp/x.lmdb") and detect_format("mongodb://h/d/c") == "mongo"
    assert {"uri", "gridfs_threshold"} <= set(MongoStore.writer_options)
    assert {"uri", "timeout", "retries"} <= set(MongoStore.reader_options)
    with pytest.raises(UsageError, match="unknown writer option.*'pixels'"):
        MongoStore.create_writer("mongodb://h/d/c", pixels="8x8")
    with pytest.raises(UsageError, match="unknown reader option.*'cache_bytes'"):
        MongoStore.open_reader("mongodb://h/d/c", cache_bytes=1)
    with pytest.raises(UsageError, match="gridfs_threshold"):
        MongoStore.create_writer("mongodb://h/d/c", gridfs_threshold="20M")
    with pytest.raises(UsageError, match="timeout"):
        MongoStore.open_reader("mongodb://h/d/c", timeout="soon")


def test_unreachable_server_fails_fast_with_redacted_uri():
    t0 = time.monotonic()
    with pytest.raises(StoreError) as err:
        MongoStore.open_reader("mongodb://alice:s3cret@127.0.0.1:9/db/coll", timeout=1, retries=1)
    msg = str(err.value)
    assert time.monotonic() - t0 < 5
    assert "mongodb://alice:***@127.0.0.1:9/db/coll" in msg and "unreachable" in msg and "s3cret" not in msg


# ---------------------------------------------------------------------------------------
# round trip, layout, GridFS
# ---------------------------------------------------------------------------------------
@mongo
@pytest.mark.parametrize("schema", ["class", "boxes"])
def test_round_trip_field_for_field(loc, schema):
    records = make_records(schema=schema)
    build(loc, records, schema=schema)
    with open_store(loc) as reader:
        assert len(reader) == 12 and reader.metadata.count == 12 and reader.check_structure() == []
        for rec in records:
            assert_same(reader.get(rec.index), rec)
        order = [11, 0, 5, 5, 3]
        for got, i in zip(reader.get_many(order), order):
            assert_same(got, records[i])
        assert reader.get_many([]) == []
        assert reader.index_of(records[7].key) == 7
        with pytest.raises(KeyError):
            reader.index_of("nope.jpg")
        with pytest.raises(IndexError):
            reader.get(12)
        assert reader.size_bytes() >= sum(len(r.data) for r in records)


@mongo
def test_layout_documents_index_and_metadata(store, records):
    assert collections(store)[:2] == [store.rsplit("/", 1)[1], store.rsplit("/", 1)[1] + ".meta"]
    client = mongo_support.client_for(store)
    try:
        coll = raw_collection(client, store)
        doc = coll.find_one({"_id": 4})
        assert doc["data"] == records[4].data and doc["size"] == len(records[4].data)
        assert doc["key"] == records[4].key and doc["checksum"] == records[4].checksum and doc["gridfs"] is False
        assert any(ix.get("unique") and list(ix["key"]) == ["key"] for ix in coll.list_indexes())
        meta = raw_collection(client, store, ".meta").find_one({"_id": "metadata"})
        assert meta["count"] == 12 and StoreMetadata.from_json(meta["json"].encode()).count == 12
    finally:
        client.close()


@mongo
def test_get_many_is_one_query(store, records, monkeypatch):
    """A batch is fetched with a single find({_id: {$in: ...}}), whatever its order."""
    from pymongo import monitoring

    class Finds(monitoring.CommandListener):
        def __init__(self):
            self.finds = []

        def started(self, event):
            if event.command_name == "find":
                self.finds.append(event.command["filter"])

        def succeeded(self, event):
            pass

        def failed(self, event):
            pass

    listener = Finds()
    import packer.stores.mongo.reader as mongo_reader

    real_client = mongo_reader.new_client
    monkeypatch.setattr(mongo_reader, "new_client",
                        lambda loc, **kw: real_client(loc, event_listeners=[listener], **kw))
    with open_store(store) as reader:
        listener.finds.clear()
        got = reader.get_many([9, 2, 7, 2, 0])
    assert [r.index for r in got] == [9, 2, 7, 2, 0]
    assert listener.finds == [{"_id": {"$in": [9, 2, 7, 0]}}]


@mongo
def test_transient_network_errors_are_retried(store, records, monkeypatch, caplog):
    from pymongo.collection import Collection
    from pymongo.errors import AutoReconnect

    real_find, failures = Collection.find, []

    def flaky_find(self, *args, **kwargs):
        if len(failures) < 2:
            failures.append(1)
            raise AutoReconnect("connection reset by peer (injected)")
        return real_find(self, *args, **kwargs)

    with open_store(store, retries=3) as reader:
        monkeypatch.setattr(Collection, "find", flaky_find)
        got = reader.get_many([3, 1])
        assert [r.checksum for r in got] == [records[3].checksum, records[1].checksum]
        assert len(failures) == 2 and "retrying" in caplog.text
        failures.clear()
        with pytest.raises(StoreError, match=r"unreachable.*2 attempt\(s\).*injected"):
            open_store(store, retries=1).get(0)


@mongo
def test_records_above_the_threshold_go_to_gridfs(loc, records):
    big = max(len(r.data) for r in records) - 100
    build(loc, records, gridfs_threshold=str(big))
    in_gridfs = [r.index for r in records if len(r.data) > big]
    assert in_gridfs and len(in_gridfs) < len(records)
    client = mongo_support.client_for(loc)
    try:
        assert raw_collection(client, loc).count_documents({"gridfs": True, "data": None}) == len(in_gridfs)
        assert raw_collection(client, loc, ".gridfs.files").count_documents({}) == len(in_gridfs)
    finally:
        client.close()
    with open_store(loc) as reader:
        for got, want in zip(reader.get_many(range(12)), records):
            assert_same(got, want)
        assert reader.check_structure() == []
        client = mongo_support.client_for(loc)
        try:
            raw_collection(client, loc, ".gridfs.files").delete_one({"_id": in_gridfs[0]})
            raw_collection(client, loc, ".gridfs.chunks").delete_many({"files_id": in_gridfs[0]})
        finally:
            client.close()
        with pytest.raises(RecordError, match="GridFS file is missing") as err:
            reader.get(in_gridfs[0])
        assert err.value.key == records[in_gridfs[0]].key
        assert any("GridFS" in p for p in reader.check_structure())


@mongo
def test_a_record_over_16_mib_round_trips_through_gridfs(loc, records):
    recs = records[:3] + [big_record(3, 17 << 20)] + [records[4]]
    build(loc, recs, commit_bytes=1 << 20)
    with open_store(loc) as reader:
        got = reader.get_many([3, 4, 0])
        assert_same(got[0], recs[3]) and len(got[0].data) > 16 << 20
        assert_same(got[1], recs[4])
        assert reader.check_structure() == []


# ---------------------------------------------------------------------------------------
# publish, overwrite, atomicity
# ---------------------------------------------------------------------------------------
@mongo
def test_nothing_visible_until_publish(loc, records):
    with pytest.raises(RuntimeError, match="boom"):
        with MongoStore.create_writer(loc, commit_bytes=4096) as writer:
            add_all(writer, writer.open("fp"), records[:5])
            raise RuntimeError("boom")
    coll = loc.rsplit("/", 1)[1]
    assert collections(loc) == [f"{coll}.partial", f"{coll}.partial.meta"]
    assert not MongoStore.exists(loc)
    with pytest.raises(StoreError, match="incomplete store.*interrupted"):
        open_store(loc)


@mongo
def test_no_metadata_means_incomplete(store):
    client = mongo_support.client_for(store)
    try:
        raw_collection(client, store, ".meta").delete_one({"_id": "metadata"})
    finally:
        client.close()
    assert MongoStore.exists(store)                  # the collection is still in the way
    with pytest.raises(StoreError, match="incomplete store"):
        open_store(store)


@mongo
def test_publish_refuses_existing_store_unless_overwrite(store, records):
    with pytest.raises(UsageError, match="exists.*--overwrite"):
        build(store, records[:6], fingerprint="fp2")
    with open_store(store) as old:
        assert len(old) == 12
        old.get(1)
        build(store, records[:6], fingerprint="fp2", overwrite=True)
        with pytest.raises(StoreError, match="replaced while open"):
            old.get(1)                               # never a silent mix of two builds
    with open_store(store) as new:
        assert len(new) == 6 and new.check_structure() == []
    coll = store.rsplit("/", 1)[1]
    assert collections(store) == [coll, f"{coll}.meta"]


@mongo
def test_overwrite_replaces_gridfs_blobs_too(loc, records):
    build(loc, records, gridfs_threshold="1K")
    build(loc, records[:4], fingerprint="fp2", overwrite=True)
    with open_store(loc) as reader:
        assert reader.check_structure() == []
        for got, want in zip(reader.get_many(range(4)), records):
            assert_same(got, want)


# ---------------------------------------------------------------------------------------
# resume
# ---------------------------------------------------------------------------------------
@mongo
def test_resume_discards_records_written_after_the_last_state(loc, records, tmp_path):
    writer = MongoStore.create_writer(loc, commit_bytes=1 << 30, gridfs_threshold="2K")
    state = writer.open("fp")
    for batch in (records[0:4], records[4:7]):
        add_all(writer, state, batch)
        writer.flush()                               # two committed batches: records, then state
    # a third batch's records (and GridFS blobs) reach the server, the process dies before its state
    writer._save_state = lambda db, state: None
    add_all(writer, state, records[7:10])
    writer.flush()
    writer.abort()
    client = mongo_support.client_for(loc)
    try:
        assert raw_collection(client, loc, ".partial").count_documents({}) == 10
    finally:
        client.close()

    writer = MongoStore.create_writer(loc, commit_bytes=1 << 30, gridfs_threshold="2K")
    state = writer.open("fp")
    assert (state.next_index, state.next_input) == (7, 7)
    assert [i for i, _, _ in writer.iter_index()] == list(range(7))
    add_all(writer, state, records[7:])
    writer.flush()
    writer.publish(StoreMetadata(format="mongo", count=12, label_schema="class", class_names=[],
                                 build_options={}, index_checksum=index_checksum(writer.iter_index())))
    writer._close()
    ref = build(mongo_support.new_store_location("ref"), records, gridfs_threshold="2K")
    try:
        with open_store(loc) as a, open_store(ref) as b:
            assert a.metadata.index_checksum == b.metadata.index_checksum and a.check_structure() == []
            for rec in records:
                assert_same(a.get(rec.index), rec)
    finally:
        mongo_support.drop_location(ref)


@mongo
def test_resume_with_other_fingerprint_or_no_resume(loc, records):
    with MongoStore.create_writer(loc, commit_bytes=4096) as writer:
        add_all(writer, writer.open("fp"), records[:6])
        writer.flush()
    with pytest.raises(ResumeMismatchError, match=r"\.partial.*--no-resume"):
        MongoStore.create_writer(loc).open("other", resume=True)
    with MongoStore.create_writer(loc) as writer:
        assert writer.open("fp", resume=True).next_index == 6
    with MongoStore.create_writer(loc) as writer:
        assert writer.open("other", resume=False).next_index == 0
        assert list(writer.iter_index()) == []


KILL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}]
    from tests.packer.stores.test_mongo_store import build, make_records
    build({loc!r}, make_records(), commit_bytes=1)
""")


@mongo
def test_killed_build_resumes_to_the_same_store(loc, records):
    """SIGKILL right after the 5th commit (base.py's fault hook), then resume in this process."""
    script = KILL_SCRIPT.format(repo=str(REPO), loc=loc)
    env = dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="5")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert not MongoStore.exists(loc)
    with MongoStore.create_writer(loc) as writer:
        assert writer.open("fp").next_index == 5
    build(loc, records)
    ref = build(mongo_support.new_store_location("ref"), records)
    try:
        with open_store(loc) as a, open_store(ref) as b:
            assert a.metadata.index_checksum == b.metadata.index_checksum
            assert [bytes(r.data) for r in a.get_many(range(12))] == [bytes(r.data) for r in b.get_many(range(12))]
    finally:
        mongo_support.drop_location(ref)


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------
@mongo
def test_duplicate_key_is_a_clear_error(loc, records):
    dup = Record(**{**records[3].__dict__, "key": records[1].key})
    recs = records[:3] + [dup] + records[4:]
    with pytest.raises(StoreError) as err:
        build(loc, recs)
    msg = str(err.value)
    assert loc in msg and f"duplicate key {records[1].key!r} (index 3)" in msg and ".partial" in msg


@mongo
def test_bad_credentials_are_named_without_the_password(loc):
    uri, db, coll = mongo_support.split_location(loc)
    bad = uri.replace("mongodb://", "mongodb://alice:s3cret@") + f"/{db}/{coll}"
    with pytest.raises(StoreError) as err:
        open_store(bad, timeout=3)
    assert "alice:***@" in str(err.value) and "s3cret" not in str(err.value)
    with pytest.raises(StoreError) as err:
        MongoStore.exists(bad)
    assert "s3cret" not in str(err.value)


@mongo
def test_damaged_documents_are_record_errors(store, records):
    client = mongo_support.client_for(store)
    try:
        coll = raw_collection(client, store)
        coll.update_one({"_id": 2}, {"$unset": {"width": ""}})
        coll.update_one({"_id": 3}, {"$set": {"data": None}})
        coll.update_one({"_id": 4}, {"$set": {"data": b"\xff\xd8" + records[4].data[2:-4]}})
        coll.delete_one({"_id": 5})
    finally:
        client.close()
    with open_store(store) as reader:
        for i, words in [(2, "damaged"), (3, "bytes are missing"), (5, "missing")]:
            with pytest.raises(RecordError, match=words) as err:
                reader.get(i)
            assert err.value.index == i
        assert not reader.get(4).data_ok()
        problems = reader.check_structure()
        assert len(reader) == 11 and any("11 documents, metadata says 12" in p for p in problems)
        assert any("span 0..11 for 11 documents" in p for p in problems), problems


@mongo
def test_verify_and_info_through_the_api(loc, tmp_path):
    import packer

    images = tmp_path / "images"
    for i in range(6):
        (images / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (images / f"c{i % 2}" / f"{i}.jpg").write_bytes(make_jpeg(30 + i, 40, seed=i))
    rep = packer.build(images, None, loc, format="mongo", workers=1, report_path=tmp_path / "r.json")
    assert rep.published and rep.records == 6
    assert packer.verify(loc, deep=True).ok
    info = packer.info(loc)
    assert info.count == 6 and info.format == "mongo" and info.size_bytes > 0
    client = mongo_support.client_for(loc)
    try:
        doc = raw_collection(client, loc).find_one({"_id": 4})
        data = bytearray(doc["data"])
        data[len(data) // 2] ^= 0xFF
        raw_collection(client, loc).update_one({"_id": 4}, {"$set": {"data": bytes(data)}})
    finally:
        client.close()
    rep = packer.verify(loc)
    assert not rep.ok and [(p.index, "checksum" in p.reason) for p in rep.problems] == [(4, True)]


# ---------------------------------------------------------------------------------------
# a server that goes away
# ---------------------------------------------------------------------------------------
@pytest.fixture
def private_server(tmp_path):
    mongo_support.mongo_uri_or_skip()
    mongo_support.require_server_script()
    srv = mongo_support.PrivateServer(tmp_path / "srv").start()
    yield srv
    srv.stop()


@mongo
def test_server_going_away_mid_read_is_a_quick_clear_error(private_server, records):
    import signal

    loc = f"{private_server.uri}/pk_test_private/gone"
    build(loc, records)
    reader = open_store(loc, timeout=2, retries=2)
    assert reader.get_many([0, 1])[1].checksum == records[1].checksum

    os.kill(private_server.pid, signal.SIGSTOP)           # hung: accepts nothing, answers nothing
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="unreachable"):
            reader.get_many([2, 3])
        assert time.monotonic() - t0 < 5
    finally:
        os.kill(private_server.pid, signal.SIGCONT)
    assert reader.get(4).checksum == records[4].checksum  # back: the same reader recovers
    writer = MongoStore.create_writer(f"{private_server.uri}/pk_test_private/building", timeout="2")
    state = writer.open("fp")
    add_all(writer, state, records[:3])
    writer.flush()

    private_server.kill()                                 # gone for good
    t0 = time.monotonic()
    add_all(writer, state, records[3:6])
    with pytest.raises(StoreError, match="cannot reach.*rerun the build to resume"):
        writer.flush()
    assert time.monotonic() - t0 < 8
    writer.abort()
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="unreachable") as err:
        reader.get_many([2, 3])
    elapsed = time.monotonic() - t0
    assert elapsed < 5, elapsed
    assert f"{private_server.uri}/pk_test_private/gone" in str(err.value)
    t0 = time.monotonic()
    with pytest.raises(StoreError):
        open_store(loc, timeout=1)
    assert time.monotonic() - t0 < 4
    reader.close()


@mongo
@pytest.mark.timeout(60)
def test_a_test_waits_out_a_stalled_test_server_and_says_so(private_server, monkeypatch):
    """The suite's own guard (tests/mongo_support.py): a server that answers nothing for a few
    seconds when a test starts delays that test with a warning, instead of failing it on the
    product's 10 s timeout; a server gone for good fails it."""
    import signal
    import threading
    import warnings

    monkeypatch.setenv(mongo_support.URI_ENV, private_server.uri)
    monkeypatch.setattr(mongo_support, "_checked", {})
    monkeypatch.setattr(mongo_support, "PATIENT_PING_MS", 15_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mongo_support.new_store_location("before")        # answers at once: no warning
    os.kill(private_server.pid, signal.SIGSTOP)
    threading.Timer(3.0, os.kill, (private_server.pid, signal.SIGCONT)).start()
    t0 = time.monotonic()
    with pytest.warns(UserWarning, match=r"took \d+\.\d s to answer a ping"):
        loc = mongo_support.new_store_location("stalled")
    assert time.monotonic() - t0 >= 2.9
    assert loc.startswith(private_server.uri + "/pk_test_")

    monkeypatch.setattr(mongo_support, "PATIENT_PING_MS", 2_000)
    private_server.kill()
    monkeypatch.setenv(mongo_support.REQUIRE_ENV, "1")
    for _ in range(2):                                    # the second fails at once
        t0 = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="does not answer a ping"):
            mongo_support.new_store_location("gone")
    assert time.monotonic() - t0 < 1


# ---------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------
class StoreDataset:
    """Map-style dataset over a reader made in the parent (the risky way round) with a
    batched ``__getitems__``, as the DataLoader calls it."""

    def __init__(self, reader):
        self.reader = reader

    def __len__(self):
        return self.reader.metadata.count

    def __getitems__(self, indices):
        return [(r.index, os.getpid(), r.checksum, checksum(r.data)) for r in self.reader.get_many(indices)]


@mongo
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_read_correctly(store, records, method):
    torch_data = pytest.importorskip("torch.utils.data")
    reader = open_store(store)
    reader.get(0)                      # the parent holds a connected client when workers start
    loader = torch_data.DataLoader(StoreDataset(reader), batch_size=4, num_workers=2,
                                   multiprocessing_context=method, collate_fn=list)
    items = [item for batch in loader for item in batch]
    assert [i for i, *_ in items] == list(range(12))
    assert all(stored == actual == records[i].checksum for i, _, stored, actual in items)
    assert {pid for _, pid, *_ in items} - {os.getpid()}
    assert reader.get(5).checksum == records[5].checksum        # parent client still good
    reader.close()


def _child_read(reader, q):
    inherited = reader._client
    sums = [reader.get(i).checksum for i in range(12)]
    q.put((sums, reader._client is not inherited and reader._pid == os.getpid()))


@mongo
def test_plain_fork_makes_a_new_client_in_the_child(store, records):
    reader = open_store(store)
    reader.get(1)
    parent_client = reader._client
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(reader, q))
    p.start()
    got = q.get(timeout=30)
    p.join(30)
    assert p.exitcode == 0 and got == ([r.checksum for r in records], True)
    assert reader._client is parent_client and reader.get(2).checksum == records[2].checksum
    reader.close()


@mongo
def test_store_dataset_passes_reader_options_and_decodes_in_fork_workers(store, records):
    torch = pytest.importorskip("torch")
    from readers import StoreDataset, collate_list

    ds = StoreDataset(store, return_key=True, layout="HWC", apply_exif=False,
                      reader_options={"timeout": 5, "retries": 1})
    ds[0]                                           # parent opens first; workers must not reuse it
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork",
                                         collate_fn=collate_list)
    samples = [s for batch in loader for s in batch]
    assert [s[2] for s in samples] == [r.key for r in records]
    assert [tuple(s[0].shape[:2]) for s in samples] == [(r.height, r.width) for r in records]
    assert ds.reader._timeout_s == 5 and ds.reader._retries == 1
    ds.close()
