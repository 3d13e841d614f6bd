"""The contract every label form keeps: its ``FORM`` record, what its parser returns, its writers.

A label form (COCO, VOC, YOLO, CSV, masks, packer's per-image JSON, class folders) is one module
of :mod:`packer.labels` that ends with one :class:`LabelForm` record, ``FORM``, listed once in the
registry (:mod:`packer.labels`, ``_MODULES``). From that list come the ``--labels-format`` choices,
the order in which LABELS is recognised, the parser :func:`packer.labels.parse_labels` runs and the
writers ``packer export --labels-form`` offers:

* ``detect(path) -> bool`` says whether LABELS (a file or a folder) holds this form; forms are
  asked in their ``order``, lowest first, and the first to say yes reads it;
* ``parse(labels, root, keys, options)`` reads LABELS as a whole into :class:`ParsedLabels`
  (a per-image form, ``suffix`` set, reads one file with ``parse_file`` instead: a folder of such
  files is walked by :mod:`packer.labels.perimage`);
* ``write(records, class_names, out, label_info)`` writes records' labels back in the form, and
  ``exports`` are the :class:`LabelWriter` classes ``packer export`` can use.

Example (a form read and written as one file)::

    FORM = LabelForm("csv", detect=lambda p: p.is_file() and p.suffix == ".csv", order=40,
                     parse=_parse, write=write_csv, exports=(CsvMapping,), schemas=("class",),
                     choices=("csv",))
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

import numpy as np

from packer.core.errors import UsageError
from packer.core.records import StoreMetadata


@dataclass(frozen=True)
class LabelForm:
    """A label module's ``FORM`` (see the module docstring).

    Attributes:
        name: the form's name (what its parser puts in ``label_info["format"]``).
        detect: ``f(path) -> bool``: LABELS holds this form. Cheap, and False for a path of
            another form; may raise :class:`~packer.core.errors.UsageError` for a path that is
            this form but ambiguous (a folder of COCO files). None: never detected.
        order: detection order, lowest asked first (a folder of VOC ``.xml`` before the
            per-image catch-all).
        parse: ``f(labels, root, keys, options: ParseOptions) -> ParsedLabels`` for LABELS as a
            whole (a COCO file, a ``data.yaml``, a CSV); raises UsageError when ``labels`` is not
            what it reads. None: not read from LABELS (class folders come from IMAGES).
        suffix: per-image forms: the suffix of each image's label file (``".txt"``); a folder of
            them is read by :func:`packer.labels.perimage.parse_folder`. None: not per-image.
        parse_file: per-image forms: ``f(path, clip=False) -> label`` for one file (raises
            ValueError naming it).
        finish_folder: per-image forms: ``f(parsed, folder) -> ParsedLabels``, run after a
            folder of per-image files is read (YOLO: class names, polygons).
        side_files: file names a folder of this form holds that are no image's label
            (``classes.txt``).
        write: ``f(records, class_names, out, label_info=None)``: the records' labels written in
            this form (a file or a folder, as :attr:`RecordsWriter.target` says). None: none.
        exports: the :class:`LabelWriter` classes ``packer export --labels-form NAME`` offers
            (``NAME`` = their ``name``).
        schemas: the label schemas the form holds (``"class"``, ``"boxes"``, ``"objects"``); a
            store of ``"objects"`` built from a form that holds them exports in that form.
        choices: the ``--labels-format`` names that choose this form (empty: detected only).
    """

    name: str
    detect: Optional[Callable] = None
    order: int = 50
    parse: Optional[Callable] = None
    suffix: Optional[str] = None
    parse_file: Optional[Callable] = None
    finish_folder: Optional[Callable] = None
    side_files: tuple = ()
    write: Optional[Callable] = None
    exports: tuple = ()
    schemas: tuple = ()
    choices: tuple = ()

    @property
    def per_image(self) -> bool:
        """True when each image has its own label file (``suffix``)."""
        return self.suffix is not None


@dataclass(frozen=True)
class ParseOptions:
    """What the user said about reading LABELS (``--clip-boxes``, ``--csv-columns``)."""

    clip: bool = False                   # clip coordinates outside the image (noted) instead of failing
    csv_columns: Optional[dict] = None   # ``{"path": column, "label": column}``


@dataclass
class ParsedLabels:
    """One parser's result, before the images are checked.

    Attributes:
        mapping: image key -> label (class id/name, (N, 5) rows, or a label-model dict).
        problems: one line per problem, naming file (and line / entry).
        schema: ``"class"``, ``"boxes"`` or ``"objects"``.
        class_names: names for class ids (``[]`` when labels are bare integers or names to sort).
        label_info: what a writer needs to reproduce the source (categories, CSV header, ...).
        metadata: image key -> per-sample metadata dict.
        notes: image key -> notes for the record (clipped boxes, ...).
        source: human-readable description of the label source.
        unparsable: keys whose label file is reported already (not "unlabeled" too).
    """

    mapping: dict
    problems: list
    schema: str
    source: str
    class_names: list = field(default_factory=list)
    label_info: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    unparsable: set = field(default_factory=set)


class KeyMatcher:
    """Find the image key a label file names (``file_name`` in COCO, a CSV path, ...).

    Tried in order: the exact relative key; ``./`` and backslashes removed; an absolute path
    under IMAGES; a unique key ending in ``/<name>`` (COCO files name ``000001.jpg`` for
    ``train2017/000001.jpg``); a unique basename.
    """

    def __init__(self, root: Path, keys):
        self.root = Path(root)
        self.keys = set(keys)
        self._by_base = {}
        for k in keys:
            self._by_base.setdefault(PurePosixPath(k).name, []).append(k)
        try:
            self._root_abs = self.root.resolve()
        except OSError:
            self._root_abs = self.root.absolute()

    def match(self, name: str) -> tuple[str | None, str]:
        """(key, "") when found, else (None, why)."""
        raw = str(name).strip()
        norm = raw.replace("\\", "/")
        if norm in self.keys:
            return norm, ""
        while norm.startswith("./"):
            norm = norm[2:]
        if norm in self.keys:
            return norm, ""
        if os.path.isabs(raw) or norm.startswith("/"):
            p = Path(raw)
            for base in (self._root_abs, self.root.absolute()):
                try:
                    rel = p.relative_to(base).as_posix()
                except ValueError:
                    continue
                if rel in self.keys:
                    return rel, ""
            try:
                rel = p.resolve().relative_to(self._root_abs).as_posix()
            except (ValueError, OSError):
                return None, f"{raw} is outside IMAGES ({self.root})"
            if rel in self.keys:
                return rel, ""
            return None, f"there is no such image in {self.root}"
        tails = [k for k in self._by_base.get(PurePosixPath(norm).name, []) if k.endswith("/" + norm)]
        if len(tails) == 1:
            return tails[0], ""
        if len(tails) > 1:
            return None, f"{norm!r} matches {len(tails)} images ({', '.join(sorted(tails)[:3])}...)"
        return None, f"there is no such image in {self.root}"


def label_files(folder: Path, limit: int = 10000, skip: tuple = ("classes.txt",)) -> list:
    """Names of the files under ``folder`` (hidden ones and ``skip`` left out), walked until
    ``limit`` are found: what detection looks at."""
    out = []
    for _, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.extend(n for n in filenames if not n.startswith(".") and n not in skip)
        if len(out) >= limit:
            break
    return out


def label_suffixes(folder: Path) -> set:
    """The lower-case suffixes of :func:`label_files` of ``folder``."""
    return {Path(n).suffix.lower() for n in label_files(folder)}


# ---------------------------------------------------------------------------------------------
# Writers for ``packer export`` (a form's ``exports``)
# ---------------------------------------------------------------------------------------------
class LabelWriter:
    """Writes the labels of exported images in one form, so that ``packer build OUT/images
    LABELS`` rebuilds the store.

    Interface: ``__init__(out, meta)`` (``out`` = the export folder, ``meta`` = the store's
    :class:`~packer.core.records.StoreMetadata`), ``add(key, label)`` once per exported image
    (``key`` = its path under ``OUT/images``, label as in :mod:`packer.core.records`), and
    ``finish()`` returning the LABELS argument for ``packer build`` (None when the images carry
    their labels, as class folders do). A writer with ``takes_records = True`` gets the record too
    (``add(key, label, record=...)``: its metadata, size, ...). ``skipped`` lists keys whose label
    cannot be written in this form (e.g. unlabeled images), ``notes`` what the export could not
    write exactly as the source had it; export reports both.
    """

    #: the ``--labels-form`` name
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


class NoLabels(LabelWriter):
    """``--labels-form none``: the images only (what a store without labels exports)."""

    name = "none"

    def add(self, key, label):
        pass

    def finish(self):
        return None


class PerImageWriter(LabelWriter):
    """One label file per image, ``labels/<dir>/<stem><suffix>``; ``finish`` returns ``labels/``."""

    suffix = ""

    def path_for(self, key: str) -> Path:
        p = self.out / "labels" / PurePosixPath(key).with_suffix(self.suffix)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self):
        (self.out / "labels").mkdir(parents=True, exist_ok=True)
        return self.out / "labels"


class MappingWriter(LabelWriter):
    """One file mapping each image's path to its class (``rows``: key -> name or id)."""

    def __init__(self, out, meta):
        super().__init__(out, meta)
        self.rows: dict = {}

    def add(self, key, label):
        if not isinstance(label, (int, np.integer)) or label < 0:
            self.skipped.append({"key": key, "reason": "unlabeled (left out of the mapping)"})
            return
        self.rows[key] = self.class_value(int(label))


