"""Discover (image, label) pairs in the input folders.

Images: every file under ``IMAGES/``, walked recursively, sorted by relative POSIX path (so the
order, and hence each record's index, never depends on the file system). The type is decided
later by magic bytes; hidden files, files whose extension says they are text or metadata
(``.txt .json .csv .xml .yaml .md ...``), files that are not images and do not claim to be
(``LICENSE``), special files and symbolic links that lead nowhere are left out here, and listed
in the build report as ``ignored`` with the reason. What cannot be read or stored (a folder that
cannot be listed, a name that is not valid UTF-8) is never left out silently: the build lists it
with the damaged inputs and publishes only when told to skip them (:func:`scan_images`).

Labels, in the forms users have (chosen by what ``labels`` points at, or named with
``labels_format``; read by the label forms of :mod:`packer.labels`, see its table):

* ``None``: class-per-subfolder (ImageFolder). Every image must sit in a first-level folder,
  whose name is its class; class ids follow the sorted folder names.
* a folder: one file per image, matched by relative path and stem (:mod:`packer.labels.perimage`) —
  ``LABELS/<dir>/<stem>.txt`` with YOLO rows ``class cx cy w h`` (an empty file = no boxes), or
  ``LABELS/<dir>/<stem>.json`` holding a class (int or name), ``{"class": ...}``, a list of
  5-number rows, or ``{"boxes": [[class, cx, cy, w, h], ...]}`` (:mod:`packer.labels.jsonfile`).
* a ``.csv`` file: rows ``path,label`` with header detection, extra columns kept as metadata
  (:mod:`packer.labels.csvfile`).
* a ``.json`` file: ``{"relative/path.jpg": label, ...}``.
* COCO ``instances.json``, Pascal VOC ``Annotations/``, ultralytics ``data.yaml``, a folder of
  PNG masks.

This module walks IMAGES and binds the labels to the images it found.

Class labels given as names get ids in sorted name order; integers are used as they are.
Every problem (image without label, label without image, unparsable line) is collected with
its path and line, and :func:`collect_sources` raises one :class:`SourceError` listing all of
them before anything is written.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

import packer.labels as label_formats
from packer.core.errors import SourceError, UsageError
from packer.core.integrity import IMAGE_EXTENSIONS, is_image_bytes
from packer.core.records import UNLABELED_CLASS

# re-exported: packer.interchange's WebDataset and MDS readers import it from here
from packer.labels.jsonfile import parse_label_json as parse_label_json

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
        ignored_reasons: ignored path -> why it was left out (see :func:`scan_images`).
        unreadable: inputs found but not readable or storable, ``{"path", "reason", "kind"}``
            each (a folder that cannot be listed, a name that is not UTF-8): a build lists them
            with its damaged inputs and publishes only when told to skip those.
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
    ignored_reasons: dict = None
    unreadable: list = None
    #: Interchange inputs (WebDataset, HF, MDS, TFRecord; :mod:`packer.interchange`): where each
    #: key's image bytes are (one :data:`~packer.interchange.Locator` per key), a printable name per
    #: key (``shard.tar:member``) and the shards' ``(name, size, mtime_ns)`` for resuming. None for
    #: an image folder, whose keys are paths under ``root``.
    locators: object = None
    displays: list = None
    shard_fingerprint: list = None

    def __post_init__(self):
        self.label_info = dict(self.label_info or {})
        self.ignored_reasons = dict(self.ignored_reasons or {})
        self.unreadable = list(self.unreadable or [])
        self.metadata = list(self.metadata) if self.metadata is not None else [{} for _ in self.keys]
        self.label_notes = dict(self.label_notes or {})

    def path(self, key: str) -> Path:
        """The image file of ``key`` (for an interchange input: its printable ``shard:member`` name)."""
        if self.displays is not None:
            return Path(self.displays[self._positions()[key]])
        return self.root / key

    def _positions(self) -> dict:
        if getattr(self, "_pos", None) is None:
            self._pos = {k: i for i, k in enumerate(self.keys)}
        return self._pos

    def task_input(self, pos: int):
        """What a build worker reads for input ``pos``: a path, or an interchange locator."""
        if self.locators is not None:
            return self.locators[pos]
        return str(self.root / self.keys[pos])

    def size_paths(self, keys) -> list:
        """Files whose sizes estimate the bytes of ``keys`` (the disk-space check): the image files,
        or for an interchange input the shard files those keys' bytes lie in."""
        if self.locators is None:
            return [self.root / k for k in keys]
        out = {}
        for name, size, _ in self.shard_fingerprint or ():
            if "://" in str(name):   # a shard in a bucket: its listed size
                out[name] = SizedName(name)
                out[name].nbytes = int(size)
            else:
                out[name] = Path(name)
        return [out[k] for k in sorted(out)]

    def fingerprint_items(self):
        """(key, size, mtime_ns) per image, for the resume fingerprint (for an interchange input
        the shards' sizes and times stand for each of their samples)."""
        if self.shard_fingerprint is not None:
            h = int(hashlib.blake2b(json.dumps([list(f) for f in self.shard_fingerprint]).encode(),
                                    digest_size=8).hexdigest(), 16)
            total = sum(int(f[1]) for f in self.shard_fingerprint)
            for key in self.keys:
                yield key, total, h
            return
        for key in self.keys:
            st = os.stat(self.root / key)
            yield key, st.st_size, st.st_mtime_ns


