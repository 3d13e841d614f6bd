"""Hugging Face ``datasets`` as a build source and an export target (``--from hf`` / ``--to hf``).

**In** (read with pyarrow alone: the ``datasets`` library is not needed to import):

* a folder written by ``Dataset.save_to_disk`` (``state.json`` + ``data-NNNNN-of-NNNNN.arrow``),
  or by ``DatasetDict.save_to_disk`` (``dataset_dict.json`` + one such folder per split);
* parquet: one file, a folder of ``*.parquet``, a glob pattern, or the hub layout
  ``data/{split}-00000-of-0000N.parquet``.

With several splits, ``ScanOptions.split`` picks one (default ``"train"``; an unknown split is a
UsageError listing those there are). The image column is the only ``Image`` feature of the schema
(``ScanOptions.image_column`` otherwise); its ``{bytes, path}`` struct gives the bytes exactly as
stored and the key: the ``path`` field when every row has one and they are unique, else
``<split>/<row>.<ext>`` (row: the index in the split, ext from the magic bytes). Labels:

* ``ClassLabel`` (the column ``label``/``labels``, the only ClassLabel, or
  ``ScanOptions.label_column``): class ids, the feature's names as the class names; a string
  column gives its sorted distinct values as the class names;
* ``objects: {bbox, category}`` (the common detection layout, COCO ``[x, y, w, h]`` pixel boxes):
  ``"boxes"`` YOLO rows ``class cx cy w h`` normalized by the image size from its header;
* ``packer_label`` (what :func:`export` writes beside them): packer's own label JSON, exact.

A row with an image but no label (null, or ClassLabel's ``-1``) is a problem unless
``allow_unlabeled``. A row group (parquet) or record batch (arrow) that cannot be read is one
problem naming the file and the rows lost; the other row groups are kept.

**Memory**: the scan reads ``_BATCH_ROWS`` rows at a time and keeps no image bytes. Arrow files
(``save_to_disk``, uncompressed) give ``("range", file, offset, size)`` locators: the bytes lie
as they are in the file. Parquet pages are compressed, so :attr:`Scan.locators` is then a
:class:`LazyLocators` sequence that reads a sample's bytes when the build asks for it, through one
streaming cursor (the build asks in order): at most one batch of one row group in memory.

**Out**: ``<out>/data/train-00000-of-0000N.parquet`` shards of ``shard_size`` rows (the hub
layout ``datasets.load_dataset("parquet")`` and the dataset viewer read) with the features
``image: Image()``, ``label: ClassLabel(names)`` (class stores) or ``objects: Sequence({bbox,
category})`` (box stores, COCO pixel boxes), and ``packer_label`` (packer's label JSON, exact
where pixel boxes in float32 are not) and ``packer_metadata`` (the records' metadata) columns.

Example:
    >>> from packer.interchange import ScanOptions, get_format
    >>> scan = get_format("hf").scan("cppe5/", ScanOptions(split="train"))   # doctest: +SKIP
    >>> scan.label_schema, scan.class_names[:2]                            # doctest: +SKIP
    ('boxes', ['Coverall', 'Face_Shield'])
"""
from __future__ import annotations

import glob
import json
import logging
import math
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import DependencyError, RecordError, SourceError, UsageError
from ..integrity import header_dimensions, sniff_format
from ..records import label_from_json, label_to_json, loads_bounded
from .base import ExportOptions, ExportResult, Scan, ScanOptions, InterchangeFormat

log = logging.getLogger(__name__)

#: Rows per batch read (scan and lazy reads): bounds the bytes in memory at once.
_BATCH_ROWS = 64
#: Read buffer of a parquet column chunk: pages stream through it (not the whole chunk at once).
_READ_BUFFER = 1 << 20
#: Export: rows per parquet row group, and bytes buffered before one is written.
_GROUP_ROWS = 100
_GROUP_BYTES = 64 << 20
_EXTENSIONS = {"jpeg": "jpg", "tiff": "tif"}
#: ``train-00000-of-00003.parquet`` / ``data-00000-of-00001.arrow``: the split before the number.
_SHARD_NAME = re.compile(r"^(?P<split>.+?)-\d+-of-\d+\.(?:parquet|arrow)$")
_SPLIT_NAMES = {"train", "test", "validation", "valid", "val", "dev"}
#: The group of parquet files whose names give no split (``part-0.parquet``).
_OTHER = "(files with no split in the name)"
_META_KEY = b"huggingface"
_PACKER_KEY = b"packer"


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DependencyError("Hugging Face datasets input and output need pyarrow "
                              "(pip install 'packer-vision[interchange]')") from exc
    return pa, pq


def _release() -> None:
    """Hand the memory of the batches read so far back to the system: Arrow's default allocator
    (mimalloc) keeps freed pages otherwise, and the process grows by tens of MB per row group."""
    pa, _ = _pyarrow()
    pa.default_memory_pool().release_unused()


def _data_errors() -> tuple:
    """What pyarrow raises for damaged data (ArrowInvalid is a ValueError, IO errors OSErrors)."""
    pa, _ = _pyarrow()
    return (pa.ArrowException, OSError, ValueError, EOFError)


