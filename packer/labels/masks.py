"""A folder of PNG masks (semantic class ids or instance ids per pixel), matched by stem.

``LABELS/<dir>/<stem>.png`` is the mask of ``IMAGES/<dir>/<stem>.*`` (relative path first, then
a unique basename stem). The PNG's exact bytes are stored (base64 in the label, so lossless and
under the record checksum); its pixels are checked to decode (Pillow: ``L``, ``P`` palette as
used by VOC ``SegmentationClass``, ``I;16``, ``I``) and its size is compared with the image's at
build time. Class names come from a ``classes.txt`` in the folder, when there is one.

Example:
    >>> parsed = parse_masks("masks", "images", keys)   # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path, PurePosixPath

import numpy as np

from packer.core.errors import SourceError, UsageError
from packer.labels.base import LabelForm, ParsedLabels, RecordsWriter, label_suffixes
from packer.labels.limits import MAX_MASK_BYTES, MAX_PER_IMAGE_BYTES, read_bounded, text_lines
from packer.labels.model import decode_png, encode_png, new_label

_MODES = ("1", "L", "P", "I;16", "I;16B", "I;16L", "I")


def looks_like_masks(path: Path) -> bool:
    """True for a folder whose files are PNGs (no .txt/.json/.xml labels)."""
    exts = set()
    for _, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        exts.update(Path(n).suffix.lower() for n in filenames if not n.startswith(".") and n != "classes.txt")
    return bool(exts) and exts <= {".png"}


def mask_array(png: bytes) -> np.ndarray:
    """PNG bytes -> 2-D integer array of the mask values (palette indices for ``P``).

    Raises:
        ValueError: not a PNG, or not a one-channel image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(png)) as im:
            if im.format != "PNG":
                raise ValueError(f"a mask must be a PNG, found {im.format}")
            if im.mode not in _MODES:
                raise ValueError(f"a mask must have one channel of ids (mode L, P, I;16 or I), found mode {im.mode}")
            im.load()
            return np.array(im)
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError, IndexError, KeyError,
            Image.DecompressionBombError) as exc:  # Pillow plugins raise these on damaged files
        raise ValueError(f"mask does not decode: {exc}") from exc


