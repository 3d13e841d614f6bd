"""MDS columns: which column holds the image, the label, the key and the metadata, and decoding
their payloads (``streaming``'s encodings: integers, ``str``, ``json``, ``ndarray``, ``pil``)."""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Optional

import numpy as np

from packer.core.errors import UsageError
from packer.core.records import UNLABELED_CLASS, loads_bounded
from packer.interchange.base import ScanOptions
from packer.interchange.mds.index import KEY_COLUMN, METADATA_COLUMN, Shard
from packer.sources.folders import parse_label_json

IMAGE_ENCODINGS = ("jpeg", "png", "pil")
IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp", "x")
LABEL_NAMES = ("label", "labels", "y", "class", "cls", "target", "category")
COCO_COLUMNS = ("bbox_sizes", "bbox_labels")
_INT_ENCODINGS = {"int": "<i8", "int8": "i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
                  "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8"}
_LABEL_ENCODINGS = (*_INT_ENCODINGS, "str_int", "str", "json")
#: streaming's NDArray dtype codes (encodings.NDArray._int2value_dtype).
_ND_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
              34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
#: Bytes per pixel of the PIL modes streaming's ``pil`` encoding may hold ("1" packs 8 a byte).
_PIL_BYTES = {"L": 1, "P": 1, "LA": 2, "PA": 2, "La": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
              "RGBA": 4, "RGBa": 4, "RGBX": 4, "CMYK": 4, "I": 4, "F": 4, "I;16": 2, "I;16L": 2,
              "I;16B": 2, "I;16N": 2}
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"BM", "bmp"),
          (b"II*\x00", "tif"), (b"MM\x00*", "tif"))


@dataclass(frozen=True)
class Layout:
    """Which columns of a shard hold what (column positions)."""

    image: int
    label: Optional[int] = None
    coco: Optional[tuple] = None
    key: Optional[int] = None
    metadata: Optional[int] = None


def _image_column(names: list, encodings: list, options: ScanOptions) -> int:
    if options.image_column:
        if options.image_column not in names:
            raise UsageError(f"--image-column {options.image_column!r}: no such column (columns: {', '.join(names)})")
        i = names.index(options.image_column)
        if encodings[i] not in (*IMAGE_ENCODINGS, "bytes"):
            raise UsageError(f"--image-column {options.image_column!r} is encoded {encodings[i]!r}; "
                             f"images are read from {', '.join(IMAGE_ENCODINGS)} or bytes columns")
        return i
    found = [i for i, e in enumerate(encodings) if e in IMAGE_ENCODINGS]
    if len(found) > 1:
        named = [i for n in IMAGE_NAMES for i in found if names[i] == n]
        if not named:
            raise UsageError(f"several image columns ({', '.join(names[i] for i in found)}); "
                             f"choose one with --image-column")
        found = named[:1]
    if not found:
        found = [names.index(n) for n in IMAGE_NAMES if n in names and encodings[names.index(n)] == "bytes"][:1]
    if not found:
        shown = ", ".join(f"{n} ({e})" for n, e in zip(names, encodings))
        raise UsageError(f"no image column (encoded {', '.join(IMAGE_ENCODINGS)}, or bytes named "
                         f"{'/'.join(IMAGE_NAMES)}) among: {shown}; name one with --image-column")
    return found[0]


def _label_column(names: list, encodings: list, options: ScanOptions) -> tuple:
    """(label column or None, COCO column pair or None)."""
    if options.label_column:
        if options.label_column not in names:
            raise UsageError(f"--label-column {options.label_column!r}: no such column (columns: {', '.join(names)})")
        i = names.index(options.label_column)
        if encodings[i].split(":")[0] not in _LABEL_ENCODINGS:
            raise UsageError(f"--label-column {options.label_column!r} is encoded {encodings[i]!r}; labels are "
                             f"read from integer, str, str_int or json columns")
        return i, None
    for name in LABEL_NAMES:
        if name in names and encodings[names.index(name)] in _LABEL_ENCODINGS:
            return names.index(name), None
    if all(c in names for c in COCO_COLUMNS) and all(
            encodings[names.index(c)].split(":")[0] == "ndarray" for c in COCO_COLUMNS):
        return None, tuple(names.index(c) for c in COCO_COLUMNS)
    return None, None


def layout_of(shard: Shard, options: ScanOptions) -> Layout:
    """Which columns of ``shard`` hold the image, label, key and metadata; UsageError when unclear."""
    names, enc = shard.names, shard.encodings
    image = _image_column(names, enc, options)
    label, coco = _label_column(names, enc, options)
    key = names.index(KEY_COLUMN) if KEY_COLUMN in names and enc[names.index(KEY_COLUMN)] == "str" else None
    meta = (names.index(METADATA_COLUMN) if METADATA_COLUMN in names and enc[names.index(METADATA_COLUMN)] == "json"
            else None)
    return Layout(image, label, coco, key, meta)


