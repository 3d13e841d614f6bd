"""LMDB store: encoded JPEG bytes per record, in an LMDB environment (a folder).

Layout (named sub-databases of one environment, keys are 8-byte big-endian indices unless
stated)::

    data      index -> JPEG bytes
    records   index -> record metadata (JSON, see packer.records.Record.meta_dict)
    keys      utf-8 relative path -> index (8-byte big-endian)
    meta      b"metadata" -> StoreMetadata JSON (written last: marks a complete store)
              b"progress" -> ResumeState JSON (while building)

Writes go to ``<out>.partial/`` and the folder is renamed onto ``<out>`` on success. The map
grows by doubling whenever a batch does not fit, so ``MapFullError`` never reaches the user.
Readers open the environment read-only without locking, lazily in their own process.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import threading
import uuid
from pathlib import Path
from typing import Iterator, Sequence

from ..diskspace import disk_full, is_disk_full, require_room
from ..errors import DependencyError, RecordError, ResumeMismatchError, StoreError, UsageError
from ..records import Record, StoreMetadata, loads_bounded
from . import register_store
from .base import (ResumeState, Store, StoreReader, StoreWriter, count_limit, load_metadata, partial_location,
                   remove_path)

log = logging.getLogger(__name__)

_DBS = (b"data", b"records", b"keys", b"meta")
#: Room kept free beyond a batch's own pages: B-tree pages rewritten by the commit, the lock file.
_WRITE_MARGIN = 1 << 20
_INITIAL_MAP = 256 << 20
_MAX_DBS = 8


def _lmdb():
    try:
        import lmdb
    except ImportError as exc:
        raise DependencyError("the LMDB store needs the 'lmdb' package (pip install lmdb)") from exc
    return lmdb


def _ikey(index: int) -> bytes:
    return struct.pack(">Q", index)


def _partial(location: str) -> Path:
    return Path(partial_location(location))


def _pages(n: int, page: int = 4096) -> int:
    """Bytes LMDB's data file grows by for a value of ``n`` bytes (whole pages, with a header)."""
    return -(-(n + 16) // page) * page


_META_MAGIC = 0xBEEFC0DE


def expected_data_size(data_file) -> tuple[int, int]:
    """(size the file must have, size it has) from LMDB's own meta pages.

    Pages 0 and 1 of ``data.mdb`` are meta pages (``MDB_meta`` after a 16-byte page header):
    the page size is in the free-list DB record's ``md_pad`` (offset 40) and the last page in
    use, ``mm_last_pg``, at offset 136, next to ``mm_txnid``; the meta with the higher txnid is
    the current one. Reading a memory map past the end of a file cut short raises SIGBUS, so
    readers compare these before they map anything.

    Raises:
        StoreError: the meta pages are missing or not LMDB's.
    """
    try:
        with open(data_file, "rb") as fh:
            head = fh.read(152)
            size = os.fstat(fh.fileno()).st_size
            psize = struct.unpack_from("<I", head, 40)[0] if len(head) >= 152 else 0
            metas = [head]
            if 4096 <= psize <= (1 << 16):
                fh.seek(psize)
                metas.append(fh.read(152))
    except OSError as exc:
        raise StoreError(f"{data_file}: cannot read: {exc}") from exc
    best = None
    for raw in metas:
        if len(raw) < 152 or struct.unpack_from("<I", raw, 16)[0] != _META_MAGIC:
            continue
        last_pg, txnid = struct.unpack_from("<QQ", raw, 136)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid)
    if best is None or not 4096 <= psize <= (1 << 16):
        raise StoreError(f"{data_file}: not an LMDB data file (no valid meta page; {size} bytes)")
    return (best[0] + 1) * psize, size


def truncation_problem(location) -> str | None:
    """A message when the store's ``data.mdb`` is shorter than its meta pages say, else None."""
    return _cut_short_message(location, *expected_data_size(Path(location) / "data.mdb"))


def _cut_short_message(location, need: int, have: int) -> str | None:
    if have < need:
        return (f"{location}: store file cut short: data.mdb holds {have} bytes, its meta pages say "
                f"{need} ({need - have} bytes missing; an interrupted copy?) (hint: packer repair)")
    return None