def _why(exc: BaseException) -> str:
    """An exception's message on one printable line (pyarrow's hold newlines and raw bytes)."""
    text = "".join(c if c.isprintable() else " " for c in str(exc))
    return " ".join(text.split()) or type(exc).__name__


# ---------------------------------------------------------------------------------------
# Detection and layout
# ---------------------------------------------------------------------------------------
def _head(path: str, n: int = 8) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


def _is_parquet(path: str) -> bool:
    return path.endswith(".parquet") or _head(path, 4) == b"PAR1"


def _is_arrow(path: str) -> bool:
    if not path.endswith(".arrow"):
        return False
    head = _head(path, 6)
    return head[:4] == b"\xff\xff\xff\xff" or head == b"ARROW1"


def _parquet_in(folder: str) -> list:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".parquet"))
    return [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]


def detect(path) -> bool:
    """True for a ``save_to_disk`` folder, a parquet file, folder or pattern (hub layout)."""
    text = os.fspath(path)
    try:
        if os.path.isdir(text):
            names = set(os.listdir(text))
            if "dataset_dict.json" in names or {"state.json", "dataset_info.json"} <= names:
                return True
            data = os.path.join(text, "data")
            return bool(_parquet_in(text)) or (os.path.isdir(data) and bool(_parquet_in(data)))
        if os.path.isfile(text):
            return _is_parquet(text) or _is_arrow(text)
        if any(c in text for c in "*?["):
            found = sorted(glob.glob(text))
            return bool(found) and all(os.path.isfile(p) and _is_parquet(p) for p in found[:4])
    except OSError:
        return False
    return False


def _split_of(name: str) -> Optional[str]:
    m = _SHARD_NAME.match(name)
    if m:
        return m.group("split")
    stem = name.rsplit(".", 1)[0]
    return stem if stem in _SPLIT_NAMES else None


def _choose(splits, wanted: Optional[str], where: str) -> str:
    """The split to read: ``wanted``, the only one, or ``train``."""
    splits = sorted(splits, key=str)
    if wanted is not None:
        if wanted not in splits:
            raise UsageError(f"{where}: no split {wanted!r}; splits: {', '.join(map(str, splits))}")
        return wanted
    if len(splits) == 1:
        return splits[0]
    if "train" in splits:
        return "train"
    raise UsageError(f"{where}: several splits ({', '.join(map(str, splits))}) and no 'train': "
                     f"name one with --split")


