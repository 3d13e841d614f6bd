"""Reading around damage in an HDF5 store: finding a global heap cut short (reading it would
hang HDF5) and reading a 1-D dataset chunk by chunk without its Fletcher32 check, so that one
damaged chunk costs only the records whose own checksums fail.
"""
from __future__ import annotations

import os

import numpy as np

_HEAP_SIGNATURE = b"GCOL\x01\x00\x00\x00"   # global heap collection: magic, version 1, reserved


def cut_heap(path: str) -> str | None:
    """A problem when the file at ``path`` (cut short) ends inside a global heap collection
    (where HDF5 keeps variable-length strings: attributes, keys), else None.

    Read through a copy padded with zeros, such a collection's tail reads as objects of size
    0, and HDF5 2.0 loops forever on them (``H5HG__cache_heap_deserialize``) at the first
    string read: ``verify`` of a store cut to 4 KiB hung. Collections are found by their
    signature; one that starts before the cut and is sized past it is lost.
    """
    import mmap

    size = os.path.getsize(path)
    if size < len(_HEAP_SIGNATURE) + 8:
        return None
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = mm.find(_HEAP_SIGNATURE)
        while pos != -1:
            if pos + 16 <= size:
                length = int.from_bytes(mm[pos + 8:pos + 16], "little")
                if pos + length > size and 4096 <= length < (1 << 40):
                    return (f"{path}: the file ends inside an HDF5 global heap (bytes {pos}..{pos + length}, "
                            f"the file holds {size}): the store metadata and keys kept there are lost, "
                            f"no record is reachable (hint: packer repair --source IMAGES rebuilds it)")
            pos = mm.find(_HEAP_SIGNATURE, pos + 1)
    return None


def read_raw_chunks(ds, lo: int, hi: int) -> np.ndarray:
    """``ds[lo:hi]`` of an uncompressed 1-D uint8 dataset read chunk by chunk as stored,
    without the Fletcher32 check (salvage).

    One flipped byte fails a whole chunk's Fletcher32, taking every record in it down; read
    raw, each record's own checksum then says which one is damaged. Raises OSError when the
    dataset is compressed or a chunk cannot be read at all.
    """
    if ds.compression is not None or ds.chunks is None or ds.ndim != 1:
        raise OSError(f"{ds.name}: cannot read around a damaged chunk of a compressed dataset")
    size = ds.chunks[0]
    tail = 4 if ds.fletcher32 else 0
    parts = []
    for k in range(lo // size, (hi - 1) // size + 1):
        _, raw = ds.id.read_direct_chunk((k * size,))
        parts.append(np.frombuffer(raw[:len(raw) - tail] if tail else raw, np.uint8))
    buf = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    start = lo - (lo // size) * size
    return buf[start:start + hi - lo]
