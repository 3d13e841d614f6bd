"""Format-agnostic orchestration: build, verify and info, each returning a report dataclass.

The CLI is a thin layer over these functions; everything here is usable from Python::

    from packer import build, verify
    report = build("data/images", "data/labels", "train.lmdb", format="lmdb")
    assert verify("train.lmdb", deep=True).ok
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import json
import logging
import multiprocessing as mp
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from . import __version__
from .errors import ImageError, PackerError, RecordError, StoreError, UsageError
from .integrity import EXIF_MODES, process_image, turbo_decode
from .records import IndexHasher, Record, StoreMetadata, label_to_json
from .sources import Sources, collect_sources
from .stores import detect_format, get_store, open_store
from .stores.base import DEFAULT_COMMIT_BYTES

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
    ``on_corrupt="skip"``) resumes from there.
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

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------
def _check_one(task):
    """Worker: read and check one input. Returns (position, Record | None, reason)."""
    pos, path, key, quality, exif = task
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        return pos, None, f"cannot read file: {exc.strerror or exc}"
    try:
        return pos, process_image(key, raw, quality=quality, exif=exif), None
    except ImageError as exc:
        return pos, None, exc.reason


def _worker_init():
    try:
        import cv2
        cv2.setNumThreads(1)
    except ImportError:
        pass


def _fingerprint(fmt: str, sources: Sources, content_options: dict) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": fmt, "schema": sources.label_schema, "classes": sources.class_names,
                         "options": content_options}, sort_keys=True).encode())
    for (key, size, mtime), label in zip(sources.fingerprint_items(), sources.labels):
        h.update(f"{key}\0{size}\0{mtime}\0{json.dumps(label_to_json(label))}\n".encode())
    return h.hexdigest()


def _ordered_results(tasks, workers: int, window: int):
    """Yield worker results in task order, at most ``window`` tasks in flight (bounded memory)."""
    if workers <= 1:
        for t in tasks:
            yield _check_one(t)
        return
    ctx = mp.get_context("spawn")  # no fork: the parent may hold threads (tqdm, torch, cv2)
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        pending = collections.deque()
        it = iter(tasks)
        for t in it:
            pending.append(pool.apply_async(_check_one, (t,)))
            if len(pending) >= window:
                break
        while pending:
            yield pending.popleft().get()
            t = next(it, None)
            if t is not None:
                pending.append(pool.apply_async(_check_one, (t,)))


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
    if label_schema == "boxes" and rec.label is None:
        stats["unlabeled"] = stats.get("unlabeled", 0) + 1
    elif isinstance(rec.label, np.ndarray):
        stats["boxes"] = stats.get("boxes", 0) + len(rec.label)
        stats["boxes_max_per_image"] = max(stats.get("boxes_max_per_image", 0), len(rec.label))
        if len(rec.label) == 0:
            stats["images_without_boxes"] = stats.get("images_without_boxes", 0) + 1
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
    tmp.write_text(json.dumps({**report.to_dict(), **extra}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def build(images, labels, out, format: str = "lmdb", *, quality: int = 95, exif: str = "apply",
          workers: Optional[int] = None, on_corrupt: str = "fail", resume: bool = True,
          overwrite: bool = False, allow_unlabeled: bool = False, no_labels: bool = False,
          commit_bytes: int = DEFAULT_COMMIT_BYTES, store_options: Optional[dict] = None,
          report_path=None, progress: bool = False) -> BuildReport:
    """Pack an image folder and its labels into a store, checking every image on the way in.

    Args:
        images: IMAGES folder (walked recursively, sorted).
        labels: LABELS folder / CSV / JSON file, or None (class-per-subfolder).
        out: where to publish the store (a path, or ``mongodb://host/db/collection``).
        format: a name from :func:`packer.stores.available_formats`.
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
        progress: show a tqdm progress bar.

    Returns:
        BuildReport.

    Raises:
        UsageError, SourceError, StoreError.

    Example:
        >>> r = build("imgs", None, "out.lmdb", workers=4)   # doctest: +SKIP
        >>> r.published, r.records                          # doctest: +SKIP
        (True, 1000)
    """
    if on_corrupt not in ON_CORRUPT:
        raise UsageError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
    if exif not in EXIF_MODES:
        raise UsageError(f"exif must be one of {EXIF_MODES}, got {exif!r}")
    if not 1 <= int(quality) <= 100:
        raise UsageError(f"quality must be 1..100, got {quality}")
    out = str(out)
    store_cls = get_store(format)
    store_options = dict(store_options or {})
    connection = {k: v for k, v in store_options.items() if k in store_cls.connection_options}
    content_store_options = {k: v for k, v in store_options.items() if k not in connection}
    if store_cls.exists(out, **connection) and not overwrite:
        raise UsageError(f"{out} already exists (hint: --overwrite replaces it)")
    sources = collect_sources(images, labels, allow_unlabeled=allow_unlabeled, no_labels=no_labels)
    workers = max(1, int(workers or os.cpu_count() or 1))
    content_options = {"quality": int(quality), "exif": exif, "store_options": content_store_options}
    fingerprint = _fingerprint(format, sources, content_options)
    report_path = Path(report_path) if report_path else default_report_path(out)

    converted, notes = [], []
    with store_cls.create_writer(out, commit_bytes=commit_bytes, **store_options) as writer:
        state = writer.open(fingerprint, resume=resume)
        resumed_from = state.next_input
        tasks = [(pos, str(sources.path(key)), key, int(quality), exif)
                 for pos, key in enumerate(sources.keys) if pos >= state.next_input]
        bar = _progress_bar(len(sources.keys), state.next_input, progress, "packing")
        stopped = False
        try:
            for pos, checked, reason in _ordered_results(tasks, workers, window=workers * 16):
                key = sources.keys[pos]
                if checked is None:
                    state.rejects.append({"path": key, "reason": reason})
                    log.warning("%s: %s", sources.path(key), reason)
                else:
                    rec = dataclasses.replace(checked, index=state.next_index, label=sources.labels[pos])
                    writer.add(rec)
                    _add_stats(state.stats, rec, sources.label_schema)
                    state.next_index += 1
                    if rec.converted:
                        converted.append({"path": key, "converted": rec.converted})
                    if rec.notes:
                        notes.extend({"path": key, "note": n} for n in rec.notes)
                state.next_input = pos + 1
                writer.checkpoint(state)
                bar.update(1)
                if checked is None and on_corrupt == "stop":
                    stopped = True
                    break
        finally:
            bar.close()
        writer.flush()
        publish = not state.rejects or on_corrupt == "skip"
        if publish and not stopped:
            hasher, n = IndexHasher(), 0
            for idx, key, rec_sum in writer.iter_index():
                if idx != n:
                    raise StoreError(f"{out}: staging area has a gap at index {n} (found {idx})")
                hasher.update(idx, key, rec_sum)
                n += 1
            if n != state.next_index:
                raise StoreError(f"{out}: staging area holds {n} records, expected {state.next_index}")
            stats = dict(state.stats, inputs=len(sources.keys), rejected=len(state.rejects),
                         ignored=len(sources.ignored))
            meta = StoreMetadata(
                format=format, count=n, label_schema=sources.label_schema,
                class_names=list(sources.class_names),
                build_options={"quality": int(quality), "exif": exif, "on_corrupt": on_corrupt,
                               "labels": sources.label_source, "images": str(sources.root),
                               "store_options": content_store_options},
                index_checksum=hasher.hexdigest(), packer_version=__version__,
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                stats=stats)
            writer.publish(meta, overwrite=overwrite)
        published = publish and not stopped

    report = BuildReport(location=out, format=format, published=published, records=state.next_index,
                         inputs=len(sources.keys), rejected=list(state.rejects), converted=converted,
                         notes=notes, ignored=list(sources.ignored), resumed_from=resumed_from,
                         report_path=str(report_path), label_schema=sources.label_schema)
    _write_report(report_path, report, {"on_corrupt": on_corrupt, "stopped_early": stopped})
    return report


def _progress_bar(total: int, initial: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="img", disable=not enabled, dynamic_ncols=True,
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
    fmt = format or detect_format(location)
    try:
        reader = open_store(location, fmt, **reader_options)
    except StoreError as exc:
        return VerifyReport(location, fmt, 0, 0, deep, [Problem(str(exc))])
    with reader:
        meta = reader.metadata
        problems = [Problem(p) for p in reader.check_structure()]
        n_present = len(reader)
        if n_present != meta.count:
            problems.append(Problem(f"{location}: holds {n_present} records, metadata says {meta.count}"))
        hasher = IndexHasher()
        checked = 0
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
        if hasher.hexdigest() != meta.index_checksum:
            problems.append(Problem(f"{location}: index checksum mismatch (records were added, removed, "
                                    f"reordered or renamed since the build)"))
        return VerifyReport(location, fmt, meta.count, checked, deep, problems)


def info(location, *, format: Optional[str] = None, pixel_sample: int = 256, seed: int = 0,
         **reader_options) -> InfoReport:
    """Count, size, image-size distribution, label summary and build options of a store.

    ``pixel_sample`` records (seeded by ``seed``) are decoded at reduced scale for the
    per-channel pixel mean/std in ``InfoReport.pixels`` (0 skips it).
    """
    from .report.sampling import pixel_stats

    location = str(location)
    fmt = format or detect_format(location)
    with open_store(location, fmt, **reader_options) as reader:
        pixels = pixel_stats(reader, pixel_sample, seed) if pixel_sample > 0 else None
        return InfoReport(location, fmt, reader.metadata.count, reader.size_bytes(),
                          asdict(reader.metadata), reader.encoding,
                          list(reader.raw_shape) if reader.raw_shape else None, pixels)


__all__ = ["build", "verify", "info", "BuildReport", "VerifyReport", "InfoReport", "Problem",
           "PackerError", "UsageError"]
