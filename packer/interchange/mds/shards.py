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

from packer.core import remote
from packer.core.errors import DependencyError
from packer.interchange.base import pin_of
from packer.interchange.mds.index import Shard

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


def hash_mismatch(path: str, hashes: dict, data: Optional[bytes] = None, *, storage_options=None,
                  info=None) -> Optional[str]:
    """Why the file's hash differs from the index's, or None (equal, or no hash computable here).
    A shard in a bucket (``info`` its ObjectInfo) is streamed once, pinned to that version."""
    order = [a for a in _HASH_ORDER if a in hashes] + sorted(a for a in hashes if a not in _HASH_ORDER)
    for algo in order:
        h = _hasher(algo)
        if h is None:
            continue
        if data is not None:
            h.update(data)
        else:
            with remote.open_input(path, storage_options, info=info) as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        got, want = h.hexdigest(), str(hashes[algo]).lower()
        return None if got == want else f"its {algo} {got} does not match index.json's {want}"
    if hashes:
        log.warning("%s: none of the hashes %s can be computed here; not checked", path, sorted(hashes))
    return None


#: Most bytes one zstd block can give (Block_Maximum_Size, RFC 8878 3.1.1.2.3).
_ZSTD_BLOCK_MAX = 128 << 10
_ZSTD_MAGIC, _ZSTD_SKIPPABLE = 0xFD2FB528, 0x184D2A50


def _zstd_frame(data: bytes, pos: int) -> tuple:
    """``(end, content size or None, most bytes its blocks can give)`` of the zstd frame at
    ``pos`` (RFC 8878), read from its headers alone. Raises ValueError for a malformed frame."""
    magic = int.from_bytes(data[pos:pos + 4], "little")
    if magic & 0xFFFFFFF0 == _ZSTD_SKIPPABLE:
        return pos + 8 + int.from_bytes(data[pos + 4:pos + 8], "little"), 0, 0
    if magic != _ZSTD_MAGIC or pos + 5 > len(data):
        raise ValueError(f"no zstd frame at byte {pos}")
    fhd = data[pos + 4]
    single, fcs_flag = (fhd >> 5) & 1, fhd >> 6
    fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
    at = pos + 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    content = None
    if fcs_len:
        content = int.from_bytes(data[at:at + fcs_len], "little") + (256 if fcs_len == 2 else 0)
    at += fcs_len
    bound, last = 0, False
    while not last:
        if at + 3 > len(data):
            raise ValueError(f"a zstd frame cut short at byte {at}")
        head = int.from_bytes(data[at:at + 3], "little")
        last, kind, size = head & 1, (head >> 1) & 3, head >> 3
        if kind == 3:
            raise ValueError(f"a reserved zstd block type at byte {at}")
        bound += _ZSTD_BLOCK_MAX if kind == 2 else size
        at += 3 + (1 if kind == 1 else size)
    return at + (4 if fhd & 4 else 0), content, bound


def _zstd_declared(data: bytes) -> tuple:
    """``(exact, size)``: the bytes ``data``'s zstd frames say they hold (``exact``: every frame
    gives its content size), else the most their blocks can give."""
    pos, total, exact = 0, 0, True
    while pos < len(data):
        pos, content, bound = _zstd_frame(data, pos)
        exact = exact and content is not None
        total += content if content is not None else bound
    return exact, total


