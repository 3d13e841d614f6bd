"""Discover (image, label) pairs in the input folders.

Images: every file under ``IMAGES/``, walked recursively, sorted by relative POSIX path (so the
order, and hence each record's index, never depends on the file system). The type is decided
later by magic bytes; hidden files, files whose extension says they are text or metadata
(``.txt .json .csv .xml .yaml .md ...``) and files that are not images and do not claim to be
(``LICENSE``) are left out here, and listed in the build report as ``ignored``.

Labels, in the forms users have (chosen by what ``labels`` points at):

* ``None``: class-per-subfolder (ImageFolder). Every image must sit in a first-level folder,
  whose name is its class; class ids follow the sorted folder names.
* a folder: one file per image, matched by relative path and stem —
  ``LABELS/<dir>/<stem>.txt`` with YOLO rows ``class cx cy w h`` (an empty file = no boxes), or
  ``LABELS/<dir>/<stem>.json`` holding a class (int or name), ``{"class": ...}``, a list of
  5-number rows, or ``{"boxes": [[class, cx, cy, w, h], ...]}``.
* a ``.csv`` file: rows ``path,label`` with header detection, extra columns kept as metadata
  (:mod:`packer.labels.csvfile`).
* a ``.json`` file: ``{"relative/path.jpg": label, ...}``.
* COCO ``instances.json``, Pascal VOC ``Annotations/``, ultralytics ``data.yaml``, a folder of
  PNG masks: parsed by :mod:`packer.labels` (detected from what LABELS is, or named with
  ``labels_format``).

Class labels given as names get ids in sorted name order; integers are used as they are.
Every problem (image without label, label without image, unparsable line) is collected with
its path and line, and :func:`collect_sources` raises one :class:`SourceError` listing all of
them before anything is written.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from . import labels as label_formats
from .errors import SourceError, UsageError
from .integrity import IMAGE_EXTENSIONS, is_image_bytes
from .records import UNLABELED_CLASS

log = logging.getLogger(__name__)

#: Extensions of files that live in image folders but are never images.
NON_IMAGE_EXTENSIONS = {".txt", ".json", ".csv", ".xml", ".yaml", ".yml", ".md", ".html", ".py",
                        ".sh", ".ini", ".cfg", ".log", ".db", ".ds_store", ".tsv"}


@dataclass
class Sources:
    """What a build reads.

    Attributes:
        root: the IMAGES folder.
        keys: relative POSIX paths of the candidate images, sorted.
        labels: one label per key (int class id, float32 (N, 5) boxes, or None).
        label_schema: ``"class"``, ``"boxes"`` or ``"none"``.
        class_names: names for class ids (empty when the labels were bare integers).
        ignored: relative paths left out as non-images (hidden or text files).
        label_source: human-readable description of where labels came from.
        label_info: what label writers need to reproduce the source (StoreMetadata.label_info).
        metadata: per-sample metadata dicts, one per key (``{}`` when none).
        label_notes: key -> notes about its label (clipped boxes, ...), added to the record.
    """

    root: Path
    keys: list
    labels: list
    label_schema: str
    class_names: list
    ignored: list
    label_source: str
    label_info: dict = None
    metadata: list = None
    label_notes: dict = None

    def __post_init__(self):
        self.label_info = dict(self.label_info or {})
        self.metadata = list(self.metadata) if self.metadata is not None else [{} for _ in self.keys]
        self.label_notes = dict(self.label_notes or {})

    def path(self, key: str) -> Path:
        return self.root / key

    def fingerprint_items(self):
        """(key, size, mtime_ns) per image, for the resume fingerprint."""
        for key in self.keys:
            st = os.stat(self.root / key)
            yield key, st.st_size, st.st_mtime_ns


def list_images(root: Path) -> tuple[list, list]:
    """(candidate image keys, ignored keys) under ``root``, both sorted.

    Ignored: hidden files, text/metadata extensions, and files that neither claim to be images
    by extension nor are by their first bytes (``LICENSE``, ``copyright``). Anything that
    claims to be an image stays a candidate, so a ``.jpg`` holding text is reported as damaged.
    FIFOs, sockets and device files are ignored without being opened (opening a FIFO blocks),
    and so are broken symbolic links.

    Symbolic links are followed, to folders and to files, as torchvision's ImageFolder does
    (``os.walk(followlinks=True)``); keys are the paths as seen through the links. A link to a
    folder that contains it (a loop) is not entered: it is listed as ignored (``dir/link/``)
    and logged.
    """
    keys, ignored = [], []
    # Real paths of each walked folder and its ancestors: a child resolving to one is a loop.
    chains = {str(root): frozenset([os.path.realpath(root)])}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        rel_dir = Path(dirpath).relative_to(root)
        chain = chains.pop(dirpath, frozenset([os.path.realpath(dirpath)]))
        kept = []
        for d in dirnames:
            if d.startswith("."):
                continue
            child = os.path.join(dirpath, d)
            real = os.path.realpath(child)
            if real in chain:
                rel = (rel_dir / d).as_posix() + "/"
                log.warning("%s: symbolic link loop (it leads back to %s); not followed", child, real)
                ignored.append(rel)
                continue
            chains[child] = chain | {real}
            kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            full = os.path.join(dirpath, name)
            kind = _special_kind(full)
            suffix = Path(name).suffix.lower()
            if kind is not None:
                log.warning("%s: %s, not a regular file; ignored", full, kind)
                ignored.append(rel)
            elif name.startswith(".") or suffix in NON_IMAGE_EXTENSIONS:
                ignored.append(rel)
            elif suffix not in IMAGE_EXTENSIONS and not _starts_like_image(Path(full)):
                ignored.append(rel)
            else:
                keys.append(rel)
    return sorted(keys), sorted(ignored)


def _special_kind(path: str) -> Optional[str]:
    """None for a regular file (or a link to one); else what it is, for the log."""
    try:
        mode = os.stat(path).st_mode   # follows links
    except FileNotFoundError:
        return "broken symbolic link"
    except OSError:
        return None  # unreadable: keep it as a candidate, the build reports why
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "not a regular file"


def _starts_like_image(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return is_image_bytes(fh.read(16))
    except OSError:
        return True  # unreadable: keep it as a candidate, the build reports why


def collect_sources(images: str | os.PathLike, labels: Optional[str | os.PathLike] = None, *,
                    allow_unlabeled: bool = False, no_labels: bool = False,
                    labels_format: Optional[str] = None, clip_boxes: bool = False,
                    csv_columns=None, masks: Optional[str | os.PathLike] = None) -> Sources:
    """Find every image and its label.

    Args:
        images: the IMAGES folder.
        labels: a LABELS folder, a CSV/JSON mapping file, or None for class-per-subfolder.
        allow_unlabeled: images without a label get ``-1`` (class) or ``None`` (boxes) instead
            of stopping the build.
        no_labels: store images only (label schema ``"none"``).
        labels_format: ``"auto"``/None (detect), or one of
            :data:`packer.labels.LABEL_FORMATS` to say what LABELS is.
        clip_boxes: clip coordinates outside the image (noted per record) instead of failing.
        csv_columns: ``{"path": column, "label": column}`` or ``"path=filename,label=category"``.
        masks: a folder of PNG masks matched by stem, added to whatever LABELS gives (VOC
            ``SegmentationClass`` next to ``Annotations``); the store becomes ``"objects"``.

    Raises:
        UsageError: a path does not exist or is not what it should be.
        SourceError: label problems; ``.problems`` lists each with path and line.

    Example:
        >>> src = collect_sources("data/images", "data/labels")   # doctest: +SKIP
        >>> src.label_schema, len(src.keys)                        # doctest: +SKIP
        ('boxes', 1200)
    """
    if masks is not None:
        src = collect_sources(images, labels, allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                              labels_format=labels_format, clip_boxes=clip_boxes, csv_columns=csv_columns)
        return label_formats.masks.attach_masks(src, Path(masks), allow_unlabeled)
    root = Path(images)
    if not root.is_dir():
        raise UsageError(f"{root}: IMAGES must be a folder")
    keys, ignored = list_images(root)
    if not keys:
        raise UsageError(f"{root}: no files found")
    if no_labels:
        return Sources(root, keys, [None] * len(keys), "none", [], ignored, "none")
    if labels is None:
        return _from_subfolders(root, keys, ignored)
    lab = Path(labels)
    if not lab.exists():
        raise UsageError(f"{lab}: LABELS does not exist")
    fmt = labels_format if labels_format not in (None, "auto") else label_formats.detect_format(lab)
    if fmt is not None:
        if isinstance(csv_columns, str):
            csv_columns = label_formats.parse_columns(csv_columns)
        parsed = label_formats.parse_labels(fmt, lab, root, keys, clip=clip_boxes, csv_columns=csv_columns,
                                            parse_class=_parse_class)
        if parsed is not None:
            return _from_parsed(root, keys, ignored, parsed, allow_unlabeled)
    if lab.is_dir():
        return _from_label_folder(root, keys, ignored, lab, allow_unlabeled, clip_boxes)
    if lab.is_file() and lab.suffix.lower() == ".json":
        mapping, problems = _read_json_map(lab)
    else:
        raise UsageError(f"{lab}: LABELS must be a folder, a .csv, .json or data.yaml file "
                         f"(or say what it is with --labels-format)")
    return _from_mapping(root, keys, ignored, mapping, problems, str(lab), allow_unlabeled)


def _from_subfolders(root, keys, ignored) -> Sources:
    hint = detect_yolo_layout(root, keys, ignored)
    if hint:
        raise UsageError(hint)
    loose = [k for k in keys if "/" not in k]
    if loose:
        raise SourceError(
            f"{root}: no LABELS given, so images must sit in one folder per class, but "
            f"{len(loose)} image(s) are directly in {root} (pass LABELS, --no-labels or "
            f"--allow-unlabeled with a LABELS source)",
            [f"{root / k}: not in a class folder" for k in loose])
    names = sorted({k.split("/", 1)[0] for k in keys})
    ids = {n: i for i, n in enumerate(names)}
    labels = [ids[k.split("/", 1)[0]] for k in keys]
    return Sources(root, keys, labels, "class", names, ignored, "class-per-subfolder")


def _parse_class(value, where: str):
    """int or name -> (int|str); raises ValueError with ``where`` in the message."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: class must be an integer or a name, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip():
        v = value.strip()
        try:
            return int(v)
        except ValueError:
            return v
    raise ValueError(f"{where}: class must be an integer or a name, got {value!r}")