@register_store
class LMDBStore(Store):
    """LMDB environment folder (``data.mdb`` + ``lock.mdb``)."""

    name = "lmdb"
    description = "LMDB environment folder: encoded JPEG bytes per record (fast random reads)"
    writer_options = {"map_size": "initial map size in bytes (default 256 MiB); it doubles whenever "
                                  "a batch does not fit, so this only tunes how often"}
    reader_options = {}
    suffixes = (".lmdb",)

    @classmethod
    def claims(cls, location: str) -> bool:
        p = Path(location)
        return p.is_dir() and (p / "data.mdb").is_file()

    @classmethod
    def exists(cls, location: str, **connection) -> bool:
        # Anything at the path is in the way of publishing there, store or not.
        return os.path.lexists(location)

    @classmethod
    def is_store(cls, location: str, **connection) -> bool:
        """An LMDB environment holding packer's named databases (data, records, keys, meta):
        published or staging. One cut short or damaged counts when a scan of its pages finds
        packer's metadata or a record's fields; another program's LMDB does not."""
        if not cls.claims(location):
            return False
        location = str(location)
        try:
            if truncation_problem(location) is None:
                _, _, fid = _acquire_env(location)
                _release_env(fid)
                return True
        except StoreError:           # no LMDB meta page: not an LMDB data file at all
            return False
        except _lmdb().NotFoundError:
            # A sound environment without packer's databases: another program's, unless it holds
            # nothing at all (a build killed before its first commit: nothing to lose there).
            return _holds_nothing(location)
        except (_lmdb().Error, OSError) as exc:
            log.debug("%s: LMDB refuses it (%s); looking for packer's pages", location, exc)
        return _has_packer_pages(Path(location) / "data.mdb")

    @classmethod
    def create_writer(cls, location: str, **options) -> "LMDBWriter":
        commit_bytes = options.pop("commit_bytes", None)
        cls.check_options(options, "writer")
        kw = {} if commit_bytes is None else {"commit_bytes": int(commit_bytes)}
        try:
            map_size = int(options.get("map_size", _INITIAL_MAP))
        except ValueError:
            raise UsageError(f"lmdb: map_size must be a number of bytes, got {options['map_size']!r}") from None
        return LMDBWriter(str(location), map_size=map_size, **kw)

    @classmethod
    def open_reader(cls, location: str, **options) -> "LMDBReader":
        cls.check_options(options, "reader")
        return LMDBReader(str(location))

    @classmethod
    def open_salvage(cls, location: str, **options) -> "LMDBReader":
        """A reader that survives missing metadata and a ``data.mdb`` cut short.

        A short file is read through a copy padded with zeros (sparse) to the size LMDB's meta
        pages say, so pages that were lost read as zeros, which LMDB reports as corrupt
        (``lmdb.Error``, a RecordError per record) instead of SIGBUS.
        """
        cls.check_options(options, "reader")
        location = str(location)
        if not (Path(location) / "data.mdb").is_file():
            raise StoreError(f"{location}: no LMDB store here")
        cut = truncation_problem(location)
        if cut is None:
            try:
                return LMDBReader(location, salvage=True)
            except StoreError as exc:
                if not isinstance(exc.__cause__, _lmdb().Error):
                    raise
                cut = f"{location}: LMDB B-tree damaged ({exc.__cause__}); records read by page scan"
        # The B-tree roots live at the end of the file (copy-on-write appends), so a file cut
        # short has lost them: read the surviving pages directly instead of through the tree.
        return LMDBScanReader(location, cut)