def decode_ndarray(encoding: str, raw: bytes) -> np.ndarray:
    """Decode streaming's ``ndarray[:dtype[:shape]]`` encoding (encodings.NDArray)."""
    args = encoding.split(":")[1:]
    dtype = args[0] if args and args[0] else None
    shape = tuple(int(v) for v in args[1].split(",")) if len(args) > 1 else None
    i = 0
    if dtype is None:
        if not raw or raw[0] not in _ND_DTYPES:
            raise ValueError("ndarray: unknown dtype code")
        dtype, i = _ND_DTYPES[raw[0]], 1
    if shape is None:
        if len(raw) <= i:
            raise ValueError("ndarray: no shape")
        ndim, code = raw[i] >> 2, raw[i] & 3
        width = 1 << code
        dims = np.frombuffer(raw[i + 1:i + 1 + ndim * width], f"<u{width}")
        if len(dims) != ndim:
            raise ValueError("ndarray: shape cut short")
        shape, i = tuple(int(d) for d in dims), i + 1 + ndim * width
    item = np.dtype(dtype).newbyteorder("<")
    if (len(raw) - i) != int(np.prod(shape)) * item.itemsize:
        raise ValueError(f"ndarray: {len(raw) - i} bytes for a {dtype} array of shape {shape}")
    return np.frombuffer(raw[i:], item).reshape(shape)


def _label_of_json(value, where: str):
    """(kind, label) of a JSON label value, or None for ``null`` (unlabeled)."""
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("objects"), list) and "boxes" not in value:
        return "objects", value
    if isinstance(value, list) or (isinstance(value, dict) and "boxes" in value):
        return "boxes", parse_label_json(value, where)
    return "class", parse_label_json(value, where)


def label_value(encoding: str, raw: bytes, where: str):
    """(kind, label) of a label column's payload, or None when unlabeled. Raises ValueError."""
    base = encoding.split(":")[0]
    if base in _INT_ENCODINGS or base == "str_int":
        if base == "str_int":
            value = int(raw.decode("ascii").strip())
        else:
            value = int(np.frombuffer(raw, _INT_ENCODINGS[base])[0])
        if value == UNLABELED_CLASS:
            return None
        return "class", parse_label_json(value, where)
    text = raw.decode("utf-8")
    if base == "str":
        return ("class", parse_label_json(text, where)) if text.strip() else None
    return _label_of_json(loads_bounded(text), where)


def coco_boxes(sizes: np.ndarray, ids: np.ndarray, where: str) -> np.ndarray:
    """streaming's COCO columns (normalized l, t, r, b + ids) -> YOLO rows ``c cx cy w h``."""
    box = np.asarray(sizes, np.float64).reshape(-1, 4)
    ids = np.asarray(ids).reshape(-1)
    if len(ids) != len(box):
        raise ValueError(f"{where}: {len(box)} boxes but {len(ids)} box labels")
    rows = [[int(c), (l + r) / 2, (t + b) / 2, r - l, b - t] for c, (l, t, r, b) in zip(ids.tolist(), box.tolist())]
    return parse_label_json(rows, where)


def png_of_pil(raw: bytes) -> bytes:
    """streaming's ``pil`` payload (uint32 width, height, mode length; mode; pixels) as PNG bytes."""
    from PIL import Image

    if len(raw) < 12:
        raise ValueError("pil: header cut short")
    width, height, msize = (int(v) for v in np.frombuffer(raw[:12], "<u4"))
    try:
        mode = raw[12:12 + msize].decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("pil: the mode is not text") from None
    if mode == "1":
        want = (width + 7) // 8 * height
    elif mode in _PIL_BYTES:
        want = width * height * _PIL_BYTES[mode]
    else:
        raise ValueError(f"pil: unknown image mode {mode!r}")
    have = len(raw) - 12 - msize
    if have != want or not width or not height:
        raise ValueError(f"pil: a {mode} {width}x{height} image needs {want} pixel bytes, the sample holds {have}")
    img = Image.frombytes(mode, (width, height), raw[12 + msize:])
    if mode in ("RGBX", "CMYK", "YCbCr", "LAB", "HSV"):
        img = img.convert("RGB")   # PNG has no such mode
    buf = io.BytesIO()
    try:
        img.save(buf, format="PNG", compress_level=1)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"pil: a {mode} image cannot be written as PNG ({exc})") from exc
    return buf.getvalue()


def image_ext(head: bytes, encoding: str) -> str:
    """The file extension of an image from its first bytes, else from its column's encoding."""
    for magic, ext in _MAGIC:
        if head.startswith(magic):
            return ext
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return {"jpeg": "jpg", "png": "png"}.get(encoding, "bin")
