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
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import DependencyError, RecordError, ResumeMismatchError, StoreError, UsageError
from ..records import Record, StoreMetadata
from . import register_store
from .base import ResumeState, Store, StoreReader, StoreWriter, partial_location, remove_path

log = logging.getLogger(__name__)

_DBS = (b"data", b"records", b"keys", b"meta")
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


class LMDBWriter(StoreWriter):
    """Builds ``<location>.partial`` and renames it onto ``location`` at publish."""

    def __init__(self, location: str, map_size: int = _INITIAL_MAP, **kw):
        super().__init__(location, **kw)
        self._initial_map = max(1 << 16, int(map_size))
        self._env = None
        self._dbs = {}

    def _open_env(self, path: Path, map_size: int):
        lmdb = _lmdb()
        self._env = lmdb.open(str(path), map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                              metasync=True, sync=True, readahead=False, meminit=False)
        self._dbs = {name.decode(): self._env.open_db(name) for name in _DBS}

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
                state = ResumeState.from_dict(json.loads(raw))
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
        with self._env.begin(write=True) as txn:
            cur = txn.cursor(self._dbs["records"])
            stale = []
            if cur.set_range(_ikey(count)):
                stale = [bytes(k) for k in cur.iternext(values=False)]
            for k in stale:
                meta = json.loads(txn.get(k, db=self._dbs["records"]))
                txn.delete(k, db=self._dbs["records"])
                txn.delete(k, db=self._dbs["data"])
                txn.delete(meta["key"].encode(), db=self._dbs["keys"])

    def _write_batch(self, records: Sequence[Record], state: ResumeState) -> None:
        lmdb = _lmdb()
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for rec in records:
                        ik = _ikey(rec.index)
                        if not txn.put(rec.key.encode(), ik, db=self._dbs["keys"], overwrite=False):
                            raise StoreError(f"{self.location}: duplicate key {rec.key!r}")
                        txn.put(ik, bytes(rec.data), db=self._dbs["data"])
                        txn.put(ik, rec.meta_to_json(), db=self._dbs["records"])
                    txn.put(b"progress", json.dumps(state.to_dict()).encode(), db=self._dbs["meta"])
                return
            except lmdb.MapFullError:
                # The transaction was aborted as a whole; grow the map and write it again.
                new_size = self._env.info()["map_size"] * 2
                log.debug("%s: growing LMDB map to %d bytes", self.location, new_size)
                self._env.set_mapsize(new_size)

    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        with self._env.begin(db=self._dbs["records"]) as txn:
            for _, raw in txn.cursor():
                meta = json.loads(raw)
                yield meta["index"], meta["key"], meta["checksum"]

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        lmdb = _lmdb()
        part, final = _partial(self.location), Path(self.location)
        if os.path.lexists(final) and not overwrite:
            # Checked before the metadata goes in, so the partial build stays resumable.
            raise UsageError(f"{final} exists (hint: --overwrite replaces it)")
        while True:
            try:
                with self._env.begin(write=True, db=self._dbs["meta"]) as txn:
                    txn.delete(b"progress")
                    txn.put(b"metadata", metadata.to_json())
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self._env.sync(True)
        self._close()
        old = None
        if os.path.lexists(final):
            old = final.with_name(final.name + ".old")
            remove_path(old)
            os.rename(final, old)
        # rename(2) is atomic: readers see either no store or the whole store. (Replacing one
        # leaves a moment with neither: the old store then waits in <out>.old.)
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
    lmdb = _lmdb()
    _forget_inherited_envs()
    st = os.stat(Path(location) / "data.mdb")
    fid = (st.st_dev, st.st_ino)
    entry = _SHARED_ENVS.get(fid)
    if entry is None:
        env = lmdb.open(location, readonly=True, lock=False, readahead=False,
                        max_dbs=_MAX_DBS, subdir=True, meminit=False)
        try:
            dbs = {name.decode(): env.open_db(name, create=False) for name in _DBS}
        except lmdb.Error:
            env.close()
            raise
        entry = _SHARED_ENVS[fid] = [env, dbs, 0]
    entry[2] += 1
    return entry[0], entry[1], fid


