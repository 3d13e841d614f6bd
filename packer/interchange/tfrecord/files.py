"""TFRecord files: which files a source names (a file, a folder, a glob or brace pattern), the
libraries a scan needs (CRC32C, ``tfrecord.example_pb2``), and each file's record framing checked."""
from __future__ import annotations

import glob
import gzip
import importlib
import importlib.util
import logging
import os
import re
import struct
import sys
import zlib
from typing import Iterator

from packer.core import remote
from packer.core.errors import DependencyError, UsageError
from packer.core.uri import redact

log = logging.getLogger(__name__)


#: File names taken from a folder: TFRecord suffixes, TFDS/TF-slim shard names, optional ``.gz``.
_NAME_RE = re.compile(r"(?i)(\.(tfrecords?|tfrec|records?)(-\d+-of-\d+)?|-\d+-of-\d+)(\.gz|\.gzip)?$")
SUFFIX_RE = re.compile(r"(?i)\.(tfrecords?|tfrec|records?)(?=(-\d+-of-\d+)?$)")
_GZIP_MAGIC = b"\x1f\x8b"
_MASK_DELTA = 0xA282EAD8
#: Protocol buffers cap a message at 2 GiB; a larger length is damage, not a record.
_MAX_RECORD = 2 ** 31 - 1
#: Most bytes a record of a gzip TFRecord may declare: with no file size to check a length
#: against, a record is read as it is inflated, and its bytes are held until the build takes them.
MAX_GZIP_RECORD = 256 << 20
_CHUNK = 16 << 20
_MAX_EXPANSION = 1_000_000


INSTALL = "pip install 'packer-vision[interchange]' (or: pip install tfrecord crc32c protobuf)"


# --- libraries ---------------------------------------------------------------------------------

def _crc_function():
    """crc32c(bytes) -> int from the ``crc32c`` package, else ``google-crc32c``; None without both."""
    try:
        import crc32c
        return crc32c.crc32c
    except ImportError:
        pass
    try:
        import google_crc32c
        return google_crc32c.value
    except ImportError:
        return None


def require_crc():
    """The CRC32C function; DependencyError saying what to install when there is none."""
    fn = _crc_function()
    if fn is None:
        raise DependencyError(f"reading TFRecord files needs a CRC32C library: {INSTALL}")
    return fn


def _example_pb2():
    """``tfrecord.example_pb2``, loaded on its own where the package is not imported yet: the
    package's ``__init__`` imports ``tfrecord.torch``, hence torch (about 0.5 GB and seconds),
    which a scan does not need. Registered under its own name, so a later ``import tfrecord``
    uses this module (and its message classes) instead of loading the file again."""
    name = "tfrecord.example_pb2"
    if name in sys.modules or "tfrecord" in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.find_spec("tfrecord")
    where = [os.path.join(d, "example_pb2.py") for d in (spec.submodule_search_locations or [])] if spec else []
    where = [w for w in where if os.path.isfile(w)]
    if not where:
        return importlib.import_module(name)   # not installed (ImportError), or laid out otherwise
    module_spec = importlib.util.spec_from_file_location(name, where[0])
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def example_class():
    """``(tf.train.Example message class, protobuf DecodeError)``; DependencyError when missing."""
    try:
        from google.protobuf.message import DecodeError
        example_pb2 = _example_pb2()
    except ImportError as exc:
        raise DependencyError(f"TFRecord support needs the tfrecord package: {INSTALL}") from exc
    return example_pb2.Example, DecodeError