def _parse_box_rows(rows, where: str) -> np.ndarray:
    arr = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 5:
            raise ValueError(f"{where}: box {i} must be [class, cx, cy, w, h], got {row!r}")
        try:
            vals = [float(v) for v in row]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: box {i} has a non-number: {row!r}") from None
        if not all(np.isfinite(vals)):
            raise ValueError(f"{where}: box {i} has a non-finite value: {row!r}")
        if not vals[0].is_integer() or vals[0] < 0:
            raise ValueError(f"{where}: box {i} class must be a non-negative integer, got {row[0]!r}")
        arr.append(vals)
    return np.asarray(arr, dtype=np.float32).reshape(-1, 5)


def parse_yolo_txt(path: Path, *, clip: bool = False) -> np.ndarray:
    """YOLO rows ``class cx cy w h`` -> float32 (N, 5) (a polygon row gives its bounding box).

    Raises:
        ValueError: naming path:line (wrong count, non-number, coordinate outside [0, 1]).
    """
    return label_formats.yolo.parse_file(path, clip=clip).rows


def parse_label_json(value, where: str):
    """A per-image JSON label -> class (int|str) or boxes array."""
    if isinstance(value, dict):
        if "boxes" in value:
            return _parse_box_rows(value["boxes"], where)
        for k in ("class", "label", "class_id"):
            if k in value:
                return _parse_class(value[k], where)
        raise ValueError(f"{where}: expected a 'class' or 'boxes' field, found {sorted(value)}")
    if isinstance(value, list):
        return _parse_box_rows(value, where)
    return _parse_class(value, where)


