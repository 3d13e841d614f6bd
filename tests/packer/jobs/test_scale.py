"""Scaling out: sharded builds, manifests (logical merge), merge --copy, append, pinned class ids,
and the Dask engine on a real LocalCluster (processes, loopback TCP) with a worker killed mid-build."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import packer
from packer.core.errors import SourceError, StoreError, UsageError
from packer.core.records import labels_equal
from packer.jobs.append import append
from packer.jobs.merge import merge
from packer.sample import make_dataset
from packer.sources.folders import collect_sources
from packer.stores import detect_format, open_store
from readers import StoreDataset, collate_list
from tests import REPO


def assert_identical(a_loc, b_loc):
    """The definition of "identical" for a sharded/merged dataset vs. a single build: same count,
    and record by record the same index, key, stored bytes, label, sizes, record and source
    checksums, record-metadata checksum; same label schema and class map."""
    with open_store(a_loc) as a, open_store(b_loc) as b:
        assert a.metadata.count == b.metadata.count == len(b)
        assert a.metadata.label_schema == b.metadata.label_schema
        assert a.metadata.class_names == b.metadata.class_names
        ra, rb = a.get_many(range(len(a))), b.get_many(range(len(b)))
        for x, y in zip(ra, rb):
            dx, dy = x.meta_dict(), y.meta_dict()
            assert labels_equal(x.label, y.label), x.key
            dx.pop("label"), dy.pop("label")
            assert dx == dy
            assert bytes(x.data) == bytes(y.data)
            assert y.data_ok() and y.meta_ok()


@pytest.fixture(scope="module")
def ds30(tmp_path_factory):
    images, _ = make_dataset(tmp_path_factory.mktemp("ds30"), 30, kind="classes", seed=3)
    return images


@pytest.fixture(scope="module")
def single(ds30, tmp_path_factory):
    loc = tmp_path_factory.mktemp("single") / "single.lmdb"
    assert packer.build(ds30, None, loc, workers=1).ok
    return loc


@pytest.mark.timeout(120)
def test_shards_merge_to_the_single_build(ds30, single, tmp_path):
    locs = []
    for i in range(3):
        loc = tmp_path / f"s{i}.lmdb"
        rep = packer.build(ds30, None, loc, workers=1, shard=f"{i}/3")
        assert rep.ok and rep.records == 10
        with open_store(loc) as r:
            info = r.metadata.build_options["shard"]
        assert (info["index"], info["count"], info["input_start"], info["input_stop"], info["inputs_total"]) == \
            (i, 3, 10 * i, 10 * i + 10, 30)
        locs.append(str(loc))
    man = tmp_path / "all.packer-manifest.json"
    rep = merge(list(reversed(locs)), man)           # given out of order: put back in shard order
    assert rep.records == 30 and rep.shards == 3 and not rep.copied
    assert detect_format(str(man)) == "manifest"
    assert_identical(single, man)
    with open_store(man) as r:
        assert r.shard_boundaries == [0, 10, 20, 30]
        keys = collect_sources(ds30).keys
        assert [r.index_of(k) for k in keys] == list(range(30))
    v = packer.verify(man, deep=True)
    assert v.ok and v.checked == 30, [str(p) for p in v.problems]
    single_stats = packer.info(single).metadata["stats"]
    assert packer.info(man).metadata["stats"] == single_stats
    # Physical merge into another format: bytes copied unchanged, index checksum equals the single build's.
    copy = tmp_path / "all.h5"
    rep = merge([str(man)], copy, copy=True, format="hdf5")
    assert rep.copied and rep.records == 30
    assert_identical(single, copy)
    with open_store(copy) as c, open_store(single) as s:
        assert c.metadata.index_checksum == s.metadata.index_checksum
    assert packer.verify(copy, deep=True).ok


@pytest.mark.timeout(60)
def test_more_shards_than_inputs_gives_empty_shards(ds30, single, tmp_path):
    small = tmp_path / "small"
    shutil.copytree(ds30 / "cat", small / "cat")
    n = len(list((small / "cat").iterdir()))
    locs = [str(tmp_path / f"e{i}.lmdb") for i in range(n + 2)]
    for i, loc in enumerate(locs):
        assert packer.build(small, None, loc, workers=1, shard=(i, len(locs))).published
    man = tmp_path / "e.packer-manifest.json"
    merge(locs, man)
    with open_store(man) as r:
        assert len(r) == n and r.shard_boundaries[-1] == n
    assert packer.verify(man).ok


def test_shard_spec_errors(ds30, tmp_path):
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(UsageError):
            packer.build(ds30, None, tmp_path / "x.lmdb", shard=bad)


@pytest.mark.timeout(120)
def test_merge_refuses_missing_doubled_and_foreign_shards(ds30, tmp_path, boxes_dataset):
    locs = [str(tmp_path / f"s{i}.lmdb") for i in range(3)]
    for i, loc in enumerate(locs):
        packer.build(ds30, None, loc, workers=1, shard=(i, 3))
    with pytest.raises(UsageError, match=r"1 of 3 shards missing \(shard index 1\)"):
        merge([locs[0], locs[2]], tmp_path / "m.json")
    rep = merge([locs[0], locs[2]], tmp_path / "m.json", allow_partial=True)
    assert rep.records == 20
    with pytest.raises(UsageError, match="given twice"):
        merge([locs[0], locs[0], locs[1], locs[2]], tmp_path / "m2.json")
    other = tmp_path / "other.lmdb"
    packer.build(*boxes_dataset, other, workers=1, shard=(1, 3))
    with pytest.raises(UsageError, match="other.lmdb"):
        merge(locs + [str(other)], tmp_path / "m3.json")
    with pytest.raises(UsageError, match="exists"):
        merge(locs, tmp_path / "m.json")


@pytest.mark.timeout(120)
def test_class_map_mismatch_refused_then_pinned(ds30, tmp_path):
    """A split lacking a class numbers the others differently; merge names it; --classes fixes it."""
    full = tmp_path / "full.lmdb"
    packer.build(ds30, None, full, workers=1)
    val_images = tmp_path / "val"
    for cls in ("cat", "dog"):              # no 'bird': 'cat' would become id 0 instead of 1
        shutil.copytree(ds30 / cls, val_images / cls)
    # Keys must not collide for a meaningful merge: rename the copies.
    for p in sorted(val_images.rglob("*.jpg")):
        p.rename(p.with_name("val_" + p.name))
    val = tmp_path / "val.lmdb"
    packer.build(val_images, None, val, workers=1)
    with pytest.raises(UsageError, match=r"class map differs.*val\.lmdb"):
        merge([str(full), str(val)], tmp_path / "m.json")
    pinned = tmp_path / "val_pinned.lmdb"
    packer.build(val_images, None, pinned, workers=1, classes=full)
    with open_store(pinned) as r, open_store(full) as f:
        assert r.metadata.class_names == f.metadata.class_names == ["bird", "cat", "dog"]
        for rec in r.get_many(range(len(r))):
            assert r.metadata.class_names[rec.label] == rec.key.split("/")[0]
    rep = merge([str(full), str(pinned)], tmp_path / "m.json")
    assert rep.records == 30 + len(list(val_images.rglob("*.jpg")))


def test_classes_file_forms_and_unknown_class(ds30, tmp_path):
    txt = tmp_path / "classes.txt"
    txt.write_text("# pinned\ndog\ncat\nbird\nfish\n")
    js = tmp_path / "classes.json"
    js.write_text(json.dumps({"dog": 0, "cat": 1, "bird": 2, "fish": 3}))
    jl = tmp_path / "list.json"
    jl.write_text(json.dumps(["dog", "cat", "bird", "fish"]))
    for spec in (txt, js, jl):
        loc = tmp_path / f"{spec.stem}{spec.suffix[1:]}.lmdb"
        packer.build(ds30, None, loc, workers=1, classes=spec)
        with open_store(loc) as r:
            assert r.metadata.class_names == ["dog", "cat", "bird", "fish"]   # 'fish' absent, keeps id 3
            for rec in r.get_many(range(len(r))):
                assert r.metadata.class_names[rec.label] == rec.key.split("/")[0]
    short = tmp_path / "short.txt"
    short.write_text("cat\ndog\n")
    with pytest.raises(SourceError, match="not in the pinned class map") as ei:
        packer.build(ds30, None, tmp_path / "bad.lmdb", classes=short)
    assert any("'bird'" in p for p in ei.value.problems)
    dup = tmp_path / "dup.txt"
    dup.write_text("cat\ncat\n")
    with pytest.raises(UsageError, match="twice"):
        packer.build(ds30, None, tmp_path / "bad.lmdb", classes=dup)
    gap = tmp_path / "gap.json"
    gap.write_text(json.dumps({"cat": 0, "dog": 2}))
    with pytest.raises(UsageError, match="exactly 0..1"):
        packer.build(ds30, None, tmp_path / "bad.lmdb", classes=gap)
    with pytest.raises(UsageError, match="no such file"):
        packer.build(ds30, None, tmp_path / "bad.lmdb", classes=tmp_path / "nope.txt")


@pytest.mark.timeout(120)
def test_manifest_verify_finds_changed_and_damaged_shards(ds30, tmp_path):
    locs = [str(tmp_path / f"s{i}.lmdb") for i in range(2)]
    for i, loc in enumerate(locs):
        packer.build(ds30, None, loc, workers=1, shard=(i, 2))
    man = tmp_path / "m.packer-manifest.json"
    merge(locs, man)
    # A shard rebuilt from other inputs after the merge: readers refuse it, verify names it.
    packer.build(ds30 / "cat", None, locs[1], workers=1, overwrite=True, allow_unlabeled=True, no_labels=True)
    v = packer.verify(man)
    assert not v.ok and any("s1.lmdb" in p.reason and "index checksum" in p.reason for p in v.problems)
    with open_store(man) as r:
        with pytest.raises(StoreError, match="changed since the manifest"):
            r.get(20)
        assert r.get(0).index == 0     # shard 0 still reads
    # An edited manifest is refused at open.
    doc = json.loads(man.read_text())
    doc["shards"][0]["count"] += 1
    doc["metadata"]["count"] += 1
    man.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="manifest checksum mismatch"):
        open_store(man)


@pytest.mark.timeout(120)
def test_manifest_flipped_byte_reported_at_global_index(ds30, tmp_path):
    locs = [str(tmp_path / f"s{i}.h5") for i in range(2)]
    for i, loc in enumerate(locs):
        packer.build(ds30, None, loc, "hdf5", workers=1, shard=(i, 2))
    man = tmp_path / "m.packer-manifest.json"
    merge(locs, man)
    with open_store(locs[1]) as r:
        rec = r.get(3)
    raw = bytearray(Path(locs[1]).read_bytes())
    pos = raw.find(bytes(rec.data)[200:264])
    raw[pos + 5] ^= 0xFF
    Path(locs[1]).write_bytes(bytes(raw))
    v = packer.verify(man)
    bad = [p for p in v.problems if p.key == rec.key]
    assert bad and bad[0].index == 15 + 3, [str(p) for p in v.problems]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_manifest_reads_in_dataloader_workers(ds30, tmp_path, ctx):
    locs = [str(tmp_path / f"s{i}{'.lmdb' if i % 2 else '.h5'}") for i in range(3)]
    for i, loc in enumerate(locs):
        packer.build(ds30, None, loc, "lmdb" if i % 2 else "hdf5", workers=1, shard=(i, 3))
    man = tmp_path / "m.packer-manifest.json"
    merge(locs, man)
    ds = StoreDataset(man, return_key=True, layout="HWC")
    assert ds.shard_boundaries == [0, 10, 20, 30] and len(ds) == 30
    ds[0]
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                                         collate_fn=collate_list, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    keys = [s[2] for batch in loader for s in batch]
    assert sorted(keys) == collect_sources(ds30).keys
    ds.close()
    # A reader opens only the shards it reads.
    with open_store(man) as r:
        r.get_many([12, 13, 11])
        assert sorted(r._open) == [1]
        r2 = open_store(man, max_open=1)
        r2.get(0), r2.get(25)
        assert list(r2._open) == [2]
        r2.close()


@pytest.mark.timeout(120)
def test_merge_of_1000_small_shards_is_fast(tmp_path):
    """Metadata only: time grows with shards, not records. Tiny stores are copies of one."""
    images, _ = make_dataset(tmp_path / "d", 2, kind="classes", seed=5)
    first = tmp_path / "shards" / "s0000.lmdb"
    packer.build(images, None, first, workers=1)
    locs = [str(first)]
    for i in range(1, 1000):
        loc = tmp_path / "shards" / f"s{i:04d}.lmdb"
        shutil.copytree(first, loc)
        locs.append(str(loc))
    man = tmp_path / "big.packer-manifest.json"
    t0 = time.perf_counter()
    rep = merge(locs, man)
    seconds = time.perf_counter() - t0
    print(f"merge of 1000 shard stores: {seconds:.2f} s, manifest {man.stat().st_size} bytes")
    assert rep.records == 2000 and rep.shards == 1000
    assert seconds < 60
    with open_store(man) as r:
        assert len(r) == 2000 and len(r.shard_boundaries) == 1001
        t0 = time.perf_counter()
        assert r.get(1999).index == 1999 and r.get(1000).key == r.get(0).key
        assert sorted(r._open) == [0, 500, 999]
    t0 = time.perf_counter()
    with open_store(man) as r:
        pass
    assert time.perf_counter() - t0 < 5


def _append_script(store, images, commit_bytes):
    return (f"import sys; sys.path.insert(0, {str(REPO)!r}); from packer.jobs.append import append; "
            f"append({str(store)!r}, {str(images)!r}, None, commit_bytes={commit_bytes})")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt,suffix", [("lmdb", ".lmdb"), ("hdf5", ".h5")])
def test_append_resumes_after_kill_and_is_atomic(ds30, tmp_path, fmt, suffix):
    old_images, new_images = tmp_path / "old", tmp_path / "new"
    keys = collect_sources(ds30).keys
    for i, k in enumerate(keys):
        dst = (new_images if i % 3 == 0 else old_images) / k
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ds30 / k, dst)
    store = tmp_path / f"s{suffix}"
    packer.build(old_images, None, store, fmt, workers=1)
    with open_store(store) as r:
        before = r.metadata.index_checksum
    env = dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="2")
    proc = subprocess.run([sys.executable, "-c", _append_script(store, new_images, 60_000)], env=env,
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # Killed mid-append: the published store is still the old version, whole.
    with open_store(store) as r:
        assert r.metadata.count == 20 and r.metadata.index_checksum == before
    assert packer.verify(store).ok
    rep = append(store, new_images, None, commit_bytes=60_000)
    assert rep.published and rep.records == 30 and rep.resumed_from > 0
    v = packer.verify(store, deep=True)
    assert v.ok, [str(p) for p in v.problems]
    with open_store(store) as r:
        got = [rec.key for rec in r.get_many(range(30))]
        assert got == collect_sources(old_images).keys + collect_sources(new_images).keys
        assert r.metadata.class_names == ["bird", "cat", "dog"]
        assert r.metadata.stats["records"] == 30 and r.metadata.build_options["appended"][0]["added"] == 10
        single = {rec.key: rec for rec in open_store(ds30_single(tmp_path, ds30)).get_many(range(30))}
        for rec in r.get_many(range(30)):
            assert bytes(rec.data) == bytes(single[rec.key].data) and rec.label == single[rec.key].label


def ds30_single(tmp_path, ds30):
    loc = tmp_path / "ref.lmdb"
    if not loc.exists():
        packer.build(ds30, None, loc, workers=1)
    return loc


@pytest.mark.timeout(120)
def test_append_refuses_present_keys_and_unknown_classes(ds30, tmp_path):
    store = tmp_path / "s.lmdb"
    packer.build(ds30, None, store, workers=1)
    with pytest.raises(SourceError, match="30 key.*already in the store") as ei:
        append(store, ds30, None)
    assert len(ei.value.problems) == 30
    changed = tmp_path / "changed"
    shutil.copytree(ds30 / "cat", changed / "cat")
    first = sorted((changed / "cat").iterdir())[0]
    shutil.copy(sorted((ds30 / "dog").iterdir())[0], first)
    rep = append(store, changed, None, replace=True)
    assert rep.published and rep.records == 30
    with open_store(store) as r:
        idx = r.index_of(f"cat/{first.name}")
        assert bytes(r.get(idx).data) == first.read_bytes() and r.get(idx).label == 1
    assert packer.verify(store).ok
    fish = tmp_path / "fish"
    shutil.copytree(ds30 / "cat", fish / "fish")
    with pytest.raises(SourceError, match="not in the pinned class map") as ei:
        append(store, fish, None)
    assert any("'fish'" in p for p in ei.value.problems)


def test_cli_merge_and_append(ds30, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], cwd=REPO,
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    for i in range(2):
        assert run("build", ds30, "-o", tmp_path / f"s{i}.lmdb", "--shard", f"{i}/2", "-q", "-j", "1").returncode == 0
    r = run("merge", tmp_path / "s0.lmdb", tmp_path / "s1.lmdb", "-o", tmp_path / "m.json", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 30
    assert run("verify", tmp_path / "m.json", "-q").returncode == 0
    r = run("merge", tmp_path / "s1.lmdb", "-o", tmp_path / "m2.json")
    assert r.returncode == 2 and "shard index 0" in r.stderr
    r = run("build", ds30, "-o", tmp_path / "x.lmdb", "--shards", "2")
    assert r.returncode == 2 and "--engine dask" in r.stderr
    r = run("append", tmp_path / "s0.lmdb", ds30, "-q")
    assert r.returncode == 1 and "already in the store" in r.stderr


# ---------------------------------------------------------------------------------------------
# Dask engine on a real LocalCluster
# ---------------------------------------------------------------------------------------------
def _need_dask():
    try:
        import distributed  # noqa: F401  (only whether it imports)
    except ImportError:
        if os.environ.get("PACKER_REQUIRE_DASK"):
            raise
        pytest.skip("dask.distributed is not installed (pip install 'packer-vision[dask]')")


@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dask_build_with_a_killed_worker_equals_the_single_build(ds30, single, tmp_path, monkeypatch):
    """3 shards on 2 worker processes; the worker running shard 1 SIGKILLs itself after its first
    committed batch; the scheduler reruns the task, which resumes the shard's staging area."""
    _need_dask()
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("PACKER_FAULT_KILL_SHARD_ONCE", f"{markers}:1")
    out = tmp_path / "d.packer-manifest.json"
    rep = packer.build(ds30, None, out, "lmdb", engine="dask", shards=3, n_workers=2, commit_bytes=20_000,
                    connect_timeout=120)
    assert (markers / "shard-1.killed").exists()
    assert rep.published and rep.records == 30 and rep.format == "manifest"
    report = json.loads(Path(rep.report_path).read_text())
    assert report["shards"][1]["resumed_from"] > 0      # the rerun continued the killed attempt
    assert_identical(single, out)
    assert packer.verify(out, deep=True).ok
    # Rerunning the same command reuses every published shard.
    monkeypatch.delenv("PACKER_FAULT_KILL_SHARD_ONCE")
    os.remove(out)
    rep2 = packer.build(ds30, None, out, "lmdb", engine="dask", shards=3, n_workers=1, connect_timeout=120)
    assert rep2.published
    assert all(s["reused"] for s in json.loads(Path(rep2.report_path).read_text())["shards"])
    assert_identical(single, out)


