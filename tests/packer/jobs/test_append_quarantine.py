"""append after repair: quarantined records (entries and bytes) stay in the quarantine area."""
from __future__ import annotations

import pytest

import packer
from packer.core.records import checksum
from packer.jobs.append import append
from packer.jobs.repair import repair
from packer.stores import open_store
from tests.corpus import bit_flipped
from tests.store_support import HDF5Damage, LMDBDamage, extra_boxes

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("fmt,suffix,damage", [("lmdb", ".lmdb", LMDBDamage), ("hdf5", ".h5", HDF5Damage)])
def test_append_keeps_the_quarantine(tmp_path, boxes_dataset, fmt, suffix, damage):
    loc = str(tmp_path / ("s" + suffix))
    assert packer.build(*boxes_dataset, loc, fmt, workers=1).ok
    d = damage(loc)
    d.set_data(4, bit_flipped)
    d.close()
    assert repair(loc).quarantined == 1
    with open_store(loc) as r:
        q0, b0, n0 = list(r.metadata.quarantine), r.quarantine_bytes(0), len(r)
        h0 = list(r.metadata.history)
    assert [h["action"] for h in h0] == ["repair"]
    rep = append(loc, *extra_boxes(tmp_path))
    assert rep.published
    with open_store(loc) as r:
        assert len(r) == n0 + 4 and r.metadata.quarantine == q0
        assert r.quarantine_bytes(0) == b0 and checksum(b0) == q0[0]["checksum"]
        assert r.metadata.history == h0           # the repair's record (original index checksum) too
    assert packer.verify(loc, deep=True).ok
    back = repair(loc, restore=[q0[0]["key"]])             # and it can still be put back
    assert back.ok and [a["action"] for a in back.actions] == ["restored"]


def test_merge_copy_keeps_the_inputs_quarantine(tmp_path, boxes_dataset):
    """merge --copy of a repaired shard: its quarantine comes along, indices moved to the
    merged store's positions, and a restore there puts the record back."""
    from packer.jobs.merge import merge
    locs = [str(tmp_path / f"s{j}.lmdb") for j in range(2)]
    for j, loc in enumerate(locs):
        assert packer.build(*boxes_dataset, loc, "lmdb", workers=1, shard=(j, 2)).ok
    d = LMDBDamage(locs[1])
    d.relabel(2)          # a changed label: restored as it is, the JPEG still decodes
    d.close()
    assert repair(locs[1]).quarantined == 1
    with open_store(locs[0]) as r0, open_store(locs[1]) as r1:
        offset, q, data = len(r0), r1.metadata.quarantine[0], r1.quarantine_bytes(0)
    out = str(tmp_path / "all.h5")
    merge(locs, out, copy=True, format="hdf5")
    with open_store(out) as r:
        assert [e["key"] for e in r.metadata.quarantine] == [q["key"]]
        assert r.metadata.quarantine[0]["index"] == offset + q["index"]
        assert r.quarantine_bytes(0) == data
    assert packer.verify(out, deep=True).ok
    back = repair(out, restore=[q["key"]])
    assert back.ok and [a["action"] for a in back.actions] == ["restored"]
    with open_store(out) as r:
        assert r.get(offset + q["index"]).key == q["key"]
