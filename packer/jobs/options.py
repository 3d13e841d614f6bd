"""The options a build takes, in one typed object checked once.

:func:`packer.build` (and ``packer build``) turns its keyword arguments into a
:class:`BuildOptions`; the local build, the distributed engine, and ``append`` pass that object
on instead of re-passing each option by hand.

Example:
    >>> opts = BuildOptions(quality=90, on_corrupt="skip")
    >>> opts.replace(workers=2).workers
    2
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional

from packer.core.errors import UsageError
from packer.core.integrity import DEFAULT_MAX_PIXELS, EXIF_MODES
from packer.core.workers import EXECUTORS
from packer.stores.base import DEFAULT_COMMIT_BYTES

#: What ``on_corrupt`` takes.
ON_CORRUPT = ("fail", "skip", "stop")

#: The options of :func:`packer.sources.folders.collect_sources` (image folders only).
FOLDER_OPTIONS = ("labels_format", "clip_boxes", "csv_columns", "masks")
#: The options of interchange inputs (``--from``, ``--split``, ...).
DATASET_OPTIONS = ("source_format", "split", "image_column", "label_column")


@dataclass(frozen=True)
class BuildOptions:
    """Everything a build can be told besides IMAGES, LABELS, OUT and the format.

    Attributes:
        quality: JPEG quality for images that must be re-encoded (1..100).
        exif: ``"apply"`` (rotate pixels, re-encode) or ``"record"`` (store the orientation).
        workers: checking/encoding processes (None: all cores). The store is identical
            whatever the count.
        on_corrupt: ``"fail"`` (check everything, list every damaged input, publish nothing),
            ``"skip"`` (publish without the damaged inputs, listed in the report) or ``"stop"``
            (halt at the first damaged input). The work done is kept for a resume either way.
        resume: continue a partial build of the same inputs and options (else start over).
        overwrite: replace an existing packer store at the output (never anything else).
        allow_unlabeled / no_labels: see :func:`packer.sources.folders.collect_sources`.
        commit_bytes: write-batch size.
        store_options: backend options (e.g. ``{"pixels": "224x224"}`` for HDF5, ``uri``).
        report_path: the report file (default: next to the output).
        progress: show a tqdm progress bar (drawn only when stderr is a terminal).
        labels_format / clip_boxes / csv_columns / masks: how to read the label files (see
            :func:`packer.sources.folders.collect_sources`).
        shard: ``"I/N"`` or ``(I, N)``: build only the I-th of N contiguous parts of the sorted
            input list (:mod:`packer.core.sharding`).
        classes: pin the class-name -> id map (a names file, JSON, or a store;
            :mod:`packer.sources.classes`).
        max_size: store images downscaled to at most this many pixels on the long side.
        max_pixels: refuse images whose header promises more pixels (decompression bombs);
            0 = no limit.
        executor: ``"auto"``, ``"process"``, ``"thread"`` or ``"inline"``
            (:mod:`packer.core.workers`).
        source_format / split / image_column / label_column: the input as a dataset of another
            stack (:mod:`packer.interchange`).
        storage_options: fsspec's options for inputs in a bucket (credentials, endpoint): passed
            to every read of IMAGES/LABELS/a dataset there; never printed, written or compared.

    Raises:
        UsageError: an option out of range, named in the message (at construction).
    """

    quality: int = 95
    exif: str = "apply"
    workers: Optional[int] = None
    on_corrupt: str = "fail"
    resume: bool = True
    overwrite: bool = False
    allow_unlabeled: bool = False
    no_labels: bool = False
    commit_bytes: int = DEFAULT_COMMIT_BYTES
    store_options: dict = field(default_factory=dict)
    report_path: Optional[str] = None
    progress: bool = False
    labels_format: Optional[str] = None
    clip_boxes: bool = False
    csv_columns: object = None
    masks: Optional[str] = None
    shard: object = None
    classes: Optional[str] = None
    max_size: Optional[int] = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    executor: str = "auto"
    source_format: Optional[str] = None
    split: Optional[str] = None
    image_column: Optional[str] = None
    label_column: Optional[str] = None
    storage_options: Optional[dict] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        for name in ("quality", "max_pixels", "max_size", "commit_bytes"):
            if not _whole(getattr(self, name)):
                raise UsageError(f"{name} must be a whole number, got {getattr(self, name)!r}")
        if self.on_corrupt not in ON_CORRUPT:
            raise UsageError(f"on_corrupt must be one of {ON_CORRUPT}, got {self.on_corrupt!r}")
        if self.exif not in EXIF_MODES:
            raise UsageError(f"exif must be one of {EXIF_MODES}, got {self.exif!r}")
        if not 1 <= int(self.quality) <= 100:
            raise UsageError(f"quality must be 1..100, got {self.quality}")
        if self.max_size is not None and int(self.max_size) < 1:
            raise UsageError(f"max_size must be >= 1 pixel, got {self.max_size}")
        if int(self.max_pixels) < 0:
            raise UsageError(f"max_pixels must be >= 0 (0 = no limit), got {self.max_pixels}")
        if self.executor not in EXECUTORS:
            raise UsageError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        set_ = object.__setattr__   # frozen: normalized once, here
        set_(self, "quality", int(self.quality))
        set_(self, "max_pixels", int(self.max_pixels))
        set_(self, "max_size", None if self.max_size is None else int(self.max_size))
        set_(self, "store_options", dict(self.store_options or {}))

    @classmethod
    def split_kwargs(cls, kwargs: dict, base: Optional["BuildOptions"] = None) -> tuple["BuildOptions", dict]:
        """``(base with the known keywords set, the other keywords)``: the others are an
        engine's options (``shards``, ``scheduler``...).

        Raises:
            UsageError: a known keyword has a bad value.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in kwargs.items() if k in names}
        return ((base or cls()).replace(**known) if known else (base or cls()),
                {k: v for k, v in kwargs.items() if k not in names})

    def replace(self, **changes) -> "BuildOptions":
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_kwargs(self) -> dict:
        """The options as :func:`packer.build`'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def worker_count(self) -> int:
        """``workers``, or every core when None."""
        return max(1, int(self.workers or os.cpu_count() or 1))

    def folder_options(self) -> dict:
        """The options that only an image folder input takes."""
        return {k: getattr(self, k) for k in FOLDER_OPTIONS}

    def dataset_options(self) -> dict:
        """The options that only a dataset input (``--from``) takes."""
        return {k: getattr(self, k) for k in DATASET_OPTIONS}

    def connection(self, store_cls) -> dict:
        """The store options that say where the store is (e.g. ``uri``), not what it holds."""
        return {k: v for k, v in self.store_options.items() if k in store_cls.connection_options}

    def content_store_options(self, store_cls) -> dict:
        """The store options that shape what the store holds (recorded in its metadata)."""
        return {k: v for k, v in self.store_options.items() if k not in store_cls.connection_options}


def _whole(value) -> bool:
    """None, or a whole number (an int, an integral float, or its digits as text)."""
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and value.strip().lstrip("-").isdigit()


__all__ = ["BuildOptions", "ON_CORRUPT"]
