"""A store rebuilt in place under its readers (issue 26, "A store replaced under its readers").

Every publish writes a new build id into the store's metadata. A Dataset records the id of the
store it opened; every reader opened later (DataLoader workers, re-opens after a fork, a close or
an error) must read that same store version, else StoreError ("the store was replaced since this
Dataset was created"): never records of two stores in one epoch or one read pass.

Each build here has its own class names (``b<k>x``, ``b<k>y``), so every record's key
(``b<k>x/img_00.jpg``) says which build it came from, and a Dataset's metadata says which build it
was made on.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from packer.core.errors import StoreError
from packer.jobs.build import build
from packer.sample import encode_jpeg, synthetic_image
from packer.stores import open_store
from readers import StoreDataset

REPLACED = "the store was replaced since"
_SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}


def _params(*formats):
    return [pytest.param(f, marks=[pytest.mark.mongo] if f == "mongo" else [], id=f) for f in formats]


ALL = _params("lmdb", "hdf5", "mongo")


@pytest.fixture
def location(request, tmp_path, monkeypatch):
    """``location(fmt)``: a fresh store location of that format (MongoDB: a test database)."""
    made = []

    def make(fmt: str) -> str:
        if fmt == "mongo":
            from tests import mongo_support
            monkeypatch.chdir(tmp_path)   # build reports for server URLs go to the working directory
            loc = mongo_support.new_store_location("identity")
        else:
            loc = str(tmp_path / ("store" + _SUFFIX[fmt]))
        made.append((fmt, loc))
        return loc

    yield make
    for fmt, loc in made:
        if fmt == "mongo":
            from tests import mongo_support
            mongo_support.drop_location(loc)


def make_source(root: Path, build_no: int, n: int = 8, *, name: str = "img") -> Path:
    """ImageFolder of ``n`` small JPEGs in classes ``b<k>x`` / ``b<k>y``, pixels seeded by build."""
    import numpy as np

    rng = np.random.default_rng(1000 + build_no + (0 if name == "img" else 500))
    src = root / f"src{build_no}{name}"
    for i in range(n):
        path = src / f"b{build_no}{'xy'[i % 2]}" / f"{name}_{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_jpeg(synthetic_image(rng, 24 + 8 * (build_no % 3), 32), quality=90))
    return src


def build_of_key(key: str) -> str:
    return key.split("/")[0][:-1]          # "b3x/img_00.jpg" -> "b3"


def build_of_dataset(ds) -> str:
    return ds.metadata.class_names[0][:-1]  # the class names the Dataset opened


def publish(src: Path, loc: str, tmp_path: Path, *, overwrite: bool = False) -> None:
    build(str(src), None, loc, overwrite=overwrite, executor="inline", workers=1,
          report_path=str(tmp_path / f"report-{time.monotonic_ns()}.json"))


def rebuild_with_cli(src: Path, loc: str, tmp_path: Path) -> None:
    """``packer build SRC -o LOC --overwrite``, as a user rebuilds a store in place."""
    run = subprocess.run([sys.executable, "-m", "packer", "build", str(src), "-o", loc, "--overwrite",
                          "-j", "1", "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def refused_as_replaced(excinfo) -> str:
    """The message of a StoreError raised for a replaced store, in a worker (re-raised by the
    DataLoader as StoreError, or wrapped in RuntimeError naming it) or in this process."""
    msg = str(excinfo.value)
    assert isinstance(excinfo.value, StoreError) or "Caught StoreError" in msg, msg
    assert REPLACED in msg, msg
    return msg


def keys_of(loader) -> list:
    return [key for batch in loader for key in batch[2]]


def loader_of(ds, workers: int = 2):
    return torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=_collate_keys)


def _collate_keys(batch):
    return [s[0] for s in batch], [s[1] for s in batch], [s[2] for s in batch]


# ---------------------------------------------------------------------------------------------
# Build ids
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ALL)
def test_every_publish_writes_a_new_build_id(fmt, location, tmp_path):
    loc = location(fmt)
    publish(make_source(tmp_path, 0), loc, tmp_path)
    with open_store(loc) as r:
        first = r.metadata.build_id
        assert len(first) >= 16 and r.build_id == first
        if fmt == "mongo":   # the metadata document and every record carry the same id
            assert r._build_id == first
    publish(make_source(tmp_path, 1), loc, tmp_path, overwrite=True)
    from packer.jobs.append import append
    with open_store(loc) as r:
        second = r.build_id
    append(loc, str(make_source(tmp_path, 1, name="more")), None, report_path=str(tmp_path / "append.json"))
    with open_store(loc) as r:
        third = r.build_id
        assert len(r) == 16
    assert len({first, second, third}) == 3


@pytest.mark.timeout(60)
def test_convert_writes_its_own_build_id(tmp_path):
    from packer.jobs.convert import convert

    src, dst = str(tmp_path / "a.lmdb"), str(tmp_path / "b.h5")
    publish(make_source(tmp_path, 0), src, tmp_path)
    convert(src, dst, "hdf5")
    with open_store(src) as a, open_store(dst) as b:
        assert b.metadata.build_id and b.build_id != a.build_id
        assert b.metadata.index_checksum == a.metadata.index_checksum


# ---------------------------------------------------------------------------------------------
# A Dataset opened on A, A rebuilt as B with --overwrite
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", ALL)
def test_dataloader_workers_refuse_a_store_replaced_since_the_dataset(fmt, location, tmp_path):
    loc = location(fmt)
    publish(make_source(tmp_path, 0), loc, tmp_path)
    ds = StoreDataset(loc, return_key=True)
    assert {build_of_key(k) for k in keys_of(loader_of(ds))} == {"b0"}   # workers read A
    rebuild_with_cli(make_source(tmp_path, 1), loc, tmp_path)   # same length: a mix would go unnoticed

    # Before: the workers silently read B's records under A's Dataset (length, classes of A).
    with pytest.raises((StoreError, RuntimeError)) as excinfo:
        keys_of(loader_of(ds))
    msg = refused_as_replaced(excinfo)
    with open_store(loc) as r:
        new_id = r.build_id
    assert new_id != ds.build_id
    assert loc.rsplit("@", 1)[-1].split("/")[-1] in msg
    assert f"build id {ds.build_id}, now {new_id}" in msg and "make a new Dataset" in msg

    # The parent process opens the store lazily too: its reads refuse B as well.
    with pytest.raises(StoreError, match=REPLACED):
        ds[0]
    with pytest.raises(StoreError, match=REPLACED):
        ds.targets

    fresh = StoreDataset(loc, return_key=True)   # what the message says to do
    assert len(fresh) == 8 and {build_of_key(k) for k in keys_of(loader_of(fresh))} == {"b1"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ALL)
def test_a_reopen_in_the_middle_of_a_pass_is_checked(fmt, location, tmp_path):
    """Half a pass read, the store replaced, the reader re-opened (as after an error or a close):
    the second half must not come from the new store."""
    loc = location(fmt)
    publish(make_source(tmp_path, 0), loc, tmp_path)
    ds = StoreDataset(loc, return_key=True)
    first_half = [ds[i][2] for i in range(4)]
    publish(make_source(tmp_path, 1), loc, tmp_path, overwrite=True)
    ds.close()
    with pytest.raises(StoreError, match=REPLACED):
        [ds[i][2] for i in range(4, len(ds))]
    assert {build_of_key(k) for k in first_half} == {"b0"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ALL)
def test_an_open_reader_never_returns_the_new_store_records(fmt, location, tmp_path):
    """packer's own reader, opened on A before the rebuild: it reads A (the handle it opened) or
    raises, never B's records under A's metadata (HDF5 opened the path again at the first read)."""
    loc = location(fmt)
    publish(make_source(tmp_path, 0), loc, tmp_path)
    with open_store(loc) as reader:
        publish(make_source(tmp_path, 1), loc, tmp_path, overwrite=True)
        try:
            recs = reader.get_many(range(len(reader)))
        except StoreError as exc:
            assert "replaced" in str(exc), exc
        else:
            assert {build_of_key(r.key) for r in recs} == {"b0"}
            assert fmt == "lmdb"   # the others open the store again per read or per process


@pytest.mark.timeout(120)
def test_raw_reader_refuses_a_store_replaced_since_it_was_created(tmp_path):
    from readers.raw import RawReader

    loc = str(tmp_path / "store.lmdb")
    publish(make_source(tmp_path, 0), loc, tmp_path)
    with RawReader(loc, threads=1) as raw:
        assert raw.read([0, 1]).keys[0].startswith("b0")
        publish(make_source(tmp_path, 1), loc, tmp_path, overwrite=True)
        raw.close()   # a read after close() opens fresh handles
        with pytest.raises(StoreError, match=REPLACED):
            raw.read([2, 3])


# ---------------------------------------------------------------------------------------------
# Stores built before build ids existed
# ---------------------------------------------------------------------------------------------
def _strip_build_id(fmt: str, loc: str) -> None:
    """Make ``loc`` look like a store published before the metadata held a build id."""
    if fmt == "lmdb":
        import lmdb

        env = lmdb.open(loc, max_dbs=8, subdir=True)
        try:
            meta_db = env.open_db(b"meta", create=False)
            with env.begin(write=True, db=meta_db) as txn:
                meta = json.loads(bytes(txn.get(b"metadata")))
                meta.pop("build_id", None)
                txn.put(b"metadata", json.dumps(meta, indent=1, sort_keys=True).encode())
        finally:
            env.close()
    else:
        import h5py

        with h5py.File(loc, "r+") as f:
            meta = json.loads(f.attrs["packer_metadata"])
            meta.pop("build_id", None)
            f.attrs["packer_metadata"] = json.dumps(meta, indent=1, sort_keys=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt", _params("lmdb", "hdf5"))
def test_a_store_without_build_id_reads_and_is_still_checked(fmt, location, tmp_path):
    loc = location(fmt)
    publish(make_source(tmp_path, 0), loc, tmp_path)
    _strip_build_id(fmt, loc)
    ds = StoreDataset(loc, return_key=True)
    assert {build_of_key(k) for k in keys_of(loader_of(ds))} == {"b0"}   # workers agree on its identity
    publish(make_source(tmp_path, 1), loc, tmp_path, overwrite=True)
    with pytest.raises((StoreError, RuntimeError)) as excinfo:
        keys_of(loader_of(ds))
    msg = refused_as_replaced(excinfo)
    assert ds.metadata.build_id == "" and ds.build_id.startswith("legacy-")
    assert f"build id {ds.build_id}, now" in msg


# ---------------------------------------------------------------------------------------------
# The race: read passes while another process rebuilds the store a few times
# ---------------------------------------------------------------------------------------------
_WRITER = """
import sys, time
from packer.jobs.build import build
loc, reports = sys.argv[1], sys.argv[2]
for n, src in enumerate(sys.argv[3:]):
    time.sleep(0.4)
    build(src, None, loc, overwrite=True, executor="inline", workers=1, report_path=f"{reports}/w{n}.json")
