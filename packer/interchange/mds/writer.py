"""MDS export: a store written by ``streaming.MDSWriter``, one shard per ``shard_size`` samples."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from packer.core.deps import optional_import
from packer.core.diskspace import require_room
from packer.core.errors import UsageError
from packer.core.records import UNLABELED_CLASS
from packer.interchange.base import CLASS_FILES, ExportOptions, ExportResult, staged_export
from packer.interchange.mds.index import INDEX, KEY_COLUMN, METADATA_COLUMN
from packer.stores.iterate import iter_records, pixels_as_png
from packer.stores.outputs import check_output

EXPORT_HASHES = ("sha1", "xxh64")
#: Largest shard MDS can address (uint32 offsets); MDSWriter refuses a size_limit >= 2**32.
SIZE_CAP = (1 << 32) - 1


def _streaming():
    # installed but broken (it imports torchvision and transformers): the real error is said
    return optional_import("streaming", "writing MDS", "mds", package="mosaicml-streaming")


def _columns(schema: str, raw: bool) -> dict:
    columns = {"image": "png" if raw else "jpeg", KEY_COLUMN: "str", METADATA_COLUMN: "json"}
    if schema == "class":
        columns["label"] = "int"
    elif schema in ("boxes", "objects"):
        columns["label"] = "json"
    return columns


def _label_field(label, schema: str):
    if schema == "class":
        return UNLABELED_CLASS if label is None else int(label)
    if schema == "objects" or label is None:
        return label
    # float(float32): json writes the shortest text that reads back as the same float32
    return {"boxes": [[float(v) for v in row] for row in np.asarray(label, np.float32).reshape(-1, 5)]}


def _sample(rec, reader, schema: str, counts: dict) -> dict:
    data = bytes(rec.data)
    if reader.encoding == "raw":
        data = pixels_as_png(rec, reader)
        counts["png"] = counts.get("png", 0) + 1
    elif not data.startswith(b"\xff\xd8\xff"):
        counts["odd"] = counts.get("odd", 0) + 1
    sample = {"image": data, KEY_COLUMN: rec.key, METADATA_COLUMN: dict(rec.metadata or {})}
    if schema in ("class", "boxes", "objects"):
        sample["label"] = _label_field(rec.label, schema)
    counts["records"] = counts.get("records", 0) + 1
    return sample


def export(reader, out, options: Optional[ExportOptions] = None) -> ExportResult:
    """Write every record of ``reader`` as an MDS dataset in ``out`` (see the module docstring).

    Args:
        reader: an open store reader (:func:`packer.stores.open_store`).
        out: a new or empty folder.
        options: ``shard_size``: samples per shard (``prefix`` is not used: MDS names its shards).

    Returns:
        ExportResult: the shard files written (in order), notes.

    Raises:
        UsageError: ``out`` is not a new or empty folder, or lies in the store; a shard size below 1.
        RecordError: a record fails its checksum (repair the store first).
        DependencyError: mosaicml-streaming is not installed.
        DiskFullError: the disk filled up (nothing is left in ``out``).
    """
    options = options or ExportOptions()
    shard_size = int(options.shard_size)
    if shard_size < 1:
        raise UsageError(f"--shard-size must be at least 1, got {options.shard_size}")
    streaming = _streaming()
    out = Path(out)
    check_output(out, inputs=[("store", reader.location)], kind="folder")
    out.mkdir(parents=True, exist_ok=True)
    room = dict(needed=reader.size_bytes(), what=f"the MDS export ({reader.metadata.count} records)")
    require_room(str(out), room["needed"], what=room["what"])
    schema = reader.metadata.label_schema
    staging = out / ".mds.partial"
    counts: dict = {}
    with staged_export(staging, out, room):
        writer = streaming.MDSWriter(out=str(staging), columns=_columns(schema, reader.encoding == "raw"),
                                     hashes=list(EXPORT_HASHES), size_limit=SIZE_CAP)
        try:
            for n, rec in enumerate(iter_records(reader), 1):
                writer.write(_sample(rec, reader, schema, counts))
                if n % shard_size == 0:
                    # what MDSWriter.write does when size_limit is reached
                    writer.flush_shard()
                    writer._reset_cache()
        except BaseException:
            writer.cancel_future_jobs()
            raise
        writer.finish()
        shards = _publish(staging, out)
        side = _write_class_names(out, list(reader.metadata.class_names or []))
    return ExportResult(str(out), counts.get("records", 0), shards, _notes(counts, side, shard_size))


def _publish(staging: Path, out: Path) -> list:
    """Shards into ``out``, then ``index.json`` (the commit marker); the shard paths."""
    with open(staging / INDEX, "rb") as fh:
        index = json.load(fh)
    shards = []
    for entry in index["shards"]:
        name = (entry.get("zip_data") or entry["raw_data"])["basename"]
        os.replace(staging / name, out / name)
        shards.append(str(out / name))
    os.replace(staging / INDEX, out / INDEX)
    staging.rmdir()
    return shards


def _write_class_names(out: Path, names: list) -> list:
    if not names:
        return []
    path = out / CLASS_FILES[0]
    path.write_text(json.dumps(names, ensure_ascii=False), encoding="utf-8")
    return [path]


def _notes(counts: dict, side: list, shard_size: int) -> list:
    notes = [f"one shard per {shard_size} samples (MDS shards are usually sized in bytes: "
             f"streaming suggests about 64 MiB)"]
    if counts.get("png"):
        notes.append(f"{counts['png']} record(s) of decoded pixels written as lossless PNG (column 'image' is 'png')")
    if counts.get("odd"):
        notes.append(f"{counts['odd']} record(s) hold bytes that are not JPEG in the 'jpeg' column "
                     f"(StreamingDataset still opens them with PIL)")
    if side:
        notes.append(f"class names in {side[0].name} (MDS has no place for them in index.json)")
    return notes
