"""Label-model dicts (``"objects"`` stores) -> training targets in torchvision v2 form.

:func:`decode_target` gives, for the image as decoded (after DCT scaling or HDF5 resizing)::

    {"boxes":  tv_tensors.BoundingBoxes (N, 4) float32, XYXY pixels, canvas_size=(H, W),
     "labels": int64 (N,),
     "masks":  tv_tensors.Mask (H, W) of the stored PNG's values (only with a mask), or with
               instance_masks=True, (N, H, W) uint8, one per object from its polygon / RLE,
               the pixels pycocotools gives (what torchvision's COCO wrapper gives Mask R-CNN),
     "polygons": list of N lists of (K, 2) float32 pixel tensors (only with polygons),
     "rle": list of N COCO RLE dicts or None (only with RLE),
     "iscrowd" / "difficult" / "truncated": int64 (N,) (only where the source had them),
     "class": int (only with an image-level class)}

This is the target format torchvision's detection models and ``transforms.v2`` take; objects
without a box (a COCO annotation with only a segmentation) get their polygon's bounding box,
or zeros when they have none (their ``rle`` is still there).
"""
from __future__ import annotations

import numpy as np
import torch

_FLAGS = ("iscrowd", "difficult", "truncated")

#: Where PyTorch publishes the wheels of one build flavour (``cpu``, ``cu128``, ...).
TORCH_WHEEL_INDEX = "https://download.pytorch.org/whl/{flavour}"


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built against ``torch_version`` (its local part ignored), or None
    for a version this rule does not know (torch 1.x, a source build such as ``2.15.0a0+git1f2e``).

    The rule of PyTorch's releases since 2.0: torch 2.M.P goes with torchvision 0.(M+15).P, except
    that torch 2.0.P went with 0.15.(P+1).

    Example:
        >>> matching_torchvision("2.13.0+cpu"), matching_torchvision("2.14.1"), matching_torchvision("2.0.1")
        ('0.28.0', '0.29.1', '0.15.2')
    """
    import re

    m = re.fullmatch(r"2\.(\d+)\.(\d+)(\+[\w.]+)?", torch_version.strip())
    if not m:
        return None
    minor, patch = int(m.group(1)), int(m.group(2))
    return f"0.15.{patch + 1}" if minor == 0 else f"0.{minor + 15}.{patch}"


def torchvision_install_hint(torch_version: str | None = None) -> str:
    """The pip command that installs the torchvision matching ``torch_version`` (default: the
    installed torch) without replacing that torch: for a build with a local flavour (``+cpu``,
    ``+cu128``), from PyTorch's wheel index of that flavour. A plain ``pip install torchvision``
    would pull PyPI's newest torchvision and with it PyPI's CUDA torch (~5.5 GB) over a CPU one.

    Example:
        >>> torchvision_install_hint("2.13.0+cpu")
        'pip install torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu'
        >>> torchvision_install_hint("2.14.1")
        'pip install torchvision==0.29.1'
    """
    if torch_version is None:
        torch_version = torch.__version__
    version = matching_torchvision(torch_version)
    if version is None:
        return (f"pip install the torchvision built for torch {torch_version} "
                "(https://pytorch.org/get-started/previous-versions/)")
    flavour = torch_version.partition("+")[2]
    index = f" --index-url {TORCH_WHEEL_INDEX.format(flavour=flavour)}" if flavour else ""
    return f"pip install torchvision=={version}{index}"


def import_tv_tensors(what: str):
    """``torchvision.tv_tensors``; DependencyError naming ``what`` needs it and the pip command of
    the torchvision that matches the installed torch (:func:`torchvision_install_hint`)."""
    try:
        from torchvision import tv_tensors
    except (ImportError, RuntimeError) as exc:   # RuntimeError: a torchvision built for another torch
        from packer.core.errors import DependencyError
        raise DependencyError(f"{what} need torchvision >= 0.16 ({exc}; for torch {torch.__version__}: "
                              f"{torchvision_install_hint()})") from exc
    return tv_tensors


def decode_target(label: dict, height: int, width: int, *, instance_masks: bool = False) -> dict:
    """A label-model dict -> target dict for an image of ``height`` x ``width`` pixels.

    Args:
        label: the record's label (see :mod:`packer.labels.model`), or None (no label: an
            image kept with ``--allow-unlabeled``, returned with zero objects).
        height, width: of the image tensor the target goes with.
        instance_masks: rasterize each object's polygon (or decode its RLE) into ``masks``.

    Returns:
        The dict described in the module docstring.

    Example:
        >>> t = decode_target({"objects": [{"class": 1, "box": [.5, .5, .2, .2]}]}, 100, 200)
        >>> t["boxes"].tolist(), t["labels"].tolist()
        ([[80.0, 40.0, 120.0, 60.0]], [1])
    """
    tv_tensors = import_tv_tensors("detection targets")
    label = label or {"objects": []}
    objects = label.get("objects", [])
    boxes = np.zeros((len(objects), 4), np.float64)
    for i, o in enumerate(objects):
        box = o.get("box")
        if box is None and o.get("polygon"):
            ring = np.asarray(o["polygon"][0], np.float64)
            xs, ys = ring[0::2], ring[1::2]
            box = [(xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2, xs.max() - xs.min(), ys.max() - ys.min()]
        if box is not None:
            cx, cy, w, h = box
            boxes[i] = [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height]
    target = {
        "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes.astype(np.float32)), format="XYXY",
                                          canvas_size=(height, width)),
        "labels": torch.from_numpy(np.array([int(o["class"]) for o in objects], np.int64)),
    }
    for flag in _FLAGS:
        if any(flag in o for o in objects):
            target[flag] = torch.from_numpy(np.array([int(o.get(flag, 0)) for o in objects], np.int64))
    if any(o.get("polygon") for o in objects):
        scale = np.array([width, height], np.float32)   # numpy: ~10x less overhead than torch per ring
        target["polygons"] = [[torch.from_numpy(np.asarray(r, np.float32).reshape(-1, 2) * scale)
                               for r in (o.get("polygon") or [])] for o in objects]
    if any("rle" in o for o in objects):
        target["rle"] = [o.get("rle") for o in objects]
    if label.get("mask"):
        target["masks"] = tv_tensors.Mask(_mask_tensor(label["mask"]["png"], height, width))
    elif instance_masks:
        target["masks"] = tv_tensors.Mask(instance_mask_stack(
            objects, height, width, pixel_polygons=_pixel_frame(label, height, width)))
    if label.get("class") is not None:
        target["class"] = int(label["class"])
    return target


def _mask_tensor(png_b64: str, height: int, width: int) -> torch.Tensor:
    from packer.labels.masks import mask_array
    from packer.labels.model import decode_png

    arr = mask_array(decode_png(png_b64))
    t = torch.from_numpy(arr.astype(np.uint8 if arr.dtype in (np.uint8, np.bool_) else np.int64))
    if t.shape != (height, width):  # decoded at a reduced scale / resized: nearest keeps the ids
        t = torch.nn.functional.interpolate(t[None, None].float(), size=(height, width), mode="nearest")[0, 0]
        t = t.to(torch.uint8 if arr.dtype in (np.uint8, np.bool_) else torch.int64)
    return t


def turned_label(label, orientation: int, raw_width: int, raw_height: int):
    """The label for a record whose EXIF ``orientation`` the reader applies (``--exif record``
    stores): turned like the pixels when its source declared the raw size (see
    :func:`packer.labels.model.bind_to_image`)."""
    from packer.labels.model import bind_to_image

    if not isinstance(label, dict) or orientation == 1:
        return label
    w, h = (raw_height, raw_width) if orientation >= 5 else (raw_width, raw_height)
    return bind_to_image(label, w, h, orientation)[0]


def _pixel_frame(label: dict, height: int, width: int) -> bool:
    """True when the COCO polygons of ``label`` (``src["segmentation"]``, in the source's pixels)
    are in the frame of the decoded image: the source's size, not turned."""
    size = label.get("size")
    return (label.get("format") == "coco" and not label.get("oriented") and bool(size)
            and (int(size[0]), int(size[1])) == (int(width), int(height)))


def instance_mask_stack(objects: list, height: int, width: int, *, pixel_polygons: bool = False) -> torch.Tensor:
    """(N, H, W) uint8: each object's polygon rings filled as pycocotools fills them
    (:func:`packer.labels.masks.polygons_mask`), or its RLE decoded and resized (nearest) to the
    image; an object with neither is its box, filled.

    ``pixel_polygons``: use the COCO source's own pixel polygons (``src["segmentation"]``) where
    an object has them, so the masks equal pycocotools' on the annotation file bit for bit
    (normalized coordinates scaled back can differ by a rounding step); otherwise the
    normalized polygons are scaled to ``width`` x ``height``.
    """
    import cv2

    from packer.labels.masks import polygons_mask

    out = np.zeros((len(objects), height, width), np.uint8)
    for i, o in enumerate(objects):
        if o.get("polygon"):
            rings = (o.get("src") or {}).get("segmentation") if pixel_polygons else None
            if not isinstance(rings, list):
                rings = [[v * (width if j % 2 == 0 else height) for j, v in enumerate(r)] for r in o["polygon"]]
            out[i] = polygons_mask(rings, height, width)
        elif o.get("rle"):
            m = rle_to_mask(o["rle"])
            if m.shape != (height, width):
                m = cv2.resize(m, (width, height), interpolation=cv2.INTER_NEAREST)
            out[i] = m
        elif o.get("box") is not None:
            cx, cy, w, h = o["box"]
            x1, y1 = int(round((cx - w / 2) * width)), int(round((cy - h / 2) * height))
            x2, y2 = int(round((cx + w / 2) * width)), int(round((cy + h / 2) * height))
            out[i, max(0, y1):y2, max(0, x1):x2] = 1
    return torch.from_numpy(out)


def rle_to_mask(rle: dict) -> np.ndarray:
    """Decode a COCO RLE (``counts`` as a list or as COCO's compressed string) to an ``(h, w)``
    uint8 mask, column-major as COCO defines it.

    Raises:
        ValueError: malformed RLE.

    Example:
        >>> rle_to_mask({"size": [2, 2], "counts": [1, 2, 1]}).tolist()
        [[0, 1], [1, 0]]
    """
    h, w = (int(v) for v in rle["size"])
    counts = rle["counts"]
    if isinstance(counts, str):
        counts = _decode_counts(counts)
    flat = np.zeros(h * w, np.uint8)
    pos, val = 0, 0
    for c in counts:
        if c < 0 or pos + c > h * w:
            raise ValueError(f"RLE counts run past the {h}x{w} mask")
        flat[pos:pos + c] = val
        pos += c
        val ^= 1
    return flat.reshape(w, h).T.copy()


def _decode_counts(s: str) -> list:
    """COCO's compressed RLE string (pycocotools ``rleFrString``): 5 bits per char, signed
    deltas from the count two before."""
    counts, p = [], 0
    while p < len(s):
        x, k, more = 0, 0, True
        while more:
            c = ord(s[p]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts
