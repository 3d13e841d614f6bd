"""YOLO labels: detection and segmentation rows, ``data.yaml`` / ``classes.txt``, the ultralytics layout.

* A row ``class cx cy w h`` is a box; a row ``class x1 y1 x2 y2 ... xn yn`` (n >= 3) is a polygon
  (YOLO-seg). All coordinates are normalized: a value outside ``[0, 1]``, NaN or inf is an error
  naming ``file:line``, or, with ``clip=True`` (``--clip-boxes``), clipped with a note.
* A folder of detection files only gives the ``"boxes"`` schema (float32 ``(N, 5)`` rows, as stores
  always had); as soon as one file holds a polygon row, every image gets a label-model dict
  (schema ``"objects"``) whose objects keep the row text (``src["row"]``) for a byte-exact
  write-back.
* Class names come from ``data.yaml`` (``names:`` list or ``{id: name}`` map) or ``classes.txt``
  next to the labels or up to two folders above them (ultralytics keeps ``data.yaml`` at the
  dataset root, above ``labels/train``).
* LABELS may be the ``data.yaml`` itself: each image's label is then found the ultralytics way,
  its path with the last ``images`` folder replaced by ``labels`` and the suffix by ``.txt``; an
  image without a label file is background only with ``--allow-unlabeled`` (said in the error).

Example:
    >>> names, where = find_class_names(Path("coco8/labels/train"))   # doctest: +SKIP
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from .base import ParsedLabels
from .model import new_label

YAML_NAMES = ("data.yaml", "dataset.yaml", "data.yml", "dataset.yml")


@dataclass
class YoloFile:
    """One parsed ``.txt``: ``rows`` are ``(N, 5)`` boxes (a polygon's bounding box for seg
    rows), ``objects`` the same as label-model objects, ``notes`` say what was clipped."""

    rows: np.ndarray
    objects: list
    has_polygons: bool
    notes: list = field(default_factory=list)


def parse_file(path, *, clip: bool = False) -> YoloFile:
    """Parse one YOLO ``.txt`` file.

    Raises:
        ValueError: naming ``path:line`` and what is wrong.
    """
    rows, objects, notes = [], [], []
    has_poly = False
    with open(path, encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            where = f"{path}:{lineno}"
            n = len(parts)
            if n != 5 and (n < 7 or n % 2 == 0):
                raise ValueError(f"{where}: expected 5 values 'class cx cy w h' or a polygon 'class x1 y1 ... xn yn' "
                                 f"(n >= 3 points), found {n}: {line.strip()!r}")
            try:
                vals = [float(v) for v in parts]
            except ValueError:
                raise ValueError(f"{where}: a value is not a number: {line.strip()!r}") from None
            if not vals[0].is_integer() or vals[0] < 0:
                raise ValueError(f"{where}: class must be a non-negative integer, got {parts[0]!r}")
            coords = vals[1:]
            bad = [v for v in coords if not math.isfinite(v)]
            if bad:
                raise ValueError(f"{where}: non-finite coordinate {bad[0]!r} in {line.strip()!r}")
            out = [v for v in coords if v < 0 or v > 1]
            if out:
                if not clip:
                    raise ValueError(f"{where}: coordinate {out[0]!r} is outside [0, 1] (YOLO coordinates are "
                                     f"normalized; hint: --clip-boxes clips them)")
                notes.append(f"{where}: coordinates clipped to [0, 1]")
                if n == 5:  # clip the box's corners (not its centre and size)
                    cx, cy, w, h = coords
                    x1, y1 = min(1.0, max(0.0, cx - w / 2)), min(1.0, max(0.0, cy - h / 2))
                    x2, y2 = min(1.0, max(0.0, cx + w / 2)), min(1.0, max(0.0, cy + h / 2))
                    coords = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
                else:
                    coords = [min(1.0, max(0.0, v)) for v in coords]
            cls = int(vals[0])
            obj = {"class": cls, "src": {"row": " ".join(parts)}}
            if n == 5:
                box = coords
            else:
                has_poly = True
                xs, ys = coords[0::2], coords[1::2]
                x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
                box = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
                obj["polygon"] = [coords]
            obj["box"] = box
            objects.append(obj)
            rows.append([cls, *box])
    return YoloFile(np.asarray(rows, dtype=np.float32).reshape(-1, 5), objects, has_poly, notes)


def resolve(mapping: dict) -> tuple[dict, str]:
    """Turn parsed :class:`YoloFile` values into labels: ``(N, 5)`` rows when no file has a
    polygon (schema ``"boxes"``), label-model dicts otherwise (``"objects"``)."""
    files = {k: v for k, v in mapping.items() if isinstance(v, YoloFile)}
    if not files:
        return mapping, ""
    if any(f.has_polygons for f in files.values()):
        out = {k: (new_label("yolo", objects=v.objects) if isinstance(v, YoloFile) else v) for k, v in mapping.items()}
        return out, "objects"
    return {k: (v.rows if isinstance(v, YoloFile) else v) for k, v in mapping.items()}, "boxes"


def load_data_yaml(path) -> dict:
    """Read an ultralytics ``data.yaml``; returns the dict with ``names`` as a list.

    Raises:
        ValueError: not YAML, or ``names`` is not a list / ``{id: name}`` map.
    """
    try:
        import yaml
    except ImportError as exc:  # a core dependency; said plainly if an install lost it
        from ..errors import DependencyError
        raise DependencyError("reading data.yaml needs PyYAML (pip install PyYAML)") from exc
    try:
        with open(path, encoding="utf-8-sig") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with 'names'")
    names = data.get("names")
    if isinstance(names, dict):
        try:
            ids = sorted(int(k) for k in names)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: 'names' keys must be class ids") from None
        if ids != list(range(len(ids))):
            raise ValueError(f"{path}: 'names' ids must be 0..{len(ids) - 1}, got {ids}")
        names = [str(names[k] if k in names else names[str(k)]) for k in ids]
    elif isinstance(names, list):
        names = [str(n) for n in names]
    elif names is not None:
        raise ValueError(f"{path}: 'names' must be a list or a {{id: name}} map")
    data["names"] = names or []
    return data


def find_class_names(label_dir: Path) -> tuple[list, str]:
    """Class names for a YOLO label folder: ``([], "")`` when there is no names file.

    Looks in ``label_dir`` and up to two folders above it for ``data.yaml`` (and variants),
    then ``classes.txt``.

    Raises:
        ValueError: a names file is there but unreadable.
    """
    label_dir = Path(label_dir)
    for d in (label_dir, label_dir.parent, label_dir.parent.parent):
        for name in YAML_NAMES:
            p = d / name
            if p.is_file():
                names = load_data_yaml(p)["names"]
                if names:
                    return names, str(p)
        p = d / "classes.txt"
        if p.is_file():
            with open(p, encoding="utf-8-sig") as fh:
                return [ln.strip() for ln in fh if ln.strip()], str(p)
    return [], ""


def check_class_ids(mapping: dict, names: list, where: str) -> list:
    """Problems for class ids beyond the names list."""
    problems = []
    for key, lab in sorted(mapping.items()):
        ids = lab.rows[:, 0] if isinstance(lab, YoloFile) else np.zeros(0)
        if len(ids) and int(ids.max()) >= len(names):
            problems.append(f"{key}: class id {int(ids.max())} but {where} names {len(names)} classes")
    return problems


def label_path_for(image: Path) -> Path:
    """The ultralytics rule: ``.../images/x/1.jpg`` -> ``.../labels/x/1.txt``."""
    parts = list(image.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts).with_suffix(".txt")
    return image.with_suffix(".txt")


def parse_data_yaml(yaml_path, root, keys, *, clip: bool = False) -> ParsedLabels:
    """LABELS = ``data.yaml``: every image under ``root`` gets the label file the ultralytics
    rule names (:func:`label_path_for`), class names from the YAML."""
    yaml_path = Path(yaml_path)
    source = str(yaml_path)
    try:
        data = load_data_yaml(yaml_path)
    except ValueError as exc:
        return ParsedLabels({}, [str(exc)], "boxes", source)
    mapping, problems, notes, unparsable = {}, [], {}, set()
    root = Path(root)
    used, label_roots = set(), set()
    for key in keys:
        lp = label_path_for(root / key)
        parts = lp.parts
        if "labels" in parts:
            label_roots.add(Path(*parts[:len(parts) - parts[::-1].index("labels")]))
        used.add(lp)
        if not lp.is_file():
            continue
        try:
            f = parse_file(lp, clip=clip)
        except (ValueError, UnicodeDecodeError, OSError) as exc:
            problems.append(str(exc))
            unparsable.add(key)
            continue
        mapping[key] = f
        if f.notes:
            notes[key] = f.notes
    for lroot in sorted(label_roots):   # a label file nobody's image points to is reported, not dropped
        for dirpath, dirnames, filenames in os.walk(lroot):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if name.endswith(".txt") and name != "classes.txt" and not name.startswith(".") and p not in used:
                    problems.append(f"{p}: label file without an image (looked for "
                                    f"{p.with_suffix('.*').as_posix().replace('/labels/', '/images/')})")
    if data["names"]:
        problems += check_class_ids(mapping, data["names"], source)
    mapping, schema = resolve(mapping)
    info = {"format": "yolo", "yaml": {k: v for k, v in data.items() if k != "names"}}
    return ParsedLabels(mapping, problems, schema or "boxes", source, data["names"], info, {}, notes, unparsable)


def format_rows(label) -> str:
    """A label as YOLO text: rows as the source wrote them when known, else ``%g`` values."""
    lines = []
    if isinstance(label, dict):
        for o in label.get("objects", []):
            row = o.get("src", {}).get("row") if label.get("format") == "yolo" else None
            if row is None:
                if o.get("polygon"):
                    row = " ".join([str(int(o["class"]))] + [f"{v:.6g}" for v in o["polygon"][0]])
                elif o.get("box") is not None:
                    row = " ".join([str(int(o["class"]))] + [f"{v:.6g}" for v in o["box"]])
                else:
                    continue
            lines.append(row)
    elif label is not None and not isinstance(label, (int, np.integer)):
        for r in np.asarray(label, dtype=np.float32).reshape(-1, 5):
            lines.append(" ".join([str(int(r[0]))] + [f"{float(v):g}" for v in r[1:]]))
    return "".join(line + "\n" for line in lines)


def write_yolo(records, class_names, out_dir, label_info=None) -> list:
    """One ``.txt`` per record under ``out_dir`` (key's relative path), plus ``classes.txt``
    when the store has class names. Images without objects get an empty file (YOLO's
    "background"); records with no label at all get none.

    Returns:
        The label paths written.
    """
    out_dir = Path(out_dir)
    written = []
    for rec in records:
        if rec.label is None:
            continue
        path = out_dir / PurePosixPath(rec.key).with_suffix(".txt")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(format_rows(rec.label), encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
    if class_names:
        (out_dir / "classes.txt").write_text("".join(f"{n}\n" for n in class_names), encoding="utf-8")
    return written
