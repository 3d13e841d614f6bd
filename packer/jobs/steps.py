"""The named steps that the jobs compose: checking inputs on workers, fingerprinting a job's
inputs for resume, binding labels to checked images, and the statistics ``info`` shows.

A build is ``plan -> check inputs -> stage records -> seal -> publish -> report``: the staging,
sealing and publishing are :class:`packer.stores.staging.Stage`; the checking, the fingerprint
and the statistics are here; the reports are :mod:`packer.jobs.reports`.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import os
import re
import stat

import numpy as np

from packer.core import remote
from packer.core.errors import ImageError
from packer.core.integrity import process_image
from packer.core.records import Record, label_to_json
from packer.core.uri import redact
from packer.core.workers import ordered_map
from packer.interchange.base import read_locator
from packer.labels.model import bind_to_image
from packer.sources.folders import Sources

#: At most this many distinct image sizes are counted one by one in the statistics.
MAX_SIZE_BUCKETS = 200
#: Inputs in a bucket one checking worker reads at once. A GET waits mostly on the network (tens
#: of ms to S3, against a few ms to check an image), so each worker is handed this many inputs
#: and reads them on as many threads before checking them one by one.
FETCH_BATCH = 16


class Unreachable(str):
    """The reason an input could not be read when its server did not answer within the retry
    budget (not: the object is missing, changed or forbidden); a build that meets several in a
    row stops instead of waiting out the budget for every remaining input (:mod:`packer.jobs.pack`)."""


def read_url(locator) -> tuple:
    """``(raw, None)`` or ``(None, reason)`` for a ``("url", url, size, version[, storage_options])``
    locator: the object's bytes, pinned to the listed version (a replaced object is refused)."""
    url, size, version = locator[1:4]
    opts = locator[4] if len(locator) > 4 else None
    try:
        raw = remote.read(url, version=version, storage_options=opts)
    except remote.RemoteError as exc:
        reason = f"cannot read: {exc}"
        return None, Unreachable(reason) if exc.transient else reason
    if len(raw) != size:
        return None, f"cannot read: {redact(url)}: {len(raw)} bytes arrived, {size} listed"
    return raw, None


def read_input(path):
    """The bytes of one input, or why they cannot be read: ``(raw, None)`` or ``(None, reason)``.
    ``path`` is a file, an object in a bucket (``("url", ...)``: :func:`read_url`), or an
    interchange locator (bytes in a local shard or, pinned, in a shard in a bucket, or carried
    along: :func:`packer.interchange.base.read_locator`)."""
    if isinstance(path, tuple) and path[0] == "url":
        return read_url(path)
    if isinstance(path, tuple) and path[0] == "fetched":   # read already (check_batch)
        return path[1], path[2]
    if isinstance(path, tuple):
        try:
            return read_locator(path), None
        except remote.RemoteError as exc:   # a range of a shard in a bucket
            reason = f"cannot read: {exc}"
            return None, Unreachable(reason) if exc.transient else reason
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


def check_one(task):
    """Worker: read and check one input. ``task`` is ``(position, path or locator, key, quality,
    exif, max_size, max_pixels)``; returns ``(position, Record | None, reason)``."""
    pos, path, key, quality, exif, max_size, max_pixels = task
    raw, reason = read_input(path)
    if raw is None:
        return pos, None, reason
    try:
        return pos, process_image(key, raw, quality=quality, exif=exif, max_size=max_size,
                                  max_pixels=max_pixels), None
    except ImageError as exc:
        return pos, None, exc.reason


def is_remote_input(path) -> bool:
    """Whether reading ``path`` (a task's input) is a request to a bucket."""
    return isinstance(path, tuple) and (path[0] == "url" or (path[0] == "range" and remote.is_url(path[1])))


