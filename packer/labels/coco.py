"""COCO ``instances_*.json``: parse into the label model, and write it back.

The file is streamed entry by entry (:func:`packer.labels.jsonfile.members`): memory holds the
entries kept, not the text; an entry over :data:`~packer.labels.limits.MAX_JSON_ENTRY_CHARS`,
nesting deeper than the stores allow, or text that is not UTF-8 is an error naming ``file:line``.
Parsing keeps what a COCO file says, in the form it says it:

* images are matched to IMAGES by ``file_name`` (see :class:`~packer.labels.base.KeyMatcher`);
  an image entry without annotations is an image without objects (COCO's meaning);
* ``bbox`` ``[x, y, w, h]`` in pixels -> canonical normalized ``cx cy w h`` with the image
  entry's ``width``/``height``; the original numbers stay in ``objects[i]["src"]["bbox"]``;
* ``category_id`` -> packer class id = position in the categories sorted by id; the
  categories themselves go to ``StoreMetadata.label_info["categories"]``;
* ``iscrowd`` kept; ``segmentation`` polygons normalized into ``polygon`` (the pixel values kept
  in ``src``), RLE kept as given in ``rle``; other annotation fields (``id``, ``area``, ...)
  in ``attrs``; the image entry in ``label["image"]`` and its id in the record metadata.

Example:
    >>> parsed = parse_coco("instances_val.json", "val2017", keys)        # doctest: +SKIP
    >>> write_coco(records, parsed.class_names, "out.json", parsed.label_info)  # doctest: +SKIP
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from packer.core.errors import UsageError
from packer.labels import jsonfile
from packer.labels.base import KeyMatcher, LabelForm, ParsedLabels, RecordsWriter
from packer.labels.limits import MAX_CLASSES, MAX_LABEL_INFO_CHARS, Problems, TooManyProblems
from packer.labels.model import as_label_model, new_label, xyxy_px_to_cxcywh

log = logging.getLogger(__name__)

_MODELLED = ("image_id", "category_id", "bbox", "segmentation", "iscrowd")
_SECTIONS = ("images", "annotations", "categories")
#: Pixels a box may reach past the image edge and be clipped without --clip-boxes.
EDGE_SLACK = 1.0


def looks_like_coco(path: Path) -> bool:
    """True when ``path`` looks like a COCO file: its first 64 KiB name ``annotations``, or
    ``images`` and ``categories``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    text = head.decode("utf-8", "replace")
    # Only the head is read (files reach GBs); tools write "annotations" first or "images" first
    return '"annotations"' in text or ('"images"' in text and '"categories"' in text)


def _id(v) -> bool:
    """COCO ids are integers (some tools write strings); anything else is refused."""
    return isinstance(v, (int, str)) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_coco(path, root, keys, *, clip: bool = False) -> ParsedLabels:
    """Parse a COCO instances file against the image keys under ``root``.

    The file is streamed entry by entry (:func:`packer.labels.jsonfile.members`): memory holds
    the entries kept (images of IMAGES, their annotations, categories), never the whole text.

    Args:
        path: the ``.json`` file.
        root: the IMAGES folder; ``keys`` its image keys.
        clip: boxes reaching outside the image are clipped (with a note) instead of reported.

    Returns:
        ParsedLabels with schema ``"objects"``.
    """
    path = Path(path)
    source = str(path)
    coco = _CocoReader(path, KeyMatcher(root, keys))
    try:
        coco.read()
        if coco.images is None:
            return ParsedLabels({}, [f"{path}: not a COCO file (no 'images' list)"], "objects", source)
        return coco.result(clip)
    except (TooManyProblems, ValueError) as exc:   # ValueError: not UTF-8, invalid JSON, an entry too large
        # not read to the end: its images are not "unlabeled" too
        lines = list(coco.problems) + ([str(exc)] if isinstance(exc, ValueError) else [])
        return ParsedLabels({}, lines, "objects", source, unparsable=set(keys))


