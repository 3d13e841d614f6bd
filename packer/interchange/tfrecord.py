"""TFRecord files of ``tf.train.Example`` (the TF Object Detection API keys) as a build source and
an export target, without TensorFlow.

**Input**: one file (``.tfrecord``, ``.tfrecords``, ``.tfrec``, ``.record``, TFDS/TF-slim shard
names such as ``train.tfrecord-00000-of-00016``; gzip detected by its magic bytes), a folder of
them (its files with such names, not recursive, sorted), or a glob/brace pattern
(``data-{00000..00009}.tfrecord``). Every record's framing is checked: ``uint64`` length,
masked CRC32C of the length, the data, masked CRC32C of the data (the ``crc32c`` package, or
``google-crc32c``). A record whose data CRC does not match is listed and skipped; a length whose
CRC does not match, or a file cut short, ends that file (its framing is lost): the problem says
so, and the other files are read on. Each record is parsed with ``tfrecord.example_pb2.Example``.

Features read:

* ``image/encoded`` (one bytes value): the image. In an uncompressed file its byte range is found by
  walking the record's protobuf wire format (Example -> features -> map entry -> Feature ->
  BytesList -> value) and checked against the parsed value, so the scan keeps
  ``("range", file, offset, size)`` locators and no image bytes; gzip files keep ``("bytes", data)``.
* keys: ``image/filename`` when every record has one (a safe relative path) and no two are equal;
  otherwise ``<file stem>/<record no:06d>.<ext>`` for every record (``ext`` from ``image/format``,
  else the image's magic bytes). Records are numbered from 0 in each file.
* boxes: ``image/object/bbox/{xmin,ymin,xmax,ymax}`` (normalized corners) become YOLO rows
  ``class cx cy w h`` (float32, computed in float64); classes from ``image/object/class/label``
  (int64) or, where only ``image/object/class/text`` is given, from the names.
* classes: ``image/class/label`` (+ ``image/class/text``).
* ``packer/label``: packer's own label JSON (what :func:`packer.records.label_to_json` gives),
  written by :func:`export` where the float32 corners would not give the stored rows back bit for
  bit (and for label-model dicts and unlabeled records); when present it is the label, after a
  check that it agrees with the TF OD features beside it. ``packer/metadata``: the record's
  per-sample metadata JSON.

**Class ids are kept as given** (the TF OD API numbers classes from 1, 0 being background; many
classification sets number from 0): ``class_names[id]`` is the name of ``id``, from
``label_map.pbtxt`` beside the files (the TF OD API's ``StringIntLabelMap``; ``display_name``
where given, else ``name``) and from the records' ``.../class/text``. An id with no name (id 0 of a
1-based set) gets the placeholder ``__unused_<id>__``; a set with ids but no names at all keeps
``class_names == []``. A record whose class text contradicts the names seen before is listed and
skipped. :func:`export` writes ids as stored and a ``label_map.pbtxt`` of every named id
(placeholders left out), so a store built from a 1-based set exports as one; a 0-based store
exports 0-based ids (noted in :attr:`ExportResult.notes`: the TF OD API reserves id 0).

**Output**: ``<out>/<prefix>-00000-of-0000N.tfrecord`` written by ``tfrecord.TFRecordWriter``, one per
``shard_size`` records, each with its ``.tfindex`` (the ``offset length`` lines of
``tfrecord.tools.tfrecord2idx``, which ``tfrecord.torch.dataset.TFRecordDataset`` takes for
shuffling and worker sharding), and ``label_map.pbtxt`` when the store has class names.

Example:
    >>> from packer.interchange import get_format, ScanOptions   # doctest: +SKIP
    >>> scan = get_format("tfrecord").scan("pets/train.record-*", ScanOptions())   # doctest: +SKIP
    >>> scan.label_schema, scan.class_names[:2]   # doctest: +SKIP
    ('boxes', ['__unused_0__', 'Abyssinian'])
"""
from __future__ import annotations

import glob
import gzip
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from ..errors import DependencyError, RecordError, UsageError
from ..records import UNLABELED_CLASS, label_from_json, label_to_json, loads_bounded
from .base import ExportOptions, ExportResult, Scan, ScanOptions, InterchangeFormat

log = logging.getLogger(__name__)