def _masked(crc_fn, data) -> int:
    crc = crc_fn(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# --- inputs ------------------------------------------------------------------------------------

def expand_braces(pattern: str) -> list:
    """``a-{0..2}.x`` -> ``[a-0.x, a-1.x, a-2.x]``; ``{a,b}`` alternatives; zero padding kept.

    Raises:
        UsageError: the pattern expands to more than a million names.
    """
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, body, tail = pattern[:m.start()], m.group(1), pattern[m.end():]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        if abs(hi - lo) >= _MAX_EXPANSION:
            raise UsageError(f"{pattern}: the range {{{body}}} names more than {_MAX_EXPANSION} files")
        width = len(rng.group(1)) if rng.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        options = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    elif "," in body:
        options = body.split(",")
    else:   # a literal brace, as the shell leaves it
        return [head + "{" + body + "}" + t for t in expand_braces(tail)]
    out = []
    for opt in options:
        out.extend(expand_braces(head + opt + tail))
        if len(out) > _MAX_EXPANSION:
            raise UsageError(f"{pattern}: expands to more than {_MAX_EXPANSION} names")
    return out


def is_pattern(text: str) -> bool:
    return "{" in text or any(c in text for c in "*?[")


def _list_urls(text: str, storage_options) -> list:
    """:func:`list_files` in a bucket: an object, a prefix's TFRecord-named objects right under it,
    or a pattern's matches among the objects of its folders (one listing per folder)."""
    import fnmatch

    if not is_pattern(text) and not text.endswith("/") and remote.exists(text, storage_options):
        return [text]
    pats = expand_braces(text) if is_pattern(text) else None
    found, listed = set(), {}
    for folder in ([text] if pats is None else dict.fromkeys(remote.parent(p) for p in pats)):
        base = folder.rstrip("/") + "/"
        listed[base] = [o.url for o in remote.list_objects(base, storage_options) if "/" not in o.url[len(base):]]
    if pats is None:
        found.update(u for u in listed[text.rstrip("/") + "/"] if _NAME_RE.search(remote.basename(u)))
    else:
        for pat in pats:
            found.update(u for u in listed[remote.parent(pat)] if fnmatch.fnmatchcase(u, pat))
    if not found:
        raise UsageError(f"{redact(text)}: no TFRecord object there (an object, a prefix of *.tfrecord objects, "
                         f"or a glob/brace pattern)")
    return sorted(found)


def list_files(path, storage_options=None) -> list:
    """The TFRecord files ``path`` names: itself, a folder's TFRecord-named files, or a pattern's
    matches (sorted, each once); in a bucket too (URLs; ``storage_options``: fsspec's).

    Raises:
        UsageError: nothing exists at ``path`` or the pattern matches nothing.
    """
    text = os.fspath(path)
    if remote.is_url(text):
        return _list_urls(text, storage_options)
    if os.path.isdir(text):
        try:
            names = sorted(e.name for e in os.scandir(text) if e.is_file() and _NAME_RE.search(e.name))
        except OSError as exc:
            raise UsageError(f"{text}: cannot list the folder: {exc.strerror or exc}") from exc
        return [os.path.join(text, n) for n in names]
    if os.path.isfile(text):
        return [text]
    if is_pattern(text):
        found = set()
        for pat in expand_braces(text):
            found.update(p for p in (glob.glob(pat) if any(c in pat for c in "*?[") else [pat])
                         if os.path.isfile(p))
        if found:
            return sorted(found)
    raise UsageError(f"{text}: no TFRecord file there (a file, a folder of *.tfrecord files, or a "
                     f"glob/brace pattern)")


def is_gzip(path: str, storage_options=None, info=None) -> bool:
    """True when ``path`` (a file, or an object) starts with the gzip magic bytes."""
    with remote.open_input(path, storage_options, info=info, chunk=2) as fh:
        return fh.read(2) == _GZIP_MAGIC


def _head(path: str) -> bytes:
    with remote.open_input(path, chunk=64 << 10) as raw:
        if raw.read(2) != _GZIP_MAGIC:
            raw.seek(0)
            return raw.read(12)
        raw.seek(0)
        with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
            return fh.read(12)


def detect(path) -> bool:
    """True when ``path`` names TFRecord data: its first file's first length has a valid masked
    CRC32C (an empty file counts when its name is a TFRecord name). Reads at most 12 bytes of one
    file; never raises."""
    try:
        text = os.fspath(path)
        if not (os.path.exists(text) or is_pattern(text) or remote.is_url(text)):
            return False
        files = list_files(text)
        if not files:
            return False
        head = _head(files[0])
    except (UsageError, OSError, EOFError, zlib.error, TypeError, ValueError):
        return False
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        return False
    if not head:
        return bool(_NAME_RE.search(os.path.basename(files[0])))
    crc_fn = _crc_function()
    if len(head) < 12:
        return False
    if crc_fn is None:   # no CRC library: go by the name (scan will say what to install)
        return bool(_NAME_RE.search(os.path.basename(files[0])))
    return _masked(crc_fn, head[:8]) == struct.unpack("<I", head[8:12])[0]


# --- framing -----------------------------------------------------------------------------------

class Problems(list):
    """The scan's problems: ``{path, reason, kind}`` dicts, each also logged as a warning."""

    def add(self, where: str, reason: str, kind: str = "damaged") -> None:
        log.warning("%s: %s", where, reason, extra={"packer_damaged_input": True})
        self.append({"path": where, "reason": reason, "kind": kind})


def _read_upto(fh, n: int) -> bytes:
    """At most ``n`` bytes of ``fh``, read in chunks: a length a stream does not hold allocates
    only what the stream gives."""
    parts, left = [], n
    while left:
        chunk = fh.read(min(left, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def iter_records(path: str, shown: str, crc_fn, problems: Problems, storage_options=None,
                 info=None) -> Iterator[tuple]:
    """``(record no, data offset, data)`` for each record of ``path`` whose framing and CRCs check
    (offsets are into the uncompressed stream); damage goes into ``problems`` (see module doc).
    An object in a bucket (``path`` a URL, ``info`` its ObjectInfo) is streamed once through
    :class:`packer.core.remote.RemoteFile`; one that changes meanwhile is the file's problem."""
    try:
        raw = remote.open_input(path, storage_options, info=info) if remote.is_url(path) else \
            open(path, "rb", buffering=1 << 20)
        gz = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        size = None if gz else remote.file_size(raw)
        fh = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    except OSError as exc:
        problems.add(shown, f"cannot read the file: {exc.strerror or exc}", "unreadable")
        return
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        problems.add(shown, f"cannot read the file: {exc}", "unreadable")
        return
    try:
        yield from _records(fh, raw, gz, size, shown, crc_fn, problems)
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        problems.add(shown, f"cannot read the file: {exc}; the rest of {shown} is not read", "unreadable")


def _records(fh, raw, gz: bool, size, shown: str, crc_fn, problems: Problems) -> Iterator[tuple]:
    recno = pos = 0
    with raw, fh:
        while True:
            where = f"{shown}:record {recno}"
            try:
                head = fh.read(12)
                if not head:
                    return
                lost = f"the rest of {shown} (from byte {pos}{' of the gzip stream' if gz else ''}) cannot be read"
                if len(head) < 12:
                    problems.add(where, f"cut short: {len(head)} of the 12 header bytes; {lost}")
                    return
                length, length_crc = struct.unpack("<QI", head)
                if _masked(crc_fn, head[:8]) != length_crc:
                    problems.add(where, f"length CRC mismatch (damaged framing); {lost}")
                    return
                if length > _MAX_RECORD:
                    problems.add(where, f"the record declares {length} bytes, more than a protobuf message "
                                        f"holds; {lost}")
                    return
                if size is not None and pos + 16 + length > size:
                    problems.add(where, f"cut short: the record declares {length} bytes + 4 CRC bytes, "
                                        f"{size - pos - 12} follow the header; {lost}")
                    return
                if gz and length > MAX_GZIP_RECORD:
                    problems.add(where, f"the record declares {length} bytes, more than a record of a gzip "
                                        f"TFRecord may hold ({MAX_GZIP_RECORD}: it is held in memory); {lost}")
                    return
                data = _read_upto(fh, length) if gz else fh.read(length)
                tail = fh.read(4)
            except (OSError, EOFError, zlib.error) as exc:
                what = "damaged gzip stream" if gz else "read error"
                problems.add(where, f"{what} ({exc}); the rest of {shown} cannot be read")
                return
            if len(data) < length or len(tail) < 4:
                problems.add(where, f"cut short: {len(data)} of {length} data bytes and {len(tail)} of 4 CRC "
                                    f"bytes; the record is lost")
                return
            if _masked(crc_fn, data) != struct.unpack("<I", tail)[0]:
                problems.add(where, "data CRC mismatch (damaged record); record skipped")
            else:
                yield recno, pos + 12, data
            pos += 16 + length
            recno += 1
