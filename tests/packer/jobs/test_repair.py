"""repair / convert / export, for every store format in the registry, on real damaged stores.

Each damage is made on the store as it sits on disk (or on the server): bytes flipped, a JPEG
cut short, a label changed, an index entry broken, metadata damaged, the file cut short, and for
MongoDB documents deleted or edited and a GridFS chunk removed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import packer
from packer.core.errors import RecordError, UsageError
from packer.core.records import labels_equal
from packer.jobs.convert import convert
from packer.jobs.export import export
from packer.jobs.repair import repair
from packer.sample import make_dataset
from packer.sources.folders import collect_sources
from packer.stores import get_store, open_store
from tests import REPO
from tests.corpus import bit_flipped
from tests.store_support import (
    STORE_FORMATS,
    HDF5Damage,
    LMDBDamage,
    MongoDamage,
    build_store,
    damager,
    snapshot,
    store_state,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """16 small JPEGs in two folders with YOLO labels (some images without boxes)."""
    return make_dataset(tmp_path_factory.mktemp("rep"), 16, kind="boxes", sizes=((48, 64), (40, 56)), seed=5)


def _acts(rep) -> list:
    """(key, action) of a repair's record actions; a manifest's repair also lists, per repaired
    shard, that it re-listed the shard (``manifest-updated``), checked here once."""
    acts = [(a["key"], a["action"]) for a in rep.actions if a["action"] != "manifest-updated"]
    if rep.format == "manifest" and not rep.dry_run:
        quarantined = any(a == "quarantined" for _, a in acts)
        assert [a["action"] for a in rep.actions].count("manifest-updated") == (1 if quarantined else 0)
    return acts


def _boxed(loc, fmt) -> int:
    """Index of a record with at least one box."""
    with open_store(loc, fmt) as r:
        return next(i for i in range(r.metadata.count) if r.get(i).label is not None and len(r.get(i).label))


def _shard_of(manifest) -> str:
    from packer.stores.manifest import read_manifest, resolve_location
    (entry,) = read_manifest(manifest)[1]
    return resolve_location(manifest, entry["location"])


def _cut_half(b):
    return b[: len(b) // 2]


def _lose_eoi(b):
    assert b.endswith(b"\xff\xd9")
    return b[:-2]


# (name, damage, expected action for the damaged record without --source)
DAMAGE = [
    ("flip", lambda d, i: d.set_data(i, bit_flipped), "quarantined"),
    ("cut", lambda d, i: d.set_data(i, _cut_half), "quarantined"),
    ("lost_eoi", lambda d, i: d.set_data(i, _lose_eoi), "salvaged"),
    ("relabel", lambda d, i: d.relabel(i), "quarantined"),
]


@pytest.mark.parametrize("name,damage,expected", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_record_damage_is_found_and_repaired(fmt, location_for, dataset, name, damage, expected):
    pristine = build_store(dataset, location_for("pristine"), fmt)
    loc = build_store(dataset, location_for("damaged"), fmt)
    before, meta0 = snapshot(loc, fmt)
    i = _boxed(loc, fmt)
    d = damager(fmt, loc)
    damage(d, i)
    d.close()
    with open_store(loc, fmt) as r:
        key = r.get(i).key if name != "relabel" else None
    rep = packer.verify(loc, deep=True)
    assert not rep.ok and any(p.index == i for p in rep.problems), [str(p) for p in rep.problems]
    key = key or next(p.key for p in rep.problems if p.index == i)

    plan = repair(loc, dry_run=True)
    assert _acts(plan) == [(key, expected)]
    assert snapshot(loc, fmt)[1].index_checksum == meta0.index_checksum   # dry run changed nothing
    assert json.loads(Path(plan.report_path).read_text())["actions"] == plan.actions

    res = repair(loc)
    assert res.ok and res.verified, res.to_dict()
    assert _acts(res) == [(key, expected)]
    assert packer.verify(loc, deep=True).ok
    after, meta1 = snapshot(loc, fmt)
    # Every other record is byte-identical, fields included, and keeps its order.
    others = [k for k in before if k != key]
    assert [k for k in after if k != key] == others
    for k in others:
        assert after[k] == before[k], k
    if expected == "salvaged":
        assert after[key][0] == before[key][0]          # the EOI was all that was lost
        assert "salvaged" in json.loads(after[key][1])["notes"][-1]
        assert meta1.count == meta0.count
    else:
        assert key not in after and meta1.count == meta0.count - 1
        with open_store(loc, fmt) as r:
            assert len(r) == meta0.count - 1
            q = r.metadata.quarantine
            assert [e["key"] for e in q] == [key] and q[0]["index"] == i and q[0]["reason"]
            assert q[0]["checksum"] == __import__("packer.core.records", fromlist=["x"]).checksum(r.quarantine_bytes(0))
        info = packer.info(loc)
        assert info.metadata["quarantine"][0]["key"] == key
    assert res.backup and get_store(fmt).store_exists(res.backup)   # the old store is kept
    # A second repair changes nothing.
    again = repair(loc)
    assert again.nothing_to_repair and again.ok and not again.actions
    assert snapshot(loc, fmt)[1].index_checksum == meta1.index_checksum
    if expected == "quarantined" and fmt == "manifest":
        # --source names files of one shard: refused with the shards listed; repairing the shard
        # from source, then the manifest (which re-lists it), gives the pristine dataset again.
        shard = _shard_of(loc)
        with pytest.raises(UsageError, match="repair the shard stores: " + re.escape(shard)):
            repair(loc, source=dataset[0], labels=dataset[1])
        with pytest.raises(UsageError, match="repair the shard stores"):
            repair(loc, restore=[key])
        back = repair(shard, source=dataset[0], labels=dataset[1])
        assert back.ok and _acts(back) == [(key, "from-source")]
        with pytest.raises(Exception, match="changed since the manifest was written"):
            snapshot(loc, fmt)
        resealed = repair(loc)
        assert resealed.ok and [a["action"] for a in resealed.actions] == ["manifest-updated"]
        assert snapshot(loc, fmt)[0] == snapshot(pristine, fmt)[0]
        assert snapshot(loc, fmt)[1].index_checksum == meta0.index_checksum
        assert repair(loc).nothing_to_repair
    elif expected == "quarantined":
        # --source brings the original back: the store is the pristine one again.
        back = repair(loc, source=dataset[0], labels=dataset[1])
        assert back.ok and [(a["key"], a["action"]) for a in back.actions] == [(key, "from-source")]
        assert snapshot(loc, fmt)[0] == snapshot(pristine, fmt)[0]
        assert snapshot(loc, fmt)[1].index_checksum == meta0.index_checksum
        assert repair(loc, source=dataset[0], labels=dataset[1]).nothing_to_repair


def test_restore_puts_a_quarantined_record_back(fmt, location_for, dataset):
    loc = build_store(dataset, location_for(), fmt)
    before, meta0 = snapshot(loc, fmt)
    d = damager(fmt, loc)
    d.relabel(3)
    d.close()
    res = repair(loc)
    key = res.actions[0]["key"]
    assert res.ok and res.quarantined == 1
    target = loc
    if fmt == "manifest":   # restore names a key of one shard: done there, then the manifest re-lists it
        with pytest.raises(UsageError, match="repair the shard stores"):
            repair(loc, restore=[key])
        target = _shard_of(loc)
    with pytest.raises(UsageError, match="not in the quarantine"):
        repair(target, restore=["no/such.jpg"])
    back = repair(target, restore=[key])
    if fmt == "manifest":
        assert [a["action"] for a in repair(loc).actions] == ["manifest-updated"]
    assert [a["action"] for a in back.actions] == ["restored"]
    after, meta = snapshot(loc, fmt)
    assert list(after) == list(before) and not meta.quarantine
    assert after[key][0] == before[key][0]           # its bytes came back as they were
    notes = json.loads(after[key][1])["notes"]
    assert "restored from quarantine" in notes[-1] and "record checksum mismatch" in notes[-1]
    assert json.loads(after[key][1])["label"] != json.loads(before[key][1])["label"]   # as it was when damaged
    was, now = json.loads(before[key][1]), json.loads(after[key][1])
    assert was.get("subsampling") and was.get("coding")   # what describes the bytes comes back too
    for name in ("coding", "subsampling", "metadata", "width", "height", "source_checksum"):
        assert now.get(name) == was.get(name), name
    assert packer.verify(loc).ok


def test_index_and_metadata_damage(fmt, location_for, dataset):
    loc = build_store(dataset, location_for(), fmt)
    before, meta0 = snapshot(loc, fmt)
    d = damager(fmt, loc)
    d.break_index(2)
    d.close()
    assert not packer.verify(loc, deep=True).ok
    res = repair(loc)
    assert res.ok and [a["action"] for a in res.actions] == ["index-rebuilt"], res.to_dict()
    after, meta = snapshot(loc, fmt)
    assert after == before and meta.index_checksum == meta0.index_checksum
    assert repair(loc).nothing_to_repair

    d = damager(fmt, loc)
    d.break_metadata()
    d.close()
    rep = packer.verify(loc, deep=True)
    assert not rep.ok and any("metadata" in p.reason for p in rep.problems)
    # Without --source the class names and build options are gone: exit 1, listed.
    assert not repair(loc, dry_run=True).ok
    if fmt == "manifest":
        with pytest.raises(UsageError, match="repair the shard stores"):
            repair(loc, source=dataset[0], labels=dataset[1])
        res = repair(_shard_of(loc), source=dataset[0], labels=dataset[1])
        assert res.ok and repair(loc).nothing_to_repair   # the shard's index checksum is the same
    else:
        res = repair(loc, source=dataset[0], labels=dataset[1])
    assert res.ok and "metadata-rebuilt" in [a["action"] for a in res.actions], res.to_dict()
    after, meta = snapshot(loc, fmt)
    assert after == before and meta.index_checksum == meta0.index_checksum
    assert meta.label_schema == "boxes" and packer.verify(loc, deep=True).ok


def _truncation_formats():
    return [f for f in ("lmdb", "hdf5")]


@pytest.mark.parametrize("frac", [0.5, 0.9])
@pytest.mark.parametrize("fmt_", _truncation_formats())
def test_store_file_cut_short(tmp_path, dataset, fmt_, frac):
    fmt = fmt_
    loc = str(tmp_path / ("s.lmdb" if fmt == "lmdb" else "s.h5"))
    build_store(dataset, loc, fmt)
    before, meta0 = snapshot(loc, fmt)
    damager(fmt, loc).cut_file(frac)
    # No SIGBUS, no traceback: verify and info exit 1 with the truncation named.
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for cmd in (["verify", "--deep", loc], ["info", loc]):
        p = subprocess.run([sys.executable, "-m", "packer", *cmd], env=env, capture_output=True, timeout=120)
        assert p.returncode == 1, (cmd, p.returncode, p.stderr[-2000:])
        assert b"cut short" in p.stdout + p.stderr and b"Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-c", f"from readers import StoreDataset; StoreDataset({loc!r})[0]"],
                       env=env, capture_output=True, timeout=120, cwd=REPO)
    assert p.returncode == 1 and b"StoreError" in p.stderr and b"cut short" in p.stderr, p.stderr[-2000:]
    rep = packer.verify(loc, deep=True)
    assert any("cut short" in p.reason for p in rep.problems)
    # Salvage what still reads; the rest is listed as lost (exit 1) until --source is given.
    res = repair(loc)
    survivors, _ = snapshot(loc, fmt)
    for k, v in survivors.items():
        assert v == before[k]
    assert res.ok == (not res.unrepaired)
    if len(survivors) < len(before):
        # Every record that left the live store is listed: lost (exit 1 until --source rebuilds
        # it), or quarantined with its bytes when its fields no longer match their checksum.
        gone = set(before) - set(survivors)
        listed = {a["key"]: a["action"] for a in res.actions if a["key"] is not None}
        lost_keyless = sum(1 for a in res.actions if not a["key"] and a["action"] == "lost")
        assert all(listed.get(k) in ("lost", "quarantined") for k in gone) or lost_keyless, res.to_dict()
        assert not res.ok or all(listed.get(k) == "quarantined" for k in gone)
    res = repair(loc, source=dataset[0], labels=dataset[1])
    assert res.ok, res.to_dict()
    after, meta = snapshot(loc, fmt)
    assert after == before and meta.index_checksum == meta0.index_checksum
    assert packer.verify(loc, deep=True).ok and repair(loc).nothing_to_repair


def test_hdf5_flip_on_disk_costs_one_record(tmp_path, dataset):
    loc = build_store(dataset, str(tmp_path / "s.h5"), "hdf5")
    before, _ = snapshot(loc, "hdf5")
    d = HDF5Damage(loc)
    d.flip_on_disk(1)
    rep = packer.verify(loc, deep=True)
    assert not rep.ok          # Fletcher32 fails the chunk: every record in it is reported
    res = repair(loc)
    assert res.ok and [a["action"] for a in res.actions] == ["quarantined"]
    after, _ = snapshot(loc, "hdf5")
    assert len(after) == len(before) - 1 and all(after[k] == before[k] for k in after)


def test_hdf5_pixel_mode_repair(tmp_path, dataset):
    import h5py
    pristine = build_store(dataset, str(tmp_path / "p.h5"), "hdf5", store_options={"pixels": "24x32"})
    loc = build_store(dataset, str(tmp_path / "s.h5"), "hdf5", store_options={"pixels": "24x32"})
    with h5py.File(loc, "r+") as f:
        px = f["pixels"][3]
        px[5:9] ^= 0x5A
        f["pixels"][3] = px
    assert not packer.verify(loc, deep=True).ok
    res = repair(loc)
    assert res.ok and [a["action"] for a in res.actions] == ["quarantined"]   # raw pixels: no salvage
    res = repair(loc, source=dataset[0], labels=dataset[1])
    assert res.ok and [a["action"] for a in res.actions] == ["from-source"]
    assert snapshot(loc, "hdf5")[1].index_checksum == snapshot(pristine, "hdf5")[1].index_checksum
    with open_store(loc) as r:
        assert r.encoding == "raw" and r.raw_shape == (24, 32, 3)


def test_hdf5_damaged_btree_is_a_store_error(tmp_path, dataset):
    """A damaged B-tree is reported, never a raw ``RuntimeError: wrong B-tree signature``."""
    import h5py
    loc = build_store(dataset, str(tmp_path / "s.h5"), "hdf5")
    with h5py.File(loc, "r") as f:
        addr = f["keys"].id.get_offset()       # None for chunked data: find the B-tree instead
        btree = None
        raw = open(loc, "rb").read()
        btree = raw.find(b"TREE")
    assert btree > 0 and addr is None
    with open(loc, "r+b") as fh:
        fh.seek(btree)
        fh.write(b"XXXX")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "packer", "verify", "--deep", loc], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == 1 and b"Traceback" not in p.stderr, p.stderr[-3000:]
    res = repair(loc, source=dataset[0], labels=dataset[1])
    assert res.ok and packer.verify(loc, deep=True).ok


@pytest.mark.mongo
def test_mongo_documents_and_gridfs(tmp_path, dataset, monkeypatch):
    from tests import mongo_support
    monkeypatch.chdir(tmp_path)   # reports of server stores go to the working directory
    loc = mongo_support.new_store_location("gridfs")
    try:
        rep = packer.build(*dataset, loc, "mongo", workers=1, store_options={"gridfs_threshold": "1K"})
        assert rep.ok
        before, meta0 = snapshot(loc, "mongo")
        keys = list(before)
        d = MongoDamage(loc)
        d.delete_doc(1)
        d.edit_doc(4)
        d.drop_gridfs_chunk(7)
        d.close()
        rep = packer.verify(loc, deep=True)
        bad = {p.index for p in rep.problems}
        assert {1, 4, 7} <= bad, [str(p) for p in rep.problems]
        res = repair(loc)
        acts = {a["key"] or a["index"]: a["action"] for a in res.actions}
        assert acts[keys[4]] == "quarantined" and acts[1] == "lost" and acts[keys[7]] == "lost"
        assert not res.ok      # two records had nothing left to keep
        res = repair(loc, source=dataset[0], labels=dataset[1])
        assert res.ok, res.to_dict()
        after, meta = snapshot(loc, "mongo")
        assert after == before and meta.index_checksum == meta0.index_checksum
        assert repair(loc).nothing_to_repair
    finally:
        mongo_support.drop_location(loc)


# ---------------------------------------------------------------------------------------
# Kill during repair
# ---------------------------------------------------------------------------------------
def _repair_script(loc, fmt) -> str:
    return (f"import sys; sys.path.insert(0, {str(REPO)!r}); from packer.jobs.repair import repair; "
            f"repair({loc!r}, format={fmt!r}, commit_bytes=4000)")


@pytest.mark.parametrize("fault", ["PACKER_FAULT_KILL_AFTER_COMMITS=2", "PACKER_FAULT_KILL_AT=swap"])
def test_kill_during_repair_then_rerun(fmt, location_for, dataset, fault):
    ref = build_store(dataset, location_for("ref"), fmt)
    loc = build_store(dataset, location_for("killed"), fmt)
    for target in (ref, loc):
        d = damager(fmt, target)
        d.set_data(2, bit_flipped)
        d.set_data(5, _lose_eoi)
        d.close()
    expected = repair(ref, commit_bytes=4000)
    name, value = fault.split("=")
    env = dict(os.environ, **{name: value})
    p = subprocess.run([sys.executable, "-c", _repair_script(loc, fmt)], env=env, capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    # Killed: the location holds the old store (or, after the swap, nothing: it is in the backup).
    if name == "PACKER_FAULT_KILL_AT" and fmt == "manifest":   # killed in its shard's repair
        assert not get_store("lmdb").store_exists(_shard_of(loc)) and os.path.exists(loc)
    elif name == "PACKER_FAULT_KILL_AT":
        assert not get_store(fmt).store_exists(loc) or fmt == "mongo"
    else:
        assert not packer.verify(loc).ok
    res = repair(loc, commit_bytes=4000)
    assert res.ok and [(a["key"], a["action"]) for a in res.actions] == \
        [(a["key"], a["action"]) for a in expected.actions]
    a, ma = snapshot(ref, fmt)
    b, mb = snapshot(loc, fmt)
    assert a == b and ma.index_checksum == mb.index_checksum and ma.quarantine[0]["key"] == mb.quarantine[0]["key"]
    assert repair(loc).nothing_to_repair
    assert get_store(fmt).read_journal(_shard_of(loc) if fmt == "manifest" else loc) is None


@pytest.mark.parametrize("fmt_", ["lmdb", "hdf5"])
def test_real_sigkill_at_any_moment(tmp_path, dataset, fmt_):
    """SIGKILL a repair at several moments (no fault injection): a rerun always gives the result
    of an uninterrupted repair, and the location never holds a mix."""
    fmt, ext = fmt_, (".lmdb" if fmt_ == "lmdb" else ".h5")
    damaged = build_store(dataset, str(tmp_path / ("damaged" + ext)), fmt)
    d = damager(fmt, damaged)
    d.set_data(2, bit_flipped)
    d.set_data(5, _lose_eoi)
    d.close()
    copy = shutil.copytree if fmt == "lmdb" else shutil.copy
    ref = str(tmp_path / ("ref" + ext))
    copy(damaged, ref)
    repair(ref)
    want = snapshot(ref, fmt)
    script = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); from packer.jobs.repair import repair; "
              f"print('go', flush=True); repair(sys.argv[1], commit_bytes=2000)")
    for n, delay in enumerate([0.0, 0.05, 0.1, 0.2, 0.3, 0.5]):
        loc = str(tmp_path / f"k{n}{ext}")
        copy(damaged, loc)
        proc = subprocess.Popen([sys.executable, "-c", script, loc], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        assert proc.stdout.readline() == b"go\n"     # imports done: the repair itself is running
        import time
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=60)
        if get_store(fmt).claims(loc):
            with open_store(loc, fmt) as r:      # whatever is there is a whole store, old or new
                assert r.metadata.count in (16, 15)
        res = repair(loc)
        assert res.ok, res.to_dict()
        got = snapshot(loc, fmt)
        assert got[0] == want[0] and got[1].index_checksum == want[1].index_checksum, delay
        assert [q["key"] for q in got[1].quarantine] == [q["key"] for q in want[1].quarantine]


# ---------------------------------------------------------------------------------------
# convert / export
# ---------------------------------------------------------------------------------------
def _chain(tmp_path, dataset, formats, mongo_loc=None):
    src = collect_sources(*dataset)
    loc = str(tmp_path / "0.lmdb")
    build_store(dataset, loc, "lmdb")
    ref, meta0 = snapshot(loc, "lmdb")
    for n, target in enumerate(formats, 1):
        dst = mongo_loc if target == "mongo" else str(tmp_path / f"{n}.{'h5' if target == 'hdf5' else target}")
        rep = convert(loc, dst, target)
        assert rep.records == len(ref) and rep.index_checksum == meta0.index_checksum
        got, meta = snapshot(dst, target)
        assert got == ref and meta.class_names == meta0.class_names and meta.label_schema == meta0.label_schema
        assert meta.build_options["labels"] == meta0.build_options["labels"] and meta.stats == meta0.stats
        assert meta.history[-1]["action"] == "convert"
        loc = dst
    out = tmp_path / "export"
    rep = export(loc, out)
    assert rep.ok and rep.identical == len(ref) and rep.label_form == "yolo"
    for key in src.keys:
        assert (out / "images" / key).read_bytes() == (dataset[0] / key).read_bytes()
    back = collect_sources(rep.images, rep.labels)
    assert back.keys == src.keys
    assert all(labels_equal(a, b) for a, b in zip(back.labels, src.labels))
    again = str(tmp_path / "again.lmdb")
    build_store((Path(rep.images), Path(rep.labels)), again, "lmdb")
    assert snapshot(again, "lmdb")[1].index_checksum == meta0.index_checksum


def test_round_trip_lmdb_hdf5_lmdb_export(tmp_path, dataset):
    _chain(tmp_path, dataset, ["hdf5", "lmdb"])


@pytest.mark.mongo
def test_round_trip_through_mongo(tmp_path, dataset, monkeypatch):
    from tests import mongo_support
    monkeypatch.chdir(tmp_path)
    loc = mongo_support.new_store_location("chain")
    try:
        _chain(tmp_path, dataset, ["hdf5", "mongo", "lmdb"], mongo_loc=loc)
    finally:
        mongo_support.drop_location(loc)


def test_convert_carries_quarantine_and_refuses_damage(fmt, location_for, dataset, tmp_path):
    loc = build_store(dataset, location_for(), fmt)
    d = damager(fmt, loc)
    d.set_data(1, bit_flipped)
    d.close()
    with pytest.raises(RecordError, match="repair"):
        convert(loc, str(tmp_path / "x.lmdb"), "lmdb")
    assert not os.path.exists(tmp_path / "x.lmdb")
    repair(loc)
    dst = str(tmp_path / ("x.h5" if fmt != "hdf5" else "x.lmdb"))
    target = "hdf5" if fmt != "hdf5" else "lmdb"
    convert(loc, dst, target)
    with open_store(dst, target) as r, open_store(loc, fmt) as o:
        assert r.metadata.quarantine == o.metadata.quarantine
        assert r.quarantine_bytes(0) == o.quarantine_bytes(0)
    assert packer.verify(dst, deep=True).ok
    with pytest.raises(UsageError, match="exists"):
        convert(loc, dst, target)


def test_convert_resumes_after_kill(tmp_path, dataset):
    loc = build_store(dataset, str(tmp_path / "s.lmdb"), "lmdb")
    dst = str(tmp_path / "d.h5")
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from packer.jobs.convert import convert; "
              f"convert({loc!r}, {dst!r}, 'hdf5', commit_bytes=4000)")
    p = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="2"),
                       capture_output=True, timeout=120)
    assert p.returncode == -9 and not os.path.exists(dst)
    rep = convert(loc, dst, "hdf5", commit_bytes=4000)
    assert rep.resumed_from > 0
    assert snapshot(dst, "hdf5")[0] == snapshot(loc, "lmdb")[0]


def test_convert_pixel_mode(tmp_path, dataset):
    pix = str(tmp_path / "p.h5")
    build_store(dataset, pix, "hdf5", store_options={"pixels": "32x32"})
    with pytest.raises(UsageError, match="decoded pixels"):
        convert(pix, str(tmp_path / "p.lmdb"), "lmdb")
    rep = convert(pix, str(tmp_path / "p2.h5"), "hdf5")
    assert rep.records == 16
    with open_store(str(tmp_path / "p2.h5")) as r:
        assert r.encoding == "raw" and r.raw_shape == (32, 32, 3)
    lm = build_store(dataset, str(tmp_path / "j.lmdb"), "lmdb")
    with pytest.raises(UsageError, match="never re-encodes"):
        convert(lm, str(tmp_path / "j.h5"), "hdf5", store_options={"pixels": "32x32"})
    out = tmp_path / "px"
    rep = export(pix, out)
    assert rep.ok and len(rep.reencoded) == 16 and rep.reencoded[0]["file"].endswith(".png")


def test_export_label_forms(tmp_path):
    # class folders
    images, _ = make_dataset(tmp_path / "c", 9, kind="classes", sizes=((40, 48),), seed=3)
    loc = str(tmp_path / "c.lmdb")
    packer.build(images, None, loc, "lmdb", workers=1)
    rep = export(loc, tmp_path / "ce")
    assert rep.ok and rep.label_form == "folders" and rep.labels is None and not rep.labels_skipped
    a, b = collect_sources(images), collect_sources(rep.images)
    assert a.keys == b.keys and a.labels == b.labels and a.class_names == b.class_names
    # CSV with class names, plus a PNG that the build re-encoded
    images, labels = make_dataset(tmp_path / "v", 6, kind="csv", sizes=((40, 48),), seed=4)
    from tests.corpus import png_bytes
    (images / "extra.png").write_bytes(png_bytes(1)[0])
    with open(labels, "a") as fh:
        fh.write("extra.png,cat\n")
    loc = str(tmp_path / "v.h5")
    packer.build(images, labels, loc, "hdf5", workers=1)
    rep = export(loc, tmp_path / "ve")
    assert rep.ok and rep.label_form == "csv" and rep.labels.endswith("labels.csv")
    assert [r["file"] for r in rep.reencoded] == ["extra.jpg"] and rep.identical == 6
    a, b = collect_sources(images, labels), collect_sources(rep.images, rep.labels)
    assert b.keys == sorted(k.replace("extra.png", "extra.jpg") for k in a.keys)
    assert b.class_names == a.class_names
    with pytest.raises(UsageError, match="empty"):
        export(loc, tmp_path / "ve")
    rep = export(loc, tmp_path / "vj", labels_form="json-map")
    assert rep.labels.endswith("labels.json")
    b = collect_sources(rep.images, rep.labels)
    assert b.class_names == a.class_names and b.labels == collect_sources(tmp_path / "ve" / "images",
                                                                          tmp_path / "ve" / "labels.csv").labels


def test_export_boxes_as_per_image_json(tmp_path, dataset):
    loc = build_store(dataset, str(tmp_path / "b.lmdb"), "lmdb")
    rep = export(loc, tmp_path / "bj", labels_form="json")
    assert rep.ok and rep.label_form == "json" and rep.labels_skipped == []
    a, b = collect_sources(*dataset), collect_sources(rep.images, rep.labels)
    assert a.keys == b.keys and all(labels_equal(x, y) for x, y in zip(a.labels, b.labels))
    with pytest.raises(UsageError, match="unknown label form"):
        export(loc, tmp_path / "bx", labels_form="coco-not-yet")


def test_export_refuses_keys_escaping_out(tmp_path):
    from packer.core.records import StoreMetadata, index_checksum
    from tests.corpus import make_records
    loc = str(tmp_path / "evil.lmdb")
    recs = make_records(4)
    recs[1].key = "../escaped.jpg"
    recs[2].key = "/abs/olute.jpg"
    recs[3].key = "link/inside.jpg"
    with get_store("lmdb").create_writer(loc) as w:
        w.open("fp")
        for r in recs:
            w.add(r)
        w.flush()
        w.publish(StoreMetadata("lmdb", 4, "class", [], {"labels": "x.csv"},
                                index_checksum((r.index, r.key, r.checksum) for r in recs)))
    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, out / "images" / "link")
    with pytest.raises(UsageError, match="empty"):
        export(loc, out)
    shutil.rmtree(out)
    rep = export(loc, out)
    assert rep.records == 2 and {r["key"] for r in rep.refused} == {"../escaped.jpg", "/abs/olute.jpg"}
    assert not rep.ok and not (tmp_path / "escaped.jpg").exists() and not Path("/abs/olute.jpg").exists()
    # A symlink on the way (planted while exporting) is never followed.
    from packer.core.paths import target_path
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(UsageError, match="symbolic link"):
        target_path(root, "link/inside.jpg")
    assert not any(outside.iterdir())


def test_cli_repair_convert_export(tmp_path, dataset):
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "packer", *args], env=env, capture_output=True,
                              timeout=120, text=True)

    loc = build_store(dataset, str(tmp_path / "s.lmdb"), "lmdb")
    p = run("repair", loc)
    assert p.returncode == 0 and "nothing to repair" in p.stdout
    d = LMDBDamage(loc)
    d.set_data(3, bit_flipped)
    d.close()
    p = run("repair", loc, "--dry-run", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["actions"][0]["action"] == "quarantined"
    p = run("repair", loc, "--source")
    assert p.returncode == 2
    p = run("repair", loc, "--source", str(dataset[0]), str(dataset[1]), "-q")
    assert p.returncode == 0, p.stderr
    assert json.loads(Path(loc + ".repair.json").read_text())["actions"][0]["action"] == "from-source"
    p = run("convert", loc, str(tmp_path / "s.h5"), "--format", "hdf5", "-q")
    assert p.returncode == 0, p.stderr
    p = run("export", str(tmp_path / "s.h5"), str(tmp_path / "out"))
    assert p.returncode == 0 and "16 byte-identical" in p.stderr + p.stdout, p.stderr
    d = LMDBDamage(loc)
    d.relabel(0)
    d.close()
    assert run("repair", loc, "-q").returncode == 0
    p = run("info", loc)
    assert p.returncode == 0 and "quarantine:   1 record(s)" in p.stdout


# ---------------------------------------------------------------------------------------
# Manifests over several shards: repair delegates to the shards, convert reads through
# ---------------------------------------------------------------------------------------
@pytest.fixture
def three_shards(tmp_path, dataset):
    """A manifest over the 3 shards of a ``--shard j/3`` build (LMDB)."""
    from packer.jobs.merge import merge
    locs = [build_store(dataset, str(tmp_path / f"s{j}.lmdb"), "lmdb", shard=(j, 3)) for j in range(3)]
    out = str(tmp_path / "all.packer-manifest.json")
    merge(locs, out)
    return out, locs


def test_manifest_repair_over_three_shards(three_shards, tmp_path):
    out, locs = three_shards
    with open_store(out) as r:
        bounds = r.shard_boundaries
        victim = r.get(bounds[1] + 2).key                 # record 2 of shard 1
    d = LMDBDamage(locs[1])
    d.set_data(2, bit_flipped)
    d.close()
    rep = packer.verify(out, deep=True)
    assert not rep.ok and [p.index for p in rep.problems] == [bounds[1] + 2]
    plan = repair(out, dry_run=True)
    assert [(a["shard"], a["index"], a["key"], a["action"]) for a in plan.actions] == \
        [(1, bounds[1] + 2, victim, "quarantined")]
    assert packer.verify(out).ok is False                   # the dry run changed nothing
    res = repair(out)
    assert res.ok and res.verified and res.records == bounds[-1] - 1
    assert [(a["shard"], a["action"]) for a in res.actions] == [(1, "quarantined"), (1, "manifest-updated")]
    assert res.backup and os.path.exists(res.backup)
    with open_store(out) as r:
        assert len(r) == bounds[-1] - 1 and r.shard_boundaries[1:] == [b - (j > 0) for j, b in enumerate(bounds[1:])]
        assert [q["key"] for q in r.metadata.quarantine] == [victim] and r.metadata.quarantine[0]["shard"] == 1
        assert __import__("packer.core.records", fromlist=["x"]).checksum(r.quarantine_bytes(0)) == \
            r.metadata.quarantine[0]["checksum"]
    assert repair(out).nothing_to_repair
    # --source / --restore: refused with the shards named (exit 2 from the CLI).
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "packer", "repair", out, "--restore", victim], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == 2 and b"repair the shard stores" in p.stderr + p.stdout, p.stderr[-2000:]
    assert all(os.path.basename(loc).encode() in p.stderr + p.stdout for loc in locs)
    # convert reads through the manifest (every record and shard checked): one store, same records.
    dst = str(tmp_path / "one.h5")
    crep = convert(out, dst, "hdf5")
    assert crep.records == bounds[-1] - 1 and crep.quarantined == 1
    with open_store(out) as a, open_store(dst) as b:
        assert [x.key for x in a.get_many(range(len(a)))] == [x.key for x in b.get_many(range(len(b)))]
        assert b.quarantine_bytes(0) == a.quarantine_bytes(0)
    assert packer.verify(dst, deep=True).ok
    # and never into a manifest: that is packer merge.
    with pytest.raises(UsageError, match="packer merge"):
        convert(dst, str(tmp_path / "x.packer-manifest.json"), "manifest")


def test_convert_manifest_refuses_duplicate_keys(tmp_path, dataset):
    from packer.jobs.merge import merge
    a = build_store(dataset, str(tmp_path / "a.lmdb"), "lmdb")
    b = build_store(dataset, str(tmp_path / "b.lmdb"), "lmdb")
    out = str(tmp_path / "ab.packer-manifest.json")
    merge([a, b], out)                       # a logical merge does not read the keys
    with pytest.raises(RecordError, match="listed twice"):
        convert(out, str(tmp_path / "ab.h5"), "hdf5")
    assert not os.path.exists(tmp_path / "ab.h5")


# ---------------------------------------------------------------------------------------
# --source and labels: bytes rebuilt keep the stored labels; a mismatched schema is refused
# ---------------------------------------------------------------------------------------
def _two_boxed(loc, fmt) -> list:
    """Indices of two records with at least one box."""
    with open_store(loc, fmt) as r:
        return [i for i in range(r.metadata.count) if len(r.get(i).label)][:2]


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_source_images_alone_repairs_a_yolo_store_keeping_its_labels(fmt, location_for, boxes_dataset):
    """The issue's case: a YOLO store, two stored JPEGs bit-flipped, ``repair --source IMAGES``
    with no LABELS: the bytes come from IMAGES, the stored labels (which still verify) stay, and
    the store equals the pristine build again (before, this was refused until LABELS was given)."""
    from click.testing import CliRunner

    from packer.cli import cli

    images, labels = boxes_dataset
    pristine, _ = snapshot(build_store(boxes_dataset, location_for("pristine"), fmt), fmt)
    loc = build_store(boxes_dataset, location_for("yolo"), fmt)
    bad = _two_boxed(loc, fmt)
    d = damager(fmt, loc)
    for i in bad:
        d.set_data(i, bit_flipped)
    d.close()
    r = CliRunner().invoke(cli, ["repair", loc, "--source", str(images), "-q"])
    assert r.exit_code == 0, r.output
    rep = packer.verify(loc, deep=True)
    assert rep.ok, [str(p) for p in rep.problems]
    assert snapshot(loc, fmt)[0] == pristine
    assert repair(loc, source=images).nothing_to_repair


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_source_images_alone_asks_for_labels_only_for_a_damaged_label(fmt, location_for, boxes_dataset):
    """A record whose stored label is damaged too needs its label from the source: --source
    IMAGES alone is refused (exit 2, naming the record and saying to pass LABELS) before anything
    changes; with LABELS it is rebuilt and the store verifies --deep."""
    from click.testing import CliRunner

    from packer.cli import cli

    images, labels = boxes_dataset
    loc = build_store(boxes_dataset, location_for("yolo"), fmt)
    bad = _two_boxed(loc, fmt)
    d = damager(fmt, loc)
    d.set_data(bad[0], bit_flipped)
    d.relabel(bad[1])
    d.close()
    with open_store(loc, fmt) as r:
        relabelled = r.get(bad[1]).key
    state = store_state(loc, fmt)
    runner = CliRunner()
    r = runner.invoke(cli, ["repair", loc, "--source", str(images)])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert relabelled in out and "--source IMAGES LABELS" in out, out
    assert store_state(loc, fmt) == state          # nothing written: no journal, no backup, no staging
    assert get_store(fmt).read_journal(loc) is None
    with pytest.raises(UsageError, match="LABELS"):
        repair(loc, source=images, dry_run=True)   # a dry run is refused the same way
    r = runner.invoke(cli, ["repair", loc, "--source", str(images), str(labels), "-q"])
    assert r.exit_code == 0, r.output
    rep = packer.verify(loc, deep=True)
    assert rep.ok, [str(p) for p in rep.problems]


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_bytes_rebuilt_from_source_keep_the_stored_labels(fmt, location_for, boxes_copy):
    """Records whose label fields verify keep them when their bytes come back from --source,
    even when the label files changed since the build (same schema)."""
    images, labels = boxes_copy
    loc = build_store(boxes_copy, location_for(), fmt)
    before, meta0 = snapshot(loc, fmt)
    bad = _two_boxed(loc, fmt)
    d = damager(fmt, loc)
    for i in bad:
        d.set_data(i, bit_flipped)
    d.close()
    with open_store(loc, fmt) as r:
        keys = [r.get(i).key for i in bad]
    for key in keys:   # the label files moved on since the build
        (labels / key).with_suffix(".txt").write_text("0 0.5 0.5 0.125 0.125\n")
    res = repair(loc, source=images, labels=labels)
    assert res.ok and res.verified, res.to_dict()
    assert _acts(res) == [(k, "from-source") for k in keys]
    after, meta1 = snapshot(loc, fmt)
    assert after == before and meta1.index_checksum == meta0.index_checksum
    assert packer.verify(loc, deep=True).ok


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_bytes_rebuilt_without_labels_when_the_schema_matches(fmt, location_for, tmp_path):
    """A store labelled by a CSV, --source IMAGES alone (class folders: the same 'class' schema,
    other class names): bytes-only damage is rebuilt with the stored labels."""
    images, labels = make_dataset(tmp_path / "csv", 8, kind="csv", sizes=((40, 48),), seed=6)
    loc = build_store((images, labels), location_for(), fmt)
    before, meta0 = snapshot(loc, fmt)
    assert meta0.label_schema == "class" and collect_sources(images).label_schema == "class"
    d = damager(fmt, loc)
    for i in (1, 4):
        d.set_data(i, bit_flipped)
    d.close()
    res = repair(loc, source=images)
    assert res.ok and res.verified, res.to_dict()
    assert [a for _, a in _acts(res)] == ["from-source", "from-source"]
    after, meta1 = snapshot(loc, fmt)
    assert after == before and meta1.index_checksum == meta0.index_checksum


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_quarantined_record_from_source_keeps_its_stored_label(fmt, location_for, boxes_copy):
    """A record quarantined for its bytes alone comes back from --source with the label it had,
    even when its label file changed since the build."""
    images, labels = boxes_copy
    loc = build_store(boxes_copy, location_for(), fmt)
    before, meta0 = snapshot(loc, fmt)
    i = _two_boxed(loc, fmt)[0]
    d = damager(fmt, loc)
    d.set_data(i, bit_flipped)
    d.close()
    res = repair(loc)
    (key, action), = _acts(res)
    assert action == "quarantined"
    (labels / key).with_suffix(".txt").write_text("0 0.5 0.5 0.125 0.125\n")
    back = repair(loc, source=images, labels=labels)
    assert back.ok and back.verified and _acts(back) == [(key, "from-source")], back.to_dict()
    after, meta1 = snapshot(loc, fmt)
    assert after == before and meta1.index_checksum == meta0.index_checksum and not meta1.quarantine


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_rebuilt_from_source_honours_the_builds_max_size(fmt, location_for, tmp_path):
    """A store built with max_size holds downscaled images: records rebuilt from --source are
    downscaled the same way (before, they came back full size)."""
    images, labels = make_dataset(tmp_path / "big", 6, kind="csv", sizes=((120, 90),), seed=8)
    loc = build_store((images, labels), location_for(), fmt, max_size=48)
    before, _ = snapshot(loc, fmt)
    d = damager(fmt, loc)
    d.set_data(2, bit_flipped)
    d.close()
    res = repair(loc, source=images, labels=labels)
    assert res.ok and res.verified, res.to_dict()
    after, _ = snapshot(loc, fmt)
    assert after == before
    with open_store(loc, fmt) as r:
        assert max(r.get(2).height, r.get(2).width) <= 48
