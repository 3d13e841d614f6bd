"""A folder of per-image label files: one file per image, matched by relative path and stem.

``LABELS/<dir>/<stem><suffix>`` is the label of ``IMAGES/<dir>/<stem>.*``, for every per-image
form (:attr:`~packer.labels.base.LabelForm.suffix`: YOLO ``.txt`` rows, packer's ``.json``); each
file is read by its form's ``parse_file``, and each form's ``finish_folder`` then runs on the
whole (YOLO: class names from ``data.yaml`` / ``classes.txt``, polygons). A second label file for
one stem, two images sharing a stem, a file that cannot be read and a label file without an image
are problems naming the files.

Example:
    >>> parsed = parse_folder(Path("data/labels"), Path("data/images"), keys, per_image_forms)   # doctest: +SKIP
"""
from __future__ import annotations

import os
from pathlib import Path

from packer.labels.base import ParsedLabels


def parse_folder(folder: Path, root: Path, keys, forms, *, clip: bool = False) -> ParsedLabels:
    """The labels a folder of per-image files gives the images ``keys`` under ``root``.

    Args:
        folder: LABELS.
        root, keys: the IMAGES folder and its image keys.
        forms: the per-image :class:`~packer.labels.base.LabelForm` records; a file whose suffix
            none of them has is not a label file.
        clip: clip coordinates outside the image (noted) instead of failing.

    Returns:
        ParsedLabels (``schema`` left to the labels found); images whose label file is reported
        as a problem are in ``unparsable``.
    """
    folder, root = Path(folder), Path(root)
    by_suffix = {f.suffix: f for f in forms}
    side_files = {n for f in forms for n in f.side_files}
    by_stem, problems = _label_files(folder, by_suffix, [])
    mapping, stems_used, unparsable, image_by_stem = {}, set(), set(), {}
    for k in keys:
        stem_key = Path(k).with_suffix("").as_posix()
        if stem_key in image_by_stem:
            problems.append(f"{root / k}: shares its label stem {stem_key} with {root / image_by_stem[stem_key]}")
            continue
        image_by_stem[stem_key] = k
        lp = by_stem.get(stem_key)
        if lp is None:
            continue
        stems_used.add(stem_key)
        try:
            mapping[k] = by_suffix[lp.suffix.lower()].parse_file(lp, clip=clip)
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(str(exc))
            unparsable.add(k)   # reported already: not "unlabeled" too
    for stem_key, lp in sorted(by_stem.items()):
        if stem_key not in stems_used and lp.name not in side_files:
            problems.append(f"{lp}: label file without an image (looked for {root / stem_key}.*)")
    parsed = ParsedLabels(mapping, problems, "", str(folder), unparsable=unparsable)
    for form in forms:
        if form.finish_folder is not None:
            parsed = form.finish_folder(parsed, folder)
    return parsed


def _label_files(folder: Path, by_suffix: dict, problems: list) -> tuple:
    """``({stem key: label file}, problems)`` of the files under ``folder`` with a suffix in
    ``by_suffix`` (hidden files and folders left out; a second file for one stem is a problem)."""
    by_stem = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(folder)
        for name in filenames:
            p = Path(name)
            if name.startswith(".") or p.suffix.lower() not in by_suffix:
                continue
            stem_key = (rel_dir / p.stem).as_posix()
            if stem_key in by_stem:
                problems.append(f"{folder / rel_dir / name}: a second label file for {stem_key} "
                                f"(also {by_stem[stem_key]})")
                continue
            by_stem[stem_key] = folder / rel_dir / name
    return by_stem, problems
