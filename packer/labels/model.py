"""The label model of ``"objects"`` stores: one JSON-able dict per image, the same in every backend.

A label is a plain ``dict`` (so it serializes with the record and is covered by its checksum)::

    {
      "format": "coco",              # where it came from: coco | voc | yolo | masks | csv
      "size": [640, 480],            # width, height the source declared (None: not declared)
      "objects": [                   # one per box / polygon / instance
        {"class": 3,                 # packer class id (index into StoreMetadata.class_names)
         "box": [cx, cy, w, h],      # CANONICAL: normalized centre-x, centre-y, width, height
         "polygon": [[x, y, ...]],   # normalized rings (COCO polygons, YOLO-seg rows)
         "rle": {...},               # COCO RLE, as the file gave it
         "iscrowd": 0, "difficult": 0, "truncated": 0,    # flags, where the source has them
         "src": {...},               # the source's own values (COCO bbox, VOC bndbox strings,
                                     # the YOLO row text): writers reproduce the file from these
         "attrs": {...}},            # other per-object fields of the source (COCO id, area, ...)
      ],
      "mask": {"png": "<base64>", "kind": "semantic"},   # a PNG mask, its exact bytes
      "class": 2,                    # an image-level class (CSV), when there is one
      "image": {...},                # image-level source fields (COCO image entry, VOC header)
    }

The canonical box is **normalized ``cx cy w h``** (the YOLO convention and the ``"boxes"``
schema of earlier stores): it stays right whatever size the image is decoded at (DCT-scaled
decode, HDF5 pixel mode resizing). Readers turn it into absolute ``XYXY`` pixels of the decoded
image (:func:`readers.targets.decode_target`). Normalization uses the size the label source
declared (COCO ``width``/``height``, VOC ``<size>``) and the stored image's size otherwise;
:func:`bind_to_image` does it at build time and notes a mismatch.
"""
from __future__ import annotations

import base64
import math
from typing import Optional

import numpy as np

MODEL_VERSION = 1


def new_label(fmt: str, *, size=None, objects=None, **extra) -> dict:
    """A label-model dict (see the module docstring); ``extra`` adds top-level fields."""
    label = {"format": fmt, "size": list(size) if size else None, "objects": list(objects or [])}
    label.update({k: v for k, v in extra.items() if v is not None})
    return label


def xyxy_px_to_cxcywh(x1, y1, x2, y2, width, height) -> list:
    """Absolute pixel corners -> normalized ``[cx, cy, w, h]``."""
    return [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]


def cxcywh_to_xyxy_px(box, width, height) -> list:
    """Normalized ``[cx, cy, w, h]`` -> absolute pixel ``[x1, y1, x2, y2]``."""
    cx, cy, w, h = box
    return [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height]


def check_finite(values, where: str) -> None:
    """Raise ValueError naming ``where`` when a value is NaN or infinite."""
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"{where}: non-finite coordinate {v!r}")


