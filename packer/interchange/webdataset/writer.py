"""WebDataset export: a store written by ``webdataset.ShardWriter``, one sample per record."""
from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Optional

import numpy as np

from packer.core.deps import optional_import
from packer.core.diskspace import require_room
from packer.core.errors import UsageError
from packer.core.paths import safe_relative
from packer.core.records import UNLABELED_CLASS
from packer.interchange.base import ExportOptions, ExportResult, staged_export
from packer.interchange.webdataset.tar import IMAGE_FIELDS, SKIP_META, base_plus_ext
from packer.stores.iterate import iter_records, pixels_as_png
from packer.stores.outputs import check_output


def _webdataset():
    return optional_import("webdataset", "exporting WebDataset shards", "interchange")


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
            and "." not in stem.rsplit("/", 1)[-1] and not SKIP_META.match(stem))


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
    if SKIP_META.match(clean):
        clean = "x" + clean
    candidate, n = f"{clean}-{index}", 0
    while not _usable_key(candidate) or candidate in used:
        n += 1
        candidate = f"sample-{index}-{n}"
    used.add(candidate)
    return candidate


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
    data = bytes(rec.data)
    counts["records"] = counts.get("records", 0) + 1
    if reader.encoding == "raw":
        data = pixels_as_png(rec, reader)
        counts["png"] = counts.get("png", 0) + 1
    suffix = _image_suffix(data, rec.key)
    wkey = _sample_key(rec.key, rec.index, used)
    sample = {"__key__": wkey, suffix: data}
    labels = _label_fields(rec.label, reader.metadata.label_schema)
    sample.update(labels)
    # an unlabeled record says so, so that the scan keeps it without --allow-unlabeled
    extra = {} if labels else {"unlabeled": True}
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
    with staged_export(staging, out, room):
        with wds.ShardWriter(str(staging / f"{options.prefix}-%06d.tar"), maxcount=int(options.shard_size),
                             maxsize=float("inf"), verbose=0, encoder=False, format="PAX_FORMAT",
                             mtime=int(_mtime(reader.metadata.created))) as sink:
            used: set = set()
            for rec in iter_records(reader):
                sink.write(_record_sample(rec, reader, used, counts))
        shards = []
        for part in sorted(staging.iterdir()):
            os.replace(part, out / part.name)
            shards.append(str(out / part.name))
        staging.rmdir()
        side = _write_class_names(out, list(reader.metadata.class_names or []))
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
