"""What a command may write over: the one check every writing entry point makes first.

Every library entry point that writes (``build``, the Dask build, ``convert``, ``export``,
``merge``, ``append``, the HTML report, ``repair``'s backup) calls :func:`check_output` before
it touches anything, so library users get the same protection as the CLI:

* An output that **is**, **lies inside** or **contains** one of the command's inputs (IMAGES,
  LABELS, a source store or its shards, ``--source`` of repair) is always refused, overwrite or
  not: paths are compared after :func:`os.path.realpath` (symbolic links, ``..``) and, where they
  exist, by inode (:func:`os.path.samefile`: bind mounts, case-insensitive file systems).
  Server locations (``mongodb://``) are not paths and are not compared.
* ``overwrite`` replaces only a packer store of any registered format, recognised by the
  backend (:meth:`packer.stores.base.Store.is_store`: its metadata or its layout, so a damaged
  store can still be rebuilt), or an empty folder. Anything else (a folder of the user's files,
  a text file, another program's LMDB or HDF5 file) is refused, naming it and saying what it is.
* The staging area ``<out>.partial`` that a build resumes from (or discards with
  ``--no-resume``) must be a packer partial build too, when there is one.

All refusals are :class:`~packer.core.errors.UsageError` (CLI exit code 2).

Example:
    >>> check_output("train.lmdb", inputs=[("images", "data/images")])     # doctest: +SKIP
    >>> check_output("data", inputs=[("images", "data/images")])            # doctest: +SKIP
    Traceback (most recent call last):
    packer.core.errors.UsageError: data: the output contains the input images (data/images); ...
"""
from __future__ import annotations

import logging
import os
from typing import Iterable, Optional

from packer.core.errors import PackerError, UsageError
from packer.stores import available_formats, get_store, output_format
from packer.stores.base import partial_location

log = logging.getLogger(__name__)

#: What ``kind`` of output a command writes (see :func:`check_output`).
KINDS = ("store", "folder", "report", "place")

#: The start of every HTML report packer writes (packer/report/html.py), how a previous one is
#: recognised so ``packer report`` may replace it.
_REPORT_MARK = b"<title>packer report: "
_COUNT_CAP = 100_000


def _is_url(location) -> bool:
    return "://" in str(location)


def _inputs(inputs) -> list[tuple[str, str]]:
    """``[(role, path)]`` from paths or ``(role, path)`` pairs; None and server URLs left out.
    A manifest among them brings its shards (they are read as much as the manifest is)."""
    out = []
    for item in inputs or ():
        role, loc = item if isinstance(item, tuple) else ("", item)
        if loc is None or _is_url(loc):
            continue
        loc = os.fspath(loc)
        out.append((role, loc))
        out.extend(("shard", shard) for shard in _manifest_shards(loc))
    return out


def _manifest_shards(location: str) -> list[str]:
    """The shard paths a manifest file lists; [] for anything else or an unreadable manifest
    (whose shards the command will not read either)."""
    from packer.stores.manifest import read_manifest, resolve_location

    if not (os.path.isfile(location) and get_store("manifest").claims(location)):
        return []
    try:
        _, shards = read_manifest(location)
    except (PackerError, OSError, ValueError) as exc:
        log.debug("%s: shards not listed (%s)", location, exc)
        return []
    return [resolve_location(location, s["location"]) for s in shards
            if isinstance(s, dict) and isinstance(s.get("location"), str) and not _is_url(s["location"])]


def _under(path: str, folder: str) -> bool:
    """``path`` lies strictly inside ``folder`` (both real, absolute paths)."""
    return path != folder and os.path.commonpath([path, folder]) == folder


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:    # one of them missing or unreadable: realpath decided already
        return False


def _ancestors(path: str):
    """``path`` and every folder above it, innermost first."""
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _relation(out, inp) -> Optional[str]:
    """How the path ``out`` relates to the path ``inp``: ``"is"``, ``"lies inside"``,
    ``"contains"`` or None (neither). Symbolic links and ``..`` are resolved; existing paths are
    also compared by inode, so a bind mount or another spelling of the same folder is caught."""
    ro, ri = os.path.realpath(out), os.path.realpath(inp)
    if ro == ri or _same(ro, ri):
        return "is"
    if _under(ro, ri) or any(_same(a, ri) for a in _ancestors(os.path.dirname(ro))):
        return "lies inside"
    if _under(ri, ro) or any(_same(a, ro) for a in _ancestors(os.path.dirname(ri))):
        return "contains"
    return None


def _describe(path) -> str:
    """What is at ``path``, for a message: ``a folder of 12 files (a.jpg, b.jpg, ...)``."""
    path = os.fspath(path)
    if os.path.islink(path):
        target = os.readlink(path)
        if not os.path.exists(path):
            return f"a broken symbolic link (to {target})"
        return f"a symbolic link to {target}, {_describe(os.path.realpath(path))}"
    if os.path.isdir(path):
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            return f"a folder that cannot be listed ({exc.strerror})"
        if not names:
            return "an empty folder"
        files = 0
        for _, _, fnames in os.walk(path):
            files += len(fnames)
            if files >= _COUNT_CAP:
                break
        count = f"more than {_COUNT_CAP:,}" if files >= _COUNT_CAP else f"{files:,}"
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        return f"a folder of {count} file{'s' if files != 1 else ''} ({shown})"
    if os.path.isfile(path):
        size = os.path.getsize(path)
        return f"a file of {size:,} byte{'s' if size != 1 else ''}"
    return "a special file (device, socket or pipe)"


