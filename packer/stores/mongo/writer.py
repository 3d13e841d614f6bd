"""The MongoDB writer: stages records in ``C.partial`` (GridFS above the threshold) with the
resume state written after each batch, redoes a batch through a replica-set failover, and at
publish renames the staging collections into place before writing the metadata document.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Iterator, Sequence

from packer.core.errors import ResumeMismatchError, StoreError, UsageError
from packer.core.records import Record, StoreMetadata, loads_bounded
from packer.core.uri import redact
from packer.stores.base import ResumeState, StoreWriter
from packer.stores.mongo.connection import (
    META_ID,
    CollectionNames,
    import_pymongo,
    new_client,
    retry_delay,
    short_message,
    store_error,
    target_exists,
)
from packer.stores.mongo.location import MongoLocation

log = logging.getLogger(__name__)

#: Records whose bytes exceed this go to GridFS (a document is at most 16 MiB, BSON included).
DEFAULT_GRIDFS_THRESHOLD = 15 << 20
#: Bytes per insert_many call: well under the 48 MB wire-message limit, bounds memory.
MAX_INSERT_BYTES = 32 << 20
DEFAULT_WRITE_TIMEOUT_S = 120.0

_STATE_ID = "state"


class MongoWriter(StoreWriter):
    """Builds ``C.partial`` and renames it onto ``C`` at publish (see :mod:`packer.stores.mongo`)."""

    def __init__(self, loc: MongoLocation, *, gridfs_threshold: int = DEFAULT_GRIDFS_THRESHOLD,
                 timeout_s: float = DEFAULT_WRITE_TIMEOUT_S, **kw):
        super().__init__(loc.name, **kw)
        self._loc = loc
        self._names = CollectionNames(loc.collection)
        self._threshold = int(gridfs_threshold)
        self._timeout_ms = int(timeout_s * 1000)
        self._client = None
        self._build_id: str | None = None

    def __repr__(self) -> str:
        return f"MongoWriter({self.location!r})"

    # -- helpers --------------------------------------------------------------------------
    def _db(self):
        if self._client is None:
            # w="majority": an acknowledged batch survives a failover (a w:1 write acknowledged
            # by a primary that then dies can be rolled back, losing committed records).
            self._client = new_client(self._loc, serverSelectionTimeoutMS=min(self._timeout_ms, 30000),
                                   connectTimeoutMS=10000, socketTimeoutMS=self._timeout_ms, w="majority")
        return self._client[self._loc.db]

    def _run(self, what: str, fn):
        try:
            return fn(self._db())
        except import_pymongo().errors.PyMongoError as exc:
            err = store_error(self._loc, what, exc)
            raise StoreError(f"{err} (committed batches are kept: rerun the build to resume)") from exc

    def _staging_colls(self) -> list[str]:
        n = self._names
        return [n.partial, n.partial_meta, *n.bucket_colls(n.partial_bucket), n.partial_quarantine]

    def write_quarantine(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Quarantined bytes go to ``C.quarantine`` documents ``{_id: n, data}`` (staged in
        ``C.partial.quarantine`` and renamed at publish like the records)."""
        def write(db):
            for n, data in items:
                db[self._names.partial_quarantine].replace_one(
                    {"_id": int(n)}, {"_id": int(n), "data": bytes(data)}, upsert=True)
        self._run("writing the quarantine area", write)

    def _drop_staging(self, db) -> None:
        for c in self._staging_colls():
            db.drop_collection(c)

    def _save_state(self, db, state: ResumeState) -> None:
        db[self._names.partial_meta].replace_one(
            {"_id": _STATE_ID},
            {"_id": _STATE_ID, "state": json.dumps(state.to_dict()), "build_id": self._build_id},
            upsert=True)

    # -- StoreWriter ----------------------------------------------------------------------
    def _open_staging(self, fingerprint: str, resume: bool) -> ResumeState:
        return self._run("opening the staging collection", lambda db: self._open(db, fingerprint, resume))

    def _open(self, db, fingerprint: str, resume: bool) -> ResumeState:
        n = self._names
        existing = set(db.list_collection_names())
        if not resume and existing & set(self._staging_colls()):
            log.info("%s: discarding partial build %s (--no-resume)", self.location, n.partial)
            self._drop_staging(db)
        doc = db[n.partial_meta].find_one({"_id": _STATE_ID}) if resume else None
        if doc is not None:
            state = ResumeState.from_dict(loads_bounded(doc["state"]))
            if state.fingerprint != fingerprint:
                raise ResumeMismatchError(
                    f"{self.location}: a partial build made from other inputs or options is in "
                    f"{self._loc.db}.{n.partial} (hint: pass --no-resume to discard it, or rerun "
                    f"the original command)")
            self._build_id = doc["build_id"]
            if state.next_index > 0 and n.partial not in existing:
                raise StoreError(
                    f"{self.location}: resume state says {state.next_index} records were committed but "
                    f"{self._loc.db}.{n.partial} is gone (an earlier publish was interrupted?) "
                    f"(hint: rerun with --no-resume --overwrite)")
            self._truncate(db, state.next_index)
            log.info("%s: resuming at input %d (%d records committed)", self.location,
                     state.next_input, state.next_index)
        else:
            # Leftovers without a state document hold nothing committed.
            self._drop_staging(db)
            self._build_id = uuid.uuid4().hex[:16]
            state = ResumeState(fingerprint=fingerprint)
            self._save_state(db, state)
        db[n.partial].create_index("key", unique=True, name="key_unique")  # creates the collection
        return state

    def _truncate(self, db, count: int) -> None:
        """Drop what a killed batch wrote after the last persisted state (index >= count)."""
        n = self._names
        files, chunks = n.bucket_colls(n.partial_bucket)
        dropped = db[n.partial].delete_many({"_id": {"$gte": count}}).deleted_count
        db[chunks].delete_many({"files_id": {"$gte": count}})
        db[files].delete_many({"_id": {"$gte": count}})
        if dropped:
            log.info("%s: dropped %d records written after the last checkpoint", self.location, dropped)

    def _write_batch(self, records: Sequence[Record], state: ResumeState) -> None:
        self._run("writing a batch", lambda db: self._write_retrying(db, records, state))

    def _write_retrying(self, db, records: Sequence[Record], state: ResumeState) -> None:
        """:meth:`_write`, redone after a replica-set failover (primary stepped down or gone) or a
        dropped connection, until ``timeout`` is spent. pymongo retries a write once; an election
        can outlast that. Before a redo, what the failed attempt may have written of this batch
        is deleted (records from the batch's first index on), so nothing is doubled or lost."""
        pymongo = import_pymongo()
        deadline = time.monotonic() + self._timeout_ms / 1000
        first = min((int(r.index) for r in records), default=None)
        attempt = 0
        while True:
            try:
                if attempt and first is not None:
                    self._truncate(db, first)
                return self._write(db, records, state)
            except (pymongo.errors.ConnectionFailure, pymongo.errors.WriteConcernError) as exc:
                attempt += 1
                delay = retry_delay(attempt)
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("%s: %s while writing a batch (%s); retrying in %.1f s", self.location,
                            type(exc).__name__, short_message(exc), delay)
                time.sleep(delay)

    def _write(self, db, records: Sequence[Record], state: ResumeState) -> None:
        import gridfs

        pymongo = import_pymongo()
        bucket = None
        chunk, chunk_recs, chunk_bytes = [], [], 0
        coll = db[self._names.partial]

        def insert():
            try:
                coll.insert_many(chunk, ordered=False)
            except pymongo.errors.BulkWriteError as exc:
                raise self._bulk_error(exc, chunk_recs) from exc

        for rec in records:
            data = bytes(rec.data)
            doc = rec.meta_dict()
            del doc["index"]
            doc.update(_id=int(rec.index), size=len(data), b=self._build_id)
            if len(data) > self._threshold:
                if bucket is None:
                    bucket = gridfs.GridFSBucket(db, bucket_name=self._names.partial_bucket)
                # File _id = record index: resume can find (and drop) blobs of a killed batch.
                bucket.upload_from_stream_with_id(int(rec.index), rec.key, data,
                                                  metadata={"b": self._build_id})
                doc.update(data=None, gridfs=True)
            else:
                doc.update(data=data, gridfs=False)
            chunk.append(doc)
            chunk_recs.append(rec)
            chunk_bytes += len(data) if not doc["gridfs"] else 0
            if chunk_bytes >= MAX_INSERT_BYTES:
                insert()
                chunk, chunk_recs, chunk_bytes = [], [], 0
        if chunk:
            insert()
        # The state goes last: after a kill, records beyond it are dropped by _truncate.
        self._save_state(db, state)

    def _bulk_error(self, exc, recs: Sequence[Record]) -> StoreError:
        errors = exc.details.get("writeErrors", [])
        dups = [e for e in errors if e.get("code") == 11000]
        if dups:
            e = dups[0]
            rec = recs[e["index"]] if 0 <= e.get("index", -1) < len(recs) else None
            which = f"key {rec.key!r} (index {rec.index})" if rec else f"{e.get('keyValue')}"
            more = f" and {len(dups) - 1} more" if len(dups) > 1 else ""
            return StoreError(
                f"{self.location}: duplicate {which}{more}: already in {self._loc.db}.{self._names.partial} "
                f"(server: {e.get('errmsg', '')}) (hint: rerun with --no-resume to start the build over)")
        first = errors[0] if errors else {}
        rec = recs[first["index"]] if 0 <= first.get("index", -1) < len(recs) else None
        which = f" key {rec.key!r} (index {rec.index}):" if rec else ""
        return StoreError(f"{self.location}:{which} {len(errors)} write error(s), first: "
                          f"{first.get('errmsg', exc)}")

    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        coll = self._db()[self._names.partial]
        try:
            for doc in coll.find({}, {"key": 1, "checksum": 1}).sort("_id", 1).batch_size(10000):
                yield doc["_id"], doc["key"], doc["checksum"]
        except import_pymongo().errors.PyMongoError as exc:
            raise store_error(self._loc, "reading the staging index", exc) from exc

    def new_build_id(self) -> str:
        # The id every record of this build already carries (field "b"): one id per store version.
        return self._build_id or super().new_build_id()

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        self._run("publishing the store", lambda db: self._do_publish(db, metadata, overwrite))

    def _do_publish(self, db, metadata: StoreMetadata, overwrite: bool) -> None:
        n = self._names
        replacing = target_exists(db, n)
        if replacing and not overwrite:
            raise UsageError(f"{self.location} exists (hint: --overwrite replaces it)")
        meta = _redacted_metadata(metadata)
        doc = {"_id": META_ID, "json": meta.to_json().decode(), "build_id": self._build_id,
               "format": meta.format, "count": meta.count, "created": meta.created,
               "packer_version": meta.packer_version}
        if replacing:
            # The old store stops being a store first: no reader can pair old metadata with
            # new records. Each rename below drops its target only once the new one is in place.
            db[n.meta].delete_one({"_id": META_ID})
        existing = set(db.list_collection_names())
        for src, dst in zip(n.bucket_colls(n.partial_bucket), n.bucket_colls(n.bucket)):
            if src in existing:
                db[src].rename(dst, dropTarget=overwrite)
            elif dst in existing:
                db.drop_collection(dst)  # the old store's blobs; the new one has none
        db[n.partial].rename(n.final, dropTarget=overwrite)
        if n.partial_quarantine in existing:
            db[n.partial_quarantine].rename(n.quarantine, dropTarget=True)
        elif n.quarantine in existing:
            db.drop_collection(n.quarantine)   # the old store's; the new one has none
        # The commit marker: one single-document write, last.
        db[n.meta].replace_one({"_id": META_ID}, doc, upsert=True)
        db.drop_collection(n.partial_meta)
        log.info("%s: published %d records", self.location, meta.count)

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


def _redacted_metadata(metadata: StoreMetadata) -> StoreMetadata:
    """``metadata`` with any connection-string password in its build options masked."""
    raw = metadata.to_json().decode()
    clean = redact(raw)
    return metadata if clean == raw else StoreMetadata.from_json(clean.encode())
