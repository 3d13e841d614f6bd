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

import io
import os
from pathlib import Path, PurePosixPath

import numpy as np

from .base import ParsedLabels
from .model import decode_png, encode_png, new_label

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
            data = p.read_bytes()
            try:
                arr = mask_array(data)
            except ValueError as exc:
                problems.append(f"{p}: {exc}")
                unparsable.add(key)
                continue
            labels[key] = new_label("masks", size=[int(arr.shape[1]), int(arr.shape[0])],
                                    mask={"png": encode_png(data), "name": PurePosixPath(rel_stem).name + ".png"})
    names = []
    if (masks_dir / "classes.txt").is_file():
        names = [ln.strip() for ln in (masks_dir / "classes.txt").read_text(encoding="utf-8-sig").splitlines()
                 if ln.strip()]
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
