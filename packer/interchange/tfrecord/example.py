"""One ``tf.train.Example``: where its image bytes lie in the record (a walk of the protobuf wire
format) and the features packer reads (TF Object Detection API keys, packer's own)."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from packer.core.records import loads_bounded
from packer.interchange.tfrecord.labelmap import Names

PACKER_LABEL = "packer/label"
PACKER_METADATA = "packer/metadata"


BOX_KEYS = tuple(f"image/object/bbox/{c}" for c in ("xmin", "ymin", "xmax", "ymax"))
_EXTENSIONS = {"jpeg": "jpg", "jpg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "webp": "webp",
               "tiff": "tif", "tif": "tif"}


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
    present = [k for k in BOX_KEYS if k in feats]
    if not present:
        return None
    if len(present) != 4:
        raise ValueError(f"{', '.join(sorted(set(BOX_KEYS) - set(present)))} missing beside {present[0]}")
    cols = [list(_values(feats, k, "float_list")) for k in BOX_KEYS]
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


class Sample:
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


def read_sample(record: bytes, data_at: int, path: str, gz: bool, example_cls, names: Names) -> Sample:
    """One record -> a Sample; ValueError says what is wrong with it."""
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
    return Sample(filename, _extension(feats, image), locator, raw, (has_packed, packed),
                  meta if has_meta else {})


def yolo_rows(corners: np.ndarray, classes: list, names: Names) -> np.ndarray:
    """float32 YOLO rows ``class cx cy w h`` of normalized corners (computed in float64)."""
    c = corners.astype(np.float64)
    ids = [cid if cid is not None else names.by_name[text] for cid, text in classes]
    rows = np.stack([np.asarray(ids, np.float64), (c[:, 0] + c[:, 2]) / 2, (c[:, 1] + c[:, 3]) / 2,
                     c[:, 2] - c[:, 0], c[:, 3] - c[:, 1]], axis=1) if len(ids) else np.zeros((0, 5))
    return rows.astype(np.float32)