NAME = "tfrecord"
#: File names taken from a folder: TFRecord suffixes, TFDS/TF-slim shard names, optional ``.gz``.
_NAME_RE = re.compile(r"(?i)(\.(tfrecords?|tfrec|records?)(-\d+-of-\d+)?|-\d+-of-\d+)(\.gz|\.gzip)?$")
_SUFFIX_RE = re.compile(r"(?i)\.(tfrecords?|tfrec|records?)(?=(-\d+-of-\d+)?$)")
_GZIP_MAGIC = b"\x1f\x8b"
_MASK_DELTA = 0xA282EAD8
#: Protocol buffers cap a message at 2 GiB; a larger length is damage, not a record.
_MAX_RECORD = 2 ** 31 - 1
_MAX_EXPANSION = 1_000_000
PACKER_LABEL = "packer/label"
PACKER_METADATA = "packer/metadata"
LABEL_MAP = "label_map.pbtxt"
_BOX_KEYS = tuple(f"image/object/bbox/{c}" for c in ("xmin", "ymin", "xmax", "ymax"))
_EXTENSIONS = {"jpeg": "jpg", "jpg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "webp": "webp",
               "tiff": "tif", "tif": "tif"}
_INSTALL = "pip install 'packer-vision[interchange]' (or: pip install tfrecord crc32c protobuf)"


def placeholder(class_id: int) -> str:
    """The class name given to an id that the data uses or skips but never names."""
    return f"__unused_{class_id}__"


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


def _require_crc():
    fn = _crc_function()
    if fn is None:
        raise DependencyError(f"reading TFRecord files needs a CRC32C library: {_INSTALL}")
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


def _example_class():
    try:
        from google.protobuf.message import DecodeError
        example_pb2 = _example_pb2()
    except ImportError as exc:
        raise DependencyError(f"TFRecord support needs the tfrecord package: {_INSTALL}") from exc
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


def _is_pattern(text: str) -> bool:
    return "{" in text or any(c in text for c in "*?[")


def list_files(path) -> list:
    """The TFRecord files ``path`` names: itself, a folder's TFRecord-named files, or a pattern's
    matches (sorted, each once).

    Raises:
        UsageError: nothing exists at ``path`` or the pattern matches nothing.
    """
    text = os.fspath(path)
    if os.path.isdir(text):
        try:
            names = sorted(e.name for e in os.scandir(text) if e.is_file() and _NAME_RE.search(e.name))
        except OSError as exc:
            raise UsageError(f"{text}: cannot list the folder: {exc.strerror or exc}") from exc
        return [os.path.join(text, n) for n in names]
    if os.path.isfile(text):
        return [text]
    if _is_pattern(text):
        found = set()
        for pat in expand_braces(text):
            found.update(p for p in (glob.glob(pat) if any(c in pat for c in "*?[") else [pat])
                         if os.path.isfile(p))
        if found:
            return sorted(found)
    raise UsageError(f"{text}: no TFRecord file there (a file, a folder of *.tfrecord files, or a "
                     f"glob/brace pattern)")


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


def _head(path: str) -> bytes:
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rb") as fh:
        return fh.read(12)


def detect(path) -> bool:
    """True when ``path`` names TFRecord data: its first file's first length has a valid masked
    CRC32C (an empty file counts when its name is a TFRecord name). Reads at most 12 bytes of one
    file; never raises."""
    try:
        text = os.fspath(path)
        if not (os.path.exists(text) or _is_pattern(text)):
            return False
        files = list_files(text)
        if not files:
            return False
        head = _head(files[0])
    except (UsageError, OSError, EOFError, zlib.error, TypeError, ValueError):
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

class _Problems(list):
    def add(self, where: str, reason: str, kind: str = "damaged") -> None:
        log.warning("%s: %s", where, reason, extra={"packer_damaged_input": True})
        self.append({"path": where, "reason": reason, "kind": kind})


def iter_records(path: str, shown: str, crc_fn, problems: _Problems) -> Iterator[tuple]:
    """``(record no, data offset, data)`` for each record of ``path`` whose framing and CRCs check
    (offsets are into the uncompressed stream); damage goes into ``problems`` (see module doc)."""
    try:
        gz = _is_gzip(path)
        size = None if gz else os.path.getsize(path)
        fh = gzip.open(path, "rb") if gz else open(path, "rb", buffering=1 << 20)
    except OSError as exc:
        problems.add(shown, f"cannot read the file: {exc.strerror or exc}", "unreadable")
        return
    recno = pos = 0
    with fh:
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
                data = fh.read(length)
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


# --- the protobuf wire walk ----------------------------------------------------------------------

