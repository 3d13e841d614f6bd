"""One writer per output: an exclusive lock that every command writing a store takes.

Two builds (or a build and a repair/convert/append) of the same output at once would interleave
their writes into one staging area and publish a corrupt store. Each writer therefore holds
:func:`output_lock` for as long as it touches the output (staging area and destination)::

    from packer.core.locking import output_lock
    with output_lock("train.lmdb", LMDBStore, purpose="build"):
        ...  # write <out>.partial, publish onto <out>

A second writer is refused at once with :class:`~packer.core.errors.LockedError` naming the holder:
host, pid, what it is doing and since when.

Path stores (LMDB, HDF5, anything on a file system) lock ``<out>.lock`` with ``flock(2)``: the
kernel drops the lock when its process dies, however it dies, so a killed build's lock is taken
over by the next run without any staleness guesswork (the file's content, who held it, is only
used for messages). Server stores provide their own lock through ``Store.lock_output`` (MongoDB:
a lock document with a heartbeat, :class:`DocumentLock`); a backend that defines none gets the
file lock.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Iterator, Optional

from packer.core.errors import LockedError, StoreError
from packer.core.records import loads_bounded
from packer.core.uri import redact
from packer.core.writes import write_error

log = logging.getLogger(__name__)


def holder_info(purpose: str) -> dict:
    """Who is taking a lock: host, pid, purpose, start time (UTC) and command line (its passwords
    masked: the record is written into the lock file, and shown to a refused writer)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "purpose": purpose,
            "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": redact(" ".join(sys.argv))[:500]}


def describe_holder(info: Optional[dict]) -> str:
    """'build by pid 123 on host-a since 2026-01-01T00:00:00+00:00' (or what is known)."""
    if not info:
        return "unknown writer (it left no details)"
    parts = [f"{info.get('purpose', 'a writer')} by pid {info.get('pid', '?')} on {info.get('host', '?')}"]
    if info.get("since"):
        parts.append(f"since {info['since']}")
    if info.get("command"):
        parts.append(f"(command: {info['command']})")
    return " ".join(parts)


def lock_path(location: str) -> str:
    """The lock file of a path store: ``<location>.lock`` next to it."""
    return str(location).rstrip("/") + ".lock"


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists on this host."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def file_lock(location: str, *, purpose: str = "build") -> Iterator[dict]:
    """Hold an exclusive ``flock`` on ``<location>.lock`` for the duration of the block.

    Yields:
        The holder record written into the lock file (host, pid, purpose, since, command).

    Raises:
        LockedError: another process holds it; the message names that process.
        StoreError: the lock file cannot be created (e.g. the folder is missing or read-only).
    """
    import fcntl

    path = lock_path(location)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)   # as writers do for the output itself
    except OSError as exc:
        raise write_error(exc, location, "the lock file") from exc   # one line: read-only, a file...
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_error(exc, location, "the lock file") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = _read_holder(fd, wait_s=_HOLDER_WAIT_S)
            finally:
                os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise StoreError(f"{location}: cannot lock {path}: {exc.strerror}") from exc
            raise LockedError(
                f"{location}: another {describe_holder(holder)} is writing this output (lock file "
                f"{path}); wait for it to finish, or stop it. (The lock is released automatically "
                f"when that process ends, even if it is killed.)", holder) from None
        # The file may have been unlinked by the previous holder between our open and flock:
        # then we hold a lock on an orphan inode and must retry on the current file.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        previous = _read_holder(fd)
        if previous and previous.get("pid") != os.getpid():
            log.info("%s: taking over the lock left by %s (that process has ended)", location,
                     describe_holder(previous))
        info = holder_info(purpose)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield info
    finally:
        # Unlink before unlocking, so a waiter never locks a file that is about to vanish
        # (it re-checks the inode, above).
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


class HeldLock:
    """What :func:`output_lock` yields: ``info`` (host, pid, purpose, since...) and ``check()``.

    Call ``check()`` right before an irreversible step (publishing): it raises LockedError if
    the lock was taken over meanwhile (possible only for heartbeat locks, after this process
    stalled longer than their ttl; a kernel ``flock`` cannot be lost).
    """

    def __init__(self, info: dict, check=None):
        self.info = info
        self._check = check

    def check(self) -> None:
        if self._check is not None:
            self._check()


#: How long a refused writer waits for the holder's record when the lock file is still empty: the
#: holder writes it right after taking the lock, so a writer refused in between would otherwise
#: name an "unknown writer".
_HOLDER_WAIT_S = 0.5