class LMDBWriter(StoreWriter):
    """Builds ``<location>.partial`` and renames it onto ``location`` at publish."""

    def __init__(self, location: str, map_size: int = _INITIAL_MAP, **kw):
        super().__init__(location, **kw)
        self._initial_map = max(1 << 16, int(map_size))
        self._env = None
        self._dbs = {}

    def _open_env(self, path: Path, map_size: int):
        lmdb = _lmdb()
        # The lock file is memory-mapped: touching a page of it on a full disk would SIGBUS.
        require_room(self.location, _WRITE_MARGIN, staging=str(path) if path.exists() else None,
                     what="opening the staging area")
        try:
            self._env = lmdb.open(str(path), map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                                  metasync=True, sync=True, readahead=False, meminit=False)
            self._dbs = {name.decode(): self._env.open_db(name) for name in _DBS}
        except lmdb.Error as exc:
            self._close()
            raise self._write_error(exc, "opening the staging area", _WRITE_MARGIN) from exc

    def _write_error(self, exc, what: str, needed: int) -> StoreError:
        """DiskFullError when ``exc`` (an lmdb.Error) means the disk is full, StoreError else.

        A failed commit is aborted as a whole and LMDB never writes over a committed page, so
        the staging area keeps every batch committed before: a rerun resumes from there.
        """
        part = str(_partial(self.location))
        if is_disk_full(exc, self.location, needed):
            return disk_full(self.location, needed=needed, staging=part, what=what, cause=exc)
        return StoreError(f"{part}: LMDB write failed ({what}): {exc} (hint: rerun to resume, or pass "
                          f"--no-resume to start over)")

    def _transact(self, what: str, needed: int, fill, db=None) -> None:
        """Run ``fill(txn)`` in one write transaction, growing the map until it fits, after
        checking the disk has ``needed`` bytes free.

        Raises:
            DiskFullError: the disk has no room for it (checked first, or said by LMDB).
            StoreError: another LMDB error (the transaction is aborted, nothing of it written).
        """
        lmdb = _lmdb()
        require_room(self.location, needed, staging=str(_partial(self.location)), what=what)
        while True:
            try:
                with self._env.begin(write=True, db=db) as txn:
                    fill(txn)
                return
            except lmdb.MapFullError:
                # The transaction was aborted as a whole; grow the map and write it again.
                new_size = self._env.info()["map_size"] * 2
                log.debug("%s: growing LMDB map to %d bytes", self.location, new_size)
                self._env.set_mapsize(new_size)
            except lmdb.Error as exc:
                raise self._write_error(exc, what, needed) from exc

    def _open_staging(self, fingerprint: str, resume: bool) -> ResumeState:
        part = _partial(self.location)
        if part.exists() and not resume:
            log.info("discarding partial build %s (--no-resume)", part)
            shutil.rmtree(part)
        if part.exists():
            size = max(self._initial_map, 2 * (part / "data.mdb").stat().st_size)
            self._open_env(part, size)
            with self._env.begin(db=self._dbs["meta"]) as txn:
                raw = txn.get(b"progress")
            if raw is not None:
                state = ResumeState.from_dict(loads_bounded(raw))
                if state.fingerprint != fingerprint:
                    self._close()
                    raise ResumeMismatchError(
                        f"{part}: a partial build made from other inputs or options is in the way "
                        f"(hint: pass --no-resume to discard it, or rerun the original command)")
                self._truncate(state.next_index)
                log.info("resuming %s at input %d (%d records committed)", part, state.next_input,
                         state.next_index)
                return state
            self._truncate(0)
        else:
            part.mkdir(parents=True)
            self._open_env(part, self._initial_map)
        return ResumeState(fingerprint=fingerprint)

    def _truncate(self, count: int) -> None:
        """Drop records with index >= count (none, normally: records and state share a txn)."""
        self._transact("resuming", _WRITE_MARGIN, lambda txn: self._drop_from(txn, count))

    def _drop_from(self, txn, count: int) -> None:
        cur = txn.cursor(self._dbs["records"])
        stale = []
        if cur.set_range(_ikey(count)):
            stale = [bytes(k) for k in cur.iternext(values=False)]
        for k in stale:
            meta = loads_bounded(txn.get(k, db=self._dbs["records"]))
            txn.delete(k, db=self._dbs["records"])
            txn.delete(k, db=self._dbs["data"])
            txn.delete(meta["key"].encode(), db=self._dbs["keys"])

    def _write_batch(self, records: Sequence[Record], state: ResumeState) -> None:
        progress = json.dumps(state.to_dict()).encode()

        def fill(txn):
            for rec in records:
                ik = _ikey(rec.index)
                if not txn.put(rec.key.encode(), ik, db=self._dbs["keys"], overwrite=False):
                    raise StoreError(f"{self.location}: duplicate key {rec.key!r}")
                txn.put(ik, bytes(rec.data), db=self._dbs["data"])
                txn.put(ik, rec.meta_to_json(), db=self._dbs["records"])
            txn.put(b"progress", progress, db=self._dbs["meta"])

        # Every value takes whole pages (4 KiB) plus its header; fields, keys and the progress
        # record take a little more; the margin covers the B-tree pages the commit rewrites.
        need = sum(_pages(len(rec.data)) + 2 * len(rec.key.encode()) + 1024 for rec in records) + \
            2 * len(progress) + _WRITE_MARGIN
        self._transact(f"a batch of {len(records)} records", need, fill)

    def write_quarantine(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Quarantined bytes go to a ``quarantine`` database: 8-byte entry number -> bytes."""
        lmdb = _lmdb()
        try:
            db = self._env.open_db(b"quarantine")
        except lmdb.Error as exc:
            raise self._write_error(exc, "the quarantine area", _WRITE_MARGIN) from exc

        def fill(txn):
            for n, data in items:
                txn.put(_ikey(int(n)), bytes(data))

        need = sum(_pages(len(data)) for _, data in items) + _WRITE_MARGIN
        self._transact(f"{len(items)} quarantined record(s)", need, fill, db=db)

    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        with self._env.begin(db=self._dbs["records"]) as txn:
            for _, raw in txn.cursor():
                meta = loads_bounded(raw)
                yield meta["index"], meta["key"], meta["checksum"]

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        lmdb = _lmdb()
        part, final = _partial(self.location), Path(self.location)
        if os.path.lexists(final) and not overwrite:
            # Checked before the metadata goes in, so the partial build stays resumable.
            raise UsageError(f"{final} exists (hint: --overwrite replaces it)")
        raw = metadata.to_json()

        def fill(txn):
            txn.delete(b"progress")
            txn.put(b"metadata", raw)

        self._transact("the store metadata", _pages(len(raw)) + _WRITE_MARGIN, fill, db=self._dbs["meta"])
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise self._write_error(exc, "the store metadata", _WRITE_MARGIN) from exc
        self._close()
        old = None
        if os.path.lexists(final):
            # A fresh name: a "<out>.old" of the user's (a backup, say) is never touched.
            old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex[:12]}")
            os.rename(final, old)
        # rename(2) is atomic: readers see either no store or the whole store. (Replacing one
        # leaves a moment with neither: the old store then waits in <out>.old-*.)
        os.rename(part, final)
        if old is not None:
            remove_path(old)

    def _close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


# py-lmdb allows one open handle per environment file per process, but users open one store
# from several Datasets (train/val views, a verify next to a loader). Readers therefore share
# one read-only environment per data file, reference-counted. A forked child inherits the
# parent's table; it closes those handles (read-only and lock-free, so the parent is not
# disturbed) before opening its own.
_SHARED_ENVS: dict = {}
_SHARED_PID = os.getpid()
# Readers opened from several threads at once (readers.gpu.RawReader) must not both open the
# environment (py-lmdb: "already open in this process") nor lose a reference count.
_SHARED_LOCK = threading.RLock()


def _forget_inherited_envs() -> None:
    global _SHARED_PID
    if _SHARED_PID == os.getpid():
        return
    for env, _, _ in _SHARED_ENVS.values():
        env.close()
    _SHARED_ENVS.clear()
    _SHARED_PID = os.getpid()


def _acquire_env(location: str):
    """(env, dbs, file id) for a read-only environment, shared within this process."""
    with _SHARED_LOCK:
        return _acquire_env_locked(location)


def _acquire_env_locked(location: str):
    lmdb = _lmdb()
    _forget_inherited_envs()
    for _ in range(_OPEN_ATTEMPTS):
        fid = _file_id(location)
        entry = _SHARED_ENVS.get(fid)
        if entry is not None:
            break
        env = lmdb.open(location, readonly=True, lock=False, readahead=False,
                        max_dbs=_MAX_DBS, subdir=True, meminit=False)
        if _file_id(location) != fid:
            # A publish renamed another store onto the path while it opened: the env may map
            # either file, and the table is keyed by file. Open again.
            env.close()
            continue
        try:
            dbs = {name.decode(): env.open_db(name, create=False) for name in _DBS}
        except lmdb.Error:
            env.close()
            raise
        entry = _SHARED_ENVS[fid] = [env, dbs, 0]
        break
    else:
        raise OSError(f"the store was replaced {_OPEN_ATTEMPTS} times while being opened")
    entry[2] += 1
    return entry[0], entry[1], fid


_OPEN_ATTEMPTS = 5


def _file_id(location: str) -> tuple:
    st = os.stat(Path(location) / "data.mdb")
    return st.st_dev, st.st_ino


def _release_env(fid) -> None:
    if _SHARED_PID != os.getpid():
        return  # inherited through fork: _forget_inherited_envs deals with it
    with _SHARED_LOCK:
        entry = _SHARED_ENVS.get(fid)
        if entry is not None:
            entry[2] -= 1
            if entry[2] <= 0:
                del _SHARED_ENVS[fid]
                entry[0].close()


def _map_start(addr: int, inode: int):
    """The address at which the file with ``inode`` is mapped, from the ``/proc/self/maps``
    region holding ``addr`` (minus that region's file offset); None where there is no such file."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi and int(parts[4]) == inode:
                    return lo - int(parts[2], 16)
    except (OSError, ValueError):
        return None
    return None


class LMDBReader(StoreReader):
    """Read-only view of a published LMDB store; decodes nothing (see ``readers``).

    Its metadata (and so its build id) and every record come from the one environment it opened:
    a publish renames a new folder onto the path, and the open map keeps the old file, so a
    reader never mixes two stores. Readers opened later (other processes, Datasets' re-opens)
    check the build id against the one first seen (:meth:`StoreReader.expect_build`).
    """

    def __init__(self, location: str, *, env_path: str | None = None, salvage: bool = False):
        """``env_path``: read the environment there (a padded copy made by salvage) while
        messages keep naming ``location``. ``salvage``: see :meth:`Store.open_salvage`."""
        self.location = str(location)
        self.salvage_problems = []
        path = Path(env_path or location)
        if not (path / "data.mdb").is_file():
            hint = " (a build is in progress or was interrupted; rerun it to resume)" \
                if _partial(location).exists() else ""
            raise StoreError(f"{location}: no LMDB store here{hint}")
        lmdb = _lmdb()
        self._fid = None
        self._pid = os.getpid()
        # The size LMDB's meta pages need, read once: checked here (mapping a file cut short would
        # SIGBUS on the first page past the end) and before each read (see _begin). A salvage
        # reader of a padded copy (env_path) may go on without it.
        self._data_fh, self._need = None, 0
        try:
            self._need, have = expected_data_size(path / "data.mdb")
        except StoreError:
            if env_path is None or not salvage:
                raise
        else:
            cut = _cut_short_message(location, self._need, have) if env_path is None else None
            if cut:
                raise StoreError(cut)
            try:
                self._data_fh = open(path / "data.mdb", "rb")
            except OSError:
                if not salvage:
                    raise
        try:
            self._env, self._dbs, self._fid = _acquire_env(str(path))
        except (lmdb.Error, OSError) as exc:
            self.close()
            raise StoreError(f"{location}: cannot open LMDB environment: {exc}") from exc
        present = None
        try:
            with self._begin() as txn:
                raw = txn.get(b"metadata", db=self._dbs["meta"])
                raw = None if raw is None else bytes(raw)
                # What the metadata's count is checked against (records may be lost from either).
                present = max(txn.stat(self._dbs[name])["entries"] for name in ("records", "data"))
        except lmdb.Error as exc:
            raw, why = None, f"store metadata unreadable: {exc}"
        else:
            why = "incomplete store (no metadata; the build did not finish)"
        try:
            if raw is None:
                raise StoreError(f"{location}: {why}")
            self.metadata = load_metadata(location, raw, present, "entries in its 'records' database")
        except StoreError as exc:
            if not salvage:
                self.close()
                raise
            self.salvage_problems.append(str(exc))
            slots = self._slots()   # a stray key far out must not make a count of it either
            self.metadata = StoreMetadata(format="lmdb", count=slots if present is None else
                                          min(slots, count_limit(present)), label_schema="none",
                                          class_names=[], build_options={}, index_checksum="")

    def _begin(self, **kw):
        """A read transaction, once ``data.mdb`` is seen to be no shorter than when this reader
        opened it. LMDB reads through a memory map, and reading a map past the end of a file cut
        short (truncated by another process, a full disk's failed copy) raises SIGBUS, which
        kills the process; the check (one ``fstat``) turns that into an error naming the store.
        A cut made between the check and the read still crashes: this narrows the window to one
        batch's read, it cannot close it.

        Raises:
            StoreError: the file is now shorter than LMDB's meta pages said at open.
        """
        fh = self._data_fh
        if fh is not None:
            have = os.fstat(fh.fileno()).st_size
            if have < self._need:
                raise StoreError(f"{self.location}: store file cut short while open: data.mdb now holds "
                                 f"{have} bytes, {self._need} when it was opened ({self._need - have} bytes "
                                 f"missing); reading on would crash the process (hint: packer verify)")
        return self._env.begin(**kw)

    def _slots(self) -> int:
        """1 + the highest record index present in any per-record database (salvage)."""
        top = -1
        with self._begin() as txn:
            for name in ("records", "data"):
                cur = txn.cursor(self._dbs[name])
                if cur.last():
                    top = max(top, struct.unpack(">Q", bytes(cur.key()))[0] if len(cur.key()) == 8 else -1)
        return top + 1

    def quarantine_bytes(self, n: int) -> bytes:
        lmdb = _lmdb()
        try:
            db = self._env.open_db(b"quarantine", create=False)
            with self._begin(db=db) as txn:
                raw = txn.get(_ikey(int(n)))
        except lmdb.Error as exc:
            raise StoreError(f"{self.location}: quarantine area unreadable: {exc}") from exc
        if raw is None:
            raise StoreError(f"{self.location}: quarantine entry {n} has no bytes")
        return bytes(raw)

    def __len__(self) -> int:
        try:
            with self._begin() as txn:
                return txn.stat(self._dbs["records"])["entries"]
        except _lmdb().Error as exc:
            raise StoreError(f"{self.location}: cannot count records: {exc}") from exc

    def _record(self, txn, index: int) -> Record:
        self._check_index(index)
        try:
            return self._read_record(txn, index)
        except _lmdb().Error as exc:   # a damaged page (e.g. the zeros of a salvaged short file)
            raise RecordError(self.location, f"#{index}", f"record unreadable: {exc}", index) from exc

    def _read_record(self, txn, index: int) -> Record:
        ik = _ikey(index)
        raw_meta = txn.get(ik, db=self._dbs["records"])
        if raw_meta is None:
            raise RecordError(self.location, f"#{index}", "record metadata is missing", index)
        try:
            meta = loads_bounded(raw_meta)
        except ValueError as exc:
            raise RecordError(self.location, f"#{index}", f"record metadata is not valid JSON: {exc}", index) from exc
        if not isinstance(meta, dict):
            raise RecordError(self.location, f"#{index}", "record metadata is not a JSON object", index)
        key = str(meta.get("key", f"#{index}"))
        data = txn.get(ik, db=self._dbs["data"])
        if data is None:
            raise RecordError(self.location, key, "image bytes are missing", index)
        try:
            rec = Record.from_meta(meta, bytes(data), self.metadata.label_schema)
        except (ValueError, TypeError) as exc:
            raise RecordError(self.location, key, f"record metadata is damaged: {exc}", index) from exc
        if rec.index != index:
            raise RecordError(self.location, key, f"record says index {rec.index}, stored at {index}", index)
        return rec

    def get(self, index: int) -> Record:
        with self._begin() as txn:
            return self._record(txn, int(index))

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.metadata.count:
            raise IndexError(f"{self.location}: index {index} out of range 0..{self.metadata.count - 1}")

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        # One read transaction (one MVCC snapshot) for the whole batch.
        with self._begin() as txn:
            return [self._record(txn, int(i)) for i in indices]

    def map_records(self, indices: Sequence[int], fn) -> list:
        """Zero-copy: ``record.data`` is a memoryview into the map, valid only inside ``fn``."""
        out = []
        with self._begin(buffers=True) as txn:
            for index in indices:
                self._check_index(int(index))
                ik = _ikey(int(index))
                try:
                    raw_meta = txn.get(ik, db=self._dbs["records"])
                    data = txn.get(ik, db=self._dbs["data"])
                except _lmdb().Error:
                    raw_meta = data = None
                try:
                    rec = None if raw_meta is None or data is None else Record.from_meta(
                        loads_bounded(raw_meta), data, self.metadata.label_schema)
                except (ValueError, TypeError):
                    rec = None
                if rec is None or rec.index != int(index):
                    rec = self._record(txn, int(index))  # raises the precise RecordError
                out.append(fn(rec))
        return out

    supports_map_data = True

    def data_file(self) -> tuple:
        """``(path of data.mdb, its file identity (st_dev, st_ino))``: the file this reader maps."""
        return str(Path(self._env.path()) / "data.mdb"), self._fid

    def file_offset(self, view) -> int | None:
        """Where a zero-copy value view handed out by this reader (``map_records`` /
        ``map_data``) starts in ``data.mdb``, or None where that cannot be told (the map's start is
        read once from ``/proc/self/maps``, Linux). Readers that keep these offsets read the
        bytes later straight from their own map of the file (``readers.gpu.raw.RecordFacts``),
        without an LMDB call per record."""
        import numpy as np

        addr = int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0
        if not addr:
            return None
        base = getattr(self, "_map_base", None)
        if base is None:
            base = self._map_base = _map_start(addr, self._fid[1]) or False
        return addr - base if base is not False else None

    def map_data(self, indices: Sequence[int], fn) -> list:
        """Zero-copy bytes only (one ``get`` per record, in one read transaction): see
        :meth:`StoreReader.map_data`. A missing or unreadable record raises the precise RecordError."""
        out = []
        count = self.metadata.count
        data_db = self._dbs["data"]
        with self._begin(buffers=True) as txn:
            for index in indices:
                if not 0 <= index < count:
                    self._check_index(int(index))
                try:
                    data = txn.get(struct.pack(">Q", index), db=data_db)
                except _lmdb().Error:
                    data = None
                if data is None:
                    self._record(txn, int(index))  # raises the precise RecordError
                    raise RecordError(self.location, f"#{index}", "record data is missing", int(index))
                out.append(fn(index, data))
        return out

    def read_labels(self, batch: int = 1024) -> list:
        """Labels from the ``records`` database (JSON metadata only; image bytes are not read)."""
        labels = [None] * self.metadata.count
        with self._begin(db=self._dbs["records"], buffers=True) as txn:
            for k, v in txn.cursor():
                i = struct.unpack(">Q", bytes(k))[0] if len(k) == 8 else -1
                if not 0 <= i < self.metadata.count:
                    continue
                try:
                    rec = Record.from_meta(loads_bounded(v), b"", self.metadata.label_schema)
                except (ValueError, TypeError) as exc:
                    raise RecordError(self.location, f"#{i}", f"record metadata is damaged: {exc}", i) from exc
                if not rec.meta_ok():  # the label is covered by the record's metadata checksum
                    raise RecordError(self.location, rec.key, "record checksum mismatch: label or record "
                                      "fields are damaged", i)
                labels[i] = rec.label
        return labels

    def index_of(self, key: str) -> int:
        try:
            with self._begin(db=self._dbs["keys"]) as txn:
                raw = txn.get(key.encode())
        except _lmdb().Error as exc:
            raise StoreError(f"{self.location}: key index unreadable: {exc}") from exc
        if raw is None:
            raise KeyError(key)
        return struct.unpack(">Q", raw)[0]

    def check_structure(self) -> list[str]:
        try:
            return self._check_structure()
        except _lmdb().Error as exc:
            return [f"{self.location}: LMDB databases unreadable: {exc}"]

    def _check_structure(self) -> list[str]:
        problems = list(self.salvage_problems)
        with self._begin() as txn:
            n_rec = txn.stat(self._dbs["records"])["entries"]
            n_data = txn.stat(self._dbs["data"])["entries"]
            n_keys = txn.stat(self._dbs["keys"])["entries"]
            for name, n in (("records", n_rec), ("data", n_data), ("keys", n_keys)):
                if n != self.metadata.count:
                    problems.append(f"{self.location}: '{name}' database holds {n} entries, metadata says {self.metadata.count}")
            for k, v in txn.cursor(self._dbs["keys"]):
                idx = struct.unpack(">Q", v)[0] if len(v) == 8 else -1
                if not 0 <= idx < self.metadata.count:
                    problems.append(f"{self.location}: key {bytes(k).decode(errors='replace')!r} points to "
                                    f"index {idx}, outside 0..{self.metadata.count - 1}")
                    continue
                raw = txn.get(v, db=self._dbs["records"])
                if raw is not None:
                    try:
                        meta = loads_bounded(raw)
                    except ValueError:
                        continue  # reported per record by verify
                    if not isinstance(meta, dict) or meta.get("key") != bytes(k).decode(errors="replace"):
                        problems.append(f"{self.location}: key {bytes(k).decode(errors='replace')!r} points to "
                                        f"index {idx}, whose record has another key")
        return problems

    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in Path(self.location).iterdir() if f.is_file())

    def close(self) -> None:
        fid, self._fid = getattr(self, "_fid", None), None
        self._env = None
        fh, self._data_fh = getattr(self, "_data_fh", None), None
        if fh is not None:
            fh.close()
        tmp, self._salvage_copy = getattr(self, "_salvage_copy", None), None
        # A reader inherited through fork must not release the child's own handle to the
        # same file: only the process that acquired a reference gives it back.
        if fid is not None and getattr(self, "_pid", None) == os.getpid():
            _release_env(fid)
        if tmp is not None and getattr(self, "_pid", None) == os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)

    def discard_after_fork(self) -> None:
        self._env = self._fid = None
        _forget_inherited_envs()