def _from_label_folder(root, keys, ignored, lab: Path, allow_unlabeled, clip=False) -> Sources:
    problems = []
    by_stem = {}
    for dirpath, dirnames, filenames in os.walk(lab):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(lab)
        for name in filenames:
            p = Path(name)
            if name.startswith(".") or p.suffix.lower() not in (".txt", ".json"):
                continue
            stem_key = (rel_dir / p.stem).as_posix()
            if stem_key in by_stem:
                problems.append(f"{lab / rel_dir / name}: a second label file for {stem_key} "
                                f"(also {by_stem[stem_key]})")
                continue
            by_stem[stem_key] = lab / rel_dir / name
    mapping = {}
    stems_used = set()
    unparsable = set()  # images whose label file is reported already: not "unlabeled" too
    image_by_stem = {}
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
            if lp.suffix.lower() == ".txt":
                mapping[k] = label_formats.yolo.parse_file(lp, clip=clip)
            else:
                try:
                    value = json.loads(lp.read_text(encoding="utf-8-sig"))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{lp}:{exc.lineno}: invalid JSON: {exc.msg}") from None
                mapping[k] = parse_label_json(value, str(lp))
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(str(exc))
            unparsable.add(k)
    for stem_key, lp in sorted(by_stem.items()):
        if stem_key not in stems_used and lp.name != "classes.txt":
            problems.append(f"{lp}: label file without an image (looked for {root / stem_key}.*)")
    if not any(isinstance(v, label_formats.yolo.YoloFile) for v in mapping.values()):
        return _finish(root, keys, ignored, mapping, problems, str(lab), allow_unlabeled, unparsable)
    # YOLO: class names from data.yaml / classes.txt, notes of clipped rows, seg rows -> objects
    try:
        names, names_from = label_formats.yolo.find_class_names(lab)
    except ValueError as exc:
        names, names_from = [], ""
        problems.append(str(exc))
    if names:
        problems += label_formats.yolo.check_class_ids(mapping, names, names_from)
    notes = {k: v.notes for k, v in mapping.items() if isinstance(v, label_formats.yolo.YoloFile) and v.notes}
    mapping, _ = label_formats.yolo.resolve(mapping)
    hint = ("" if allow_unlabeled else
            " (ultralytics treats an image without a label file as background: pass --allow-unlabeled)")
    parsed = label_formats.ParsedLabels(mapping, problems, "", str(lab), names, {"format": "yolo"}, {}, notes,
                                        set(unparsable))
    return _finish(root, keys, ignored, parsed.mapping, parsed.problems, parsed.source, allow_unlabeled,
                   parsed.unparsable, parsed=parsed, unlabeled_hint=hint)


