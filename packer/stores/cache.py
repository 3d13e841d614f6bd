"""Node-local cache of a remote manifest's shards: bounded, shared, planned by the next use.

A manifest in a bucket (``s3://bucket/train.packer-manifest.json``) is read through
:class:`ShardCache`: a shard is downloaded whole into ``cache_dir`` the first time a process on
this machine needs it, checked (size, and the ``xxh3_128`` of every file when the manifest lists
its ``"files"``; see docs/object-storage.md), then opened with the ordinary LMDB/HDF5 reader.

* **One download per shard per node.** Every process (DataLoader workers, the ranks of a node)
  shares the folder; a shard is downloaded under an exclusive ``flock`` on its own lock file, so
  the second process asking for it waits for the first and then reads the same files.
* **A hard size limit.** ``cache_limit`` bytes hold every shard on disk plus the full size of
  every download in flight (reserved before its first byte arrives), so the folder never holds
  more than the limit. Space is made under one cache-wide lock.
* **Nothing in use is evicted.** A process holds a shared ``flock`` on a shard's use-lock while
  it has the shard open or read ahead; eviction takes the lock exclusively without waiting, so a
  shard open anywhere on the node is skipped. A crashed process's locks go with it (the kernel).
* **Eviction by the next use (Belady).** Given the order in which shards will be read (the
  sampler's epoch order and the next epoch's: :func:`write_plan`), the shard whose next use is
  farthest away is evicted; without an order, the least recently used. With a cache of a
  fraction ``f`` of the dataset, an epoch after the first then downloads about ``(1 - f)`` of
  it, where LRU downloads nearly all of it again under a shuffled order.
* **Read-ahead.** A background thread per process downloads the next ``read_ahead`` shards of
  the order (pinned until read), never evicting a shard needed sooner than the one it fetches.
  It starts with the first shard asked for, so the next ones download while that one does; a
  shard another process on the node is already downloading is skipped (its turn comes when
  that download ends), so several workers keep several downloads in flight. Without a plan,
  a process that reads shards in manifest order from the start (``0, 1, 2...``: a sequential
  sampler, the plain DataLoader; one worker of several skips a few) reads ahead the shards after the
  current one and evicts as if the scan repeated each epoch; any other order without a plan
  reads nothing ahead (and evicts by LRU).
* **No room is a wait, then a give-way.** A process that needs a shard and finds the limit held
  by shards in use closes what it has open besides (``on_pressure``), drops its read-ahead and
  marks the cache under pressure; every other process's read-ahead thread sees the mark within
  half a second and does the same, unless that process is in the middle of a read. So workers
  that keep shards open while idle (a DataLoader hands batches over in order) never starve
  the one that must move: a limit of one process's pins is enough for any number of them, as
  long as each can hold the shard it reads. It waits within the remote time budget, then fails
  naming the cache.
* **Refused up front when too small**: the limit must hold the largest shard times
  ``read_ahead + max_open`` (the shards one process may pin at once); the error gives that size.

The cache holds only copies of objects that stay in the bucket, so eviction never loses data.
"""
from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from packer.core import remote
from packer.core.diskspace import size_text
from packer.core.errors import StoreError, UsageError
from packer.core.records import checksum, xxh3_file
from packer.core.uri import redact
from packer.stores import get_store
from packer.stores.extents import load_extents

log = logging.getLogger(__name__)

DEFAULT_READ_AHEAD = 2
#: Bytes of a cache's limit kept for the files beside the shards (plans, locks), at least.
META_ROOM = 4 << 10
_COMPLETE = ".complete"
_NEVER = float("inf")
_COALESCE = 64 * 1024     # a record's two ranges this close are read by one GET
#: Seconds a process's "no room" mark (the file ``pressure`` in the cache's root) stays in force:
#: while it does, every process lets go of the shards it is not reading and reads nothing ahead.
PRESSURE_S = 2.0