# ---------------------------------------------------------------------------------------
# Salvage: read records from the pages of a damaged data.mdb without its B-tree
# ---------------------------------------------------------------------------------------
_P_LEAF, _P_OVERFLOW, _P_META = 0x02, 0x04, 0x08
_F_BIGDATA = 0x01
_PAGEHDR = 16


def scan_leaf_nodes(data_file) -> Iterator[tuple[bytes, int, int, bytes | None]]:
    """Every (key, value offset, value length, inline value) in the leaf pages of ``data_file``.

    LMDB page layout (lmdb/mdb.c, 64-bit): a 16-byte header (pgno, pad, flags, lower/upper or
    overflow page count), then on leaf pages ``lower - 16`` bytes of uint16 node offsets; a
    node is lo/hi (data size), flags, key size, key, then the data or, with F_BIGDATA, the
    8-byte number of the overflow page whose bytes follow its header. Stale copies of pages
    (copy-on-write) are yielded too: callers keep only values that pass their checksums.
    Pages past the end of the file (a file cut short) are skipped, never mapped.
    """
    need, size = expected_data_size(data_file)
    with open(data_file, "rb") as fh:
        fh.seek(40)
        psize = struct.unpack("<I", fh.read(4))[0]
        for pgno in range(2, size // psize):
            fh.seek(pgno * psize)
            page = fh.read(psize)
            flags = struct.unpack_from("<H", page, 10)[0]
            if flags & (_P_OVERFLOW | _P_META) or not flags & _P_LEAF or flags & 0x60:
                continue
            lower, upper = struct.unpack_from("<HH", page, 12)
            if not _PAGEHDR <= lower <= upper <= psize:
                continue
            for i in range((lower - _PAGEHDR) // 2):
                off = struct.unpack_from("<H", page, _PAGEHDR + 2 * i)[0]
                if off + 8 > psize:
                    continue
                lo, hi, nflags, ksize = struct.unpack_from("<HHHH", page, off)
                dsize = lo | (hi << 16)
                kstart = off + 8
                key = page[kstart:kstart + ksize]
                if nflags & _F_BIGDATA:
                    if kstart + ksize + 8 > psize:
                        continue
                    ov = struct.unpack_from("<Q", page, kstart + ksize)[0]
                    start = ov * psize + _PAGEHDR
                    if start + dsize <= size:
                        yield key, start, dsize, None
                elif kstart + ksize + dsize <= psize and not nflags & 0x06:
                    yield key, -1, dsize, page[kstart + ksize:kstart + ksize + dsize]


def _holds_nothing(location: str) -> bool:
    """True when the LMDB environment at ``location`` has no key at all (not even a named
    database): what a build killed before its first commit leaves in its staging folder."""
    try:
        env = _lmdb().open(str(location), readonly=True, lock=False, max_dbs=0, subdir=True)
    except (_lmdb().Error, OSError):
        return False
    try:
        return env.stat()["entries"] == 0
    finally:
        env.close()


def _has_packer_pages(data_file) -> bool:
    """True at the first leaf node that only packer writes: the store metadata or build
    progress (JSON objects under ``metadata`` / ``progress``), or a record's fields (a JSON
    object with ``key`` and ``checksum`` under an 8-byte index)."""
    try:
        for key, _, _, inline in scan_leaf_nodes(data_file):
            if inline is None or inline[:1] != b"{" or not (key in (b"metadata", b"progress") or len(key) == 8):
                continue
            try:
                d = loads_bounded(inline)
            except ValueError:
                continue
            if isinstance(d, dict) and (len(key) != 8 or ("key" in d and "checksum" in d)):
                return True
    except (StoreError, OSError, struct.error):
        return False
    return False


class LMDBScanReader(StoreReader):
    """Read-only view of what survives in a damaged ``data.mdb``, found by :func:`scan_leaf_nodes`.

    A record is readable only when a copy of its fields passes its meta checksum and a value
    under the same index key matches the record's data checksum, so nothing unverified is
    ever handed out. Metadata is the store's own when its page survived, else provisional.
    """

    def __init__(self, location: str, problem: str):
        self.location = str(location)
        self.salvage_problems = [problem]
        self._file = Path(location) / "data.mdb"
        metas: dict[int, list[dict]] = {}
        blobs: dict[int, list[tuple[int, int, bytes | None]]] = {}
        store_meta = None
        for key, off, n, inline in scan_leaf_nodes(self._file):
            if key == b"metadata" and inline is not None:
                try:
                    store_meta = StoreMetadata.from_json(inline)
                except (ValueError, TypeError):
                    pass
                continue
            if len(key) != 8:
                continue
            idx = struct.unpack(">Q", key)[0]
            if inline is not None and inline[:1] == b"{":
                try:
                    d = loads_bounded(inline)
                except ValueError:
                    d = None
                if isinstance(d, dict) and d.get("index") == idx and "checksum" in d:
                    metas.setdefault(idx, []).append(d)
                    continue
            blobs.setdefault(idx, []).append((off, n, inline))
        self._metas, self._blobs = metas, blobs
        # Most records may be lost with the pages, so the count is checked against the file the
        # meta pages describe too: every record takes more than 64 bytes of it (its JSON alone).
        need = expected_data_size(self._file)[0]
        limit = max(count_limit(len(metas)), need // 64)
        if store_meta is not None and store_meta.count > limit:
            self.salvage_problems.append(f"{location}: store metadata is damaged: field 'count' says "
                                         f"{store_meta.count} records, {len(metas)} were found in a file "
                                         f"meant to hold {need} bytes")
        elif store_meta is None:
            self.salvage_problems.append(f"{location}: store metadata lost with the damaged pages")
        if store_meta is None or store_meta.count > limit:
            store_meta = StoreMetadata(format="lmdb", count=min(max(metas, default=-1) + 1, limit),
                                       label_schema="none", class_names=[], build_options={},
                                       index_checksum="")
        self.metadata = store_meta

    def _value(self, off: int, n: int, inline) -> bytes:
        if inline is not None:
            return bytes(inline)
        with open(self._file, "rb") as fh:
            fh.seek(off)
            return fh.read(n)

    def __len__(self) -> int:
        return sum(1 for i in self._metas if i < self.metadata.count)

    def get(self, index: int) -> Record:
        index = int(index)
        if not 0 <= index < self.metadata.count:
            raise IndexError(f"{self.location}: index {index} out of range 0..{self.metadata.count - 1}")
        from ..records import checksum
        key = f"#{index}"
        for d in self._metas.get(index, []):
            try:
                rec = Record.from_meta(d, b"", self.metadata.label_schema)
            except (ValueError, TypeError, KeyError):
                continue
            key = rec.key
            if not rec.meta_ok():
                continue
            for off, n, inline in self._blobs.get(index, []):
                data = self._value(off, n, inline)
                if checksum(data) == rec.checksum:
                    rec.data = data
                    return rec
            raise RecordError(self.location, key, "image bytes lost with the damaged part of the file", index)
        raise RecordError(self.location, key, "record lost with the damaged part of the file", index)

    def index_of(self, key: str) -> int:
        for idx, ds in self._metas.items():
            if any(d.get("key") == key for d in ds):
                return idx
        raise KeyError(key)

    def check_structure(self) -> list[str]:
        return list(self.salvage_problems)

    def size_bytes(self) -> int:
        return self._file.stat().st_size

    def close(self) -> None:
        pass
