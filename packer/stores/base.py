"""The Store contract: what every backend (LMDB, HDF5, MongoDB, ...) implements.

A backend is one module or subpackage in ``packer/stores/`` (``hdf5/``: layout, options,
writer, reader, salvage, with the store class in its ``__init__``) defining three classes and
registering the first with :func:`packer.stores.register_store`:

``<Format>Store(Store)``
    Class-level facts: ``name`` (the ``--format`` choice), ``claims(location)`` (is an
    existing store at ``location`` of this format?), ``create_writer`` and ``open_reader``;
    what kind of store it is (``composite``, ``can_hold_pixels``, ``server_backed``,
    ``folder``), which jobs ask instead of comparing format names.

``<Format>Writer(StoreWriter)``
    Driven by :func:`packer.jobs.pack.pack` (through :class:`packer.stores.staging.Stage`) in this order::

        with store_cls.create_writer(location, commit_bytes=...) as writer:
            state = writer.open(fingerprint, resume=True)  # ResumeState, fresh or resumed
            for each input from state.next_input on:
                writer.add(record)                 # record.index == state.next_index, then +1 ...
                writer.checkpoint(state)           # state.next_input/next_index/rejects updated
            writer.flush()
            meta = ...index_checksum(writer.iter_index())...
            writer.publish(meta, overwrite=False)  # metadata written last, published atomically

    Guarantees a backend must give:

    * Nothing is visible at ``location`` until ``publish``; the staging area (``<out>.partial``
      or a staging collection) holds the work in progress.
    * ``_write_batch(records, state)`` persists the records *and then* the state. After a kill
      at any instant, ``open(same fingerprint, resume=True)`` returns a state whose
      ``next_index`` records are exactly the ones present (extra records written after the
      last persisted state are discarded by ``open``), so the resumed store equals an
      uninterrupted one.
    * An exception inside ``with writer:`` calls ``abort()``: handles are closed, nothing is
      published, the staging area stays for a later resume.
    * ``publish`` refuses to replace an existing store unless ``overwrite=True``; when it does,
      the old store is removed only after the new one is in place.

``<Format>Reader(StoreReader)``
    Opened in the process that uses it (never shared across fork). ``get(i)`` and
    ``get_many(indices)`` return :class:`~packer.core.records.Record` or raise
    :class:`~packer.core.errors.RecordError` naming the store and key. ``get_many`` should fetch a
    batch in one storage round-trip where the backend allows it. A reader never returns records
    of two store versions: its metadata and records come from one handle (LMDB, HDF5, whose
    every re-open checks the build id first read) or every record carries the build id
    (MongoDB). ``publish`` writes a new random ``StoreMetadata.build_id``; readers opened later
    for a Dataset compare theirs with :meth:`StoreReader.expect_build`.

Repair, convert and export (``packer.jobs.repair`` / ``convert`` / ``export``) use a few more hooks,
with defaults that suit path-based stores: ``Store.open_salvage`` (read what survives in a
damaged store), ``Store.move_store`` / ``side_location`` / ``store_exists`` (move the old store
aside as a backup), ``Store.read_journal`` / ``write_journal`` (a killed repair finishes on
rerun), ``StoreWriter.add_stored`` and ``write_quarantine``, and ``StoreReader.quarantine_bytes``
(the quarantine area: entries in ``StoreMetadata.quarantine``, bytes in the backend).
``tests/packer/jobs/test_repair.py`` runs them against every registered backend.

The store contract test suite (``tests/packer/stores/test_store_contract.py``) runs against every
registered backend, so a new backend is done when that suite passes unchanged.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Iterator, Sequence

from packer.core.errors import StoreError, UsageError
from packer.core.records import Record, StoreMetadata, loads_bounded

log = logging.getLogger(__name__)

DEFAULT_COMMIT_BYTES = 64 << 20

# Fault injection for the kill-and-resume tests: the process SIGKILLs itself right after its
# N-th committed batch. Only read from the environment; never set by packer itself.
FAULT_ENV = "PACKER_FAULT_KILL_AFTER_COMMITS"


@dataclass
class ResumeState:
    """How far a build got: persisted by the writer together with every committed batch.

    Attributes:
        fingerprint: hash of the inputs and content-affecting options; a partial build is only
            resumed by a run with the same fingerprint.
        next_input: position in the (sorted) input list of the first input not yet handled.
        next_index: number of records committed (= index of the next record).
        rejects: damaged inputs found so far, as ``{"path", "reason"}`` dicts.
        stats: running statistics of the committed records (for ``info``), JSON-able.
        converted / notes: the build report's entries for the committed records
            (``{"path", "converted"}`` / ``{"path", "note"}``), so a resumed build's report
            still lists those of the earlier run(s).

    Backends persist it as ``json.dumps(state.to_dict())`` and read it back with
    ``from_dict``; they never need to look inside.
    """

    fingerprint: str
    next_input: int = 0
    next_index: int = 0
    rejects: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    converted: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"fingerprint": self.fingerprint, "next_input": self.next_input,
                "next_index": self.next_index, "rejects": list(self.rejects),
                "stats": dict(self.stats), "converted": list(self.converted),
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "ResumeState":
        return cls(fingerprint=d["fingerprint"], next_input=int(d["next_input"]),
                   next_index=int(d["next_index"]), rejects=list(d.get("rejects", [])),
                   stats=dict(d.get("stats", {})), converted=list(d.get("converted", [])),
                   notes=list(d.get("notes", [])))


class StoreWriter(ABC):
    """Base writer: buffers records and commits them in batches of about ``commit_bytes``."""

    def __init__(self, location: str, *, commit_bytes: int = DEFAULT_COMMIT_BYTES):
        self.location = location
        self.commit_bytes = int(commit_bytes)
        self._pending: list[Record] = []
        self._pending_bytes = 0
        self._state: ResumeState | None = None
        self._commits = 0
        fault = os.environ.get(FAULT_ENV)
        self._kill_after = int(fault) if fault else None

    # -- driven by packer.jobs.pack -------------------------------------------------------------
    def open(self, fingerprint: str, resume: bool = True) -> ResumeState:
        """Create the staging area, or reopen the one an interrupted build left.

        Raises:
            ResumeMismatchError: a staging area with another fingerprint exists and ``resume``.
        """
        state = self._open_staging(fingerprint, resume)
        self._state = state
        return state

    def add(self, record: Record) -> None:
        """Queue one record; it is committed with the next checkpoint that fills a batch."""
        self._pending.append(record)
        self._pending_bytes += len(record.data) + 512

    def add_stored(self, record: Record) -> None:
        """Queue a record already in this store's encoding (copied from a store of the same
        kind by ``repair`` / ``convert``): backends that transform records in :meth:`add`
        (HDF5 pixel mode decodes JPEGs) must not transform these again."""
        StoreWriter.add(self, record)

    def write_quarantine(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Keep the bytes of quarantined records in the staging area, entry ``n`` -> bytes.

        Called by :func:`packer.jobs.repair.write.write_repaired` after the live records and before ``publish``; the
        entries themselves (key, reason, original index...) go in ``StoreMetadata.quarantine``.
        Must be idempotent (a resumed repair writes the same entries again).
        """
        raise StoreError(f"{self.location}: this store format keeps no quarantine area")

    def checkpoint(self, state: ResumeState) -> None:
        """Record progress; commits the pending batch once it holds ``commit_bytes``."""
        self._state = state
        if self._pending_bytes >= self.commit_bytes:
            self.flush()

    def flush(self) -> None:
        """Commit pending records together with the current state."""
        if self._state is None:
            raise RuntimeError("StoreWriter.flush() before open()")
        self._write_batch(self._pending, self._state)
        self._pending = []
        self._pending_bytes = 0
        self._commits += 1
        if self._kill_after is not None and self._commits >= self._kill_after:
            log.warning("%s=%d: killing this process to test resume", FAULT_ENV, self._kill_after)
            os.kill(os.getpid(), signal.SIGKILL)

    def publish(self, metadata: StoreMetadata, overwrite: bool = False) -> None:
        """Flush, write ``metadata`` last and make the store visible at ``location`` atomically.

        Sets ``metadata.build_id`` to :meth:`new_build_id` first: every publish (build, append,
        convert, merge, repair) makes a new version of the store, which readers opened on the
        old one must be able to tell apart (:meth:`StoreReader.expect_build`).
        """
        self.flush()
        metadata.build_id = self.new_build_id()
        self._publish(metadata, overwrite)

    def new_build_id(self) -> str:
        """The build id :meth:`publish` writes into the metadata: a random UUID. Backends whose
        records already carry an id of this build (MongoDB) return that one."""
        return new_build_id()

    def abort(self) -> None:
        """Close everything without publishing; the staging area stays for a resume."""
        self._pending = []
        self._pending_bytes = 0
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        else:
            self._close()
        return False

    # -- what a backend implements ----------------------------------------------------------
    @abstractmethod
    def _open_staging(self, fingerprint: str, resume: bool) -> ResumeState:
        """Make or reopen the staging area; return where the build stands (see class doc)."""

    @abstractmethod
    def _write_batch(self, records: Sequence[Record], state: ResumeState) -> None:
        """Persist ``records`` and then ``state`` (records may be empty)."""

    @abstractmethod
    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        """Yield (index, key, checksum) of every committed record, in index order."""

    @abstractmethod
    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        """Write metadata last and publish atomically (see class doc)."""

    @abstractmethod
    def _close(self) -> None:
        """Release handles. Must be safe to call twice."""


