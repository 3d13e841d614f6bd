"""Format-agnostic orchestration: build, verify and info, each returning a report dataclass.

The CLI is a thin layer over these functions; everything here is usable from Python::

    from packer import build, verify
    report = build("data/images", "data/labels", "train.lmdb", format="lmdb")
    assert verify("train.lmdb", deep=True).ok
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from . import __version__
from .diskspace import build_bytes, full_disk_as_error, more_needed, require_room
from .errors import DiskFullError, ImageError, PackerError, RecordError, StoreError, UsageError, WorkerError
from .integrity import DEFAULT_MAX_PIXELS, EXIF_MODES, process_image, turbo_decode
from .interchange.base import read_locator
from .labels.model import bind_to_image
from .locking import output_lock
from .outputs import check_output
from .records import CHECKSUM_ALGORITHMS, IndexHasher, Record, StoreMetadata, label_to_json
from .sources import Sources, collect_sources
from .storeio import hash_staged_index
from .stores import detect_format, get_store, open_store, output_format
from .stores.base import DEFAULT_COMMIT_BYTES, partial_location
from .uri import redact
from .workers import EXECUTORS, ordered_map, refuse_in_bootstrap

log = logging.getLogger(__name__)

ON_CORRUPT = ("fail", "skip", "stop")
_MAX_SIZE_BUCKETS = 200


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------
@dataclass
class BuildReport:
    """What a build did.

    ``published`` is False when damaged inputs were found under ``on_corrupt="fail"`` or
    ``"stop"``: the good records stay in the staging area, and a rerun (for instance with
    ``on_corrupt="skip"``) resumes from there. ``rejected`` also lists the inputs that could not
    be read or stored at all (a folder that cannot be listed, a name that is not UTF-8; their
    ``kind`` says which, see :func:`packer.sources.scan_images`); ``ignored_reasons`` says why
    each ``ignored`` file was left out.
    """

    location: str
    format: str
    published: bool
    records: int
    inputs: int
    rejected: list
    converted: list
    notes: list
    ignored: list
    resumed_from: int
    report_path: str
    label_schema: str
    ignored_reasons: dict = field(default_factory=dict)

    def __post_init__(self):
        self.location = redact(self.location)  # a report is shown and shared: no password in it

    @property
    def ok(self) -> bool:
        return self.published and not self.rejected

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Problem:
    """One thing wrong with a store. ``key``/``index`` are None for store-level problems."""

    reason: str
    key: Optional[str] = None
    index: Optional[int] = None

    def __post_init__(self):
        self.reason = redact(self.reason)

    def __str__(self) -> str:
        if self.key is None:
            return self.reason
        return f"key {self.key!r} (index {self.index}): {self.reason}"


@dataclass
class VerifyReport:
    location: str
    format: str
    count: int
    checked: int
    deep: bool
    problems: list = field(default_factory=list)

    def __post_init__(self):
        self.location = redact(self.location)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


@dataclass
class InfoReport:
    """``encoding`` is what records hold: ``"jpeg"`` or ``"raw"`` pixels of ``raw_shape``; the
    statistics in ``metadata["stats"]`` describe the images as checked at build time."""

    location: str
    format: str
    count: int
    size_bytes: int
    metadata: dict
    encoding: str = "jpeg"
    raw_shape: Optional[list] = None
    #: Per-channel pixel mean/std (0..1) of a seeded sample, for Normalize; see
    #: :func:`packer.report.sampling.pixel_stats`. None when not computed.
    pixels: Optional[dict] = None

    def __post_init__(self):
        self.location = redact(self.location)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------
def _read_input(path):
    """The bytes of one input, or why they cannot be read: ``(raw, None)`` or ``(None, reason)``.
    ``path`` is a file, or an interchange locator (bytes in a shard, or carried along)."""
    if isinstance(path, tuple):
        try:
            return read_locator(path), None
        except OSError as exc:
            return None, f"cannot read: {exc.strerror or exc}"
    try:
        # O_NONBLOCK: a FIFO that appeared since the listing must not block the worker forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None, "not a regular file (FIFO, socket or device)"
            return fh.read(), None
    except OSError as exc:
        return None, f"cannot read file: {exc.strerror or exc}"


def _check_one(task):
    """Worker: read and check one input. Returns (position, Record | None, reason)."""
    pos, path, key, quality, exif, max_size, max_pixels = task
    raw, reason = _read_input(path)
    if raw is None:
        return pos, None, reason
    try:
        return pos, process_image(key, raw, quality=quality, exif=exif, max_size=max_size,
                                  max_pixels=max_pixels), None
    except ImageError as exc:
        return pos, None, exc.reason


def _worker_init():
    import signal

    # Ctrl-C goes to the whole process group: the parent stops the pool and keeps the work
    # done; workers dying of KeyboardInterrupt mid-task would only add tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import cv2
        cv2.setNumThreads(1)
    except ImportError:
        pass


def _fingerprint(fmt: str, sources: Sources, content_options: dict) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": fmt, "schema": sources.label_schema, "classes": sources.class_names,
                         "options": content_options}, sort_keys=True).encode())
    if sources.label_info:
        h.update(json.dumps(sources.label_info, sort_keys=True, default=str).encode())
    for (key, size, mtime), label, extra in zip(sources.fingerprint_items(), sources.labels, sources.metadata):
        line = f"{key}\0{size}\0{mtime}\0{json.dumps(label_to_json(label), sort_keys=True)}"
        if extra:  # only when present: fingerprints of builds without metadata stay as they were
            line += f"\0{json.dumps(extra, sort_keys=True)}"
        h.update(f"{line}\n".encode())
    return h.hexdigest()


def _ordered_results(tasks, workers: int, window: int, executor: str = "auto"):
    """Yield worker results in task order, at most ``window`` tasks in flight (bounded memory).

    See :mod:`packer.workers`: spawn processes where the main module allows, threads otherwise;
    a dead worker raises WorkerError instead of hanging.
    """
    return ordered_map(_check_one, tasks, workers=workers, window=window, executor=executor,
                       initializer=_worker_init, describe=lambda task: task[2])


def _add_stats(stats: dict, rec: Record, label_schema: str) -> None:
    stats["records"] = stats.get("records", 0) + 1
    stats["bytes"] = stats.get("bytes", 0) + len(rec.data)
    stats["source_bytes"] = stats.get("source_bytes", 0) + rec.source_size
    for dim, v in (("width", rec.width), ("height", rec.height)):
        stats[f"{dim}_min"] = min(stats.get(f"{dim}_min", v), v)
        stats[f"{dim}_max"] = max(stats.get(f"{dim}_max", v), v)
        stats[f"{dim}_sum"] = stats.get(f"{dim}_sum", 0) + v
    sizes = stats.setdefault("sizes", {})
    size = f"{rec.width}x{rec.height}"
    if size in sizes or len(sizes) < _MAX_SIZE_BUCKETS:
        sizes[size] = sizes.get(size, 0) + 1
    else:
        sizes["other"] = sizes.get("other", 0) + 1
    for name, value in (("channels", str(rec.channels)), ("source_formats", rec.source_format)):
        d = stats.setdefault(name, {})
        d[value] = d.get(value, 0) + 1
    if rec.converted:
        stats["converted"] = stats.get("converted", 0) + 1
    if rec.notes:
        stats["with_notes"] = stats.get("with_notes", 0) + 1
    if rec.orientation != 1:
        stats["orientation_recorded"] = stats.get("orientation_recorded", 0) + 1
    if label_schema in ("boxes", "objects") and rec.label is None:
        stats["unlabeled"] = stats.get("unlabeled", 0) + 1
    elif isinstance(rec.label, np.ndarray):
        stats["boxes"] = stats.get("boxes", 0) + len(rec.label)
        stats["boxes_max_per_image"] = max(stats.get("boxes_max_per_image", 0), len(rec.label))
        if len(rec.label) == 0:
            stats["images_without_boxes"] = stats.get("images_without_boxes", 0) + 1
    elif isinstance(rec.label, dict):  # the label model ("objects" stores)
        objects = rec.label.get("objects", [])
        stats["objects"] = stats.get("objects", 0) + len(objects)
        stats["objects_max_per_image"] = max(stats.get("objects_max_per_image", 0), len(objects))
        if not objects:
            stats["images_without_objects"] = stats.get("images_without_objects", 0) + 1
        if rec.label.get("mask"):
            stats["masks"] = stats.get("masks", 0) + 1
    elif isinstance(rec.label, int):
        classes = stats.setdefault("classes", {})
        classes[str(rec.label)] = classes.get(str(rec.label), 0) + 1


def default_report_path(location: str) -> Path:
    """Where a build's report goes: next to the output (cwd for a server URL)."""
    if "://" in location:
        return Path.cwd() / (location.rstrip("/").rsplit("/", 1)[-1].split("?")[0] + ".report.json")
    return Path(str(location).rstrip("/") + ".report.json")


