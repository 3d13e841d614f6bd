"""The LMDB reader: a published store read through the process's shared read-only environment,
checked against a data file cut short before every read (reading past its end would SIGBUS),
with zero-copy record access for the fast readers and the structure checks verify runs.
"""
from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Sequence

from packer.core.errors import RecordError, StoreError
from packer.core.records import Record, StoreMetadata, loads_bounded
from packer.stores.base import StoreReader, count_limit, load_metadata
from packer.stores.lmdb.envs import acquire_env, forget_inherited_envs, map_start, release_env
from packer.stores.lmdb.layout import cut_short_message, expected_data_size, import_lmdb, index_key, partial_path


def record_from_parts(location: str, label_schema, index: int, raw_meta, data) -> Record:
    """Record ``index`` of the LMDB store at ``location`` from its metadata bytes and image bytes
    (``data``: the bytes, or a callable that reads them once the metadata passed), checked as
    :meth:`LMDBReader.get` checks it; also what a ranged read of a copy in a bucket hands over."""
    if raw_meta is None:
        raise RecordError(location, f"#{index}", "record metadata is missing", index)
    try:
        meta = loads_bounded(raw_meta)
    except ValueError as exc:
        raise RecordError(location, f"#{index}", f"record metadata is not valid JSON: {exc}", index) from exc
    if not isinstance(meta, dict):
        raise RecordError(location, f"#{index}", "record metadata is not a JSON object", index)
    key = str(meta.get("key", f"#{index}"))
    data = data() if callable(data) else data
    if data is None:
        raise RecordError(location, key, "image bytes are missing", index)
    try:
        rec = Record.from_meta(meta, bytes(data), label_schema)
    except (ValueError, TypeError) as exc:
        raise RecordError(location, key, f"record metadata is damaged: {exc}", index) from exc
    if rec.index != index:
        raise RecordError(location, key, f"record says index {rec.index}, stored at {index}", index)
    return rec


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
                if partial_path(location).exists() else ""
            raise StoreError(f"{location}: no LMDB store here{hint}")
        lmdb = import_lmdb()
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
            cut = cut_short_message(location, self._need, have) if env_path is None else None
            if cut:
                raise StoreError(cut)
            try:
                self._data_fh = open(path / "data.mdb", "rb")
            except OSError as exc:   # gone since the check above: replaced by a publish, or removed
                if not salvage:
                    raise StoreError(f"{location}: no LMDB store here ({exc.strerror or exc}; a store being "
                                     f"replaced is absent for an instant: open it again)") from exc
        try:
            self._env, self._dbs, self._fid = acquire_env(str(path))
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
        lmdb = import_lmdb()
        try:
            db = self._env.open_db(b"quarantine", create=False)
            with self._begin(db=db) as txn:
                raw = txn.get(index_key(int(n)))
        except lmdb.Error as exc:
            raise StoreError(f"{self.location}: quarantine area unreadable: {exc}") from exc
        if raw is None:
            raise StoreError(f"{self.location}: quarantine entry {n} has no bytes")
        return bytes(raw)

    def __len__(self) -> int:
        try:
            with self._begin() as txn:
                return txn.stat(self._dbs["records"])["entries"]
        except import_lmdb().Error as exc:
            raise StoreError(f"{self.location}: cannot count records: {exc}") from exc

    def _record(self, txn, index: int) -> Record:
        self._check_index(index)
        try:
            return self._read_record(txn, index)
        except import_lmdb().Error as exc:   # a damaged page (e.g. the zeros of a salvaged short file)
            raise RecordError(self.location, f"#{index}", f"record unreadable: {exc}", index) from exc

    def _read_record(self, txn, index: int) -> Record:
        ik = index_key(index)
        return record_from_parts(self.location, self.metadata.label_schema, index,
                                 txn.get(ik, db=self._dbs["records"]), lambda: txn.get(ik, db=self._dbs["data"]))

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
                ik = index_key(int(index))
                try:
                    raw_meta = txn.get(ik, db=self._dbs["records"])
                    data = txn.get(ik, db=self._dbs["data"])
                except import_lmdb().Error:
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
        return self._env.path(), self._fid

    def file_offset(self, view) -> int | None:
        """Where a zero-copy value view handed out by this reader (``map_records`` /
        ``map_data``) starts in ``data.mdb``, or None where that cannot be told (the map's start is
        read once from ``/proc/self/maps``, Linux). Readers that keep these offsets read the
        bytes later straight from their own map of the file (``readers.raw.RecordFacts``),
        without an LMDB call per record."""
        import numpy as np

        addr = int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0
        if not addr:
            return None
        base = getattr(self, "_map_base", None)
        if base is None:
            base = self._map_base = map_start(addr, self._fid[1]) or False
        return addr - base if base is not False else None

    def record_extents(self):
        """``("data.mdb", (count, 4) uint64 array)``: each record's metadata and image bytes as
        (offset, length) in ``data.mdb`` (values lie contiguous in LMDB's pages), found from
        the zero-copy views of the map; None where :meth:`file_offset` cannot tell."""
        import numpy as np

        out = np.zeros((self.metadata.count, 4), dtype=np.uint64)
        with self._begin(buffers=True) as txn:
            for i in range(self.metadata.count):
                ik = index_key(i)
                meta, data = txn.get(ik, db=self._dbs["records"]), txn.get(ik, db=self._dbs["data"])
                if meta is None or data is None or not len(meta) or not len(data):
                    return None
                mo, do = self.file_offset(meta), self.file_offset(data)
                if mo is None or do is None:
                    return None
                out[i] = (mo, len(meta), do, len(data))
        return "data.mdb", out

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
                except import_lmdb().Error:
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
        except import_lmdb().Error as exc:
            raise StoreError(f"{self.location}: key index unreadable: {exc}") from exc
        if raw is None:
            raise KeyError(key)
        return struct.unpack(">Q", raw)[0]

    def check_structure(self) -> list[str]:
        try:
            return self._check_structure()
        except import_lmdb().Error as exc:
            return [f"{self.location}: LMDB databases unreadable: {exc}"]

    def _check_structure(self) -> list[str]:
        problems = list(self.salvage_problems)
        with self._begin() as txn:
            n_rec = txn.stat(self._dbs["records"])["entries"]
            n_data = txn.stat(self._dbs["data"])["entries"]
            n_keys = txn.stat(self._dbs["keys"])["entries"]
            for name, n in (("records", n_rec), ("data", n_data), ("keys", n_keys)):
                if n != self.metadata.count:
                    problems.append(f"{self.location}: '{name}' database holds {n} entries, metadata says "
                                    f"{self.metadata.count}")
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
            release_env(fid)
        if tmp is not None and getattr(self, "_pid", None) == os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)

    def discard_after_fork(self) -> None:
        self._env = self._fid = None
        forget_inherited_envs()
