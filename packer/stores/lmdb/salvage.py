"""Reading a damaged LMDB store without its B-tree: a scan of the leaf pages of ``data.mdb``
(skipping pages past the end of a file cut short), telling packer's environments from other
programs' by their pages, and a reader that hands out only records whose checksums hold.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

from packer.core.errors import RecordError, StoreError
from packer.core.records import Record, StoreMetadata, loads_bounded
from packer.stores.base import StoreReader, count_limit
from packer.stores.lmdb.envs import open_readonly
from packer.stores.lmdb.layout import DBS, expected_data_size, import_lmdb

_P_LEAF, _P_OVERFLOW, _P_META = 0x02, 0x04, 0x08
_F_BIGDATA = 0x01
_PAGEHDR = 16


def scan_leaf_nodes(data_file) -> Iterator[tuple[bytes, int, int, bytes | None]]:
    """Every (key, value offset, value length, inline value) in the leaf pages of ``data_file``.

    LMDB page layout (lmdb/mdb.c, 64-bit): a 16-byte header (pgno, pad, flags, lower/upper or
    overflow page count), then on leaf pages ``lower - 16`` bytes of uint16 node offsets; a
    node is lo/hi (data size), flags, key size, key, then the data or, with F_BIGDATA, the
    8-byte number of the overflow page whose bytes follow its header. Stale copies of pages
    (copy-on-write) are yielded too: callers keep only values that pass their checksums.
    Pages past the end of the file (a file cut short) are skipped, never mapped.
    """
    need, size = expected_data_size(data_file)
    with open(data_file, "rb") as fh:
        fh.seek(40)
        psize = struct.unpack("<I", fh.read(4))[0]
        for pgno in range(2, size // psize):
            fh.seek(pgno * psize)
            page = fh.read(psize)
            flags = struct.unpack_from("<H", page, 10)[0]
            if flags & (_P_OVERFLOW | _P_META) or not flags & _P_LEAF or flags & 0x60:
                continue
            lower, upper = struct.unpack_from("<HH", page, 12)
            if not _PAGEHDR <= lower <= upper <= psize:
                continue
            for i in range((lower - _PAGEHDR) // 2):
                off = struct.unpack_from("<H", page, _PAGEHDR + 2 * i)[0]
                if off + 8 > psize:
                    continue
                lo, hi, nflags, ksize = struct.unpack_from("<HHHH", page, off)
                dsize = lo | (hi << 16)
                kstart = off + 8
                key = page[kstart:kstart + ksize]
                if nflags & _F_BIGDATA:
                    if kstart + ksize + 8 > psize:
                        continue
                    ov = struct.unpack_from("<Q", page, kstart + ksize)[0]
                    start = ov * psize + _PAGEHDR
                    if start + dsize <= size:
                        yield key, start, dsize, None
                elif kstart + ksize + dsize <= psize and not nflags & 0x06:
                    yield key, -1, dsize, page[kstart + ksize:kstart + ksize + dsize]


def holds_nothing(location: str) -> bool:
    """True when the LMDB environment at ``location`` holds no data: no key at all, or only
    (some of) packer's named databases, all empty. That is what a build killed before its first
    commit leaves in its staging folder (killed just after creating its databases, too)."""
    lmdb = import_lmdb()
    try:
        env = open_readonly(location)
    except (lmdb.Error, OSError):
        return False
    try:
        with env.begin() as txn:
            names = [key for key, _ in txn.cursor()]
            if not set(names) <= set(DBS):
                return False
            for name in names:
                if txn.stat(env.open_db(name, txn=txn, create=False))["entries"]:
                    return False
        return True
    except lmdb.Error:
        return False
    finally:
        env.close()


def has_packer_pages(data_file) -> bool:
    """True at the first leaf node that only packer writes: the store metadata or build
    progress (JSON objects under ``metadata`` / ``progress``), or a record's fields (a JSON
    object with ``key`` and ``checksum`` under an 8-byte index)."""
    try:
        for key, _, _, inline in scan_leaf_nodes(data_file):
            if inline is None or inline[:1] != b"{" or not (key in (b"metadata", b"progress") or len(key) == 8):
                continue
            try:
                d = loads_bounded(inline)
            except ValueError:
                continue
            if isinstance(d, dict) and (len(key) != 8 or ("key" in d and "checksum" in d)):
                return True
    except (StoreError, OSError, struct.error):
        return False
    return False


class LMDBScanReader(StoreReader):
    """Read-only view of what survives in a damaged ``data.mdb``, found by :func:`scan_leaf_nodes`.

    A record is readable only when a copy of its fields passes its meta checksum and a value
    under the same index key matches the record's data checksum, so nothing unverified is
    ever handed out. Metadata is the store's own when its page survived, else provisional.
    """

    def __init__(self, location: str, problem: str):
        self.location = str(location)
        self.salvage_problems = [problem]
        self._file = Path(location) / "data.mdb"
        metas: dict[int, list[dict]] = {}
        blobs: dict[int, list[tuple[int, int, bytes | None]]] = {}
        store_meta = None
        for key, off, n, inline in scan_leaf_nodes(self._file):
            if key == b"metadata" and inline is not None:
                try:
                    store_meta = StoreMetadata.from_json(inline)
                except (ValueError, TypeError):
                    pass
                continue
            if len(key) != 8:
                continue
            idx = struct.unpack(">Q", key)[0]
            if inline is not None and inline[:1] == b"{":
                try:
                    d = loads_bounded(inline)
                except ValueError:
                    d = None
                if isinstance(d, dict) and d.get("index") == idx and "checksum" in d:
                    metas.setdefault(idx, []).append(d)
                    continue
            blobs.setdefault(idx, []).append((off, n, inline))
        self._metas, self._blobs = metas, blobs
        # Most records may be lost with the pages, so the count is checked against the file the
        # meta pages describe too: every record takes more than 64 bytes of it (its JSON alone).
        need = expected_data_size(self._file)[0]
        limit = max(count_limit(len(metas)), need // 64)
        if store_meta is not None and store_meta.count > limit:
            self.salvage_problems.append(f"{location}: store metadata is damaged: field 'count' says "
                                         f"{store_meta.count} records, {len(metas)} were found in a file "
                                         f"meant to hold {need} bytes")
        elif store_meta is None:
            self.salvage_problems.append(f"{location}: store metadata lost with the damaged pages")
        if store_meta is None or store_meta.count > limit:
            store_meta = StoreMetadata(format="lmdb", count=min(max(metas, default=-1) + 1, limit),
                                       label_schema="none", class_names=[], build_options={},
                                       index_checksum="")
        self.metadata = store_meta

    def _value(self, off: int, n: int, inline) -> bytes:
        if inline is not None:
            return bytes(inline)
        with open(self._file, "rb") as fh:
            fh.seek(off)
            return fh.read(n)

    def __len__(self) -> int:
        return sum(1 for i in self._metas if i < self.metadata.count)

    def get(self, index: int) -> Record:
        index = int(index)
        if not 0 <= index < self.metadata.count:
            raise IndexError(f"{self.location}: index {index} out of range 0..{self.metadata.count - 1}")
        from packer.core.records import checksum
        key = f"#{index}"
        for d in self._metas.get(index, []):
            try:
                rec = Record.from_meta(d, b"", self.metadata.label_schema)
            except (ValueError, TypeError, KeyError):
                continue
            key = rec.key
            if not rec.meta_ok():
                continue
            for off, n, inline in self._blobs.get(index, []):
                data = self._value(off, n, inline)
                if checksum(data) == rec.checksum:
                    rec.data = data
                    return rec
            raise RecordError(self.location, key, "image bytes lost with the damaged part of the file", index)
        raise RecordError(self.location, key, "record lost with the damaged part of the file", index)

    def index_of(self, key: str) -> int:
        for idx, ds in self._metas.items():
            if any(d.get("key") == key for d in ds):
                return idx
        raise KeyError(key)

    def check_structure(self) -> list[str]:
        return list(self.salvage_problems)

    def size_bytes(self) -> int:
        return self._file.stat().st_size

    def close(self) -> None:
        pass
