"""MongoDB store: one document per record in a collection, metadata in its own collection.

Location: ``mongodb://[user:pass@]host[:port][,host2...]/DB/COLLECTION[?options]`` (or
``mongodb+srv://``). The last two path segments name the database and the collection; the
rest is the connection string handed to :class:`pymongo.MongoClient`. A ``uri`` option (CLI
``--uri``) or else the ``MONGODB_URI`` environment variable, when given, replaces the host,
credentials and options of the location (``mongodb:///DB/COLLECTION`` leaves them empty).
Passwords never appear in messages, logs, reports or ``repr()`` (``user:***@``, see
:func:`packer.uri.redact`); a user name or password must be percent-escaped (a ``/``, ``@`` or
``:`` in it is refused with a hint), and the scheme may be written in any case.

Layout, for a store at ``.../DB/C``::

    C                  {_id: index, key, data: BSON binary JPEG (null when in GridFS), gridfs,
                        size, label, width, height, channels, ..., checksum, b: build id}
                       + a unique index on ``key``
    C.gridfs.files     GridFS bucket for records above ``gridfs_threshold`` (file _id = index)
    C.gridfs.chunks
    C.meta             {_id: "metadata", json: StoreMetadata JSON, build_id, ...}: the commit
                       marker, written last. No metadata document = incomplete store.

A build writes ``C.partial`` (+ ``C.partial.gridfs.*``) and keeps its resume state in
``C.partial.meta``. ``publish`` renames the staging collections onto the final names (each
``renameCollection`` is atomic on the server) and then writes the metadata document, one
atomic single-document write. With ``overwrite`` the old metadata document is deleted first,
so no reader ever pairs old metadata with new records; every record carries the build id,
so a reader that was opened before the replacement raises instead of mixing two builds.

Readers create their ``MongoClient`` lazily in the process that uses them (a new one after
fork), fetch a whole batch with one ``find({"_id": {"$in": [...]}})``, and retry transient
network errors within a time budget (``timeout``), so a dead server never hangs a DataLoader.

Example:
    >>> from packer.stores import open_store                          # doctest: +SKIP
    >>> with open_store("mongodb://127.0.0.1:27017/datasets/train") as r:
    ...     recs = r.get_many([0, 1, 2])
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Iterator, Sequence

from ..errors import DependencyError, RecordError, ResumeMismatchError, StoreError, UsageError
from ..uri import redact
from ..records import Record, StoreMetadata, loads_bounded
from . import register_store
from .base import ResumeState, Store, StoreReader, StoreWriter, count_limit, load_metadata, parse_size

log = logging.getLogger(__name__)

SCHEMES = ("mongodb://", "mongodb+srv://")
#: Records whose bytes exceed this go to GridFS (a document is at most 16 MiB, BSON included).
DEFAULT_GRIDFS_THRESHOLD = 15 << 20
#: Bytes per insert_many call: well under the 48 MB wire-message limit, bounds memory.
MAX_INSERT_BYTES = 32 << 20
DEFAULT_READ_TIMEOUT_S = 10.0
DEFAULT_READ_RETRIES = 3
DEFAULT_WRITE_TIMEOUT_S = 120.0

_STATE_ID = "state"
_META_ID = "metadata"
_DB_FORBIDDEN = set('/\\. "$\0')


def _pymongo():
    try:
        import gridfs  # noqa: F401  (ships with pymongo)
        import pymongo
    except ImportError as exc:
        raise DependencyError("the MongoDB store needs pymongo (pip install 'packer-vision[mongo]')") from exc
    return pymongo


def _short(exc: BaseException) -> str:
    """A pymongo error message without its (long) topology dump, passwords masked."""
    return redact(str(exc).split(", Topology Description:")[0])


@dataclass(frozen=True)
class MongoLocation:
    """A parsed store location. ``client_uri`` may hold a password; ``server``, ``name`` and
    ``repr()`` never do."""

    client_uri: str
    db: str
    collection: str

    @property
    def server(self) -> str:
        return redact(self.client_uri)

    @property
    def name(self) -> str:
        base = self.client_uri.split("?")[0].rstrip("/")
        return redact(f"{base}/{self.db}/{self.collection}")

    def __repr__(self) -> str:
        return f"MongoLocation({self.name!r})"


_ESCAPE_HINT = ("hint: percent-escape / @ : ? # % and spaces in the user name and password, "
                "e.g. with urllib.parse.quote_plus")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/?#@\[\],]+)(:\d{1,5})?")


def _scheme(text: str) -> str | None:
    """The MongoDB scheme ``text`` starts with, lower-cased (a scheme is case-insensitive)."""
    head = text[:len("mongodb+srv://")].lower()
    return next((s for s in SCHEMES if head.startswith(s)), None)


def _check_netloc(netloc: str, shown: str) -> None:
    """UsageError unless ``netloc`` is ``[user[:password]@]host[:port][,host[:port]...]`` with the
    user name and password escaped: pymongo's own errors about a malformed one (a port that is
    not a number...) would repeat pieces of the password."""
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ("@" in userinfo or userinfo.count(":") > 1 or re.search(r"[\s/?#]|%(?![0-9A-Fa-f]{2})", userinfo)):
        raise UsageError(f"{shown}: the user name or password holds a character that must be escaped "
                         f"({_ESCAPE_HINT})")
    if hosts and not all(_HOST.fullmatch(h) for h in hosts.split(",")):
        raise UsageError(f"{shown}: cannot read the server list (expected host[:port][,host[:port]...]; "
                         f"{_ESCAPE_HINT})")


def parse_location(location: str, uri: str | None = None) -> MongoLocation:
    """Split ``mongodb://host/DB/COLLECTION[?opts]`` into a connection string, db and collection.

    ``uri`` (else ``$MONGODB_URI``) replaces the location's host, credentials and options. The
    scheme may be written in any case (``MongoDB://``). Messages show the location with its
    password masked (:func:`packer.uri.redact`).

    Raises:
        UsageError: not a ``mongodb://`` URL, no ``/DB/COLLECTION``, no host anywhere, or a user
            name or password with an unescaped ``/ @ : ? #``, ``%`` or space.
    """
    location = str(location)
    shown = redact(location)
    scheme = _scheme(location)
    if scheme is None:
        raise UsageError(f"{shown}: a MongoDB store location starts with mongodb:// or mongodb+srv://")
    rest = location[len(scheme):]
    netloc, slash, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    parts = [p for p in path.split("/") if p]
    if not slash or len(parts) != 2:
        hint = f"; {_ESCAPE_HINT}" if "@" in path else ""
        raise UsageError(f"{shown}: expected {scheme}host/DATABASE/COLLECTION "
                         f"(e.g. mongodb://127.0.0.1:27017/datasets/train{hint})")
    db, coll = parts
    if "@" in db:  # not shown: it is most likely the end of a password holding a "/"
        raise UsageError(f"{shown}: the database name holds '@' ({_ESCAPE_HINT})")
    if _DB_FORBIDDEN & set(db):
        raise UsageError(f"{shown}: database name {db!r} may not contain / \\ . space \" $")
    if "$" in coll or coll.startswith("system."):
        raise UsageError(f"{shown}: {coll!r} is not a usable collection name")
    _check_netloc(netloc, shown)
    uri = uri or os.environ.get("MONGODB_URI") or None
    if uri:
        uri_scheme = _scheme(uri)
        if uri_scheme is None:
            raise UsageError(f"{redact(uri)}: a MongoDB connection string starts with mongodb:// "
                             f"or mongodb+srv://")
        uri_rest = uri[len(uri_scheme):]
        _check_netloc(re.split(r"[/?]", uri_rest, maxsplit=1)[0], redact(uri))
        client_uri = uri_scheme + uri_rest
    elif not netloc:
        raise UsageError(f"{shown}: no server given (put one in the location, or pass "
                         f"--uri / set MONGODB_URI)")
    else:
        client_uri = f"{scheme}{netloc}/" + (f"?{query}" if query else "")
    return MongoLocation(client_uri, db, coll)


def _client(loc: MongoLocation, **defaults):
    """A MongoClient for ``loc``; ``defaults`` apply unless the URI sets the same option."""
    pymongo = _pymongo()
    given = loc.client_uri.partition("?")[2].lower()
    kwargs = {k: v for k, v in defaults.items() if f"{k.lower()}=" not in given}
    try:
        return pymongo.MongoClient(loc.client_uri, appname="packer", connect=False, **kwargs)
    except pymongo.errors.ConfigurationError as exc:
        raise UsageError(f"{loc.server}: bad MongoDB connection string: {_short(exc)}") from exc


def _parse_float(value, name: str, low: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"mongo: option {name} expects a number, got {value!r}") from None
    if v < low:
        raise UsageError(f"mongo: option {name} must be >= {low}, got {value!r}")
    return v


def _parse_bytes(value, name: str) -> int:
    """``1048576``, ``512K``, ``15M`` or ``1G`` -> bytes."""
    return parse_size(value, store="mongo", option=name)



class _Names:
    """Collection names of a store and of its staging area."""

    def __init__(self, coll: str):
        self.final = coll
        self.meta = f"{coll}.meta"
        self.bucket = f"{coll}.gridfs"
        self.partial = f"{coll}.partial"
        self.partial_meta = f"{coll}.partial.meta"
        self.partial_bucket = f"{coll}.partial.gridfs"
        self.quarantine = f"{coll}.quarantine"
        self.partial_quarantine = f"{coll}.partial.quarantine"
        self.journal = f"{coll}.repair-journal"

    def store_colls(self) -> list[str]:
        """Every collection of a published store, commit marker (``.meta``) first."""
        return [self.meta, self.final, *self.bucket_colls(self.bucket), self.quarantine]

    def bucket_colls(self, bucket: str) -> tuple[str, str]:
        return f"{bucket}.files", f"{bucket}.chunks"


def _error(loc: MongoLocation, what: str, exc: BaseException) -> StoreError:
    """A StoreError for a pymongo error, naming the (redacted) store and what was being done."""
    pymongo = _pymongo()
    if isinstance(exc, pymongo.errors.ConnectionFailure):
        return StoreError(f"{loc.name}: cannot reach the MongoDB server while {what}: {_short(exc)}")
    if isinstance(exc, pymongo.errors.OperationFailure):
        return StoreError(f"{loc.name}: the MongoDB server answered with an error while {what}: {_short(exc)}")
    return StoreError(f"{loc.name}: MongoDB error while {what}: {_short(exc)}")


@register_store
class MongoStore(Store):
    """A collection on a MongoDB server (plus ``.meta`` and ``.gridfs`` collections)."""

    name = "mongo"
    description = "MongoDB collection: one document per record, GridFS above 15 MiB (mongodb://host/db/collection)"
    writer_options = {
        "uri": "connection string replacing the location's host/credentials (default: $MONGODB_URI)",
        "gridfs_threshold": f"records larger than this go to GridFS (default {DEFAULT_GRIDFS_THRESHOLD >> 20}M)",
        "timeout": f"seconds before a write to an unresponsive server fails (default {DEFAULT_WRITE_TIMEOUT_S:.0f})",
    }
    reader_options = {
        "uri": "connection string replacing the location's host/credentials (default: $MONGODB_URI)",
        "timeout": f"seconds one read may take, retries included (default {DEFAULT_READ_TIMEOUT_S:.0f})",
        "retries": f"retries of a read after a network error (default {DEFAULT_READ_RETRIES})",
    }

    connection_options = ("uri", "timeout")
    schemes = SCHEMES

    @classmethod
    def claims(cls, location: str) -> bool:
        return _scheme(str(location)) is not None

    @classmethod
    def exists(cls, location: str, **options) -> bool:
        """True when a store (or a collection in the way of one) is at ``location``."""
        try:
            loc = parse_location(location, options.get("uri"))
        except UsageError:
            return False  # e.g. mongodb:///db/c before --uri is known: publish checks again
        client = _client(loc, serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)
        try:
            return _target_exists(client[loc.db], _Names(loc.collection))
        except _pymongo().errors.PyMongoError as exc:
            raise _error(loc, "checking whether the store exists", exc) from exc
        finally:
            client.close()

    @classmethod
    def is_store(cls, location: str, **options) -> bool:
        """True when the collections at ``location`` are a packer store: a metadata document in
        ``C.meta``, or (metadata lost) ``C`` empty or holding packer's record documents (``key``,
        ``checksum``, build id ``b``). Another program's collection of that name is not one."""
        if not cls.claims(location):
            return False
        loc = parse_location(location, options.get("uri"))

        def packer_colls(db, n):
            if db[n.meta].find_one({"_id": _META_ID}, {"_id": 1}) is not None:
                return True
            if n.final not in set(db.list_collection_names()):
                return False   # only GridFS collections of that name: not packer's alone
            doc = db[n.final].find_one({}, {"key": 1, "checksum": 1, "b": 1})
            return doc is None or {"key", "checksum", "b"} <= set(doc)
        client = _client(loc, serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)
        try:
            return packer_colls(client[loc.db], _Names(loc.collection))
        except _pymongo().errors.PyMongoError as exc:
            raise _error(loc, "checking whether the collections are a packer store", exc) from exc
        finally:
            client.close()

    @classmethod
    @contextlib.contextmanager
    def lock_output(cls, location: str, *, purpose: str = "build", **options):
        """Exclusive writer lock on the store: a document in ``<collection>.lock`` with the
        holder's host, pid and a heartbeat (see :class:`packer.locking.DocumentLock`); yields
        a :class:`packer.locking.HeldLock`."""
        from ..locking import DocumentLock, HeldLock

        pymongo = _pymongo()
        loc = parse_location(location, options.get("uri"))
        client = _client(loc, serverSelectionTimeoutMS=10000, connectTimeoutMS=10000)
        try:
            lock = DocumentLock(client[loc.db][f"{loc.collection}.lock"], loc.name, purpose=purpose)
            try:
                info = lock.acquire()
            except pymongo.errors.PyMongoError as exc:
                raise _error(loc, "taking the output lock", exc) from exc
            try:
                yield HeldLock(info, lock.check)
            finally:
                lock.release()
        finally:
            client.close()

    @classmethod
    def create_writer(cls, location: str, **options) -> "MongoWriter":
        commit_bytes = options.pop("commit_bytes", None)
        cls.check_options(options, "writer")
        kw = {} if commit_bytes is None else {"commit_bytes": int(commit_bytes)}
        _pymongo()
        loc = parse_location(location, options.get("uri"))
        threshold = _parse_bytes(options.get("gridfs_threshold", DEFAULT_GRIDFS_THRESHOLD), "gridfs_threshold")
        if threshold > DEFAULT_GRIDFS_THRESHOLD:
            raise UsageError(f"mongo: gridfs_threshold must be at most {DEFAULT_GRIDFS_THRESHOLD >> 20}M "
                             f"(a document holds at most 16 MiB), got {options['gridfs_threshold']!r}")
        timeout = _parse_float(options.get("timeout", DEFAULT_WRITE_TIMEOUT_S), "timeout", 1.0)
        return MongoWriter(loc, gridfs_threshold=threshold, timeout_s=timeout, **kw)

    @classmethod
    def open_reader(cls, location: str, salvage: bool = False, **options) -> "MongoReader":
        cls.check_options(options, "reader")
        _pymongo()
        loc = parse_location(location, options.get("uri"))
        timeout = _parse_float(options.get("timeout", DEFAULT_READ_TIMEOUT_S), "timeout", 0.1)
        retries = int(_parse_float(options.get("retries", DEFAULT_READ_RETRIES), "retries", 0))
        return MongoReader(loc, timeout_s=timeout, retries=retries, salvage=salvage)

    @classmethod
    def open_salvage(cls, location: str, **options) -> "MongoReader":
        """A reader that survives a missing or damaged metadata document and documents from
        another build (it reads every record document whatever its build id)."""
        return cls.open_reader(location, salvage=True, **options)

    @classmethod
    def side_location(cls, location: str, suffix: str) -> str:
        base, q, query = str(location).partition("?")
        return base.rstrip("/") + suffix + q + query

    @classmethod
    def _with_db(cls, location: str, what: str, fn, **connection):
        loc = parse_location(location, connection.get("uri"))
        client = _client(loc, serverSelectionTimeoutMS=10000, connectTimeoutMS=10000)
        try:
            return fn(client[loc.db], _Names(loc.collection))
        except _pymongo().errors.PyMongoError as exc:
            raise _error(loc, what, exc) from exc
        finally:
            client.close()

    @classmethod
    def move_store(cls, location: str, dest: str, **connection) -> None:
        """Rename every collection of the store (metadata first); finishes a half-done move."""
        dest_coll = parse_location(dest, connection.get("uri")).collection

        def move(db, n):
            existing = set(db.list_collection_names())
            for src, dst in zip(n.store_colls(), _Names(dest_coll).store_colls()):
                if src in existing and dst not in existing:
                    db[src].rename(dst)
        cls._with_db(location, "moving the store aside", move, **connection)

    @classmethod
    def store_exists(cls, location: str, **connection) -> bool:
        def any_coll(db, n):
            return bool(set(db.list_collection_names()) & set(n.store_colls()))
        return cls._with_db(location, "looking for the store", any_coll, **connection)

    @classmethod
    def read_journal(cls, location: str, **connection) -> dict | None:
        def read(db, n):
            doc = db[n.journal].find_one({"_id": "journal"})
            try:
                return None if doc is None else loads_bounded(doc.get("json"))
            except ValueError as exc:
                raise StoreError(f"{redact(location)}: repair journal unreadable: {exc}") from exc
        return cls._with_db(location, "reading the repair journal", read, **connection)

    @classmethod
    def write_journal(cls, location: str, journal: dict | None, **connection) -> None:
        def write(db, n):
            if journal is None:
                db.drop_collection(n.journal)
            else:
                db[n.journal].replace_one({"_id": "journal"}, {"_id": "journal", "json": json.dumps(journal)},
                                          upsert=True)
        cls._with_db(location, "writing the repair journal", write, **connection)