class StoreReader(ABC):
    """Read access to one published store. Open it in the process that uses it.

    ``encoding`` says what ``Record.data`` holds: ``"jpeg"`` (encoded bytes, the default) or
    ``"raw"`` (decoded uint8 pixels of shape ``raw_shape`` = (H, W, C), e.g. HDF5 pixel mode).
    """

    location: str
    metadata: StoreMetadata
    encoding: str = "jpeg"
    raw_shape: tuple | None = None

    @property
    def build_id(self) -> str:
        """The identity of the store version this reader reads (:func:`store_identity`)."""
        return store_identity(self.metadata)

    def expect_build(self, build_id: str | None, *, since: str = "this reader was opened",
                     hint: str = "open it again") -> None:
        """Check that this reader reads the store version ``build_id`` (recorded when the store
        was first opened, e.g. by a Dataset in the main process); ``None`` checks nothing.

        Raises:
            StoreError: another version was published at the location since (this reader is
                closed first): reading on would mix records of two stores.
        """
        if build_id is not None and self.build_id != build_id:
            found = self.build_id
            self.close()
            raise replaced_error(self.location, build_id, found, since=since, hint=hint)

    @abstractmethod
    def __len__(self) -> int:
        """Number of records actually present (verify compares it with ``metadata.count``)."""

    @abstractmethod
    def get(self, index: int) -> Record:
        """Record at ``index``. Raises RecordError (store, key, reason) or IndexError."""

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        """Records at ``indices``, in that order. Backends override to batch the I/O."""
        return [self.get(i) for i in indices]

    def map_records(self, indices: Sequence[int], fn) -> list:
        """``[fn(record) for record in get_many(indices)]``, where ``record.data`` may be a
        zero-copy view valid only during ``fn`` (LMDB overrides this to decode straight from
        the memory map). ``fn`` must not keep ``record.data``."""
        return [fn(r) for r in self.get_many(indices)]

    #: True where :meth:`map_data` reads the image bytes alone (no record metadata): readers that
    #: cached the checked metadata of a record (readers.raw) then read only its bytes.
    supports_map_data: bool = False

    def map_data(self, indices: Sequence[int], fn) -> list:
        """``[fn(index, data) for index in indices]`` with ``data`` the stored bytes alone (a
        zero-copy view valid only during ``fn``); record metadata is neither read nor checked.
        Only where :attr:`supports_map_data`; a missing or unreadable record raises RecordError."""
        raise NotImplementedError(f"{type(self).__name__} has no map_data")

    def record_extents(self):
        """Where each record's bytes lie in the store's one data file, for reading a record by
        byte ranges from a copy of that file in a bucket (``ds[i]`` without the whole shard):
        ``(data file name, uint64 array (count, 4) of [meta offset, meta length, data offset,
        data length])``; None where the store cannot
        tell (the default). The store class reads them back with ``record_from_parts``."""
        return None

    @abstractmethod
    def index_of(self, key: str) -> int:
        """Index of the record whose key is ``key``; KeyError if there is none."""

    def check_structure(self) -> list[str]:
        """Backend-specific consistency problems (one line each); ``[]`` when none."""
        return []

    #: Store-level damage found while opening in salvage mode (see :meth:`Store.open_salvage`).
    salvage_problems: list = []

    def quarantine_bytes(self, n: int) -> bytes:
        """The bytes kept for quarantine entry ``n`` (``metadata.quarantine[n]``).

        Raises:
            StoreError: the entry or its bytes are missing.
        """
        raise StoreError(f"{self.location}: this store format keeps no quarantine area")

    @property
    def shard_boundaries(self) -> list:
        """``[0, end_0, ..., len]``: records of shard ``j`` are ``[b[j], b[j+1])``. One shard for
        a plain store; a manifest lists its shards (samplers use it to read shard-locally)."""
        return [0, self.metadata.count]

    def size_bytes(self) -> int:
        """Bytes the store takes on disk / on the server (best effort)."""
        return 0

    @abstractmethod
    def close(self) -> None:
        """Release handles. Safe to call twice."""

    def discard_after_fork(self) -> None:
        """Called in a forked child that inherited this (parent's) reader, before the child
        opens its own. Release only what is safe to release without disturbing the parent;
        the default does nothing and lets the handle be garbage-collected."""

    def read_labels(self, batch: int = 1024) -> list:
        """Every record's label in index order (for samplers and splits). Backends override
        this to read record metadata without the image bytes; this default reads records."""
        out = []
        for start in range(0, self.metadata.count, batch):
            out.extend(r.label for r in self.get_many(range(start, min(start + batch, self.metadata.count))))
        return out

    #: True once closed by ``with reader:`` (datasets then open a fresh reader).
    closed: bool = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        self.closed = True
        return False


