"""Hand-edited ("hostile") stores, as a downloaded dataset can be: every field read from a store
is checked when it is opened, and each bad one gives a packer error naming the store and the
field, exit code 1 from ``packer verify`` / ``verify --deep`` / ``info`` without a traceback, in
bounded time (subprocess timeouts) and memory (an address-space limit where a declared size
would make a reader allocate it).

Stores are built small with packer itself, then edited the way an attacker would: the LMDB
``meta``/``records`` entries with the ``lmdb`` module, the HDF5 attribute and datasets with
h5py, the MongoDB metadata document with pymongo.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

import packer
from packer.core.errors import RecordError, StoreError
from packer.sample import make_dataset
from packer.stores import open_store
from tests import REPO

DEEP = 200_000
pytestmark = pytest.mark.timeout(300)

#: Bad values of the metadata field ``count`` and a word the error must contain.
BAD_COUNTS = [(10 ** 12, "records"), ("12", "integer"), (12.5, "integer"), (True, "integer"),
              (-1, "negative")]


def nested(depth: int = DEEP) -> str:
    """A JSON object nested ``depth`` levels deep: ``{"a":[[[...]]]}``."""
    return '{"a":' + "[" * depth + "]" * depth + "}"


# ---------------------------------------------------------------------------------------
# the one JSON reader of store contents
# ---------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_json_nesting_is_bounded_in_linear_time():
    from packer.core.records import MAX_JSON_DEPTH, json_depth, loads_bounded
    assert json_depth(b'{"a": [[1], "]]]", "\\"[["]}') == 3
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(ok) == json.loads(ok)
    for hostile in (nested(), "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
                    '["\\' + '"\\' * 300_000,          # unterminated string of escaped quotes
                    "[" * 1_000_000, 5, None):
        with pytest.raises(ValueError):
            loads_bounded(hostile)


# ---------------------------------------------------------------------------------------
# stores: built once per module, copied per test
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return make_dataset(root, 6, kind="classes", sizes=((40, 48), (32, 30)), seed=3)[0]


@pytest.fixture(scope="module")
def pristine(images, tmp_path_factory):
    """``pristine(kind)`` -> path of a store built once: ``lmdb``, ``hdf5`` or ``pixels``."""
    root = tmp_path_factory.mktemp("pristine")
    built = {}

    def get(kind: str) -> str:
        if kind not in built:
            loc = str(root / {"lmdb": "s.lmdb", "hdf5": "s.h5", "pixels": "p.h5"}[kind])
            opts = {"pixels": "16x16"} if kind == "pixels" else None
            rep = packer.build(images, None, loc, "lmdb" if kind == "lmdb" else "hdf5", workers=1,
                            store_options=opts, report_path=str(root / f"{kind}.report.json"))
            assert rep.ok
            built[kind] = loc
        return built[kind]
    return get


@pytest.fixture
def store_copy(pristine, tmp_path):
    def copy(kind: str) -> str:
        src = pristine(kind)
        dst = str(tmp_path / os.path.basename(src))
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, dst)
        return dst
    return copy


def lmdb_edit(loc: str, db: bytes, key: bytes, edit) -> None:
    """Replace ``key`` of LMDB database ``db`` by ``edit(old bytes)``."""
    import lmdb
    env = lmdb.open(loc, max_dbs=8)
    try:
        handle = env.open_db(db)
        with env.begin(write=True, db=handle) as txn:
            txn.put(key, edit(bytes(txn.get(key))))
    finally:
        env.close()


def lmdb_metadata(loc: str, **fields) -> None:
    lmdb_edit(loc, b"meta", b"metadata", lambda raw: json.dumps({**json.loads(raw), **fields}).encode())


def hdf5_metadata(loc: str, raw: str | None = None, **fields) -> None:
    import h5py
    with h5py.File(loc, "r+") as f:
        f.attrs["packer_metadata"] = raw if raw is not None else json.dumps(
            {**json.loads(f.attrs["packer_metadata"]), **fields})


# ---------------------------------------------------------------------------------------
# running the CLI and the readers
# ---------------------------------------------------------------------------------------
#: Runs the packer CLI, or a library check, under an address-space limit of 2 GiB above what
#: the imports took: an allocation the size a hostile store declares fails the test, not the machine.
_LIMITED = r"""
import resource, sys
import cv2, h5py, lmdb, numpy, tqdm, turbojpeg
import packer
from packer import repair
from packer import cli
from packer.core.errors import PackerError
from packer.stores import open_store
if sys.argv[1] == "--readers":
    import readers.dataset, readers.crops, readers.train, readers.raw
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
if sys.argv[1] != "--readers":
    sys.argv = ["packer", *sys.argv[1:]]
    cli.cli()
