"""The LMDB writer: builds ``<out>.partial/`` one write transaction per batch (records and
resume state together), grows the map when a batch does not fit, checks the disk before each
commit, and renames the folder onto ``<out>`` at publish, its metadata written last.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator, Sequence

from packer.core.diskspace import disk_full, is_disk_full, require_room
from packer.core.errors import ResumeMismatchError, StoreError, UsageError
from packer.core.records import Record, StoreMetadata, loads_bounded
from packer.stores.base import ResumeState, StoreWriter, remove_path
from packer.stores.lmdb.layout import (
    DBS,
    INITIAL_MAP,
    MAX_DBS,
    WRITE_MARGIN,
    import_lmdb,
    index_key,
    page_bytes,
    partial_path,
)

log = logging.getLogger(__name__)


class LMDBWriter(StoreWriter):
    """Builds ``<location>.partial`` and renames it onto ``location`` at publish."""

    def __init__(self, location: str, map_size: int = INITIAL_MAP, **kw):
        super().__init__(location, **kw)
        self._initial_map = max(1 << 16, int(map_size))
        self._part = partial_path(location)     # the staging folder, renamed onto location at publish
        self._env = None
        self._dbs = {}

    def _open_env(self, path: Path, map_size: int):
        lmdb = import_lmdb()
        # The lock file is memory-mapped: touching a page of it on a full disk would SIGBUS.
        require_room(self.location, WRITE_MARGIN, staging=str(path) if path.exists() else None,
                     what="opening the staging area")
        try:
            self._env = lmdb.open(str(path), map_size=map_size, max_dbs=MAX_DBS, subdir=True,
                                  metasync=True, sync=True, readahead=False, meminit=False)
            self._dbs = {name.decode(): self._env.open_db(name) for name in DBS}
        except lmdb.Error as exc:
            self._close()
            raise self._write_error(exc, "opening the staging area", WRITE_MARGIN) from exc

    def _write_error(self, exc, what: str, needed: int) -> StoreError:
        """DiskFullError when ``exc`` (an lmdb.Error) means the disk is full, StoreError else.

        A failed commit is aborted as a whole and LMDB never writes over a committed page, so
        the staging area keeps every batch committed before: a rerun resumes from there.
        """
        part = str(self._part)
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
        lmdb = import_lmdb()
        require_room(self.location, needed, staging=str(self._part), what=what)
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
        part = self._part
        if part.exists() and not resume:
            log.info("discarding partial build %s (--no-resume)", part)
            shutil.rmtree(part)
        if part.exists():
            data = part / "data.mdb"     # absent after a kill between mkdir and LMDB's first write
            size = max(self._initial_map, 2 * data.stat().st_size) if data.exists() else self._initial_map
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
        self._transact("resuming", WRITE_MARGIN, lambda txn: self._drop_from(txn, count))

    def _drop_from(self, txn, count: int) -> None:
        cur = txn.cursor(self._dbs["records"])
        stale = []
        if cur.set_range(index_key(count)):
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
                ik = index_key(rec.index)
                if not txn.put(rec.key.encode(), ik, db=self._dbs["keys"], overwrite=False):
                    raise StoreError(f"{self.location}: duplicate key {rec.key!r}")
                txn.put(ik, bytes(rec.data), db=self._dbs["data"])
                txn.put(ik, rec.meta_to_json(), db=self._dbs["records"])
            txn.put(b"progress", progress, db=self._dbs["meta"])

        # Every value takes whole pages (4 KiB) plus its header; fields, keys and the progress
        # record take a little more; the margin covers the B-tree pages the commit rewrites.
        need = sum(page_bytes(len(rec.data)) + 2 * len(rec.key.encode()) + 1024 for rec in records) + \
            2 * len(progress) + WRITE_MARGIN
        self._transact(f"a batch of {len(records)} records", need, fill)

    def write_quarantine(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Quarantined bytes go to a ``quarantine`` database: 8-byte entry number -> bytes."""
        lmdb = import_lmdb()
        try:
            db = self._env.open_db(b"quarantine")
        except lmdb.Error as exc:
            raise self._write_error(exc, "the quarantine area", WRITE_MARGIN) from exc

        def fill(txn):
            for n, data in items:
                txn.put(index_key(int(n)), bytes(data))

        need = sum(page_bytes(len(data)) for _, data in items) + WRITE_MARGIN
        self._transact(f"{len(items)} quarantined record(s)", need, fill, db=db)

    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        with self._env.begin(db=self._dbs["records"]) as txn:
            for _, raw in txn.cursor():
                meta = loads_bounded(raw)
                yield meta["index"], meta["key"], meta["checksum"]

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        lmdb = import_lmdb()
        part, final = self._part, Path(self.location)
        if os.path.lexists(final) and not overwrite:
            # Checked before the metadata goes in, so the partial build stays resumable.
            raise UsageError(f"{final} exists (hint: --overwrite replaces it)")
        raw = metadata.to_json()

        def fill(txn):
            txn.delete(b"progress")
            txn.put(b"metadata", raw)

        self._transact("the store metadata", page_bytes(len(raw)) + WRITE_MARGIN, fill, db=self._dbs["meta"])
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise self._write_error(exc, "the store metadata", WRITE_MARGIN) from exc
        self._close()
        old = None
        if os.path.lexists(final):
            # A fresh name: a "<out>.old" of the user's (a backup, say) is never touched.
            old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex[:12]}")
            os.rename(final, old)
        # rename(2) is atomic: readers see either no store or the whole store. (Replacing one
        # leaves a moment with neither: the old store then waits in <out>.old-*.)
        try:
            os.rename(part, final)
        except OSError:
            if old is not None:   # the store that was there goes back: a failed publish changes nothing
                os.rename(old, final)
            raise
        if old is not None:
            remove_path(old)

    def _close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