def _varint(buf: bytes, pos: int, end: int) -> tuple:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _len_fields(buf: bytes, start: int, end: int, number: int) -> list:
    """``(start, end)`` of each length-delimited field ``number`` of the message ``buf[start:end]``
    (other fields skipped)."""
    out, pos = [], start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        wire = tag & 7
        if wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise ValueError("field runs past its message")
            if tag >> 3 == number:
                out.append((pos, pos + n))
            pos += n
        elif wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    if pos != end:
        raise ValueError("field runs past its message")
    return out


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encoded_range(record: bytes, feature: bytes = b"image/encoded") -> Optional[tuple]:
    """``(offset, size)`` in ``record`` (a serialized Example) of the last value of the bytes
    feature ``feature``, or None (absent, or not laid out as the wire format says).

    Walks Example.features (1) -> Features.feature map entries (1: key 1, value 2) ->
    Feature.bytes_list (1) -> BytesList.value (1); a map entry that starts with its key (as every
    writer lays it out) is told apart by that prefix alone."""
    first = b"\x0a" + _varint_bytes(len(feature)) + feature
    found = None
    try:
        for s, e in _len_fields(record, 0, len(record), 1):
            for s2, e2 in _len_fields(record, s, e, 1):
                if record[s2] == 0x0A and not record.startswith(first, s2):
                    continue   # another feature's entry (its key comes first)
                keys = _len_fields(record, s2, e2, 1)
                if not keys or record[keys[-1][0]:keys[-1][1]] != feature:
                    continue
                for value in _len_fields(record, s2, e2, 2)[-1:]:
                    for s4, e4 in _len_fields(record, *value, 1):
                        for s5, e5 in _len_fields(record, s4, e4, 1):
                            found = (s5, e5 - s5)
    except (ValueError, IndexError):
        return None
    return found


# --- parsing one Example -----------------------------------------------------------------------

def _values(feats, key: str, kind: str):
    """The values of feature ``key`` (None when absent); ValueError for another list type."""
    if key not in feats:
        return None
    feature = feats[key]
    which = feature.WhichOneof("kind")
    if which is None:
        return []
    if which != kind:
        raise ValueError(f"{key} holds a {which}, expected a {kind}")
    return getattr(feature, kind).value


def _text(value: bytes, key: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{key} is not UTF-8 text") from exc


def _one(feats, key: str, kind: str):
    vals = _values(feats, key, kind)
    if not vals:
        return None
    if len(vals) != 1:
        raise ValueError(f"{key} holds {len(vals)} values, expected one")
    return vals[0]


def _boxes(feats) -> Optional[tuple]:
    """``(corners float32 (N, 4), [(class id or None, name or None) per box])`` from the TF OD
    keys, or None when the record has no box keys."""
    present = [k for k in _BOX_KEYS if k in feats]
    if not present:
        return None
    if len(present) != 4:
        raise ValueError(f"{', '.join(sorted(set(_BOX_KEYS) - set(present)))} missing beside {present[0]}")
    cols = [list(_values(feats, k, "float_list")) for k in _BOX_KEYS]
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise ValueError(f"the bbox lists differ in length ({', '.join(str(len(c)) for c in cols)})")
    corners = np.array(cols, np.float32).T.reshape(n, 4)
    if n:
        lo, hi = float(corners.min()), float(corners.max())
        if not (math.isfinite(lo) and math.isfinite(hi) and lo >= 0 and hi <= 1):
            raise ValueError("a bbox coordinate is outside [0, 1] (TF OD boxes are normalized) or not finite")
        if not np.all(corners[:, 2:] >= corners[:, :2]):
            raise ValueError("a box has xmax < xmin or ymax < ymin")
    ids = _values(feats, "image/object/class/label", "int64_list")
    texts = _values(feats, "image/object/class/text", "bytes_list")
    for name, vals in (("image/object/class/label", ids), ("image/object/class/text", texts)):
        if vals is not None and len(vals) != n:
            raise ValueError(f"{name} holds {len(vals)} values for {n} boxes")
    if n and ids is None and texts is None:
        raise ValueError("boxes without image/object/class/label or image/object/class/text")
    ids = [None] * n if ids is None else [int(v) for v in ids]
    texts = [None] * n if texts is None else [_text(v, "image/object/class/text") for v in texts]
    return corners, list(zip(ids, texts))


def _image_class(feats) -> Optional[tuple]:
    cid = _one(feats, "image/class/label", "int64_list")
    text = _one(feats, "image/class/text", "bytes_list")
    if cid is None and text is None:
        return None
    return (None if cid is None else int(cid), None if text is None else _text(text, "image/class/text"))


def _packer_json(feats, key: str):
    raw = _one(feats, key, "bytes_list")
    if raw is None:
        return None, False
    try:
        return loads_bounded(raw), True
    except ValueError as exc:
        raise ValueError(f"{key} is not valid JSON: {exc}") from exc


def _extension(feats, image: bytes) -> str:
    fmt = _one(feats, "image/format", "bytes_list")
    if fmt:
        ext = _EXTENSIONS.get(fmt.decode("ascii", "replace").strip().lower())
        if ext:
            return ext
    magic = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG", "png"), (b"GIF8", "gif"), (b"BM", "bmp"),
             (b"II*\x00", "tif"), (b"MM\x00*", "tif"))
    for sig, ext in magic:
        if image.startswith(sig):
            return ext
    return "webp" if image[:4] == b"RIFF" and image[8:12] == b"WEBP" else "bin"


