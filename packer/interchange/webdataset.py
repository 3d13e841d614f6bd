"""WebDataset tar shards as a build source and an export target.

**In** (``packer build SRC --from webdataset``): SRC is one ``.tar`` shard, a folder of shards
(its ``*.tar`` files, sorted by name) or a brace pattern (``data-{000000..000099}.tar``, expanded
with ``braceexpand``, the library webdataset itself uses). Samples are grouped exactly as
``webdataset`` groups them (``tar_file_iterator`` / ``base_plus_ext`` / ``group_by_keys``): a
member's key is its name up to the first dot of its base name (folders included), its field
the rest, lower-cased; consecutive members with the same key are one sample; members that are
not regular files, have no dot in their base name or are ``__meta__`` entries are skipped.

* image: the first of the fields ``jpg``, ``jpeg``, ``png``, ``webp`` the sample has (or the
  field ``ScanOptions.image_column`` names); the record key is the image member's name
  (``"000123.jpg"``, ``"train/000123.jpg"``);
* label, first found: a ``.json`` holding a packer label-model dict (``{"format":..,
  "objects": [...]}``, schema ``"objects"``) or boxes (``{"boxes": [[c, cx, cy, w, h], ...]}``
  or a bare list of such rows, normalized, schema ``"boxes"``); a ``.cls`` holding a class id or
  a class name; a ``.json`` ``{"class": id-or-name}`` (or ``label`` / ``class_id``); a ``.txt``
  holding an integer (any other ``.txt`` is a caption, not a label). ``ScanOptions.label_column``
  names the one field to read instead;
* class names: the dataset's class-name file when there is one (``classes.json``, a JSON list,
  else ``classes.txt``, one name per line) in the folder of the shards; otherwise the sorted
  names the ``.cls`` files hold;
* ``packer.json`` (a field packer's export writes): ``{"key": record key}`` where the sample key
  cannot carry it, ``{"metadata": {...}}`` the record's metadata.

The scan reads the tar headers with the standard library's ``tarfile`` in streaming mode and
keeps, per sample, only ``("range", shard, offset, size)`` of its image member: image bytes are
never read (label members, a few bytes each, are). Damage is reported per shard and member in
``Scan.problems`` and the scan goes on with the next shard: a member the tar ends inside, a
corrupt or cut header, a shard that ends without its end-of-archive blocks or has data after
them, a gzip-compressed or non-tar file, a duplicate field, a sample without an image or (unless
``allow_unlabeled``) without a label. Samples before the damage are kept; the sample the damage
falls in is not.

**Out** (``packer export STORE OUT --to webdataset --shard-size N``): ``OUT/<prefix>-000000.tar``,
... written by ``webdataset.ShardWriter`` (``maxcount=N``, no size cap; PAX headers where a name
needs them), one sample per record, fields in webdataset's own conventions:

* ``jpg``: the stored JPEG bytes as they are (a stored PNG/WebP keeps its own type and
  extension; decoded-pixel stores are written as lossless PNG);
* ``cls``: the class id as decimal text (class stores; an unlabeled record has none);
* ``json``: ``{"boxes": [[c, cx, cy, w, h], ...]}`` for box stores (floats written with every
  bit, so they read back as the same float32), the label-model dict for ``"objects"`` stores;
* ``packer.json``: the record key when the sample key plus the image extension does not spell
  it (``a.b.jpg``, ``x.JPEG``, keys with ``..``), and the record metadata when there is any;
* ``OUT/classes.txt``: the store's class names, one per line, line *i* = class id *i*; plus
  ``OUT/classes.json`` (a JSON list) when a name would not survive a line file (a line break,
  blank or padded name). This is the side file convention the scan reads back.

The sample key is the record key without its image extension (``part0/img_00000``). Shards are
written in ``OUT/.<prefix>.partial`` and moved into OUT when all are complete: a failed export
leaves no shard behind.

Example:
    >>> from packer.interchange import ScanOptions, ExportOptions            # doctest: +SKIP
    >>> scan = FORMAT.scan("shards/data-{000000..000009}.tar", ScanOptions())   # doctest: +SKIP
    >>> with open_store("train.lmdb") as reader:                             # doctest: +SKIP
    ...     FORMAT.export(reader, "wds_out", ExportOptions(shard_size=1000)).shards
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tarfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from ..diskspace import disk_full, is_disk_full, require_room
from ..errors import DependencyError, RecordError, UsageError
from ..export import safe_relative
from ..labels.limits import MAX_PER_IMAGE_BYTES
from ..outputs import check_output
from ..records import UNLABELED_CLASS, loads_bounded
from ..sources import parse_label_json
from .base import ExportOptions, ExportResult, Scan, ScanOptions, InterchangeFormat

log = logging.getLogger(__name__)

#: Image fields, in the order the first one present is taken.
IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")
#: Fields read during the scan (labels and packer's own record fields); all others are skipped.
TEXT_FIELDS = ("cls", "json", "txt", "packer.json")
#: Dataset-level class-name files, the first present is used (JSON list, then one name per line).
CLASS_FILES = ("classes.json", "classes.txt")
#: webdataset's tar_file_iterator default ``skip_meta`` (a leading ``__name__/`` or ``__name__``).
_SKIP_META = re.compile(r"__[^/]*__($|/)")
_BLOCK = tarfile.BLOCKSIZE
#: Most bytes after the end-of-archive blocks checked to be zero padding (tar records are 10 KiB).
_MAX_TRAILER = 64 << 10


def base_plus_ext(path: str):
    """``(key, field)`` of a member name as webdataset splits it, or ``(None, None)``."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def _webdataset():
    try:
        import webdataset
    except ImportError as exc:
        raise DependencyError("exporting WebDataset shards needs the webdataset package "
                              "(pip install 'packer-vision[interchange]' or pip install webdataset)") from exc
    return webdataset


