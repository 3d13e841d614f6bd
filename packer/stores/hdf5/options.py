"""Writer and reader options of the HDF5 store, parsed from the CLI's strings
(``-O pixels=224x224``) or typed Python values: pixel size, compression and byte sizes.
"""
from __future__ import annotations

import re

import numpy as np

from packer.core.errors import UsageError
from packer.stores.base import parse_size


def parse_pixels(value) -> tuple[int, int] | None:
    """``"224x224"`` / ``"224"`` / ``(224, 224)`` / ``None`` -> ``(H, W)`` or None (JPEG mode)."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    if isinstance(value, str):
        parts = re.split(r"[xX,\s]+", value.strip())
        try:
            dims = [int(p) for p in parts if p]
        except ValueError:
            dims = []
    elif isinstance(value, (int, np.integer)):
        dims = [int(value)]
    else:
        try:
            dims = [int(v) for v in value]
        except (TypeError, ValueError):
            dims = []
    if len(dims) == 1:
        dims = dims * 2
    if len(dims) != 2 or not all(0 < d <= 65535 for d in dims):
        raise UsageError(f"hdf5: option pixels={value!r} is not a size; expected HxW, e.g. pixels=224x224")
    return dims[0], dims[1]


def parse_compression(value) -> tuple[str | None, int | None]:
    """``"lzf"`` / ``"gzip"`` / ``"gzip:6"`` / ``None`` -> (h5py compression, level)."""
    if value is None or value is False:
        return None, None
    text = str(value).strip().lower()
    if text in ("", "none", "off", "false"):
        return None, None
    if text == "lzf":
        return "lzf", None
    m = re.fullmatch(r"gzip(?::(\d))?", text)
    if m:
        return "gzip", int(m.group(1) or 4)
    raise UsageError(f"hdf5: option compression={value!r} not understood; choose none, lzf, gzip or gzip:LEVEL (1-9)")


def parse_bytes(value, name: str) -> int:
    """``131072`` / ``"128K"`` / ``"1M"`` -> bytes (at least 1 KiB)."""
    return parse_size(value, store="hdf5", option=name, minimum=1024)
