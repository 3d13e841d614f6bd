"""folder -> store -> X -> store gives the same records, for X in WebDataset, Hugging Face
datasets, MDS and TFRecord, on all three stores: every record's key, image bytes and label, and the
class names and label schema, equal the first store's. Through the CLI (auto-detected input,
``export --to``), and a damaged input in each format is listed by shard/member and exits 1."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from packer import build
from packer.interchange import available_formats, detect_input
from packer.jobs.export import export_dataset
from packer.stores import open_store
from tests.interchange_fixtures import dataset_store

#: The peer library each format's export writes with (the tests of the format check with it too).
PEERS = {"webdataset": "webdataset", "hf": "datasets", "mds": "streaming", "tfrecord": "tfrecord"}


def _need_peer(name):
    required = "PACKER_REQUIRE_MDS" if name == "mds" else "PACKER_REQUIRE_INTERCHANGE"
    if os.environ.get(required) == "1":
        __import__(PEERS[name])
    else:
        pytest.importorskip(PEERS[name])


def _records(loc):
    with open_store(loc) as r:
        meta = r.metadata
        recs = []
        for i in range(meta.count):
            rec = r.get(i)
            lab = rec.label
            lab = lab.tolist() if isinstance(lab, np.ndarray) else lab
            recs.append((rec.key, bytes(rec.data), lab))
    return meta.label_schema, list(meta.class_names), recs


@pytest.fixture(scope="module", params=["boxes", "classes"])
def first_store(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"rt-{request.param}")
    return dataset_store(root / "data", request.param, str(root / "first.lmdb"), n=14, seed=5, format="lmdb")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", available_formats())
@pytest.mark.parametrize("store", ["lmdb", "hdf5", pytest.param("mongo", marks=pytest.mark.mongo)])
def test_round_trip_is_exact(name, store, first_store, tmp_path, location_for_format):
    _need_peer(name)
    out = tmp_path / f"as-{name}"
    rep = export_dataset(first_store, out, name, shard_size=5)
    assert rep.records == len(_records(first_store)[2]) and len(rep.shards) >= 3
    assert detect_input(str(out)) == name
    second = location_for_format(store)
    back = build(str(out), None, second, format=store, workers=1)
    assert back.published and not back.rejected, back.to_dict()
    assert _records(second) == _records(first_store)


@pytest.fixture
def location_for_format(tmp_path, monkeypatch):
    made = []

    def make(fmt):
        if fmt == "mongo":
            from tests import mongo_support
            monkeypatch.chdir(tmp_path)
            loc = mongo_support.new_store_location("rt")
        else:
            loc = str(tmp_path / ("second" + {"lmdb": ".lmdb", "hdf5": ".h5"}[fmt]))
        made.append((fmt, loc))
        return loc

    yield make
    for fmt, loc in made:
        if fmt == "mongo":
            from tests import mongo_support
            mongo_support.drop_location(loc)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True,
                          timeout=240, cwd=cwd)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", available_formats())
def test_cli_export_then_build_from_the_dataset(name, first_store, tmp_path):
    _need_peer(name)
    out = tmp_path / "ds"
    r = _cli("export", first_store, out, "--to", name, "--shard-size", 4)
    assert r.returncode == 0, r.stderr
    assert f"packer build {out}" in r.stdout
    second = tmp_path / "second.lmdb"
    r = _cli("build", out, "-o", second, "-q")
    assert r.returncode == 0, r.stderr
    assert _records(str(second)) == _records(first_store)
    # the same, named explicitly
    r = _cli("build", out, "-o", tmp_path / "third.lmdb", "--from", name, "-q")
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(120)
def test_dataset_with_labels_argument_is_refused(first_store, tmp_path):
    _need_peer("webdataset")
    out = tmp_path / "wds"
    export_dataset(first_store, out, "webdataset", shard_size=5)
    (tmp_path / "labels").mkdir()
    r = _cli("build", out, tmp_path / "labels", "-o", tmp_path / "x.lmdb")
    assert r.returncode == 2 and "labels are inside it" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_export_refuses_a_non_empty_folder_and_leaves_no_partial(first_store, tmp_path):
    _need_peer("webdataset")
    out = tmp_path / "busy"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    r = _cli("export", first_store, out, "--to", "webdataset")
    assert r.returncode == 2 and str(out) in r.stderr
    assert (out / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", available_formats())
def test_a_cut_shard_is_listed_and_the_rest_is_built(name, first_store, tmp_path):
    """The last shard cut short: the build names that shard, exits 1 and publishes nothing by
    default; with --on-corrupt skip it publishes every sample of the intact shards."""
    _need_peer(name)
    out = tmp_path / "ds"
    rep = export_dataset(first_store, out, name, shard_size=5)
    shards = sorted(rep.shards)
    last = max(shards, key=lambda s: (os.path.basename(s)))
    size = os.path.getsize(last)
    with open(last, "r+b") as fh:
        fh.truncate(size // 2)
    second = tmp_path / "second.lmdb"
    r = _cli("build", out, "-o", second, "-q")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and os.path.basename(last) in r.stderr, r.stderr
    assert not second.exists()
    # The checked samples were kept: the rerun resumes after them instead of starting over.
    r = _cli("build", out, "-o", second, "--on-corrupt", "skip", "--json")
    assert r.returncode == 1 and second.exists(), r.stderr
    import json
    assert json.loads(r.stdout)["resumed_from"] > 0
    _, _, first = _records(first_store)
    _, _, got = _records(str(second))
    assert 0 < len(got) < len(first) and all(g in first for g in got)


@pytest.mark.dask
@pytest.mark.timeout(300)
def test_dask_build_from_a_webdataset(first_store, tmp_path):
    """A sharded Dask build (LocalCluster on loopback) takes an interchange source too: the
    manifest reads back the same records as the first store."""
    if os.environ.get("PACKER_REQUIRE_DASK") != "1":
        pytest.importorskip("dask.distributed")
    _need_peer("webdataset")
    out = tmp_path / "wds"
    export_dataset(first_store, out, "webdataset", shard_size=5)
    manifest = tmp_path / "train.packer-manifest.json"
    rep = build(str(out), None, str(manifest), "lmdb", engine="dask", shards=2, n_workers=1,
                connect_timeout=120)
    assert rep.published, rep.to_dict()
    assert _records(str(manifest)) == _records(first_store)


@pytest.fixture(scope="module")
def damaged_store(tmp_path_factory):
    """An LMDB store whose record 2 has one image byte flipped (its checksum no longer matches)."""
    import struct

    import lmdb

    root = tmp_path_factory.mktemp("rt-damaged")
    loc = dataset_store(root / "data", "classes", str(root / "bad.lmdb"), n=6, seed=6, format="lmdb")
    env = lmdb.open(loc, max_dbs=8)
    try:
        data = env.open_db(b"data")
        with env.begin(write=True) as t:
            blob = bytearray(t.get(struct.pack(">Q", 2), db=data))
            blob[len(blob) // 2] ^= 0xFF
            t.put(struct.pack(">Q", 2), bytes(blob), db=data)
    finally:
        env.close()
    with open_store(loc) as r:
        return loc, r.get(2).key


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["folder", *available_formats()])
def test_a_damaged_record_stops_every_export_with_one_message(name, damaged_store, tmp_path):
    """``packer export`` and every interchange export refuse a record that fails its checksum with
    the same RecordError (store, key, index, the repair hint), and leave no output behind."""
    from packer.core.errors import RecordError
    from packer.jobs.export import export

    loc, key = damaged_store
    out = tmp_path / "out"
    if name != "folder":
        _need_peer(name)
    with pytest.raises(RecordError) as info:
        export(loc, out) if name == "folder" else export_dataset(loc, out, name, shard_size=2)
    assert str(info.value) == f"{loc}: key {key!r} (index 2): checksum mismatch (hint: packer repair first)"
    assert info.value.key == key and info.value.index == 2
    if name != "folder":
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