def parse_masks(masks_dir, root, keys, **_ignored) -> ParsedLabels:
    """Match every ``.png`` under ``masks_dir`` to an image key; schema ``"objects"``."""
    masks_dir = Path(masks_dir)
    by_stem, base = {}, {}
    for k in keys:
        by_stem[PurePosixPath(k).with_suffix("").as_posix()] = k
        base.setdefault(PurePosixPath(k).stem, []).append(k)
    labels, problems, unparsable = {}, [], set()
    for dirpath, dirnames, filenames in os.walk(masks_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(".png"):
                continue
            p = Path(dirpath) / name
            rel_stem = (Path(dirpath).relative_to(masks_dir) / Path(name).stem).as_posix()
            key = by_stem.get(rel_stem)
            if key is None and len(base.get(Path(name).stem, [])) == 1:
                key = base[Path(name).stem][0]
            if key is None:
                problems.append(f"{p}: mask without an image (looked for {rel_stem}.* in {root})")
                continue
            if key in labels:
                problems.append(f"{p}: a second mask for {key}")
                continue
            try:
                data = read_bounded(p, MAX_MASK_BYTES, "mask")
                arr = mask_array(data)
            except ValueError as exc:
                problems.append(str(exc) if str(exc).startswith(str(p)) else f"{p}: {exc}")
                unparsable.add(key)
                continue
            labels[key] = new_label("masks", size=[int(arr.shape[1]), int(arr.shape[0])],
                                    mask={"png": encode_png(data), "name": PurePosixPath(rel_stem).name + ".png"})
    names = []
    if (masks_dir / "classes.txt").is_file():
        try:
            names = [ln.strip() for ln in text_lines(masks_dir / "classes.txt", max_bytes=MAX_PER_IMAGE_BYTES)
                     if ln.strip()]
        except ValueError as exc:
            problems.append(str(exc))
    return ParsedLabels(labels, problems, "objects", str(masks_dir), names, {"format": "masks"}, {}, {}, unparsable)


def write_masks(records, class_names, out_dir, label_info=None) -> list:
    """Write each record's mask PNG, byte for byte, to ``out_dir/<key stem>.png``."""
    out_dir = Path(out_dir)
    written = []
    for rec in records:
        mask = rec.label.get("mask") if isinstance(rec.label, dict) else None
        if not mask:
            continue
        path = out_dir / PurePosixPath(rec.key).with_suffix(".png")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(decode_png(mask["png"]))
        os.replace(tmp, path)
        written.append(path)
    if class_names:
        (out_dir / "classes.txt").write_text("".join(f"{n}\n" for n in class_names), encoding="utf-8")
    return written


def attach_masks(sources, masks_dir: Path, allow_unlabeled: bool = False):
    """Add the masks of ``masks_dir`` to the labels of ``sources`` (``--masks``).

    Every label becomes a label-model dict with a ``"mask"``: class ids become
    ``{"class": id}``, YOLO rows become objects; images keep their other labels. An image
    without a mask is a problem unless ``allow_unlabeled``.

    Raises:
        UsageError: ``masks_dir`` is not a folder.
        SourceError: mask problems, each naming its file.
    """
    import numpy as np

    if not masks_dir.is_dir():
        raise UsageError(f"{masks_dir}: --masks must be a folder of .png masks")
    parsed = parse_masks(masks_dir, sources.root, sources.keys)
    problems = list(parsed.problems)
    if not allow_unlabeled:
        problems += [f"{sources.root / k}: image without a mask in {masks_dir}" for k in sources.keys
                     if k not in parsed.mapping and k not in parsed.unparsable]
    if problems:
        raise SourceError(f"{len(problems)} problem(s) with masks; nothing was written", problems)
    labels = []
    for key, label in zip(sources.keys, sources.labels):
        if isinstance(label, dict):
            label = dict(label)
        elif isinstance(label, np.ndarray):
            label = new_label("yolo", objects=[{"class": int(r[0]), "box": [float(v) for v in r[1:]]}
                                               for r in label])
        elif label is not None and sources.label_schema == "class":
            label = new_label(sources.label_info.get("format", "class"),
                              **({"class": int(label)} if label >= 0 else {}))
        else:
            label = new_label("masks")
        mask = parsed.mapping.get(key)
        if mask is not None:
            label["mask"] = mask["mask"]
        labels.append(label)
    info = dict(sources.label_info, masks={"format": "masks", "folder": str(masks_dir)})
    return dataclasses.replace(sources, labels=labels, label_schema="objects", label_info=info,
                               class_names=list(sources.class_names) or list(parsed.class_names),
                               label_source=f"{sources.label_source} + masks {masks_dir}")


def polygon_mask(ring, height: int, width: int) -> np.ndarray:
    """One polygon ring (pixel ``[x1, y1, x2, y2, ...]``) -> ``(height, width)`` uint8 mask, the
    pixels pycocotools gives (``decode(frPyObjects([ring], h, w))``): a numpy port of its
    ``rleFrPoly`` (COCO's ``maskApi.c``), bit for bit.

    pycocotools walks the edges on a grid 5x finer than the pixels and keeps, per pixel column
    centre, where the boundary crosses it; a pixel is inside when its centre lies between two
    crossings. So a 200x150 rectangle from (0, 0) covers 200x150 pixels (OpenCV's ``fillPoly``
    of the rounded corners covers 201x151).

    Example:
        >>> polygon_mask([1, 1, 3, 1, 3, 3, 1, 3], 4, 4)
        array([[0, 0, 0, 0],
               [0, 1, 1, 0],
               [0, 1, 1, 0],
               [0, 0, 0, 0]], dtype=uint8)
    """
    h, w = int(height), int(width)
    scale = 5.0
    xy = np.asarray(ring, np.float64).reshape(-1, 2)
    # (int)(scale * v + .5): C truncates toward zero
    x = np.trunc(scale * xy[:, 0] + .5).astype(np.int64)
    y = np.trunc(scale * xy[:, 1] + .5).astype(np.int64)
    xs, ys = x, y
    xe, ye = np.roll(x, -1), np.roll(y, -1)
    dx, dy = np.abs(xe - xs), np.abs(ys - ye)
    along_x = dx >= dy
    flip = (along_x & (xs > xe)) | (~along_x & (ys > ye))
    xs, xe = np.where(flip, xe, xs), np.where(flip, xs, xe)
    ys, ye = np.where(flip, ye, ys), np.where(flip, ys, ye)
    steps = np.where(along_x, dx, dy)
    with np.errstate(divide="ignore", invalid="ignore"):   # a repeated vertex: 0/0, its point is never used
        s = np.where(along_x, (ye - ys) / dx, (xe - xs) / dy)
    s = np.where(steps == 0, 0.0, s)
    n = steps + 1
    edge = np.repeat(np.arange(len(n)), n)
    d = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    t = np.where(flip[edge], steps[edge] - d, d)
    ax = along_x[edge]
    walked = np.trunc(np.where(ax, ys[edge], xs[edge]) + s[edge] * t + .5).astype(np.int64)
    u = np.where(ax, t + xs[edge], walked)
    v = np.where(ax, walked, t + ys[edge])
    # points where the boundary crosses a pixel column centre, downsampled to pixels
    changed = u[1:] != u[:-1]
    u1, u0, v1, v0 = u[1:][changed], u[:-1][changed], v[1:][changed], v[:-1][changed]
    xd = (np.where(u1 < u0, u1, u1 - 1).astype(np.float64) + .5) / scale - .5
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= w - 1)
    yd = (np.minimum(v1, v0)[keep].astype(np.float64) + .5) / scale - .5
    yd = np.ceil(np.clip(yd, 0, h))
    starts = xd[keep].astype(np.int64) * h + yd.astype(np.int64)
    # each crossing toggles inside/outside from there on, column-major as COCO's RLE; only the
    # span between the first and the last crossing is walked, the rest is constant
    flat = np.zeros(h * w, np.uint8)
    if starts.size and starts.min() < h * w:
        lo, hi = int(starts.min()), int(starts.max())
        parity = (np.cumsum(np.bincount(starts - lo, minlength=hi - lo + 1)) & 1).astype(np.uint8)
        end = min(hi + 1, h * w)
        flat[lo:end] = parity[:end - lo]
        flat[end:] = parity[-1]
    return flat.reshape(w, h).T.copy()


