"""YOLO labels: detection and segmentation rows, ``data.yaml`` / ``classes.txt``, the ultralytics layout.

* A row ``class cx cy w h`` is a box; a row ``class x1 y1 x2 y2 ... xn yn`` (n >= 3) is a polygon
  (YOLO-seg). All coordinates are normalized: a value outside ``[0, 1]``, NaN or inf is an error
  naming ``file:line``, or, with ``clip=True`` (``--clip-boxes``), clipped with a note.
* A folder of detection files only gives the ``"boxes"`` schema (float32 ``(N, 5)`` rows, as stores
  always had); as soon as one file holds a polygon row, every image gets a label-model dict
  (schema ``"objects"``) whose objects keep the row text (``src["row"]``) for a byte-exact
  write-back.
* Each file's text is kept, exactly as it was, in the record metadata (``"yolo_txt"``), so
  ``packer export`` writes every label file back byte for byte (rows stay float32 for the
  readers; ``0.133333`` alone would come back as ``0.1333329975605011``).
* Class names come from ``data.yaml`` (``names:`` list or ``{id: name}`` map; also
  ``dataset.yaml``), ``obj.names`` (darknet; what CVAT and datumaro write) or ``classes.txt``,
  next to the labels or up to two folders above them (ultralytics keeps ``data.yaml`` at the
  dataset root, above ``labels/train``; CVAT and datumaro keep ``obj.names`` above
  ``obj_train_data/``). Every one found is read: two that disagree stop the build (exit 2)
  naming both files and the first differing class.
* LABELS may be the ``data.yaml`` itself: each image's label is then found the ultralytics way,
  its path with the last ``images`` folder replaced by ``labels`` and the suffix by ``.txt``; an
  image without a label file is background only with ``--allow-unlabeled`` (said in the error).
* LABELS may be a folder of ``.txt`` files, one per image (:mod:`packer.labels.perimage` reads it,
  :func:`finish_folder` then finds the class names and turns the files into labels).

Example:
    >>> names, where = find_class_names(Path("coco8/labels/train"))   # doctest: +SKIP
"""
from __future__ import annotations

import math
import os
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from packer.core.errors import UsageError
from packer.labels.base import LabelForm, ParsedLabels, PerImageWriter, label_suffixes
from packer.labels.limits import MAX_PER_IMAGE_BYTES, check_class_id, read_bounded, snippet, text_lines
from packer.labels.model import new_label

YAML_NAMES = ("data.yaml", "dataset.yaml", "data.yml", "dataset.yml")
#: Class-name files read in each folder, in this order: the first one found names the classes,
#: every other one must agree with it.
NAMES_FILES = (*YAML_NAMES, "obj.names", "classes.txt")
#: Record metadata key holding a label file's exact text (see :func:`source_metadata`).
TEXT_KEY = "yolo_txt"


@dataclass
class YoloFile:
    """One parsed ``.txt``: ``rows`` are ``(N, 5)`` boxes (a polygon's bounding box for seg
    rows), ``objects`` the same as label-model objects, ``notes`` say what was clipped."""

    rows: np.ndarray
    objects: list
    has_polygons: bool
    notes: list = field(default_factory=list)
    #: the file's text exactly as it was (BOM and line ends included), for a byte-exact export
    text: str = ""