def _braceexpand(pattern: str) -> list:
    try:
        import braceexpand
    except ImportError as exc:
        raise DependencyError(f"{pattern}: expanding a brace pattern needs the braceexpand package "
                              f"(pip install 'packer-vision[interchange]')") from exc
    try:
        return list(braceexpand.braceexpand(pattern))
    except braceexpand.UnbalancedBracesError as exc:
        raise UsageError(f"{pattern}: unbalanced braces in the shard pattern") from exc


# ---------------------------------------------------------------------------------------------
# Input: which shards


@dataclass
class _Input:
    root: str                 # the input as given
    folder: Path              # where a class-name file is looked for
    shards: list              # shard paths, in order
    missing: list = field(default_factory=list)


def _is_tar_head(block: bytes) -> bool:
    if len(block) < _BLOCK or block[:_BLOCK] == bytes(_BLOCK):
        return False
    try:
        tarfile.TarInfo.frombuf(block[:_BLOCK], "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _head(path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(_BLOCK)
    except OSError:
        return b""


def _expand(path) -> _Input:
    """The shards ``path`` names (see the module docstring)."""
    text = os.fspath(path)
    if os.path.isdir(text):
        shards = sorted(str(p) for p in Path(text).iterdir() if p.suffix.lower() == ".tar" and p.is_file())
        return _Input(text, Path(text), shards)
    if os.path.isfile(text):
        return _Input(text, Path(text).parent, [text])
    if "{" in text:
        names = _braceexpand(text)
        present = [n for n in names if os.path.isfile(n)]
        return _Input(text, Path(names[0]).parent if names else Path("."), present,
                      [n for n in names if not os.path.isfile(n)])
    raise UsageError(f"{text}: no such file or folder (a WebDataset source is a .tar shard, a folder "
                     f"of them or a brace pattern such as data-{{000000..000009}}.tar)")


def detect(path) -> bool:
    """True when ``path`` is a tar shard, a folder holding tar shards, or a brace pattern whose
    first existing shard is a tar. Reads one header block; never raises."""
    text = os.fspath(path)
    try:
        if os.path.isfile(text):
            return _is_tar_head(_head(text))
        if os.path.isdir(text):
            tars = sorted(p for p in Path(text).iterdir() if p.suffix.lower() == ".tar" and p.is_file())
            return bool(tars) and _is_tar_head(_head(tars[0]))
        if "{" in text:
            names = [n for n in _braceexpand(text) if os.path.isfile(n)]
            return bool(names) and _is_tar_head(_head(names[0]))
    except (OSError, UsageError, DependencyError):
        return False
    return False


# ---------------------------------------------------------------------------------------------
# Scan: one shard's members -> samples


@dataclass
class _Sample:
    key: str                                          # webdataset's __key__
    fields: dict = field(default_factory=dict)        # field -> (member name, offset, size)
    texts: dict = field(default_factory=dict)         # field -> bytes (TEXT_FIELDS only)
    bad: Optional[str] = None                         # why the sample is unusable


@dataclass
class _ShardScan:
    path: str
    display: str
    samples: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    def problem(self, member: Optional[str], reason: str) -> None:
        where = f"{self.display}:{member}" if member else self.display
        self.problems.append({"path": where, "reason": reason})


class _Grouper:
    """webdataset's group_by_keys over (name, offset, size) members of one shard."""

    def __init__(self, out: _ShardScan, wanted: tuple):
        self.out, self.wanted, self.current = out, wanted, None

    def add(self, name: str, offset: int, size: int, read) -> None:
        key, suffix = base_plus_ext(name)
        if key is None:
            return
        suffix = suffix.lower()
        if self.current is None or key != self.current.key:
            self.flush()
            self.current = _Sample(key)
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


def _corrupt(out: _ShardScan, grouper: _Grouper, block: bytes, pos: int, after: str, last) -> None:
    name = _member_name_of(block)
    reason = f"corrupt tar header at byte {pos}{after} (name field {name!r}); the rest of the shard is not scanned"
    if not name or (grouper.current is not None and base_plus_ext(name)[0] == grouper.current.key):
        grouper.drop_current(last, reason)   # the header may be one of the current sample's members
    else:
        grouper.flush()
        out.problem(last, reason)


def _check_end(fh, out: _ShardScan, grouper: _Grouper, pos: int, size: int, last: Optional[str]) -> bool:
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


def _scan_shard(path: str, display: str, wanted: tuple) -> _ShardScan:
    out = _ShardScan(path, display)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        out.problem(None, f"cannot read: {exc.strerror or exc}")
        return out
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if _read_at(fh, 0, 2) == b"\x1f\x8b":
            out.problem(None, "a gzip-compressed tar: packer reads image bytes by range from plain tar "
                              "shards (gunzip it first)")
            return out
        if size == 0 or not _is_tar_head(_read_at(fh, 0, _BLOCK)):
            out.problem(None, "not a tar file (no valid tar header at byte 0)")
            return out
        fh.seek(0)
        _walk(fh, out, size, wanted)
    return out


def _walk(fh, out: _ShardScan, size: int, wanted: tuple) -> None:
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
            if ("/" not in name and name.startswith("__") and name.endswith("__")) or _SKIP_META.match(name):
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


# ---------------------------------------------------------------------------------------------
# Scan: a sample's fields -> key, locator, label


def _text(sample: _Sample, suffix: str) -> Optional[str]:
    data = sample.texts.get(suffix)
    if data is None:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{sample.fields[suffix][0]}: not UTF-8 text (byte {exc.start})") from None


def _json(sample: _Sample, suffix: str):
    text = _text(sample, suffix)
    if text is None:
        return None
    try:
        return loads_bounded(text)
    except ValueError as exc:
        raise ValueError(f"{sample.fields[suffix][0]}: invalid JSON: {exc}") from None


def _label_of_json(value, where: str):
    """(kind, label) of a ``.json`` value, or None when it is no label (metadata, captions...)."""
    if isinstance(value, dict) and isinstance(value.get("objects"), list) and "boxes" not in value:
        return "objects", value
    if isinstance(value, list) or (isinstance(value, dict) and "boxes" in value):
        return "boxes", parse_label_json(value, where)
    if isinstance(value, dict) and any(k in value for k in ("class", "label", "class_id")):
        return "class", parse_label_json(value, where)
    if isinstance(value, int) and not isinstance(value, bool):
        return "class", parse_label_json(value, where)
    return None


def _label_of_field(sample: _Sample, suffix: str):
    """(kind, label, field) of one field, or None when it holds no label."""
    where = sample.fields[suffix][0]
    if suffix == "json" or suffix.endswith(".json"):
        found = _label_of_json(_json(sample, suffix), where)
        return found + (suffix,) if found else None
    text = _text(sample, suffix).strip()
    if suffix == "txt" or suffix.endswith(".txt"):
        try:
            int(text)
        except ValueError:
            return None   # a caption
    return "class", parse_label_json(text, where), suffix


def _label(sample: _Sample, label_field: Optional[str]):
    """(kind, label, field) of a sample, or None when it has none. Raises ValueError naming the member."""
    if label_field:
        return _label_of_field(sample, label_field) if label_field in sample.texts else None
    from_json = _label_of_field(sample, "json") if "json" in sample.texts else None
    if from_json and from_json[0] in ("objects", "boxes"):
        return from_json
    if "cls" in sample.texts:
        return _label_of_field(sample, "cls")
    if from_json:
        return from_json
    return _label_of_field(sample, "txt") if "txt" in sample.texts else None


@dataclass
class _Entry:
    key: str
    shard: int
    locator: tuple
    display: str
    kind: Optional[str]
    label: object
    metadata: dict
    label_field: Optional[str] = None


def _entry(sample: _Sample, shard: _ShardScan, index: int, shard_path: str, options: ScanOptions):
    """An _Entry, or a problem reason. ``shard_path``: the shard's absolute path (one string per shard)."""
    if sample.bad:
        return sample.bad
    image_fields = (options.image_column.lower(),) if options.image_column else IMAGE_FIELDS
    image = next((f for f in image_fields if f in sample.fields), None)
    if image is None:
        return (f"no image member ({', '.join('.' + f for f in image_fields)}); "
                f"fields: {', '.join(sorted(sample.fields)) or 'none'}")
    name, offset, size = sample.fields[image]
    try:
        extra = _json(sample, "packer.json") if "packer.json" in sample.texts else {}
        if not isinstance(extra, dict):
            raise ValueError(f"{sample.fields['packer.json'][0]}: expected a JSON object")
        found = _label(sample, options.label_column.lower() if options.label_column else None)
    except ValueError as exc:
        return str(exc)
    key = extra.get("key", name)
    metadata = extra.get("metadata", {})
    if not isinstance(key, str) or not key or not isinstance(metadata, dict):
        return f"{sample.fields['packer.json'][0]}: 'key' must be a non-empty string, 'metadata' an object"
    kind, label, label_field = found if found else (None, None, None)
    return _Entry(key, index, ("range", shard_path, offset, size),
                  f"{shard.display}:{name}", kind, label, metadata, label_field)


# ---------------------------------------------------------------------------------------------
# Scan: the whole dataset


#: Shards are scanned in parallel worker processes (one shard per task) when there are several
#: and together they hold at least this many bytes (below it starting workers costs more).
PARALLEL_MIN_BYTES = 512 << 20
#: Most worker processes a scan starts.
MAX_SCAN_WORKERS = 16


def _scan_task(task: tuple) -> _ShardScan:
    return _scan_shard(*task)


def _scan_shards(tasks: list, total_bytes: int) -> Iterator[_ShardScan]:
    """``_scan_shard`` of every task, in order; header parsing is CPU-bound, so large inputs of
    several shards use worker processes (:func:`packer.workers.ordered_map`)."""
    workers = min(len(tasks), os.cpu_count() or 1, MAX_SCAN_WORKERS)
    if workers < 2 or total_bytes < PARALLEL_MIN_BYTES:
        yield from map(_scan_task, tasks)
        return
    from ..workers import ordered_map
    yield from ordered_map(_scan_task, tasks, workers=workers, window=2 * workers,
                           describe=lambda t: t[1])


def _read_class_file(folder: Path) -> tuple:
    """``(names or None, file name, problem or None)`` of the dataset's class-name file."""
    for name in CLASS_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if path.stat().st_size > MAX_PER_IMAGE_BYTES:
                raise ValueError(f"more than {MAX_PER_IMAGE_BYTES} bytes")
            text = path.read_bytes().decode("utf-8-sig")
            if name.endswith(".json"):
                names = loads_bounded(text)
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError("expected a JSON list of class names")
            else:
                names = [ln.strip() for ln in text.split("\n") if ln.strip()]   # not splitlines: \x1c, \x85...
        except (OSError, ValueError) as exc:   # UnicodeDecodeError is a ValueError
            return None, name, {"path": str(path), "reason": f"unreadable class-name file: {exc}"}
        return names, name, None
    return None, "", None


def _display_names(shards: list, folder: Path) -> list:
    """Shard names for messages: relative to the input folder where they lie in it."""
    out = []
    for s in shards:
        rel = os.path.relpath(s, folder)
        out.append(Path(rel).as_posix() if not rel.startswith("..") else s)
    return out


def _majority_kind(entries: list) -> Optional[str]:
    counts: dict = {}
    for e in entries:
        if e.kind:
            counts[e.kind] = counts.get(e.kind, 0) + 1
    return max(sorted(counts), key=counts.get) if counts else None


def _class_ids(entries: list, names: Optional[list], names_file: str, problems: list) -> tuple:
    """Class labels (ids or names) -> ids; ``(entries kept, class names)``."""
    if names is None:
        named = [e for e in entries if isinstance(e.label, str)]
        if named and len(named) < len(entries):   # ids and names with no file to tie them
            want = str if 2 * len(named) > len(entries) else int
            for e in entries:
                if not isinstance(e.label, want):
                    problems.append({"path": e.display, "reason": f"class {e.label!r}, but the other samples "
                                     f"give class {'names' if want is str else 'ids'} and there is no "
                                     f"{' or '.join(CLASS_FILES)} to tie them"})
            entries = [e for e in entries if isinstance(e.label, want)]
        names = sorted({e.label for e in entries if isinstance(e.label, str)})
    ids = {n: i for i, n in enumerate(names)}
    kept = []
    for e in entries:
        if isinstance(e.label, str):
            if e.label not in ids:
                problems.append({"path": e.display, "reason": f"class name {e.label!r} is not in {names_file}"})
                continue
            e.label = ids[e.label]
        elif names_file and e.label >= len(names):
            problems.append({"path": e.display, "reason": f"class id {e.label}, but {names_file} names "
                                                          f"{len(names)} classes"})
            continue
        kept.append(e)
    return kept, list(names)


def _unique_keys(entries: list, displays: list, problems: list) -> list:
    """Keys repeated across shards get their shard's name in front (all keys, so keying stays one
    rule); a key repeated within a shard is a problem for its later samples."""
    first_shard: dict = {}
    across = False
    for e in entries:
        across = across or first_shard.setdefault(e.key, e.shard) != e.shard
    del first_shard
    if across:
        for e in entries:
            stem = displays[e.shard]
            e.key = f"{stem[:-4] if stem.lower().endswith('.tar') else stem}/{e.key}"
    seen, kept = set(), []
    for e in entries:
        if e.key in seen:
            problems.append({"path": e.display, "reason": f"key {e.key!r} again in the same shard (its members "
                                                          f"are not next to each other, or two samples name it)"})
            continue
        seen.add(e.key)
        kept.append(e)
    return kept


def _sample_member(sample: _Sample) -> str:
    """The member that names a sample in messages: its image, else its first member."""
    image = next((f for f in IMAGE_FIELDS if f in sample.fields), None) or next(iter(sample.fields), None)
    return sample.fields[image][0] if image else sample.key


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List the samples of a WebDataset (see the module docstring).

    Args:
        path: a ``.tar`` shard, a folder of them, or a brace pattern.
        options: ``allow_unlabeled`` (unlabeled samples kept with label None), ``image_column``
            / ``label_column`` (the field to take the image / label from).

    Returns:
        Scan, samples in shard order; damaged parts in ``problems``.

    Raises:
        UsageError: ``path`` names nothing (a missing file, a pattern with unbalanced braces).
        DependencyError: a brace pattern and no ``braceexpand``.
    """
    options = options or ScanOptions()
    src = _expand(path)
    result = Scan(root=os.fspath(path))
    result.problems.extend({"path": m, "reason": "no such shard"} for m in src.missing)
    if not src.shards and not src.missing:
        result.problems.append({"path": src.root, "reason": "no .tar shard here"})
    wanted = TEXT_FIELDS + ((options.label_column.lower(),) if options.label_column else ())
    tasks, total = [], 0
    for shard, display in zip(src.shards, _display_names(src.shards, src.folder)):
        try:
            st = os.stat(shard)
        except OSError as exc:
            result.problems.append({"path": display, "reason": f"cannot read: {exc.strerror or exc}"})
            continue
        result.fingerprint.append((display, st.st_size, st.st_mtime_ns))
        tasks.append((shard, display, wanted))
        total += st.st_size
    displays = [t[1] for t in tasks]
    entries = []
    for i, found in enumerate(_scan_shards(tasks, total)):
        result.problems.extend(found.problems)
        shard_path = os.path.abspath(found.path)
        for sample in found.samples:
            got = _entry(sample, found, i, shard_path, options)
            if isinstance(got, str):
                result.problems.append({"path": f"{found.display}:{_sample_member(sample)}", "reason": got})
            else:
                entries.append(got)
    _finish_labels(result, entries, src, options)
    entries = _unique_keys(entries, displays, result.problems)
    log.debug("%s: %d sample(s) in %d shard(s), %d problem(s)", result.root, len(entries), len(src.shards),
              len(result.problems))
    result.keys = [e.key for e in entries]
    result.locators = [e.locator for e in entries]
    result.displays = [e.display for e in entries]
    result.labels = [e.label for e in entries]
    result.metadata = [e.metadata for e in entries]
    return result


def _finish_labels(result: Scan, entries: list, src: _Input, options: ScanOptions) -> None:
    """Label schema, class ids and names, unlabeled and mixed samples (into problems); filters
    ``entries`` in place."""
    names, names_file, bad_file = _read_class_file(src.folder)
    if bad_file:
        result.problems.append(bad_file)
        names_file = ""
    kind = _majority_kind(entries)
    kept = []
    for e in entries:
        if e.kind is None and not options.allow_unlabeled:
            result.problems.append({"path": e.display, "reason": "image without a label (.cls, .json or .txt) "
                                                                 "(--allow-unlabeled keeps it unlabeled)"})
        elif e.kind is not None and e.kind != kind:
            result.problems.append({"path": e.display, "reason": f"a {e.kind} label, but the other samples have "
                                                                 f"{kind} labels; a store holds one kind"})
        else:
            kept.append(e)
    if kind == "class":
        kept, result.class_names = _class_ids(kept, names, names_file, result.problems)
    else:
        result.class_names = list(names or [])
    entries[:] = kept
    result.label_schema = kind or "none"
    fields = sorted({e.label_field for e in kept if e.label_field})
    result.label_source = (f"webdataset {' '.join('.' + f for f in fields) or 'unlabeled'}"
                           + (f" + {names_file}" if names_file else ""))


# ---------------------------------------------------------------------------------------------
# Export


def _image_suffix(data: bytes, key: str) -> str:
    """The field of a stored image: ``jpg`` for JPEG bytes, else its own type."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    _, ext = base_plus_ext(key.rsplit("/", 1)[-1])
    return (ext or "bin").rsplit(".", 1)[-1].lower()


def _usable_key(stem: str) -> bool:
    return (bool(stem) and safe_relative(stem) is None and ":" not in stem.split("/", 1)[0]
            and "." not in stem.rsplit("/", 1)[-1] and not _SKIP_META.match(stem))


def _sample_key(key: str, index: int, used: set) -> str:
    """webdataset's ``__key__`` for record ``key``: the key without its extension where that is a
    usable, unused sample key; else a cleaned-up form made unique with the record index."""
    stem = base_plus_ext(key)[0] or key
    if _usable_key(stem) and stem not in used:
        used.add(stem)
        return stem
    parts = [p for p in stem.replace("\\", "/").replace("\0", "_").replace(":", "_").split("/")
             if p not in ("", ".", "..")]
    clean = "/".join(parts[:-1] + [parts[-1].replace(".", "_")]) if parts else "sample"
    if _SKIP_META.match(clean):
        clean = "x" + clean
    candidate, n = f"{clean}-{index}", 0
    while not _usable_key(candidate) or candidate in used:
        n += 1
        candidate = f"sample-{index}-{n}"
    used.add(candidate)
    return candidate


def _png_of_pixels(rec, reader) -> bytes:
    """Decoded pixels (a raw store) as lossless PNG, as :func:`packer.export.export` writes them."""
    import cv2
    arr = np.frombuffer(bytes(rec.data), np.uint8).reshape(reader.raw_shape)
    if arr.shape[2] == 3:
        arr = cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".png", arr)
    if not ok:
        raise RecordError(reader.location, rec.key, "PNG encode failed", rec.index)
    return buf.tobytes()