# --- class names -------------------------------------------------------------------------------

def _label_map_classes():
    """Message classes of the TF OD API's StringIntLabelMap (the fields packer reads)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="packer_string_int_label_map.proto",
                                            package="object_detection.protos", syntax="proto2")
    item = fd.message_type.add(name="StringIntLabelMapItem")
    opt, lab = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto
    for name, number, typ in (("name", 1, lab.TYPE_STRING), ("id", 2, lab.TYPE_INT32),
                              ("display_name", 3, lab.TYPE_STRING)):
        item.field.add(name=name, number=number, type=typ, label=opt)
    top = fd.message_type.add(name="StringIntLabelMap")
    top.field.add(name="item", number=1, type=lab.TYPE_MESSAGE, label=lab.LABEL_REPEATED,
                  type_name=".object_detection.protos.StringIntLabelMapItem")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("object_detection.protos.StringIntLabelMap")
    get = getattr(message_factory, "GetMessageClass", None)
    return get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)


def read_label_map(path: str) -> dict:
    """``{id: name}`` of a ``label_map.pbtxt`` (``display_name`` where given, else ``name``).

    Raises:
        UsageError: the file is not a label map, or gives one id or one name twice.
    """
    from google.protobuf import text_format

    msg = _label_map_classes()()
    try:
        with open(path, encoding="utf-8") as fh:
            text_format.Parse(fh.read(), msg, allow_unknown_field=True)
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise UsageError(f"{path}: not a readable TF OD label map: {exc}") from exc
    out, seen = {}, {}
    for item in msg.item:
        name = item.display_name or item.name
        if not item.HasField("id") or not name or item.id < 0:
            raise UsageError(f"{path}: an item without a non-negative id and a name ({item.id}, {name!r})")
        if item.id in out or name in seen:
            raise UsageError(f"{path}: id {item.id} or name {name!r} appears twice")
        out[item.id], seen[name] = name, item.id
    return out


def write_label_map(path: str, class_names: list) -> int:
    """Write ``label_map.pbtxt`` with an item per named id (placeholders left out); returns the count."""
    from google.protobuf import text_format

    msg = _label_map_classes()()
    for i, name in enumerate(class_names):
        if name != placeholder(i):
            msg.item.add(name=name, id=i)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text_format.MessageToString(msg, as_utf8=True))
    return len(msg.item)


@dataclass
class _Names:
    """Class id <-> name as the label map and the records give them; conflicts refuse a record."""

    by_id: dict = field(default_factory=dict)
    by_name: dict = field(default_factory=dict)
    pending: set = field(default_factory=set)   # names seen without an id

    def bind(self, pairs) -> None:
        """Check then record ``(id or None, name or None)`` pairs of one record (ValueError: a clash)."""
        new_ids, new_names = {}, {}
        for cid, name in pairs:
            if cid is not None and cid < 0:
                raise ValueError(f"class id {cid} is negative")
            if cid is None or name is None:
                continue
            known = self.by_id.get(cid, new_ids.get(cid))
            if known is not None and known != name:
                raise ValueError(f"class {cid} is named {name!r} here but {known!r} before")
            other = self.by_name.get(name, new_names.get(name))
            if other is not None and other != cid:
                raise ValueError(f"class name {name!r} has id {cid} here but {other} before")
            new_ids[cid], new_names[name] = name, cid
        self.by_id.update(new_ids)
        self.by_name.update(new_names)
        self.pending.update(n for c, n in pairs if c is None and n is not None and n not in self.by_name)

    def resolve(self) -> None:
        """Give each name seen without an id the next free id, in sorted order."""
        nxt = max(self.by_id, default=-1) + 1
        for name in sorted(self.pending - set(self.by_name)):
            self.by_id[nxt], self.by_name[name] = name, nxt
            nxt += 1

    def class_names(self, used_max: int) -> list:
        if not self.by_id:
            return []
        top = max(max(self.by_id), used_max)
        return [self.by_id.get(i, placeholder(i)) for i in range(top + 1)]


# --- scan ----------------------------------------------------------------------------------------

class _Sample:
    """One record as the scan keeps it until the labels are resolved (slots: a scan holds one per
    record of the data set)."""

    __slots__ = ("filename", "shown", "stem", "recno", "ext", "locator", "raw", "packed", "metadata", "label")

    def __init__(self, filename, ext, locator, raw, packed, metadata):
        self.filename, self.ext, self.locator = filename, ext, locator
        self.raw = raw               # ("boxes", corners, classes) | ("class", (id, text)) | None
        self.packed = packed         # (has packer/label, its JSON value)
        self.metadata, self.label = metadata, None
        self.shown = self.stem = ""
        self.recno = 0

    @property
    def display(self) -> str:
        return f"{self.shown}:record {self.recno}"

    @property
    def fallback(self) -> str:
        return f"{self.stem}/{self.recno:06d}.{self.ext}"


def _read_sample(record: bytes, data_at: int, path: str, gz: bool, example_cls, names: _Names) -> _Sample:
    """One record -> a _Sample; ValueError says what is wrong with it."""
    ex = example_cls()
    ex.ParseFromString(record)
    feats = ex.features.feature
    image = _one(feats, "image/encoded", "bytes_list")
    if image is None:
        raise ValueError("no image/encoded bytes")
    filename = _one(feats, "image/filename", "bytes_list")
    filename = None if filename is None else filename.decode("utf-8", "replace")
    boxes, image_class = _boxes(feats), _image_class(feats)
    raw = ("boxes", *boxes) if boxes is not None else ("class", image_class) if image_class else None
    packed, has_packed = _packer_json(feats, PACKER_LABEL)
    meta, has_meta = _packer_json(feats, PACKER_METADATA)
    if has_meta and not isinstance(meta, dict):
        raise ValueError(f"{PACKER_METADATA} must be a JSON object")
    names.bind(raw[2] if raw and raw[0] == "boxes" else [raw[1]] if raw else [])
    locator = ("bytes", image)
    if not gz:
        at = encoded_range(record)
        if at is None or memoryview(record)[at[0]:at[0] + at[1]] != image:
            pos = record.find(image)   # an unusual layout: any copy of the same bytes will do
            at = None if pos < 0 else (pos, len(image))
        if at is not None:
            locator = ("range", path, data_at + at[0], at[1])
    return _Sample(filename, _extension(feats, image), locator, raw, (has_packed, packed),
                   meta if has_meta else {})


def _display_names(files: list) -> list:
    if len(files) == 1:
        return [os.path.basename(files[0])]
    root = os.path.commonpath([os.path.abspath(f) for f in files])
    return [os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/") for f in files]


def _stem(shown: str) -> str:
    base = re.sub(r"(?i)\.(gz|gzip)$", "", shown)
    return _SUFFIX_RE.sub("", base)


def _find_label_map(path: str, files: list) -> Optional[str]:
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(files[0]))
    candidate = os.path.join(folder, LABEL_MAP)
    return candidate if os.path.isfile(candidate) else None


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List every record of the TFRecord data at ``path`` (see the module doc).

    Raises:
        UsageError: no TFRecord file at ``path``, or a damaged ``label_map.pbtxt``.
        DependencyError: tfrecord / protobuf / a CRC32C library is missing.
    """
    options = options or ScanOptions()
    text = os.fspath(path)
    example_cls, decode_error = _example_class()
    crc_fn = _require_crc()
    files = list_files(text)
    names, problems, samples = _Names(), _Problems(), []
    label_map = _find_label_map(text, files)
    if label_map:
        for cid, name in sorted(read_label_map(label_map).items()):
            names.bind([(cid, name)])
    fingerprint = []
    for file, shown in zip(files, _display_names(files)):
        try:
            st = os.stat(file)
            gz = _is_gzip(file)
        except OSError as exc:
            problems.add(shown, f"cannot read the file: {exc.strerror or exc}", "unreadable")
            continue
        fingerprint.append((shown, st.st_size, st.st_mtime_ns))
        path_abs, stem = os.path.abspath(file), _stem(shown)
        for recno, data_at, record in iter_records(file, shown, crc_fn, problems):
            where = f"{shown}:record {recno}"
            try:
                sample = _read_sample(record, data_at, path_abs, gz, example_cls, names)
            except decode_error as exc:
                problems.add(where, f"not a tf.train.Example ({exc}); record skipped")
                continue
            except ValueError as exc:
                problems.add(where, f"{exc}; record skipped")
                continue
            sample.shown, sample.stem, sample.recno = shown, stem, recno
            samples.append(sample)
    return _finish(text, samples, names, problems, fingerprint, options, label_map)