def new_build_id() -> str:
    """A fresh random build id (a UUID4, 32 hex digits)."""
    return uuid.uuid4().hex


def store_identity(metadata: StoreMetadata) -> str:
    """The identity of one published version of a store: ``metadata.build_id``, or for a store
    published before build ids existed, ``legacy-`` + a hash of its whole metadata (which holds
    its index checksum and creation time), the same in every process that reads it.

    Example:
        >>> store_identity(reader.metadata)                       # doctest: +SKIP
        '6f1c0d2e9a4b4c7f8e2d1a0b3c4d5e6f'
    """
    if metadata.build_id:
        return metadata.build_id
    return "legacy-" + hashlib.blake2b(metadata.to_json(), digest_size=8).hexdigest()


def replaced_error(location: str, expected: str, found: str, *, since: str = "this reader was opened",
                   hint: str = "open it again") -> StoreError:
    """The error for a store found replaced under a reader (build ``expected`` -> ``found``)."""
    return StoreError(f"{location}: the store was replaced since {since} (build id {expected}, "
                      f"now {found}); {hint}")


def count_limit(present: int) -> int:
    """The largest ``metadata.count`` a store holding ``present`` entries may declare.

    A store that lost records still opens, and verify lists each missing one; but a count
    further beyond what is present than it could have lost (all of it, and 1000 more) comes
    from an edited or damaged metadata, and a loop over ``range(count)`` would never end.
    """
    return 2 * max(0, int(present)) + 1000