def _target_exists(db, names: _Names) -> bool:
    existing = set(db.list_collection_names())
    if names.final in existing or any(c in existing for c in names.bucket_colls(names.bucket)):
        return True
    return names.meta in existing and db[names.meta].find_one({"_id": _META_ID}, {"_id": 1}) is not None


class MongoWriter(StoreWriter):
    """Builds ``C.partial`` and renames it onto ``C`` at publish (see the module docstring)."""

    def __init__(self, loc: MongoLocation, *, gridfs_threshold: int = DEFAULT_GRIDFS_THRESHOLD,
                 timeout_s: float = DEFAULT_WRITE_TIMEOUT_S, **kw):
        super().__init__(loc.name, **kw)
        self._loc = loc
        self._names = _Names(loc.collection)
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
            self._client = _client(self._loc, serverSelectionTimeoutMS=min(self._timeout_ms, 30000),
                                   connectTimeoutMS=10000, socketTimeoutMS=self._timeout_ms, w="majority")
        return self._client[self._loc.db]

    def _run(self, what: str, fn):
        try:
            return fn(self._db())
        except _pymongo().errors.PyMongoError as exc:
            err = _error(self._loc, what, exc)
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
        pymongo = _pymongo()
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
                delay = _backoff(attempt)
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("%s: %s while writing a batch (%s); retrying in %.1f s", self.location,
                            type(exc).__name__, _short(exc), delay)
                time.sleep(delay)

    def _write(self, db, records: Sequence[Record], state: ResumeState) -> None:
        import gridfs

        pymongo = _pymongo()
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
        except _pymongo().errors.PyMongoError as exc:
            raise _error(self._loc, "reading the staging index", exc) from exc

    def new_build_id(self) -> str:
        # The id every record of this build already carries (field "b"): one id per store version.
        return self._build_id or super().new_build_id()

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        self._run("publishing the store", lambda db: self._do_publish(db, metadata, overwrite))

    def _do_publish(self, db, metadata: StoreMetadata, overwrite: bool) -> None:
        n = self._names
        replacing = _target_exists(db, n)
        if replacing and not overwrite:
            raise UsageError(f"{self.location} exists (hint: --overwrite replaces it)")
        meta = _redacted_metadata(metadata)
        doc = {"_id": _META_ID, "json": meta.to_json().decode(), "build_id": self._build_id,
               "format": meta.format, "count": meta.count, "created": meta.created,
               "packer_version": meta.packer_version}
        if replacing:
            # The old store stops being a store first: no reader can pair old metadata with
            # new records. Each rename below drops its target only once the new one is in place.
            db[n.meta].delete_one({"_id": _META_ID})
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
        db[n.meta].replace_one({"_id": _META_ID}, doc, upsert=True)
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


