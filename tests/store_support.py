"""Stores made and damaged as they sit on disk (or on the server), shared by the repair tests
(``test_repair.py``) and the tests that reuse that damage: quarantine across append, publish
checks, BLAKE2b stores (built as packer built them before XXH3)."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.core import records as core_records
from packer.core.records import LEGACY_CHECKSUM_ALGORITHM, StoreMetadata
from packer.sample import make_dataset
from packer.stores import open_store


def build_store(dataset, loc, fmt, **kw):
    """``dataset`` (images, labels) built into ``loc`` by one worker, cleanly; returns ``loc``."""
    rep = packer.build(*dataset, loc, fmt, workers=1, **kw)
    assert rep.ok
    return loc


def snapshot(loc, fmt):
    """key -> (bytes, meta fields but index/meta_checksum) of every live record."""
    out = {}
    with open_store(loc, fmt) as r:
        for i in range(r.metadata.count):
            rec = r.get(i)
            d = rec.meta_dict()
            d.pop("index"), d.pop("meta_checksum")
            out[rec.key] = (bytes(rec.data), json.dumps(d, sort_keys=True))
        return out, r.metadata


#: The record stores (a manifest has no records of its own: repair --source goes to its shards).
STORE_FORMATS = ["lmdb", "hdf5", pytest.param("mongo", marks=pytest.mark.mongo)]


def store_state(loc, fmt, staging: bool = True):
    """Everything a reader or a later command can see of the store at ``loc``: its records and
    metadata, the bytes of its files (path stores) or its metadata document (MongoDB), and what
    lies next to it (journal, backups; staging areas too unless ``staging`` is False). The lock
    a writer takes is left out: taking it is not a change to the store."""
    import hashlib
    records, meta = snapshot(loc, fmt)
    if fmt == "mongo":
        from tests import mongo_support
        client = mongo_support.client_for(loc)
        _, db, coll = mongo_support.split_location(loc)
        try:
            names = client[db].list_collection_names()
            marker = client[db][coll + ".meta"].find_one({"_id": "metadata"})
        finally:
            client.close()
        stored = [marker["json"], marker["build_id"]]
    else:
        p = Path(loc)
        names = os.listdir(p.parent)
        stored = [hashlib.sha256((p / "data.mdb" if p.is_dir() else p).read_bytes()).hexdigest()]
        names = [n for n in names if n.startswith(p.name)]
    names = sorted(n for n in names if not n.endswith(".lock") and (staging or ".partial" not in n))
    return records, meta.to_json(), stored, names


def build_legacy(images, labels, loc, fmt, monkeypatch):
    """A store as packer built it before XXH3: BLAKE2b everywhere, no algorithm in the metadata."""
    with monkeypatch.context() as m:
        m.setattr(core_records, "CHECKSUM_ALGORITHM", LEGACY_CHECKSUM_ALGORITHM)
        to_json = StoreMetadata.to_json

        def old_to_json(self):
            d = json.loads(to_json(self))
            del d["checksum_algorithm"]
            return json.dumps(d, indent=1, sort_keys=True).encode()

        m.setattr(StoreMetadata, "to_json", old_to_json)
        rep = packer.build(images, labels, loc, fmt, workers=1)
    assert rep.published and rep.ok


def extra_boxes(tmp_path):
    """4 more images under keys the boxes dataset does not use."""
    images, labels = make_dataset(tmp_path / "more", 4, kind="boxes", seed=9)
    for root in (images, labels):
        for p in sorted(root.iterdir()):
            p.rename(root / ("extra_" + p.name))
    return images, labels


# ---------------------------------------------------------------------------------------
# Damage, per format, on the store as stored
# ---------------------------------------------------------------------------------------
class LMDBDamage:
    def __init__(self, loc):
        import lmdb
        self.loc = loc
        self.env = lmdb.open(loc, max_dbs=8)
        self.db = {n: self.env.open_db(n.encode()) for n in ("data", "records", "keys", "meta")}

    def close(self):
        self.env.close()

    def _get(self, name, k):
        with self.env.begin() as t:
            return bytes(t.get(k, db=self.db[name]))

    def _put(self, name, k, v):
        with self.env.begin(write=True) as t:
            t.put(k, v, db=self.db[name])

    def set_data(self, i, fn):
        k = struct.pack(">Q", i)
        self._put("data", k, fn(self._get("data", k)))

    def relabel(self, i):
        k = struct.pack(">Q", i)
        m = json.loads(self._get("records", k))
        m["label"] = [[2.0, 0.5, 0.5, 0.25, 0.25]]
        self._put("records", k, json.dumps(m).encode())

    def break_index(self, i):
        k = struct.pack(">Q", i)
        key = json.loads(self._get("records", k))["key"].encode()
        with self.env.begin(write=True) as t:
            t.put(key, struct.pack(">Q", (i + 1) % 16), db=self.db["keys"])   # points to the wrong record

    def break_metadata(self):
        self._put("meta", b"metadata", b'{"format": "lmdb", "cou')

    def cut_file(self, frac):
        self.close()
        f = Path(self.loc) / "data.mdb"
        os.truncate(f, int(f.stat().st_size * frac))


class HDF5Damage:
    def __init__(self, loc):
        import h5py
        self.loc = loc
        self.f = h5py.File(loc, "r+")

    def close(self):
        if self.f:
            self.f.close()
            self.f = None

    def set_data(self, i, fn):
        o = self.f["jpeg_offsets"]
        a, b = int(o[i]), int(o[i + 1])
        old = self.f["jpeg_bytes"][a:b].tobytes()
        new = fn(old)
        new = new + b"\0" * (len(old) - len(new))   # a record's room is fixed: a lost tail reads as zeros
        self.f["jpeg_bytes"][a:b] = np.frombuffer(new, np.uint8)

    def relabel(self, i):
        bo = self.f["box_offsets"]
        self.f["boxes"][int(bo[i])] = [2.0, 0.5, 0.5, 0.25, 0.25]

    def break_index(self, i):
        self.f["keys"][i] = "not/the/key.jpg"

    def break_metadata(self):
        self.f.attrs["packer_metadata"] = '{"format": "hdf5", "cou'

    def cut_file(self, frac):
        self.close()
        os.truncate(self.loc, int(os.path.getsize(self.loc) * frac))

    def flip_on_disk(self, i):
        """Flip bytes in the file itself: the chunk's Fletcher32 fails, not just the record."""
        o = self.f["jpeg_offsets"][:]
        ds = self.f["jpeg_bytes"]
        size = ds.chunks[0]
        pos = (int(o[i]) + int(o[i + 1])) // 2
        info = ds.id.get_chunk_info_by_coord(((pos // size) * size,))
        at = info.byte_offset + pos % size
        self.close()
        with open(self.loc, "r+b") as fh:
            fh.seek(at)
            raw = bytearray(fh.read(8))
            fh.seek(at)
            fh.write(bytes(x ^ 0x5A for x in raw))


class MongoDamage:
    def __init__(self, loc):
        from tests import mongo_support
        self.client = mongo_support.client_for(loc)
        _, db, coll = mongo_support.split_location(loc)
        self.db, self.coll = self.client[db], coll
        self.c = self.db[coll]

    def close(self):
        self.client.close()

    def set_data(self, i, fn):
        doc = self.c.find_one({"_id": i})
        self.c.update_one({"_id": i}, {"$set": {"data": fn(doc["data"])}})

    def relabel(self, i):
        self.c.update_one({"_id": i}, {"$set": {"label": [[2.0, 0.5, 0.5, 0.25, 0.25]]}})

    def break_index(self, i):
        self.c.drop_index("key_unique")

    def break_metadata(self):
        self.db[self.coll + ".meta"].update_one({"_id": "metadata"}, {"$set": {"json": '{"format": "mon'}})

    def delete_doc(self, i):
        self.c.delete_one({"_id": i})

    def edit_doc(self, i):
        self.c.update_one({"_id": i}, {"$set": {"width": 1}})

    def drop_gridfs_chunk(self, i):
        chunks = self.db[self.coll + ".gridfs.chunks"]
        doc = chunks.find_one({"files_id": i, "n": 0})
        assert doc is not None, "record not in GridFS"
        chunks.delete_one({"_id": doc["_id"]})


def damager(fmt, loc):
    if fmt == "manifest":
        # A built manifest lists one shard (LMDB by default), whose positions are the manifest's:
        # the damage is done to the shard store, where the records are.
        from packer.stores.manifest import ManifestReader
        with ManifestReader(loc) as m:
            (entry,), shard = m.shards, m.shard_location(0)
        return damager(entry["format"], shard)
    return {"lmdb": LMDBDamage, "hdf5": HDF5Damage, "mongo": MongoDamage}[fmt](loc)
