"""Pixel mode of the HDF5 store: a record's JPEG bytes decoded, oriented and resized to the
store's fixed ``(H, W)``, and the record rewritten to hold those pixels (with their checksum).
"""
from __future__ import annotations

import numpy as np

from packer.core.errors import ImageError
from packer.core.records import Record, checksum


def decode_resize(data, size: tuple[int, int], orientation: int = 1) -> np.ndarray:
    """JPEG bytes -> uint8 RGB ``(H, W, 3)`` resized to ``size`` = (H, W).

    EXIF in the bytes is ignored; ``orientation`` (the record's, "still to apply") is applied
    before resizing. INTER_AREA when shrinking (both sides), INTER_LINEAR otherwise.

    Raises:
        ValueError: the bytes do not decode.
    """
    import cv2

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if img is None:
        raise ValueError("OpenCV could not decode the JPEG")
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if orientation != 1:
        from packer.core.integrity import apply_orientation
        img = apply_orientation(img, orientation)
    h, w = size
    if img.shape[:2] != (h, w):
        shrink = h <= img.shape[0] and w <= img.shape[1]
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return np.ascontiguousarray(img, dtype=np.uint8)


def to_pixel_record(record: Record, size: tuple[int, int]) -> Record:
    """The record as pixel mode stores it: data = RGB pixel bytes, checksum of those bytes.

    ``source_checksum`` / ``source_size`` keep describing the original input file.
    """
    try:
        pixels = decode_resize(record.data, size, int(record.orientation))
    except ValueError as exc:
        raise ImageError(record.key, f"cannot decode for HDF5 pixel mode: {exc}") from exc
    data = pixels.tobytes()
    converted = record.converted
    if record.orientation != 1:
        applied = f"exif-orientation {record.orientation} applied"
        converted = f"{converted}, {applied}" if converted else applied
    return Record(index=record.index, key=record.key, data=data, label=record.label,
                  width=size[1], height=size[0], channels=3, source_format=record.source_format,
                  converted=converted, orientation=1, checksum=checksum(data),
                  source_checksum=record.source_checksum, source_size=record.source_size,
                  notes=list(record.notes), metadata=dict(record.metadata))