@pytest.mark.dask
@pytest.mark.timeout(120)
def test_dask_bad_input_is_reported_not_retried(tmp_path):
    _need_dask()
    images = tmp_path / "flat"
    images.mkdir()
    (images / "a.jpg").write_bytes(b"x")
    with pytest.raises(SourceError, match="not in a class folder|refused their inputs"):
        packer.build(images, None, tmp_path / "o.json", engine="dask", shards=2, n_workers=1, connect_timeout=120)
    with pytest.raises(UsageError, match="engine"):
        packer.build(images, None, tmp_path / "o.json", engine="spark", shards=2)
    with pytest.raises(UsageError, match="unknown build option"):
        packer.build(images, None, tmp_path / "o.json", shards=2)


def _dask_into_mongo(ds30, single, tmp_path, base, query=""):
    out = tmp_path / "m.packer-manifest.json"
    rep = packer.build(ds30, None, out, "mongo", engine="dask", shards=3, n_workers=2, shard_dir=base + query,
                    connect_timeout=120)
    assert rep.published and rep.records == 30
    shards = json.loads(out.read_text())["shards"]
    assert [s["location"].split("?")[0].rsplit("/", 1)[-1] for s in shards] == \
        [f"train-shard-{i:05d}-of-00003" for i in range(3)]
    assert all(s["location"].endswith(query) for s in shards)
    assert_identical(single, out)
    assert packer.verify(out, deep=True).ok
    merge([str(out)], base + query, copy=True, format="mongo")
    assert_identical(single, base + query)
    assert packer.verify(base + query).ok


