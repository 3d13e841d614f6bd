"""MongoDB store: one document per record in a collection, metadata in its own collection.

Location: ``mongodb://[user:pass@]host[:port][,host2...]/DB/COLLECTION[?options]`` (or
``mongodb+srv://``). The last two path segments name the database and the collection; the
rest is the connection string handed to :class:`pymongo.MongoClient`. A ``uri`` option (CLI
``--uri``) or else the ``MONGODB_URI`` environment variable, when given, replaces the host,
credentials and options of the location (``mongodb:///DB/COLLECTION`` leaves them empty).
Passwords never appear in messages, logs, reports or ``repr()`` (``user:***@``, see
:func:`packer.core.uri.redact`); a user name or password must be percent-escaped (a ``/``, ``@`` or
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

The package holds one module per concern: ``location`` (parsing and checking the location),
``connection`` (client, collection names, errors), ``writer`` and ``reader``; this module holds
the store class, registered here, and its option parsing.
"""
from __future__ import annotations

import contextlib
import json

from packer.core.errors import StoreError, UsageError
from packer.core.records import loads_bounded
from packer.core.uri import redact
from packer.stores import register_store
from packer.stores.base import Store, parse_size
from packer.stores.mongo.connection import (
    META_ID,
    CollectionNames,
    admin_timeout_ms,
    import_pymongo,
    new_client,
    store_error,
    target_exists,
)
from packer.stores.mongo.location import SCHEMES, MongoLocation, mongo_scheme, parse_location
from packer.stores.mongo.reader import DEFAULT_READ_RETRIES, DEFAULT_READ_TIMEOUT_S, MongoReader
from packer.stores.mongo.writer import DEFAULT_GRIDFS_THRESHOLD, DEFAULT_WRITE_TIMEOUT_S, MAX_INSERT_BYTES, MongoWriter


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


#: Server selection and connect timeout of the short administrative calls (does the store exist,
#: is it packer's, the output lock, moves and drops), unless the location's URI sets its own. One
#: value for all: the existence check had 5 s where the others had 10, and a build's first check
#: failed on a local server that was busy for a few seconds (the test suite on a loaded 2-core VM).
ASK_TIMEOUT_MS = 10_000


def _ask(loc, what: str, question, timeout_ms: int | None = None):
    """``question(database, collection names)`` on a short-lived client (``timeout_ms`` timeouts,
    default ASK_TIMEOUT_MS or ``$PACKER_MONGO_TIMEOUT_MS``); a server error becomes the StoreError
    of ``what``."""
    timeout_ms = admin_timeout_ms(ASK_TIMEOUT_MS) if timeout_ms is None else timeout_ms
    client = new_client(loc, serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms)
    try:
        return question(client[loc.db], CollectionNames(loc.collection))
    except import_pymongo().errors.PyMongoError as exc:
        raise store_error(loc, what, exc) from exc
    finally:
        client.close()

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
    server_backed = True

    @classmethod
    def claims(cls, location: str) -> bool:
        return mongo_scheme(str(location)) is not None

    @classmethod
    def exists(cls, location: str, **options) -> bool:
        """True when a store (or a collection in the way of one) is at ``location``."""
        try:
            loc = parse_location(location, options.get("uri"))
        except UsageError:
            return False  # e.g. mongodb:///db/c before --uri is known: publish checks again
        return _ask(loc, "checking whether the store exists", target_exists)

    @classmethod
    def is_store(cls, location: str, **options) -> bool:
        """True when the collections at ``location`` are a packer store: a metadata document in
        ``C.meta``, or (metadata lost) ``C`` empty or holding packer's record documents (``key``,
        ``checksum``, build id ``b``). Another program's collection of that name is not one."""
        if not cls.claims(location):
            return False
        loc = parse_location(location, options.get("uri"))

        def packer_colls(db, n):
            if db[n.meta].find_one({"_id": META_ID}, {"_id": 1}) is not None:
                return True
            if n.final not in set(db.list_collection_names()):
                return False   # only GridFS collections of that name: not packer's alone
            doc = db[n.final].find_one({}, {"key": 1, "checksum": 1, "b": 1})
            return doc is None or {"key", "checksum", "b"} <= set(doc)
        return _ask(loc, "checking whether the collections are a packer store", packer_colls)

    @classmethod
    @contextlib.contextmanager
    def lock_output(cls, location: str, *, purpose: str = "build", **options):
        """Exclusive writer lock on the store: a document in ``<collection>.lock`` with the
        holder's host, pid and a heartbeat (see :class:`packer.core.locking.DocumentLock`); yields
        a :class:`packer.core.locking.HeldLock`."""
        from packer.core.locking import DocumentLock, HeldLock

        pymongo = import_pymongo()
        loc = parse_location(location, options.get("uri"))
        timeout_ms = admin_timeout_ms(ASK_TIMEOUT_MS)
        client = new_client(loc, serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms)
        try:
            lock = DocumentLock(client[loc.db][f"{loc.collection}.lock"], loc.name, purpose=purpose)
            try:
                info = lock.acquire()
            except pymongo.errors.PyMongoError as exc:
                raise store_error(loc, "taking the output lock", exc) from exc
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
        import_pymongo()
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
        import_pymongo()
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
        return _ask(parse_location(location, connection.get("uri")), what, fn)

    @classmethod
    def move_store(cls, location: str, dest: str, **connection) -> None:
        """Rename every collection of the store (metadata first); finishes a half-done move."""
        dest_coll = parse_location(dest, connection.get("uri")).collection

        def move(db, n):
            existing = set(db.list_collection_names())
            for src, dst in zip(n.store_colls(), CollectionNames(dest_coll).store_colls()):
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


__all__ = ["MongoStore", "MongoWriter", "MongoReader", "MongoLocation", "parse_location", "redact", "SCHEMES",
           "DEFAULT_GRIDFS_THRESHOLD", "MAX_INSERT_BYTES", "DEFAULT_READ_TIMEOUT_S", "DEFAULT_READ_RETRIES",
           "DEFAULT_WRITE_TIMEOUT_S"]
