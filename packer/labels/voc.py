"""Pascal VOC ``Annotations/*.xml``: parse into the label model, and write it back.

* one XML file per image, matched by relative path and stem (``Annotations/000005.xml`` ->
  ``000005.jpg``), else by its ``<filename>``;
* ``<object>``: ``name`` -> class id (names sorted), ``bndbox`` ``xmin ymin xmax ymax`` (pixels,
  taken as the box corners as written) -> canonical normalized ``cx cy w h`` with ``<size>``;
  the strings as written stay in ``src["bndbox"]``; ``difficult`` and ``truncated`` kept as flags;
  other children (``pose``, ``occluded``, ``part`` ...) in ``attrs``;
* the header (``folder``, ``source``, ``size``, ``segmented`` ...) in ``label["image"]``.

Example:
    >>> parsed = parse_voc("VOC2007/Annotations", "VOC2007/JPEGImages", keys)   # doctest: +SKIP
"""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath

from packer.core.errors import UsageError
from packer.labels.base import KeyMatcher, LabelForm, ParsedLabels, RecordsWriter, label_suffixes
from packer.labels.coco import EDGE_SLACK
from packer.labels.limits import MAX_PER_IMAGE_BYTES, MAX_XML_DEPTH, read_bounded
from packer.labels.model import as_label_model, new_label, xyxy_px_to_cxcywh

_CORNERS = ("xmin", "ymin", "xmax", "ymax")
_FLAGS = ("difficult", "truncated")


def annotations_dir(path: Path) -> Path | None:
    """The folder of VOC XML files that ``path`` is or holds (``VOC2007/`` -> ``Annotations``)."""
    path = Path(path)
    if (path / "Annotations").is_dir():
        return path / "Annotations"
    if path.is_dir() and any(n.lower().endswith(".xml") for n in os.listdir(path)):
        return path
    return None


def read_xml(path) -> ET.Element:
    """The root element of a per-image XML file: at most MAX_PER_IMAGE_BYTES, elements nested
    at most MAX_XML_DEPTH deep (what reads it recurses).

    Raises:
        ValueError: naming ``path``: unreadable, too large, invalid XML or nested too deep.
    """
    data = read_bounded(path, MAX_PER_IMAGE_BYTES)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ValueError(f"{path}: invalid XML: {exc}") from None
    stack = [(root, 1)]
    while stack:
        e, depth = stack.pop()
        if depth > MAX_XML_DEPTH:
            raise ValueError(f"{path}: XML elements nested more than {MAX_XML_DEPTH} deep (<{e.tag}>); "
                             f"a VOC annotation nests 4")
        stack.extend((child, depth + 1) for child in e)
    return root


def _value(e: ET.Element):
    """An element as text (leaf) or a list of ``[tag, value]`` pairs: a list, not a dict, so that
    the order of children survives JSON with sorted keys (stores sort them)."""
    if len(e) == 0:
        return (e.text or "").strip()
    return [[child.tag, _value(child)] for child in e]


