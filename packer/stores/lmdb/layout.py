"""The LMDB store's layout and file facts: database names, map and margin sizes, record keys
(8-byte big-endian indices), ``py-lmdb`` imported lazily, and the size ``data.mdb`` must have
according to LMDB's own meta pages (a file cut short is found before anything maps it).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

from packer.core.deps import optional_import
from packer.core.errors import StoreError
from packer.stores.base import partial_location

DBS = (b"data", b"records", b"keys", b"meta")
#: Room kept free beyond a batch's own pages: B-tree pages rewritten by the commit, the lock file.
WRITE_MARGIN = 1 << 20
INITIAL_MAP = 256 << 20
MAX_DBS = 8


_LMDB = None


def import_lmdb():
    """The ``lmdb`` module (imported once); DependencyError saying what to install when it is missing."""
    global _LMDB
    if _LMDB is None:
        _LMDB = optional_import("lmdb", "the LMDB store", package="lmdb")
    return _LMDB


def index_key(index: int) -> bytes:
    """The key of record ``index`` in the per-record databases: 8 bytes, big-endian (sorts by index)."""
    return struct.pack(">Q", index)


def partial_path(location: str) -> Path:
    """The staging folder of the store at ``location``: ``<location>.partial``."""
    return Path(partial_location(location))


def page_bytes(n: int, page: int = 4096) -> int:
    """Bytes LMDB's data file grows by for a value of ``n`` bytes (whole pages, with a header)."""
    return -(-(n + 16) // page) * page


_META_MAGIC = 0xBEEFC0DE


def expected_data_size(data_file) -> tuple[int, int]:
    """(size the file must have, size it has) from LMDB's own meta pages.

    Pages 0 and 1 of ``data.mdb`` are meta pages (``MDB_meta`` after a 16-byte page header):
    the page size is in the free-list DB record's ``md_pad`` (offset 40) and the last page in
    use, ``mm_last_pg``, at offset 136, next to ``mm_txnid``; the meta with the higher txnid is
    the current one. Reading a memory map past the end of a file cut short raises SIGBUS, so
    readers compare these before they map anything.

    Raises:
        StoreError: the meta pages are missing or not LMDB's.
    """
    try:
        with open(data_file, "rb") as fh:
            head = fh.read(152)
            size = os.fstat(fh.fileno()).st_size
            psize = struct.unpack_from("<I", head, 40)[0] if len(head) >= 152 else 0
            metas = [head]
            if 4096 <= psize <= (1 << 16):
                fh.seek(psize)
                metas.append(fh.read(152))
    except OSError as exc:
        raise StoreError(f"{data_file}: cannot read: {exc}") from exc
    best = None
    for raw in metas:
        if len(raw) < 152 or struct.unpack_from("<I", raw, 16)[0] != _META_MAGIC:
            continue
        last_pg, txnid = struct.unpack_from("<QQ", raw, 136)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid)
    if best is None or not 4096 <= psize <= (1 << 16):
        raise StoreError(f"{data_file}: not an LMDB data file (no valid meta page; {size} bytes)")
    return (best[0] + 1) * psize, size


def truncation_problem(location) -> str | None:
    """A message when the store's ``data.mdb`` is shorter than its meta pages say, else None."""
    return cut_short_message(location, *expected_data_size(Path(location) / "data.mdb"))


def cut_short_message(location, need: int, have: int) -> str | None:
    """The problem when ``data.mdb`` holds ``have`` bytes where its meta pages say ``need``, else None."""
    if have < need:
        return (f"{location}: store file cut short: data.mdb holds {have} bytes, its meta pages say "
                f"{need} ({need - have} bytes missing; an interrupted copy?) (hint: packer repair)")
    return None
