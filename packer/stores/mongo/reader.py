"""The MongoDB reader: a client made lazily in the process that reads (a new one after fork),
a batch fetched with one query, network errors retried within a time budget, and every record
checked to belong to the build whose metadata was read.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Sequence

from packer.core.errors import RecordError, StoreError, UnreachableError
from packer.core.records import Record, StoreMetadata
from packer.stores.base import StoreReader, count_limit, load_metadata
from packer.stores.mongo.connection import (
    META_ID,
    CollectionNames,
    import_pymongo,
    new_client,
    retry_delay,
    short_message,
    store_error,
)
from packer.stores.mongo.location import MongoLocation

log = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_S = 10.0
DEFAULT_READ_RETRIES = 3


class MongoReader(StoreReader):
    """A published MongoDB store. The client is created lazily, once per process."""

    def __init__(self, loc: MongoLocation, *, timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                 retries: int = DEFAULT_READ_RETRIES, salvage: bool = False):
        self.location = loc.name
        self._loc = loc
        self._names = CollectionNames(loc.collection)
        self._timeout_s = float(timeout_s)
        self._retries = int(retries)
        self._client = None
        self._pid = None
        self._bucket = None
        self._attempt_s = 0.0
        self._reached = False   # the server answered once: a later network error is worth a warning
        self._lock, self._lock_pid = threading.Lock(), os.getpid()  # threads share one client
        self._salvage = salvage
        self.salvage_problems = []
        doc = self._call("reading the store metadata", lambda db: db[self._names.meta].find_one({"_id": META_ID}))
        try:
            self._read_metadata(doc)
        except StoreError as exc:
            if not salvage:
                raise
            self.salvage_problems.append(str(exc))
            rows = self._call("finding the highest record id", lambda db: list(
                db[self._names.final].find({}, {"_id": 1}).sort("_id", -1).limit(1)))
            top = int(rows[0]["_id"]) if rows and isinstance(rows[0]["_id"], int) else -1
            # a stray document far out must not make a count of its id either
            self.metadata = StoreMetadata(format="mongo", count=min(top + 1, count_limit(self._documents())),
                                          label_schema="none", class_names=[], build_options={},
                                          index_checksum="")
            self._build_id = None

    def __repr__(self) -> str:
        return f"MongoReader({self.location!r})"

    def _read_metadata(self, doc) -> None:
        if doc is None:
            names = set(self._call("listing collections", lambda db: db.list_collection_names()))
            if self._names.final in names:
                why = "incomplete store (no metadata; the build did not finish or is being replaced)"
            elif self._names.partial in names:
                why = "incomplete store (a build is in progress or was interrupted; rerun it to resume)"
            else:
                why = "no packer store here"
            raise StoreError(f"{self.location}: {why}")
        self.metadata = load_metadata(self.location, doc.get("json"), self._documents(),
                                      "documents in its collection")
        self._build_id = doc.get("build_id")
        if not self.metadata.build_id and isinstance(self._build_id, str):
            # Published before the metadata held it: the id the records carry is the store's.
            self.metadata.build_id = self._build_id

    def _documents(self) -> int:
        """Record documents in the collection, from the server's collection statistics (cheap)."""
        return self._call("counting records", lambda db: db[self._names.final].estimated_document_count())

    # -- connection -----------------------------------------------------------------------
    def _db(self):
        pid = os.getpid()
        if self._client is None or self._pid != pid:
            if self._lock_pid != pid:
                # A lock copied by fork may have been held by a parent thread: use a new one.
                self._lock, self._lock_pid = threading.Lock(), pid
            with self._lock:
                if self._client is None or self._pid != pid:
                    self._connect(pid)
        return self._client[self._loc.db]

    def _connect(self, pid: int) -> None:
        """Make this process's client; never reuse one made in another process (fork).

        A dead server shows up in server selection, so each attempt gets a share of the
        budget there; a slow answer is not a dead server, so a socket read may take it all.
        """
        backoff = sum(retry_delay(k) for k in range(1, self._retries + 1))
        attempt_ms = max(200, int(1000 * (self._timeout_s - backoff) / (self._retries + 1)))
        self._attempt_s = attempt_ms / 1000
        self._client = new_client(self._loc, serverSelectionTimeoutMS=attempt_ms, connectTimeoutMS=attempt_ms,
                               socketTimeoutMS=int(1000 * self._timeout_s), retryReads=False)
        self._bucket = None
        self._pid = pid

    def _call(self, what: str, fn):
        """``fn(db)``, retried on network errors with backoff until ``timeout`` is spent."""
        pymongo = import_pymongo()
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                result = fn(self._db())
                self._reached = True
                return result
            except pymongo.errors.ConnectionFailure as exc:
                attempt += 1
                elapsed = time.monotonic() - start
                delay = retry_delay(attempt)
                # No retry that could not finish inside the budget (pymongo's own selection
                # timeout runs a little over its setting).
                if attempt > self._retries or elapsed + delay + self._attempt_s > self._timeout_s:
                    raise UnreachableError(
                        f"{self.location}: cannot reach the MongoDB server (unreachable while {what}, "
                        f"{attempt} attempt(s) in {elapsed:.1f} s): {short_message(exc)}") from exc
                # Before the server ever answered, the final error says how many attempts were
                # made: the retries are detail (a command that cannot start prints one line).
                log.log(logging.WARNING if self._reached else logging.INFO, "%s: %s while %s; retrying in %.1f s",
                        self.location, type(exc).__name__, what, delay)
                time.sleep(delay)
            except pymongo.errors.PyMongoError as exc:
                raise store_error(self._loc, what, exc) from exc

    def __getstate__(self):
        # Picklable for spawn workers: the client stays behind, the copy makes its own.
        d = dict(self.__dict__)
        d.update(_client=None, _pid=None, _bucket=None, _lock=None, _lock_pid=None)
        return d

    # -- StoreReader ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self._call("counting records", lambda db: db[self._names.final].count_documents({}))

    def get(self, index: int) -> Record:
        return self.get_many([index])[0]

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        idx = [int(i) for i in indices]
        for i in idx:
            if not 0 <= i < self.metadata.count:
                raise IndexError(f"{self.location}: index {i} out of range 0..{self.metadata.count - 1}")
        if not idx:
            return []
        wanted = list(dict.fromkeys(idx))
        docs = self._call(f"reading {len(wanted)} record(s)",
                          lambda db: list(db[self._names.final].find({"_id": {"$in": wanted}})))
        by_id = {d["_id"]: d for d in docs}
        return [self._record(by_id.get(i), i) for i in idx]

    def read_labels(self, batch: int = 4096) -> list:
        """Labels from the record documents without their image bytes (projection), checked
        against each record's metadata checksum."""
        docs = self._call("reading labels", lambda db: list(
            db[self._names.final].find({}, {"data": 0}).sort("_id", 1).batch_size(batch)))
        labels = [None] * self.metadata.count
        for doc in docs:
            index = doc.get("_id")
            if not isinstance(index, int) or not 0 <= index < self.metadata.count:
                continue
            if doc.get("b") != self._build_id:
                raise StoreError(f"{self.location}: record {index} belongs to another build: the store was "
                                 f"replaced while open (reopen it)")
            try:
                rec = Record.from_meta(dict(doc, index=index), b"", self.metadata.label_schema)
            except (KeyError, ValueError, TypeError) as exc:
                raise RecordError(self.location, doc.get("key", f"#{index}"),
                                  f"record document is damaged: {exc}", index) from exc
            if not rec.meta_ok():
                raise RecordError(self.location, rec.key, "record checksum mismatch: label or record "
                                  "fields are damaged", index)
            labels[index] = rec.label
        return labels

    def _record(self, doc, index: int) -> Record:
        if doc is None:
            raise RecordError(self.location, f"#{index}", "record document is missing", index)
        key = doc.get("key", f"#{index}")
        if doc.get("b") != self._build_id and not self._salvage:
            raise StoreError(f"{self.location}: record {index} belongs to another build: the store was "
                             f"replaced while open (reopen it)")
        if doc.get("gridfs"):
            data = self._gridfs_read(index, key)
        else:
            data = doc.get("data")
            if not isinstance(data, bytes):
                raise RecordError(self.location, key, "image bytes are missing", index)
        meta = dict(doc, index=doc["_id"])
        try:
            return Record.from_meta(meta, data, self.metadata.label_schema)
        except (KeyError, ValueError, TypeError) as exc:
            raise RecordError(self.location, key, f"record document is damaged: {exc}", index) from exc

    def _gridfs_read(self, index: int, key: str) -> bytes:
        import gridfs

        def read(db):
            if self._bucket is None:
                self._bucket = gridfs.GridFSBucket(db, bucket_name=self._names.bucket)
            with self._bucket.open_download_stream(index) as stream:
                if (stream.metadata or {}).get("b") != self._build_id and not self._salvage:
                    raise StoreError(f"{self.location}: GridFS file of record {index} belongs to another "
                                     f"build: the store was replaced while open (reopen it)")
                return stream.read()

        try:
            return self._call(f"reading record {index} from GridFS", read)
        except StoreError as exc:
            if isinstance(exc.__cause__, gridfs.errors.NoFile):
                raise RecordError(self.location, key, "GridFS file is missing", index) from exc
            if isinstance(exc.__cause__, gridfs.errors.CorruptGridFile):
                raise RecordError(self.location, key, f"GridFS file is damaged: {exc.__cause__}", index) from exc
            raise

    def index_of(self, key: str) -> int:
        doc = self._call("looking up a key",
                         lambda db: db[self._names.final].find_one({"key": key}, {"_id": 1}))
        if doc is None:
            raise KeyError(key)
        return int(doc["_id"])

    def check_structure(self) -> list[str]:
        return self.salvage_problems + self._call("checking the store structure", self._check)

    def quarantine_bytes(self, n: int) -> bytes:
        doc = self._call("reading the quarantine area",
                         lambda db: db[self._names.quarantine].find_one({"_id": int(n)}))
        if doc is None or not isinstance(doc.get("data"), bytes):
            raise StoreError(f"{self.location}: quarantine entry {n} has no bytes")
        return doc["data"]

    def _check(self, db) -> list[str]:
        n, where, count = self._names, self.location, self.metadata.count
        coll = db[n.final]
        problems = []
        rows = list(coll.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}, "lo": {"$min": "$_id"},
                                                "hi": {"$max": "$_id"}}}]))
        got = rows[0]["n"] if rows else 0
        if got != count:
            problems.append(f"{where}: collection holds {got} documents, metadata says {count}")
        non_int = coll.count_documents({"_id": {"$not": {"$type": ["int", "long"]}}})
        if non_int:
            problems.append(f"{where}: {non_int} document(s) with a non-integer _id")
        elif got and (rows[0]["lo"] != 0 or rows[0]["hi"] != got - 1):
            # _id is unique, so N integer ids with min 0 and max N-1 have no gaps.
            problems.append(f"{where}: record ids span {rows[0]['lo']}..{rows[0]['hi']} for {got} "
                            f"documents: expected 0..{got - 1} without gaps")
        if not any(ix.get("unique") and list(ix["key"]) == ["key"] for ix in coll.list_indexes()):
            problems.append(f"{where}: the unique index on 'key' is missing")
        foreign = coll.count_documents({"b": {"$ne": self._build_id}})
        if foreign:
            problems.append(f"{where}: {foreign} document(s) from another build")
        in_gridfs = coll.count_documents({"gridfs": True})
        files = db[n.bucket_colls(n.bucket)[0]].count_documents({})
        if in_gridfs != files:
            problems.append(f"{where}: {in_gridfs} record(s) point to GridFS, the bucket holds {files} file(s)")
        return problems

    def size_bytes(self) -> int:
        """Bytes of the store's collections as the server reports them (collStats): per
        collection the larger of ``size`` (BSON data) and ``storageSize`` (on disk).

        mongod's ``storageSize`` only moves at WiredTiger checkpoints (a minute apart), so a
        fresh store would read as a few KiB; JPEG bytes barely compress, so once checkpointed the
        two agree. Falls back to the sum of record sizes when collStats is refused.
        """
        def size(db):
            n = self._names
            names = set(db.list_collection_names())
            total = 0
            for c in (n.final, n.meta, *n.bucket_colls(n.bucket)):
                if c in names:
                    st = db.command("collStats", c)
                    total += max(int(st.get("storageSize", 0)), int(st.get("size", 0)))
            return total

        try:
            return self._call("reading collection sizes", size)
        except StoreError as exc:
            if not isinstance(exc.__cause__, import_pymongo().errors.OperationFailure):
                raise
            rows = self._call("summing record sizes", lambda db: list(db[self._names.final].aggregate(
                [{"$group": {"_id": None, "s": {"$sum": "$size"}}}])))
            return int(rows[0]["s"]) if rows else 0

    def discard_after_fork(self) -> None:
        # The parent's client shares its sockets with the parent: closing it here would send
        # endSessions down the parent's connections. Drop it unclosed; _db() makes our own.
        self._client, self._bucket, self._pid = None, None, None

    def close(self) -> None:
        client, self._client = self._client, None
        self._bucket = None
        if client is not None and self._pid == os.getpid():
            client.close()
