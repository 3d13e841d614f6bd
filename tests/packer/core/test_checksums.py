"""Record checksums: XXH3-128 for new stores, BLAKE2b-128 stores (built before the switch) still read
and verify, the algorithm recorded in the store metadata."""
from __future__ import annotations

import hashlib
import json

import pytest
import xxhash

import packer
from packer.core import records
from packer.core.records import (
    CHECKSUM_ALGORITHM,
    LEGACY_CHECKSUM_ALGORITHM,
    IndexHasher,
    StoreMetadata,
    checksum,
    checksum_matches,
)
from packer.stores import open_store
from readers import StoreDataset
from tests.store_support import build_legacy

PATH_FORMATS = ["lmdb", "hdf5"]
_SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}


def test_checksum_algorithms():
    data = b"packer" * 1000
    assert checksum(data) == xxhash.xxh3_128_hexdigest(data)
    assert checksum(data, "blake2b-128") == hashlib.blake2b(data, digest_size=16).hexdigest()
    assert checksum_matches(data, checksum(data, "blake2b-128"))
    assert checksum_matches(data, checksum(data))
    assert not checksum_matches(data, checksum(data, "blake2b-128"), "xxh3-128")
    assert not checksum_matches(data + b"x", checksum(data))
    with pytest.raises(ValueError, match="unknown checksum algorithm 'md5'"):
        checksum(data, "md5")
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        IndexHasher("md5")


def test_metadata_without_algorithm_reads_as_blake2b():
    meta = StoreMetadata("lmdb", 1, "class", [], {}, "0" * 32)
    assert meta.checksum_algorithm == CHECKSUM_ALGORITHM
    d = json.loads(meta.to_json())
    del d["checksum_algorithm"]
    assert StoreMetadata.from_dict(d).checksum_algorithm == LEGACY_CHECKSUM_ALGORITHM


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", PATH_FORMATS)
def test_blake2b_store_reads_and_verifies(fmt, tmp_path, boxes_dataset, monkeypatch):
    images, labels = boxes_dataset
    loc = str(tmp_path / ("old" + _SUFFIX[fmt]))
    build_legacy(images, labels, loc, fmt, monkeypatch)
    with open_store(loc, fmt) as r:
        assert r.metadata.checksum_algorithm == LEGACY_CHECKSUM_ALGORITHM
        rec = r.get(0)
        # The stored checksums really are BLAKE2b: the store is what old packer wrote.
        assert rec.checksum == checksum(bytes(rec.data), LEGACY_CHECKSUM_ALGORITHM)
        assert rec.data_ok() and rec.meta_ok()
    rep = packer.verify(loc, format=fmt)
    assert rep.ok, rep.problems
    ds = StoreDataset(loc, format=fmt)
    assert len([ds[i] for i in range(len(ds))]) == 24


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", PATH_FORMATS)
def test_new_store_uses_xxh3(fmt, tmp_path, boxes_dataset):
    images, labels = boxes_dataset
    loc = str(tmp_path / ("new" + _SUFFIX[fmt]))
    assert packer.build(images, labels, loc, fmt, workers=1).ok
    with open_store(loc, fmt) as r:
        assert r.metadata.checksum_algorithm == "xxh3-128"
        rec = r.get(3)
        assert rec.checksum == xxhash.xxh3_128_hexdigest(bytes(rec.data))
        assert rec.meta_checksum == rec.meta_digest("xxh3-128")
    assert packer.verify(loc, format=fmt).ok


@pytest.mark.timeout(120)
def test_damage_in_blake2b_store_is_found(tmp_path, boxes_dataset, monkeypatch):
    """A flipped byte in an old store's record is still reported by verify and the reader."""
    images, labels = boxes_dataset
    loc = str(tmp_path / "old.h5")
    build_legacy(images, labels, loc, "hdf5", monkeypatch)
    import h5py

    with h5py.File(loc, "r+") as f:
        jb = f["jpeg_bytes"]
        offs = f["jpeg_offsets"][:]
        pos = int(offs[5]) + 400 if offs.ndim == 1 else int(offs[5][0]) + 400
        jb[pos] = jb[pos] ^ 0x10
    rep = packer.verify(loc, format="hdf5")
    assert not rep.ok
    assert any("checksum mismatch" in p.reason for p in rep.problems)


@pytest.mark.timeout(60)
def test_index_checksum_of_old_store_uses_its_algorithm(tmp_path, boxes_dataset, monkeypatch):
    images, labels = boxes_dataset
    loc = str(tmp_path / "old.lmdb")
    build_legacy(images, labels, loc, "lmdb", monkeypatch)
    with open_store(loc, "lmdb") as r:
        entries = [(i, r.get(i).key, r.get(i).checksum) for i in range(r.metadata.count)]
        assert records.index_checksum(entries, LEGACY_CHECKSUM_ALGORITHM) == r.metadata.index_checksum
        assert records.index_checksum(entries) != r.metadata.index_checksum