class SizedName(str):
    """A file's name carrying its size (``nbytes``), for the disk-space estimate
    (:func:`packer.core.diskspace.input_bytes`) of inputs that are no local file."""

    nbytes: int = 0


def list_images(root: Path) -> tuple[list, list]:
    """(candidate image keys, ignored keys) under ``root``, both sorted: :func:`scan_images`
    without the reasons and the unreadable inputs."""
    walk = scan_images(root)
    return walk.keys, walk.ignored


@dataclass
class Walk:
    """What :func:`scan_images` found under IMAGES.

    Attributes:
        keys: relative POSIX paths of the candidate images, sorted.
        ignored: relative paths left out as not images, sorted (folders end in ``/``).
        ignored_reasons: ignored path -> why it was left out.
        unreadable: inputs found but not readable or not storable, one dict each
            (``path``, ``reason``, ``kind``), sorted by path: a folder that cannot be listed
            (``birds/``), a file that cannot be looked at, a name that is not valid UTF-8.
            A build reports them with the damaged inputs (see :data:`Sources.unreadable`).
    """

    keys: list
    ignored: list
    ignored_reasons: dict
    unreadable: list


def display_path(rel: str) -> str:
    """``rel`` as printable text: bytes of the name that are not UTF-8 (held by Python as
    surrogate escapes) are written ``\\xNN``; valid names come back unchanged.

    Example:
        >>> display_path(os.fsdecode(b"cats/bad\\xff.jpg"))
        'cats/bad\\\\xff.jpg'
    """
    return os.fsencode(rel).decode("utf-8", "backslashreplace")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:   # os.walk gives undecodable bytes as lone surrogates
        return False
    return True


#: Why a name that is not valid UTF-8 is refused (the report shows it in ``\xNN`` form).
BAD_NAME_REASON = ("{what} name is not valid UTF-8 (shown with \\xNN for its bad bytes); store keys are UTF-8 "
                   "text and packer does not rename inputs: rename it (e.g. convmv -f latin1 -t utf-8 -r "
                   "--notest IMAGES) and rerun")


def scan_images(root: Path) -> Walk:
    """Walk ``root``: candidate images, ignored files (with why) and unreadable inputs.

    Ignored: hidden files, text/metadata extensions, and files that neither claim to be images
    by extension nor are by their first bytes (``LICENSE``, ``copyright``). Anything that
    claims to be an image stays a candidate, so a ``.jpg`` holding text is reported as damaged.
    FIFOs, sockets and device files are ignored without being opened (opening a FIFO blocks),
    and so are broken symbolic links and links that lead back to themselves
    (``a.jpg -> b.jpg -> a.jpg``).

    Symbolic links are followed, to folders and to files, as torchvision's ImageFolder does
    (``os.walk(followlinks=True)``); keys are the paths as seen through the links. A link to a
    folder that contains it (a loop) is not entered: it is listed as ignored (``dir/link/``)
    and logged.

    Unreadable, never silently left out: a folder that cannot be listed (``chmod 000``), a
    file whose status cannot be read, and a file or folder whose name is not valid UTF-8 (a
    store key is UTF-8 text; such names are refused, not renamed, and shown with ``\\xNN``
    escapes). A build lists them with the damaged inputs and does not publish unless told to
    skip them (``on_corrupt="skip"``).

    Raises:
        SourceError: ``root`` itself cannot be read.
    """
    keys, ignored, reasons, unreadable = [], [], {}, []
    root_str = os.path.join(str(root), "")

    def rel_of(path: str) -> str:
        rel = os.path.relpath(path, root)
        return "" if rel == "." else Path(rel).as_posix()

    def ignore(rel: str, why: str) -> None:
        ignored.append(display_path(rel))
        reasons[display_path(rel)] = why

    def refuse(rel: str, why: str, kind: str = "unreadable") -> None:
        log.warning("%s: %s", os.path.join(root, display_path(rel)), why, extra={"packer_damaged_input": True})
        unreadable.append({"path": display_path(rel), "reason": why, "kind": kind})

    def on_error(exc: OSError) -> None:
        where = exc.filename if isinstance(exc.filename, str) else str(root)
        if os.path.join(where, "") == root_str:
            raise SourceError(f"{root}: cannot read the IMAGES folder: {exc.strerror or exc}",
                              [f"{root}: {exc.strerror or exc}"]) from exc
        refuse(rel_of(where) + "/", f"cannot read folder: {exc.strerror or exc}; the images in it are "
                                    f"left out")

    # Real paths of each walked folder and its ancestors: a child resolving to one is a loop.
    chains = {str(root): frozenset([os.path.realpath(root)])}
    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error, followlinks=True):
        rel_dir = Path(dirpath).relative_to(root)
        chain = chains.pop(dirpath, frozenset([os.path.realpath(dirpath)]))
        kept = []
        for d in dirnames:
            if d.startswith("."):
                continue
            child = os.path.join(dirpath, d)
            rel = (rel_dir / d).as_posix() + "/"
            if not _is_utf8(d):
                refuse(rel, BAD_NAME_REASON.format(what="folder") + "; the files in it are left out", "refused")
                continue
            real = os.path.realpath(child)
            if real in chain:
                log.warning("%s: symbolic link loop (it leads back to %s); not followed", child, real)
                ignore(rel, f"symbolic link loop (it leads back to {display_path(real)}); not followed")
                continue
            chains[child] = chain | {real}
            kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            _classify(root, (rel_dir / name).as_posix(), os.path.join(dirpath, name), keys, ignore, refuse)
    ignored.sort()
    unreadable.sort(key=lambda e: e["path"])
    return Walk(sorted(keys), ignored, {k: reasons[k] for k in ignored}, unreadable)