class RecordsWriter(LabelWriter):
    """A form written by its ``write(records, class_names, out, label_info)``: the records'
    labels (not their bytes) are kept until :meth:`finish`, which writes them in one go to
    ``target`` under the export folder (a file when its name has a suffix, ``instances.json``,
    else a folder, ``labels``), in the source's own layout when the store was built from that form (a COCO store
    exports the same COCO document, a VOC store byte-identical XML)."""

    #: where the writer writes, under the export folder
    target = ""
    takes_records = True
    #: write no file for an image stored without a label (its source had none): writing one
    #: would make the rebuild see "no objects" instead of "unlabeled"
    skip_unlabeled = False

    def __init__(self, out, meta):
        super().__init__(out, meta)
        self.records: list = []

    @staticmethod
    def write(records, class_names, out, label_info) -> None:
        raise NotImplementedError

    def add(self, key, label, record=None):
        if record is None:
            raise UsageError(f"--labels-form {self.name} needs the records (export passes them)")
        if label is None and self.skip_unlabeled:
            self.skipped.append({"key": key, "reason": "unlabeled (no label file written)"})
            return
        self.records.append(record)

    def finish(self):
        path = self.out / self.target
        if not PurePosixPath(self.target).suffix:   # "labels": a folder; "instances.json": a file
            path.mkdir(parents=True, exist_ok=True)
        self.write(self.records, self.names, path, dict(self.meta.label_info or {}))
        return path
