"""TFRecord export: shards written by ``tfrecord.TFRecordWriter``, each with its ``.tfindex``."""
from __future__ import annotations

import json
import math
import os
from typing import Iterator, Optional

import numpy as np

from packer.core.deps import optional_import
from packer.core.errors import UsageError
from packer.core.records import label_to_json
from packer.interchange.base import ExportOptions, ExportResult
from packer.interchange.tfrecord.example import BOX_KEYS, PACKER_LABEL, PACKER_METADATA, yolo_rows
from packer.interchange.tfrecord.labelmap import LABEL_MAP, Names, placeholder, write_label_map
from packer.stores.iterate import iter_records, pixels_as_png


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
    feats = {k: ([float(v) for v in corners[:, i]], "float") for i, k in enumerate(BOX_KEYS)}
    feats["image/object/class/label"] = ([int(v) for v in ids], "int")
    if class_names and integral and all(int(v) < len(class_names) for v in ids):
        feats["image/object/class/text"] = ([class_names[int(v)].encode("utf-8") for v in ids], "byte")
    exact = False
    if integral and inside:
        back = yolo_rows(corners, [(int(v), None) for v in ids], Names())
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
    ``packer export`` reads them): :func:`packer.stores.iterate.iter_records`.

    Raises:
        RecordError: a record's bytes do not match their checksum (repair the store first).
    """
    return iter_records(reader, batch=batch)


def _image(rec, reader) -> tuple:
    """``(bytes, format)`` to write: the stored JPEG, or PNG for a store of decoded pixels."""
    if reader.encoding != "raw":
        return bytes(rec.data), "jpeg"
    return pixels_as_png(rec, reader), "png"


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
    from packer.core.diskspace import disk_full, is_disk_full, require_room
    from packer.stores.outputs import check_output

    options = options or ExportOptions()
    if options.shard_size < 1:
        raise UsageError(f"shard size must be at least 1, got {options.shard_size}")
    TFRecordWriter = optional_import("tfrecord", "exporting TFRecord", "interchange").TFRecordWriter
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
        for rec in iter_records(reader):
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