"""


def _read_pass(ds, workers: int) -> list:
    if workers:
        return keys_of(loader_of(ds, workers))   # the workers open the store, each on its own
    ds.close()   # a new epoch in this process opens the store again
    return [ds[i][2] for i in range(len(ds))]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, 0], ids=["workers", "in-process"])
@pytest.mark.parametrize("fmt", ALL)
def test_no_read_pass_mixes_two_stores_while_another_process_rebuilds(fmt, workers, location, tmp_path):
    loc = location(fmt)
    rebuilds = 4
    sources = [make_source(tmp_path, k, n=6) for k in range(rebuilds + 1)]
    publish(sources[0], loc, tmp_path)
    ds = StoreDataset(loc, return_key=True)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, loc, str(tmp_path), *map(str, sources[1:])],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 45
    passes, refused, mixed = 0, 0, []
    try:
        writer_done = False
        while time.monotonic() < deadline:
            writer_done = writer.poll() is not None
            try:
                keys = _read_pass(ds, workers)
            except (StoreError, RuntimeError) as exc:
                if isinstance(exc, RuntimeError) and "Caught StoreError" not in str(exc):
                    raise
                refused += 1
                ds = _reopen(loc, deadline)
                continue
            passes += 1
            builds = {build_of_key(k) for k in keys}
            if builds != {build_of_dataset(ds)} or len(keys) != len(ds):
                mixed.append((build_of_dataset(ds), sorted(builds), len(keys), len(ds)))
            if writer_done:   # one whole pass after the last rebuild: then stop
                break
    finally:
        if writer.poll() is None:
            writer.kill()
        out = writer.communicate(timeout=10)[0]
    assert writer.returncode == 0, out
    assert writer_done, f"the writer did not finish in time ({passes} passes)"
    assert not mixed, f"passes with records of another store than their Dataset's: {mixed[:5]}"
    # At least one replacement noticed and one whole pass after it (on a busy machine a pass with
    # two spawned workers can take as long as the four rebuilds: then that is all there is).
    assert passes >= 1 and refused >= 1, (passes, refused)
    assert build_of_dataset(ds) == f"b{rebuilds}"


def _reopen(loc: str, deadline: float):
    """A new Dataset on whatever store is published now (LMDB: none for a moment mid-publish)."""
    while True:
        try:
            return StoreDataset(loc, return_key=True)
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
