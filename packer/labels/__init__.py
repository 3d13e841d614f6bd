"""Label forms: parsers into one label model, and writers back out; the registry of the forms.

Each form is one module ending in one :class:`~packer.labels.base.LabelForm` record, ``FORM``,
and one line in :data:`_MODULES`; from that list come the ``--labels-format`` choices
(:func:`label_format_choices`), the order in which LABELS is recognised (:func:`detect_format`),
the parser run (:func:`parse_labels`) and the writers ``packer export`` offers
(:func:`packer.labels.export.label_writers`).

============  ==========================================  ==========  ===============================
form          LABELS is                                    schema      export (``--labels-form``)
============  ==========================================  ==========  ===============================
coco          ``instances_*.json``                         objects     ``coco``
voc           ``Annotations/`` (or a folder of ``.xml``)   objects     ``voc``
yolo          folder of ``.txt`` / ``data.yaml``           boxes, or   ``yolo``
                                                           objects
                                                           (seg rows)
csv           ``.csv`` / ``.tsv``                          class       ``csv``, ``csv-source``
masks         folder of ``.png`` masks                     objects     ``masks``
json          folder of per-image ``.json``, or a          class,      ``json``, ``json-map``
              ``{path: label}`` ``.json`` file             boxes
folders       (no LABELS: IMAGES has a folder per class)   class       ``folders``
============  ==========================================  ==========  ===============================

The label model is documented in :mod:`packer.labels.model`; a form's ``write(records,
class_names, out, label_info)`` writes any Records' labels back in that form.

Example:
    >>> detect_format(Path("coco/annotations/instances_val2017.json"))   # doctest: +SKIP
    'coco'
    >>> get_label_form("coco").write(records, names, "out.json")        # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from packer.core.errors import UsageError
from packer.labels import classfolders, coco, csvfile, jsonfile, limits, masks, perimage, voc, yolo
from packer.labels.base import KeyMatcher, LabelForm, ParsedLabels, ParseOptions
from packer.labels.csvfile import parse_columns

#: The label form modules, each ending in its ``FORM``; the ``--labels-format`` choices follow this order.
_MODULES = (coco, voc, yolo, csvfile, masks, jsonfile, classfolders)


def label_forms() -> list:
    """Every :class:`~packer.labels.base.LabelForm`, in :data:`_MODULES` order."""
    return [m.FORM for m in _MODULES]


def available_label_forms() -> list:
    """The label form names, in :data:`_MODULES` order."""
    return [f.name for f in label_forms()]


def label_format_choices() -> tuple:
    """``--labels-format`` choices: ``"auto"`` (:func:`detect_format`) and each form's ``choices``."""
    return ("auto", *(c for f in label_forms() for c in f.choices))


def get_label_form(name: str) -> LabelForm:
    """The form called ``name`` (or that has ``name`` among its ``--labels-format`` choices).

    Raises:
        UsageError: an unknown name (the message lists the ``--labels-format`` choices).
    """
    for form in label_forms():
        if name == form.name or name in form.choices:
            return form
    raise UsageError(f"unknown labels format {name!r} (choose from {', '.join(label_format_choices())})")


def detect_format(labels: Path) -> Optional[str]:
    """The name of the form ``labels`` holds: the first, in ``order``, whose ``detect`` says yes
    (a folder no other form claims is per-image ``json``); None when none does.

    Raises:
        UsageError: a folder of COCO files (one of them must be chosen).
    """
    labels = Path(labels)
    for form in sorted((f for f in label_forms() if f.detect is not None), key=lambda f: f.order):
        if form.detect(labels):
            return form.name
    return None


def parse_labels(fmt: str, labels: Path, root: Path, keys, *, clip: bool = False,
                 csv_columns: Optional[dict] = None) -> ParsedLabels:
    """Read ``labels`` as the form ``fmt``: a folder of a per-image form through
    :func:`packer.labels.perimage.parse_folder` (with every per-image form: YOLO ``.txt`` and
    ``.json`` files side by side), anything else through the form's ``parse``.

    Raises:
        UsageError: ``fmt`` is unknown, or ``labels`` is not what it reads.
    """
    form, labels = get_label_form(fmt), Path(labels)
    if form.per_image and labels.is_dir():
        per_image = [f for f in label_forms() if f.per_image]
        return perimage.parse_folder(labels, root, keys, per_image, clip=clip)
    if form.parse is None:
        raise UsageError(f"{labels}: {form.name} labels are not read from a LABELS argument")
    return form.parse(labels, root, keys, ParseOptions(clip=clip, csv_columns=csv_columns))


__all__ = ["LabelForm", "KeyMatcher", "ParsedLabels", "ParseOptions", "label_forms", "available_label_forms",
           "label_format_choices", "get_label_form", "detect_format", "parse_labels", "parse_columns", "jsonfile",
           "limits", "yolo", "masks"]