def check_batch(tasks):
    """Worker: :func:`check_one` for each of ``tasks``, the inputs in a bucket read first on
    one thread each (their GETs overlap; the checks then run one by one on this worker)."""
    far = [i for i, t in enumerate(tasks) if is_remote_input(t[1])]
    if len(far) > 1:
        with cf.ThreadPoolExecutor(len(far), thread_name_prefix="packer-get") as pool:
            got = dict(zip(far, pool.map(lambda i: read_input(tasks[i][1]), far)))
        tasks = [(t[0], ("fetched", *got[i]), *t[2:]) if i in got else t for i, t in enumerate(tasks)]
    return [check_one(t) for t in tasks]


def _batches(tasks, size: int):
    batch = []
    for t in tasks:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def worker_init():
    """Initializer of a checking worker: Ctrl-C is the parent's to handle; OpenCV on one thread."""
    import signal

    # Ctrl-C goes to the whole process group: the parent stops the pool and keeps the work
    # done; workers dying of KeyboardInterrupt mid-task would only add tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import cv2
        cv2.setNumThreads(1)
    except ImportError:
        pass


def fingerprint(fmt: str, sources: Sources, content_options: dict) -> str:
    """What identifies a build's inputs and content options: a rerun with the same fingerprint
    resumes its staging area."""
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


def check_images(tasks, workers: int, window: int, executor: str = "auto", batch: int = 1):
    """Yield worker results in task order, at most ``window`` tasks in flight (bounded memory).

    See :mod:`packer.core.workers`: spawn processes where the main module allows, threads otherwise;
    a dead worker raises WorkerError instead of hanging. ``batch > 1`` hands each worker that many
    tasks at once (:func:`check_batch`: inputs in a bucket, whose GETs then overlap), with at
    least two batches a worker in flight.
    """
    if batch <= 1:
        return ordered_map(check_one, tasks, workers=workers, window=window, executor=executor,
                           initializer=worker_init, describe=lambda task: task[2])
    return _flat(ordered_map(check_batch, _batches(tasks, batch), workers=workers,
                             window=max(2 * workers, window // batch), executor=executor, initializer=worker_init,
                             describe=lambda b: f"{b[0][2]} .. {b[-1][2]} ({len(b)} inputs)"))


def _flat(batches):
    try:
        for results in batches:
            yield from results
    finally:
        batches.close()    # stops the pool now (pack.py closes this generator whatever ends its loop)


def add_stats(stats: dict, rec: Record, label_schema: str) -> None:
    """Count ``rec`` into the running build statistics ``stats`` (what ``info`` shows)."""
    stats["records"] = stats.get("records", 0) + 1
    stats["bytes"] = stats.get("bytes", 0) + len(rec.data)
    stats["source_bytes"] = stats.get("source_bytes", 0) + rec.source_size
    for dim, v in (("width", rec.width), ("height", rec.height)):
        stats[f"{dim}_min"] = min(stats.get(f"{dim}_min", v), v)
        stats[f"{dim}_max"] = max(stats.get(f"{dim}_max", v), v)
        stats[f"{dim}_sum"] = stats.get(f"{dim}_sum", 0) + v
    sizes = stats.setdefault("sizes", {})
    size = f"{rec.width}x{rec.height}"
    if size in sizes or len(sizes) < MAX_SIZE_BUCKETS:
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


def with_label(checked: Record, index: int, sources: Sources, pos: int) -> Record:
    """The checked image's record with its index, label (bound to the image's size), metadata
    and label notes."""
    turned = re.search(r"exif-orientation (\d) applied", checked.converted or "")
    label, notes = bind_to_image(sources.labels[pos], checked.width, checked.height,
                                 int(turned.group(1)) if turned else 1)
    notes = list(checked.notes) + notes + list(sources.label_notes.get(sources.keys[pos], []))
    return dataclasses.replace(checked, index=index, label=label, metadata=dict(sources.metadata[pos]), notes=notes)


__all__ = ["Unreachable", "read_url", "read_input", "check_one", "check_batch", "is_remote_input", "FETCH_BATCH",
           "worker_init", "check_images", "fingerprint", "add_stats", "with_label"]