def _schema_of(samples: list) -> str:
    kinds = set()
    for s in samples:
        has, value = s.packed
        if has:
            kinds.add("objects" if isinstance(value, dict) else "boxes" if isinstance(value, list)
                      else "class" if isinstance(value, int) and not isinstance(value, bool) else "unlabeled")
        if s.raw:
            kinds.add(s.raw[0])
    for schema in ("objects", "boxes", "class"):
        if schema in kinds:
            return schema
    return "none"


def _rows(corners: np.ndarray, classes: list, names: _Names) -> np.ndarray:
    c = corners.astype(np.float64)
    ids = [cid if cid is not None else names.by_name[text] for cid, text in classes]
    rows = np.stack([np.asarray(ids, np.float64), (c[:, 0] + c[:, 2]) / 2, (c[:, 1] + c[:, 3]) / 2,
                     c[:, 2] - c[:, 0], c[:, 3] - c[:, 1]], axis=1) if len(ids) else np.zeros((0, 5))
    return rows.astype(np.float32)


def _raw_label(raw, schema: str, names: _Names):
    """The label the TF OD features give in ``schema`` (None: they give none there)."""
    from ..labels.model import as_label_model

    if raw is None:
        return None
    if raw[0] == "boxes":
        rows = _rows(raw[1], raw[2], names)
        return rows if schema == "boxes" else as_label_model(rows) if schema == "objects" else None
    cid, text = raw[1]
    cid = cid if cid is not None else names.by_name[text]
    return cid if schema == "class" else as_label_model(cid) if schema == "objects" else None


