"""WebDataset input, shard by shard: which shards a source names, and each shard's tar members
grouped into samples exactly as ``webdataset`` groups them, damage reported per shard and member."""
from __future__ import annotations

import gzip
import os
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packer.core import remote
from packer.core.deps import optional_import
from packer.core.errors import DependencyError, UsageError
from packer.core.uri import redact
from packer.interchange.base import pin_of
from packer.labels.limits import MAX_PER_IMAGE_BYTES

#: Image fields, in the order the first one present is taken.
IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")
#: webdataset's tar_file_iterator default ``skip_meta`` (a leading ``__name__/`` or ``__name__``).
SKIP_META = re.compile(r"__[^/]*__($|/)")
_BLOCK = tarfile.BLOCKSIZE
#: Most bytes after the end-of-archive blocks checked to be zero padding (tar records are 10 KiB).
_MAX_TRAILER = 64 << 10
#: Shard file names: plain tars, and gzip-compressed ones (read sequentially, as webdataset does).
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
#: Most bytes one image member of a gzip shard may hold: with no byte range to read later, its
#: bytes are read as the shard is inflated and held until the build takes them.
MAX_GZIP_MEMBER = 256 << 20
_GZIP_MAGIC = b"\x1f\x8b"
#: Tars compressed with what webdataset does not read either: named, not read.
_OTHER_TAR = re.compile(r"(?i)\.(tar\.(zst|zstd|bz2|xz|lz4|lzma)|tbz2?|txz)$")


def is_shard_name(name: str) -> bool:
    """True for a ``.tar``, ``.tar.gz`` or ``.tgz`` file name (any case)."""
    return name.lower().endswith(SHARD_SUFFIXES)


def shard_stem(name: str) -> str:
    """``name`` without its shard suffix (``data-000000.tar.gz`` -> ``data-000000``)."""
    low = name.lower()
    return next((name[:-len(x)] for x in SHARD_SUFFIXES[::-1] if low.endswith(x)), name)


