"""Small images from records: reduced-scale decode, label drawing, JPEG data URIs.

Everything here decodes at a reduced DCT scale with libjpeg-turbo (1/2, 1/4, 1/8 inside the
IDCT), so a thumbnail of a 4000 px photograph costs about as much as a full decode of a
500 px one. The reduced-scale decode itself (:func:`packer.stores.sampling.decode_small`) is
shared with ``packer info``.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np

from packer.core.integrity import turbo_encode

# Tab10-like palette (RGB), one colour per class id modulo its length.
_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
            (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


@dataclass
class Shapes:
    """A label in drawable form: what :func:`draw_labels` takes.

    Attributes:
        caption: text under the thumbnail (class name, box count, ...).
        boxes: float array (N, 4) of x0, y0, x1, y1 in pixels of the image the label belongs to.
        box_classes: int array (N,) of class ids, one per box.
        masks: list of HxW bool arrays (any size: scaled to the image) or polygons as (K, 2)
            float arrays in pixels; empty when the label has none.
    """

    caption: str = ""
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    box_classes: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    masks: list = field(default_factory=list)


def class_name(cid: int, names) -> str:
    """``names[cid]`` when there is one, else the id as text (``-1`` -> ``unlabeled``)."""
    if cid == -1:
        return "unlabeled"
    return str(names[cid]) if names and 0 <= cid < len(names) else str(cid)


def label_shapes(label, schema: str, width: int, height: int, names=()) -> Shapes:
    """Turn a stored label into :class:`Shapes` in pixel coordinates of a ``width`` x ``height`` image.

    The one place that knows label layouts: ``"class"`` (an int), ``"boxes"`` (YOLO rows
    ``class cx cy w h``, normalized), ``"objects"`` (COCO / VOC / YOLO-seg / masks, see
    :mod:`packer.labels.model`), ``"none"``. The drawing and the plots take :class:`Shapes`.

    Example:
        >>> s = label_shapes(np.array([[0, .5, .5, .2, .4]], np.float32), "boxes", 100, 50, ["cat"])
        >>> s.boxes.tolist(), s.caption
        ([[40.0, 15.0, 60.0, 35.0]], '1 box: cat')
    """
    if label is None:
        return Shapes(caption="no label" if schema != "none" else "")
    if isinstance(label, (int, np.integer)):
        return Shapes(caption=class_name(int(label), names))
    if isinstance(label, dict):  # the "objects" label model (packer.labels.model)
        return _object_shapes(label, width, height, names)
    rows = np.asarray(label, dtype=np.float32).reshape(-1, 5)
    cls, cx, cy, w, h = rows.T
    boxes = np.stack([(cx - w / 2) * width, (cy - h / 2) * height,
                      (cx + w / 2) * width, (cy + h / 2) * height], axis=1)
    classes = cls.astype(np.int64)
    return Shapes(_box_caption(classes, names), boxes.astype(np.float32), classes)


def _object_shapes(label: dict, width: int, height: int, names) -> Shapes:
    """Shapes of an ``"objects"`` label: each object's canonical box (normalized cx cy w h) and
    polygon rings, the PNG mask where the label has one, the image-level class as caption."""
    from packer.labels.model import cxcywh_to_xyxy_px

    boxes, classes, masks = [], [], []
    for obj in label.get("objects") or []:
        if obj.get("box") is not None:
            boxes.append(cxcywh_to_xyxy_px(obj["box"], width, height))
            classes.append(int(obj.get("class", -1)))
        for ring in obj.get("polygon") or []:
            ring = np.asarray(ring, np.float32).reshape(-1, 2) * np.array([width, height], np.float32)
            if len(ring) >= 3:
                masks.append(ring)
    mask = (label.get("mask") or {}).get("png")
    if mask:
        import base64

        import cv2

        arr = cv2.imdecode(np.frombuffer(base64.b64decode(mask), np.uint8), cv2.IMREAD_UNCHANGED)
        if arr is not None and arr.ndim == 2:
            masks.append(arr > 0)
    classes_arr = np.asarray(classes, np.int64)
    caption = _box_caption(classes_arr, names)
    if label.get("class") is not None:
        caption = class_name(int(label["class"]), names) + ("" if not len(classes_arr) else f"; {caption}")
    return Shapes(caption, np.asarray(boxes, np.float32).reshape(-1, 4), classes_arr, masks)


def _box_caption(classes: np.ndarray, names) -> str:
    if len(classes) == 0:
        return "no boxes"
    uniq = sorted(set(int(c) for c in classes))
    shown = ", ".join(class_name(c, names) for c in uniq[:4]) + (", ..." if len(uniq) > 4 else "")
    return f"{len(classes)} box{'es' if len(classes) != 1 else ''}: {shown}"


def draw_labels(img: np.ndarray, boxes_xyxy, box_classes, names=(), masks=(), *,
                scale=1.0) -> np.ndarray:
    """Draw boxes (with class names) and masks on a copy of an RGB image.

    Args:
        img: HxWx3 uint8.
        boxes_xyxy: (N, 4) x0, y0, x1, y1 in pixels of the ORIGINAL image; multiplied by
            ``scale`` to land on ``img`` (a thumbnail).
        box_classes: (N,) class ids (colour and name).
        names: class names.
        masks: HxW bool arrays (resized to ``img``) or (K, 2) polygons in original pixels.
        scale: ``img`` size / original size, one factor or ``(sx, sy)``.

    Returns:
        A new HxWx3 uint8 array.
    """
    import cv2

    out = np.ascontiguousarray(img.copy())
    h, w = out.shape[:2]
    sx, sy = (scale, scale) if np.isscalar(scale) else scale
    xy = np.array([sx, sy], np.float32)
    for i, m in enumerate(masks):
        colour = np.array(_PALETTE[i % len(_PALETTE)], np.float32)
        m = np.asarray(m)
        if m.ndim == 2 and m.shape[1] == 2 and m.dtype.kind == "f":  # polygon
            pts = np.round(m * xy).astype(np.int32).reshape(-1, 1, 2)
            layer = np.zeros((h, w), np.uint8)
            cv2.fillPoly(layer, [pts], 1)
            sel = layer.astype(bool)
        else:
            sel = cv2.resize(m.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(bool)
        out[sel] = (0.55 * out[sel] + 0.45 * colour).astype(np.uint8)
    boxes = np.asarray(boxes_xyxy, np.float32).reshape(-1, 4) * np.tile(xy, 2)
    thick = 1 if max(h, w) < 200 else 2
    for (x0, y0, x1, y1), c in zip(boxes, np.asarray(box_classes).reshape(-1)):
        colour = _PALETTE[int(c) % len(_PALETTE)]
        p0 = (int(round(x0)), int(round(y0)))
        p1 = (int(round(x1)), int(round(y1)))
        cv2.rectangle(out, p0, p1, colour, thick)
        text = class_name(int(c), names)
        (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.35, 1)
        ty = max(th + 2, p0[1])
        cv2.rectangle(out, (p0[0], ty - th - 2), (p0[0] + tw + 2, ty), colour, -1)
        cv2.putText(out, text, (p0[0] + 1, ty - 2), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (255, 255, 255), 1,
                    cv2.LINE_AA)
    return out


def fit(img: np.ndarray, max_side: int) -> tuple[np.ndarray, float]:
    """Resize so the longer side is at most ``max_side``; returns (image, factor applied)."""
    import cv2

    h, w = img.shape[:2]
    f = min(1.0, max_side / max(h, w))
    if f >= 1.0:
        return img, 1.0
    size = (max(1, round(w * f)), max(1, round(h * f)))
    return cv2.resize(img, size, interpolation=cv2.INTER_AREA), f


def enlarge(img: np.ndarray, long_side: int) -> np.ndarray:
    """Blow a small image up by a whole factor, nearest-neighbour (each pixel a sharp square),
    until its longer side is close to ``long_side``; images with a longer side over
    ``long_side / 2`` come back as they are. A 5x10 image is otherwise a dot in the report.

    Example:
        >>> enlarge(np.zeros((10, 5, 3), np.uint8), 160).shape
        (160, 80, 3)
    """
    factor = long_side // max(1, max(img.shape[:2]))
    if factor < 2:
        return img
    return np.repeat(np.repeat(img, factor, axis=0), factor, axis=1)


def jpeg_data_uri(img: np.ndarray, quality: int = 80) -> str:
    """``data:image/jpeg;base64,...`` of an RGB uint8 image (self-contained HTML)."""
    return "data:image/jpeg;base64," + base64.b64encode(turbo_encode(img, quality)).decode("ascii")