def _load_json(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            value = loads_bounded(fh.read(1 << 24))
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot read: {exc}", [f"{path}: {exc}"]) from exc
    if not isinstance(value, dict):
        raise SourceError(f"{path}: expected a JSON object", [f"{path}: not a JSON object"])
    return value


@dataclass
class _Layout:
    files: list          # in reading order
    kind: str            # "parquet" | "arrow"
    split: str           # for keys of rows with no path
    root: str            # displays are relative to this


def _saved_dataset(folder: str, split: Optional[str]) -> _Layout:
    """A ``Dataset.save_to_disk`` folder: the arrow files in ``state.json`` order."""
    state = _load_json(os.path.join(folder, "state.json"))
    names = [d.get("filename") for d in state.get("_data_files") or [] if isinstance(d, dict)]
    files = [os.path.join(folder, n) for n in names if isinstance(n, str) and "/" not in n and n not in ("", "..")]
    if not files:
        files = sorted(glob.glob(os.path.join(glob.escape(folder), "*.arrow")))
    saved_split = state.get("_split") if isinstance(state.get("_split"), str) else None
    return _Layout(files, "arrow", split or saved_split or "train", folder)


def _layout(text: str, split: Optional[str]) -> _Layout:
    """Which files to read, and as which split.

    Raises:
        UsageError: an unknown split, or several and none chosen.
        SourceError: nothing readable there.
    """
    if os.path.isdir(text):
        dict_file = os.path.join(text, "dataset_dict.json")
        if os.path.isfile(dict_file):
            splits = [s for s in _load_json(dict_file).get("splits") or [] if isinstance(s, str)]
            chosen = _choose(splits, split, text)
            if "/" in chosen or chosen in ("", ".", ".."):
                raise SourceError(f"{dict_file}: bad split name {chosen!r}", [f"{dict_file}: split {chosen!r}"])
            layout = _saved_dataset(os.path.join(text, chosen), chosen)
            layout.root = text
            return layout
        if os.path.isfile(os.path.join(text, "state.json")):
            return _saved_dataset(text, split)
        files = _parquet_in(text) + (_parquet_in(os.path.join(text, "data"))
                                     if os.path.isdir(os.path.join(text, "data")) else [])
        root = text
    elif os.path.isfile(text):
        files, root = [text], os.path.dirname(text)
        if _is_arrow(text):
            return _Layout(files, "arrow", split or _split_of(os.path.basename(text)) or "train", root)
    else:
        files, root = sorted(p for p in glob.glob(text) if os.path.isfile(p)), os.path.dirname(text)
    if not files:
        raise SourceError(f"{text}: no parquet or arrow file found", [f"{text}: nothing to read"])
    if all(f.endswith(".arrow") for f in files):   # a pattern of arrow files
        return _Layout(files, "arrow", split or "train", root)
    groups: dict = {}
    for f in files:
        groups.setdefault(_split_of(os.path.basename(f)) or _OTHER, []).append(f)
    if len(groups) == 1 and split is None:
        (name, chosen), = groups.items()
        return _Layout(chosen, "parquet", name if name != _OTHER else "train", root)
    name = _choose(list(groups), split, text)
    return _Layout(groups[name], "parquet", name if name != _OTHER else "train", root)


# ---------------------------------------------------------------------------------------
# Columns
# ---------------------------------------------------------------------------------------
def _features(schema) -> dict:
    """The ``datasets`` features JSON of an arrow schema (``{}`` when absent or unreadable)."""
    raw = (schema.metadata or {}).get(_META_KEY)
    if not raw:
        return {}
    try:
        info = loads_bounded(raw)
        feats = info.get("info", {}).get("features")
    except (ValueError, AttributeError):
        log.warning("unreadable 'huggingface' schema metadata: column types taken from arrow")
        return {}
    return feats if isinstance(feats, dict) else {}


def _packer_meta(schema) -> dict:
    raw = (schema.metadata or {}).get(_PACKER_KEY)
    try:
        value = loads_bounded(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _inner(spec):
    """A feature inside Sequence/List wrappers (``{"_type": "Sequence", "feature": ...}``)."""
    while isinstance(spec, dict) and spec.get("_type") in ("Sequence", "List", "LargeList"):
        spec = spec.get("feature")
    return spec


def _class_names(spec) -> Optional[list]:
    spec = _inner(spec)
    if isinstance(spec, dict) and spec.get("_type") == "ClassLabel":
        names = spec.get("names")
        return [str(n) for n in names] if isinstance(names, list) else []
    return None


def _is_image_struct(typ) -> bool:
    pa, _ = _pyarrow()
    return (pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0
            and typ.get_field_index("path") >= 0)


@dataclass
class _Columns:
    image: str
    label: Optional[str] = None       # a class column
    objects: Optional[str] = None     # the detection struct
    packer: bool = False              # packer_label column present
    metadata: bool = False            # packer_metadata column present
    schema: str = "none"              # label schema
    class_names: list = field(default_factory=list)
    strings: bool = False             # class labels given as strings
    box_fields: tuple = ("bbox", "category")

    @property
    def read(self) -> list:
        cols = [self.image, self.label, self.objects]
        cols += ["packer_label"] if self.packer else []
        cols += ["packer_metadata"] if self.metadata else []
        return [c for c in cols if c]


def _pick_image(schema, feats: dict, wanted: Optional[str], where: str) -> str:
    names = schema.names
    if wanted is not None:
        if wanted not in names:
            raise UsageError(f"{where}: no column {wanted!r}; columns: {', '.join(names)}")
        return wanted
    found = [n for n in names if isinstance(feats.get(n), dict) and feats[n].get("_type") == "Image"]
    if not feats:
        found = [n for n in names if _is_image_struct(schema.field(n).type)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise UsageError(f"{where}: no Image column (columns: {', '.join(names)}); name it with --image-column")
    raise UsageError(f"{where}: several Image columns ({', '.join(found)}): choose one with --image-column")


def _box_fields(typ) -> Optional[tuple]:
    """(bbox field, class field) of an ``objects`` column: struct of lists or list of structs."""
    pa, _ = _pyarrow()
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        typ = typ.value_type
    if not pa.types.is_struct(typ) or typ.get_field_index("bbox") < 0:
        return None
    for name in ("category", "categories", "label", "labels"):
        if typ.get_field_index(name) >= 0:
            return "bbox", name
    return None


def _pick_label(schema, feats: dict, options: ScanOptions, cols: _Columns, where: str) -> None:
    names = schema.names
    objects = "objects" if "objects" in names and _box_fields(schema.field("objects").type) else None
    if options.label_column is not None:
        if options.label_column not in names:
            raise UsageError(f"{where}: no column {options.label_column!r}; columns: {', '.join(names)}")
        chosen = options.label_column
        if _box_fields(schema.field(chosen).type):
            objects = chosen
    else:
        classes = [n for n in names if isinstance(feats.get(n), dict) and feats[n].get("_type") == "ClassLabel"]
        named = [n for n in ("label", "labels") if n in names]
        chosen = named[0] if len(named) == 1 else (classes[0] if len(classes) == 1 and not named else None)
        if chosen is None and (named or classes):
            raise UsageError(f"{where}: several label columns ({', '.join(sorted(set(named + classes)))}): "
                             f"choose one with --label-column")
        if chosen and objects:
            raise UsageError(f"{where}: both a class column ({chosen!r}) and boxes ({objects!r}): "
                             f"choose one with --label-column")
    if objects and (options.label_column is None or options.label_column == objects):
        cols.objects, cols.schema, cols.box_fields = objects, "boxes", _box_fields(schema.field(objects).type)
        spec = _inner(feats.get(objects))
        if isinstance(spec, dict):
            cols.class_names = _class_names(spec.get(cols.box_fields[1])) or []
        return
    if chosen:
        _class_column(schema, feats, chosen, cols, where)


def _class_column(schema, feats: dict, name: str, cols: _Columns, where: str) -> None:
    pa, _ = _pyarrow()
    typ = schema.field(name).type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        cols.strings = True
    elif not (pa.types.is_integer(typ) or pa.types.is_boolean(typ)):
        raise UsageError(f"{where}: column {name!r} is {typ}, not a class id (ClassLabel, integer or string); "
                         f"choose another with --label-column, or build with --no-labels")
    cols.label, cols.schema = name, "class"
    cols.class_names = _class_names(feats.get(name)) or []


def _columns(schema, options: ScanOptions, where: str) -> _Columns:
    """Which columns hold the image, the label and packer's own fields."""
    feats = _features(schema)
    cols = _Columns(_pick_image(schema, feats, options.image_column, where))
    typ = schema.field(cols.image).type
    pa, _ = _pyarrow()
    if not (_is_image_struct(typ) or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
        raise UsageError(f"{where}: column {cols.image!r} is {typ}, not an image ({{bytes, path}} or binary)")
    _pick_label(schema, feats, options, cols, where)
    names = schema.names
    cols.packer = "packer_label" in names and options.label_column is None
    cols.metadata = "packer_metadata" in names
    meta = _packer_meta(schema)
    if cols.packer and meta.get("label_schema") in ("class", "boxes", "objects", "none"):
        cols.schema = meta["label_schema"]
        names_ = meta.get("class_names")
        cols.class_names = [str(n) for n in names_] if isinstance(names_, list) else cols.class_names
    return cols


# ---------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------
def _boxes(value, fields: tuple, size) -> np.ndarray:
    """COCO ``[x, y, w, h]`` pixel boxes -> float32 ``(N, 5)`` YOLO rows; ValueError says why not."""
    bbox_name, class_name = fields
    if isinstance(value, list):   # a list of {bbox, category} structs
        boxes = [o.get(bbox_name) for o in value]
        classes = [o.get(class_name) for o in value]
    else:
        boxes, classes = value.get(bbox_name) or [], value.get(class_name) or []
    if len(boxes) != len(classes):
        raise ValueError(f"{len(boxes)} boxes but {len(classes)} categories")
    if not boxes:
        return np.zeros((0, 5), np.float32)
    if size is None:
        raise ValueError("the image header gives no size to normalize the boxes by")
    width, height = size
    rows = []
    for box, cls in zip(boxes, classes):
        if not isinstance(cls, (int, np.integer)) or isinstance(cls, bool) or cls < 0:
            raise ValueError(f"category {cls!r} is not a class id")
        if box is None or len(box) != 4 or any(v is None for v in box):
            raise ValueError(f"bbox {box!r} is not [x, y, w, h]")
        x, y, w, h = (float(v) for v in box)
        rows.append([cls, (x + w / 2) / width, (y + h / 2) / height, w / width, h / height])
    arr = np.asarray(rows, np.float32)
    if not np.isfinite(arr).all():
        raise ValueError("a box is not finite")
    return arr


@dataclass
class _Values:
    """One row's values, as read."""
    label: object = None
    objects: object = None
    packer: Optional[str] = None
    metadata: Optional[str] = None


def _label(cols: _Columns, v: _Values, data_of) -> object:
    """The packer label of one row (None: unlabeled); ValueError says why it cannot be read."""
    if cols.packer and v.packer is not None:
        value = loads_bounded(v.packer)
        if isinstance(value, dict):   # label-model dicts, whatever columns sit beside them
            cols.schema = "objects"
            return value
        return label_from_json(value, "boxes" if isinstance(value, list) else cols.schema)
    if cols.schema == "class":
        if v.label is None or (not cols.strings and int(v.label) < 0):
            return None
        if cols.strings:
            return str(v.label)
        label = int(v.label)
        if cols.class_names and label >= len(cols.class_names):
            raise ValueError(f"label {label} but only {len(cols.class_names)} class names")
        return label
    if cols.schema == "boxes" and cols.objects:
        if v.objects is None:
            return None
        needs_size = bool(v.objects) if isinstance(v.objects, list) else bool(v.objects.get(cols.box_fields[0]))
        data = data_of() if needs_size else b""
        return _boxes(v.objects, cols.box_fields, header_dimensions(data, sniff_format(data[:16]))
                      if needs_size else None)
    return None


def _metadata(text: Optional[str]) -> dict:
    if text is None:
        return {}
    value = loads_bounded(text)
    if not isinstance(value, dict):
        raise ValueError("packer_metadata is not a JSON object")
    return value


# ---------------------------------------------------------------------------------------
# Scanning
# ---------------------------------------------------------------------------------------
@dataclass
class _Row:
    where: tuple          # a locator, or a lazy entry ("parquet"|"arrow", file, unit, row)
    display: str
    row: int              # index in the split
    path: Optional[str]
    ext: str
    label: object
    metadata: dict


class _Scanner:
    """The state of one scan: the split's rows so far, the problems, the columns."""

    def __init__(self, layout: _Layout, options: ScanOptions, where: str):
        self.layout, self.options, self.where = layout, options, where
        self.cols: Optional[_Columns] = None
        self.rows: list = []
        self.problems: list = []
        self.next_row = 0     # index in the split of the next row

    def rel(self, path: str) -> str:
        return Path(os.path.relpath(path, self.layout.root)).as_posix()

    def problem(self, where: str, reason: str, kind: str = "damaged") -> None:
        log.warning("%s: %s", where, reason, extra={"packer_damaged_input": True})
        self.problems.append({"path": where, "reason": reason, "kind": kind})

    def columns_for(self, schema, rel: str) -> Optional[_Columns]:
        """The columns (chosen on the first file); None when this file lacks them."""
        if self.cols is None:
            self.cols = _columns(schema, self.options, self.where)
            return self.cols
        missing = [c for c in self.cols.read if c not in schema.names]
        if missing:
            self.problem(rel, f"no column {', '.join(missing)} (the first file has it): file skipped")
            return None
        return self.cols

    def take(self, batch, rel: str, entry, ranges=None) -> list:
        """The rows of one record batch. ``entry(i)`` is the lazy entry of its row ``i``;
        ``ranges`` (arrow) the ``(offset, size)`` of each row's bytes in the file."""
        cols = self.cols
        img = batch.column(batch.schema.get_field_index(cols.image))
        data, paths = _image_parts(img)
        n = batch.num_rows
        columns = [batch.column(batch.schema.get_field_index(c)).to_pylist() if c else [None] * n for c in
                   (cols.label, cols.objects, "packer_label" if cols.packer else None,
                    "packer_metadata" if cols.metadata else None)]
        out = []
        for i in range(n):
            row = self.next_row + i
            display = f"{rel}:row {row}"
            v = _Values(*(col[i] for col in columns))
            got = self._one(data, paths, i, display, v, entry, ranges)
            if got is not None:
                out.append(_Row(got[0], display, row, paths[i], got[1], got[2], got[3]))
        self.next_row += batch.num_rows
        del data, img
        _release()
        return out

    def _one(self, data, paths, i, display, v: _Values, entry, ranges):
        """(locator, ext, label, metadata) of one row, or None (a problem was recorded)."""
        if data[i].is_valid:
            buf = data[i].as_buffer()
            where = ("range", entry(i)[1], *ranges[i]) if ranges is not None else entry(i)
            head = buf[:16].to_pybytes()
        else:   # Image() of local files, not embedded: the path is all there is
            buf, where = None, _local_file(paths[i], self.layout.root)
            try:
                head = _head(where, 16) if where else None
            except OSError as exc:
                head, paths[i] = None, f"{paths[i]} ({exc.strerror or exc})"
            if head is None:
                self.problem(display, f"no image bytes, and its path {paths[i]!r} is no readable file")
                return None
        kind = sniff_format(head)
        ext = _EXTENSIONS.get(kind, kind if kind not in ("empty", "unknown") else "bin")

        def data_of():
            return buf.to_pybytes() if buf is not None else Path(where).read_bytes()

        try:
            label = _label(self.cols, v, data_of)
            metadata = _metadata(v.metadata)
        except (ValueError, TypeError, OSError) as exc:
            self.problem(display, f"unusable label: {_why(exc)}", "bad label")
            return None
        if label is None and self.cols.schema != "none" and not self.options.allow_unlabeled:
            self.problem(display, f"an image but no label ({_source_name(self.cols)} is empty)", "unlabeled")
            return None
        return where, ext, label, metadata


def _image_parts(img):
    """(bytes array, list of paths or Nones) of an image column."""
    pa, _ = _pyarrow()
    if pa.types.is_struct(img.type):
        parts = img.flatten()
        typ = img.type
        data = parts[typ.get_field_index("bytes")]
        paths = parts[typ.get_field_index("path")].to_pylist()
        return data, paths
    return img, [None] * len(img)


def _local_file(path: Optional[str], root: str) -> Optional[str]:
    """A path-only image (``Image()`` of local files, not embedded): the file, when it exists."""
    if not path:
        return None
    for p in (path, os.path.join(root, path)):
        if os.path.isfile(p):
            return p
    return None


def _scan_parquet(sc: _Scanner, path: str) -> None:
    _, pq = _pyarrow()
    errors = _data_errors()
    rel = sc.rel(path)
    try:
        pf = pq.ParquetFile(path, buffer_size=_READ_BUFFER, pre_buffer=False, page_checksum_verification=True)
        meta = pf.metadata
    except errors as exc:
        sc.problem(rel, f"not a readable parquet file (footer): {_why(exc)}")
        return
    with pf:
        if sc.columns_for(pf.schema_arrow, rel) is None:
            sc.next_row += meta.num_rows
            return
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            first, rows, start, mark = sc.next_row, [], 0, len(sc.problems)
            try:
                for batch in pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], columns=sc.cols.read,
                                             use_threads=False):
                    rows += sc.take(batch, rel, lambda i, s=start: ("parquet", path, group, s + i))
                    start += batch.num_rows
            except errors as exc:
                del sc.problems[mark:]   # its rows are lost as a whole
                sc.problem(f"{rel}:row group {group}", f"cannot read rows {first}-{first + n - 1}: {_why(exc)}")
                rows = []
            sc.rows += rows
            sc.next_row = first + n


def _arrow_batches(path: str, start: int = 0):
    """``(index, batch, body buffer, body offset in the file)`` per record batch of an Arrow IPC
    stream (``save_to_disk``) or file; batches before ``start`` are skipped undecoded."""
    pa, _ = _pyarrow()
    with pa.OSFile(path) as fh:
        if fh.read(6) == b"ARROW1":   # the file format: a stream after 8 bytes, a footer after it
            fh.seek(8)
        else:
            fh.seek(0)
        messages = pa.ipc.MessageReader.open_stream(fh)
        schema, index = None, 0
        while True:
            try:
                msg = messages.read_next_message()
            except StopIteration:
                return
            if msg.type == "schema":
                schema = pa.ipc.read_schema(msg)
            elif msg.type == "record batch":
                if schema is None:
                    raise ValueError("a record batch before the schema")
                if index >= start:
                    end = fh.tell()
                    yield index, pa.ipc.read_record_batch(msg, schema), msg.body, end - msg.body.size
                index += 1
            else:
                raise ValueError(f"unsupported Arrow IPC message {msg.type!r} (dictionary-encoded column?)")


def _ranges(data, body, body_offset: int) -> Optional[list]:
    """``(offset, size)`` in the file of each value of a binary array that lies, uncompressed, in
    an IPC message body; None when the values are not there (a compressed body)."""
    pa, _ = _pyarrow()
    bufs = data.buffers()
    if len(bufs) < 3 or bufs[1] is None:
        return None
    if bufs[2] is None:   # every value empty or null
        return [(body_offset, 0)] * len(data)
    dtype = np.int64 if pa.types.is_large_binary(data.type) else np.int32
    offs = np.frombuffer(bufs[1], dtype=dtype)[data.offset:data.offset + len(data) + 1]
    base = bufs[2].address - body.address
    if base < 0 or base + bufs[2].size > body.size:
        return None
    return [(body_offset + base + int(offs[i]), int(offs[i + 1] - offs[i])) for i in range(len(data))]


def _scan_arrow(sc: _Scanner, path: str) -> None:
    errors = _data_errors()
    rel = sc.rel(path)
    current = 0   # the record batch being read
    try:
        for index, batch, body, body_offset in _arrow_batches(path):
            current = index
            if index == 0 and sc.columns_for(batch.schema, rel) is None:
                return
            batch.validate(full=True)   # offsets inside their buffers: a damaged batch stops here
            batch = batch.select(sc.cols.read)
            data, _ = _image_parts(batch.column(0))
            ranges = _ranges(data, body, body_offset)
            if ranges is not None and not _range_ok(path, data, ranges):
                ranges = None
            sc.rows += sc.take(batch, rel, lambda i, k=index: ("arrow", path, k, i), ranges)
            current = index + 1
    except errors as exc:
        sc.problem(f"{rel}:record batch {current}",
                   f"cannot read record batch {current} and the rest of the file (rows from {sc.next_row}): "
                   f"{_why(exc)}")


def _range_ok(path: str, data, ranges: list) -> bool:
    """The first non-empty value's range, read from the file, equals the value (else the offsets
    are not file offsets: fall back to reading the bytes through the batch)."""
    for i, (offset, size) in enumerate(ranges):
        if size and data[i].is_valid:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read(size) == data[i].as_py()
    return True


def _safe_key(path: Optional[str]) -> Optional[str]:
    """The ``path`` field as a store key: a relative POSIX path as it is, else its base name."""
    from ..export import safe_relative

    if not path:
        return None
    path = path.replace("\\", "/")
    if safe_relative(path) is None:
        return path
    base = posixpath.basename(path)
    return base if base and safe_relative(base) is None else None


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List the samples of a Hugging Face dataset (see the module docstring).

    Raises:
        UsageError: an unknown split, or the image/label column is ambiguous or missing.
        SourceError: the folder's ``state.json``/``dataset_dict.json`` cannot be read, or no file.
        DependencyError: pyarrow is not installed.
    """
    options = options or ScanOptions()
    text = os.fspath(path)
    layout = _layout(text, options.split)
    sc = _Scanner(layout, options, text)
    for f in layout.files:
        (_scan_arrow if layout.kind == "arrow" else _scan_parquet)(sc, f)
    out = Scan(root=text, problems=sc.problems, fingerprint=_fingerprint(layout.files))
    cols = sc.cols
    if cols is None:
        return out
    keys = [_safe_key(r.path) for r in sc.rows]
    if not all(keys) or len(set(keys)) != len(keys):
        keys = [f"{layout.split}/{r.row}.{r.ext}" for r in sc.rows]
    labels = [r.label for r in sc.rows]
    if cols.schema == "objects":
        from ..labels.model import as_label_model

        labels = [as_label_model(lab) for lab in labels]
    names = list(cols.class_names)
    if cols.strings:
        names = sorted({lab for lab in labels if isinstance(lab, str)})
        ids = {n: i for i, n in enumerate(names)}
        labels = [ids[lab] if isinstance(lab, str) else lab for lab in labels]
    out.keys, out.labels, out.class_names, out.label_schema = keys, labels, names, cols.schema
    out.displays = [r.display for r in sc.rows]
    out.metadata = [r.metadata for r in sc.rows]
    out.locators = LazyLocators([r.where for r in sc.rows], cols.image)
    out.label_source = f"hf {layout.kind} ({_source_name(cols)})"
    return out


def _fingerprint(files: list) -> list:
    out = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue   # listed as a problem by the scan
        out.append((f, st.st_size, st.st_mtime_ns))
    return out


def _source_name(cols: _Columns) -> str:
    if cols.packer:
        return "packer_label"
    return {"class": f"column {cols.label!r}", "boxes": f"column {cols.objects!r} (COCO xywh)"}.get(
        cols.schema, "no labels")


# ---------------------------------------------------------------------------------------
# Lazy locators
# ---------------------------------------------------------------------------------------
class LazyLocators(Sequence):
    """The scan's locators: ready ones (``range``, a path) as they are, and parquet/compressed
    arrow rows read when asked for, as ``("bytes", data)``.

    One streaming cursor serves the reads: asked in order (as the build does), each row group
    or record batch is read once, ``_BATCH_ROWS`` rows at a time. Slices share nothing but the
    entries; pickling drops the cursor.

    Raises (from ``[]``):
        SourceError: the file cannot be read any more (changed since the scan).
    """

    def __init__(self, entries: list, column: str):
        self._entries = entries
        self._column = column
        self._cursor = None

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyLocators(self._entries[i], self._column)
        entry = self._entries[i]
        if not (isinstance(entry, tuple) and entry[0] in ("parquet", "arrow")):
            return entry
        return "bytes", self._read(entry)

    def __getstate__(self):
        return {"_entries": self._entries, "_column": self._column, "_cursor": None}

    def _read(self, entry) -> bytes:
        kind, path, unit, row = entry
        c = self._cursor
        if c is None or c.where != (kind, path) or (unit, row) < (c.unit, c.start) or \
                (kind == "parquet" and unit != c.unit):
            self._cursor = c = _Cursor(kind, path, unit, self._column)
        try:
            while (c.unit, c.start + c.count) <= (unit, row):
                c.advance()
        except StopIteration:
            raise SourceError(f"{path}: row {row} of {'row group' if kind == 'parquet' else 'record batch'} "
                              f"{unit} is gone: the file changed since the scan",
                              [f"{path}: changed since the scan"]) from None
        except _data_errors() as exc:
            self._cursor = None
            raise SourceError(f"{path}: {'row group' if kind == 'parquet' else 'record batch'} {unit} "
                              f"cannot be read any more: {_why(exc)}", [f"{path}: {_why(exc)}"]) from exc
        if c.unit != unit:
            raise SourceError(f"{path}: {kind} unit {unit} not found (the file changed since the scan)")
        value = c.data[row - c.start]
        if not value.is_valid:
            raise SourceError(f"{path}: row {row} of unit {unit} has no image bytes (changed since the scan)")
        return value.as_py()


class _Cursor:
    """Batches of one image column from ``unit`` (row group / record batch) on."""

    def __init__(self, kind: str, path: str, unit: int, column: str):
        self.where = (kind, path)
        self._column = column
        self._batches = self._parquet(path, unit) if kind == "parquet" else self._arrow(path, unit)
        self.unit, self.start, self.count, self.data = unit, 0, 0, None

    def advance(self) -> None:
        self.data = None
        unit, start, data = next(self._batches)
        self.unit, self.start, self.count, self.data = unit, start, len(data), data
        _release()

    def _parquet(self, path: str, group: int):
        _, pq = _pyarrow()
        with pq.ParquetFile(path, buffer_size=_READ_BUFFER, pre_buffer=False,
                            page_checksum_verification=True) as pf:
            start = 0
            for batch in pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], columns=[self._column],
                                         use_threads=False):
                yield group, start, _image_parts(batch.column(0))[0]
                start += batch.num_rows

    def _arrow(self, path: str, first: int):
        for index, batch, _, _ in _arrow_batches(path, first):
            yield index, 0, _image_parts(batch.column(batch.schema.get_field_index(self._column)))[0]


# ---------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------
def _hf_features(meta) -> dict:
    """The ``datasets`` features JSON of the export (``Sequence`` spelling: every version reads it)."""
    feats = {"image": {"_type": "Image"}}
    names = list(meta.class_names)
    cls = ({"names": names, "_type": "ClassLabel"} if names else {"dtype": "int64", "_type": "Value"})
    if meta.label_schema == "class":
        feats["label"] = cls
    elif meta.label_schema in ("boxes", "objects"):
        feats["objects"] = {"feature": {
            "bbox": {"feature": {"dtype": "float32", "_type": "Value"}, "length": 4, "_type": "Sequence"},
            "category": cls}, "_type": "Sequence"}
    if meta.label_schema in ("boxes", "objects"):
        feats["packer_label"] = {"dtype": "string", "_type": "Value"}
    feats["packer_metadata"] = {"dtype": "string", "_type": "Value"}
    return feats


def _export_schema(meta):
    pa, _ = _pyarrow()
    fields = [pa.field("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())]))]
    if meta.label_schema == "class":
        fields.append(pa.field("label", pa.int64()))
    elif meta.label_schema in ("boxes", "objects"):
        fields.append(pa.field("objects", pa.struct([("bbox", pa.list_(pa.list_(pa.float32(), 4))),
                                                     ("category", pa.list_(pa.int64()))])))
        fields.append(pa.field("packer_label", pa.string()))
    fields.append(pa.field("packer_metadata", pa.string()))
    info = {"info": {"features": _hf_features(meta)}}
    ours = {"label_schema": meta.label_schema, "class_names": list(meta.class_names), "version": 1}
    return pa.schema(fields, metadata={_META_KEY: json.dumps(info), _PACKER_KEY: json.dumps(ours)})


def _coco_objects(label, data: bytes) -> dict:
    """Normalized boxes -> COCO ``[x, y, w, h]`` pixels of the stored image."""
    from ..labels.model import as_label_model

    model = as_label_model(label) or {}
    objs = [o for o in model.get("objects", []) if isinstance(o.get("box"), list) and len(o["box"]) == 4]
    size = header_dimensions(data, sniff_format(data[:16])) if objs else None
    if size is None:
        return {"bbox": [], "category": []}
    w, h = size
    bbox = [[(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h] for cx, cy, bw, bh in (o["box"] for o in objs)]
    return {"bbox": bbox, "category": [o["class"] if isinstance(o.get("class"), int) else -1 for o in objs]}


def _row(rec, schema: str, data: bytes) -> dict:
    row = {"image": {"bytes": data, "path": rec.key},
           "packer_metadata": json.dumps(rec.metadata) if rec.metadata else None}
    if schema == "class":
        row["label"] = -1 if rec.label is None else int(rec.label)
    elif schema in ("boxes", "objects"):
        row["objects"] = None if rec.label is None else _coco_objects(rec.label, data)
        row["packer_label"] = None if rec.label is None else json.dumps(label_to_json(rec.label))
    return row


def _records(reader):
    """Every record of the store, its bytes checked (as ``packer export`` iterates)."""
    count = reader.metadata.count
    for start in range(0, count, 256):
        for rec in reader.get_many(range(start, min(start + 256, count))):
            if not rec.data_ok():
                raise RecordError(reader.location, rec.key, "checksum mismatch (hint: packer repair first)",
                                  rec.index)
            yield rec


def _encoded(reader, rec) -> bytes:
    """The record's image bytes; decoded-pixel (``raw``) stores give a PNG of the pixels."""
    data = bytes(rec.data)
    if getattr(reader, "encoding", "jpeg") != "raw":
        return data
    import cv2

    arr = np.frombuffer(data, np.uint8).reshape(reader.raw_shape)
    ok, buf = cv2.imencode(".png", cv2.cvtColor(arr, cv2.COLOR_RGB2BGR) if arr.shape[-1] == 3 else arr)
    if not ok:
        raise RecordError(reader.location, rec.key, "PNG encode failed", rec.index)
    return buf.tobytes()


def export(reader, out, options: Optional[ExportOptions] = None) -> ExportResult:
    """Write every record of an open store as parquet shards in the hub layout (module docstring).

    Args:
        reader: an open store reader (:func:`packer.stores.open_store`).
        out: an existing empty folder (or a new one).
        options: ``shard_size`` rows per ``data/train-NNNNN-of-NNNNN.parquet`` file (``prefix`` is
            not used: the hub layout names the files).

    Returns:
        ExportResult with the shard files written.

    Raises:
        RecordError: a record fails its checksum.
        DependencyError: pyarrow is not installed.
    """
    pa, _ = _pyarrow()
    options = options or ExportOptions()
    meta = reader.metadata
    schema = _export_schema(meta)
    folder = Path(out) / "data"
    folder.mkdir(parents=True, exist_ok=True)
    total = max(1, math.ceil(meta.count / options.shard_size))
    res = ExportResult(str(out))
    if getattr(reader, "encoding", "jpeg") == "raw":
        res.notes.append("the store keeps decoded pixels: images written as PNG")
    writer, rows, size, written = None, [], 0, 0

    def flush():
        nonlocal rows, size
        if rows:
            writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema), row_group_size=len(rows))
        rows, size = [], 0

    try:
        for pos, rec in enumerate(_records(reader)):
            if pos % options.shard_size == 0:
                flush()
                writer = _next_shard(writer, folder, pos // options.shard_size, total, schema, res)
            data = _encoded(reader, rec)
            rows.append(_row(rec, meta.label_schema, data))
            size += len(data)
            written += 1
            if len(rows) >= _GROUP_ROWS or size >= _GROUP_BYTES:
                flush()
        if writer is None:   # an empty store: one empty shard keeps the layout readable
            writer = _next_shard(None, folder, 0, 1, schema, res)
        flush()
    finally:
        if writer is not None:
            writer.close()
    res.records = written
    return res


def _next_shard(writer, folder: Path, index: int, total: int, schema, res: ExportResult):
    _, pq = _pyarrow()
    if writer is not None:
        writer.close()
    path = folder / f"train-{index:05d}-of-{total:05d}.parquet"
    res.shards.append(str(path))
    return pq.ParquetWriter(str(path), schema, compression="snappy", write_statistics=False,
                            write_page_checksum=True)


#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat("hf", detect, scan, export)

__all__ = ["FORMAT", "LazyLocators", "detect", "scan", "export"]
