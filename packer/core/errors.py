"""The PackerError family.

Every error names what it is about (file, store, key) and what was wrong, so that a
message alone is enough to find the problem. The CLI maps these to exit codes:
``UsageError`` -> 2, everything else -> 1.
"""
from __future__ import annotations

import ast
import re

from packer.core.uri import redact


def _rebuild(cls, args):
    """Unpickle a packer error without calling its ``__init__`` (see :meth:`PackerError.__reduce__`)."""
    exc = cls.__new__(cls)
    exc.args = tuple(args)
    return exc


class PackerError(Exception):
    """Base class of every error packer raises on purpose.

    Its text arguments have any connection-string password masked (:func:`packer.core.uri.redact`),
    so no message, ``repr()`` or pickle of a packer error carries one.

    Every subclass survives ``pickle`` with its message and fields, and can also be made from
    a message alone (``cls("...")``): PyTorch's DataLoader re-raises a worker's error as
    ``type(exc)(message)``, so a RecordError in a worker still arrives as a RecordError.
    """

    def __init__(self, *args):
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))

    def __reduce__(self):
        # Exception's own reduce calls ``type(self)(*self.args)``: a subclass whose __init__ takes
        # other arguments than its message (RecordError(store, key, reason)) would not unpickle,
        # and a worker's error would reach the parent as another one. Rebuild without __init__:
        # the message (args) and every field (__dict__) as they were.
        return _rebuild, (type(self), self.args), (self.__dict__ or None)


class UsageError(PackerError):
    """The user asked for something that cannot work (bad option, existing output, ...)."""


class DependencyError(PackerError):
    """An optional dependency or system library is missing; the message says what to install."""


class SourceError(PackerError):
    """Input folders or label files are inconsistent (unlabeled image, orphan label, bad line).

    ``problems`` holds one human-readable line per problem, each naming the file (and line).
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class ImageError(PackerError):
    """One input image is damaged or unsupported. ``path`` names it, ``reason`` says why."""

    def __init__(self, path: str, reason: str | None = None):
        if reason is None:   # a message alone (see PackerError): the path is not known apart
            super().__init__(path)
            self.path, self.reason = None, path
            return
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StoreError(PackerError):
    """A store cannot be opened, written or published."""


class WriteError(StoreError):
    """An output cannot be written: a read-only file system, no permission, an I/O error, a
    file where a folder must be (made by :func:`packer.core.writes.write_error`).

    ``location`` names the output, ``path`` the file the system refused (None when not known),
    ``errno`` the error number (None when not known).
    """

    def __init__(self, message: str, *, location: str | None = None, path: str | None = None,
                 errno: int | None = None):
        super().__init__(message)
        self.location = location
        self.path = path
        self.errno = errno


#: ``<store>: key '<key>' (index <i>): <reason>``, the message of a RecordError (key as repr).
_RECORD_MESSAGE = re.compile(r"(?P<store>.+?): key (?P<key>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
                             r"(?: \(index (?P<index>-?\d+)\))?: (?P<reason>.*)")


class RecordError(StoreError):
    """One record in a store is damaged: names the store, the key and the reason.

    ``RecordError(message)`` (one argument, as PyTorch's DataLoader re-raises a worker's error)
    takes the fields from the last line of ``message`` written as this class writes its own.
    """

    def __init__(self, store: str, key: str | None = None, reason: str | None = None, index: int | None = None):
        if key is None and reason is None:
            super().__init__(store)
            self.store, self.key, self.index, self.reason = _record_fields(self.args[0])
            return
        where = f"key {key!r}" if index is None else f"key {key!r} (index {index})"
        super().__init__(f"{store}: {where}: {reason}")
        self.store = redact(store)
        self.key = key
        self.index = index
        self.reason = reason


def _record_fields(message: str) -> tuple:
    """(store, key, index, reason) from a RecordError's message, or from a traceback whose last
    ``RecordError: ...`` line is one (a DataLoader worker's); (None, None, None, message) else."""
    found = re.findall(r"(?:^|\n)(?:[\w.]+\.)?RecordError: ([^\n]*)", message)
    m = _RECORD_MESSAGE.fullmatch(found[-1] if found else message)
    try:
        key = ast.literal_eval(m.group("key")) if m else None
    except (ValueError, SyntaxError):   # not a key as repr() writes it
        m = None
    if m is None:
        return None, None, None, message
    index = m.group("index")
    return m.group("store"), key, None if index is None else int(index), m.group("reason")


class UnreachableError(StoreError):
    """The server holding a store cannot be reached (refused, timed out, no server selected).

    Nothing was read, so nothing is known about the store: verify raises this rather than
    report the store as damaged, and repair never acts on it.
    """


class ResumeMismatchError(UsageError):
    """A partial build exists but was started with other inputs or options."""


class WorkerError(PackerError):
    """A build worker process died (killed, out of memory, crashed); names its pid and signal."""


class LockedError(StoreError):
    """Another process is writing the same output. ``holder`` says who (host, pid, since...)."""

    def __init__(self, message: str, holder: dict | None = None):
        super().__init__(message)
        self.holder = dict(holder or {})


class DiskFullError(StoreError):
    """The output's file system has no room for what is to be written.

    ``location`` names the output, ``needed`` and ``free`` are byte counts (None when not
    known), ``staging`` the staging area kept for a resume, ``what`` what needed the room,
    ``detail`` the library's own words (None when the room was checked before writing). Made by
    :func:`packer.core.diskspace.disk_full`, which writes the message.
    """

    def __init__(self, message: str, *, location: str | None = None, needed: int | None = None,
                 free: int | None = None, staging: str | None = None, what: str | None = None,
                 detail: str | None = None):
        super().__init__(message)
        self.location = location
        self.needed = needed
        self.free = free
        self.staging = staging
        self.what = what
        self.detail = detail