def load_metadata(location: str, raw, present: int, holder: str) -> StoreMetadata:
    """The store's metadata from its JSON ``raw``, every field checked: types and nesting
    (:meth:`StoreMetadata.from_json`) and ``count`` against the ``present`` entries the store
    really holds (:func:`count_limit`), which ``holder`` names (e.g. "entries in its 'records'
    database"). The one way every backend reads its metadata.

    Raises:
        StoreError: naming ``location`` and the field.
    """
    try:
        meta = StoreMetadata.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"{location}: store metadata is damaged: {exc}") from exc
    if meta.count > count_limit(present):
        raise StoreError(f"{location}: store metadata is damaged: field 'count' says {meta.count} records, "
                         f"but {holder}: {present}")
    return meta


def partial_location(location) -> str:
    """Staging path of a path-based store: ``<location>.partial``."""
    return str(location).rstrip("/") + ".partial"


def remove_path(path) -> None:
    """Remove the file, link or folder at ``path``, if there is one."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def parse_size(value, *, store: str, option: str, minimum: int = 1) -> int:
    """A byte count from an option: ``131072``, ``"128K"``, ``"1M"``, ``"2GiB"`` -> int.

    Raises:
        UsageError: naming ``store`` and ``option`` when the value is not a size >= ``minimum``.
    """
    if isinstance(value, int) or (hasattr(value, "__index__") and not isinstance(value, (str, bool))):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*", str(value))
        if not m:
            raise UsageError(f"{store}: option {option}={value!r} is not a size in bytes "
                             f"(e.g. 131072, 128K, 1M)")
        n = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
    if n < minimum:
        raise UsageError(f"{store}: option {option}={value!r} is too small (at least {minimum} bytes)")
    return n


class Store(ABC):
    """A storage format. Subclasses are registered with :func:`packer.stores.register_store`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: Backend-specific writer options accepted by ``create_writer`` (CLI: ``-O NAME=VALUE``),
    #: mapped to a one-line help text. Common options (``commit_bytes``) are not listed here.
    writer_options: ClassVar[dict] = {}
    #: Options accepted by ``open_reader`` (e.g. ``uri`` for MongoDB), mapped to help text.
    reader_options: ClassVar[dict] = {}
    #: Output suffixes that mean this format (``build -o x.h5`` infers ``hdf5``), lower case.
    suffixes: ClassVar[tuple] = ()
    #: URL schemes this format writes to (``("mongodb://",)``); a store with schemes only
    #: takes such outputs, and an output with a scheme no store claims is refused.
    schemes: ClassVar[tuple] = ()

    # -- facts the jobs ask instead of comparing format names ----------------------------------
    #: A dataset of other stores (shards) with no records of its own (the manifest): jobs
    #: verify, repair and append its shards, and never copy records into one.
    composite: ClassVar[bool] = False
    #: Can hold decoded pixels (``encoding == "raw"``) besides JPEG bytes (HDF5 pixel mode).
    can_hold_pixels: ClassVar[bool] = False
    #: Lives on a server and is named by a URL of one of ``schemes`` (MongoDB), not a path.
    server_backed: ClassVar[bool] = False
    #: A folder of files (LMDB) rather than one file: in a bucket, its objects share a prefix.
    folder: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def claims(cls, location: str) -> bool:
        """True when ``location`` holds (or names) a store of this format."""

    #: Options that say how to reach a store, not what it holds (e.g. a connection string):
    #: they are passed to ``exists`` and kept out of the resume fingerprint and the metadata.
    connection_options: ClassVar[tuple] = ()

    @classmethod
    def check_options(cls, options: dict, which: str) -> None:
        """UsageError naming any option not in ``writer_options`` / ``reader_options``."""
        allowed = cls.writer_options if which == "writer" else cls.reader_options
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise UsageError(f"{cls.name}: unknown {which} option(s) {unknown}; "
                             f"accepted: {sorted(allowed) or 'none'}")

    @classmethod
    def exists(cls, location: str, **connection) -> bool:
        """True when a published store is at ``location`` (build refuses to overwrite it).

        Defaults to :meth:`claims`; backends whose ``claims`` only looks at the location's
        form (e.g. a ``mongodb://`` URL) override it to look for the store itself.
        """
        return cls.claims(location)

    @classmethod
    def is_store(cls, location: str, **connection) -> bool:
        """True when ``location`` holds a store of this format that packer wrote: published,
        damaged (its metadata lost, say) or a staging area (``<out>.partial``). ``--overwrite``
        replaces only these (:func:`packer.stores.outputs.check_output`); another program's file of
        the same kind (an LMDB environment, an HDF5 file) is not one.

        Defaults to :meth:`claims`; backends whose ``claims`` looks at the file type only
        override it to look for packer's own metadata or layout.
        """
        return cls.claims(location)

    @classmethod
    @abstractmethod
    def create_writer(cls, location: str, **options) -> StoreWriter:
        """A writer that will publish a new store at ``location``."""

    @classmethod
    @abstractmethod
    def open_reader(cls, location: str, **options) -> StoreReader:
        """Open a published store. Raises StoreError if it is missing or incomplete."""

    @classmethod
    def record_from_parts(cls, location: str, label_schema, index: int, raw_meta: bytes, data: bytes) -> Record:
        """Record ``index`` from the two byte ranges its reader's
        :meth:`StoreReader.record_extents` locates (read from a copy in a bucket), checked as
        ``get`` checks a record. Only for stores whose readers give extents."""
        raise NotImplementedError(f"{cls.__name__} has no record extents")

    # -- used by packer.jobs.repair / packer.jobs.convert (defaults suit path-based stores) -------------
    @classmethod
    def open_salvage(cls, location: str, **options) -> StoreReader:
        """Open a possibly damaged store to read whatever still reads.

        Unlike :meth:`open_reader` this does not give up on store-level damage it can work
        around (missing or damaged metadata, a file cut short): the reader's
        ``salvage_problems`` lists that damage, and ``metadata`` is a provisional one when
        the store's own is gone (``label_schema`` then set by the caller). Backends override
        it; the default is :meth:`open_reader` with nothing listed.

        Raises:
            StoreError: nothing readable at ``location``.
        """
        reader = cls.open_reader(location, **options)
        reader.salvage_problems = []
        return reader

    @classmethod
    def side_location(cls, location: str, suffix: str) -> str:
        """A location next to ``location`` for a store of the same format (backups made by
        repair): ``<location><suffix>`` for paths; backends with other naming override."""
        return str(location).rstrip("/") + suffix

    @classmethod
    def move_store(cls, location: str, dest: str, **connection) -> None:
        """Move the published store at ``location`` to ``dest`` (for repair's backup).

        Idempotent: a move interrupted half-way is finished by calling it again; parts
        already at ``dest`` are left alone.
        """
        if os.path.lexists(location) and not os.path.lexists(dest):
            os.rename(location, dest)

    @classmethod
    def store_exists(cls, location: str, **connection) -> bool:
        """True when anything of a store (complete or not) is at ``location``."""
        return os.path.lexists(location)

    @classmethod
    def read_journal(cls, location: str, **connection) -> dict | None:
        """The journal an unfinished repair left for ``location`` (None when there is none)."""
        path = str(location).rstrip("/") + ".repair-journal.json"
        try:
            with open(path, "rb") as fh:
                return loads_bounded(fh.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path}: repair journal unreadable: {exc}") from exc

    @classmethod
    def write_journal(cls, location: str, journal: dict | None, **connection) -> None:
        """Replace (atomically) or, with None, remove the repair journal of ``location``."""
        path = str(location).rstrip("/") + ".repair-journal.json"
        if journal is None:
            if os.path.lexists(path):
                os.remove(path)
            return
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(journal, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
