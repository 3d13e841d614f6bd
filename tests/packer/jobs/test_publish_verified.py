"""repair, convert, append and merge check what they staged before they publish it.

Each test hands the operation one record that would not verify in the result (its label does
not fit the store's label schema, the damage of the ``repair --source`` issue, while its
checksums agree with it, as a label or reader bug would make it) and checks that the operation
stops with a StoreError naming the store and the key, publishes nothing, and leaves the store
that was there as it was.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import shutil

import pytest

import packer
from packer.core.errors import StoreError
from packer.core.records import sealed_with
from packer.sample import make_dataset
from packer.stores import get_store, open_store
from tests.corpus import bit_flipped
from tests.store_support import STORE_FORMATS, LMDBDamage, build_store, damager, store_state

pytestmark = pytest.mark.timeout(240)

# The modules, not the functions ``packer`` exports under the same names.
append_mod, convert_mod, merge_mod, repair_mod = (importlib.import_module(f"packer.jobs.{name}") for name in
                                                  ("append", "convert", "merge", "repair"))
repair_source_mod = importlib.import_module("packer.jobs.repair.source")

#: Which record each test hands over wrong.
VICTIM = 3


def misfit(rec, algorithm):
    """``rec`` with a class id where the store holds boxes, its checksums made to agree."""
    return sealed_with(dataclasses.replace(rec, label=3), algorithm)


class OneMisfit:
    """A store reader that hands out record ``VICTIM`` as :func:`misfit` makes it."""

    def __init__(self, reader):
        self._reader = reader

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._reader.__exit__(*exc)

    def _fix(self, rec):
        return misfit(rec, self._reader.metadata.checksum_algorithm) if rec.index == VICTIM else rec

    def get(self, index):
        return self._fix(self._reader.get(index))

    def get_many(self, indices):
        return [self._fix(r) for r in self._reader.get_many(indices)]


def _victim_key(loc, fmt) -> str:
    with open_store(loc, fmt) as r:
        return r.get(VICTIM).key


def _refused(key):
    """pytest.raises for the StoreError of a staged record that would not verify."""
    return pytest.raises(StoreError, match=re.escape(repr(key)) + r".*label.*nothing (was )?published")


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_repair_publishes_nothing_that_does_not_verify(fmt, location_for, boxes_dataset, monkeypatch):
    loc = build_store(boxes_dataset, location_for(), fmt)
    key = _victim_key(loc, fmt)
    d = damager(fmt, loc)
    d.set_data(VICTIM, bit_flipped)
    d.close()
    state = store_state(loc, fmt, staging=False)
    problems = [str(p) for p in packer.verify(loc, deep=True).problems]
    real = repair_source_mod.Source.record

    def record(self, *args, **kwargs):
        rec, why = real(self, *args, **kwargs)
        return (None if rec is None else misfit(rec, rec.checksum_algorithm)), why
    with monkeypatch.context() as m, _refused(key):
        m.setattr(repair_source_mod.Source, "record", record)
        repair_mod.repair(loc, source=boxes_dataset[0], labels=boxes_dataset[1])
    # The old store is in place as it was: same records, no backup, no journal.
    assert store_state(loc, fmt, staging=False) == state
    assert get_store(fmt).read_journal(loc) is None
    assert [str(p) for p in packer.verify(loc, deep=True).problems] == problems
    res = repair_mod.repair(loc, source=boxes_dataset[0], labels=boxes_dataset[1])
    assert res.ok and res.verified and packer.verify(loc, deep=True).ok


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_convert_publishes_nothing_that_does_not_verify(fmt, location_for, boxes_dataset, monkeypatch):
    src = build_store(boxes_dataset, location_for("src"), fmt)
    dst = location_for("dst")
    key = _victim_key(src, fmt)
    real = convert_mod.open_store
    with monkeypatch.context() as m, _refused(key):
        m.setattr(convert_mod, "open_store", lambda *a, **k: OneMisfit(real(*a, **k)))
        convert_mod.convert(src, dst, fmt)
    assert not get_store(fmt).exists(dst)
    assert packer.verify(src, deep=True).ok
    assert convert_mod.convert(src, dst, fmt).records == 24 and packer.verify(dst, deep=True).ok


def _more_images(tmp_path):
    """4 new images with YOLO labels, under folders the boxes dataset does not use."""
    images, labels = make_dataset(tmp_path / "more", 4, kind="boxes", sizes=((40, 56),), seed=9)
    for root in (images, labels):
        for part in ("part0", "part1"):
            shutil.move(root / part, root / part.replace("part", "extra"))
    return images, labels


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_append_publishes_nothing_that_does_not_verify(fmt, location_for, boxes_dataset, tmp_path, monkeypatch):
    loc = build_store(boxes_dataset, location_for(), fmt)
    key = _victim_key(loc, fmt)
    state = store_state(loc, fmt, staging=False)
    more = _more_images(tmp_path)
    real = append_mod.open_store
    with monkeypatch.context() as m, _refused(key):
        m.setattr(append_mod, "open_store", lambda *a, **k: OneMisfit(real(*a, **k)))
        append_mod.append(loc, *more)
    assert store_state(loc, fmt, staging=False) == state
    assert packer.verify(loc, deep=True).ok
    rep = append_mod.append(loc, *more, resume=False)
    assert rep.published and rep.records == 28 and packer.verify(loc, deep=True).ok


def test_append_to_a_manifest_lists_no_shard_that_does_not_verify(tmp_path, boxes_dataset, monkeypatch):

    shard = build_store(boxes_dataset, str(tmp_path / "s0.lmdb"), "lmdb")
    out = str(tmp_path / "all.packer-manifest.json")
    merge_mod.merge([shard], out)
    before = open(out, "rb").read()
    real = append_mod.pack

    def build(*args, **kwargs):   # the new shard is published, then damaged (a disk, a bug)
        rep = real(*args, **kwargs)
        d = LMDBDamage(args[2])
        d.set_data(1, bit_flipped)
        d.close()
        return rep
    monkeypatch.setattr(append_mod, "pack", build)
    with pytest.raises(StoreError, match="does not verify.*manifest not changed"):
        append_mod.append(out, *_more_images(tmp_path))
    assert open(out, "rb").read() == before and packer.verify(out, deep=True).ok


@pytest.mark.parametrize("fmt", STORE_FORMATS)
def test_merge_copy_publishes_nothing_that_does_not_verify(fmt, location_for, boxes_dataset, monkeypatch):
    shards = [build_store(boxes_dataset, location_for(f"s{j}"), fmt, shard=(j, 2)) for j in range(2)]
    out = location_for("merged")
    key = _victim_key(shards[0], fmt)
    real = merge_mod.open_store
    with monkeypatch.context() as m, _refused(key):
        m.setattr(merge_mod, "open_store", lambda *a, **k: OneMisfit(real(*a, **k)))
        merge_mod.merge(shards, out, copy=True, format=fmt)
    assert not get_store(fmt).exists(out)
    assert all(packer.verify(s, deep=True).ok for s in shards)
    rep = merge_mod.merge(shards, out, copy=True, format=fmt, resume=False)
    assert rep.records == 24 and packer.verify(out, deep=True).ok