def _read_holder(fd: int, wait_s: float = 0.0) -> Optional[dict]:
    """The holder record in the lock file ``fd``, or None; an empty file is read again for up to
    ``wait_s`` seconds (the holder may be about to write it)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            raw = os.pread(fd, 4096, 0)
            if raw.strip():
                return loads_bounded(raw)
        except (OSError, ValueError):
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


class DocumentLock:
    """An exclusive lock held as one document in a MongoDB collection (``<C>.lock``).

    The document ``{_id: "output", host, pid, purpose, since, heartbeat, token}`` is inserted
    (``_id`` is unique: only one insert can win); while held, a daemon thread refreshes
    ``heartbeat`` every ``ttl / 4`` seconds. A lock is stale, and taken over with an atomic
    compare-and-replace on its token, when its holder's pid is gone on this same host, or its
    heartbeat is older than ``ttl`` seconds (a holder on another host that died, or a pid that
    was reused). Clocks of the hosts are assumed to agree within a fraction of ``ttl``.

    Args:
        collection: a pymongo Collection (e.g. ``db["train.lock"]``).
        name: the output, for messages.
        purpose: what the holder does (``"build"``, ``"repair"`` ...).
        ttl: seconds without heartbeat after which the lock is stale.
    """

    _ID = "output"

    def __init__(self, collection, name: str, *, purpose: str = "build", ttl: float = 60.0):
        self.coll = collection
        self.name = name
        self.purpose = purpose
        self.ttl = float(ttl)
        self.info: Optional[dict] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lost = False

    @staticmethod
    def _now() -> datetime.datetime:
        return datetime.datetime.now(datetime.timezone.utc)

    def _stale(self, doc: dict) -> Optional[str]:
        if doc.get("host") == socket.gethostname() and doc.get("pid") is not None:
            if not pid_alive(doc["pid"]):
                return f"pid {doc['pid']} is no longer running on this host"
        # Also on this host: a live pid with a stale heartbeat is a reused pid, not the holder.
        beat = doc.get("heartbeat")
        if isinstance(beat, datetime.datetime):
            if beat.tzinfo is None:
                beat = beat.replace(tzinfo=datetime.timezone.utc)   # BSON dates come back naive
            age = (self._now() - beat).total_seconds()
            if age > self.ttl:
                return f"its last heartbeat was {age:.0f}s ago (more than {self.ttl:.0f}s)"
        return None

    def acquire(self) -> dict:
        """Take the lock or raise LockedError naming the holder."""
        import uuid

        from pymongo.errors import DuplicateKeyError

        info = dict(holder_info(self.purpose), token=uuid.uuid4().hex)
        for _ in range(3):
            doc = dict(info, _id=self._ID, heartbeat=self._now())
            try:
                self.coll.insert_one(doc)
                break
            except DuplicateKeyError:
                held = self.coll.find_one({"_id": self._ID})
                if held is None:
                    continue  # released meanwhile: try again
                why = self._stale(held)
                if why is None:
                    raise LockedError(
                        f"{self.name}: another {describe_holder(held)} is writing this output "
                        f"(lock document in {self.coll.full_name}); wait for it to finish, or stop "
                        f"it (a lock whose holder stops sending heartbeats for {self.ttl:.0f}s is "
                        f"taken over)", {k: v for k, v in held.items() if k != "heartbeat"}) from None
                old = self.coll.find_one_and_replace({"_id": self._ID, "token": held.get("token")}, doc)
                if old is not None:
                    log.warning("%s: taking over a stale lock of %s: %s", self.name, describe_holder(held), why)
                    break
        else:
            raise LockedError(f"{self.name}: could not take the lock in {self.coll.full_name} "
                              f"(it changed hands repeatedly)")
        self.info = info
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="packer-lock-heartbeat", daemon=True)
        self._thread.start()
        return info

    def _beat(self) -> None:
        from pymongo.errors import PyMongoError

        while not self._stop.wait(self.ttl / 4):
            try:
                res = self.coll.update_one({"_id": self._ID, "token": self.info["token"]},
                                           {"$set": {"heartbeat": self._now()}})
            except PyMongoError as exc:  # a blip: the next beat retries; ttl leaves room
                log.warning("%s: lock heartbeat failed: %s", self.name, exc)
                continue
            if res.matched_count == 0:
                self.lost = True
                log.error("%s: the output lock was taken over by another process", self.name)
                return

    def check(self) -> None:
        """Raise LockedError unless the lock document is still ours (asks the server)."""
        held = self.coll.find_one({"_id": self._ID}) if self.info is not None else None
        if self.lost or held is None or held.get("token") != self.info["token"]:
            raise LockedError(f"{self.name}: this process lost the output lock (its heartbeat stopped "
                              f"for more than {self.ttl:.0f}s) to {describe_holder(held)}; not publishing",
                              held)

    def release(self) -> None:
        """Stop the heartbeat and delete the lock document (only if it is still ours)."""
        from pymongo.errors import PyMongoError

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.info is not None:
            try:
                self.coll.delete_one({"_id": self._ID, "token": self.info["token"]})
            except PyMongoError as exc:
                log.warning("%s: could not release the lock (it goes stale in %.0fs): %s",
                            self.name, self.ttl, exc)
            self.info = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


@contextlib.contextmanager
def output_lock(location: str, store_cls=None, *, purpose: str = "build", **connection) -> Iterator[HeldLock]:
    """Hold the exclusive writer lock of the output at ``location`` for the block.

    Every command that writes a store (build, and later repair, convert, append) takes it, so
    two writers of one output never run at once.

    Args:
        location: the output (a path, or a server URL).
        store_cls: its Store class; one defining ``lock_output(location, purpose=..., **connection)``
            (a context manager yielding a :class:`HeldLock`) provides its own lock, others get
            :func:`file_lock`.
        purpose: what the holder does, shown to a refused writer.
        connection: connection options of server stores (e.g. ``uri``).

    Yields:
        A :class:`HeldLock`: ``.info`` is the holder record (host, pid, purpose, since...);
        call ``.check()`` before publishing.

    Raises:
        LockedError: another writer holds the lock; the message names it (host, pid, since).

    Example:
        >>> from packer.stores import get_store
        >>> with output_lock("/tmp/x.lmdb", get_store("lmdb")) as held:   # doctest: +SKIP
        ...     print(held.info["pid"]); held.check()
    """
    custom = getattr(store_cls, "lock_output", None)
    if custom is not None:
        with custom(str(location), purpose=purpose, **connection) as held:
            yield held
        return
    with file_lock(str(location), purpose=purpose) as info:
        yield HeldLock(info)
