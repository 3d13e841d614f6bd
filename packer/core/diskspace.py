"""Free disk space: checked before writing, and a full disk reported as one clear error.

A full file system must end a write with a :class:`~packer.core.errors.DiskFullError` naming the
output, saying how much more room is needed, and keeping the staging area for a resume, never
with a library's traceback or a crash (HDF5 segfaults when it flushes after a failed write).
So writers check the room for each batch before writing it (:func:`require_room`), a build
checks its inputs' total before it starts, and an ``OSError`` / ``lmdb.Error`` that still says
the disk is full is turned into the same error (:func:`is_disk_full`, :func:`disk_full`).

The estimates can be wrong (a file system that compresses, quotas that ``statvfs`` does not
see): ``PACKER_NO_SPACE_CHECK=1`` skips them, and the writes then fail on the real limit with
the same error.

Example:
    >>> require_room("train.lmdb", 50 << 20, what="the build")    # doctest: +SKIP
    DiskFullError: train.lmdb: disk full: about 30.2 MiB more space needed ...
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from typing import Iterable, Optional

from packer.core.errors import DiskFullError

log = logging.getLogger(__name__)

#: Set to 1 to skip every free-space estimate (writes then fail on the real limit).
SKIP_ENV = "PACKER_NO_SPACE_CHECK"

#: errno values that mean "no room": no space, quota exceeded.
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
#: What libraries write for them (h5py/HDF5 and LMDB put the errno in the message only).
_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "errno = 28", "errno = 122")


def skipped() -> bool:
    """True when ``$PACKER_NO_SPACE_CHECK`` asks to skip the estimates."""
    return os.environ.get(SKIP_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _existing_dir(location: str) -> Optional[str]:
    """The nearest existing folder at or above ``location`` (None for a server URL)."""
    if "://" in str(location):
        return None
    path = os.path.abspath(str(location))
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return path


def free_bytes(location: str) -> Optional[int]:
    """Bytes free to this user on the file system that holds (or will hold) ``location``;
    None for a server URL or when it cannot be told."""
    where = _existing_dir(location)
    if where is None:
        return None
    try:
        return shutil.disk_usage(where).free
    except OSError as exc:
        log.debug("%s: free space unknown: %s", where, exc)
        return None


def input_bytes(paths: Iterable) -> int:
    """Total size of the files at ``paths`` (a missing one counts 0: the build reports it; a path
    with an ``nbytes`` attribute, an object in a bucket, counts that)."""
    total = 0
    for path in paths:
        known = getattr(path, "nbytes", None)   # an object in a bucket, listed with its size
        if known is not None:
            total += known
            continue
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


def mib(n: int) -> str:
    """``12345678`` -> ``"11.8 MiB"``."""
    return f"{n / (1 << 20):.1f} MiB"


def human_bytes(n) -> str:
    """``1536`` -> ``"1.5 KiB"``, ``512`` -> ``"512 B"`` (sizes in ``info`` and the reports: one decimal)."""
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def size_text(n: int) -> str:
    """``16777216`` -> ``"16 MiB"``, ``73728`` -> ``"72 KiB"`` (sizes and limits in messages)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v.is_integer() else f"{v:.1f} {unit}"
    return f"{n} bytes"


def disk_full(location: str, *, needed: Optional[int] = None, free: Optional[int] = None,
              staging: Optional[str] = None, what: str = "the write", cause=None,
              detail: Optional[str] = None, note: Optional[str] = None) -> DiskFullError:
    """The DiskFullError for ``location``: one line naming it, how much more room is needed
    (when ``needed`` is known), what is kept for a resume and how to go on.

    Args:
        needed: bytes the write is estimated to need (None: unknown).
        free: bytes free now (default: measured).
        staging: the staging area kept for a resume (named in the message).
        what: what needs the room, for the message ("the build", "a batch of 12 records").
        cause: the library error that said the disk is full (its first line is quoted).
        detail: that first line, when there is no ``cause`` object at hand.
        note: what is left behind and how to go on, when there is no ``staging`` to resume from.
    """
    location = str(location)
    free = free_bytes(location) if free is None else free
    detail = _first_line(cause) if cause is not None else detail
    if needed is not None and free is not None and needed > free:
        amount = (f"about {mib(max(needed - free, 1 << 20))} more space needed ({what} needs about "
                  f"{mib(needed)}, {mib(free)} free)")
    elif free is not None:
        amount = f"{mib(free)} free, not enough for {what}"
    else:
        amount = "free space unknown"
    said = f" ({detail})" if detail else ""
    keep = f"; {staging} is kept, a rerun resumes from it" if staging else (f"; {note}" if note else "")
    hint = "free space and rerun" + ("" if detail else f", or set {SKIP_ENV}=1 if this estimate is wrong")
    return DiskFullError(f"{location}: disk full{said}: {amount}{keep} (hint: {hint})", location=location,
                         needed=needed, free=free, staging=staging, what=what, detail=detail)