def _agrees(packed, raw_label, schema: str) -> bool:
    """Does packer/label say what the TF OD features beside it say (up to their float32 rounding)?"""
    if raw_label is None:
        return True
    if schema == "boxes":
        a = np.asarray(packed, np.float64).reshape(-1, 5)
        b = np.asarray(raw_label, np.float64)
        return a.shape == b.shape and np.array_equal(a[:, 0], b[:, 0]) and np.allclose(a, b, rtol=0, atol=1e-5)
    if schema == "objects":
        def classes(lab):
            return [o.get("class") for o in (lab or {}).get("objects", []) if "box" in o]
        return classes(packed) == classes(raw_label)
    return packed == raw_label


def _label_of(s: _Sample, schema: str, names: _Names):
    """``(label, explicit)`` of one sample; ValueError for a packer/label that does not fit."""
    raw_label = _raw_label(s.raw, schema, names)
    has, value = s.packed
    if not has:
        return raw_label, raw_label is not None
    try:
        label = label_from_json(value, schema)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{PACKER_LABEL} is not a {schema} label: {exc}") from exc
    if schema == "class" and not isinstance(value, int) and value is not None:
        raise ValueError(f"{PACKER_LABEL} holds {type(value).__name__}, expected a class id")
    if schema in ("boxes", "objects") and value is not None and not isinstance(value, (list, dict)):
        raise ValueError(f"{PACKER_LABEL} holds {type(value).__name__}, expected {schema}")
    if not _agrees(label, raw_label, schema):
        raise ValueError(f"{PACKER_LABEL} disagrees with the image/object or image/class features "
                         f"(edited after export?)")
    return label, True


def _keys(samples: list) -> list:
    names = [s.filename for s in samples]
    from ..export import safe_relative
    if names and all(n and safe_relative(n) is None for n in names) and len(set(names)) == len(names):
        return names
    if any(names):
        log.info("image/filename is missing, unsafe or repeated: keys are <file stem>/<record no>.<ext>")
    return [s.fallback for s in samples]


def _finish(text, samples, names: _Names, problems: _Problems, fingerprint, options: ScanOptions,
            label_map) -> Scan:
    names.resolve()
    schema = _schema_of(samples)
    scan = Scan(root=text, label_schema=schema, fingerprint=fingerprint)
    kept, used_max = [], -1
    for s in samples:
        try:
            label, explicit = _label_of(s, schema, names)
        except ValueError as exc:
            problems.add(s.display, f"{exc}; record skipped")
            continue
        s.raw = s.packed = None   # keep the label only
        if not explicit and schema != "none":
            if not options.allow_unlabeled:
                problems.add(s.display, "no label (no image/class/label, image/object/bbox/* or packer/label "
                                        "while other records have one; --allow-unlabeled keeps it)", "unlabeled")
                continue
            label = UNLABELED_CLASS if schema == "class" else None
        used_max = max(used_max, _max_class(label))
        s.label = label
        kept.append(s)
    samples.clear()
    scan.class_names = names.class_names(used_max)
    keys = _keys(kept)
    for i, (key, s) in enumerate(zip(keys, kept)):
        scan.keys.append(key)
        scan.locators.append(s.locator)
        scan.displays.append(s.display)
        scan.labels.append(s.label)
        scan.metadata.append(s.metadata)
        kept[i] = None
    scan.problems = list(problems)
    scan.label_source = {"boxes": "tfrecord image/object/bbox (TF Object Detection API)",
                         "class": "tfrecord image/class/label", "objects": "tfrecord packer/label",
                         "none": "tfrecord (no labels)"}[schema] + (f" + {LABEL_MAP}" if label_map else "")
    return scan