def default_cache_dir() -> str:
    """``PACKER_CACHE_DIR``, else ``~/.cache/packer/remote``."""
    return os.environ.get("PACKER_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "packer", "remote")


def cache_root(cache_dir: Optional[str], manifest_url: str) -> str:
    """The folder of one remote dataset inside ``cache_dir`` (named by a hash of its URL, so
    no credentials or odd characters reach a file name)."""
    digest = hashlib.sha256(redact(manifest_url).encode()).hexdigest()[:16]
    return os.path.join(os.path.abspath(cache_dir or default_cache_dir()), digest)


def _plan_path(root: str, rank: Optional[int]) -> str:
    rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
    return os.path.join(root, f"plan-{rank}.json")


def write_plan(root: str, order: Sequence[int], *, epoch: int = 0, rank: Optional[int] = None) -> None:
    """Tell every process of this rank on this node the order in which shards will be read.

    ``order`` is a sequence of shard ids (consecutive repeats collapsed or not), usually this
    epoch's order followed by the next epoch's (what :class:`readers.DistributedSampler` hands
    over), so that the end of one epoch already keeps the shards the next one starts with.
    Written atomically; processes pick it up at their next shard open. ``rank`` defaults to the
    ``RANK`` environment variable (torchrun), inherited by DataLoader workers.
    """
    os.makedirs(root, exist_ok=True)
    runs = [int(s) for k, s in enumerate(order) if k == 0 or order[k - 1] != s]
    path = _plan_path(root, rank)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as fh:
        json.dump({"epoch": int(epoch), "order": runs}, fh, separators=(",", ":"))
    os.replace(tmp, path)


@dataclass
class ShardSource:
    """Where shard ``index`` lives: its URL, format and, when published, its files (remote.md)."""

    index: int
    url: str
    format: str
    index_checksum: str
    files: Optional[list] = None   # [{"name", "size", "xxh3_128", "etag"}] or None: learn at download
    #: ``{"url", "file", "size", "xxh3_128", "etag"}``: where each record lies in ``file`` (ranged reads)
    extents: Optional[dict] = None
    key: str = field(init=False)

    def __post_init__(self):
        ident = [self.url, self.index_checksum] + [f"{f.get('name')}:{f.get('etag')}:{f.get('xxh3_128')}"
                                                   for f in (self.files or [])]
        self.key = f"{self.index:05d}-{hashlib.sha256(chr(0).join(ident).encode()).hexdigest()[:12]}"

    @property
    def size(self) -> Optional[int]:
        return None if self.files is None else sum(int(f["size"]) for f in self.files)


def _flock(path: str, mode: int) -> Optional[int]:
    """An fd of ``path`` (created) locked with ``mode``; None when ``LOCK_NB`` could not lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        return fd
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise


@contextlib.contextmanager
def _locked(path: str, mode: int = fcntl.LOCK_EX):
    fd = _flock(path, mode)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


class ShardCache:
    """The node-local copies of one remote manifest's shards (see the module docstring).

    Args:
        root: this dataset's folder (:func:`cache_root`).
        shards: one :class:`ShardSource` per shard, in manifest order.
        limit: bytes the folder may hold (None: unbounded).
        read_ahead: shards downloaded ahead of use in the planned order (0: none).
        max_open: shards one process may have open at once (for the up-front size check).
        storage_options: fsspec options for the bucket (never logged).
        label: the manifest's URL, for messages.

    Raises:
        UsageError: ``limit`` cannot hold the largest shard times ``read_ahead + max_open``.
    """

    def __init__(self, root: str, shards: Sequence[ShardSource], *, limit: Optional[int] = None,
                 read_ahead: int = DEFAULT_READ_AHEAD, max_open: int = 1,
                 storage_options: Optional[dict] = None, label: str = ""):
        self.root, self.shards = root, list(shards)
        self.limit = None if limit is None else int(limit)
        self.read_ahead, self.max_open = max(0, int(read_ahead)), max(1, int(max_open))
        self.storage_options = storage_options
        self.label = redact(label or root)
        self._keys = {s.key for s in self.shards}
        for sub in ("shards", "locks", "reserve"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        sizes = [s.size for s in self.shards if s.size is not None]
        if sizes:
            self._check_fits(max(sizes))
        #: Per process: shards downloaded, their bytes, and shard opens served from the cache.
        self.stats = {"downloads": 0, "bytes": 0, "hits": 0, "ranged": 0, "ranged_bytes": 0}
        self._extents: dict = {}           # shard index -> its (count, 4) extents table
        self._pins: dict = {}              # shard index -> [fd, count]
        self._mutex = threading.RLock()
        self._order: list = []
        self._occ: dict = {}
        self._pos = 0
        self._last = None                  # without a plan: the last shard this process opened
        self._seq = None                   # ... and where a manifest-order scan is (None: none seen)
        self._plan_mtime = None
        self._ahead: set = set()
        self._cv = threading.Condition()
        self._wake = 0
        self._stop = False
        self._thread = None
        self._pid = os.getpid()
        #: Called (no arguments, from a read or from the read-ahead thread) when this node's cache
        #: has no room for a shard some process needs: the owner closes the shards it has open
        #: unless a read is under way (their pins hold room others need). Must not block.
        self.on_pressure: Optional[Callable[[], None]] = None
        self._marked = 0.0                 # when this process last marked the cache under pressure

    # -- sizes -----------------------------------------------------------------------------------
    def needed_bytes(self, largest: int) -> int:
        """The smallest limit this cache accepts for shards of at most ``largest`` bytes: the
        shards one process holds at once, and room for the plan and lock files."""
        return int(largest) * (self.read_ahead + self.max_open) + META_ROOM

    @staticmethod
    def _meta_room(plans: int) -> int:
        """Bytes kept free of shards for the files beside them: the read plans a sampler rewrites
        each epoch (``plans`` bytes now; written after the shards' room was reserved) and the lock
        files."""
        return max(META_ROOM, 2 * plans)

    def _check_fits(self, largest: int) -> None:
        if self.limit is not None and self.limit < self.needed_bytes(largest):
            need = self.needed_bytes(largest)
            raise UsageError(
                f"{self.label}: cache_limit {self.limit} bytes is too small: the largest shard is {largest} "
                f"bytes and one process holds up to {self.read_ahead + self.max_open} shards at once "
                f"(read_ahead {self.read_ahead} + max_open {self.max_open}); it needs at least {need} bytes "
                f"({size_text(need)}; lower read_ahead/max_open or raise cache_limit)")
        if self.limit is not None and self.limit < 2 * self.needed_bytes(largest):
            # Accepted, but the shards in flight (each process's read-ahead and open ones) take
            # most of it: little stays from one epoch to the next, so each downloads most of the
            # dataset again (measured: 64 MiB shards, two workers, half the dataset's bytes).
            log.warning("%s: cache_limit %s holds little beyond the shards in flight (%d shards of up "
                        "to %s per process): later epochs will download most of the dataset again; "
                        "a limit of several times %s, or smaller shards, keeps more",
                        self.label, size_text(self.limit), self.read_ahead + self.max_open, size_text(largest),
                        size_text(self.needed_bytes(largest)))

    def _path(self, *parts) -> str:
        return os.path.join(self.root, *parts)

    def local_path(self, j: int) -> str:
        """Where shard ``j``'s copy lives (a file, or a folder for an LMDB shard)."""
        s = self.shards[j]
        return self._path("shards", s.key, remote.basename(s.url) or "shard")

    def is_cached(self, j: int) -> bool:
        return os.path.exists(self._path("shards", self.shards[j].key, _COMPLETE))

    def usage(self) -> int:
        """Bytes the folder holds, counting each download in flight at its full size."""
        return self._usage_and_plans()[0]

    def _usage_and_plans(self) -> tuple:
        """(:meth:`usage`, the bytes of the read plans among it), the cache's root scanned once."""
        total = plans = 0
        for entry in os.scandir(self._path("shards")):
            if os.path.exists(os.path.join(entry.path, _COMPLETE)) or not os.path.exists(
                    self._path("reserve", entry.name)):
                total += _tree_bytes(entry.path)
        for entry in os.scandir(self._path("reserve")):
            with contextlib.suppress(OSError, ValueError):
                with open(entry.path) as fh:
                    total += int(fh.read() or 0) + entry.stat().st_size
        for entry in os.scandir(self.root):
            if entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):   # a plan being replaced
                    size = entry.stat().st_size
                    total += size
                    plans += size if entry.name.startswith("plan") else 0
        return total, plans

    # -- the order -------------------------------------------------------------------------------
    def set_order(self, order: Sequence[int], *, epoch: int = 0) -> None:
        """Plan eviction and read-ahead by ``order`` (shard ids), for this rank's processes."""
        write_plan(self.root, order, epoch=epoch)
        self._load_plan()

    def _load_plan(self) -> None:
        path = _plan_path(self.root, None)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == self._plan_mtime:
            return
        try:
            with open(path) as fh:
                order = [int(x) for x in json.load(fh)["order"] if 0 <= int(x) < len(self.shards)]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: ignoring an unreadable read plan %s (%s)", self.label, path, exc)
            return
        occ: dict = {}
        for pos, s in enumerate(order):
            occ.setdefault(s, []).append(pos)
        with self._mutex:
            self._order, self._occ, self._pos, self._plan_mtime = order, occ, 0, mtime
        self._kick()

    def advance(self, j: int) -> None:
        """Shard ``j`` is being read now: move this process's place in the order to it."""
        with self._mutex:
            occ, before = self._occ.get(j), self._pos
            if occ:
                k = bisect.bisect_left(occ, self._pos)
                self._pos = occ[k] if k < len(occ) else occ[0]
        if self._pos != before:
            self._kick()

    def next_use(self, j: int) -> float:
        """Steps from this process's place in the order to the next read of shard ``j`` after it
        (``inf``: not read again in the known order)."""
        occ = self._occ.get(j)
        if not occ:
            seq = self._seq
            if not self._order and seq is not None:    # a scan in manifest order, again each epoch
                n = len(self.shards)
                return (j - seq) % n or n
            return _NEVER
        k = bisect.bisect_right(occ, self._pos)
        return occ[k] - self._pos if k < len(occ) else _NEVER

    def far(self, j: int) -> bool:
        """Whether shard ``j`` is not among the next ``max_open`` distinct shards of the order
        (an open shard that is far should be closed: open shards stay pinned)."""
        with self._mutex:
            if not self._order:
                if self._seq is None:
                    return False
                return (j - self._seq) % len(self.shards) >= self.max_open   # a scan: behind it, or far ahead
            near, k = set(), self._pos
            while k < len(self._order) and len(near) < self.max_open:
                near.add(self._order[k])
                k += 1
            return j not in near

    def _follow(self, j: int) -> None:
        """Without a plan: shard ``j`` is opened now. A first shard near the start of the
        manifest, and each one at most ``read_ahead + 1`` after the last (one DataLoader worker of
        several skips the shards the others read), are taken for a scan in manifest order, which
        reads ahead the shards after it; a jump anywhere else ends the guess (and a first open
        elsewhere, such as ``ds[i]`` of a record deep in the dataset, starts none)."""
        with self._mutex:
            if self._order:
                return
            prev, self._last = self._last, j
            near = self.read_ahead + 1
            follows = j <= near if prev is None else (j - prev) % len(self.shards) <= near
            self._seq = j if follows else None
        if follows:
            self._kick()

    def _window(self) -> list:
        """The next ``read_ahead`` distinct shards of the order after the current one (without
        a plan: the shards after the current one of a manifest-order scan)."""
        with self._mutex:
            if not self._order:
                if self._seq is None:
                    return []
                n = len(self.shards)
                return [(self._seq + 1 + k) % n for k in range(min(self.read_ahead, n - 1))]
            out, cur = [], self._order[self._pos] if self._order else None
            for s in self._order[self._pos + 1:]:
                if len(out) >= self.read_ahead:
                    break
                if s != cur and s not in out:
                    out.append(s)
            return out

    # -- pins ------------------------------------------------------------------------------------
    def _pin(self, j: int) -> None:
        with self._mutex:
            p = self._pins.get(j)
            if p is not None:
                p[1] += 1
                return
        fd = _flock(self._path("locks", self.shards[j].key + ".use"), fcntl.LOCK_SH)
        with self._mutex:
            p = self._pins.get(j)
            if p is not None:        # another thread pinned it meanwhile
                p[1] += 1
                os.close(fd)
            else:
                self._pins[j] = [fd, 1]

    def _unpin(self, j: int) -> None:
        with self._mutex:
            p = self._pins.get(j)
            if p is None:
                return
            p[1] -= 1
            if p[1] <= 0:
                del self._pins[j]
                os.close(p[0])

    # -- the public protocol -----------------------------------------------------------------------
    def acquire(self, j: int) -> str:
        """Shard ``j``'s local copy, downloaded now if needed; pinned until :meth:`release`.

        Raises:
            RemoteError: the bucket failed within its time budget, or an object changed (named).
            StoreError: a file arrived with the wrong checksum, or no room could be made.
        """
        self._check_pid()
        self._load_plan()
        self._pin(j)
        try:
            self.advance(j)
            self._follow(j)
            if self.is_cached(j):
                self.stats["hits"] += 1
            else:
                self._start_thread()     # the next shards download while this one does
                self._ensure(j, demand=True)
            with contextlib.suppress(OSError):
                os.utime(self._path("shards", self.shards[j].key, _COMPLETE))
        except BaseException:
            self._unpin(j)
            raise
        self._start_thread()
        return self.local_path(j)

    def release(self, j: int) -> None:
        """Shard ``j`` is no longer open in this process (it may be evicted when not in use)."""
        self._unpin(j)

    def close(self) -> None:
        """Stop the read-ahead thread and drop this process's pins."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        t, self._thread = self._thread, None
        if t is not None and self._pid == os.getpid():
            t.join(timeout=30)
        with self._mutex:
            pins, self._pins = self._pins, {}
            self._ahead = set()
        for fd, _ in pins.values():
            with contextlib.suppress(OSError):
                os.close(fd)   # inherited through fork: closing ours leaves the parent's lock alone

    def _check_pid(self) -> None:
        if self._pid != os.getpid():     # inherited through fork: not our pins, not our thread
            self._mutex, self._cv = threading.RLock(), threading.Condition()
            pins, self._pins, self._ahead, self._thread = self._pins, {}, set(), None
            for fd, _ in pins.values():
                with contextlib.suppress(OSError):
                    os.close(fd)   # drops our reference only: the parent's lock stays
            self._pid, self._stop = os.getpid(), False

    # -- one record by ranged reads ------------------------------------------------------------------
    def record_parts(self, j: int, local: int) -> Optional[tuple]:
        """``(metadata bytes, image bytes)`` of record ``local`` of shard ``j``, read by byte ranges
        of the shard's data file in the bucket (pinned to its ETag) without downloading the shard;
        None when the manifest lists no extents for it.

        Raises:
            RemoteError: as :func:`remote.read`. StoreError: the extents object, or the manifest's
            size of the file they point into, is damaged.
        """
        s = self.shards[j]
        table = self._extents_of(j)
        if table is None:
            return None
        f = next((f for f in s.files if f.get("name") == s.extents["file"]), None)
        if f is None or not 0 <= local < len(table):
            raise StoreError(f"{self.label}: shard {j}: its extents list no record {local} of file "
                             f"{s.extents['file']!r}")
        mo, ml, do, dl = (int(v) for v in table[local])
        size, url = int(f["size"]), remote.join(s.url, f["name"]) if f["name"] else s.url
        if max(mo + ml, do + dl) > size:
            raise StoreError(f"{self.label}: shard {j}: extents of record {local} lie past the end of "
                             f"{redact(url)} ({size} bytes, as the manifest lists it): the extents object or "
                             f"the manifest's size of that file is damaged")
        read = lambda a, b: remote.read(url, a, b, version=f.get("etag") or "",   # noqa: E731
                                        storage_options=self.storage_options)
        lo, hi = min(mo, do), max(mo + ml, do + dl)
        if hi - lo <= ml + dl + _COALESCE:            # close together: one GET
            span = read(lo, hi)
            meta, data = span[mo - lo:mo - lo + ml], span[do - lo:do - lo + dl]
        else:
            meta, data = read(mo, mo + ml), read(do, do + dl)
        self.stats["ranged"] += 1
        self.stats["ranged_bytes"] += ml + dl
        return meta, data

    def _extents_of(self, j: int):
        """Shard ``j``'s extents table (fetched once per process, checked by its xxh3_128)."""
        s = self.shards[j]
        if s.extents is None or s.files is None:
            return None
        table = self._extents.get(j)
        if table is None:
            e = s.extents
            raw = remote.read(e["url"], 0, int(e["size"]), version=e.get("etag") or "",
                              storage_options=self.storage_options)
            if e.get("xxh3_128") and checksum(raw, "xxh3-128") != e["xxh3_128"]:
                raise StoreError(f"{redact(e['url'])}: arrived damaged: xxh3_128 differs from the manifest "
                                 f"{self.label}")
            table = self._extents[j] = load_extents(raw, redact(e["url"]))
        return table

    # -- downloads ---------------------------------------------------------------------------------
    def _ensure(self, j: int, demand: bool) -> Optional[bool]:
        """Make shard ``j`` present (one download per node); False when read-ahead gave way to
        a shard needed sooner, None when read-ahead found another process downloading it."""
        s = self.shards[j]
        lock = self._path("locks", s.key + ".dl")
        fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:      # another process is downloading it
            if not demand:
                return None
            fd = self._wait_for(lock)
        try:
            if self.is_cached(j):
                return True
            files = s.files if s.files is not None else self._discover(s)
            size = sum(int(f["size"]) for f in files)
            self._check_fits(size)
            if not self._make_room(j, size, demand):
                return False
            try:
                self._download(s, files)
            finally:
                with contextlib.suppress(OSError):
                    os.remove(self._path("reserve", s.key))
        finally:
            os.close(fd)
        return True

    def _wait_for(self, lock: str) -> int:
        """Another process is downloading this shard: wait for its lock, giving way meanwhile
        whenever the cache is under pressure (that download may be waiting for room that this
        process's idle shards hold). No deadline of its own: the download ends within the remote
        time budget, or with its process, and the lock with it."""
        while True:
            if self.under_pressure():
                self._give_way()
            fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is not None:
                return fd
            time.sleep(0.02)

    def _discover(self, s: ShardSource) -> list:
        """The files of a shard whose manifest entry lists none: pinned to the ETags seen now."""
        so = self.storage_options
        if get_store(s.format).folder:   # a folder of files: every object under its prefix
            base = s.url.rstrip("/") + "/"
            found = [o for o in remote.list_objects(base, so) if remote.basename(o.url) != "lock.mdb"]
            if not found:
                raise remote.RemoteError(s.url, "no such shard (no objects under it)")
            return [{"name": o.url[len(base):], "size": o.size, "etag": o.version} for o in found]
        info = remote.stat(s.url, so)
        return [{"name": "", "size": info.size, "etag": info.version}]

    def _download(self, s: ShardSource, files: list) -> None:
        folder = self._path("shards", s.key)
        shutil.rmtree(folder, ignore_errors=True)
        dest = os.path.join(folder, remote.basename(s.url) or "shard")
        t0, total = time.monotonic(), 0
        try:
            for f in files:
                name = f.get("name") or ""
                url = remote.join(s.url, name) if name else s.url
                path = os.path.join(dest, *name.split("/")) if name else dest
                remote.download(url, path, version=f.get("etag") or "", size=int(f["size"]),
                                storage_options=self.storage_options)
                want = f.get("xxh3_128")
                got = xxh3_file(path) if want else None
                if want and got != want:
                    raise StoreError(f"{redact(url)}: arrived damaged: xxh3_128 {got}, the "
                                     f"manifest {self.label} says {want}")
                total += int(f["size"])
            # counted before the marker: a reader seeing the marker reads the shard at once
            self.stats["downloads"] += 1
            self.stats["bytes"] += total
            open(os.path.join(folder, _COMPLETE), "wb").close()
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        log.info("%s: shard %d downloaded (%d bytes in %.2f s)", self.label, s.index, total, time.monotonic() - t0)

    def _make_room(self, j: int, size: int, demand: bool) -> bool:
        """Reserve ``size`` bytes for shard ``j``, evicting by next use; a demand waits (within
        the remote time budget) for shards in use elsewhere, read-ahead gives way."""
        deadline = time.monotonic() + remote.RETRY_BUDGET_S
        yielded = False
        while True:
            with _locked(self._path("locks", "cache")):
                if self._evict_until(j, size, demand):
                    with open(self._path("reserve", self.shards[j].key), "w") as fh:
                        fh.write(str(size))
                    return True
            if not demand:
                return False
            self._mark_pressure()
            if not yielded:        # first let go of what this process holds besides shard j
                yielded = True
                self._give_way()
                continue
            if time.monotonic() > deadline:
                raise StoreError(
                    f"{self.label}: no room in the cache {self.root} for shard {j} ({size} bytes): "
                    f"cache_limit {self.limit} bytes is held by shards in use by other processes on this "
                    f"node; give it at least {self.needed_bytes(size)} bytes per process reading it")
            time.sleep(0.05)

    # -- no room: every process lets go of what it is not reading ----------------------------------
    def _mark_pressure(self) -> None:
        now = time.monotonic()
        if now - self._marked < PRESSURE_S / 4:
            return
        self._marked = now
        path = self._path("pressure")
        with contextlib.suppress(OSError):
            open(path, "a").close()  # empty: it costs the limit nothing
            os.utime(path)           # its mtime is the mark

    def under_pressure(self) -> bool:
        """Whether some process on this node found no room in the last :data:`PRESSURE_S` (never
        for a cache without a limit: nothing of it needs to give way)."""
        if self.limit is None:
            return False
        try:
            return time.time() - os.stat(self._path("pressure")).st_mtime < PRESSURE_S
        except OSError:
            return False

    def _give_way(self) -> None:
        """Drop this process's read-ahead pins and have its owner close the shards it has open
        but is not reading (:attr:`on_pressure`)."""
        with self._mutex:
            ahead, self._ahead = self._ahead, set()
            for t in ahead:
                self._unpin(t)
        if self.on_pressure is not None:
            self.on_pressure()

    def _victims(self, j: int) -> list:
        """Shard folders that may go, best first: stale and foreign ones, then the farthest next
        use, then the least recently used."""
        by_key = {s.key: s.index for s in self.shards}
        out = []
        for entry in os.scandir(self._path("shards")):
            if entry.name == self.shards[j].key or os.path.exists(self._path("reserve", entry.name)):
                continue
            marker = os.path.join(entry.path, _COMPLETE)
            try:
                used = os.stat(marker).st_mtime
                rank = 0 if entry.name not in self._keys else 1
            except OSError:
                used, rank = 0.0, 0      # incomplete and nobody downloading it: stale
            idx = by_key.get(entry.name)
            nxt = _NEVER if idx is None else self.next_use(idx)
            out.append((rank, -nxt, used, entry.name, nxt))
        out.sort()
        return out

    def _evict_until(self, j: int, size: int, demand: bool) -> bool:
        if self.limit is None:
            return True
        used, plans = self._usage_and_plans()
        used += self._meta_room(plans)
        if used + size <= self.limit:
            return True
        mine = self.next_use(j) if not demand else 0
        for rank, _, _, key, nxt in self._victims(j):
            if not demand and rank == 1 and nxt <= mine:
                return False     # read-ahead never evicts a shard needed sooner than its own
            fd = _flock(self._path("locks", key + ".use"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                continue         # open or read ahead somewhere on this node
            try:
                with _locked(self._path("locks", key + ".dl"), fcntl.LOCK_EX | fcntl.LOCK_NB) as dl:
                    if dl is None:
                        continue
                    freed = _tree_bytes(self._path("shards", key))
                    shutil.rmtree(self._path("shards", key), ignore_errors=True)
                    log.debug("%s: evicted %s (%d bytes, next use %s)", self.label, key, freed, nxt)
                    used -= freed
            finally:
                os.close(fd)
            if used + size <= self.limit:
                return True
        return False

    # -- read-ahead --------------------------------------------------------------------------------
    def _kick(self) -> None:
        with self._cv:
            self._wake += 1
            self._cv.notify_all()

    def _start_thread(self) -> None:
        # with a limit, also without read-ahead: the thread gives way when the cache is full
        if (self.read_ahead or self.limit is not None) and self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._ahead_loop, name="packer-read-ahead", daemon=True)
            self._thread.start()

    def _ahead_loop(self) -> None:
        seen = -1
        while True:
            with self._cv:
                while self._wake == seen and not self._stop:
                    self._cv.wait(0.5)
                    if self.under_pressure():
                        break
                if self._stop:
                    return
                seen = self._wake
            if self.under_pressure():
                self._give_way()       # and read nothing ahead while the mark is in force
                continue
            window = self._window()
            with self._mutex:          # a give-way from the reading thread swaps the set
                for t in [t for t in self._ahead if t not in window]:
                    self._ahead.discard(t)
                    self._unpin(t)
            for t in window:
                if self._stop or self._wake != seen:
                    break
                with self._mutex:
                    if t not in self._ahead:
                        self._pin(t)
                        self._ahead.add(t)
                try:
                    if self._ensure(t, demand=False) is False:
                        break
                except Exception as exc:   # noqa: BLE001 - the read that needs it raises it
                    log.info("%s: read-ahead of shard %d failed (%s); the read will retry", self.label, t, exc)
                    break