def _label_fields(label, schema: str) -> dict:
    """webdataset fields holding ``label`` (none for an unlabeled record)."""
    if label is None or schema == "none":
        return {}
    if isinstance(label, dict):
        return {"json": json.dumps(label).encode("utf-8")}
    if isinstance(label, (int, np.integer)):
        return {} if int(label) == UNLABELED_CLASS else {"cls": str(int(label)).encode("ascii")}
    rows = np.asarray(label, np.float32).reshape(-1, 5)
    # float(float32) then repr: the shortest text that reads back as the same float32
    return {"json": json.dumps({"boxes": [[float(v) for v in row] for row in rows]}).encode("utf-8")}


def _record_sample(rec, reader, used: set, counts: dict) -> dict:
    if not rec.data_ok():
        raise RecordError(reader.location, rec.key, "checksum mismatch (hint: packer repair first)", rec.index)
    data = bytes(rec.data)
    counts["records"] = counts.get("records", 0) + 1
    if reader.encoding == "raw":
        data = _png_of_pixels(rec, reader)
        counts["png"] = counts.get("png", 0) + 1
    suffix = _image_suffix(data, rec.key)
    wkey = _sample_key(rec.key, rec.index, used)
    sample = {"__key__": wkey, suffix: data}
    sample.update(_label_fields(rec.label, reader.metadata.label_schema))
    extra = {}
    if f"{wkey}.{suffix}" != rec.key:
        extra["key"] = rec.key
        counts["renamed"] = counts.get("renamed", 0) + 1
    if rec.metadata:
        extra["metadata"] = rec.metadata
    if extra:
        sample["packer.json"] = json.dumps(extra).encode("utf-8")
    if suffix not in IMAGE_FIELDS:
        counts["odd"] = counts.get("odd", 0) + 1
    return sample