def _read_json_map(path: Path):
    try:
        raw = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        return {}, [f"{path}:{exc.lineno}: invalid JSON: {exc.msg}"]
    if not isinstance(raw, dict):
        return {}, [f"{path}: expected an object mapping relative path -> label"]
    mapping, problems = {}, []
    for key, value in raw.items():
        try:
            mapping[key.replace("\\", "/")] = parse_label_json(value, f"{path} [{key!r}]")
        except ValueError as exc:
            problems.append(str(exc))
    return mapping, problems


def _from_mapping(root, keys, ignored, mapping, problems, source, allow_unlabeled) -> Sources:
    key_set = set(keys)
    for k in sorted(mapping):
        if k not in key_set:
            problems.append(f"{source}: label for {k!r}, but there is no such image in {root}")
    mapping = {k: v for k, v in mapping.items() if k in key_set}
    return _finish(root, keys, ignored, mapping, problems, source, allow_unlabeled)


def _from_parsed(root, keys, ignored, parsed, allow_unlabeled) -> Sources:
    """Sources from a :mod:`packer.labels` parser's result."""
    hint = ""
    if parsed.label_info.get("format") == "yolo" and not allow_unlabeled:
        hint = " (ultralytics treats an image without a label file as background: pass --allow-unlabeled)"
    return _finish(root, keys, ignored, dict(parsed.mapping), list(parsed.problems), parsed.source,
                   allow_unlabeled, parsed.unparsable, parsed=parsed, unlabeled_hint=hint)


def _kind(value) -> str:
    if isinstance(value, dict):
        return "objects"
    return "boxes" if isinstance(value, np.ndarray) else "class"