class _CocoReader:
    """One pass over a COCO file: images are matched as they come, junk is reported as it
    comes (not kept), annotations of images that are not in IMAGES are not kept."""

    def __init__(self, path: Path, matcher: KeyMatcher):
        self.path, self.matcher = path, matcher
        self.problems = Problems(path)
        self.images = None                  # None: no 'images' list (yet)
        self.cats, self.anns, self.other = None, [], {}
        self.bad_cats = False
        self.labels, self.image_key, self.metadata, self.image_ids = {}, {}, {}, set()
        self.other_size = 0

    def read(self) -> None:
        seen = set()
        for name, value, is_array in jsonfile.members(self.path, expected="a COCO file (a JSON object)"):
            if name in seen and name in _SECTIONS:
                self.problems.append(f"{self.path}: '{name}' is given twice")
                continue
            seen.add(name)
            if name == "images" and is_array:
                self.images = True
                for n, img in value:
                    self._image(n, img)
            elif name == "annotations" and is_array:
                for n, ann in value:
                    self._annotation(n, ann)
            elif name == "categories" and is_array:
                self.cats = []
                for _, c in value:
                    self._category(c)
            elif name in _SECTIONS:
                if name == "annotations" and value:
                    self.problems.append(f"{self.path}: 'annotations' must be a list")
                if name == "categories" and value:
                    self.bad_cats = True
            elif is_array:
                self.other[name] = [self._kept(name, v) for _, v in value]
            else:
                self.other[name] = self._kept(name, value)

    def _kept(self, name: str, value):
        """Members other than images/annotations/categories go to the store's label_info:
        at most MAX_LABEL_INFO_CHARS of them in all (counted item by item)."""
        self.other_size += len(json.dumps(value))
        if self.other_size > MAX_LABEL_INFO_CHARS:
            raise ValueError(f"{self.path}: member {name!r}: the members other than 'images', 'annotations' "
                             f"and 'categories' hold more than {MAX_LABEL_INFO_CHARS} characters")
        return value

    def _category(self, c) -> None:
        if not (isinstance(c, dict) and _id(c.get("id"))):
            self.bad_cats = True
            return
        if len(self.cats) >= MAX_CLASSES:
            raise ValueError(f"{self.path}: more than {MAX_CLASSES} categories (a label file holds at most that many "
                             f"classes)")
        self.cats.append(c)

    def _image(self, n: int, img) -> None:
        where = f"{self.path} images[{n}]"
        if isinstance(img, dict) and _id(img.get("id")):   # its annotations are not reported again
            self.image_ids.add(img["id"])
        if not isinstance(img, dict) or not _id(img.get("id")) or not isinstance(img.get("file_name"), str):
            self.problems.append(f"{where}: an image needs 'id' and 'file_name', got {_short(img)}")
            return
        if img["id"] in self.image_key:
            self.problems.append(f"{where}: image id {img['id']!r} is used twice")
            return
        key, why = self.matcher.match(img["file_name"])
        if key is None:
            self.problems.append(f"{where}: file_name {img['file_name']!r}: {why}")
            return
        if key in self.labels:
            self.problems.append(f"{where}: {key} is listed twice")
            return
        w, h = img.get("width"), img.get("height")
        size = [w, h] if _num(w) and _num(h) and w > 0 and h > 0 else None
        self.labels[key] = new_label("coco", size=size, image=img)
        self.image_key[img["id"]] = key
        self.metadata[key] = {"image_id": img["id"]}

    def _annotation(self, n: int, ann) -> None:
        """Report what is wrong with ``ann`` alone; keep it when its image may be in IMAGES."""
        where = f"{self.path} annotations[{n}]" + (f" (id {_short(ann['id'], str)})" if isinstance(ann, dict)
                                                  and "id" in ann else "")
        if not isinstance(ann, dict):
            self.problems.append(f"{where}: expected an object")
            return
        if not _id(ann.get("image_id")) or not _id(ann.get("category_id")):
            self.problems.append(f"{where}: image_id and category_id must be integers, got "
                                 f"{_short(ann.get('image_id'))} and {_short(ann.get('category_id'))}")
            return
        if self.images and ann["image_id"] not in self.image_key:   # the images are read: not kept
            if ann["image_id"] not in self.image_ids:
                self.problems.append(f"{where}: image_id {ann['image_id']!r} is not in 'images'")
            return      # else the image entry itself is reported already
        self.anns.append((where, ann))

    def result(self, clip: bool) -> ParsedLabels:
        problems, path = self.problems, self.path
        cats = self.cats or []
        if self.bad_cats:
            problems.append(f"{path}: 'categories' must be a list of objects with an integer 'id'")
            cats = []
        seen = set()
        for c in cats:
            if c["id"] in seen:
                problems.append(f"{path}: category id {c['id']!r} is listed twice")
            seen.add(c["id"])
        cats = sorted(cats, key=lambda c: (isinstance(c["id"], str), c["id"]))
        cat_index = {c["id"]: i for i, c in enumerate(cats)}
        notes = {}
        for where, ann in self.anns:
            key = self.image_key.get(ann["image_id"])
            if key is None:
                if ann["image_id"] not in self.image_ids:
                    problems.append(f"{where}: image_id {ann['image_id']!r} is not in 'images'")
                continue  # else the image entry itself is reported already
            if ann["category_id"] not in cat_index:
                problems.append(f"{where}: category_id {ann.get('category_id')!r} is not in 'categories'")
                continue
            try:
                obj, note = _object(ann, cat_index[ann["category_id"]], self.labels[key]["size"], where, clip)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if note:
                notes.setdefault(key, []).append(note)
            self.labels[key]["objects"].append(obj)
        info = {"format": "coco", "categories": cats, **self.other}
        class_names = [str(c.get("name", c["id"])) for c in cats]
        return ParsedLabels(self.labels, list(problems), "objects", str(path), class_names, info,
                            self.metadata, notes)


