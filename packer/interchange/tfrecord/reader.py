"""TFRecord scan: every record of the files a source names, its key, locator, label and metadata,
with damaged framing, CRCs and Examples listed."""
from __future__ import annotations

import logging
import os
import re
from typing import Optional

import numpy as np

from packer.core import remote
from packer.core.paths import safe_relative
from packer.core.records import UNLABELED_CLASS, label_from_json
from packer.interchange.base import Scan, ScanOptions, pin_of_object
from packer.interchange.tfrecord.example import PACKER_LABEL, Sample, read_sample, yolo_rows
from packer.interchange.tfrecord.files import (
    SUFFIX_RE,
    Problems,
    example_class,
    is_gzip,
    is_pattern,
    iter_records,
    list_files,
    require_crc,
)
from packer.interchange.tfrecord.labelmap import LABEL_MAP, Names, read_label_map

log = logging.getLogger(__name__)


def _display_names(files: list) -> list:
    if len(files) == 1:
        return [os.path.basename(files[0]) if not remote.is_url(files[0]) else remote.basename(files[0])]
    if remote.is_url(files[0]):   # relative to the folder they share
        root = os.path.commonprefix(files).rpartition("/")[0] + "/"
        return [f[len(root):] for f in files]
    root = os.path.commonpath([os.path.abspath(f) for f in files])
    return [os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/") for f in files]


def _stem(shown: str) -> str:
    base = re.sub(r"(?i)\.(gz|gzip)$", "", shown)
    return SUFFIX_RE.sub("", base)


def _find_label_map(path: str, files: list, storage_options=None) -> Optional[str]:
    if remote.is_url(files[0]):
        folder = path if path.endswith("/") and not is_pattern(path) else remote.parent(files[0])
        candidate = remote.join(folder, LABEL_MAP)
        return candidate if remote.exists(candidate, storage_options) else None
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(files[0]))
    candidate = os.path.join(folder, LABEL_MAP)
    return candidate if os.path.isfile(candidate) else None


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List every record of the TFRecord data at ``path`` (see the module doc).

    Raises:
        UsageError: no TFRecord file at ``path``, or a damaged ``label_map.pbtxt``.
        DependencyError: tfrecord / protobuf / a CRC32C library is missing.
    """
    options = options or ScanOptions()
    text = os.fspath(path)
    example_cls, decode_error = example_class()
    crc_fn = require_crc()
    opts = options.storage_options
    files = list_files(text, opts)
    names, problems, samples = Names(), Problems(), []
    label_map = _find_label_map(text, files, opts)
    if label_map:
        for cid, name in sorted(read_label_map(label_map, opts).items()):
            names.bind([(cid, name)])
    fingerprint = []
    for file, shown in zip(files, _display_names(files)):
        url = remote.is_url(file)
        try:
            info = remote.input_info(file, opts)
            gz = is_gzip(file, opts, info)
        except OSError as exc:
            problems.add(shown, f"cannot read the file: {exc.strerror or exc}", "unreadable")
            continue
        except remote.RemoteError as exc:
            if exc.transient:
                raise
            problems.add(shown, f"cannot read the file: {exc}", "unreadable")
            continue
        # a local file: (name, size, mtime_ns); an object: (URL, size, ETag), the ETag pinned for every read
        fingerprint.append((file, info.size, info.version) if url else (shown, info.size, int(info.version)))
        path_abs, stem = (file if url else os.path.abspath(file)), _stem(shown)
        pin = pin_of_object(file, info, opts)
        for recno, data_at, record in iter_records(file, shown, crc_fn, problems, opts, info if url else None):
            where = f"{shown}:record {recno}"
            try:
                sample = read_sample(record, data_at, path_abs, gz, example_cls, names)
                if pin and sample.locator[0] == "range":
                    sample.locator = sample.locator + pin
            except decode_error as exc:
                problems.add(where, f"not a tf.train.Example ({exc}); record skipped")
                continue
            except ValueError as exc:
                problems.add(where, f"{exc}; record skipped")
                continue
            sample.shown, sample.stem, sample.recno = shown, stem, recno
            samples.append(sample)
    return _finish(text, samples, names, problems, fingerprint, options, label_map)


def _schema_of(samples: list) -> str:
    kinds = set()
    for s in samples:
        has, value = s.packed
        if has:
            kinds.add("objects" if isinstance(value, dict) else "boxes" if isinstance(value, list)
                      else "class" if isinstance(value, int) and not isinstance(value, bool) else "unlabeled")
        if s.raw:
            kinds.add(s.raw[0])
    for schema in ("objects", "boxes", "class"):
        if schema in kinds:
            return schema
    return "none"


def _raw_label(raw, schema: str, names: Names):
    """The label the TF OD features give in ``schema`` (None: they give none there)."""
    from packer.labels.model import as_label_model

    if raw is None:
        return None
    if raw[0] == "boxes":
        rows = yolo_rows(raw[1], raw[2], names)
        return rows if schema == "boxes" else as_label_model(rows) if schema == "objects" else None
    cid, text = raw[1]
    cid = cid if cid is not None else names.by_name[text]
    return cid if schema == "class" else as_label_model(cid) if schema == "objects" else None


def _agrees(packed, raw_label, schema: str) -> bool:
    """Does packer/label say what the TF OD features beside it say (up to their float32 rounding)?"""
    if raw_label is None:
        return True
    if schema == "boxes":
        a = np.asarray(packed, np.float64).reshape(-1, 5)
        b = np.asarray(raw_label, np.float64)
        return a.shape == b.shape and np.array_equal(a[:, 0], b[:, 0]) and np.allclose(a, b, rtol=0, atol=1e-5)
    if schema == "objects":
        def classes(lab):
            return [o.get("class") for o in (lab or {}).get("objects", []) if "box" in o]
        return classes(packed) == classes(raw_label)
    return packed == raw_label


def _label_of(s: Sample, schema: str, names: Names):
    """``(label, explicit)`` of one sample; ValueError for a packer/label that does not fit."""
    raw_label = _raw_label(s.raw, schema, names)
    has, value = s.packed
    if not has:
        return raw_label, raw_label is not None
    try:
        label = label_from_json(value, schema)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{PACKER_LABEL} is not a {schema} label: {exc}") from exc
    if schema == "class" and not isinstance(value, int) and value is not None:
        raise ValueError(f"{PACKER_LABEL} holds {type(value).__name__}, expected a class id")
    if schema in ("boxes", "objects") and value is not None and not isinstance(value, (list, dict)):
        raise ValueError(f"{PACKER_LABEL} holds {type(value).__name__}, expected {schema}")
    if not _agrees(label, raw_label, schema):
        raise ValueError(f"{PACKER_LABEL} disagrees with the image/object or image/class features "
                         f"(edited after export?)")
    return label, True


def _keys(samples: list) -> list:
    names = [s.filename for s in samples]
    if names and all(n and safe_relative(n) is None for n in names) and len(set(names)) == len(names):
        return names
    if any(names):
        log.info("image/filename is missing, unsafe or repeated: keys are <file stem>/<record no>.<ext>")
    return [s.fallback for s in samples]


def _finish(text, samples, names: Names, problems: Problems, fingerprint, options: ScanOptions,
            label_map) -> Scan:
    names.resolve()
    schema = _schema_of(samples)
    scan = Scan(root=text, label_schema=schema, fingerprint=fingerprint)
    kept, used_max = [], -1
    for s in samples:
        try:
            label, explicit = _label_of(s, schema, names)
        except ValueError as exc:
            problems.add(s.display, f"{exc}; record skipped")
            continue
        s.raw = s.packed = None   # keep the label only
        if not explicit and schema != "none":
            if not options.allow_unlabeled:
                problems.add(s.display, "no label (no image/class/label, image/object/bbox/* or packer/label "
                                        "while other records have one; --allow-unlabeled keeps it)", "unlabeled")
                continue
            label = UNLABELED_CLASS if schema == "class" else None
        used_max = max(used_max, _max_class(label))
        s.label = label
        kept.append(s)
    samples.clear()
    scan.class_names = names.class_names(used_max)
    keys = _keys(kept)
    for i, (key, s) in enumerate(zip(keys, kept)):
        scan.keys.append(key)
        scan.locators.append(s.locator)
        scan.displays.append(s.display)
        scan.labels.append(s.label)
        scan.metadata.append(s.metadata)
        kept[i] = None
    scan.problems = list(problems)
    scan.label_source = {"boxes": "tfrecord image/object/bbox (TF Object Detection API)",
                         "class": "tfrecord image/class/label", "objects": "tfrecord packer/label",
                         "none": "tfrecord (no labels)"}[schema] + (f" + {LABEL_MAP}" if label_map else "")
    return scan


def _max_class(label) -> int:
    if isinstance(label, (int, np.integer)):
        return int(label)
    if isinstance(label, np.ndarray):
        return int(label[:, 0].max()) if len(label) else -1
    if isinstance(label, dict):
        ids = [o.get("class") for o in label.get("objects", [])] + [label.get("class")]
        return max((i for i in ids if isinstance(i, int)), default=-1)
    return -1
