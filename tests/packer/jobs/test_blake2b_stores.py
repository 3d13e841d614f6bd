"""BLAKE2b stores (built before XXH3) through repair, convert, export, append and merge --copy:
each keeps one algorithm per store, the one its metadata names, and verifies afterwards."""
from __future__ import annotations

import shutil

import pytest

import packer
from packer.core.records import LEGACY_CHECKSUM_ALGORITHM, checksum, index_checksum
from packer.jobs.append import append
from packer.jobs.convert import convert
from packer.jobs.export import export
from packer.jobs.merge import merge
from packer.jobs.repair import repair
from packer.sample import make_dataset
from packer.stores import open_store
from tests.corpus import bit_flipped
from tests.store_support import LMDBDamage, build_legacy, extra_boxes

pytestmark = pytest.mark.timeout(180)
OLD = LEGACY_CHECKSUM_ALGORITHM


def _sealed_under(loc, algorithm):
    """Every record's checksums, the quarantine's and the index checksum are ``algorithm``'s."""
    with open_store(loc) as r:
        assert r.metadata.checksum_algorithm == algorithm
        entries = []
        for i in range(len(r)):
            rec = r.get(i)
            assert rec.checksum == checksum(bytes(rec.data), algorithm), rec.key
            assert rec.meta_checksum == rec.meta_digest(algorithm), rec.key
            entries.append((i, rec.key, rec.checksum))
        assert index_checksum(entries, algorithm) == r.metadata.index_checksum
        for n, q in enumerate(r.metadata.quarantine or []):
            assert q["checksum"] == checksum(r.quarantine_bytes(n), algorithm)
    assert packer.verify(loc, deep=True).ok


@pytest.fixture
def old_store(tmp_path, boxes_dataset, monkeypatch):
    loc = str(tmp_path / "old.lmdb")
    build_legacy(*boxes_dataset, loc, "lmdb", monkeypatch)
    return loc


def test_repair_keeps_blake2b(old_store, boxes_dataset):
    d = LMDBDamage(old_store)
    d.set_data(3, bit_flipped)
    d.close()
    res = repair(old_store)
    assert res.ok and [a["action"] for a in res.actions] == ["quarantined"]
    _sealed_under(old_store, OLD)
    back = repair(old_store, source=boxes_dataset[0], labels=boxes_dataset[1])   # source checksums are BLAKE2b
    assert back.ok and [a["action"] for a in back.actions] == ["from-source"], back.to_dict()
    _sealed_under(old_store, OLD)


@pytest.mark.parametrize("target,suffix", [("hdf5", ".h5"), ("lmdb", ".lmdb")])
def test_convert_and_export_of_a_blake2b_store(old_store, tmp_path, target, suffix):
    with open_store(old_store) as r:
        want = r.metadata.index_checksum
    rep = convert(old_store, str(tmp_path / ("c" + suffix)), target)
    assert rep.index_checksum == want          # compared under the source's algorithm
    _sealed_under(str(tmp_path / ("c" + suffix)), OLD)
    ex = export(str(tmp_path / ("c" + suffix)), tmp_path / "out")
    assert ex.ok and ex.identical == rep.records     # original-file checksums are BLAKE2b too


def test_append_to_a_blake2b_store_stays_blake2b(old_store, tmp_path):
    before = len(open_store(old_store))
    rep = append(old_store, *extra_boxes(tmp_path))
    assert rep.published and rep.records == before + 4
    _sealed_under(old_store, OLD)
    with open_store(old_store) as r:     # appended records' original-file checksums are BLAKE2b
        rec = r.get(len(r) - 1)
        src = tmp_path / "more" / "images" / rec.key
        assert rec.source_checksum == checksum(src.read_bytes(), OLD)


def test_merge_copy_keeps_or_unifies_the_algorithm(old_store, tmp_path):
    images, labels = extra_boxes(tmp_path)
    new = str(tmp_path / "new.lmdb")
    assert packer.build(images, labels, new, "lmdb", workers=1).ok
    old2 = str(tmp_path / "old2.lmdb")
    shutil.copytree(old_store, old2)
    merge([old_store], str(tmp_path / "same.h5"), copy=True, format="hdf5")
    _sealed_under(str(tmp_path / "same.h5"), OLD)
    merge([old_store, new], str(tmp_path / "mixed.lmdb"), copy=True)
    _sealed_under(str(tmp_path / "mixed.lmdb"), "xxh3-128")
    # The logical merge of a BLAKE2b shard reads and verifies as well.
    merge([old_store, new], str(tmp_path / "m.packer-manifest.json"))
    assert packer.verify(str(tmp_path / "m.packer-manifest.json"), deep=True).ok


def test_append_follows_the_stores_max_size(tmp_path):
    """Images appended to a store built with max_size are downscaled like the build's were."""
    images, labels = make_dataset(tmp_path / "a", 4, kind="boxes", sizes=((120, 160),), seed=1)
    loc = str(tmp_path / "s.lmdb")
    assert packer.build(images, labels, loc, "lmdb", workers=1, max_size=64).ok
    more_images, more_labels = extra_boxes(tmp_path)     # 375x500 etc. by default
    rep = append(loc, more_images, more_labels)
    assert rep.published
    with open_store(loc) as r:
        assert r.metadata.build_options["max_size"] == 64
        sizes = [(r.get(i).width, r.get(i).height) for i in range(len(r))]
    assert len(sizes) == 8 and all(max(w, h) <= 64 for w, h in sizes), sizes
    assert packer.verify(loc, deep=True).ok
