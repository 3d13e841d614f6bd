"""MDS shard files: which file of a shard is read (the raw one or the compressed one), its hash
against ``index.json``, decompression, and reading samples by offset."""
from __future__ import annotations

import bz2
import hashlib
import logging
import os
import zlib
from dataclasses import dataclass
from typing import Optional

from packer.core.errors import DependencyError
from packer.interchange.mds.index import INSTALL, Shard

log = logging.getLogger(__name__)


#: Hashes tried first (fast); any other hashlib/xxhash name streaming allows works too.
_HASH_ORDER = ("xxh3_64", "xxh3_128", "xxh128", "xxh64", "xxh32", "md5", "sha1")


def _hasher(algo: str):
    if algo.startswith("shake_"):
        return None
    if hasattr(hashlib, algo):
        return getattr(hashlib, algo)()
    try:
        import xxhash
    except ImportError:
        return None
    return getattr(xxhash, algo)() if algo in xxhash.algorithms_available else None


def hash_mismatch(path: str, hashes: dict, data: Optional[bytes] = None) -> Optional[str]:
    """Why the file's hash differs from the index's, or None (equal, or no hash computable here)."""
    order = [a for a in _HASH_ORDER if a in hashes] + sorted(a for a in hashes if a not in _HASH_ORDER)
    for algo in order:
        h = _hasher(algo)
        if h is None:
            continue
        if data is not None:
            h.update(data)
        else:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        got, want = h.hexdigest(), str(hashes[algo]).lower()
        return None if got == want else f"its {algo} {got} does not match index.json's {want}"
    if hashes:
        log.warning("%s: none of the hashes %s can be computed here; not checked", path, sorted(hashes))
    return None


def decompress(compression: str, data: bytes, size: int) -> bytes:
    """``data`` decompressed with streaming's codec ``compression`` (``zstd:7`` -> zstd), at most
    ``size + 1`` bytes where the codec can stop early.

    Raises:
        ValueError: the data does not decompress; DependencyError: the codec library is missing.
    """
    family = compression.split(":")[0]
    errors = (OSError, EOFError, MemoryError, zlib.error)
    try:
        if family == "gz":
            out = zlib.decompressobj(wbits=31).decompress(data, size + 1)
        elif family == "bz2":
            out = bz2.BZ2Decompressor().decompress(data, size + 1)
        elif family == "zstd":
            zstd = _codec("zstd", "zstd")
            errors += (zstd.Error,)
            out = zstd.decompress(data)
        elif family == "br":
            brotli = _codec("brotli", "Brotli")
            errors += (brotli.error,)
            out = brotli.Decompressor().process(data, output_buffer_limit=size + 1)
        elif family == "snappy":
            snappy = _codec("snappy", "python-snappy")
            errors += (snappy.UncompressError,)
            out = snappy.decompress(data)
        else:
            raise ValueError(f"unknown compression {compression!r}")
    except errors as exc:
        raise ValueError(f"does not decompress as {family}: {exc}") from exc
    return bytes(out)


def _codec(module: str, package: str):
    try:
        return __import__(module)
    except ImportError as exc:
        raise DependencyError(f"reading {module}-compressed MDS shards needs the {package} package: "
                              f"{INSTALL}") from exc


class FileShard:
    """An uncompressed shard file: reads by offset; images become byte ranges."""

    def __init__(self, path: str, size: int):
        self.path, self.size = path, size
        self.fh = open(path, "rb", buffering=1 << 16)

    def read(self, offset: int, size: int) -> bytes:
        self.fh.seek(offset)
        data = self.fh.read(size)
        if len(data) != size:
            raise ValueError(f"cut short: {size} bytes expected at offset {offset}, {len(data)} found")
        return data

    def locator(self, offset: int, size: int) -> tuple:
        return ("range", self.path, offset, size)

    def close(self) -> None:
        self.fh.close()


class MemoryShard:
    """A decompressed shard in memory: images carry their bytes."""

    def __init__(self, data: bytes):
        self.view, self.size = memoryview(data), len(data)

    def read(self, offset: int, size: int) -> bytes:
        if offset + size > self.size:
            raise ValueError(f"cut short: {size} bytes expected at offset {offset}, {self.size - offset} found")
        return bytes(self.view[offset:offset + size])

    def locator(self, offset: int, size: int) -> tuple:
        return ("bytes", self.read(offset, size))

    def close(self) -> None:
        self.view.release()


@dataclass
class ShardFile:
    """Which file of a shard is read, and how."""

    path: str
    display: str
    compressed: bool
    expected: int        # bytes index.json gives that file
    hashes: dict


def pick_file(folder: str, shard: Shard, shown) -> Optional[ShardFile]:
    """The raw file where it lies there (StreamingDataset's cache), else the compressed one."""
    raw = os.path.join(folder, shard.raw["basename"])
    if os.path.isfile(raw) and (not shard.zip or os.path.getsize(raw) == shard.raw["bytes"]):
        return ShardFile(raw, shown(raw), False, shard.raw["bytes"], shard.raw["hashes"])
    if shard.zip:
        path = os.path.join(folder, shard.zip["basename"])
        if os.path.isfile(path):
            return ShardFile(path, shown(path), True, shard.zip["bytes"], shard.zip["hashes"])
    return None