def bind_to_image(label, width: int, height: int, orientation_applied: int = 1) -> tuple[object, list]:
    """Fill in what needs the image's size; return ``(label, notes)``.

    ``orientation_applied``: the EXIF orientation the build applied to the pixels (``--exif
    apply``). A label whose source declared the file's raw size (COCO, VOC: their tools read
    raw pixels) is turned with the pixels, and its ``size`` updated; a label already in the
    turned frame (declared size = turned size, for 90-degree turns) is kept. YOLO files carry no
    size and follow ultralytics, which labels the EXIF-turned image: they are kept.

    Objects whose source gave pixel coordinates carry ``"_px"`` (corner box) / ``"_px_poly"``
    until the image size is known (a VOC file without ``<size>``); they are normalized here.
    A declared size that differs from the stored image's (EXIF rotation applied, a resized
    copy) is noted: the label keeps the frame its source used.
    """
    if not isinstance(label, dict):
        return label, []
    notes = []
    size = label.get("size")
    if size and orientation_applied != 1:
        raw = (height, width) if orientation_applied >= 5 else (width, height)
        if (int(size[0]), int(size[1])) == raw:
            label = orient_label(label, orientation_applied)
            size = label["size"]
            notes.append(f"labels turned with the pixels (EXIF orientation {orientation_applied})"
                         + ("; the mask kept as given" if label.get("mask") else ""))
    if size and (int(size[0]), int(size[1])) != (int(width), int(height)):
        notes.append(f"label source says {size[0]}x{size[1]}, the stored image is {width}x{height}: "
                     f"coordinates kept in the source's frame")
    w, h = (size[0], size[1]) if size else (width, height)
    pending = [o for o in label.get("objects", []) if "_px" in o or "_px_poly" in o]
    if not pending:
        return label, notes
    label = dict(label, objects=[dict(o) for o in label["objects"]])
    for o in label["objects"]:
        px = o.pop("_px", None)
        if px is not None:
            o["box"] = xyxy_px_to_cxcywh(*px, w, h)
        poly = o.pop("_px_poly", None)
        if poly is not None:
            o["polygon"] = [[v / (w if i % 2 == 0 else h) for i, v in enumerate(ring)] for ring in poly]
    return label, notes


def _orient_point(x: float, y: float, o: int) -> tuple[float, float]:
    """Normalized point of the raw image -> the same point after EXIF orientation ``o``
    (as :func:`packer.core.integrity.apply_orientation` turns pixels)."""
    return {2: (1 - x, y), 3: (1 - x, 1 - y), 4: (x, 1 - y), 5: (y, x), 6: (1 - y, x),
            7: (1 - y, 1 - x), 8: (y, 1 - x)}.get(o, (x, y))


def orient_label(label: dict, orientation: int) -> dict:
    """A label-model dict in the raw frame -> the frame after EXIF ``orientation`` is applied:
    canonical boxes and polygons turned (``src`` keeps the source's raw values, so a writer
    for the same format still gives the original file); ``size`` swapped for 90-degree turns."""
    out = dict(label, objects=[])
    size = label.get("size")
    if size and orientation >= 5:
        out["size"] = [size[1], size[0]]
    for o in label.get("objects", []):
        o = dict(o)
        if o.get("box") is not None:
            cx, cy, w, h = o["box"]
            cx, cy = _orient_point(cx, cy, orientation)
            o["box"] = [cx, cy, h, w] if orientation >= 5 else [cx, cy, w, h]
        if o.get("polygon"):
            o["polygon"] = [[v for i in range(0, len(r), 2) for v in _orient_point(r[i], r[i + 1], orientation)]
                            for r in o["polygon"]]
        out["objects"].append(o)
    out["oriented"] = orientation
    return out


def encode_png(data: bytes) -> str:
    """PNG bytes -> the base64 text stored in ``label["mask"]["png"]``."""
    return base64.b64encode(data).decode("ascii")


def decode_png(text: str) -> bytes:
    """Inverse of :func:`encode_png`."""
    return base64.b64decode(text.encode("ascii"), validate=True)


def as_label_model(label):
    """Any stored label as a label-model dict: ``(N, 5)`` YOLO rows (``"boxes"`` stores) become
    objects with canonical boxes, a class id ``{"class": id}``; None stays None."""
    if label is None or isinstance(label, dict):
        return label
    if isinstance(label, (int, np.integer)):
        return new_label("class", **({"class": int(label)} if label >= 0 else {}))
    rows = np.asarray(label, dtype=np.float64).reshape(-1, 5)
    return new_label("boxes", objects=[{"class": int(r[0]), "box": [float(v) for v in r[1:]]} for r in rows])


def objects_of(label) -> list:
    """The objects of a label-model dict (``[]`` for anything else)."""
    return list(label.get("objects", [])) if isinstance(label, dict) else []


def class_of(label) -> Optional[int]:
    """The image-level class of a label-model dict, if any."""
    return label.get("class") if isinstance(label, dict) else None