@pytest.mark.mongo
@pytest.mark.dask
@pytest.mark.timeout(300)
def test_dask_shards_into_one_mongo_database(ds30, single, tmp_path):
    """Shard jobs write disjoint collections of one database; the manifest reads them as one, and
    merge --copy publishes them as one collection (one atomic publish)."""
    _need_dask()
    from tests import mongo_support

    base = mongo_support.new_store_location("train")          # uri/<fresh db>/train
    try:
        _dask_into_mongo(ds30, single, tmp_path, base)
    finally:
        mongo_support.drop_location(base)


@pytest.mark.mongo
@pytest.mark.dask
@pytest.mark.timeout(300)
def test_dask_shards_on_a_replica_set(ds30, single, tmp_path):
    """The same against a real MongoDB replica set (scripts/test.sh starts one with
    `scripts/mongo_server.sh --dir .mongo-rs start --replset 1` and exports its URI as
    PACKER_TEST_MONGO_RS_URI). Skips without it unless PACKER_REQUIRE_MONGO_RS=1."""
    _need_dask()
    uri = os.environ.get("PACKER_TEST_MONGO_RS_URI", "").strip()
    if not uri:
        if os.environ.get("PACKER_REQUIRE_MONGO_RS") == "1":
            pytest.fail("PACKER_REQUIRE_MONGO_RS=1 but PACKER_TEST_MONGO_RS_URI is not set")
        pytest.skip("no replica set: start one with `export PACKER_TEST_MONGO_RS_URI=$(bash "
                    "scripts/mongo_server.sh --dir .mongo-rs start --replset 1)`")
    import pymongo

    host, _, query = uri.partition("?")
    db = f"pk_rs_{os.getpid()}_{int(time.time())}"
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000)
    try:
        assert client.admin.command("hello").get("setName"), f"{uri} is not a replica set"
        _dask_into_mongo(ds30, single, tmp_path, f"{host.rstrip('/')}/{db}/train", f"?{query}" if query else "")
    finally:
        client.drop_database(db)
        client.close()


