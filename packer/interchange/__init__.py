"""Datasets in the formats the big training stacks use, as build sources and export targets.

One subpackage per format (a module per concern: finding the input, reading it, writing it),
each with a ``FORMAT`` object keeping the contract of :mod:`packer.interchange.base`; this
registry imports them lazily, so a format's optional library is needed only when that format is
used.

    >>> from packer.interchange import available_formats
    >>> available_formats()
    ['hf', 'mds', 'tfrecord', 'webdataset']
"""
from __future__ import annotations

import importlib
from typing import Optional

from packer.core.errors import UsageError
from packer.interchange.base import ExportOptions, ExportResult, Locator, Scan, ScanOptions, read_locator

#: --from / --to name -> module under packer.interchange.
_MODULES = {"webdataset": "webdataset", "hf": "hf", "mds": "mds", "tfrecord": "tfrecord"}

__all__ = ["available_formats", "get_format", "detect_input", "ExportOptions", "ExportResult", "Locator",
           "Scan", "ScanOptions", "read_locator"]


def available_formats() -> list:
    """The interchange format names, sorted (``"folder"`` is the plain image folder, not listed)."""
    return sorted(_MODULES)


def get_format(name: str):
    """The ``FORMAT`` object of ``name``.

    Raises:
        UsageError: an unknown name (the message lists the known ones).
    """
    if name not in _MODULES:
        raise UsageError(f"unknown dataset format {name!r}; known: folder, {', '.join(available_formats())}")
    return importlib.import_module(f"{__name__}.{_MODULES[name]}").FORMAT


def detect_input(path) -> Optional[str]:
    """The interchange format ``path`` holds, or None (a plain image folder, or nothing known)."""
    for name in available_formats():
        try:
            fmt = get_format(name)
        except ImportError:
            continue
        if fmt.detect(path):
            return name
    return None