def _classify(root, rel: str, full: str, keys: list, ignore, refuse) -> None:
    """Put one file of the walk in ``keys``, or ``ignore`` / ``refuse`` it with why."""
    name = rel.rsplit("/", 1)[-1]
    suffix = Path(name).suffix.lower()
    try:
        kind = _special_kind(full)
    except OSError as exc:
        refuse(rel, f"cannot read file: {exc.strerror or exc}")
        return
    if kind is not None:
        why = kind if "symbolic link" in kind else f"{kind}, not a regular file"
        log.warning("%s: %s; ignored", display_path(full), why)
        ignore(rel, why)
    elif name.startswith("."):
        ignore(rel, "hidden file")
    elif suffix in NON_IMAGE_EXTENSIONS:
        ignore(rel, f"not an image: {suffix} files hold text or metadata")
    elif suffix not in IMAGE_EXTENSIONS and not _starts_like_image(Path(full)):
        ignore(rel, "not an image: no image extension, and its first bytes are not an image's")
    elif not _is_utf8(rel):
        refuse(rel, BAD_NAME_REASON.format(what="file"), "refused")
    else:
        keys.append(rel)


def _special_kind(path: str) -> Optional[str]:
    """None for a regular file (or a link to one); else what it is, for the log.

    Raises:
        OSError: its status cannot be read (other than a broken link or a link loop).
    """
    try:
        mode = os.stat(path).st_mode   # follows links
    except FileNotFoundError:
        return "broken symbolic link"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop (the links lead back to each other, never to a file)"
        raise
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
            :func:`packer.labels.label_format_choices` to say what LABELS is.
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
    if not root.exists():
        raise UsageError(f"{root}: IMAGES does not exist")
    if not root.is_dir():
        raise UsageError(f"{root}: IMAGES must be a folder, not a file")
    walk = scan_images(root)
    if not walk.keys and not walk.unreadable:
        raise UsageError(_no_images(root, walk, labels))
    if not walk.keys:
        raise SourceError(f"{root}: no image could be read", [f"{root / e['path']}: {e['reason']}"
                                                              for e in walk.unreadable])
    try:
        src = _labelled(root, walk, labels, allow_unlabeled, no_labels, labels_format, clip_boxes, csv_columns)
    except SourceError as exc:
        if not walk.unreadable:
            raise
        # The label problems may come from what could not be read: say so first.
        raise SourceError(str(exc), [f"{root / e['path']}: {e['reason']}" for e in walk.unreadable]
                          + list(exc.problems)) from exc
    src.ignored_reasons, src.unreadable = walk.ignored_reasons, walk.unreadable
    return src