def _short(value, text=repr) -> str:
    """``repr`` (or ``text``) of a JSON value, at most 80 characters."""
    text = text(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _object(ann: dict, cls: int, size, where: str, clip: bool):
    obj = {"class": cls, "src": {}, "attrs": {k: v for k, v in ann.items() if k not in _MODELLED}}
    note = ""
    if "iscrowd" in ann:
        obj["iscrowd"] = int(bool(ann["iscrowd"]))
    bbox = ann.get("bbox")
    if bbox is not None:
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(_num(v) for v in bbox)):
            raise ValueError(f"{where}: bbox must be 4 finite numbers [x, y, w, h], got {bbox!r}")
        x, y, bw, bh = bbox
        if bw < 0 or bh < 0:
            raise ValueError(f"{where}: bbox {bbox} has a negative width or height")
        x1, y1, x2, y2 = x, y, x + bw, y + bh
        if size:
            W, H = size
            if x1 < 0 or y1 < 0 or x2 > W or y2 > H:
                # Up to EDGE_SLACK px past the edge is rounding in the tool that wrote the file:
                # clipped (noted) without asking; more is an error unless clip
                slack = max(-x1, -y1, x2 - W, y2 - H) <= EDGE_SLACK
                if not clip and not slack:
                    raise ValueError(f"{where}: bbox {bbox} reaches outside the {W}x{H} image "
                                     f"(hint: --clip-boxes clips it)")
                x1, y1, x2, y2 = max(0, x1), max(0, y1), min(W, x2), min(H, y2)
                note = f"bbox {bbox} of annotation {ann.get('id')} clipped to the {W}x{H} image"
            obj["box"] = xyxy_px_to_cxcywh(x1, y1, x2, y2, W, H)
        else:
            obj["_px"] = [x1, y1, x2, y2]
        obj["src"]["bbox"] = bbox
    seg = ann.get("segmentation")
    if seg is not None:
        obj["src"]["segmentation"] = seg
        if isinstance(seg, dict):
            if "counts" not in seg or "size" not in seg:
                raise ValueError(f"{where}: RLE segmentation needs 'counts' and 'size'")
            obj["rle"] = seg
        elif isinstance(seg, list):
            rings = []
            for r, ring in enumerate(seg):
                if not (isinstance(ring, list) and len(ring) >= 6 and len(ring) % 2 == 0
                        and all(_num(v) for v in ring)):
                    raise ValueError(f"{where}: segmentation polygon {r} must be an even list of >= 6 "
                                     f"finite numbers")
                rings.append(ring)
            if size:
                obj["polygon"] = [[v / (size[0] if i % 2 == 0 else size[1]) for i, v in enumerate(ring)]
                                  for ring in rings]
            else:
                obj["_px_poly"] = rings
        else:
            raise ValueError(f"{where}: segmentation must be polygons (a list) or RLE (an object)")
    return obj, note


