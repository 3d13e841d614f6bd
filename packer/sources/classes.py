"""Pinned class ids: one class-name -> id map shared by every build of a dataset.

Without a pinned map a build numbers the classes it sees in sorted order, so a validation
split that lacks one class (or one shard of a sharded build) shifts every later id silently.
``--classes FILE|STORE`` fixes the map instead:

* a text file, one class name per line (line ``i`` is id ``i``; blank lines and ``#`` comments
  are skipped): ``classes.txt``, darknet's ``obj.names`` (what CVAT and datumaro write);
* an ultralytics ``data.yaml`` (``.yaml`` / ``.yml``): its ``names`` list or ``{id: name}`` map;
* a JSON list of names (position = id) or a JSON object ``{"name": id, ...}`` whose ids are
  exactly ``0..K-1``;
* an existing store (any format, manifests included): its ``class_names``.

Example:
    >>> names = load_class_map("classes.txt")                 # doctest: +SKIP
    >>> sources = apply_class_map(collect_sources("imgs"), names, "classes.txt")  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from packer.core.errors import SourceError, StoreError, UsageError
from packer.core.records import UNLABELED_CLASS

#: File suffixes ``--classes`` reads as class lists (anything else must be a store).
TEXT_SUFFIXES = (".txt", ".names")
YAML_SUFFIXES = (".yaml", ".yml")
LIST_SUFFIXES = (*TEXT_SUFFIXES, *YAML_SUFFIXES, ".json")


def _check_names(names: list, where: str) -> list:
    seen = {}
    for i, n in enumerate(names):
        if not isinstance(n, str) or not n.strip():
            raise UsageError(f"{where}: class {i} must be a non-empty name, got {n!r}")
        if n in seen:
            raise UsageError(f"{where}: class name {n!r} appears twice (ids {seen[n]} and {i})")
        seen[n] = i
    if not names:
        raise UsageError(f"{where}: holds no class names")
    return list(names)


def _from_json(value, where: str) -> list:
    if isinstance(value, list):
        return _check_names(value, where)
    if isinstance(value, dict):
        ids = {}
        for name, i in value.items():
            if isinstance(i, bool) or not isinstance(i, int):
                raise UsageError(f"{where}: id of class {name!r} must be an integer, got {i!r}")
            if i in ids:
                raise UsageError(f"{where}: id {i} is given to both {ids[i]!r} and {name!r}")
            ids[i] = name
        if sorted(ids) != list(range(len(ids))):
            raise UsageError(f"{where}: class ids must be exactly 0..{len(ids) - 1}, got {sorted(ids)}")
        return _check_names([ids[i] for i in range(len(ids))], where)
    raise UsageError(f"{where}: expected a JSON list of names or an object name -> id")


def load_class_map(spec) -> list:
    """Class names in id order from a text file, a ``data.yaml``, a JSON file or an existing store.

    Args:
        spec: path of a ``.txt`` / ``.names`` / ``.yaml`` / ``.yml`` / ``.json`` file, or a
            store location (path or URL).

    Returns:
        list of names; ``names[i]`` is the name of class id ``i``.

    Raises:
        UsageError: the file is missing or malformed, or the store has no class names.
    """
    spec = str(spec)
    from packer.stores import detect_format, open_store

    is_file = os.path.isfile(spec)
    fmt = None
    if "://" in spec or os.path.isdir(spec) or is_file:
        try:
            fmt = detect_format(spec)       # a store (manifests are .json files too)
        except StoreError as exc:
            if not is_file or Path(spec).suffix.lower() not in LIST_SUFFIXES:
                raise UsageError(f"--classes {spec}: not a class list file ({', '.join(LIST_SUFFIXES)}) and not "
                                 f"a readable store ({exc})") from exc
    if fmt is not None:
        try:
            with open_store(spec, fmt) as reader:
                names = list(reader.metadata.class_names)
        except StoreError as exc:
            raise UsageError(f"--classes {spec}: cannot read the store's class names ({exc})") from exc
        if not names:
            raise UsageError(f"--classes {spec}: the store has no class names (its labels are bare ids)")
        return names
    if not is_file:
        raise UsageError(f"--classes {spec}: no such file or store")
    if Path(spec).suffix.lower() in YAML_SUFFIXES:
        from packer.labels.yolo import load_data_yaml
        try:
            names = load_data_yaml(spec)["names"]
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"--classes {spec}: {exc}") from exc
        if not names:
            raise UsageError(f"--classes {spec}: has no 'names' (a data.yaml names its classes in 'names:')")
        return _check_names(names, spec)
    try:
        text = Path(spec).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--classes {spec}: cannot read: {exc}") from exc
    if Path(spec).suffix.lower() == ".json":
        try:
            return _from_json(json.loads(text), spec)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{spec}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    names = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return _check_names(names, spec)


def apply_class_map(sources, names: list, where: str = "--classes"):
    """``sources`` with its class ids renumbered by the pinned ``names``.

    Named classes (class folders, class names in label files) take the pinned id of their
    name; a name missing from the map is an error naming it and its images. Bare integer
    ids and box class ids are kept and must lie in ``0..len(names)-1``. The returned sources
    carry ``class_names = names``, so classes absent from these inputs keep their ids.

    Raises:
        SourceError: unknown class names or out-of-range ids (every one listed).
        UsageError: the sources have no labels to pin.
    """
    if sources.label_schema == "none":
        raise UsageError(f"{where}: the build has no labels (--no-labels), there are no classes to pin")
    ids = {n: i for i, n in enumerate(names)}
    problems = []
    if sources.label_schema == "class" and sources.class_names:
        unknown = {}
        for key, label in zip(sources.keys, sources.labels):
            if label != UNLABELED_CLASS and sources.class_names[label] not in ids:
                unknown.setdefault(sources.class_names[label], []).append(key)
        for name, keys in sorted(unknown.items()):
            problems.append(f"{sources.root}: class {name!r} is not in {where} ({len(keys)} image(s), "
                            f"e.g. {keys[0]})")
        if problems:
            raise SourceError(f"{len(unknown)} class(es) not in the pinned class map {where}; nothing was "
                              f"written (add them to the map, or drop those images)", problems)
        remap = [ids[n] for n in sources.class_names]
        labels = [lab if lab == UNLABELED_CLASS else remap[lab] for lab in sources.labels]
        return dataclasses.replace(sources, labels=labels, class_names=list(names))
    for key, label in zip(sources.keys, sources.labels):
        if isinstance(label, np.ndarray):
            bad = sorted({int(c) for c in label[:, 0] if int(c) >= len(names)})
        elif label is None or label == UNLABELED_CLASS:
            bad = []
        else:
            bad = [int(label)] if not 0 <= int(label) < len(names) else []
        if bad:
            problems.append(f"{sources.root / key}: class id(s) {bad} outside the {len(names)} classes of {where}")
    if problems:
        raise SourceError(f"{len(problems)} image(s) use class ids the pinned map {where} does not have; "
                          f"nothing was written", problems)
    return dataclasses.replace(sources, class_names=list(names))