def _release_env(fid) -> None:
    if _SHARED_PID != os.getpid():
        return  # inherited through fork: _forget_inherited_envs deals with it
    entry = _SHARED_ENVS.get(fid)
    if entry is not None:
        entry[2] -= 1
        if entry[2] <= 0:
            del _SHARED_ENVS[fid]
            entry[0].close()


class LMDBReader(StoreReader):
    """Read-only view of a published LMDB store; decodes nothing (see ``readers``)."""

    def __init__(self, location: str):
        self.location = str(location)
        path = Path(location)
        if not (path / "data.mdb").is_file():
            hint = " (a build is in progress or was interrupted; rerun it to resume)" \
                if _partial(location).exists() else ""
            raise StoreError(f"{location}: no LMDB store here{hint}")
        lmdb = _lmdb()
        self._fid = None
        self._pid = os.getpid()
        try:
            self._env, self._dbs, self._fid = _acquire_env(self.location)
        except (lmdb.Error, OSError) as exc:
            raise StoreError(f"{location}: cannot open LMDB environment: {exc}") from exc
        with self._env.begin(db=self._dbs["meta"]) as txn:
            raw = txn.get(b"metadata")
        if raw is None:
            self.close()
            raise StoreError(f"{location}: incomplete store (no metadata; the build did not finish)")
        try:
            self.metadata = StoreMetadata.from_json(raw)
        except (ValueError, TypeError) as exc:
            self.close()
            raise StoreError(f"{location}: store metadata is damaged: {exc}") from exc

    def __len__(self) -> int:
        with self._env.begin() as txn:
            return txn.stat(self._dbs["records"])["entries"]

    def _record(self, txn, index: int) -> Record:
        self._check_index(index)
        ik = _ikey(index)
        raw_meta = txn.get(ik, db=self._dbs["records"])
        if raw_meta is None:
            raise RecordError(self.location, f"#{index}", "record metadata is missing", index)
        try:
            meta = json.loads(bytes(raw_meta))
        except ValueError as exc:
            raise RecordError(self.location, f"#{index}", f"record metadata is not valid JSON: {exc}", index) from exc
        key = meta.get("key", f"#{index}")
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
        with self._env.begin() as txn:
            return self._record(txn, int(index))

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.metadata.count:
            raise IndexError(f"{self.location}: index {index} out of range 0..{self.metadata.count - 1}")

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        # One read transaction (one MVCC snapshot) for the whole batch.
        with self._env.begin() as txn:
            return [self._record(txn, int(i)) for i in indices]

    def map_records(self, indices: Sequence[int], fn) -> list:
        """Zero-copy: ``record.data`` is a memoryview into the map, valid only inside ``fn``."""
        out = []
        with self._env.begin(buffers=True) as txn:
            for index in indices:
                self._check_index(int(index))
                ik = _ikey(int(index))
                raw_meta = txn.get(ik, db=self._dbs["records"])
                data = txn.get(ik, db=self._dbs["data"])
                try:
                    rec = None if raw_meta is None or data is None else Record.from_meta(
                        json.loads(bytes(raw_meta)), data, self.metadata.label_schema)
                except (ValueError, TypeError):
                    rec = None
                if rec is None or rec.index != int(index):
                    rec = self._record(txn, int(index))  # raises the precise RecordError
                out.append(fn(rec))
        return out

    def index_of(self, key: str) -> int:
        with self._env.begin(db=self._dbs["keys"]) as txn:
            raw = txn.get(key.encode())
        if raw is None:
            raise KeyError(key)
        return struct.unpack(">Q", raw)[0]

    def check_structure(self) -> list[str]:
        problems = []
        with self._env.begin() as txn:
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
                        if json.loads(bytes(raw)).get("key") != bytes(k).decode():
                            problems.append(f"{self.location}: key {bytes(k).decode()!r} points to index "
                                            f"{idx}, whose record has another key")
                    except ValueError:
                        pass  # reported per record by verify
        return problems

    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in Path(self.location).iterdir() if f.is_file())

    def close(self) -> None:
        fid, self._fid = getattr(self, "_fid", None), None
        self._env = None
        # A reader inherited through fork must not release the child's own handle to the
        # same file: only the process that acquired a reference gives it back.
        if fid is not None and getattr(self, "_pid", None) == os.getpid():
            _release_env(fid)

    def discard_after_fork(self) -> None:
        self._env = self._fid = None
        _forget_inherited_envs()
