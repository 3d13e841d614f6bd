"""Label writers for ``packer export``: one small class per label form, in a registry.

A writer gets every exported image's relative path and label and writes the label files in one
form that :func:`packer.sources.folders.collect_sources` reads back, so ``packer build OUT/images
LABELS`` rebuilds the store. Adding a form (COCO, VOC, YOLO-seg, ...) is one class::

    @register_label_writer("coco")
    class CocoWriter(LabelWriter):
        def add(self, key, label): ...
        def finish(self): ...; return self.out / "labels.json"

Interface (:class:`LabelWriter`): ``__init__(out, meta)`` (``out`` = the export folder, ``meta`` =
the store's :class:`~packer.core.records.StoreMetadata`), ``add(key, label)`` once per exported
image (``key`` = its path under ``OUT/images``, label as in :mod:`packer.core.records`), and
``finish()`` returning the LABELS argument for ``packer build`` (None when the images carry
their labels, as class folders do). A writer with ``takes_records = True`` gets the record too
(``add(key, label, record=...)``: its metadata, size, ...). ``notes`` says what the export could
not write exactly as the source had it. :func:`infer_label_form` picks the form the store was
built from (``build_options["labels"]``).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path, PurePosixPath
from typing import Optional

import numpy as np

from packer.core.errors import UsageError
from packer.core.records import StoreMetadata

LABEL_WRITERS: dict = {}


def register_label_writer(name: str):
    """Class decorator: make a :class:`LabelWriter` available as ``export(..., labels_form=name)``."""
    def deco(cls):
        cls.name = name
        LABEL_WRITERS[name] = cls
        return cls
    return deco


def get_label_writer(name: str):
    try:
        return LABEL_WRITERS[name]
    except KeyError:
        raise UsageError(f"unknown label form {name!r}; known: {sorted(LABEL_WRITERS)}") from None


def infer_label_form(meta: StoreMetadata) -> str:
    """The label form a store was built from: ``folders``, ``yolo``, ``json``, ``csv``,
    ``json-map`` or ``none`` (from ``build_options["labels"]`` and the label schema), or for
    stores of ``"objects"`` labels the format they were parsed from (``coco``, ``voc``,
    ``masks``, ``yolo``: ``label_info["format"]``, written by :mod:`packer.labels`)."""
    source = str((meta.build_options or {}).get("labels", ""))
    if meta.label_schema == "none" or source == "none":
        return "none"
    parsed = (meta.label_info or {}).get("format")
    if meta.label_schema == "objects":
        return parsed if parsed in _OBJECT_FORMS else "coco"   # COCO holds any objects label
    if source == "class-per-subfolder":
        return "folders"
    if source.lower().endswith(".csv"):
        return "csv"
    if source.lower().endswith(".json"):
        return "json-map"
    return "yolo" if meta.label_schema == "boxes" else "json"


class LabelWriter:
    """Base class (see the module docstring). ``skipped`` lists keys whose label cannot be
    written in this form (e.g. unlabeled images); export reports them."""

    name = ""
    #: True: ``add`` takes the record as ``record=`` (export passes it)
    takes_records = False

    def __init__(self, out: Path, meta: StoreMetadata):
        self.out = Path(out)
        self.meta = meta
        self.names = list(meta.class_names or [])
        self.skipped: list = []
        self.notes: list = []

    def class_value(self, cid: int):
        """Class id -> the name the store was built with (or the id when it had none)."""
        return self.names[cid] if 0 <= cid < len(self.names) else int(cid)

    def add(self, key: str, label) -> None:
        raise NotImplementedError

    def finish(self) -> Optional[Path]:
        raise NotImplementedError


@register_label_writer("none")
class NoLabels(LabelWriter):
    def add(self, key, label):
        pass

    def finish(self):
        return None


@register_label_writer("folders")
class ClassFolders(LabelWriter):
    """Class-per-subfolder: the keys already hold the class folder; checks they agree."""

    def add(self, key, label):
        top = key.split("/", 1)[0]
        if not isinstance(label, (int, np.integer)) or label < 0 or str(self.class_value(int(label))) != top:
            self.skipped.append({"key": key, "reason": f"label {label!r} does not match its folder {top!r}"})

    def finish(self):
        return None


class _PerImage(LabelWriter):
    suffix = ""

    def path_for(self, key: str) -> Path:
        p = self.out / "labels" / PurePosixPath(key).with_suffix(self.suffix)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self):
        (self.out / "labels").mkdir(parents=True, exist_ok=True)
        return self.out / "labels"


@register_label_writer("yolo")
class YoloTxt(_PerImage):
    """``labels/<dir>/<stem>.txt``: a YOLO store's files as they went in (their text is kept in
    the record metadata), other labels as ``class cx cy w h`` / polygon rows (empty file: no
    objects); ``classes.txt`` (plus ``obj.names`` / ``data.yaml`` where the source named its
    classes there) when the store has class names. See :mod:`packer.labels.yolo`."""

    suffix = ".txt"
    takes_records = True

    def __init__(self, out, meta):
        super().__init__(out, meta)
        self.own_form = (meta.label_info or {}).get("format") == "yolo"
        self.inexact = 0

    def finish(self):
        from packer.labels.yolo import write_class_names
        labels = super().finish()
        write_class_names(labels, self.names, self.meta.label_info if self.own_form else None)
        if self.inexact:
            self.notes.append(
                f"{self.inexact} YOLO label file(s) written from the stored float32 rows: the store was built "
                f"before packer kept each file's text, so values read back the same but the text may differ from "
                f"the original files (e.g. 0.500000 -> 0.5); rebuild it from the original files for exact export")
        return labels

    def add(self, key, label, record=None):
        from packer.labels.yolo import label_file_text
        if label is None:
            self.skipped.append({"key": key, "reason": "unlabeled (no label file written)"})
            return
        text, exact = label_file_text(label, record.metadata if record is not None else None)
        if self.own_form and not exact:
            self.inexact += 1
        self.path_for(key).write_bytes(text.encode("utf-8"))   # bytes: no newline translation


@register_label_writer("json")
class JsonPerImage(_PerImage):
    """``labels/<dir>/<stem>.json``: ``{"class": name-or-id}`` or ``{"boxes": [[c, cx, cy, w, h]]}``."""

    suffix = ".json"

    def add(self, key, label):
        if label is None or (isinstance(label, (int, np.integer)) and label < 0):
            self.skipped.append({"key": key, "reason": "unlabeled (no label file written)"})
            return
        if isinstance(label, (int, np.integer)):
            value = {"class": self.class_value(int(label))}
        else:
            value = {"boxes": [[float(v) for v in row] for row in np.asarray(label, np.float32).reshape(-1, 5)]}
        self.path_for(key).write_text(json.dumps(value), encoding="utf-8")


class _Mapping(LabelWriter):
    def __init__(self, out, meta):
        super().__init__(out, meta)
        self.rows: dict = {}

    def add(self, key, label):
        if not isinstance(label, (int, np.integer)) or label < 0:
            self.skipped.append({"key": key, "reason": "unlabeled (left out of the mapping)"})
            return
        self.rows[key] = self.class_value(int(label))


@register_label_writer("csv")
class CsvMapping(_Mapping):
    """``labels.csv``: header ``path,label`` then one row per image."""

    def finish(self):
        path = self.out / "labels.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["path", "label"])
            for key, value in self.rows.items():
                w.writerow([key, value])
        return path


@register_label_writer("json-map")
class JsonMapping(_Mapping):
    """``labels.json``: ``{"relative/path.jpg": label, ...}`` (class labels; boxes as rows)."""

    def add(self, key, label):
        if label is not None and not isinstance(label, (int, np.integer)):
            self.rows[key] = [[float(v) for v in row] for row in np.asarray(label, np.float32).reshape(-1, 5)]
            return
        super().add(key, label)

    def finish(self):
        path = self.out / "labels.json"
        path.write_text(json.dumps(self.rows, indent=1), encoding="utf-8")
        return path


class _ParsedForm(LabelWriter):
    """A form written by :data:`packer.labels.WRITERS` (``write_x(records, class_names, out,
    label_info)``): the records' labels (not their bytes) are kept until :meth:`finish`, which
    writes them in one go, in the source's own layout when the store was built from that form
    (e.g. a COCO store exports the same COCO document, a VOC store byte-identical XML)."""

    form = ""
    target = ""      # where the writer writes, under the export folder
    takes_records = True
    #: write no file for an image stored without a label (its source had none)
    skip_unlabeled = False

    def __init__(self, out, meta):
        super().__init__(out, meta)
        self.records: list = []

    def add(self, key, label, record=None):
        if record is None:
            raise UsageError(f"--labels-form {self.form} needs the records (export passes them)")
        if label is None and self.skip_unlabeled:
            self.skipped.append({"key": key, "reason": "unlabeled (no label file written)"})
            return
        self.records.append(record)

    def finish(self):
        from packer.labels import WRITERS
        path = self.out / self.target
        if not self.target.endswith((".json", ".csv")):
            path.mkdir(parents=True, exist_ok=True)
        WRITERS[self.form](self.records, self.names, path, dict(self.meta.label_info or {}))
        return path


def _parsed_form(form: str, target: str, register_as: Optional[str] = None, skip_unlabeled: bool = False):
    cls = type(f"{form.title()}Form", (_ParsedForm,),
               {"form": form, "target": target, "skip_unlabeled": skip_unlabeled,
                "__doc__": f"``{target}`` written by packer.labels' {form} writer."})
    return register_label_writer(register_as or form)(cls)


_OBJECT_FORMS = ("coco", "voc", "masks", "yolo")
# An image stored unlabeled (--allow-unlabeled) had no annotation file / no COCO image entry:
# writing one would make the rebuild see "no objects" instead of "unlabeled".
_parsed_form("coco", "instances.json", skip_unlabeled=True)
_parsed_form("voc", "labels", skip_unlabeled=True)
_parsed_form("masks", "labels", skip_unlabeled=True)
_parsed_form("csv", "labels.csv", register_as="csv-source")


__all__ = ["LabelWriter", "LABEL_WRITERS", "register_label_writer", "get_label_writer", "infer_label_form"]
