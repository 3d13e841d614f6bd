"""What a build reads, as :class:`packer.sources.folders.Sources`: an image folder with its
labels, or a dataset of another stack; then the pinned class map and the shard applied.

``packer build SRC -o OUT`` with SRC a WebDataset, Hugging Face dataset, MDS folder or TFRecord
files: the format's scan lists the samples, their labels and where their image bytes are; the
build's workers read the bytes through the locators, so they go through exactly the checks of a
folder build (strict decode, bombs, EXIF...), resume after a kill, and land in the report when
damaged (the scan's problems are listed like files that could not be read).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from packer.core import remote
from packer.core.errors import SourceError, UsageError
from packer.core.uri import redact
from packer.interchange import ScanOptions, available_formats, detect_input, get_format
from packer.jobs.options import BuildOptions
from packer.sources.folders import Sources, collect_sources

#: What ``--from`` takes: the plain image folder and the interchange formats.
INPUT_FORMATS = ("auto", "folder", *available_formats())


def input_format(images, source_format: Optional[str]) -> str:
    """``"folder"`` or the interchange format of ``images`` (``source_format`` when given).

    Raises:
        UsageError: an unknown format name, or a path that does not exist (and is no pattern).
    """
    if source_format not in (None, "auto"):
        if source_format != "folder":
            get_format(source_format)   # an unknown name is refused here
        return source_format
    text = os.fspath(images)
    if os.path.isdir(text):
        found = detect_input(text)
        return found or "folder"
    if os.path.exists(text) or "{" in text or any(c in text for c in "*?["):
        found = detect_input(text)
        if found:
            return found
        if os.path.exists(text):
            raise UsageError(f"{text}: not a folder of images, nor a dataset packer can read "
                             f"(--from {'|'.join(INPUT_FORMATS[1:])} says what it is)")
    return "folder"


def collect_interchange(images, source_format: str, *, allow_unlabeled: bool = False,
                        no_labels: bool = False, split: Optional[str] = None,
                        image_column: Optional[str] = None, label_column: Optional[str] = None,
                        storage_options: Optional[dict] = None) -> Sources:
    """Scan an interchange dataset (local, or in a bucket: ``storage_options`` are fsspec's) into
    the build's Sources.

    Raises:
        UsageError: the options do not fit the data (an unknown split, an ambiguous column).
        SourceError: nothing usable was found; ``.problems`` lists what was wrong.
    """
    fmt = get_format(source_format)
    scan = fmt.scan(os.fspath(images), ScanOptions(split=split, image_column=image_column,
                                                   label_column=label_column,
                                                   allow_unlabeled=allow_unlabeled or no_labels,
                                                   storage_options=storage_options))
    shown = redact(os.fspath(images))
    if not scan.keys:
        raise SourceError(f"{shown}: no sample found in this {source_format} data",
                          [f"{p['path']}: {p['reason']}" for p in scan.problems])
    dup = len(set(scan.keys)) != len(scan.keys)
    if dup:
        raise SourceError(f"{shown}: the {source_format} data gives two samples the same key",
                          [k for k in _dups(scan.keys)[:20]])
    labels = list(scan.labels) if not no_labels else [None] * len(scan.keys)
    schema = "none" if no_labels else scan.label_schema
    unreadable = [{"path": p["path"], "reason": p["reason"], "kind": p.get("kind", "damaged")}
                  for p in scan.problems]
    if remote.is_url(os.fspath(images)):
        from packer.sources.remote import UrlRoot
        root = UrlRoot(os.fspath(images).rstrip("/"))
    else:
        root = Path(os.fspath(images))
    return Sources(root, list(scan.keys), labels, schema,
                   [] if no_labels else list(scan.class_names), [],
                   "none" if no_labels else (scan.label_source or source_format),
                   metadata=list(scan.metadata) if scan.metadata else None, unreadable=unreadable,
                   locators=scan.locators, displays=list(scan.displays),
                   shard_fingerprint=[list(f) for f in scan.fingerprint])


def _dups(keys) -> list:
    seen, out = set(), []
    for k in keys:
        if k in seen:
            out.append(k)
        seen.add(k)
    return out


def gather_sources(images, labels, options: BuildOptions) -> Sources:
    """What a build reads: an image folder (:func:`packer.sources.folders.collect_sources`) or
    a dataset in an interchange format (:mod:`packer.interchange`: WebDataset, HF datasets, MDS,
    TFRecord), detected from ``images`` or named by ``options.source_format``.

    Raises:
        UsageError: LABELS given with an interchange dataset (its labels are inside it), options
            that fit neither; SourceError: as collect_sources.
    """
    if remote.is_url(labels) and not remote.is_url(images):
        raise UsageError(f"LABELS in a bucket ({redact(labels)}) needs IMAGES in a bucket too; with the local "
                         f"IMAGES {images}, download the labels first")
    listing = None
    if remote.is_url(images):
        from packer.sources.remote import remote_input_format
        kind, listing = remote_input_format(images, options.source_format, options.storage_options)
    else:
        kind = input_format(images, options.source_format)
    shown = redact(os.fspath(images))
    if kind == "folder":
        if options.split or options.image_column or options.label_column:
            raise UsageError("--split/--image-column/--label-column apply to datasets (--from hf|mds|...), "
                             f"not to the image folder {shown}")
        if remote.is_url(images):
            from packer.sources.remote import collect_remote_sources
            return collect_remote_sources(images, labels, allow_unlabeled=options.allow_unlabeled,
                                          no_labels=options.no_labels, storage_options=options.storage_options,
                                          listing=listing, **options.folder_options())
        return collect_sources(images, labels, allow_unlabeled=options.allow_unlabeled,
                               no_labels=options.no_labels, **options.folder_options())
    if labels is not None:
        raise UsageError(f"{shown} is a {kind} dataset: its labels are inside it, LABELS ({redact(str(labels))}) "
                         f"does not apply")
    given = sorted(k for k, v in options.folder_options().items() if v not in (None, False, "auto"))
    if given:
        raise UsageError(f"{shown} is a {kind} dataset: {', '.join(given)} apply to image folders only")
    return collect_interchange(images, kind, allow_unlabeled=options.allow_unlabeled, no_labels=options.no_labels,
                               split=options.split, image_column=options.image_column,
                               label_column=options.label_column, storage_options=options.storage_options)


def pin_and_shard(sources: Sources, classes, shard) -> tuple[Sources, dict | None]:
    """Apply a pinned class map (``--classes``), then keep only shard ``shard`` (``--shard``);
    returns the sources and the shard's description (None when not sharded)."""
    shard_info = None
    if classes is not None:
        from packer.sources.classes import apply_class_map, load_class_map
        sources = apply_class_map(sources, load_class_map(classes), f"--classes {classes}")
    if shard is not None:
        from packer.core.sharding import select_shard
        sources, shard_info = select_shard(sources, shard)
    return sources, shard_info


__all__ = ["INPUT_FORMATS", "input_format", "collect_interchange", "gather_sources", "pin_and_shard"]
