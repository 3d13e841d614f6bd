"""``packer export``: a store back to an image folder plus label files.

``OUT/images/<key>`` for every live record and the labels in the form the store was built from
(see :mod:`packer.labels.export`), so that ``packer build OUT/images LABELS`` makes the same
store again. A record stored byte for byte comes back byte-identical to its original file; a
re-encoded one (PNG, CMYK, EXIF-rotated...) comes back as the stored JPEG with its extension
replaced by ``.jpg``, and is listed. Keys that would land outside ``OUT/images`` (``..``,
absolute paths, symbolic links on the way) are refused and listed, never written.

Example:
    >>> rep = export("train.lmdb", "restored/")     # doctest: +SKIP
    >>> rep.identical, len(rep.reencoded)           # doctest: +SKIP
    (998, 2)
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Optional

from packer.core.diskspace import disk_full, full_disk_as_error, is_disk_full, require_room
from packer.core.errors import UsageError
from packer.core.paths import safe_relative, target_path, write_new
from packer.core.progress import progress_bar
from packer.core.records import checksum_matches
from packer.core.writes import writes_to
from packer.jobs.publish import export_to_bucket, is_bucket, store_identity
from packer.jobs.reports import DatasetExportReport, ExportReport
from packer.labels.export import get_label_writer, infer_label_form
from packer.stores import detect_format, open_store
from packer.stores.iterate import iter_records, pixels_as_png
from packer.stores.outputs import check_output

log = logging.getLogger(__name__)

__all__ = ["export", "ExportReport", "safe_relative"]

_JPEG_SUFFIXES = {".jpg", ".jpeg", ".jpe", ".jfif"}


@writes_to("out", what="the export")
def export(location, out, *, format: Optional[str] = None, labels_form: Optional[str] = None,
           progress: bool = False, storage_options: Optional[dict] = None, **reader_options) -> ExportReport:
    """Write the store's images and labels to the folder ``out`` (which must be empty or new).

    Args:
        location: the store.
        out: the export folder; images go to ``out/images``, labels next to them. A bucket
            folder (``s3://bucket/folder/``, new or empty) is written here first, then uploaded
            (:func:`packer.jobs.publish.export_to_bucket`; ``storage_options``: its fsspec options).
        format: the store's format (detected when None).
        labels_form: a name from :func:`packer.labels.export.label_writers` (default: the form
            the store was built from).
        progress: tqdm progress bar.
        **reader_options: backend reader options (e.g. ``uri``).

    Returns:
        ExportReport (``ok`` False when some key was refused).

    Raises:
        UsageError: ``out`` is not a new or empty folder (export never replaces files), or it
            is, contains or lies inside the store.
        RecordError: a record fails its checksum (repair the store first).
    """
    if is_bucket(str(out)):
        job = dict(store_identity(str(location), format, **reader_options), to="folder", labels_form=labels_form)
        return export_to_bucket(str(out), job, lambda local: export(location, local, format=format,
                                labels_form=labels_form, progress=progress, **reader_options),
                                ExportReport, storage_options=storage_options)
    location, out = str(location), Path(out)
    check_output(out, inputs=[("store", location)], kind="folder")
    fmt = format or detect_format(location)
    with open_store(location, fmt, **reader_options) as reader:
        meta = reader.metadata
        form = labels_form or infer_label_form(meta)
        writer_cls = get_label_writer(form)
        images = out / "images"
        images.mkdir(parents=True, exist_ok=True)
        lw = writer_cls(out, meta)
        rep = ExportReport(location, str(out), str(images), None, form, 0, 0)
        # The images take about what the store takes; a full disk ends the export with one
        # clear error (the folder, partly written, must be removed before a rerun).
        room = dict(needed=reader.size_bytes(), what=f"the export ({meta.count} records)",
                    note=f"{out} holds a partial export: remove it before rerunning")
        require_room(out, room["needed"], what=room["what"])
        _write_images(reader, location, rep, lw, room, progress)
        with full_disk_as_error(out, **room):
            labels = lw.finish()
        rep.labels = None if labels is None else str(labels)
        rep.labels_skipped = lw.skipped
        rep.label_notes = list(lw.notes)
        for note in rep.label_notes:
            log.warning("%s: %s", out, note)
    return rep


def _write_images(reader, location: str, rep: ExportReport, lw, room: dict, progress: bool) -> None:
    """Every record into ``rep.images`` and the label writer ``lw``, counted in ``rep``.

    Raises:
        RecordError: a record fails its checksum.
        DiskFullError: the disk filled up (``room`` says what was needed).
    """
    images, used = Path(rep.images), set()
    bar = progress_bar(reader.metadata.count, 0, progress, "exporting")
    try:
        for rec in iter_records(reader, location=location, bar=bar):
            _write_record(rec, reader, location, images, rep, lw, used)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(Path(rep.out), cause=exc, **room) from exc
        raise
    finally:
        bar.close()


def _write_record(rec, reader, location: str, images: Path, rep: ExportReport, lw, used: set) -> None:
    """One record: its image file (unless its key is refused) and its label."""
    why = safe_relative(rec.key)
    if why:
        rep.refused.append({"key": rec.key, "reason": why})
        return
    data, name, entry = _image_file(rec, reader, location)
    if name in used:
        name = rec.key + ".jpg"
        if entry:
            entry["file"] = name
    try:
        write_new(target_path(images, name), data)
    except (UsageError, FileExistsError) as exc:
        rep.refused.append({"key": rec.key, "reason": str(exc)})
        return
    used.add(name)
    rep.records += 1
    if entry is None:
        rep.identical += 1
    elif rec.converted or reader.encoding == "raw":
        rep.reencoded.append(entry)
    else:
        rep.modified.append(entry)
    if lw.takes_records:   # e.g. the writers of packer.labels, YOLO (metadata text)
        lw.add(name, rec.label, record=dataclasses.replace(rec, key=name, data=b""))
    else:
        lw.add(name, rec.label)


def _image_file(rec, reader, location: str) -> tuple:
    """``(bytes, file name, entry)`` of a record's image: the stored bytes under its key, or, for
    a record that is not its original file, what was written and why (``entry``; else None)."""
    data, name, entry = bytes(rec.data), rec.key, None
    if reader.encoding == "raw":
        data = pixels_as_png(rec, reader, location=location)
        name = str(PurePosixPath(rec.key).with_suffix(".png"))
        entry = {"key": rec.key, "file": name,
                 "why": f"decoded pixels {'x'.join(map(str, reader.raw_shape))} written as PNG"}
    elif not checksum_matches(data, rec.source_checksum):   # either algorithm (old stores)
        if rec.converted and PurePosixPath(rec.key).suffix.lower() not in _JPEG_SUFFIXES:
            name = str(PurePosixPath(rec.key).with_suffix(".jpg"))
        entry = {"key": rec.key, "file": name, "why": rec.converted or "; ".join(rec.notes)}
    return data, name, entry


# ---------------------------------------------------------------------------------------
# Interchange formats (WebDataset, Hugging Face datasets, MDS, TFRecord)
# ---------------------------------------------------------------------------------------
@writes_to("out", what="the export")
def export_dataset(location, out, to: str, *, shard_size: int = 10_000, format: Optional[str] = None,
                   storage_options: Optional[dict] = None, **reader_options) -> DatasetExportReport:
    """Write the store as a dataset of another stack: ``to`` is ``"webdataset"``, ``"hf"``,
    ``"mds"`` or ``"tfrecord"`` (:mod:`packer.interchange`), in shards of ``shard_size`` samples,
    image bytes exactly as stored, labels in the format's own convention.

    The shards are written into a staging folder beside ``out`` and moved into place when all are
    written: a failed or killed export leaves no half dataset at ``out``. A bucket folder
    ``out`` (``s3://bucket/folder/``) is written here first, then every file uploaded, the
    dataset's index file (MDS ``index.json``, HF ``dataset_info.json``/``state.json``) last.

    Raises:
        UsageError: an unknown format, a bad shard size, or ``out`` is not a new or empty folder
            (export never replaces files) or is, contains or lies inside the store.
        DiskFullError: the disk filled up (the staging folder is removed).
        RecordError: a record fails its checksum (repair the store first).
    """
    from packer.interchange import ExportOptions, get_format

    if int(shard_size) < 1:
        raise UsageError(f"shard_size must be >= 1 sample, got {shard_size}")
    target = get_format(to)
    if is_bucket(str(out)):
        job = dict(store_identity(str(location), format, **reader_options), to=to, shard_size=int(shard_size))
        return export_to_bucket(str(out), job, lambda local: export_dataset(location, local, to, shard_size=shard_size,
                                format=format, **reader_options),
                                DatasetExportReport, storage_options=storage_options)
    location, out = str(location), Path(out)
    check_output(out, inputs=[("store", location)], kind="folder")
    fmt = format or detect_format(location)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        with open_store(location, fmt, **reader_options) as reader:
            require_room(out, reader.size_bytes(), what=f"the {to} export ({reader.metadata.count} records)")
            with full_disk_as_error(str(out), needed=reader.size_bytes(), what=f"the {to} export"):
                res = target.export(reader, stage, ExportOptions(shard_size=int(shard_size)))
        if out.exists():
            out.rmdir()   # new or empty (checked above)
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shards = [str(out / Path(s).relative_to(stage)) if str(s).startswith(str(stage)) else str(s)
              for s in res.shards]
    return DatasetExportReport(location, str(out), to, res.records, shards, list(res.notes))
