"""Hugging Face export: parquet shards in the hub layout, with ``datasets`` features."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from packer.core.integrity import header_dimensions, sniff_format
from packer.core.records import label_to_json
from packer.interchange.base import ExportOptions, ExportResult
from packer.interchange.hf.arrow import META_KEY, PACKER_KEY, require_pyarrow
from packer.stores.iterate import iter_records, pixels_as_png

#: Export: rows per parquet row group, and bytes buffered before one is written.
_GROUP_ROWS = 100
_GROUP_BYTES = 64 << 20


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
    pa, _ = require_pyarrow()
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
    return pa.schema(fields, metadata={META_KEY: json.dumps(info), PACKER_KEY: json.dumps(ours)})


def _coco_objects(label, data: bytes) -> dict:
    """Normalized boxes -> COCO ``[x, y, w, h]`` pixels of the stored image."""
    from packer.labels.model import as_label_model

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


def _encoded(reader, rec) -> bytes:
    """The record's image bytes; decoded-pixel (``raw``) stores give a PNG of the pixels."""
    if getattr(reader, "encoding", "jpeg") != "raw":
        return bytes(rec.data)
    return pixels_as_png(rec, reader)


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
    pa, _ = require_pyarrow()
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
        for pos, rec in enumerate(iter_records(reader)):
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
    _, pq = require_pyarrow()
    if writer is not None:
        writer.close()
    path = folder / f"train-{index:05d}-of-{total:05d}.parquet"
    res.shards.append(str(path))
    return pq.ParquetWriter(str(path), schema, compression="snappy", write_statistics=False,
                            write_page_checksum=True)