def parse_voc(labels_dir, root, keys, *, clip: bool = False) -> ParsedLabels:
    """Parse every ``*.xml`` under ``labels_dir`` against the image keys under ``root``.

    Returns:
        ParsedLabels with schema ``"objects"``; problems name file and object.
    """
    labels_dir = Path(labels_dir)
    source = str(labels_dir)
    matcher = KeyMatcher(root, keys)
    by_stem = {}
    base_stems = {}
    for k in keys:
        by_stem[PurePosixPath(k).with_suffix("").as_posix()] = k
        base_stems.setdefault(PurePosixPath(k).stem, []).append(k)
    problems, labels, notes, unparsable = [], {}, {}, set()
    parsed = []
    for dirpath, dirnames, filenames in os.walk(labels_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(".xml"):
                continue
            xml_path = Path(dirpath) / name
            rel_stem = (Path(dirpath).relative_to(labels_dir) / Path(name).stem).as_posix()
            try:
                ann = read_xml(xml_path)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if ann.tag != "annotation":
                problems.append(f"{xml_path}: root element is <{ann.tag}>, expected <annotation>")
                continue
            key = by_stem.get(rel_stem)
            if key is None and len(base_stems.get(Path(name).stem, [])) == 1:
                key = base_stems[Path(name).stem][0]
            if key is None and ann.findtext("filename"):
                key, _ = matcher.match(ann.findtext("filename"))
            if key is None:
                problems.append(f"{xml_path}: annotation without an image (looked for {rel_stem}.* and "
                                f"<filename> {ann.findtext('filename')!r} in {root})")
                continue
            if key in labels:
                problems.append(f"{xml_path}: a second annotation for {key}")
                continue
            try:
                labels[key], note = _parse_annotation(ann, xml_path, clip)
            except ValueError as exc:
                problems.append(str(exc))
                unparsable.add(key)
                continue
            if note:
                notes[key] = note
            parsed.append(key)
    names = sorted({o["class"] for lab in labels.values() for o in lab["objects"]})
    ids = {n: i for i, n in enumerate(names)}
    for lab in labels.values():
        for o in lab["objects"]:
            o["class"] = ids[o["class"]]
    return ParsedLabels(labels, problems, "objects", source, names, {"format": "voc"}, {}, notes, unparsable)


def _parse_annotation(ann: ET.Element, xml_path: Path, clip: bool):
    header = [[child.tag, _value(child)] for child in ann if child.tag != "object"]
    size = None
    sz = dict(header).get("size")
    if isinstance(sz, list):
        sz = {k: v for k, v in sz if isinstance(v, str)}
        try:
            w, h = float(sz.get("width", "")), float(sz.get("height", ""))
            if w > 0 and h > 0:
                size = [int(w) if w.is_integer() else w, int(h) if h.is_integer() else h]
        except ValueError:
            raise ValueError(f"{xml_path}: <size> is not numeric: {sz}") from None
    objects, notes = [], []
    for n, obj in enumerate(ann.findall("object")):
        where = f"{xml_path}: object {n}"
        name = (obj.findtext("name") or "").strip()
        if not name:
            raise ValueError(f"{where}: no <name>")
        o = {"class": name, "src": {"order": [child.tag for child in obj]}, "attrs": []}
        for child in obj:
            if child.tag in ("name", "bndbox"):
                continue
            if child.tag in _FLAGS:
                text = (child.text or "").strip()
                if text not in ("0", "1"):
                    raise ValueError(f"{where}: <{child.tag}> must be 0 or 1, got {text!r}")
                o[child.tag] = int(text)
                o["src"][child.tag] = text
            else:
                o["attrs"].append([child.tag, _value(child)])
        box = obj.find("bndbox")
        if box is not None:
            texts = [(box.findtext(c) or "").strip() for c in _CORNERS]
            try:
                x1, y1, x2, y2 = (float(t) for t in texts)
            except ValueError:
                raise ValueError(f"{where}: <bndbox> needs numeric xmin ymin xmax ymax, got {texts}") from None
            if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
                raise ValueError(f"{where}: <bndbox> has a non-finite value {texts}")
            if x2 < x1 or y2 < y1:
                raise ValueError(f"{where}: <bndbox> xmax/ymax smaller than xmin/ymin: {texts}")
            o["src"]["bndbox"] = dict(zip(_CORNERS, texts))
            if size:
                W, H = size
                if x1 < 0 or y1 < 0 or x2 > W or y2 > H:
                    if not clip and max(-x1, -y1, x2 - W, y2 - H) > EDGE_SLACK:  # else: rounding, clipped
                        raise ValueError(f"{where}: <bndbox> {texts} reaches outside the {W}x{H} image "
                                         f"(hint: --clip-boxes clips it)")
                    x1, y1, x2, y2 = max(0, x1), max(0, y1), min(W, x2), min(H, y2)
                    notes.append(f"{xml_path.name} object {n}: box {texts} clipped to {W}x{H}")
                o["box"] = xyxy_px_to_cxcywh(x1, y1, x2, y2, W, H)
            else:
                o["_px"] = [x1, y1, x2, y2]
        objects.append(o)
    return new_label("voc", size=size, objects=objects, image=header), notes


def _element(parent: ET.Element, tag: str, value) -> None:
    e = ET.SubElement(parent, tag)
    if isinstance(value, list):
        for k, v in value:
            _element(e, k, v)
    else:
        e.text = str(value)


def write_voc(records, class_names, out_dir, label_info=None) -> list:
    """Write one VOC XML per record into ``out_dir`` (relative path of the key, ``.xml``).

    VOC sources are written back from the values they gave (header, child order, strings of
    ``bndbox``, flags, extra children), tab-indented as VOC's own files; other sources get a
    standard header and boxes in pixels of the stored image.

    Returns:
        The paths written.
    """
    out_dir = Path(out_dir)
    written = []
    for rec in records:
        label = as_label_model(rec.label) or {"objects": []}
        same = label.get("format") == "voc"
        W, H = label.get("size") or (rec.width, rec.height)
        if same:
            header = label.get("image") or []
        else:
            header = [["folder", ""], ["filename", PurePosixPath(rec.key).name],
                      ["size", [["width", str(rec.width)], ["height", str(rec.height)], ["depth", str(rec.channels)]]],
                      ["segmented", "0"]]
        ann = ET.Element("annotation")
        objects = list(label.get("objects", []))
        for tag, value in header:
            _element(ann, tag, value)
        for o in objects:
            _object_element(ann, o, class_names, same, W, H)
        ET.indent(ann, space="\t")
        path = out_dir / PurePosixPath(rec.key).with_suffix(".xml")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(ET.tostring(ann, encoding="unicode").encode() + b"\n")
        os.replace(tmp, path)
        written.append(path)
    return written


def _object_element(ann, o: dict, class_names, same: bool, W, H) -> None:
    obj = ET.SubElement(ann, "object")
    src = o.get("src", {}) if same else {}
    attrs = dict((k, v) for k, v in o.get("attrs", [])) if same else {}
    order = src.get("order") or ["name", *attrs, *[f for f in _FLAGS if f in o], "bndbox"]
    for tag in order:
        if tag == "name":
            ET.SubElement(obj, "name").text = class_names[o["class"]]
        elif tag in _FLAGS:
            if tag in o:
                ET.SubElement(obj, tag).text = src.get(tag, str(o[tag]))
        elif tag == "bndbox":
            corners = src.get("bndbox")
            if corners is None and o.get("box") is not None:
                cx, cy, w, h = o["box"]
                vals = [(cx - w / 2) * W, (cy - h / 2) * H, (cx + w / 2) * W, (cy + h / 2) * H]
                corners = {c: _fmt(v) for c, v in zip(_CORNERS, vals)}
            if corners is not None:
                box = ET.SubElement(obj, "bndbox")
                for c in _CORNERS:
                    ET.SubElement(box, c).text = corners[c]
        elif tag in attrs:
            _element(obj, tag, attrs.pop(tag))


def _fmt(v: float) -> str:
    r = round(v, 2)
    return str(int(r)) if float(r).is_integer() else str(r)


def _detect(path) -> bool:
    """A folder holding ``Annotations/``, or a folder of ``.xml`` files (and no per-image labels)."""
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / "Annotations").is_dir():
        return True
    exts = label_suffixes(path)
    return ".xml" in exts and not exts & {".txt", ".json"}


def _parse(labels: Path, root, keys, options) -> ParsedLabels:
    ann = annotations_dir(labels) if labels.is_dir() else None
    if ann is None:
        raise UsageError(f"{labels}: --labels-format voc expects an Annotations/ folder of .xml files")
    return parse_voc(ann, root, keys, clip=options.clip)


class VocWriter(RecordsWriter):
    """``labels/`` of ``.xml`` files written by :func:`write_voc` (images stored unlabeled left out)."""

    name = "voc"
    target = "labels"
    skip_unlabeled = True
    write = staticmethod(write_voc)


FORM = LabelForm("voc", detect=_detect, order=10, parse=_parse, write=write_voc, exports=(VocWriter,),
                 schemas=("objects",), choices=("voc",))