@pytest.mark.timeout(120)
def test_append_to_a_manifest_adds_a_shard(ds30, single, tmp_path):
    old_images, new_images = tmp_path / "old", tmp_path / "new"
    keys = collect_sources(ds30).keys
    for i, k in enumerate(keys):
        dst = (new_images if i >= 20 else old_images) / k
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ds30 / k, dst)
    man = tmp_path / "m.packer-manifest.json"
    packer.build(old_images, None, man, "manifest", workers=1)
    rep = append(man, new_images, None)
    assert rep.published and rep.records == 30 and rep.format == "manifest"
    with open_store(man) as r:
        assert r.shard_boundaries == [0, 20, 30]
        assert r.metadata.class_names == ["bird", "cat", "dog"]
    assert packer.verify(man, deep=True).ok
    with pytest.raises(SourceError, match="already in the dataset"):
        append(man, new_images, None)
    with pytest.raises(UsageError, match="--replace"):
        append(man, new_images, None, replace=True)


@pytest.mark.dask
@pytest.mark.timeout(200)
def test_dask_from_a_script_without_main_guard_fails_clearly(ds30, tmp_path):
    """Spawned workers re-import an unguarded script; the build must fail with a hint, not hang."""
    _need_dask()
    script = tmp_path / "unguarded.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(REPO)!r})\nimport packer\n"
                      f"packer.build({str(ds30)!r}, None, {str(tmp_path / 'o.json')!r}, engine='dask', shards=2, "
                      f"n_workers=1, connect_timeout=60)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "__main__" in proc.stderr and "PackerError" in proc.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.timeout(180)
