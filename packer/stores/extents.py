"""Where each record of a published shard lies in its data file: the ``<shard>.extents.npy``
object beside an LMDB shard in a bucket, written by :mod:`packer.jobs.publish`, read by
:mod:`packer.stores.cache` for ``ds[i]`` by byte ranges (docs/object-storage.md)."""
from __future__ import annotations

import io

import numpy as np

from packer.core.errors import StoreError

#: Next to a published shard: where each of its records lies in its data file (ranged reads).
EXTENTS_SUFFIX = ".extents.npy"


def dump_extents(table) -> bytes:
    """An extents table (``(count, 4)``: metadata offset, length, image offset, length) as the
    ``.npy`` bytes published beside a shard (little-endian uint64, no pickle)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(table, dtype="<u8"), allow_pickle=False)
    return buf.getvalue()


def load_extents(raw: bytes, name: str) -> np.ndarray:
    """The extents table in ``raw`` (:func:`dump_extents`); StoreError naming ``name`` when it is
    not one."""
    try:
        table = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise StoreError(f"{name}: not an extents table: {exc}") from exc
    if table.ndim != 2 or table.shape[1] != 4 or table.dtype.kind != "u":
        raise StoreError(f"{name}: not an extents table (shape {table.shape}, dtype {table.dtype})")
    return table


__all__ = ["EXTENTS_SUFFIX", "dump_extents", "load_extents"]
