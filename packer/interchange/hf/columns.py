"""Hugging Face columns: which hold the image, the label (``ClassLabel``, a string column, COCO
``objects``) and packer's own fields, and each row's label and metadata read from them."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from packer.core.errors import UsageError
from packer.core.integrity import header_dimensions, sniff_format
from packer.core.records import label_from_json, loads_bounded
from packer.interchange.base import ScanOptions
from packer.interchange.hf.arrow import META_KEY, PACKER_KEY, require_pyarrow

log = logging.getLogger(__name__)


def _features(schema) -> dict:
    """The ``datasets`` features JSON of an arrow schema (``{}`` when absent or unreadable)."""
    raw = (schema.metadata or {}).get(META_KEY)
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
    raw = (schema.metadata or {}).get(PACKER_KEY)
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
    pa, _ = require_pyarrow()
    return (pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0
            and typ.get_field_index("path") >= 0)


@dataclass
class Columns:
    """The columns a scan reads, chosen on the first file, and what their labels are."""

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
    pa, _ = require_pyarrow()
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        typ = typ.value_type
    if not pa.types.is_struct(typ) or typ.get_field_index("bbox") < 0:
        return None
    for name in ("category", "categories", "label", "labels"):
        if typ.get_field_index(name) >= 0:
            return "bbox", name
    return None


def _pick_label(schema, feats: dict, options: ScanOptions, cols: Columns, where: str) -> None:
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


def _class_column(schema, feats: dict, name: str, cols: Columns, where: str) -> None:
    pa, _ = require_pyarrow()
    typ = schema.field(name).type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        cols.strings = True
    elif not (pa.types.is_integer(typ) or pa.types.is_boolean(typ)):
        raise UsageError(f"{where}: column {name!r} is {typ}, not a class id (ClassLabel, integer or string); "
                         f"choose another with --label-column, or build with --no-labels")
    cols.label, cols.schema = name, "class"
    cols.class_names = _class_names(feats.get(name)) or []


def columns_of(schema, options: ScanOptions, where: str) -> Columns:
    """Which columns hold the image, the label and packer's own fields."""
    feats = _features(schema)
    cols = Columns(_pick_image(schema, feats, options.image_column, where))
    typ = schema.field(cols.image).type
    pa, _ = require_pyarrow()
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
class Values:
    """One row's values, as read."""
    label: object = None
    objects: object = None
    packer: Optional[str] = None
    metadata: Optional[str] = None


def label_of(cols: Columns, v: Values, data_of) -> object:
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


def metadata_of(text: Optional[str]) -> dict:
    """A row's ``packer_metadata`` JSON as a dict (``{}`` when null); ValueError for another value."""
    if text is None:
        return {}
    value = loads_bounded(text)
    if not isinstance(value, dict):
        raise ValueError("packer_metadata is not a JSON object")
    return value


def source_name(cols: Columns) -> str:
    """Where the labels come from, for the store's build options and messages."""
    if cols.packer:
        return "packer_label"
    return {"class": f"column {cols.label!r}", "boxes": f"column {cols.objects!r} (COCO xywh)"}.get(
        cols.schema, "no labels")