def parse_file(path, *, clip: bool = False) -> YoloFile:
    """Parse one YOLO ``.txt`` file.

    Raises:
        ValueError: naming ``path:line`` and what is wrong.
    """
    rows, objects, notes = [], [], []
    has_poly = False
    with closing(text_lines(path, max_bytes=MAX_PER_IMAGE_BYTES, newline=None)) as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            where = f"{path}:{lineno}"
            n = len(parts)
            if n != 5 and (n < 7 or n % 2 == 0):
                raise ValueError(f"{where}: expected 5 values 'class cx cy w h' or a polygon 'class x1 y1 ... xn yn' "
                                 f"(n >= 3 points), found {n}: {snippet(line)}")
            try:
                vals = [float(v) for v in parts]
            except ValueError:
                raise ValueError(f"{where}: a value is not a number: {snippet(line)}") from None
            if not vals[0].is_integer() or vals[0] < 0:
                raise ValueError(f"{where}: class must be a non-negative integer, got {parts[0]!r}")
            coords = vals[1:]
            bad = [v for v in coords if not math.isfinite(v)]
            if bad:
                raise ValueError(f"{where}: non-finite coordinate {bad[0]!r} in {snippet(line)}")
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
            exact = parts[0].isascii() and parts[0].isdigit()   # float64 loses ids past 2**53
            cls = check_class_id(int(parts[0]) if exact else int(vals[0]), where, "boxes")
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
    return YoloFile(np.asarray(rows, dtype=np.float32).reshape(-1, 5), objects, has_poly, notes,
                    source_text(path))


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


def source_text(path) -> str:
    """A label file's text exactly as it is on disk (UTF-8; a BOM and ``\\r\\n`` kept).

    Raises:
        ValueError: over :data:`~packer.labels.limits.MAX_PER_IMAGE_BYTES`, unreadable, or not UTF-8.
    """
    data = read_bounded(path, MAX_PER_IMAGE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc}") from exc


def source_metadata(mapping: dict) -> dict:
    """Record metadata keeping each parsed file's text: ``{key: {"yolo_txt": text}}`` for the
    :class:`YoloFile` values of ``mapping`` (call before :func:`resolve`)."""
    return {k: {TEXT_KEY: v.text} for k, v in mapping.items() if isinstance(v, YoloFile)}


def load_data_yaml(path) -> dict:
    """Read an ultralytics ``data.yaml``; returns the dict with ``names`` as a list.

    Raises:
        ValueError: not YAML, or ``names`` is not a list / ``{id: name}`` map.
    """
    try:
        import yaml
    except ImportError as exc:  # a core dependency; said plainly if an install lost it
        from packer.core.errors import DependencyError
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


def read_names_file(path) -> list:
    """Class names of a ``data.yaml`` (its ``names``) or of a text file with one name per line
    (``obj.names``, ``classes.txt``; blank lines skipped, names stripped).

    Raises:
        ValueError: the file cannot be read, or is not valid YAML / UTF-8.
    """
    path = Path(path)
    if path.name in YAML_NAMES or path.suffix.lower() in (".yaml", ".yml"):
        return load_data_yaml(path)["names"]
    with closing(text_lines(path, max_bytes=MAX_PER_IMAGE_BYTES)) as lines:
        return [ln.strip() for ln in lines if ln.strip()]


def names_conflict(a: str, names_a: list, b: str, names_b: list) -> str:
    """Why two class-name lists differ, naming both files and the first differing id ("" if
    they agree)."""
    for i, (x, y) in enumerate(zip(names_a, names_b)):
        if x != y:
            return f"class {i} is {x!r} in {a} but {y!r} in {b}"
    if len(names_a) != len(names_b):
        longer, extra = (a, names_a) if len(names_a) > len(names_b) else (b, names_b)
        i = min(len(names_a), len(names_b))
        return (f"{a} names {len(names_a)} classes, {b} names {len(names_b)} (class {i}, {extra[i]!r}, "
                f"is only in {longer})")
    return ""


def find_class_names(label_dir: Path) -> tuple[list, str]:
    """Class names for a YOLO label folder: ``([], "")`` when there is no names file.

    Reads every file of :data:`NAMES_FILES` in ``label_dir`` and up to two folders above it;
    the nearest one (in that order within a folder) names the classes and every other one must
    agree with it.

    Returns:
        ``(names, path of the file they came from)``.

    Raises:
        ValueError: a names file is there but unreadable.
        UsageError: two names files disagree (both named, with the first differing class).
    """
    label_dir = Path(label_dir)
    found = []
    for d in (label_dir, label_dir.parent, label_dir.parent.parent):
        for name in NAMES_FILES:
            p = d / name
            if p.is_file():
                names = read_names_file(p)
                if names:
                    found.append((names, str(p)))
    if not found:
        return [], ""
    names, where = found[0]
    for other, other_where in found[1:]:
        why = names_conflict(where, names, other_where, other)
        if why:
            raise UsageError(f"conflicting YOLO class names: {why} (packer reads {', '.join(NAMES_FILES)} next "
                             f"to the labels and up to two folders above them; make them agree or remove the "
                             f"wrong one)")
    return names, where


