"""The PackerError family.

Every error names what it is about (file, store, key) and what was wrong, so that a
message alone is enough to find the problem. The CLI maps these to exit codes:
``UsageError`` -> 2, everything else -> 1.
"""
from __future__ import annotations


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


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

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StoreError(PackerError):
    """A store cannot be opened, written or published."""


class RecordError(StoreError):
    """One record in a store is damaged: names the store, the key and the reason."""

    def __init__(self, store: str, key: str, reason: str, index: int | None = None):
        where = f"key {key!r}" if index is None else f"key {key!r} (index {index})"
        super().__init__(f"{store}: {where}: {reason}")
        self.store = store
        self.key = key
        self.index = index
        self.reason = reason


class ResumeMismatchError(UsageError):
    """A partial build exists but was started with other inputs or options."""


class WorkerError(PackerError):
    """A build worker process died (killed, out of memory, crashed); names its pid and signal."""


class LockedError(StoreError):
    """Another process is writing the same output. ``holder`` says who (host, pid, since...)."""

    def __init__(self, message: str, holder: dict | None = None):
        super().__init__(message)
        self.holder = dict(holder or {})