def _records(reader) -> Iterator:
    """Every live record, in index order (256 at a time, as :func:`packer.export.export` reads)."""
    count = reader.metadata.count
    for start in range(0, count, 256):
        yield from reader.get_many(range(start, min(start + 256, count)))


def _write_class_names(out: Path, names: list) -> list:
    if not names:
        return []
    written = [out / "classes.txt"]
    written[0].write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
    if any(not n or n != n.strip() or "\n" in n or "\r" in n for n in names):
        written.append(out / "classes.json")
        written[1].write_text(json.dumps(names), encoding="utf-8")
    return written


def _mtime(created: str) -> float:
    """The tar members' mtime: the store's creation time, so one store always exports the same
    bytes (whole seconds: a fractional mtime costs every member a PAX header)."""
    try:
        return datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return 0.0


def export(reader, out, options: Optional[ExportOptions] = None) -> ExportResult:
    """Write every record of ``reader`` as WebDataset shards in ``out`` (see the module docstring).

    Args:
        reader: an open store reader (:func:`packer.stores.open_store`).
        out: a new or empty folder.
        options: ``shard_size`` (samples per shard), ``prefix`` (shard file names).

    Returns:
        ExportResult: the shards written (in order), the class-name files, notes.

    Raises:
        UsageError: ``out`` is not a new or empty folder, or lies in the store; a shard size below 1.
        RecordError: a record fails its checksum (repair the store first).
        DependencyError: webdataset is not installed.
        DiskFullError: the disk filled up (nothing is left in ``out``).
    """
    options = options or ExportOptions()
    wds = _webdataset()
    if int(options.shard_size) < 1:
        raise UsageError(f"--shard-size must be at least 1, got {options.shard_size}")
    if not options.prefix or "/" in options.prefix or "%" in options.prefix:
        raise UsageError(f"shard prefix {options.prefix!r}: must be a plain file name part (no '/' or '%')")
    out = Path(out)
    check_output(out, inputs=[("store", reader.location)], kind="folder")
    out.mkdir(parents=True, exist_ok=True)
    room = dict(needed=reader.size_bytes(), what=f"the export ({reader.metadata.count} records)")
    require_room(str(out), room["needed"], what=room["what"])
    staging = out / f".{options.prefix}.partial"
    staging.mkdir()
    counts: dict = {}
    try:
        with wds.ShardWriter(str(staging / f"{options.prefix}-%06d.tar"), maxcount=int(options.shard_size),
                             maxsize=float("inf"), verbose=0, encoder=False, format="PAX_FORMAT",
                             mtime=int(_mtime(reader.metadata.created))) as sink:
            used: set = set()
            for rec in _records(reader):
                sink.write(_record_sample(rec, reader, used, counts))
        shards = []
        for part in sorted(staging.iterdir()):
            os.replace(part, out / part.name)
            shards.append(str(out / part.name))
        staging.rmdir()
        side = _write_class_names(out, list(reader.metadata.class_names or []))
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full(str(out), cause=exc, **room) from exc
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(str(out), counts.get("records", 0), shards, _notes(counts, side))


def _notes(counts: dict, side: list) -> list:
    notes = []
    if counts.get("png"):
        notes.append(f"{counts['png']} record(s) of decoded pixels written as lossless PNG (.png)")
    if counts.get("renamed"):
        notes.append(f"{counts['renamed']} record key(s) that the sample key plus extension cannot spell "
                     f"are kept in each sample's packer.json")
    if counts.get("odd"):
        notes.append(f"{counts['odd']} record(s) hold bytes of a type that is not .jpg/.png/.webp")
    if side:
        notes.append("class names in " + " and ".join(p.name for p in side))
    return notes


#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat("webdataset", detect, scan, export)

__all__ = ["FORMAT", "detect", "scan", "export", "base_plus_ext", "IMAGE_FIELDS", "CLASS_FILES"]
