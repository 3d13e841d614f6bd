"""What every part of the MongoDB store shares: ``pymongo`` imported lazily, a client made for a
location, the collection names of a store and of its staging area, pymongo errors turned into
StoreError with the password masked, and the backoff between retries.
"""
from __future__ import annotations

import os

from packer.core.deps import optional_import
from packer.core.errors import StoreError, UnreachableError, UsageError
from packer.core.uri import redact
from packer.stores.mongo.location import MongoLocation

#: ``_id`` of the metadata document in ``C.meta``: the commit marker of a published store.
META_ID = "metadata"


def import_pymongo():
    """The ``pymongo`` module (and GridFS); DependencyError saying what to install when missing."""
    pymongo = optional_import("pymongo", "the MongoDB store", "mongo")
    optional_import("gridfs", "the MongoDB store", "mongo")   # ships with pymongo
    return pymongo


#: Environment variable: milliseconds of server selection (and connect) that packer's short
#: administrative MongoDB calls (does the store exist, the output lock, moves and drops) wait, in
#: place of their default (``packer.stores.mongo.ASK_TIMEOUT_MS``, 10 s). scripts/test.sh sets 60000:
#: a test server on a loaded machine once answered nothing for longer than 10 s. A timeout the
#: location's URI sets (``?serverSelectionTimeoutMS=``) still wins; reads and writes keep theirs.
TIMEOUT_ENV = "PACKER_MONGO_TIMEOUT_MS"


def admin_timeout_ms(default: int) -> int:
    """``default``, or the milliseconds ``$PACKER_MONGO_TIMEOUT_MS`` gives (UsageError when that is
    not a positive integer)."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return default
    try:
        ms = int(value)
    except ValueError:
        ms = 0
    if ms < 1:
        raise UsageError(f"{TIMEOUT_ENV} must be a positive number of milliseconds, got {value!r}")
    return ms


def short_message(exc: BaseException) -> str:
    """A pymongo error message without its (long) topology dump, passwords masked."""
    return redact(str(exc).split(", Topology Description:")[0])


def new_client(loc: MongoLocation, **defaults):
    """A MongoClient for ``loc``; ``defaults`` apply unless the URI sets the same option."""
    pymongo = import_pymongo()
    given = loc.client_uri.partition("?")[2].lower()
    kwargs = {k: v for k, v in defaults.items() if f"{k.lower()}=" not in given}
    try:
        return pymongo.MongoClient(loc.client_uri, appname="packer", connect=False, **kwargs)
    except pymongo.errors.ConfigurationError as exc:
        raise UsageError(f"{loc.server}: bad MongoDB connection string: {short_message(exc)}") from exc


class CollectionNames:
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


def store_error(loc: MongoLocation, what: str, exc: BaseException) -> StoreError:
    """A StoreError for a pymongo error, naming the (redacted) store and what was being done
    (:class:`~packer.core.errors.UnreachableError` when the server could not be reached)."""
    pymongo = import_pymongo()
    if isinstance(exc, pymongo.errors.ConnectionFailure):
        return UnreachableError(f"{loc.name}: cannot reach the MongoDB server while {what}: {short_message(exc)}")
    if isinstance(exc, pymongo.errors.OperationFailure):
        return StoreError(f"{loc.name}: the MongoDB server answered with an error while {what}: "
                          f"{short_message(exc)}")
    return StoreError(f"{loc.name}: MongoDB error while {what}: {short_message(exc)}")


def target_exists(db, names: CollectionNames) -> bool:
    """True when a published store, or a collection in the way of one, is at ``names.final``."""
    existing = set(db.list_collection_names())
    if names.final in existing or any(c in existing for c in names.bucket_colls(names.bucket)):
        return True
    return names.meta in existing and db[names.meta].find_one({"_id": META_ID}, {"_id": 1}) is not None


def retry_delay(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...)."""
    return min(0.1 * 2 ** (attempt - 1), 1.0)