def base_plus_ext(path: str):
    """``(key, field)`` of a member name as webdataset splits it, or ``(None, None)``."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def _braceexpand(pattern: str) -> list:
    braceexpand = optional_import("braceexpand", "expanding a brace pattern of shards", "interchange")
    try:
        return list(braceexpand.braceexpand(pattern))
    except braceexpand.UnbalancedBracesError as exc:
        raise UsageError(f"{pattern}: unbalanced braces in the shard pattern") from exc


# ---------------------------------------------------------------------------------------------
# Input: which shards


@dataclass
class Input:
    """The shards a source names, in order, and those its brace pattern names but are missing."""

    root: str                 # the input as given
    folder: object            # where a class-name file is looked for (a Path, or a URL ending in /)
    shards: list              # shard paths (or URLs), in order
    missing: list = field(default_factory=list)
    skipped: list = field(default_factory=list)   # tars of a folder compressed in a way not read
    objects: dict = field(default_factory=dict)   # URL -> remote.ObjectInfo, as listed (bucket inputs)
    listed: Optional[set] = None   # URLs of every object listed beside the shards (bucket inputs)


def _is_tar_head(block: bytes) -> bool:
    if len(block) < _BLOCK or block[:_BLOCK] == bytes(_BLOCK):
        return False
    try:
        tarfile.TarInfo.frombuf(block[:_BLOCK], "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _head(path, storage_options=None, info=None) -> bytes:
    """The first tar block of ``path`` (inflated where it is gzip); ``b""`` when unreadable."""
    try:
        with remote.open_input(path, storage_options, info=info, chunk=64 << 10) as fh:
            head = fh.read(_BLOCK)
            if head[:2] == _GZIP_MAGIC:
                fh.seek(0)
                with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                    head = gz.read(_BLOCK)
        return head
    except (OSError, EOFError, zlib.error, remote.RemoteError):
        return b""


def _children(folder: str, storage_options) -> dict:
    """The objects right under the prefix ``folder`` (not in its sub-"folders"), URL -> ObjectInfo."""
    base = folder.rstrip("/") + "/"
    return {o.url: o for o in remote.list_objects(base, storage_options) if "/" not in o.url[len(base):]}


def _expand_url(text: str, storage_options) -> Input:
    """:func:`expand` for a dataset in a bucket: one listing per folder the shards lie in (a
    brace pattern's names are looked up in it, one request per 1,000 objects, not one each)."""
    if "{" in text:
        names = _braceexpand(text)
        listed: dict = {}
        for folder in dict.fromkeys(remote.parent(n) for n in names):
            listed.update(_children(folder, storage_options))
        return Input(text, remote.parent(names[0]) if names else text, [n for n in names if n in listed],
                     [n for n in names if n not in listed], objects={n: listed[n] for n in names if n in listed},
                     listed=set(listed))
    if not text.endswith("/") and (is_shard_name(text) or _OTHER_TAR.search(text)):
        try:
            info = remote.stat(text, storage_options)
        except remote.RemoteError as exc:
            if exc.transient:
                raise
            raise UsageError(f"{redact(text)}: no such object (a WebDataset source in a bucket is a .tar "
                             f"shard, a prefix of them or a brace pattern)") from exc
        return Input(text, remote.parent(text), [text], objects={text: info})
    objects = _children(text, storage_options)
    if not objects:
        raise UsageError(f"{redact(text)}: no object under this prefix")
    urls = sorted(objects)
    return Input(text, text.rstrip("/") + "/", [u for u in urls if is_shard_name(u)],
                 skipped=[remote.basename(u) for u in urls if _OTHER_TAR.search(u)],
                 objects={u: objects[u] for u in urls if is_shard_name(u)}, listed=set(urls))


def expand(path, storage_options: Optional[dict] = None) -> Input:
    """The shards ``path`` names (see the module docstring); ``path`` may be a URL (a shard, a
    prefix of shards or a brace pattern in a bucket; ``storage_options``: fsspec's)."""
    text = os.fspath(path)
    if remote.is_url(text):
        return _expand_url(text, storage_options)
    if os.path.isdir(text):
        files = sorted(p for p in Path(text).iterdir() if p.is_file())
        return Input(text, Path(text), [str(p) for p in files if is_shard_name(p.name)],
                     skipped=[p.name for p in files if _OTHER_TAR.search(p.name)])
    if os.path.isfile(text):
        return Input(text, Path(text).parent, [text])
    if "{" in text:
        names = _braceexpand(text)
        present = [n for n in names if os.path.isfile(n)]
        return Input(text, Path(names[0]).parent if names else Path("."), present,
                     [n for n in names if not os.path.isfile(n)])
    raise UsageError(f"{text}: no such file or folder (a WebDataset source is a .tar shard, a folder "
                     f"of them or a brace pattern such as data-{{000000..000009}}.tar)")


def detect(path, storage_options: Optional[dict] = None) -> bool:
    """True when ``path`` is a tar shard (plain or gzip), a folder holding tar shards, or a brace
    pattern whose first existing shard is a tar (locally or in a bucket). Reads one header block;
    never raises (but for a bucket that cannot be reached: RemoteError)."""
    text = os.fspath(path)
    try:
        if remote.is_url(text):
            src = expand(text, storage_options)
            return bool(src.shards) and _is_tar_head(_head(src.shards[0], storage_options,
                                                            src.objects.get(src.shards[0])))
        if os.path.isfile(text):
            return _is_tar_head(_head(text))
        if os.path.isdir(text):
            tars = sorted(p for p in Path(text).iterdir() if is_shard_name(p.name) and p.is_file())
            return bool(tars) and _is_tar_head(_head(tars[0]))
        if "{" in text:
            names = [n for n in _braceexpand(text) if os.path.isfile(n)]
            return bool(names) and _is_tar_head(_head(names[0]))
    except (OSError, UsageError, DependencyError):
        return False
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        return False
    return False


# ---------------------------------------------------------------------------------------------
# One shard's members -> samples


@dataclass
class Sample:
    """One sample as grouped from a shard's members."""

    key: str                                          # webdataset's __key__
    fields: dict = field(default_factory=dict)        # field -> (member name, offset, size)
    texts: dict = field(default_factory=dict)         # field -> bytes (TEXT_FIELDS only)
    blobs: dict = field(default_factory=dict)         # field -> image bytes (gzip shards only)
    bad: Optional[str] = None                         # why the sample is unusable


@dataclass
class ShardScan:
    """One shard's samples and problems."""

    path: str
    display: str
    samples: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    pin: tuple = ()         # what a range locator of a shard in a bucket carries (base.pin_of)

    def problem(self, member: Optional[str], reason: str) -> None:
        where = f"{self.display}:{member}" if member else self.display
        self.problems.append({"path": where, "reason": reason})


class _Grouper:
    """webdataset's group_by_keys over (name, offset, size) members of one shard."""

    def __init__(self, out: ShardScan, wanted: tuple, blobs: tuple = ()):
        self.out, self.wanted, self.blobs, self.current = out, wanted, blobs, None

    def add(self, name: str, offset: int, size: int, read) -> None:
        key, suffix = base_plus_ext(name)
        if key is None:
            return
        suffix = suffix.lower()
        if self.current is None or key != self.current.key:
            self.flush()
            self.current = Sample(key)
        cur = self.current
        if suffix in cur.fields:
            cur.bad = cur.bad or f"a second {suffix!r} member in sample {key!r} (webdataset refuses duplicate fields)"
            return
        cur.fields[suffix] = (name, offset, size)
        if suffix in self.wanted and cur.bad is None:
            if size > MAX_PER_IMAGE_BYTES:
                cur.bad = f"{name}: {size} bytes is more than a label member may hold ({MAX_PER_IMAGE_BYTES})"
            else:
                cur.texts[suffix] = read()
        elif suffix in self.blobs and cur.bad is None:
            if size > MAX_GZIP_MEMBER:
                cur.bad = (f"{name}: {size} bytes is more than an image member of a gzip shard may hold "
                           f"({MAX_GZIP_MEMBER}; gunzip the shard to read it by range)")
            else:
                cur.blobs[suffix] = read()

    def flush(self) -> None:
        if self.current is not None:
            self.out.samples.append(self.current)
        self.current = None

    def drop_current(self, member: str, reason: str) -> None:
        """The damage falls in the current sample: report it, do not keep it."""
        if self.current is not None:
            self.out.problem(member, f"{reason}; sample {self.current.key!r} is left out")
            self.current = None
        else:
            self.out.problem(member, reason)


def _read_at(fh, pos: int, n: int) -> bytes:
    """``n`` bytes at ``pos`` (before tarfile reads ``fh`` or after it is done with it)."""
    fh.seek(pos)
    return fh.read(n)


def _member_name_of(block: bytes) -> str:
    return block[:100].split(b"\0", 1)[0].decode("utf-8", "replace")


def _corrupt(out: ShardScan, grouper: _Grouper, block: bytes, pos: int, after: str, last) -> None:
    name = _member_name_of(block)
    reason = f"corrupt tar header at byte {pos}{after} (name field {name!r}); the rest of the shard is not scanned"
    if not name or (grouper.current is not None and base_plus_ext(name)[0] == grouper.current.key):
        grouper.drop_current(last, reason)   # the header may be one of the current sample's members
    else:
        grouper.flush()
        out.problem(last, reason)


def _check_end(fh, out: ShardScan, grouper: _Grouper, pos: int, size: int, last: Optional[str]) -> bool:
    """Where tarfile stopped reading (it stops silently at a cut or corrupt header): the
    end-of-archive blocks, or damage, reported. True when damage was reported."""
    after = f" after member {last!r}" if last else " before the first member"
    if pos >= size:
        grouper.drop_current(last, f"the tar ends at byte {size}{after} without its end-of-archive "
                                   f"blocks: it was cut short")
        return True
    block = _read_at(fh, pos, _BLOCK)
    if len(block) < _BLOCK:
        grouper.drop_current(last, f"the tar ends inside the header at byte {pos}{after}: it was cut short")
        return True
    if block == bytes(_BLOCK):
        grouper.flush()
        rest = size - pos
        if rest > _MAX_TRAILER or _read_at(fh, pos, rest).strip(b"\0"):
            out.problem(None, f"data after the end-of-archive blocks at byte {pos} (concatenated tars? "
                              f"webdataset reads only the first); the members after it are not scanned")
            return True
        return False
    if not _is_tar_head(block):
        _corrupt(out, grouper, block, pos, after, last)
        return True
    # a sound header (PAX / GNU long-name) whose data or following header is cut or damaged
    info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    nxt = pos + _BLOCK + -(-info.size // _BLOCK) * _BLOCK
    if nxt + _BLOCK > size:
        grouper.drop_current(last, f"the tar ends inside the member header at byte {pos}{after}: it was cut short")
    else:
        _corrupt(out, grouper, _read_at(fh, nxt, _BLOCK), nxt, after, last)
    return True


def scan_shard(path: str, display: str, wanted: tuple, images: tuple = IMAGE_FIELDS,
               storage_options: Optional[dict] = None, info=None) -> ShardScan:
    """The samples of one shard (reading only the ``wanted`` text fields, and of a gzip shard the
    ``images`` fields too), damage in its problems. A shard in a bucket (``path`` a URL, ``info``
    its listed ObjectInfo) is streamed once through a read-ahead buffer
    (:class:`packer.core.remote.RemoteFile`, ``ceil(size / READ_AHEAD)`` GETs pinned to its
    version); a read that fails for good (the shard replaced or deleted meanwhile) is the shard's
    problem, one the retry budget did not overcome (the server gone) stops the scan."""
    out = ShardScan(path, display)
    try:
        fh = remote.open_input(path, storage_options, info=info)
    except OSError as exc:
        out.problem(None, f"cannot read: {exc.strerror or exc}")
        return out
    except remote.RemoteError as exc:
        out.problem(None, f"cannot read: {exc}")
        return out
    out.pin = pin_of(fh)
    try:
        _scan_file(fh, out, wanted, images)
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        out.problem(None, f"cannot read: {exc}; the rest of the shard is not scanned")
    return out


def _scan_file(fh, out: ShardScan, wanted: tuple, images: tuple) -> None:
    with fh:
        size = remote.file_size(fh)
        if _read_at(fh, 0, 2) == _GZIP_MAGIC:
            fh.seek(0)
            _walk_gz(fh, out, wanted, images)
            return
        if size == 0 or not _is_tar_head(_read_at(fh, 0, _BLOCK)):
            out.problem(None, "not a tar file (no valid tar header at byte 0)")
            return
        fh.seek(0)
        _walk(fh, out, size, wanted)


def _walk(fh, out: ShardScan, size: int, wanted: tuple) -> None:
    grouper = _Grouper(out, wanted)
    last, stream = None, None
    try:
        stream = tarfile.open(fileobj=fh, mode="r|")
        for info in stream:
            stream.members = []   # streaming: keep no TarInfo per member
            if not info.isreg():
                continue
            name = info.name
            if info.offset_data + info.size > size:
                if grouper.current is not None and base_plus_ext(name)[0] != grouper.current.key:
                    grouper.flush()   # the cut member starts a new sample: the one before is whole
                grouper.drop_current(name, f"the tar ends inside this member ({info.size} bytes from byte "
                                           f"{info.offset_data}, the shard has {size}): it was cut short")
                return
            last = name
            if ("/" not in name and name.startswith("__") and name.endswith("__")) or SKIP_META.match(name):
                continue   # webdataset's metadata entries
            grouper.add(name, info.offset_data, info.size, lambda: stream.extractfile(info).read())
    except (tarfile.TarError, EOFError) as exc:   # a damaged header after a PAX header, a cut label
        if not _check_end(fh, out, grouper, stream.offset if stream is not None else 0, size, last):
            grouper.drop_current(last, f"unreadable tar data after member {last!r}: {exc}")
        return
    except OSError as exc:
        grouper.drop_current(last, f"read error after member {last!r}: {exc.strerror or exc}")
        return
    _check_end(fh, out, grouper, stream.offset, size, last)
    grouper.flush()


def _walk_gz(fh, out: ShardScan, wanted: tuple, images: tuple) -> None:
    """A gzip shard, read in one pass as webdataset reads it: image members' bytes are kept
    (each at most :data:`MAX_GZIP_MEMBER`); damage ends the shard, the samples before it kept."""
    grouper = _Grouper(out, wanted, images)
    last = None
    try:
        with tarfile.open(fileobj=fh, mode="r|gz") as stream:
            for info in stream:
                stream.members = []   # streaming: keep no TarInfo per member
                if not info.isreg():
                    continue
                name = info.name
                if ("/" not in name and name.startswith("__") and name.endswith("__")) or SKIP_META.match(name):
                    last = name
                    continue
                grouper.add(name, 0, info.size, lambda: stream.extractfile(info).read())
                last = name
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        after = f"after member {last!r}" if last else "before the first member"
        grouper.drop_current(last, f"damaged or cut gzip tar {after}: {exc}; the rest of the shard is not read")
        return
    grouper.flush()