def test_merge_copy_resumes_after_kill(ds30, single, tmp_path):
    locs = [str(tmp_path / f"s{i}.lmdb") for i in range(3)]
    for i, loc in enumerate(locs):
        packer.build(ds30, None, loc, workers=1, shard=(i, 3))
    out = tmp_path / "copy.h5"
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from packer.jobs.merge import merge; "
              f"merge({locs!r}, {str(out)!r}, copy=True, format='hdf5', commit_bytes=60_000)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          env=dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="2"))
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not out.exists()
    rep = merge(locs, out, copy=True, format="hdf5", commit_bytes=60_000)
    assert rep.copied and rep.records == 30 and 0 < rep.resumed_from < 30
    assert_identical(single, out)
    with open_store(out) as c, open_store(single) as s:
        assert c.metadata.index_checksum == s.metadata.index_checksum


def test_damaged_manifest_files_are_refused(ds30, tmp_path):
    loc = tmp_path / "s.lmdb"
    packer.build(ds30, None, loc, workers=1, shard=(0, 1))
    man = tmp_path / "m.packer-manifest.json"
    merge([str(loc)], man)
    raw = man.read_bytes()
    man.write_bytes(raw[: len(raw) // 2])                      # truncated
    with pytest.raises(StoreError, match="not valid JSON"):
        open_store(man, "manifest")
    rep = packer.verify(man, format="manifest")
    assert not rep.ok and "not valid JSON" in rep.problems[0].reason
    man.write_bytes(raw)
    shutil.rmtree(loc)                                           # a shard gone
    rep = packer.verify(man)
    assert not rep.ok and any("s.lmdb" in p.reason for p in rep.problems)
    with open_store(man) as r, pytest.raises(StoreError, match="shard 0"):
        r.get(0)