def _max_class(label) -> int:
    if isinstance(label, (int, np.integer)):
        return int(label)
    if isinstance(label, np.ndarray):
        return int(label[:, 0].max()) if len(label) else -1
    if isinstance(label, dict):
        ids = [o.get("class") for o in label.get("objects", [])] + [label.get("class")]
        return max((i for i in ids if isinstance(i, int)), default=-1)
    return -1


# --- export --------------------------------------------------------------------------------------

def corners_of(rows: np.ndarray) -> np.ndarray:
    """float32 ``(N, 4)`` ``xmin ymin xmax ymax`` of float32 YOLO rows (computed in float64)."""
    r = np.asarray(rows, np.float32).reshape(-1, 5).astype(np.float64)
    return np.stack([r[:, 1] - r[:, 3] / 2, r[:, 2] - r[:, 4] / 2,
                     r[:, 1] + r[:, 3] / 2, r[:, 2] + r[:, 4] / 2], axis=1).astype(np.float32)


def _box_features(rows: np.ndarray, class_names: list) -> tuple:
    """``(features, exact)``: TF OD box features of YOLO ``rows``; ``exact`` when scanning them
    gives ``rows`` back bit for bit (else packer/label must carry the label)."""
    rows = np.asarray(rows, np.float32).reshape(-1, 5)
    corners = corners_of(rows)
    ids = rows[:, 0]
    integral = bool(np.all((ids >= 0) & (ids == np.round(ids))))
    inside = bool(np.all((corners >= 0) & (corners <= 1)))
    feats = {k: ([float(v) for v in corners[:, i]], "float") for i, k in enumerate(_BOX_KEYS)}
    feats["image/object/class/label"] = ([int(v) for v in ids], "int")
    if class_names and integral and all(int(v) < len(class_names) for v in ids):
        feats["image/object/class/text"] = ([class_names[int(v)].encode("utf-8") for v in ids], "byte")
    exact = False
    if integral and inside:
        back = _rows(corners, [(int(v), None) for v in ids], _Names())
        exact = back.tobytes() == rows.tobytes()
    return feats, exact


def _label_features(label, schema: str, class_names: list) -> dict:
    """The TF OD features of one stored label, plus packer/label where they would not give it back."""
    feats, exact = {}, False
    if schema == "class" and isinstance(label, (int, np.integer)) and label >= 0:
        feats["image/class/label"] = (int(label), "int")
        if int(label) < len(class_names):
            feats["image/class/text"] = (class_names[int(label)].encode("utf-8"), "byte")
        exact = True
    elif schema == "boxes" and label is not None:
        feats, exact = _box_features(label, class_names)
    elif schema == "objects" and isinstance(label, dict):
        boxed = [o for o in label.get("objects", []) if "box" in o and isinstance(o.get("class"), int)]
        rows = np.asarray([[o["class"], *o["box"]] for o in boxed], np.float32).reshape(-1, 5)
        if len(rows) and np.all(np.isfinite(rows)):
            feats, _ = _box_features(rows, class_names)
    elif schema == "none":
        exact = True
    if not exact:
        feats[PACKER_LABEL] = (json.dumps(label_to_json(label), separators=(",", ":")).encode(), "byte")
    return feats


def iter_store(reader, batch: int = 256) -> Iterator:
    """Every record of an open store, in index order, each checked against its checksum (as
    ``packer export`` reads them).

    Raises:
        RecordError: a record's bytes do not match their checksum (repair the store first).
    """
    for start in range(0, reader.metadata.count, batch):
        for rec in reader.get_many(range(start, min(start + batch, reader.metadata.count))):
            if not rec.data_ok():
                raise RecordError(reader.location, rec.key, "checksum mismatch (hint: packer repair first)",
                                  rec.index)
            yield rec