def names_info(where: str) -> dict:
    """``label_info`` of a YOLO source whose class names came from the file ``where`` (empty:
    none): export writes the same kind of names file again."""
    info = {"format": "yolo"}
    if where:
        name = Path(where).name
        is_yaml = Path(where).suffix.lower() in (".yaml", ".yml")
        info["names_file"] = "data.yaml" if is_yaml and name not in YAML_NAMES else name
    return info


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
    metadata = source_metadata(mapping)
    mapping, schema = resolve(mapping)
    info = dict(names_info(source if data["names"] else ""),
                yaml={k: v for k, v in data.items() if k != "names"})
    return ParsedLabels(mapping, problems, schema or "boxes", source, data["names"], info, metadata, notes,
                        unparsable)


def _coord(v) -> str:
    # the shortest decimal that reads back as the same float32 (0.133333, not 0.1333329975605011)
    return np.format_float_positional(np.float32(v), unique=True, trim="-")


def format_rows(label) -> str:
    """A label as YOLO text: rows as the source wrote them when known, else each value as the
    shortest decimal that reads back as the same float32."""
    lines = []
    if isinstance(label, dict):
        for o in label.get("objects", []):
            row = o.get("src", {}).get("row") if label.get("format") == "yolo" else None
            if row is None:
                if o.get("polygon"):
                    row = " ".join([str(int(o["class"]))] + [_coord(v) for v in o["polygon"][0]])
                elif o.get("box") is not None:
                    row = " ".join([str(int(o["class"]))] + [_coord(v) for v in o["box"]])
                else:
                    continue
            lines.append(row)
    elif label is not None and not isinstance(label, (int, np.integer)):
        for r in np.asarray(label, dtype=np.float32).reshape(-1, 5):
            lines.append(" ".join([str(int(r[0]))] + [_coord(v) for v in r[1:]]))
    return "".join(line + "\n" for line in lines)


def label_file_text(label, metadata=None) -> tuple[str, bool]:
    """The text of one record's ``.txt``: ``(text, exact)``; ``exact`` is False when the store
    did not keep the file's text (built before it did, or labels from another format) and the
    rows are written from the stored values (:func:`format_rows`)."""
    text = (metadata or {}).get(TEXT_KEY)
    if isinstance(text, str):
        return text, True
    return format_rows(label), False


def write_class_names(out_dir, class_names, label_info=None) -> list:
    """``classes.txt`` in ``out_dir``, plus the names file the source had (``obj.names`` or a
    ``data.yaml``, from ``label_info["names_file"]``), so a rebuild reads the same names from
    the same kind of file. Returns the paths written (none without class names)."""
    if not class_names:
        return []
    out_dir = Path(out_dir)
    text = "".join(f"{n}\n" for n in class_names)
    written = {out_dir / "classes.txt": text}
    kind = str((label_info or {}).get("names_file", ""))
    if kind == "obj.names":
        written[out_dir / kind] = text
    elif kind in YAML_NAMES:
        import yaml
        written[out_dir / kind] = yaml.safe_dump({"nc": len(class_names),
                                                  "names": {i: n for i, n in enumerate(class_names)}},
                                                 sort_keys=False, allow_unicode=True)
    for path, body in written.items():
        _write_text(path, body)
    return list(written)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(text.encode("utf-8"))   # bytes: no newline translation
    os.replace(tmp, path)