def write_coco(records, class_names, out_path, label_info=None) -> None:
    """Write records' labels as one COCO instances file (atomically).

    Works for any ``"objects"`` label (COCO, VOC, YOLO...): values a COCO source gave are
    written as they were; others are converted from the canonical box (pixels of the stored
    image). Images and annotations keep their source ids where they had them.

    Args:
        records: iterable of :class:`~packer.core.records.Record` (``key``, ``label``, ``width``,
            ``height``, ``metadata`` are used).
        class_names: the store's class names.
        out_path: the ``.json`` file to write.
        label_info: ``StoreMetadata.label_info`` (COCO categories, info, licenses).
    """
    records = list(records)
    info = dict(label_info or {})
    cats = info.pop("categories", None) if info.get("format") == "coco" else None
    info.pop("format", None)
    if not cats:
        # A store of bare class ids (YOLO without classes.txt) has no names: each id used gets a
        # category named after it, so every object keeps its class.
        used = [o["class"] for r in records for o in (as_label_model(r.label) or {}).get("objects", [])]
        names = list(class_names) + [str(i) for i in range(len(class_names), 1 + max(used, default=-1))]
        cats = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
    images, anns = [], []
    # New ids continue after the ids a COCO source used (other sources' attrs are not COCO's)
    coco_labels = [r.label for r in records if isinstance(r.label, dict) and r.label.get("format") == "coco"]
    used_ann = [o.get("attrs", {}).get("id") for lab in coco_labels for o in lab.get("objects", [])]
    used_img = [(lab.get("image") or {}).get("id") for lab in coco_labels]
    next_ann = 1 + max([i for i in used_ann if isinstance(i, int) and not isinstance(i, bool)] or [0])
    next_img = 1 + max([i for i in used_img if isinstance(i, int) and not isinstance(i, bool)] or [0])
    for rec in records:
        label = as_label_model(rec.label) or {}
        img = label.get("image") if label.get("format") == "coco" else None
        if img is None:
            img = {"id": next_img, "file_name": rec.key, "width": rec.width, "height": rec.height}
            next_img += 1
        images.append(img)
        W, H = label.get("size") or (rec.width, rec.height)
        for o in label.get("objects", []):
            ann = dict(o.get("attrs", {})) if label.get("format") == "coco" else {}
            if "id" not in ann:
                ann["id"] = next_ann
                next_ann += 1
            ann["image_id"] = img["id"]
            ann["category_id"] = cats[o["class"]]["id"]
            src = o.get("src", {}) if label.get("format") == "coco" else {}
            if "segmentation" in src:
                ann["segmentation"] = src["segmentation"]
            elif "polygon" in o:
                ann["segmentation"] = [[_px(v * (W if i % 2 == 0 else H)) for i, v in enumerate(r)]
                                       for r in o["polygon"]]
            elif "rle" in o:
                ann["segmentation"] = o["rle"]
            if "bbox" in src:
                ann["bbox"] = src["bbox"]
            elif o.get("box") is not None:
                cx, cy, w, h = o["box"]
                ann["bbox"] = [_px((cx - w / 2) * W), _px((cy - h / 2) * H), _px(w * W), _px(h * H)]
            if "iscrowd" in o or label.get("format") != "coco":
                ann["iscrowd"] = int(o.get("iscrowd", 0))
            if "area" not in ann and "bbox" in ann and label.get("format") != "coco":
                ann["area"] = _px(ann["bbox"][2] * ann["bbox"][3])
            anns.append(ann)
    out = {**info, "images": images, "annotations": anns, "categories": cats}
    _atomic_write(out_path, json.dumps(out).encode())


def _px(v: float):
    """Pixel value rounded to 1/100 px (no float noise), an int when whole."""
    r = round(v, 2)
    return int(r) if float(r).is_integer() else r


def _atomic_write(path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _detect(path) -> bool:
    """A COCO ``.json`` file. A folder of COCO files is refused: which split goes with the images
    is the user's call."""
    path = Path(path)
    if path.is_file():
        return path.suffix.lower() == ".json" and looks_like_coco(path)
    if path.is_dir():
        coco = sorted(p.name for p in path.glob("*.json") if looks_like_coco(p))
        if coco:
            raise UsageError(f"{path}: holds COCO annotation files ({', '.join(coco[:4])}): pass the one "
                             f"that goes with the images as LABELS, e.g. {path / coco[0]}")
    return False


def _parse(labels: Path, root, keys, options) -> ParsedLabels:
    if not labels.is_file():
        raise UsageError(f"{labels}: --labels-format coco expects an instances .json file")
    return parse_coco(labels, root, keys, clip=options.clip)


class CocoWriter(RecordsWriter):
    """``instances.json`` written by :func:`write_coco` (images stored unlabeled left out)."""

    name = "coco"
    target = "instances.json"
    skip_unlabeled = True
    write = staticmethod(write_coco)


FORM = LabelForm("coco", detect=_detect, order=30, parse=_parse, write=write_coco, exports=(CocoWriter,),
                 schemas=("objects",), choices=("coco",))