def _image(rec, reader) -> tuple:
    """``(bytes, format)`` to write: the stored JPEG, or PNG for a store of decoded pixels."""
    if reader.encoding != "raw":
        return bytes(rec.data), "jpeg"
    import cv2

    arr = np.frombuffer(bytes(rec.data), np.uint8).reshape(reader.raw_shape)
    ok, buf = cv2.imencode(".png", cv2.cvtColor(arr, cv2.COLOR_RGB2BGR) if arr.shape[2] == 3 else arr)
    if not ok:
        raise RecordError(reader.location, rec.key, "PNG encode failed", rec.index)
    return buf.tobytes(), "png"


def _datum(rec, reader, schema: str, class_names: list) -> dict:
    data, fmt = _image(rec, reader)
    key = rec.key.encode("utf-8")
    datum = {"image/encoded": (data, "byte"), "image/format": (fmt.encode(), "byte"),
             "image/filename": (key, "byte"), "image/source_id": (key, "byte"),
             "image/height": (int(rec.height), "int"), "image/width": (int(rec.width), "int")}
    datum.update(_label_features(rec.label, schema, class_names))
    if rec.metadata:
        datum[PACKER_METADATA] = (json.dumps(rec.metadata, separators=(",", ":")).encode(), "byte")
    return datum


class _ShardWriter:
    """``<out>/<prefix>-IIIII-of-NNNNN.tfrecord`` + ``.tfindex`` files of ``size`` records each."""

    def __init__(self, out: str, prefix: str, size: int, total: int, writer_cls):
        self.out, self.prefix, self.size, self.writer_cls = out, prefix, size, writer_cls
        self.shards = max(1, math.ceil(total / size))
        self.files, self.writer, self.index, self.count = [], None, [], 0

    def write(self, datum: dict) -> None:
        if self.count % self.size == 0:
            self.close()
            name = f"{self.prefix}-{len(self.files):05d}-of-{self.shards:05d}.tfrecord"
            self.files.append(os.path.join(self.out, name))
            self.writer = self.writer_cls(self.files[-1])
        start = self.writer.file.tell()
        self.writer.write(datum)
        self.index.append(f"{start} {self.writer.file.tell() - start}\n")
        self.count += 1

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        with open(os.path.splitext(self.files[-1])[0] + ".tfindex", "w") as fh:
            fh.writelines(self.index)
        self.writer, self.index = None, []


def export(reader, out, options: Optional[ExportOptions] = None) -> ExportResult:
    """Write every record of the open store ``reader`` as TFRecord shards under ``out`` (a new or
    empty folder): see the module doc for the features and files.

    Raises:
        UsageError: ``out`` is not a new or empty folder, or ``shard_size`` < 1.
        RecordError: a record fails its checksum.
        DiskFullError: the disk filled up (``out`` then holds a partial export).
        DependencyError: the tfrecord package is missing.
    """
    from ..diskspace import disk_full, is_disk_full, require_room
    from ..outputs import check_output

    options = options or ExportOptions()
    if options.shard_size < 1:
        raise UsageError(f"shard size must be at least 1, got {options.shard_size}")
    try:
        from tfrecord import TFRecordWriter
    except ImportError as exc:
        raise DependencyError(f"exporting TFRecord needs the tfrecord package: {_INSTALL}") from exc
    out = os.fspath(out)
    check_output(out, inputs=[("store", reader.location)], kind="folder")
    os.makedirs(out, exist_ok=True)
    meta = reader.metadata
    names, schema = list(meta.class_names), meta.label_schema
    result = ExportResult(out)
    room = dict(needed=reader.size_bytes(), what=f"the TFRecord export ({meta.count} records)",
                note=f"{out} holds a partial export: remove it before rerunning")
    require_room(out, room["needed"], what=room["what"])
    shards = _ShardWriter(out, options.prefix, options.shard_size, meta.count, TFRecordWriter)
    try:
        for rec in iter_store(reader):
            shards.write(_datum(rec, reader, schema, names))
        shards.close()
        if names and write_label_map(os.path.join(out, LABEL_MAP), names):
            result.notes.append(f"class names in {LABEL_MAP}")
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(out, cause=exc, **room) from exc
        raise
    result.records, result.shards = shards.count, list(shards.files)
    if names and names[0] != placeholder(0):
        result.notes.append(f"class ids are written as stored, from 0 ({names[0]!r}); the TF Object "
                            f"Detection API reserves id 0 for the background")
    if reader.encoding == "raw":
        result.notes.append("the store holds decoded pixels: images written as PNG")
    return result


#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat(NAME, detect, scan, export)

__all__ = ["FORMAT", "scan", "export", "detect", "list_files", "expand_braces",
           "iter_records", "encoded_range", "read_label_map", "write_label_map", "corners_of",
           "iter_store", "placeholder", "PACKER_LABEL", "PACKER_METADATA", "LABEL_MAP"]
