"""An output that cannot be written, said in one line: the one translation of ``OSError``.

Every command that writes (build, convert, export, merge, append, repair, the HTML report)
goes through :func:`writes_to` (or :func:`writing`), so a read-only file system (EROFS), a
folder without permission (EACCES, EPERM), an I/O error (EIO), a file where a folder must be
(ENOTDIR) or a full disk (ENOSPC, EDQUOT: :class:`~packer.core.errors.DiskFullError`) ends in a
:class:`~packer.core.errors.WriteError` naming the output, the file the system refused, its
words and a hint, never in a library traceback. The CLI gives the same line for any ``OSError``
that still reaches it (:func:`os_error_message`).

Only errors about the output are translated: an ``OSError`` naming another file (an input that
cannot be read) passes unchanged, for the command's own handling of inputs.

Example:
    >>> with writing("out/train.lmdb", what="the build"):      # doctest: +SKIP
    ...     os.mkdir("out/train.lmdb")
    WriteError: out/train.lmdb: cannot write: Read-only file system (hint: ...)
"""
from __future__ import annotations

import contextlib
import errno as errnos
import functools
import inspect
import os
import re
from typing import Optional

from packer.core.diskspace import disk_full, is_disk_full
from packer.core.errors import PackerError, WriteError

#: errno values only a write produces: always about the output.
_WRITE_ONLY = {errnos.EROFS, errnos.ENOSPC, errnos.EDQUOT}

#: What to do about each, for the message's hint.
_HINTS = {
    errnos.EROFS: "the file system is mounted read-only: choose an output on a writable one",
    errnos.EACCES: "no permission to write there: check the folder's owner and mode, or choose another output",
    errnos.EPERM: "the operation is not permitted there: check the folder's owner and mode, or choose "
                  "another output",
    errnos.EIO: "the disk or network file system reported an I/O error: check it (dmesg, the mount) and rerun",
    errnos.ENOTDIR: "a part of the path is not a folder: choose another output",
    errnos.EISDIR: "a folder is where a file must go: choose another output",
    errnos.ENAMETOOLONG: "the name is too long for the file system: choose a shorter output",
}


def _facts(exc: BaseException) -> tuple[Optional[int], Optional[str], str]:
    """``(errno, file name, the system's words)`` of an OSError, also of h5py's (which puts
    ``name = '...', errno = 30, error message = '...'`` in its text only)."""
    code, name = getattr(exc, "errno", None), getattr(exc, "filename", None)
    words = getattr(exc, "strerror", None)
    text = str(exc)
    if code is None:
        m = re.search(r"errno = (\d+)", text)
        code = int(m.group(1)) if m else None
    if name is None:
        m = re.search(r"name = '([^']*)'", text)
        name = m.group(1) if m else None
    if not words:
        m = re.search(r"error message = '([^']*)'", text)
        words = m.group(1) if m else (os.strerror(code) if code else (text.strip().splitlines() or [""])[0])
    return code, (os.fsdecode(name) if name is not None else None), words


def _related(path: str, location: str) -> bool:
    """``path`` is the output, inside it, a folder above it, or beside it named after it, or
    inside such a neighbour (its ``.partial``, ``.lock``, a temporary ``.<name>.tmp-*``)."""
    if "://" in location:
        return False
    p, out = os.path.abspath(path), os.path.abspath(location.rstrip("/") or location)
    if p == out or p.startswith(out + os.sep) or out.startswith(p.rstrip(os.sep) + os.sep):
        return True
    parent, name = os.path.dirname(out), os.path.basename(out)
    while os.path.dirname(p) != p and len(p) > len(parent):
        if os.path.dirname(p) == parent and name in os.path.basename(p):
            return True
        p = os.path.dirname(p)
    return False


def _file_above(location: str) -> Optional[str]:
    """The nearest path above ``location`` that exists and is not a folder (None if none)."""
    if "://" in location:
        return None
    path = os.path.abspath(location)
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
        if os.path.lexists(path):
            return None if os.path.isdir(path) else path


def is_about_output(exc: BaseException, location) -> bool:
    """True when the OSError ``exc`` is about writing ``location``: an errno only writes give,
    a system error naming no file (a write to an open file), or a file name that is the output
    or one of its own files (see :func:`_related`). A library's OSError with neither errno nor
    file name (h5py's "file signature not found" about a source) is not."""
    code, name, _ = _facts(exc)
    if name is None:
        return code is not None
    return code in _WRITE_ONLY or _related(name, str(location))


def write_error(exc: BaseException, location, what: str = "the write") -> PackerError:
    """The one-line error for an OSError met while writing ``location``: a DiskFullError for a
    full disk, else a WriteError naming the output, the file refused (where it is another),
    the system's words and a hint.

    Args:
        exc: the OSError (or h5py's OSError, whose facts are in its text).
        location: the output the command writes (a path or a URL).
        what: what was being written, for a full disk's message ("the export").
    """
    location = str(location)
    if is_disk_full(exc):
        return disk_full(location, cause=exc, what=what)
    code, name, words = _facts(exc)
    blocker = _file_above(location) if code in (errnos.ENOTDIR, errnos.EEXIST) else None
    if blocker is not None:   # makedirs says EEXIST, open ENOTDIR: the same mistake
        return WriteError(f"{location}: cannot write: {blocker} is a file, not a folder (hint: choose an "
                          f"output whose folders are folders)", location=location, path=blocker,
                          errno=errnos.ENOTDIR)
    where = "" if name is None or os.path.abspath(name) == os.path.abspath(location) else f" {name}"
    hint = _HINTS.get(code)
    tail = f" (hint: {hint})" if hint else ""
    return WriteError(f"{location}: cannot write{where}: {words}{tail}", location=location, path=name, errno=code)


def os_error_message(exc: BaseException, location=None) -> str:
    """One line for any OSError (the CLI's last word on one): :func:`write_error`'s when it is
    about ``location``, else ``<file>: <the system's words>``."""
    if location is not None and is_about_output(exc, location):
        return str(write_error(exc, location))
    code, name, words = _facts(exc)
    return f"{name}: {words}" if name else words


@contextlib.contextmanager
def writing(location, what: str = "the write"):
    """``with``: an OSError about writing ``location`` leaves as :func:`write_error`'s error;
    any other passes unchanged."""
    try:
        yield
    except OSError as exc:
        if not is_about_output(exc, location):
            raise
        raise write_error(exc, location, what) from exc


def writes_to(argument: str, what: str = "the write"):
    """Decorator of a function that writes the output named by its parameter ``argument``:
    its OSErrors about that output leave as :func:`write_error`'s error (see :func:`writing`).

    Example:
        >>> @writes_to("out", what="the export")                 # doctest: +SKIP
        ... def export(location, out, **options): ...
    """
    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            location = signature.bind_partial(*args, **kwargs).arguments.get(argument)
            if location is None:
                return fn(*args, **kwargs)
            with writing(os.fspath(location) if not isinstance(location, str) else location, what):
                return fn(*args, **kwargs)
        return wrapper
    return decorate


__all__ = ["WriteError", "write_error", "writing", "writes_to", "is_about_output", "os_error_message"]