def write_yolo(records, class_names, out_dir, label_info=None) -> list:
    """One ``.txt`` per record under ``out_dir`` (key's relative path), the file's own text
    when the store kept it (:func:`label_file_text`), plus the class-name files
    (:func:`write_class_names`) when the store has class names. Images without objects get
    an empty file (YOLO's "background"); records with no label at all get none.

    Returns:
        The label paths written.
    """
    out_dir = Path(out_dir)
    written = []
    for rec in records:
        if rec.label is None:
            continue
        path = out_dir / PurePosixPath(rec.key).with_suffix(".txt")
        _write_text(path, label_file_text(rec.label, rec.metadata)[0])
        written.append(path)
    write_class_names(out_dir, class_names, label_info)
    return written


def finish_folder(parsed: ParsedLabels, folder: Path) -> ParsedLabels:
    """A folder of per-image files read (:mod:`packer.labels.perimage`): when it held YOLO files,
    their class names (``data.yaml`` / ``obj.names`` / ``classes.txt``, checked against the ids),
    the notes of clipped rows, each file's text (for a byte-exact export) and the labels (rows, or
    label-model dicts when a file has a polygon row); else ``parsed`` as it is."""
    mapping = parsed.mapping
    if not any(isinstance(v, YoloFile) for v in mapping.values()):
        return parsed
    problems = list(parsed.problems)
    try:
        names, names_from = find_class_names(folder)
    except ValueError as exc:
        names, names_from = [], ""
        problems.append(str(exc))
    if names:
        problems += check_class_ids(mapping, names, names_from)
    notes = {k: v.notes for k, v in mapping.items() if isinstance(v, YoloFile) and v.notes}
    texts = source_metadata(mapping)
    mapping, _ = resolve(mapping)
    return ParsedLabels(mapping, problems, "", parsed.source, names, names_info(names_from), texts, notes,
                        set(parsed.unparsable))


def _detect(path) -> bool:
    """A ``data.yaml``, or a folder holding ``.txt`` label files."""
    path = Path(path)
    if path.is_file():
        return path.suffix.lower() in (".yaml", ".yml")
    return path.is_dir() and ".txt" in label_suffixes(path)


def _parse(labels: Path, root, keys, options) -> ParsedLabels:
    if labels.is_file() and labels.suffix.lower() in (".yaml", ".yml"):
        return parse_data_yaml(labels, root, keys, clip=options.clip)
    raise UsageError(f"{labels}: --labels-format yolo expects a folder of .txt files or a data.yaml")


class YoloTxt(PerImageWriter):
    """``labels/<dir>/<stem>.txt``: a YOLO store's files as they went in (their text is kept in
    the record metadata), other labels as ``class cx cy w h`` / polygon rows (empty file: no
    objects); ``classes.txt`` (plus ``obj.names`` / ``data.yaml`` where the source named its
    classes there) when the store has class names."""

    name = "yolo"
    suffix = ".txt"
    takes_records = True

    def __init__(self, out, meta):
        super().__init__(out, meta)
        self.own_form = (meta.label_info or {}).get("format") == "yolo"
        self.inexact = 0

    def finish(self):
        labels = super().finish()
        write_class_names(labels, self.names, self.meta.label_info if self.own_form else None)
        if self.inexact:
            self.notes.append(
                f"{self.inexact} YOLO label file(s) written from the stored float32 rows: the store was built "
                f"before packer kept each file's text, so values read back the same but the text may differ from "
                f"the original files (e.g. 0.500000 -> 0.5); rebuild it from the original files for exact export")
        return labels

    def add(self, key, label, record=None):
        if label is None:
            self.skipped.append({"key": key, "reason": "unlabeled (no label file written)"})
            return
        text, exact = label_file_text(label, record.metadata if record is not None else None)
        if self.own_form and not exact:
            self.inexact += 1
        self.path_for(key).write_bytes(text.encode("utf-8"))   # bytes: no newline translation


FORM = LabelForm("yolo", detect=_detect, order=50, parse=_parse, suffix=".txt", parse_file=parse_file,
                 finish_folder=finish_folder, side_files=("classes.txt",), write=write_yolo, exports=(YoloTxt,),
                 schemas=("boxes", "objects"), choices=("yolo",))