def label_walk(root: Path, walk: Walk, labels, *, allow_unlabeled: bool = False, no_labels: bool = False,
               labels_format: Optional[str] = None, clip_boxes: bool = False, csv_columns=None) -> Sources:
    """Sources of the images of ``walk`` (found under ``root``) with the labels ``labels`` gives,
    as :func:`collect_sources` does after its walk (an image folder in a bucket:
    :mod:`packer.sources.remote`). Raises as collect_sources."""
    return _labelled(Path(root), walk, labels, allow_unlabeled, no_labels, labels_format, clip_boxes, csv_columns)


def _labelled(root, walk: Walk, labels, allow_unlabeled, no_labels, labels_format, clip_boxes,
              csv_columns) -> Sources:
    """Sources of the walked images with the labels ``labels`` gives (see collect_sources)."""
    keys, ignored = walk.keys, walk.ignored
    if no_labels:
        return Sources(root, keys, [None] * len(keys), "none", [], ignored, "none")
    if labels is None:
        return _from_subfolders(root, keys, ignored, walk.unreadable)
    lab = Path(labels)
    if not lab.exists():
        raise UsageError(f"{lab}: LABELS does not exist")
    fmt = labels_format if labels_format not in (None, "auto") else label_formats.detect_format(lab)
    if fmt is None:
        raise UsageError(f"{lab}: LABELS must be a folder, a .csv, .json or data.yaml file "
                         f"(or say what it is with --labels-format)")
    if isinstance(csv_columns, str):
        csv_columns = label_formats.parse_columns(csv_columns)
    parsed = label_formats.parse_labels(fmt, lab, root, keys, clip=clip_boxes, csv_columns=csv_columns)
    return _from_parsed(root, keys, ignored, parsed, allow_unlabeled)


#: Loose files listed when IMAGES without LABELS is not one folder per class; the rest are counted.
LOOSE_LISTED = 10


def _from_subfolders(root, keys, ignored, unreadable=()) -> Sources:
    hint = detect_yolo_layout(root, keys, ignored)
    if hint:
        raise UsageError(hint)
    loose = [k for k in keys if "/" not in k]
    if loose:
        # One mistake (no LABELS, or the wrong folder), not one per file: a few examples.
        listed = [f"{root / k}: not in a class folder" for k in loose[:LOOSE_LISTED]]
        if len(loose) > LOOSE_LISTED:
            listed.append(f"... and {len(loose) - LOOSE_LISTED} more")
        raise SourceError(
            f"{root}: no LABELS given, so images must sit in one folder per class, but "
            f"{len(loose)} image(s) are directly in {root} (pass LABELS, --no-labels or "
            f"--allow-unlabeled with a LABELS source)", listed)
    # A class folder that cannot be read is still a class: the ids stay those of a build that reads it.
    lost = {e["path"].split("/", 1)[0] for e in unreadable if e["kind"] == "unreadable" and "/" in e["path"]}
    names = sorted({k.split("/", 1)[0] for k in keys} | lost)
    ids = {n: i for i, n in enumerate(names)}
    labels = [ids[k.split("/", 1)[0]] for k in keys]
    return Sources(root, keys, labels, "class", names, ignored, "class-per-subfolder")


#: Images named when LABELS gives no label at all (the message says how many there are).
_SHOWN_UNLABELED = 3

#: What label files are named like, to tell IMAGES and LABELS given the wrong way round.
_LABEL_SUFFIXES = (".txt", ".json", ".xml", ".csv", ".yaml", ".yml")


def _no_images(root: Path, walk: Walk, labels) -> str:
    """Why IMAGES gave nothing to build: empty, or (the common slip) it holds label files, the
    arguments given as LABELS IMAGES."""
    found = [p for p in walk.ignored if not p.endswith("/") and p.lower().endswith(_LABEL_SUFFIXES)]
    if not found:
        if walk.ignored:
            return f"{root}: no image files found ({len(walk.ignored)} file(s) that are not images ignored)"
        return f"{root}: no files found"
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    said = f"{root}: IMAGES holds {len(found)} label file(s) ({shown}) and no images; the order is IMAGES [LABELS]"
    images_there = labels is not None and Path(labels).is_dir() and scan_images(Path(labels)).keys
    if images_there:
        said += f", and LABELS ({labels}) holds images (hint: packer build {labels} {root} ...)"
    return said


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
    if unlabeled and not allow_unlabeled and not mapping and not unparsable and not problems:
        # LABELS gave no label at all: one line says so, not one line per image.
        shown = [f"{root / k}: image without a label" for k in unlabeled[:_SHOWN_UNLABELED]]
        more = len(unlabeled) - len(shown)
        raise SourceError(f"{source} holds no label: {len(unlabeled)} image(s) have no label; nothing was "
                          f"written (pass --no-labels to build without labels, or --allow-unlabeled to keep "
                          f"them unlabeled)", shown + ([f"... and {more} more"] if more > 0 else []))
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