def _is_empty(path: str) -> bool:
    if os.path.islink(path):
        return False
    if os.path.isdir(path):
        return not os.listdir(path)
    return os.path.isfile(path) and os.path.getsize(path) == 0


def _store_format_at(location, **connection) -> Optional[str]:
    """The name of the format whose store (complete, damaged, or a staging area) is at the
    path ``location`` by its backend's :meth:`~packer.stores.base.Store.is_store`, else None."""
    for name in available_formats():
        cls = get_store(name)
        if cls.schemes and not cls.suffixes:
            continue                      # server-only formats hold no paths
        if cls.is_store(str(location), **connection):
            return name
    return None


def _is_report(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return _REPORT_MARK in fh.read(4096)
    except OSError:
        return False


def check_output(out, *, inputs: Iterable = (), overwrite: bool = False, fmt: Optional[str] = None,
                 kind: str = "store", connection: Optional[dict] = None, staging: bool = True) -> None:
    """Refuse an output that would destroy or mix with anything but packer's own earlier output.

    Args:
        out: the output: a path, or a server URL (``mongodb://...``; only ``kind="store"``).
        inputs: what the command reads: paths, or ``(role, path)`` pairs naming them in
            messages (``("images", "data/imgs")``); None and server URLs are skipped.
        overwrite: (stores) the user asked to replace an existing store at ``out``.
        staging: also judge ``<out>.partial`` (a build checks it once it holds the output lock:
            before that, another build may be writing there).
        fmt: (stores) the format to be written; picks the backend for a server URL.
        kind: ``"store"`` (a store of any format, or its partial build, may be replaced when
            ``overwrite``), ``"folder"`` (export: a new or empty folder), ``"report"`` (an HTML
            file: new, empty, or a report packer wrote before) or ``"place"`` (only the input rule:
            a folder packer fills with shard stores of its own, a store repair rewrites).
        connection: (server stores) connection options, e.g. ``{"uri": ...}``.

    Raises:
        UsageError: naming ``out`` (or its ``.partial``) and saying what it is and why it is
            refused: it is, lies inside or contains an input; it exists and is not replaceable.

    Example:
        >>> check_output("out/train.lmdb", inputs=[("images", "data")], overwrite=True)   # doctest: +SKIP
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    connection = dict(connection or {})
    if _is_url(out):
        if kind == "store":
            _check_server_store(str(out), overwrite, fmt, connection)
        return
    out = os.fspath(out)
    for role, inp in _inputs(inputs):
        how = _relation(out, inp)
        if how is not None:
            what = f"the input {role} ({inp})" if role else f"the input {inp}"
            raise UsageError(f"{out}: the output {how} {what}; refusing to write there, with or without "
                             f"--overwrite (choose an output outside every input)")
    if kind == "place":
        return
    if kind == "folder":
        if os.path.lexists(out) and not (os.path.isdir(out) and not os.path.islink(out) and _is_empty(out)):
            raise UsageError(f"{out} is {_describe(out)}; export writes only into a new or empty folder and "
                             f"never replaces files (choose another folder)")
        return
    if kind == "report":
        if os.path.lexists(out) and not (os.path.isfile(out) and not os.path.islink(out)
                                         and (_is_empty(out) or _is_report(out))):
            raise UsageError(f"{out} is {_describe(out)}, not an HTML report packer wrote; refusing to "
                             f"replace it (choose another file)")
        return
    _check_path_store(out, overwrite, connection, staging)


def _check_path_store(out: str, overwrite: bool, connection: dict, staging: bool = True) -> None:
    """A store output at a path: what is there, and at its ``.partial``, must be packer's."""
    if os.path.lexists(out):
        found = _store_format_at(out, **connection)
        if not overwrite:
            if found is not None:
                raise UsageError(f"{out} already exists (hint: --overwrite replaces it)")
            if _is_empty(out):
                raise UsageError(f"{out} already exists ({_describe(out)}) (hint: --overwrite replaces it)")
            raise UsageError(f"{out} already exists and is {_describe(out)}, not a packer store; choose "
                             f"another output (--overwrite replaces only packer stores)")
        if found is None and not _is_empty(out):
            raise UsageError(f"{out} is {_describe(out)}, not a packer store; refusing to replace it "
                             f"(--overwrite replaces only packer stores: move it away or choose another output)")
    part = partial_location(out)
    if staging and os.path.lexists(part) and not _is_empty(part) and _store_format_at(part, **connection) is None:
        raise UsageError(f"{part} is {_describe(part)}, not a packer partial build; a build of {out} "
                         f"stages there (resumes or discards it): refusing to touch it (move it away or "
                         f"choose another output)")


def _check_server_store(out: str, overwrite: bool, fmt: Optional[str], connection: dict) -> None:
    cls = get_store(output_format(out, fmt))
    if not cls.exists(out, **connection):
        return
    if not overwrite:
        raise UsageError(f"{_redact(out)} already exists (hint: --overwrite replaces it)")
    if not cls.is_store(out, **connection):
        raise UsageError(f"{_redact(out)} holds data that is not a packer store; refusing to replace it "
                         f"(--overwrite replaces only packer stores: choose another location)")


def _redact(location: str) -> str:
    from packer.stores.mongo import redact
    return redact(location)


__all__ = ["check_output"]