def _finish(root, keys, ignored, mapping, problems, source, allow_unlabeled, unparsable=(), *,
            parsed=None, unlabeled_hint="") -> Sources:
    kinds = {_kind(v) for v in mapping.values()}
    if len(kinds) > 1:
        problems.append(f"{source}: mixes class labels and box labels; a store holds one kind")
    schema = kinds.pop() if len(kinds) == 1 else (parsed.schema if parsed and parsed.schema else "class")
    unlabeled = [k for k in keys if k not in mapping and k not in unparsable]
    if unlabeled and not allow_unlabeled:
        problems.extend(f"{root / k}: image without a label in {source}{unlabeled_hint}" for k in unlabeled)
    if problems:
        raise SourceError(f"{len(problems)} problem(s) with images/labels; nothing was written", problems)
    class_names = list(parsed.class_names) if parsed else []
    if schema == "class" and not class_names:
        names = sorted({v for v in mapping.values() if isinstance(v, str)})
        if names and any(isinstance(v, int) for v in mapping.values()):
            raise SourceError(f"{source}: mixes class names and class ids", [source])
        if names:
            class_names = names
            ids = {n: i for i, n in enumerate(names)}
            mapping = {k: ids[v] for k, v in mapping.items()}
        labels = [mapping.get(k, UNLABELED_CLASS) for k in keys]
    elif schema == "class":
        ids = {n: i for i, n in enumerate(class_names)}
        labels = [ids[v] if isinstance(v, str) and v in ids else v for v in (mapping.get(k, UNLABELED_CLASS)
                                                                              for k in keys)]
    else:
        labels = [mapping.get(k) for k in keys]
    if parsed is None:
        return Sources(root, keys, labels, schema, class_names, ignored, source)
    return Sources(root, keys, labels, schema, class_names, ignored, source, label_info=parsed.label_info,
                   metadata=[parsed.metadata.get(k, {}) for k in keys], label_notes=parsed.notes)


#: First-level folder names that are dataset splits, never classes.
SPLIT_NAMES = {"train", "val", "valid", "validation", "test", "images", "labels"}


def detect_yolo_layout(root: Path, keys, ignored=()) -> str:
    """A usage hint when IMAGES (given without LABELS) looks like a YOLO/ultralytics dataset.

    Recognized: ``images/`` + ``labels/`` folders, class folders that are all split names
    (``train``/``val``/``test``) holding ``images``/``labels``, a ``data.yaml`` in or above
    IMAGES, ``labels/<split>`` twin of ``images/<split>``, or ``.txt`` label files next to the
    images (``ignored``: the keys left out as text). Returns ``""`` otherwise.
    """
    root = Path(root)
    stems = {k.rsplit(".", 1)[0] for k in keys}
    beside = [k for k in ignored if k.endswith(".txt") and k[:-4] in stems]
    if beside:  # darknet style: a.jpg with a.txt in the same folder
        return (f"{root}: no LABELS given, but YOLO label files sit next to the images ({beside[0]}, ...): "
                f"pass the folder as LABELS too: packer build {root} {root} (--no-labels stores images only)")
    twin = label_formats.yolo.label_path_for(root / "x.jpg").parent   # images/train -> labels/train
    if twin != root and twin.is_dir() and any(twin.glob("*.txt")):
        return (f"{root}: no LABELS given, but {twin} holds YOLO label files for these images: pass it as "
                f"LABELS: packer build {root} {twin} (add --allow-unlabeled to keep images without a label "
                f"file as background; --no-labels stores images only)")
    firsts = {k.split("/", 1)[0] for k in keys if "/" in k}
    yaml_file = next((d / n for d in (root, root.parent) for n in label_formats.yolo.YAML_NAMES
                      if (d / n).is_file()), None)
    labels_dir = next((p for p in (root / "labels", root.parent / "labels") if p.is_dir()), None)
    if root.name == "images" and (root.parent / "labels").is_dir():
        labels_dir = root.parent / "labels"
    looks = bool(firsts) and firsts <= SPLIT_NAMES and (labels_dir is not None or yaml_file is not None
                                                        or "images" in firsts)
    if not (looks or (yaml_file is not None and labels_dir is not None)):
        return ""
    if yaml_file is not None:
        how = f"pass the data.yaml as LABELS: packer build {root} {yaml_file}"
    elif labels_dir is not None and root.name == "images":
        how = f"pass the labels folder as LABELS: packer build {root} {labels_dir}"
    else:
        split = sorted(firsts - {"images", "labels"}) or ["train"]
        how = (f"pass one split with its labels, e.g. packer build {root / 'images' / split[0]} "
               f"{root / 'labels' / split[0]}") if labels_dir else "pass its labels folder or data.yaml as LABELS"
    return (f"{root}: no LABELS given, but this looks like a YOLO/ultralytics dataset "
            f"(folders {', '.join(sorted(firsts))}{', data.yaml' if yaml_file else ''}), not one folder per "
            f"class: {how} (add --allow-unlabeled to keep images without a label file as background; "
            f"--no-labels stores images only)")
