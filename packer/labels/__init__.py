"""Label formats: parsers into one label model, and writers back out.

==========  ==========================================  ==========  =====================
format      LABELS is                                    schema      writer
==========  ==========================================  ==========  =====================
coco        ``instances_*.json``                         objects     :func:`write_coco`
voc         ``Annotations/`` (or a folder of ``.xml``)   objects     :func:`write_voc`
yolo        folder of ``.txt`` / ``data.yaml``           boxes, or   :func:`write_yolo`
                                                         objects
                                                         (seg rows)
csv         ``.csv`` / ``.tsv``                          class       :func:`write_csv`
masks       folder of ``.png`` masks                     objects     :func:`write_masks`
==========  ==========================================  ==========  =====================

:func:`detect_format` says which one ``LABELS`` is (``--labels-format`` overrides it); ``None``
means one of packer's own forms (per-image ``.json`` folders, a ``{path: label}`` JSON file)
that :mod:`packer.sources.folders` reads itself. The label model is documented in
:mod:`packer.labels.model`; ``WRITERS`` maps a format name to ``f(records, class_names, out,
label_info)`` for ``packer export``.

Example:
    >>> detect_format(Path("coco/annotations/instances_val2017.json"))   # doctest: +SKIP
    'coco'
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from packer.core.errors import UsageError
from packer.labels import jsonfile, limits
from packer.labels.base import KeyMatcher, ParsedLabels
from packer.labels.coco import looks_like_coco, parse_coco, write_coco
from packer.labels.csvfile import parse_columns, parse_csv, write_csv
from packer.labels.masks import looks_like_masks, parse_masks, write_masks
from packer.labels.voc import annotations_dir, parse_voc, write_voc
from packer.labels.yolo import parse_data_yaml, write_yolo

#: ``--labels-format`` choices ("auto" = :func:`detect_format`).
LABEL_FORMATS = ("auto", "coco", "voc", "yolo", "csv", "masks")

#: format -> writer ``f(records, class_names, out, label_info=None)``: ``records`` are Records
#: (any label schema), ``class_names`` and ``label_info`` the store's metadata; ``out`` is a
#: file for coco and csv, a folder for voc, yolo and masks (see WRITER_TARGETS).
WRITERS = {"coco": write_coco, "voc": write_voc, "yolo": write_yolo, "csv": write_csv, "masks": write_masks}
WRITER_TARGETS = {"coco": "file", "csv": "file", "voc": "folder", "yolo": "folder", "masks": "folder"}


def detect_format(labels: Path) -> Optional[str]:
    """The label format ``labels`` holds, or None for packer's own forms (see module doc).

    Raises:
        UsageError: a folder of COCO files (one of them must be chosen).
    """
    labels = Path(labels)
    suffix = labels.suffix.lower()
    if labels.is_file():
        if suffix == ".json":
            return "coco" if looks_like_coco(labels) else None
        if suffix in (".csv", ".tsv"):
            return "csv"
        if suffix in (".yaml", ".yml"):
            return "yolo"
        return None
    if labels.is_dir():
        if (labels / "Annotations").is_dir():
            return "voc"
        names = _label_files(labels)
        exts = {Path(n).suffix.lower() for n in names}
        if ".xml" in exts and not exts & {".txt", ".json"}:
            return "voc"
        if exts and exts <= {".png"} and looks_like_masks(labels):
            return "masks"
        coco = sorted(p.name for p in labels.glob("*.json") if looks_like_coco(p))
        if coco:  # an annotations/ folder of COCO files: which split is meant is the user's call
            raise UsageError(f"{labels}: holds COCO annotation files ({', '.join(coco[:4])}): pass the one "
                             f"that goes with the images as LABELS, e.g. {labels / coco[0]}")
    return None


def _label_files(folder: Path, limit: int = 10000) -> list:
    out = []
    for _, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.extend(n for n in filenames if not n.startswith(".") and n != "classes.txt")
        if len(out) >= limit:
            break
    return out


def parse_labels(fmt: str, labels: Path, root: Path, keys, *, clip: bool = False,
                 csv_columns: Optional[dict] = None, parse_class=None) -> Optional[ParsedLabels]:
    """Run the parser for ``fmt``; None when :mod:`packer.sources.folders` reads the form itself (a YOLO
    folder of ``.txt`` files goes through its per-image walk).

    Raises:
        UsageError: ``labels`` is not what ``fmt`` reads.
    """
    labels = Path(labels)
    if fmt == "coco":
        if not labels.is_file():
            raise UsageError(f"{labels}: --labels-format coco expects an instances .json file")
        return parse_coco(labels, root, keys, clip=clip)
    if fmt == "voc":
        ann = annotations_dir(labels) if labels.is_dir() else None
        if ann is None:
            raise UsageError(f"{labels}: --labels-format voc expects an Annotations/ folder of .xml files")
        return parse_voc(ann, root, keys, clip=clip)
    if fmt == "yolo":
        if labels.is_file() and labels.suffix.lower() in (".yaml", ".yml"):
            return parse_data_yaml(labels, root, keys, clip=clip)
        if labels.is_dir():
            return None
        raise UsageError(f"{labels}: --labels-format yolo expects a folder of .txt files or a data.yaml")
    if fmt == "csv":
        if not labels.is_file():
            raise UsageError(f"{labels}: --labels-format csv expects a .csv file")
        return parse_csv(labels, root, keys, columns=csv_columns, parse_class=parse_class)
    if fmt == "masks":
        if not labels.is_dir():
            raise UsageError(f"{labels}: --labels-format masks expects a folder of .png masks")
        return parse_masks(labels, root, keys)
    raise UsageError(f"unknown labels format {fmt!r} (choose from {', '.join(LABEL_FORMATS)})")


__all__ = ["LABEL_FORMATS", "WRITERS", "WRITER_TARGETS", "KeyMatcher", "ParsedLabels", "detect_format", "parse_labels",
           "parse_columns", "write_coco", "write_voc", "write_yolo", "write_csv", "write_masks", "jsonfile", "limits"]
