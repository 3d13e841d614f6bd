"""JPEG decoding for the readers: libjpeg-turbo (default) with DCT-domain reduced scale.

libjpeg-turbo can decode at 1/2, 1/4 and 1/8 scale inside the IDCT, which skips most of the
decode work: :func:`choose_scale` picks the smallest such scale that keeps a requested
minimum side. OpenCV (``decoder="opencv"``) is used only when asked for.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from packer.core.errors import UsageError
from packer.core.integrity import cv2_imdecode, turbo_decode, turbojpeg

#: Scales decoded in the DCT domain (fast); other libjpeg-turbo factors are slower.
FAST_SCALES = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1, 1))
DECODERS = ("turbojpeg", "opencv")


def parse_scale(scale) -> Fraction | None:
    """``None``/1 -> None (full size); ``0.5``, ``"1/4"``, ``(1, 8)`` -> Fraction in FAST_SCALES."""
    if scale is None:
        return None
    if isinstance(scale, (tuple, list)) and len(scale) == 2:
        f = Fraction(int(scale[0]), int(scale[1]))
    else:
        f = Fraction(str(scale)).limit_denominator(8)
    if f not in FAST_SCALES:
        raise UsageError(f"scale must be one of 1/8, 1/4, 1/2, 1; got {scale!r}")
    return None if f == 1 else f


def scaled_size(width: int, height: int, scale: Fraction | None) -> tuple[int, int]:
    """(width, height) libjpeg-turbo produces at ``scale`` (it rounds up)."""
    if scale is None:
        return width, height
    return (math.ceil(width * scale.numerator / scale.denominator),
            math.ceil(height * scale.numerator / scale.denominator))


def choose_scale(width: int, height: int, min_size: int) -> Fraction | None:
    """Smallest fast scale whose output keeps ``min(width, height) >= min_size``."""
    for f in FAST_SCALES:
        w, h = scaled_size(width, height, f)
        if min(w, h) >= min_size:
            return None if f == 1 else f
    return None


def decode_jpeg(data, *, channels: int = 3, scale: Fraction | None = None,
                decoder: str = "turbojpeg") -> np.ndarray:
    """Decode JPEG bytes to an HxWxC uint8 array (C = ``channels``: 3 RGB or 1 gray).

    Raises:
        ValueError: the data does not decode cleanly (decoder warnings count as errors).
        DependencyError: libturbojpeg is missing (with the install hint).
    """
    fmt = "gray" if channels == 1 else "rgb"
    if decoder == "turbojpeg":
        sf = None if scale is None else (scale.numerator, scale.denominator)
        return turbo_decode(data, pixel_format=fmt, scaling_factor=sf, strict=True)
    if decoder == "opencv":
        return _opencv_decode(data, channels, scale)
    raise UsageError(f"decoder must be one of {DECODERS}, got {decoder!r}")


def _opencv_decode(data, channels: int, scale: Fraction | None) -> np.ndarray:
    import cv2

    reduced = {None: 0, Fraction(1, 2): 2, Fraction(1, 4): 4, Fraction(1, 8): 8}[scale]
    if channels == 1:
        flag = {0: cv2.IMREAD_GRAYSCALE, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
                4: cv2.IMREAD_REDUCED_GRAYSCALE_4, 8: cv2.IMREAD_REDUCED_GRAYSCALE_8}[reduced]
    else:
        flag = {0: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
                4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}[reduced]
    arr = cv2_imdecode(data, flag | cv2.IMREAD_IGNORE_ORIENTATION)
    if channels == 1:
        return arr[:, :, None]
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)


def check_decoder(decoder: str) -> None:
    """Fail early (in the constructing process) when the chosen decoder cannot load."""
    if decoder == "turbojpeg":
        turbojpeg()
    elif decoder != "opencv":
        raise UsageError(f"decoder must be one of {DECODERS}, got {decoder!r}")