def polygons_mask(rings, height: int, width: int) -> np.ndarray:
    """The union of an object's polygon rings (pixels), as pycocotools gives it to torchvision's
    COCO wrapper (``merge(frPyObjects(rings, h, w))`` then ``decode``): ``(height, width)`` uint8.

    Uses pycocotools when it is installed (``pip install 'packer-vision[coco]'``), else
    :func:`polygon_mask` (the same pixels, checked against pycocotools in the tests).
    """
    rings = [list(map(float, r)) for r in rings]
    out = np.zeros((int(height), int(width)), np.uint8)
    if not rings:
        return out
    try:
        from pycocotools import mask as coco_mask
    except ImportError:
        coco_mask = None
    if coco_mask is not None and all(len(r) >= 6 for r in rings):
        # frPyObjects takes a list whose first ring has > 4 values for polygons (4: a bbox)
        rles = coco_mask.frPyObjects(rings, int(height), int(width))
        return np.ascontiguousarray(coco_mask.decode(coco_mask.merge(rles)), dtype=np.uint8)
    for r in rings:
        out |= polygon_mask(r, height, width)
    return out


def _detect(path) -> bool:
    """A folder of ``.png`` masks."""
    path = Path(path)
    if not path.is_dir():
        return False
    exts = label_suffixes(path)
    return bool(exts) and exts <= {".png"} and looks_like_masks(path)


def _parse(labels: Path, root, keys, options) -> ParsedLabels:
    if not labels.is_dir():
        raise UsageError(f"{labels}: --labels-format masks expects a folder of .png masks")
    return parse_masks(labels, root, keys)


class MasksWriter(RecordsWriter):
    """``labels/`` of ``.png`` masks written by :func:`write_masks` (images stored unlabeled left out)."""

    name = "masks"
    target = "labels"
    skip_unlabeled = True
    write = staticmethod(write_masks)


FORM = LabelForm("masks", detect=_detect, order=20, parse=_parse, write=write_masks, exports=(MasksWriter,),
                 schemas=("objects",), choices=("masks",))