def _write_report(path: Path, report: BuildReport, extra: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with full_disk_as_error(path, what="the build report",
                                note=f"{report.location} was {'published' if report.published else 'not published'}"):
            tmp.write_text(json.dumps({**report.to_dict(), **extra}, indent=1, sort_keys=True))
    except DiskFullError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def gather_sources(images, labels=None, *, source_format: Optional[str] = None, split: Optional[str] = None,
                   image_column: Optional[str] = None, label_column: Optional[str] = None,
                   allow_unlabeled: bool = False, no_labels: bool = False, **folder_options) -> Sources:
    """What a build reads: an image folder (:func:`packer.sources.collect_sources`) or a dataset
    in an interchange format (:mod:`packer.interchange`: WebDataset, HF datasets, MDS, TFRecord),
    detected from ``images`` or named by ``source_format``.

    Raises:
        UsageError: LABELS given with an interchange dataset (its labels are inside it), options
            that fit neither; SourceError: as collect_sources.
    """
    from .interchange.sources import collect_interchange, input_format

    kind = input_format(images, source_format)
    if kind == "folder":
        if split or image_column or label_column:
            raise UsageError("--split/--image-column/--label-column apply to datasets (--from hf|mds|...), "
                             f"not to the image folder {images}")
        return collect_sources(images, labels, allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                               **folder_options)
    if labels is not None:
        raise UsageError(f"{images} is a {kind} dataset: its labels are inside it, LABELS ({labels}) "
                         f"does not apply")
    given = sorted(k for k, v in folder_options.items() if v not in (None, False, "auto"))
    if given:
        raise UsageError(f"{images} is a {kind} dataset: {', '.join(given)} apply to image folders only")
    return collect_interchange(images, kind, allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                               split=split, image_column=image_column, label_column=label_column)


def build(images, labels, out, format: Optional[str] = None, *, quality: int = 95, exif: str = "apply",
          workers: Optional[int] = None, on_corrupt: str = "fail", resume: bool = True,
          overwrite: bool = False, allow_unlabeled: bool = False, no_labels: bool = False,
          commit_bytes: int = DEFAULT_COMMIT_BYTES, store_options: Optional[dict] = None,
          report_path=None, progress: bool = False, labels_format: Optional[str] = None,
          clip_boxes: bool = False, csv_columns=None, masks=None, shard=None, classes=None,
          max_size: Optional[int] = None, max_pixels: int = DEFAULT_MAX_PIXELS,
          executor: str = "auto", source_format: Optional[str] = None, split: Optional[str] = None,
          image_column: Optional[str] = None, label_column: Optional[str] = None,
          engine: Optional[str] = None, **engine_options) -> BuildReport:
    """Pack an image folder and its labels into a store, checking every image on the way in.

    Args:
        images: IMAGES folder (walked recursively, sorted).
        labels: LABELS folder / CSV / JSON file, or None (class-per-subfolder).
        out: where to publish the store (a path, or ``mongodb://host/db/collection``).
        format: a name from :func:`packer.stores.available_formats`; default: inferred from
            ``out`` (``.h5``/``.hdf5`` -> hdf5, ``.lmdb`` -> lmdb, ``mongodb://`` -> mongo,
            else lmdb). A format contradicting ``out``, or a URL no store writes
            (``s3://``...), raises UsageError.
        quality: JPEG quality for images that must be re-encoded.
        exif: ``"apply"`` (rotate pixels, re-encode) or ``"record"`` (store orientation).
        workers: checking/encoding processes (default: all cores). The store is identical
            whatever the count.
        on_corrupt: ``"fail"`` (check everything, list every damaged input, publish nothing),
            ``"skip"`` (publish without the damaged inputs, listed in the report) or ``"stop"``
            (halt at the first damaged input). The work done is kept for a resume either way.
        resume: continue a partial build of the same inputs and options (else start over).
        overwrite: replace an existing store at ``out``.
        allow_unlabeled / no_labels: see :func:`packer.sources.collect_sources`.
        commit_bytes: write-batch size.
        store_options: backend options (e.g. ``{"pixels": "224x224"}`` for HDF5).
        report_path: report file (default: next to ``out``).
        max_size: store images downscaled to at most this many pixels on the long side (aspect
            kept, area interpolation, re-encoded at ``quality``; recorded as converted).
        labels_format / clip_boxes / csv_columns / masks: see :func:`packer.sources.collect_sources`.
        shard: ``"I/N"`` or ``(I, N)``: build only the I-th of N contiguous parts of the sorted
            input list (see :mod:`packer.sharding`); the store records which part it holds.
        classes: pin the class-name -> id map (a names file, JSON, or a store; see
            :mod:`packer.classes`).
        engine: ``None`` (this machine) or ``"dask"``: build ``shards=N`` shards on a
            dask.distributed cluster (``scheduler=ADDRESS`` or a LocalCluster) and publish a
            manifest at ``out`` (see :func:`packer.distributed.build_distributed`).
        progress: show a tqdm progress bar (drawn only when stderr is a terminal).
        max_pixels: refuse (as damaged) images whose header promises more pixels than this,
            before decoding them (decompression bombs); default Pillow's 89,478,485; 0 = no limit.
        executor: where the checks run: ``"auto"`` (spawn worker processes where the main
            module allows, else threads, logged), ``"process"``, ``"thread"`` or ``"inline"``;
            see :mod:`packer.workers`.

    Returns:
        BuildReport.

    Raises:
        UsageError, SourceError, StoreError, LockedError (another build holds ``out``),
        WorkerError (a worker process died: the work done so far is kept for a resume).

    Example:
        >>> r = build("imgs", None, "out.lmdb", workers=4)   # doctest: +SKIP
        >>> r.published, r.records                          # doctest: +SKIP
        (True, 1000)
    """
    if engine is not None or engine_options:
        from .distributed import dispatch_engine
        return dispatch_engine(engine, images, labels, out, format, engine_options, shard=shard,
                               quality=quality, exif=exif, workers=workers, on_corrupt=on_corrupt,
                               resume=resume, overwrite=overwrite, allow_unlabeled=allow_unlabeled,
                               no_labels=no_labels, commit_bytes=commit_bytes,
                               store_options=store_options, report_path=report_path,
                               progress=progress, classes=classes, labels_format=labels_format,
                               clip_boxes=clip_boxes, csv_columns=csv_columns, masks=masks, max_size=max_size,
                               max_pixels=max_pixels, executor=executor, source_format=source_format,
                               split=split, image_column=image_column, label_column=label_column)
    if on_corrupt not in ON_CORRUPT:
        raise UsageError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
    if exif not in EXIF_MODES:
        raise UsageError(f"exif must be one of {EXIF_MODES}, got {exif!r}")
    if not 1 <= int(quality) <= 100:
        raise UsageError(f"quality must be 1..100, got {quality}")
    if max_size is not None and int(max_size) < 1:
        raise UsageError(f"max_size must be >= 1 pixel, got {max_size}")
    max_size = None if max_size is None else int(max_size)
    if int(max_pixels) < 0:
        raise UsageError(f"max_pixels must be >= 0 (0 = no limit), got {max_pixels}")
    if executor not in EXECUTORS:
        raise UsageError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    refuse_in_bootstrap()
    out = str(out)
    format = output_format(out, format)
    store_cls = get_store(format)
    store_options = dict(store_options or {})
    connection = {k: v for k, v in store_options.items() if k in store_cls.connection_options}
    content_store_options = {k: v for k, v in store_options.items() if k not in connection}
    output_inputs = [("images", images), ("labels", labels), ("masks", masks)]
    # The staging area is judged under the output lock (below): before it, another build may be
    # writing there, and the lock is what refuses this one then, naming the holder.
    check_output(out, inputs=output_inputs, overwrite=overwrite, fmt=format, connection=connection,
                 staging=False)
    sources = gather_sources(images, labels, allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                             labels_format=labels_format, clip_boxes=clip_boxes, csv_columns=csv_columns,
                             masks=masks, source_format=source_format, split=split,
                             image_column=image_column, label_column=label_column)
    sources, shard_info = _pin_and_shard(sources, classes, shard)
    workers = max(1, int(workers or os.cpu_count() or 1))
    content_options = {"quality": int(quality), "exif": exif, "store_options": content_store_options,
                       "max_pixels": int(max_pixels)}
    if shard_info is not None:
        content_options["shard"] = shard_info
    if max_size is not None:  # only when used: fingerprints of earlier partial builds stay valid
        content_options["max_size"] = max_size
    fingerprint = _fingerprint(format, sources, content_options)
    report_path = Path(report_path) if report_path else default_report_path(out)

    with output_lock(out, store_cls, purpose="build", **connection) as held, \
            store_cls.create_writer(out, commit_bytes=commit_bytes, **store_options) as writer:
        # Again under the lock: something may have been published there while we waited.
        check_output(out, inputs=output_inputs, overwrite=overwrite, fmt=format, connection=connection)
        state = writer.open(fingerprint, resume=resume)
        resumed_from = state.next_input
        # Refused before any work when the inputs clearly do not fit (packer.diskspace).
        left = sources.keys[state.next_input:]
        require_room(out, lambda: build_bytes(sources.size_paths(left)),
                     staging=partial_location(out) if "://" not in out else None,
                     what=f"the build ({len(left)} inputs)")
        # A generator: interchange inputs may carry their bytes in the task (bounded window).
        tasks = ((pos, sources.task_input(pos), sources.keys[pos], int(quality), exif, max_size, int(max_pixels))
                 for pos in range(state.next_input, len(sources.keys)))
        bar = _progress_bar(len(sources.keys), state.next_input, progress, "packing")
        # Inputs the walk could not read (listed once: by shard 0 of a sharded build).
        unreadable = list(sources.unreadable) if shard_info is None or shard_info["index"] == 0 else []
        stopped = bool(unreadable) and on_corrupt == "stop"
        if stopped:
            tasks = []
        results = _ordered_results(tasks, workers, workers * 16, executor)
        try:
            for pos, checked, reason in results:
                key = sources.keys[pos]
                if checked is None:
                    state.rejects.append({"path": key, "reason": reason})
                    # The CLI prints the damaged inputs itself: it drops these records (extra).
                    log.warning("%s: %s", sources.path(key), reason, extra={"packer_damaged_input": True})
                else:
                    rec = _with_label(checked, state.next_index, sources, pos)
                    writer.add(rec)
                    _add_stats(state.stats, rec, sources.label_schema)
                    state.next_index += 1
                    if rec.converted:
                        state.converted.append({"path": key, "converted": rec.converted})
                    if rec.notes:
                        state.notes.extend({"path": key, "note": n} for n in rec.notes)
                state.next_input = pos + 1
                writer.checkpoint(state)
                bar.update(1)
                if checked is None and on_corrupt == "stop":
                    stopped = True
                    break
        except WorkerError:
            writer.flush()  # keep every input checked so far: a rerun resumes after them
            raise
        except DiskFullError as exc:   # a batch did not fit: say what the whole rest needs
            left = sources.size_paths(sources.keys[state.next_input:])
            raise more_needed(exc, build_bytes(left), "the rest of the build") from exc
        finally:
            # Stops the pool now, whatever ended the loop (break, an error, Ctrl-C), rather than
            # when the generator is collected: idle workers would keep the interpreter's exit
            # waiting for them.
            results.close()
            bar.close()
        writer.flush()
        publish = not (state.rejects or unreadable) or on_corrupt == "skip"
        if publish and not stopped:
            n, index_sum = hash_staged_index(writer, out)
            if n != state.next_index:
                raise StoreError(f"{out}: staging area holds {n} records, expected {state.next_index}")
            stats = dict(state.stats, inputs=len(sources.keys), rejected=len(unreadable) + len(state.rejects),
                         ignored=len(sources.ignored))
            meta = StoreMetadata(
                format=format, count=n, label_schema=sources.label_schema,
                class_names=list(sources.class_names), label_info=dict(sources.label_info),
                build_options={"quality": int(quality), "exif": exif, "on_corrupt": on_corrupt, "max_size": max_size,
                               "labels": sources.label_source, "images": str(sources.root),
                               "store_options": content_store_options,
                               **({"shard": shard_info} if shard_info is not None else {})},
                index_checksum=index_sum, packer_version=__version__,
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                stats=stats)
            held.check()  # still the only writer (a heartbeat lock could have been taken over)
            writer.publish(meta, overwrite=overwrite)
        published = publish and not stopped

    # The report is a file users share: a connection string's password never goes into it.
    report = BuildReport(location=redact(str(out)), format=format, published=published, records=state.next_index,
                         inputs=len(sources.keys), rejected=unreadable + list(state.rejects),
                         converted=list(state.converted), notes=list(state.notes),
                         ignored=list(sources.ignored), resumed_from=resumed_from,
                         report_path=str(report_path), label_schema=sources.label_schema,
                         ignored_reasons=dict(sources.ignored_reasons))
    _write_report(report_path, report, {"on_corrupt": on_corrupt, "stopped_early": stopped})
    return report


def _with_label(checked: Record, index: int, sources: Sources, pos: int) -> Record:
    """The checked image's record with its index, label (bound to the image's size), metadata
    and label notes."""
    turned = re.search(r"exif-orientation (\d) applied", checked.converted or "")
    label, notes = bind_to_image(sources.labels[pos], checked.width, checked.height,
                                 int(turned.group(1)) if turned else 1)
    notes = list(checked.notes) + notes + list(sources.label_notes.get(sources.keys[pos], []))
    return dataclasses.replace(checked, index=index, label=label, metadata=dict(sources.metadata[pos]), notes=notes)


def _pin_and_shard(sources: Sources, classes, shard):
    """Apply a pinned class map (``--classes``), then keep only shard ``shard`` (``--shard``)."""
    shard_info = None
    if classes is not None:
        from .classes import apply_class_map, load_class_map
        sources = apply_class_map(sources, load_class_map(classes), f"--classes {classes}")
    if shard is not None:
        from .sharding import select_shard
        sources, shard_info = select_shard(sources, shard)
    return sources, shard_info


def _progress_bar(total: int, initial: int, enabled: bool, desc: str):
    from tqdm import tqdm

    # disable=None: tqdm turns itself off when stderr is not a terminal (no \r lines in logs).
    return tqdm(total=total, initial=initial, unit="img", disable=None if enabled else True, dynamic_ncols=True,
                smoothing=0.1, desc=desc)


# ---------------------------------------------------------------------------------------
# verify / info
# ---------------------------------------------------------------------------------------
def _deep_check(rec: Record, encoding: str, raw_shape) -> Optional[str]:
    if encoding == "raw":
        expected = int(np.prod(raw_shape))
        return None if len(rec.data) == expected else f"holds {len(rec.data)} pixel bytes, expected {expected}"
    try:
        img = turbo_decode(rec.data, pixel_format="gray" if rec.channels == 1 else "rgb", strict=True)
    except ValueError as exc:
        return f"does not decode cleanly: {exc}"
    if img.shape[:2] != (rec.height, rec.width):
        return f"decodes to {img.shape[1]}x{img.shape[0]}, record says {rec.width}x{rec.height}"
    return None


def _require_location(location: str) -> None:
    """UsageError for a local path that names nothing (a typo, not a damaged store)."""
    from .stores.base import partial_location

    if "://" in location or os.path.lexists(location) or os.path.lexists(partial_location(location)):
        return
    shown = redact(location)
    hint = f" (a server store is written mongodb://{shown})" if shown != location else ""
    raise UsageError(f"{shown}: no such file or folder{hint}")


def verify(location, *, deep: bool = False, format: Optional[str] = None, batch: int = 256,
           progress: bool = False, **reader_options) -> VerifyReport:
    """Check a store: metadata, index, every record's checksum (and with ``deep``, decode).

    Every bad record is listed (key, index, reason); nothing stops at the first problem.

    Example:
        >>> rep = verify("train.lmdb", deep=True)     # doctest: +SKIP
        >>> rep.ok, [str(p) for p in rep.problems]     # doctest: +SKIP
        (True, [])
    """
    location = str(location)
    _require_location(location)
    fmt = format or detect_format(location)
    if fmt == "manifest":   # a dataset of shards: each shard verified, and the checksum chain
        from .merge import verify_manifest
        return verify_manifest(location, deep=deep, batch=batch, progress=progress, **reader_options)
    try:
        reader = open_store(location, fmt, **reader_options)
    except StoreError as exc:
        # Store-level damage (metadata gone, file cut short): report it, and still check every
        # record that reads, through the backend's salvage reader.
        reader = _salvage_reader(location, fmt, exc, reader_options)
        if reader is None:
            return VerifyReport(location, fmt, 0, 0, deep, [Problem(str(exc))])
    with _released(reader):
        meta = reader.metadata
        problems = [Problem(p) for p in reader.check_structure()]
        n_present = len(reader)
        if n_present != meta.count:
            problems.append(Problem(f"{redact(location)}: holds {n_present} records, metadata says {meta.count}"))
        if meta.checksum_algorithm not in CHECKSUM_ALGORITHMS:
            return VerifyReport(location, fmt, meta.count, 0, deep, problems + [Problem(
                f"{redact(location)}: metadata names checksum algorithm {meta.checksum_algorithm!r}; this packer "
                f"knows {', '.join(CHECKSUM_ALGORITHMS)} (hint: upgrade packer)")])
        hasher = IndexHasher(meta.checksum_algorithm)
        checked = unreadable = 0
        bar = _progress_bar(meta.count, 0, progress, "verifying")
        try:
            for start in range(0, meta.count, batch):
                idx = list(range(start, min(start + batch, meta.count)))
                try:
                    recs = reader.get_many(idx)
                except (RecordError, StoreError, IndexError):
                    recs = []
                    for i in idx:  # find which records of the batch are bad
                        try:
                            recs.append(reader.get(i))
                        except RecordError as exc:
                            problems.append(Problem(exc.reason, exc.key, i))
                            recs.append(None)
                        except StoreError as exc:
                            problems.append(Problem(str(exc), None, i))
                            recs.append(None)
                        except IndexError as exc:
                            problems.append(Problem(f"missing: {exc}", None, i))
                            recs.append(None)
                for i, rec in zip(idx, recs):
                    bar.update(1)
                    if rec is None:
                        hasher.update(i, "", "missing")
                        unreadable += 1
                        continue
                    checked += 1
                    hasher.update(rec.index, rec.key, rec.checksum)
                    if not rec.data_ok():
                        problems.append(Problem("checksum mismatch: the stored bytes changed since the build",
                                                rec.key, i))
                        continue
                    if not rec.meta_ok():
                        problems.append(Problem("record checksum mismatch: the label or other record fields "
                                                "changed since the build", rec.key, i))
                        continue
                    if deep:
                        why = _deep_check(rec, reader.encoding, reader.raw_shape)
                        if why:
                            problems.append(Problem(why, rec.key, i))
        finally:
            bar.close()
        if unreadable:
            # The index checksum covers every record's key and checksum; with records unreadable
            # it cannot be recomputed, and a mismatch would only repeat the problems above.
            log.info("%s: index checksum not checked: %d record(s) could not be read", redact(location), unreadable)
        elif meta.index_checksum and hasher.hexdigest() != meta.index_checksum:
            problems.append(Problem(f"{redact(location)}: index checksum mismatch (records were added, removed, "
                                    f"reordered or renamed since the build)"))
        return VerifyReport(location, fmt, meta.count, checked, deep, problems)


def _salvage_reader(location: str, fmt: str, exc: StoreError, reader_options: dict):
    """The backend's salvage reader after ``open_store`` failed with ``exc`` (None if none)."""
    from .repair import infer_label_schema, metadata_is_provisional
    try:
        reader = get_store(fmt).open_salvage(location, **reader_options)
    except (StoreError, UsageError) as exc2:
        log.debug("%s: salvage open failed too: %s", redact(location), exc2)
        return None
    if str(exc) not in reader.salvage_problems:
        reader.salvage_problems.insert(0, str(exc))
    if metadata_is_provisional(reader.metadata):
        infer_label_schema(reader)
    return reader


class _released:
    """``with``: close a reader and drop a salvage copy it read through."""

    def __init__(self, reader):
        self.reader = reader

    def __enter__(self):
        return self.reader

    def __exit__(self, *exc):
        from .repair import release
        release(self.reader)
        return False


def info(location, *, format: Optional[str] = None, pixel_sample: int = 256, seed: int = 0,
         **reader_options) -> InfoReport:
    """Count, size, image-size distribution, label summary and build options of a store.

    ``pixel_sample`` records (seeded by ``seed``) are decoded at reduced scale for the
    per-channel pixel mean/std in ``InfoReport.pixels`` (0 skips it).
    """
    from .report.sampling import pixel_stats

    location = str(location)
    _require_location(location)
    fmt = format or detect_format(location)
    with open_store(location, fmt, **reader_options) as reader:
        pixels = pixel_stats(reader, pixel_sample, seed) if pixel_sample > 0 else None
        return InfoReport(location, fmt, reader.metadata.count, reader.size_bytes(),
                          asdict(reader.metadata), reader.encoding,
                          list(reader.raw_shape) if reader.raw_shape else None, pixels)


__all__ = ["build", "verify", "info", "BuildReport", "VerifyReport", "InfoReport", "Problem",
           "PackerError", "UsageError"]