def _backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...)."""
    return min(0.1 * 2 ** (attempt - 1), 1.0)


class MongoReader(StoreReader):
    """A published MongoDB store. The client is created lazily, once per process."""

    def __init__(self, loc: MongoLocation, *, timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                 retries: int = DEFAULT_READ_RETRIES, salvage: bool = False):
        self.location = loc.name
        self._loc = loc
        self._names = _Names(loc.collection)
        self._timeout_s = float(timeout_s)
        self._retries = int(retries)
        self._client = None
        self._pid = None
        self._bucket = None
        self._attempt_s = 0.0
        self._lock, self._lock_pid = threading.Lock(), os.getpid()  # threads share one client
        self._salvage = salvage
        self.salvage_problems = []
        doc = self._call("reading the store metadata", lambda db: db[self._names.meta].find_one({"_id": _META_ID}))
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
        backoff = sum(_backoff(k) for k in range(1, self._retries + 1))
        attempt_ms = max(200, int(1000 * (self._timeout_s - backoff) / (self._retries + 1)))
        self._attempt_s = attempt_ms / 1000
        self._client = _client(self._loc, serverSelectionTimeoutMS=attempt_ms, connectTimeoutMS=attempt_ms,
                               socketTimeoutMS=int(1000 * self._timeout_s), retryReads=False)
        self._bucket = None
        self._pid = pid

    def _call(self, what: str, fn):
        """``fn(db)``, retried on network errors with backoff until ``timeout`` is spent."""
        pymongo = _pymongo()
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                return fn(self._db())
            except pymongo.errors.ConnectionFailure as exc:
                attempt += 1
                elapsed = time.monotonic() - start
                delay = _backoff(attempt)
                # No retry that could not finish inside the budget (pymongo's own selection
                # timeout runs a little over its setting).
                if attempt > self._retries or elapsed + delay + self._attempt_s > self._timeout_s:
                    raise StoreError(
                        f"{self.location}: MongoDB server unreachable while {what} "
                        f"({attempt} attempt(s) in {elapsed:.1f} s): {_short(exc)}") from exc
                log.warning("%s: %s while %s; retrying in %.1f s", self.location, type(exc).__name__,
                            what, delay)
                time.sleep(delay)
            except pymongo.errors.PyMongoError as exc:
                raise _error(self._loc, what, exc) from exc

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
            if not isinstance(exc.__cause__, _pymongo().errors.OperationFailure):
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