loc = sys.argv[2]
opens = {"open_store": lambda: open_store(loc), "StoreDataset": lambda: readers.dataset.StoreDataset(loc),
         "CropDataset": lambda: readers.train.CropDataset(loc, readers.crops.FullDecode()),
         "RawReader": lambda: readers.raw.RawReader(loc)}
for name, make in opens.items():
    try:
        make()
    except PackerError as exc:
        print(f"{name}: {type(exc).__name__}: {exc}")
    else:
        print(f"{name}: opened")
"""


def run(*args: str, limited: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-c", _LIMITED, *args] if limited else [sys.executable, "-m", "packer", *args]
    try:
        # in the working directory: a server store's verify result goes there (tmp_path for mongo)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`packer {' '.join(args)}` still running after {timeout} s (a hostile store hangs it)")


def assert_refused(loc: str, *words: str, limited: bool = False) -> None:
    """verify, verify --deep and info: exit 1, no traceback, the store and ``words`` named."""
    for args in (["verify", loc], ["verify", "--deep", loc], ["info", loc]):
        p = run(*args, limited=limited)
        # verify lists problems on stdout (BAD ...) and sums up on stderr; info fails on stderr.
        out = p.stderr if args[0] == "info" else p.stdout + p.stderr
        assert p.returncode == 1, (args, p.returncode, p.stdout[-2000:], p.stderr[-3000:])
        assert "Traceback" not in p.stderr, (args, p.stderr[-3000:])
        assert loc in out and all(w in out.replace(loc, "") for w in words), (args, words, out[-3000:])


def assert_readers_refuse(loc: str, *words: str, limited: bool = False) -> None:
    """Every reader that opens the store raises a packer error naming the store and ``words``."""
    p = run("--readers", loc, limited=True, timeout=120) if limited else None
    if p is None:
        from readers.crops import FullDecode
        from readers.dataset import StoreDataset
        from readers.raw import RawReader
        from readers.train import CropDataset
        lines = []
        for name, make in {"open_store": lambda: open_store(loc), "StoreDataset": lambda: StoreDataset(loc),
                           "CropDataset": lambda: CropDataset(loc, FullDecode()),
                           "RawReader": lambda: RawReader(loc)}.items():
            with pytest.raises(StoreError) as err:
                make()
            lines.append(f"{name}: {type(err.value).__name__}: {err.value}")
    else:
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
        lines = p.stdout.splitlines()
    assert len(lines) == 4, lines
    for line in lines:
        assert "StoreError" in line and loc in line and all(w in line.replace(loc, "") for w in words), line


# ---------------------------------------------------------------------------------------
# LMDB
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("count,word", BAD_COUNTS, ids=[repr(c) for c, _ in BAD_COUNTS])
def test_lmdb_count(store_copy, count, word):
    loc = store_copy("lmdb")
    lmdb_metadata(loc, count=count)
    assert_refused(loc, "'count'", word)
    assert_readers_refuse(loc, "'count'", word)


@pytest.mark.parametrize("field,value", [("class_names", "cat"), ("class_names", [1, 2]), ("label_schema", 7),
                                         ("build_options", []), ("stats", {"width_sum": "wide"}),
                                         ("quarantine", ["x"]), ("format_version", "1"),
                                         ("checksum_algorithm", None)])
def test_lmdb_field_types(store_copy, field, value):
    loc = store_copy("lmdb")
    lmdb_metadata(loc, **{field: value})
    assert_refused(loc, f"'{field}'")
    assert_readers_refuse(loc, f"'{field}'")


def test_lmdb_metadata_nested_deep(store_copy):
    loc = store_copy("lmdb")
    lmdb_edit(loc, b"meta", b"metadata", lambda raw: nested().encode())
    assert_refused(loc, "metadata", "nested")
    assert_readers_refuse(loc, "metadata", "nested")


def test_lmdb_record_nested_deep(store_copy):
    loc = store_copy("lmdb")
    lmdb_edit(loc, b"records", struct.pack(">Q", 3), lambda raw: nested().encode())
    for args in (["verify", loc], ["verify", "--deep", loc]):
        p = run(*args)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
        bad = [line for line in p.stdout.splitlines() if line.startswith("BAD")]
        assert len(bad) == 1 and "(index 3)" in bad[0] and "nested" in bad[0].replace(loc, ""), p.stdout
    from readers.dataset import StoreDataset
    with pytest.raises(RecordError, match="nested") as err:
        StoreDataset(loc)[3]
    assert err.value.index == 3 and err.value.store == loc
    with open_store(loc) as r, pytest.raises(RecordError, match="nested"):
        r.read_labels()
    assert StoreDataset(loc)[2] is not None   # the other records still read


# ---------------------------------------------------------------------------------------
# HDF5
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("count,word", [(10 ** 12, "records"), ("12", "integer")], ids=["1e12", "'12'"])
def test_hdf5_count(store_copy, count, word):
    loc = store_copy("hdf5")
    hdf5_metadata(loc, count=count)
    assert_refused(loc, "'count'", word)
    assert_readers_refuse(loc, "'count'", word)


def test_hdf5_metadata_nested_deep(store_copy):
    loc = store_copy("hdf5")
    hdf5_metadata(loc, raw=nested())
    assert_refused(loc, "metadata", "nested")
    assert_readers_refuse(loc, "metadata", "nested")


def test_hdf5_record_nested_deep(store_copy):
    import h5py
    import numpy as np
    loc = store_copy("hdf5")
    with h5py.File(loc, "r+") as f:
        off = f["record_meta_offsets"][:]
        blob = f["record_meta"][:]
        metas = [blob[off[j]:off[j + 1]].tobytes() for j in range(len(off) - 1)]
        key = json.loads(metas[3])["key"]
        metas[3] = nested().encode()
        new = np.frombuffer(b"".join(metas), np.uint8)
        f["record_meta"].resize(new.size, axis=0)
        f["record_meta"][:] = new
        f["record_meta_offsets"][:] = np.concatenate([[0], np.cumsum([len(m) for m in metas])])
    for args in (["verify", loc], ["verify", "--deep", loc]):
        p = run(*args)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
        bad = [line for line in p.stdout.splitlines() if line.startswith("BAD")]
        assert len(bad) == 1 and key in bad[0] and "nested" in bad[0].replace(loc, ""), p.stdout
    from readers.dataset import StoreDataset
    with pytest.raises(RecordError, match="nested") as err:
        StoreDataset(loc)[3]
    assert err.value.key == key and err.value.index == 3


def test_hdf5_pixel_store_declaring_huge_images(store_copy):
    """30000x30000 RGB images (2.5 GiB each) declared by a small file: refused from the file
    size before anything is allocated. Run under an address-space limit."""
    import h5py
    loc = store_copy("pixels")
    with h5py.File(loc, "r+") as f:
        n = f["pixels"].shape[0]
        del f["pixels"]
        f.create_dataset("pixels", shape=(n, 30000, 30000, 3), dtype="u1", chunks=(1, 1000, 1000, 3))
    assert os.path.getsize(loc) < 10 << 20
    assert_refused(loc, "'pixels'", "30000x30000", limited=True)
    assert_readers_refuse(loc, "'pixels'", "30000x30000", limited=True)


# ---------------------------------------------------------------------------------------
# manifest (a JSON file that names shard stores)
# ---------------------------------------------------------------------------------------
def test_manifest_nested_and_bad_shard_count(pristine, tmp_path):
    from packer.stores.manifest import manifest_checksum, read_manifest
    shard = pristine("lmdb")
    loc = str(tmp_path / "m.packer-manifest.json")
    from packer.jobs.merge import merge
    merge([shard], loc)
    good = json.loads(open(loc).read())
    with open(loc, "w") as fh:
        fh.write('{"packer_manifest": 1, "metadata": ' + nested() + ', "shards": []}')
    assert_refused(loc, "manifest", "nested")
    with pytest.raises(StoreError, match="nested"):
        read_manifest(loc)
    bad = json.loads(json.dumps(good))
    bad["shards"][0]["count"] = "many"
    with open(loc, "w") as fh:
        json.dump(bad, fh)
    assert_refused(loc, "'count'")
    assert_readers_refuse(loc, "'count'")
    # a count consistent through the manifest (its checksum recomputed), not with the shard
    good["shards"][0]["count"] = good["metadata"]["count"] = 10 ** 12
    good["metadata"]["index_checksum"] = manifest_checksum(good["shards"])
    with open(loc, "w") as fh:
        json.dump(good, fh)
    assert_refused(loc, "'count'", "shard 0")
    assert_readers_refuse(loc, "'count'", "shard 0", limited=True)


# ---------------------------------------------------------------------------------------
# MongoDB (the metadata document holds the same StoreMetadata JSON)
# ---------------------------------------------------------------------------------------
@pytest.fixture
def mongo_store(images, tmp_path, monkeypatch):
    pytest.importorskip("pymongo")
    from tests import mongo_support
    monkeypatch.chdir(tmp_path)          # the build report of a server store goes to the cwd
    loc = mongo_support.new_store_location("hostile")
    assert packer.build(images, None, loc, "mongo", workers=1).ok
    client = mongo_support.client_for(loc)
    _, db, coll = mongo_support.split_location(loc)
    meta = client[db][coll + ".meta"]

    def set_json(text: str) -> None:
        meta.update_one({"_id": "metadata"}, {"$set": {"json": text}})
    try:
        yield loc, set_json, json.loads(meta.find_one({"_id": "metadata"})["json"])
    finally:
        client.close()
        mongo_support.drop_location(loc)


@pytest.mark.mongo
@pytest.mark.parametrize("count,word", [(10 ** 12, "documents"), ("12", "integer"), (-1, "negative")],
                         ids=["1e12", "'12'", "-1"])
def test_mongo_count(mongo_store, count, word):
    loc, set_json, meta = mongo_store
    set_json(json.dumps(dict(meta, count=count)))
    assert_refused(loc, "'count'", word)
    with pytest.raises(StoreError, match="'count'"):
        open_store(loc)


@pytest.mark.mongo
def test_mongo_metadata_nested_deep(mongo_store):
    loc, set_json, _ = mongo_store
    set_json(nested())
    assert_refused(loc, "metadata", "nested")
    with pytest.raises(StoreError, match="nested"):
        open_store(loc)


# ---------------------------------------------------------------------------------------
# HDF5 cut short inside a global heap (issue 26)
# ---------------------------------------------------------------------------------------
@pytest.mark.timeout(150)
def test_hdf5_cut_to_4k_verify_ends_with_exit_1(store_copy):
    """An HDF5 store truncated to 4 KiB: the reader refuses it (StoreError), and ``verify`` /
    ``verify --deep`` report it and exit 1 within seconds. They hung: salvage reads a copy padded
    with zeros, and HDF5 loops forever on a string of a global heap collection the cut split."""
    loc = store_copy("hdf5")
    os.truncate(loc, 4096)
    with pytest.raises(StoreError, match="cut short"):
        open_store(loc)
    for args in (["verify", loc], ["verify", "--deep", loc]):
        p = run(*args, timeout=30)
        out = p.stdout + p.stderr
        assert p.returncode == 1, (args, p.returncode, out[-3000:])
        assert "Traceback" not in p.stderr, (args, p.stderr[-3000:])
        assert "cut short" in out and "global heap" in out and loc in out, (args, out[-3000:])
    assert not [n for n in os.listdir(os.path.dirname(loc)) if n.startswith(".salvage-")]   # copy removed