def more_needed(exc: DiskFullError, more: int, what: str) -> DiskFullError:
    """``exc`` with ``more`` bytes added to what is needed (the rest of a build, beyond the batch
    that did not fit); ``what`` now needs it."""
    if exc.needed is None or more <= 0:
        more, what = 0, exc.what or what
    return disk_full(exc.location, needed=None if exc.needed is None else exc.needed + more, free=exc.free,
                     staging=exc.staging, what=what, detail=exc.detail)


def build_bytes(paths: list) -> int:
    """About how many bytes a store of the images at ``paths`` takes: their sizes, plus 2 KiB a
    record for fields and page rounding, plus 1 MiB."""
    return input_bytes(paths) + 2048 * len(paths) + (1 << 20)


@contextlib.contextmanager
def full_disk_as_error(location: str, *, needed: Optional[int] = None, what: str = "the write",
                       note: Optional[str] = None):
    """``with``: an OSError that says the disk is full (ENOSPC, EDQUOT) leaves as DiskFullError
    naming ``location`` (see :func:`disk_full`); other errors pass unchanged.

    Example:
        >>> with full_disk_as_error("out/", needed=store_size, what="the export"):   # doctest: +SKIP
        ...     write_files()
    """
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise disk_full(location, needed=needed, what=what, cause=exc, note=note) from exc


def require_room(location: str, needed, *, staging: Optional[str] = None, what: str = "the write") -> None:
    """Raise DiskFullError when the file system of ``location`` has less than ``needed`` bytes
    free (nothing for a server URL, or with ``$PACKER_NO_SPACE_CHECK`` set).

    Args:
        needed: bytes, or a function returning them (called only when there is a disk to check:
            a build's estimate stats every input).

    Raises:
        DiskFullError: naming ``location``, the shortfall and ``staging``.
    """
    if skipped():
        return
    free = free_bytes(location)
    if free is None:
        return
    needed = needed() if callable(needed) else needed
    if free < needed:
        raise disk_full(location, needed=needed, free=free, staging=staging, what=what)


def is_disk_full(exc: BaseException, location: Optional[str] = None, needed: int = 0) -> bool:
    """True when ``exc`` (an OSError, h5py's RuntimeError, an lmdb.Error) says the disk is full.

    LMDB reports a short write as EIO ("Input/output error"): that counts as full when the file
    system of ``location`` has less than ``needed`` bytes free now.
    """
    if getattr(exc, "errno", None) in _FULL_ERRNOS:
        return True
    text = str(exc).lower()
    if any(t in text for t in _FULL_TEXTS):
        return True
    if location is not None and ("input/output error" in text or getattr(exc, "errno", None) == errno.EIO):
        free = free_bytes(location)
        return free is not None and free < max(needed, 1 << 20)
    return False


def _first_line(exc) -> str:
    """A library error's own words, short: the errno's text where there is one ("No space left
    on device"), not h5py's multi-line "file write failed: time = ..." details."""
    code = getattr(exc, "errno", None)
    if code:
        return os.strerror(code)
    text = str(exc)
    m = re.search(r"error message = '([^']*)'", text)   # HDF5's report of the failed write
    if m:
        return m.group(1)
    lines = text.strip().splitlines()
    return lines[0].split(" (file write failed", 1)[0][:200] if lines else type(exc).__name__