def _snappy_declared(data: bytes) -> int:
    """The uncompressed length a raw snappy block gives in its leading varint."""
    value = 0
    for i, byte in enumerate(data[:10]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    raise ValueError("no snappy length header")


def check_declared(compression: str, data: bytes, size: int) -> None:
    """Refuse zstd / snappy data whose own headers say it holds another size than ``size`` (the
    raw bytes index.json gives) before anything is inflated: those codecs decompress a whole
    buffer at once, sized by the data.

    Raises:
        ValueError: declared vs found: the frames' content sizes (or, for zstd frames without
            one, the most their blocks can give, beyond ``size`` + one block), or the snappy length.
    """
    family = compression.split(":")[0]
    if family == "zstd":
        try:
            exact, found = _zstd_declared(data)
        except ValueError as exc:        # not zstd at all, or frames cut short
            raise ValueError(f"does not decompress as zstd: {exc}") from exc
        if (exact and found != size) or (not exact and found > size + _ZSTD_BLOCK_MAX):
            says = "say they hold" if exact else "can give up to"
            raise ValueError(f"its zstd frames {says} {found} bytes, index.json says {size}")
    elif family == "snappy":
        try:
            found = _snappy_declared(data)
        except ValueError as exc:
            raise ValueError(f"does not decompress as snappy: {exc}") from exc
        if found != size:
            raise ValueError(f"its snappy header says it holds {found} bytes, index.json says {size}")


def decompress(compression: str, data: bytes, size: int) -> bytes:
    """``data`` decompressed with streaming's codec ``compression`` (``zstd:7`` -> zstd), at most
    ``size + 1`` bytes: gz, bz2 and br stop there; zstd and snappy data is first checked to
    declare ``size`` bytes (:func:`check_declared`), so they are never asked for more.

    Raises:
        ValueError: the data does not decompress, or declares another size; DependencyError:
            the codec library is missing.
    """
    family = compression.split(":")[0]
    errors = (OSError, EOFError, MemoryError, zlib.error)
    try:
        if family in ("zstd", "snappy"):
            check_declared(compression, data, size)
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
        raise ValueError(f"does not decompress as {family}: {exc or type(exc).__name__}") from exc
    return bytes(out)


def _codec(module: str, package: str):
    try:
        return __import__(module)
    except ImportError as exc:
        raise DependencyError(f"reading {module}-compressed MDS shards needs the {package} package: "
                              f"pip install {package} (or: pip install 'packer-vision[mds]')") from exc


class FileShard:
    """An uncompressed shard file: reads by offset; images become byte ranges (of an object in a
    bucket: pinned to the version read, ``info``)."""

    def __init__(self, path: str, size: int, storage_options=None, info=None):
        self.path, self.size = path, size
        self.fh = (remote.open_input(path, storage_options, info=info) if remote.is_url(path)
                   else open(path, "rb", buffering=1 << 16))
        self.pin = pin_of(self.fh)

    def read(self, offset: int, size: int) -> bytes:
        self.fh.seek(offset)
        data = self.fh.read(size)
        if len(data) != size:
            raise ValueError(f"cut short: {size} bytes expected at offset {offset}, {len(data)} found")
        return data

    def locator(self, offset: int, size: int) -> tuple:
        return ("range", self.path, offset, size) + self.pin

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


def pick_file(folder: str, shard: Shard, shown, objects: Optional[dict] = None) -> Optional[ShardFile]:
    """The raw file where it lies there (StreamingDataset's cache), else the compressed one.
    ``objects``: for a prefix in a bucket, its listing (URL -> ObjectInfo)."""
    if objects is not None:
        raw, zipped = (remote.join(folder, shard.raw["basename"]),
                       remote.join(folder, shard.zip["basename"]) if shard.zip else None)
        if raw in objects and (not shard.zip or objects[raw].size == shard.raw["bytes"]):
            return ShardFile(raw, shown(raw), False, shard.raw["bytes"], shard.raw["hashes"])
        if zipped in objects:
            return ShardFile(zipped, shown(zipped), True, shard.zip["bytes"], shard.zip["hashes"])
        return None
    raw = os.path.join(folder, shard.raw["basename"])
    if os.path.isfile(raw) and (not shard.zip or os.path.getsize(raw) == shard.raw["bytes"]):
        return ShardFile(raw, shown(raw), False, shard.raw["bytes"], shard.raw["hashes"])
    if shard.zip:
        path = os.path.join(folder, shard.zip["basename"])
        if os.path.isfile(path):
            return ShardFile(path, shown(path), True, shard.zip["bytes"], shard.zip["hashes"])
    return None
