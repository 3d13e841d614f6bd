"""Store registry: every backend registers itself here; ``--format`` choices come from it.

Adding a backend is one new module (or subpackage, like ``hdf5/``, ``lmdb/`` and ``mongo/``) in
this package that calls :func:`register_store` on its ``Store`` subclass, and one entry in
:data:`BACKENDS`, the list of modules imported on first use of the registry. The other modules
here (``base``, ``staging``, ``sampling``, ``iterate``, ``outputs``, ``cache``) are machinery the
backends and jobs share, not backends.
"""
from __future__ import annotations

import importlib
import logging
import os
import re

from packer.core.errors import StoreError, UsageError
from packer.core.uri import redact
from packer.stores.base import ResumeState, Store, StoreReader, StoreWriter, partial_location

log = logging.getLogger(__name__)

#: The backend modules of this package, imported (in this order) on first use of the registry.
BACKENDS = ("lmdb", "hdf5", "mongo", "manifest")

_REGISTRY: dict[str, type[Store]] = {}
_loaded = False


def register_store(cls: type[Store]) -> type[Store]:
    """Class decorator: make ``cls`` available as ``--format cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def _load_backends() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # Backends import their optional dependencies lazily, so importing one never fails for a
    # missing package.
    for mod in BACKENDS:
        importlib.import_module(f"{__name__}.{mod}")


def available_formats() -> list[str]:
    """Names of the registered store formats, sorted."""
    _load_backends()
    return sorted(_REGISTRY)


def get_store(name: str) -> type[Store]:
    """The Store class registered as ``name``; UsageError listing the choices if none."""
    _load_backends()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown store format {name!r}; choose from {', '.join(available_formats())}") from None


#: Format of a path output whose suffix no store claims (``-o train``).
DEFAULT_FORMAT = "lmdb"

#: A suffix that looks like a file type (``.hd5``, ``.data``), not a version or a date (``.2024``).
_FILE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9_-]*")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# "user:password@host[:port]/..." or "user:password@host[:port]" without a scheme: a server URL,
# not a path to create (a folder named after it would hold the password; "./NAME" is a path).
_BARE_URL = re.compile(r"^[^\s/:@]+:(?!//)[^\s]*@(?:[^\s/@]+/|(?:\[[0-9A-Fa-f:.]*\]|[A-Za-z0-9_.%\-]+)(?::\d*)?$)")


def output_format(location: str, format: str | None = None, default: str = DEFAULT_FORMAT) -> str:
    """The format to write ``location`` in: ``format`` if given, else inferred from the output.

    Each Store class declares the ``suffixes`` and URL ``schemes`` it claims, so a new backend
    needs no edit here: ``x.h5`` -> ``hdf5``, ``x.lmdb`` -> ``lmdb``, ``mongodb://...`` ->
    ``mongo``; a path without a suffix (``out/train``) gets ``default`` (:data:`DEFAULT_FORMAT`;
    ``merge --copy`` passes its first input's). A suffix no store claims (``train.hd5``,
    ``x.data``) is refused unless ``format`` says what to write: a typo must not silently
    become an LMDB folder.

    Raises:
        UsageError: a URL scheme no store writes to (``s3://``, ``http://``), an unknown
            ``format``, a ``format`` that contradicts the output's suffix or scheme, or an
            unknown suffix without ``format``.

    Example:
        >>> output_format("train.h5"), output_format("out/train")
        ('hdf5', 'lmdb')
    """
    _load_backends()
    location = str(location)
    if format is not None:
        get_store(format)  # UsageError listing the choices
    if _BARE_URL.match(location):
        raise UsageError(f"{redact(location)}: looks like a server URL without its scheme, not a path "
                         f"(did you mean mongodb://{redact(location)} ?)")
    m = _SCHEME.match(location)
    if m:
        scheme = m.group(0).lower()
        owners = sorted(n for n, c in _REGISTRY.items() if scheme in c.schemes)
        if not owners:
            writable = sorted(s for c in _REGISTRY.values() for s in c.schemes)
            raise UsageError(f"{redact(location)}: no store format writes to {m.group(1)}:// outputs "
                             f"(outputs are local paths{', or ' + ', '.join(writable) if writable else ''})")
        if format is not None and format not in owners:
            raise UsageError(f"{redact(location)}: --format {format} contradicts the output, a {scheme} URL "
                             f"(that is --format {owners[0]})")
        return format or owners[0]
    if format is not None and _REGISTRY[format].schemes and not _REGISTRY[format].suffixes:
        raise UsageError(f"{location}: --format {format} needs an output URL starting with "
                         f"{' or '.join(_REGISTRY[format].schemes)}")
    name = location.rstrip("/").lower()
    suffix = os.path.splitext(name)[1]
    # the longest suffix a store claims that ends the name (".packer-manifest.json" over ".json")
    claimed = sorted(((x, n) for n, c in _REGISTRY.items() for x in c.suffixes if name.endswith(x)),
                     key=lambda t: -len(t[0]))
    owners = sorted(n for x, n in claimed if x == claimed[0][0]) if claimed else []
    suffix = claimed[0][0] if claimed else suffix
    if format is not None:
        if owners and format not in owners:
            raise UsageError(f"{location}: --format {format} contradicts the output's suffix {suffix} "
                             f"(that is --format {owners[0]}); rename the output or drop --format")
        return format
    if owners:
        return owners[0]
    if _FILE_SUFFIX.fullmatch(suffix):
        known = sorted({x for c in _REGISTRY.values() for x in c.suffixes}) + sorted(
            {x for c in _REGISTRY.values() for x in c.schemes})
        raise UsageError(f"{location}: no store format has the suffix {suffix} (known: {', '.join(known)}); "
                         f"rename the output, or say the format with --format "
                         f"({'|'.join(n for n, c in sorted(_REGISTRY.items()) if c.suffixes or not c.schemes)})")
    return default


def detect_format(location: str) -> str:
    """Name of the format whose store is at ``location`` (StoreError when none claims it)."""
    _load_backends()
    for name, cls in sorted(_REGISTRY.items()):
        if cls.claims(location):
            return name
    shown = redact(location)
    if os.path.exists(partial_location(location)):
        raise StoreError(f"{shown}: not published yet: a build is in progress, was interrupted, or "
                         f"found damaged inputs (see {shown}.report.json; rerun the build to resume)")
    raise StoreError(f"{shown}: not a packer store (no format recognises it; "
                     f"known formats: {', '.join(available_formats())})")


def is_server_location(location) -> bool:
    """Whether ``location`` names a store on a server (a URL of a ``server_backed`` format's
    scheme, such as ``mongodb://``), not a path or a bucket."""
    _load_backends()
    low = str(location).lower()
    return any(c.server_backed and low.startswith(tuple(x.lower() for x in c.schemes)) for c in _REGISTRY.values())


def open_store(location: str, format: str | None = None, **options) -> StoreReader:
    """Open the published store at ``location`` for reading (format detected when not given).

    Example:
        >>> with open_store("train.lmdb") as store:        # doctest: +SKIP
        ...     rec = store.get(0); print(rec.key, rec.label)
    """
    cls = get_store(format) if format else get_store(detect_format(location))
    return cls.open_reader(location, **options)


__all__ = ["Store", "StoreReader", "StoreWriter", "ResumeState", "register_store", "is_server_location",
           "available_formats", "get_store", "detect_format", "output_format", "open_store",
           "DEFAULT_FORMAT", "BACKENDS"]
