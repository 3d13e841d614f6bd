"""Label writers for ``packer export``, from the label form registry.

A writer gets every exported image's relative path and label and writes the label files in one
form that :func:`packer.sources.folders.collect_sources` reads back, so ``packer build OUT/images
LABELS`` rebuilds the store. Each form lists its writers in its record
(:attr:`packer.labels.base.LabelForm.exports`; the interface is
:class:`~packer.labels.base.LabelWriter`), so a new form's writer is one class in its module;
:func:`label_writers` gathers them (plus ``none``, the images alone) and
:func:`infer_label_form` picks the one that reproduces the form the store was built from.
"""
from __future__ import annotations

from packer.core.errors import UsageError
from packer.core.records import StoreMetadata
from packer.labels import label_forms
from packer.labels.base import LabelWriter, NoLabels


def label_writers() -> dict:
    """``--labels-form`` name -> :class:`~packer.labels.base.LabelWriter` class: ``none`` and
    every form's ``exports``."""
    writers = {NoLabels.name: NoLabels}
    for form in label_forms():
        writers.update((cls.name, cls) for cls in form.exports)
    return writers


def get_label_writer(name: str) -> type:
    """The writer class ``packer export --labels-form name`` uses.

    Raises:
        UsageError: an unknown name (the message lists the known ones).
    """
    writers = label_writers()
    try:
        return writers[name]
    except KeyError:
        raise UsageError(f"unknown label form {name!r}; known: {sorted(writers)}") from None


def infer_label_form(meta: StoreMetadata) -> str:
    """The label form a store was built from: ``folders``, ``yolo``, ``json``, ``csv``,
    ``json-map`` or ``none`` (from ``build_options["labels"]`` and the label schema), or for
    stores of ``"objects"`` labels the form they were parsed from when it holds objects
    (``coco``, ``voc``, ``masks``, ``yolo``: ``label_info["format"]``, written by
    :mod:`packer.labels`; COCO holds any other)."""
    source = str((meta.build_options or {}).get("labels", ""))
    if meta.label_schema == "none" or source == "none":
        return "none"
    parsed = (meta.label_info or {}).get("format")
    if meta.label_schema == "objects":
        return parsed if parsed in _object_forms() else "coco"
    if source == "class-per-subfolder":
        return "folders"
    if source.lower().endswith(".csv"):
        return "csv"
    if source.lower().endswith(".json"):
        return "json-map"
    return "yolo" if meta.label_schema == "boxes" else "json"


def _object_forms() -> set:
    """Names of the forms that hold ``"objects"`` labels and export under their own name."""
    writers = label_writers()
    return {f.name for f in label_forms() if "objects" in f.schemas and f.name in writers}


__all__ = ["LabelWriter", "label_writers", "get_label_writer", "infer_label_form"]
