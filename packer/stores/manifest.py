"""Manifest store: one dataset made of many shard stores (a logical merge).

A manifest is a small JSON file (any name; ``.packer-manifest.json`` by convention) that lists
shard stores of any format, in order, with what is needed to trust them without reading a
record::

    {"packer_manifest": 1,
     "metadata": {StoreMetadata: format "manifest", count, label_schema, class_names, stats, ...,
                  "index_checksum": manifest checksum, see below},
     "shards": [{"location": "train.shards/shard-00000-of-00008.lmdb",   # relative to the file,
                 "format": "lmdb", "count": 125000,                        # or a URL / absolute path
                 "index_checksum": "<the shard's own index checksum>",
                 "encoding": "jpeg", "raw_shape": null,
                 "first_key": "...", "last_key": "...",
                 "shard": {"index": 0, "count": 8, ...} or null}, ...]}

Record ``i`` of the manifest is record ``i - offset[j]`` of shard ``j`` (offsets = running sum
of counts); readers return it with its global index. The manifest's ``index_checksum`` is
:func:`manifest_checksum` over the shards' (count, index checksum): a shard replaced, changed,
reordered or left out changes it, and a reader refuses a shard whose metadata no longer
matches its entry. ``packer verify`` checks every shard completely and the chain of checksums.

Written atomically (temporary file, fsync, ``os.replace``): readers see the old manifest or the
new one. Readers open shards lazily, only those they read, in the process that reads, and keep
at most ``max_open`` open (least recently used closed first).

``--format manifest`` in a build writes one shard (``shard_format``, default LMDB) under
``<out>.shards/`` and the manifest at ``<out>``; ``packer merge`` and the Dask engine write
manifests over many shards.

Example:
    >>> from packer.stores import open_store                         # doctest: +SKIP
    >>> with open_store("train.packer-manifest.json") as r:
    ...     r.shard_boundaries[:3], r.get(0).key
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import threading
from typing import Iterator, Sequence

import numpy as np

from packer.core import remote
from packer.core.errors import StoreError, UsageError
from packer.core.records import Record, StoreMetadata, checksum, is_int, loads_bounded
from packer.core.uri import redact
from packer.stores import get_store, register_store
from packer.stores.base import ResumeState, Store, StoreReader, StoreWriter, count_limit, new_build_id

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".packer-manifest.json"
_MAGIC = b'{"packer_manifest":'
DEFAULT_MAX_OPEN = 64
#: Shards open at once per process for a manifest in a bucket (each one pinned in the cache).
DEFAULT_REMOTE_MAX_OPEN = 4


def shard_formats() -> list[str]:
    """The formats a manifest's shard can have: one store per file or folder (not composite, not
    on a server), each named by its first suffix (:func:`shard_suffix`)."""
    from packer.stores import available_formats

    return [n for n in available_formats()
            if not get_store(n).composite and not get_store(n).server_backed and get_store(n).suffixes]


def shard_suffix(fmt: str) -> str:
    """The suffix of a shard of format ``fmt`` (``.lmdb``, ``.h5``): its store's first suffix."""
    suffixes = get_store(fmt).suffixes
    return suffixes[0] if suffixes else "." + fmt


def _size(value) -> int:
    from packer.stores.base import parse_size
    return parse_size(value, store="manifest", option="cache_limit")


def manifest_checksum(shards: Sequence[dict]) -> str:
    """Checksum of a manifest's shard list: each shard's count and index checksum, in order."""
    lines = "".join(f"{int(s['count'])}\t{s['index_checksum']}\n" for s in shards)
    return checksum(lines.encode())


def resolve_location(manifest: str, location: str) -> str:
    """A shard location as written in ``manifest`` -> one to open (relative to its folder, which
    may be a bucket's: ``s3://b/x.packer-manifest.json`` + ``x.shards/s0.lmdb``)."""
    if remote.is_url(manifest):
        return remote.resolve(manifest, location)
    if "://" in location or os.path.isabs(location):
        return location
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(manifest)), location))


def relative_location(manifest: str, location: str) -> str:
    """The inverse of :func:`resolve_location`: how ``manifest`` should name ``location``."""
    if "://" in location:
        from packer.core.uri import redact  # never write a password into a manifest (pass --uri to read)
        return redact(location)
    return os.path.relpath(os.path.abspath(location), os.path.dirname(os.path.abspath(manifest)))


def write_manifest(location: str, metadata: StoreMetadata, shards: Sequence[dict],
                   overwrite: bool = False, *, build_id: str | None = None) -> None:
    """Write a manifest atomically (temporary file, fsync, rename).

    Each manifest written is a new version of the store: ``metadata.build_id`` is set to
    ``build_id``, by default a new random one (readers opened on the old version notice).

    Raises:
        UsageError: something is at ``location`` and ``overwrite`` is False.
    """
    location = str(location)
    if os.path.lexists(location) and not overwrite:
        raise UsageError(f"{location} exists (hint: --overwrite replaces it)")
    if os.path.isdir(location):
        raise UsageError(f"{location} is a folder; a manifest is a file")
    metadata.build_id = build_id or new_build_id()
    doc = {"packer_manifest": MANIFEST_VERSION, "metadata": dataclasses.asdict(metadata),
           "shards": [dict(s) for s in shards]}
    # The first bytes identify the format (claims() reads them): keep packer_manifest first.
    raw = json.dumps(doc, indent=1).encode()
    folder = os.path.dirname(os.path.abspath(location))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(location)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, location)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(location: str) -> tuple[StoreMetadata, list]:
    """(metadata, shard entries) of the manifest at ``location``; StoreError when unreadable."""
    try:
        with open(location, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise StoreError(f"{location}: cannot read the manifest: {exc.strerror or exc}") from exc
    return parse_manifest(raw, location)


def parse_manifest(raw: bytes, location: str) -> tuple[StoreMetadata, list]:
    """(metadata, shard entries) of the manifest bytes ``raw`` read from ``location``."""
    location = redact(location)
    try:
        doc = loads_bounded(raw)
    except ValueError as exc:
        raise StoreError(f"{location}: manifest is not valid JSON (damaged?): {exc}") from exc
    if not isinstance(doc, dict) or doc.get("packer_manifest") != MANIFEST_VERSION:
        raise StoreError(f"{location}: not a packer manifest of version {MANIFEST_VERSION}")
    try:
        meta = StoreMetadata.from_dict(doc["metadata"])
        shards = doc["shards"]
        if not isinstance(shards, list):
            raise ValueError(f"'shards' must be a list, got {type(shards).__name__}")
        for j, s in enumerate(shards):
            _check_entry(j, s)
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{location}: manifest is damaged: {exc}") from exc
    return meta, list(shards)


def _check_entry(j: int, s) -> None:
    """ValueError naming shard ``j`` and the field when its manifest entry is not as written."""
    if not isinstance(s, dict):
        raise ValueError(f"shard {j} must be an object, got {type(s).__name__}")
    for k in ("location", "format", "count", "index_checksum"):
        if k not in s:
            raise ValueError(f"shard {j} lacks {k!r}")
    for k in ("location", "format", "index_checksum", "encoding"):
        if k in s and not isinstance(s[k], str):
            raise ValueError(f"shard {j}: field {k!r} must be a string, got {s[k]!r}"[:200])
    if not (is_int(s["count"]) and s["count"] >= 0):
        raise ValueError(f"shard {j}: field 'count' must be a non-negative integer, got {s['count']!r}"[:200])
    files = s.get("files")
    if files is not None and not (isinstance(files, list) and all(
            isinstance(f, dict) and isinstance(f.get("name"), str) and is_int(f.get("size")) and f["size"] >= 0
            for f in files)):
        raise ValueError(f"shard {j}: field 'files' must be a list of {{name, size, xxh3_128, etag}}, "
                         f"got {files!r}"[:200])
    ext = s.get("extents")
    if ext is not None and not (isinstance(ext, dict) and isinstance(ext.get("name"), str)
                                and isinstance(ext.get("file"), str) and is_int(ext.get("size")) and ext["size"] >= 0):
        raise ValueError(f"shard {j}: field 'extents' must be an object {{name, file, size, xxh3_128, etag}}, "
                         f"got {ext!r}"[:200])
    shape = s.get("raw_shape")
    if shape is not None and not (isinstance(shape, list) and len(shape) == 3 and all(
            is_int(v) and v > 0 for v in shape)):
        raise ValueError(f"shard {j}: field 'raw_shape' must be null or [H, W, C], got {shape!r}"[:200])


def _extents_source(manifest: str, entry: dict | None) -> dict | None:
    """A shard entry's ``"extents"`` for the cache, with the object's URL resolved."""
    if not entry:
        return None
    return {**entry, "url": resolve_location(manifest, entry["name"])}


def _bytes_on_disk(location: str) -> int | None:
    """Bytes of the file or folder at ``location``; None for a server store or nothing there."""
    if "://" in location:
        return None
    try:
        if os.path.isdir(location):
            return sum(e.stat().st_size for e in os.scandir(location) if e.is_file())
        return os.path.getsize(location)
    except OSError:
        return None


def shard_entry(manifest: str, location: str, fmt: str, reader: StoreReader, shard=None) -> dict:
    """The manifest entry describing the open shard ``reader`` (reads 2 records at most)."""
    n = reader.metadata.count
    first = reader.get(0).key if n else None
    last = reader.get(n - 1).key if n else None
    return {"location": relative_location(manifest, location), "format": fmt, "count": n,
            "index_checksum": reader.metadata.index_checksum, "encoding": reader.encoding,
            "raw_shape": list(reader.raw_shape) if reader.raw_shape else None,
            "first_key": first, "last_key": last,
            "shard": shard if shard is not None else reader.metadata.build_options.get("shard")}


@register_store
class ManifestStore(Store):
    """A JSON manifest listing shard stores that read as one dataset."""

    name = "manifest"
    description = ("manifest file listing shard stores of any format, read as one dataset "
                   "(packer merge, --engine dask; a build writes one LMDB shard)")
    composite = True
    suffixes = (MANIFEST_SUFFIX,)   # build -o train.packer-manifest.json: a manifest over one shard
    writer_options = {"shard_format": "format of the shard store a build writes (default lmdb)"}
    reader_options = {
        "max_open": f"shards kept open per process (default {DEFAULT_MAX_OPEN})",
        "uri": "passed to MongoDB shards", "timeout": "passed to MongoDB shards",
        "retries": "passed to MongoDB shards", "cache_bytes": "passed to HDF5 shards",
        "cache_dir": "manifest in a bucket: the node-local shard cache (default PACKER_CACHE_DIR "
                     "or ~/.cache/packer/remote)",
        "cache_limit": "manifest in a bucket: bytes the shard cache may hold (default unbounded)",
        "read_ahead": "manifest in a bucket: shards downloaded ahead of use (default 2)",
        "storage_options": "manifest in a bucket: fsspec options (credentials, endpoint)",
    }

    @classmethod
    def claims(cls, location: str) -> bool:
        if remote.is_url(location):   # one small ranged read, unless the name says it
            if location.endswith(MANIFEST_SUFFIX):
                return True
            try:
                size = remote.stat(location).size
                head = remote.read(location, 0, min(64, size))
            except remote.RemoteError as exc:
                if exc.transient:
                    raise
                return False
            return b"".join(head.split()).startswith(_MAGIC.replace(b" ", b""))
        try:
            with open(location, "rb") as fh:
                return b"".join(fh.read(64).split()).startswith(_MAGIC.replace(b" ", b""))
        except OSError:
            return False

    @classmethod
    def exists(cls, location: str, **connection) -> bool:
        return os.path.lexists(location)

    @classmethod
    def create_writer(cls, location: str, **options) -> "ManifestWriter":
        commit_bytes = options.pop("commit_bytes", None)
        cls.check_options(options, "writer")
        fmt = options.get("shard_format", "lmdb")
        if fmt == cls.name:
            raise UsageError("manifest: shard_format must be a store format, not 'manifest'")
        get_store(fmt)
        kw = {} if commit_bytes is None else {"commit_bytes": int(commit_bytes)}
        return ManifestWriter(str(location), shard_format=fmt, **kw)

    @classmethod
    def open_reader(cls, location: str, **options) -> "ManifestReader":
        cls.check_options(options, "reader")
        remote_opts = {k: options.pop(k) for k in ("cache_dir", "cache_limit", "read_ahead", "storage_options")
                       if k in options}
        default = DEFAULT_REMOTE_MAX_OPEN if remote.is_url(str(location)) else DEFAULT_MAX_OPEN
        given = options.pop("max_open", None)
        max_open = default if given is None else int(given)
        if max_open < 1:
            raise UsageError(f"manifest: max_open must be >= 1, got {max_open}")
        return ManifestReader(str(location), max_open=max_open, shard_options=options, **remote_opts)


class ManifestWriter(StoreWriter):
    """A build into a manifest: one shard store at ``<out>.shards/shard-00000-of-00001.<ext>``.

    Everything but publishing is the shard writer's (staging, resume, fault injection); publish
    publishes the shard, then writes the manifest (the commit marker) atomically.
    """

    def __init__(self, location: str, *, shard_format: str = "lmdb", **kw):
        super().__init__(location, **kw)
        self.shard_format = shard_format
        from packer.core.sharding import shard_name
        self.shard_location = os.path.join(location.rstrip("/") + ".shards",
                                           shard_name(0, 1, shard_suffix(shard_format)))
        self._inner = None

    def _open_staging(self, fingerprint: str, resume: bool) -> ResumeState:
        os.makedirs(os.path.dirname(self.shard_location), exist_ok=True)
        self._inner = get_store(self.shard_format).create_writer(self.shard_location,
                                                                  commit_bytes=self.commit_bytes)
        return self._inner.open(fingerprint, resume)

    def add(self, record: Record) -> None:
        self._inner.add(record)

    def checkpoint(self, state: ResumeState) -> None:
        self._state = state
        self._inner.checkpoint(state)

    def flush(self) -> None:
        self._inner.flush()

    def _write_batch(self, records, state) -> None:   # everything goes through the shard writer
        self._inner._write_batch(records, state)

    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        return self._inner.iter_index()

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        if os.path.lexists(self.location) and not overwrite:
            raise UsageError(f"{self.location} exists (hint: --overwrite replaces it)")
        self._inner.publish(dataclasses.replace(metadata, format=self.shard_format), overwrite=True)
        with get_store(self.shard_format).open_reader(self.shard_location) as reader:
            entry = shard_entry(self.location, self.shard_location, self.shard_format, reader)
        meta = dataclasses.replace(metadata, index_checksum=manifest_checksum([entry]),
                                   build_options=dict(metadata.build_options, shard_format=self.shard_format))
        write_manifest(self.location, meta, [entry], overwrite=overwrite, build_id=metadata.build_id)

    def _close(self) -> None:
        if self._inner is not None:
            self._inner._close()


class ManifestReader(StoreReader):
    """Read-only view of a manifest: global indices over lazily opened shards.

    ``shard_boundaries`` lists ``[0, end_0, end_1, ..., len]``: records of shard ``j`` are
    ``shard_boundaries[j]:shard_boundaries[j+1]`` (for samplers that prefer shard-local reads).
    """

    def __init__(self, location: str, *, max_open: int = DEFAULT_MAX_OPEN, shard_options=None,
                 cache_dir: str | None = None, cache_limit=None, read_ahead: int | None = None,
                 storage_options: dict | None = None):
        self.location = location
        self.remote = remote.is_url(location)
        self.storage_options = storage_options
        if self.remote:
            # The manifest's version is pinned while it is read; a new one published later is
            # seen by the next open (a Dataset checks the build id then).
            info = remote.stat(location, storage_options)
            self.version = info.version
            self.metadata, self.shards = parse_manifest(
                remote.read(location, version=info.version, storage_options=storage_options), location)
        else:
            if cache_dir is not None or cache_limit is not None or storage_options is not None:
                raise UsageError(f"{location}: cache_dir, cache_limit and storage_options are for a manifest "
                                 f"in a bucket (s3://...), this one is a local file")
            if not os.path.isfile(location):
                raise StoreError(f"{location}: no manifest here")
            self.metadata, self.shards = read_manifest(location)
        self._cache_opts = {"cache_dir": cache_dir, "read_ahead": read_ahead,
                            "limit": None if cache_limit is None else _size(cache_limit)}
        self._cache = None
        counts = [int(s["count"]) for s in self.shards]
        self._offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        if int(self._offsets[-1]) != self.metadata.count:
            raise StoreError(f"{location}: manifest is damaged: shards hold {int(self._offsets[-1])} records, "
                             f"its metadata says {self.metadata.count}")
        if manifest_checksum(self.shards) != self.metadata.index_checksum:
            raise StoreError(f"{redact(location)}: manifest checksum mismatch: the shard list was edited or damaged")
        for j, s in enumerate(self.shards):   # shards open lazily: a count is bounded by its store's size
            size = _bytes_on_disk(self.shard_location(j))
            if size is not None and s["count"] > count_limit(size // 64):
                raise StoreError(f"{location}: manifest is damaged: shard {j} field 'count' says {s['count']} "
                                 f"records, more than its {size}-byte store can hold (64 bytes each at least)")
        encodings = {(s.get("encoding", "jpeg"), tuple(s.get("raw_shape") or ())) for s in self.shards}
        if len(encodings) > 1:
            raise StoreError(f"{location}: shards hold different encodings {sorted(encodings)}")
        enc, shape = encodings.pop() if encodings else ("jpeg", ())
        self.encoding, self.raw_shape = enc, (tuple(shape) or None)
        self.max_open = max_open
        self._shard_options = dict(shard_options or {})
        self._open: collections.OrderedDict = collections.OrderedDict()
        self._ranged_shards: set = set()     # shards this process read one record of by ranges
        self._pid = os.getpid()
        self._reading = threading.RLock()   # held by a read: the cache's thread closes nothing then
        if self.remote:
            self._make_cache()   # refuses a cache too small up front

    # -- the node-local cache (a manifest in a bucket) ----------------------------------------------
    def _make_cache(self):
        from packer.stores.cache import DEFAULT_READ_AHEAD, ShardCache, ShardSource, cache_root

        o = self._cache_opts
        sources = [ShardSource(j, self.shard_location(j), s["format"], s["index_checksum"], s.get("files"),
                               _extents_source(self.location, s.get("extents")))
                   for j, s in enumerate(self.shards)]
        ra = DEFAULT_READ_AHEAD if o["read_ahead"] is None else int(o["read_ahead"])
        self._cache = ShardCache(cache_root(o["cache_dir"], self.location), sources, limit=o["limit"],
                                 read_ahead=ra, max_open=self.max_open,
                                 storage_options=self.storage_options, label=self.location)
        self._cache.on_pressure = self._close_idle
        return self._cache

    def _own_process(self) -> None:
        """Inherited through fork: the open shards, and the read lock, are the parent's."""
        if self._pid != os.getpid():
            self.discard_after_fork()
            self._pid = os.getpid()

    def _read_lock(self):
        """The lock a read holds (this process's own)."""
        self._own_process()
        return self._reading

    def _close_idle(self) -> None:
        """The node's cache has no room for a shard some process needs: close every shard open
        here, unless a read is under way in another thread (a read here that needs room calls
        this itself, between shards, so it closes them too)."""
        if self._pid != os.getpid() or not self._reading.acquire(blocking=False):
            return
        try:
            for k in list(self._open):
                self._close_one(k)
        finally:
            self._reading.release()

    @property
    def cache(self):
        """The :class:`~packer.stores.cache.ShardCache` of a manifest in a bucket (None for a local one)."""
        return self._cache

    def set_shard_order(self, order, *, epoch: int = 0) -> None:
        """Plan the cache by the order in which shards will be read (see :func:`cache.write_plan`)."""
        if self._cache is not None:
            self._cache.set_order(order, epoch=epoch)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"], state["_open"], state["_reading"] = None, collections.OrderedDict(), None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reading = threading.RLock()
        if self.remote:
            self._make_cache()

    # -- shards ---------------------------------------------------------------------------------
    @property
    def shard_boundaries(self) -> list:
        return [int(x) for x in self._offsets]

    def shard_location(self, j: int) -> str:
        return resolve_location(self.location, self.shards[j]["location"])

    def open_shard(self, j: int) -> StoreReader:
        """Shard ``j``'s reader, opened now if needed and checked against its manifest entry
        (for a manifest in a bucket: from the node-local cache, downloaded first if needed)."""
        self._own_process()
        r = self._open.get(j)
        if r is not None:
            self._open.move_to_end(j)
            if self._cache is not None:
                self._cache.advance(j)
            return r
        entry, loc = self.shards[j], redact(self.shard_location(j))
        cls = get_store(entry["format"])
        opts = {k: v for k, v in self._shard_options.items() if k in cls.reader_options}
        if self._cache is not None:
            self._cache.advance(j)
            self._close_finished()
            while len(self._open) >= self.max_open:   # make room first: each open shard is pinned
                self._close_one(next(iter(self._open)))
        path = self._cache.acquire(j) if self._cache is not None else self.shard_location(j)
        try:
            r = cls.open_reader(path, **opts)
        except StoreError as exc:
            self._release(j)
            raise StoreError(f"{redact(self.location)}: shard {j} ({loc}) cannot be opened: {exc}") from exc
        if r.metadata.count != int(entry["count"]) or r.metadata.index_checksum != entry["index_checksum"]:
            r.close()
            self._release(j)
            raise StoreError(f"{redact(self.location)}: shard {j} ({loc}) changed since the manifest was written "
                             f"(holds {r.metadata.count} records, index checksum {r.metadata.index_checksum}; "
                             f"manifest says {entry['count']}, {entry['index_checksum']})")
        self._open[j] = r
        while len(self._open) > self.max_open:
            self._close_one(next(iter(self._open)))
        return r

    def _ranged(self, indices: Sequence[int]) -> Record | None:
        """A lone record of a shard in a bucket that is not on this node and not open here, read
        by byte ranges (``ds[i]`` without the whole shard); None to read it the ordinary way.

        Only the first such read of a shard in a process: a second read of the same shard, or a
        batch, brings the whole shard into the cache (a scan should not pay a request per record).
        """
        if self._cache is None or len(indices) != 1:
            return None
        index = int(indices[0])
        j, local = self.locate(index)
        if j in self._open or j in self._ranged_shards or self._cache.is_cached(j):
            return None
        self._ranged_shards.add(j)
        parts = self._cache.record_parts(j, local)
        if parts is None:
            return None
        cls = get_store(self.shards[j]["format"])
        rec = cls.record_from_parts(redact(self.shard_location(j)), self.metadata.label_schema, local, *parts)
        return self._globalize(rec, index)

    def _release(self, j: int) -> None:
        if self._cache is not None:
            self._cache.release(j)

    def _close_one(self, j: int) -> None:
        self._open.pop(j).close()
        self._release(j)

    def _close_finished(self) -> None:
        """Close shards not read soon in the planned order: an open shard stays pinned in the
        cache, and one read again only next epoch should not hold its place."""
        for k in [k for k in self._open if self._cache.far(k)]:
            self._close_one(k)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, index within the shard) of global ``index``; IndexError when out of range."""
        n = self.metadata.count
        if not 0 <= index < n:
            raise IndexError(f"{self.location}: index {index} out of range 0..{n - 1}")
        j = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return j, index - int(self._offsets[j])

    def _runs(self, indices: Sequence[int]):
        """Consecutive runs of ``indices`` that fall in the same shard: (shard, [(global, local)])."""
        run, shard = [], None
        for g in indices:
            j, local = self.locate(int(g))
            if j != shard and run:
                yield shard, run
                run = []
            shard = j
            run.append((int(g), local))
        if run:
            yield shard, run

    @staticmethod
    def _globalize(rec: Record, index: int) -> Record:
        if rec.index == index:
            return rec
        intact = rec.meta_ok()
        rec = dataclasses.replace(rec, index=index)
        if intact:   # re-seal under the global index; a damaged record stays detectably damaged
            rec.meta_checksum = rec.meta_digest()
        return rec

    # -- StoreReader ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._offsets[-1])

    def get(self, index: int) -> Record:
        rec = self._ranged([index])
        if rec is not None:
            return rec
        j, local = self.locate(int(index))
        with self._read_lock():
            return self._globalize(self.open_shard(j).get(local), int(index))

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        rec = self._ranged(indices)
        if rec is not None:
            return [rec]
        out = []
        with self._read_lock():
            for j, run in self._runs(indices):
                recs = self.open_shard(j).get_many([loc for _, loc in run])
                out.extend(self._globalize(r, g) for r, (g, _) in zip(recs, run))
        return out

    def map_records(self, indices: Sequence[int], fn) -> list:
        rec = self._ranged(indices)
        if rec is not None:
            return [fn(rec)]
        out = []
        with self._read_lock():
            for j, run in self._runs(indices):
                globals_ = iter([g for g, _ in run])
                out.extend(self.open_shard(j).map_records([loc for _, loc in run],
                                                          lambda r: fn(self._globalize(r, next(globals_)))))
        return out

    def index_of(self, key: str) -> int:
        for j, s in enumerate(self.shards):
            first, last = s.get("first_key"), s.get("last_key")
            if int(s["count"]) == 0 or (first is not None and last is not None
                                         and not first <= key <= last and s.get("shard")):
                continue   # shards of a sharded build hold sorted, disjoint key ranges
            try:
                with self._read_lock():
                    return int(self._offsets[j]) + self.open_shard(j).index_of(key)
            except KeyError:
                continue
        raise KeyError(key)

    def quarantine_bytes(self, n: int) -> bytes:
        """Bytes of ``metadata.quarantine[n]``: kept by the shard named in the entry (a repaired
        manifest lists its shards' quarantine entries, each with its ``shard``)."""
        entries = self.metadata.quarantine or []
        if not 0 <= n < len(entries) or entries[n].get("shard") is None:
            raise StoreError(f"{self.location}: no quarantine entry {n} with a shard")
        j = int(entries[n]["shard"])
        local = sum(1 for e in entries[:n] if e.get("shard") == j)
        with self._read_lock():
            return self.open_shard(j).quarantine_bytes(local)

    def check_structure(self) -> list[str]:
        problems = []
        for j in range(len(self.shards)):
            try:
                with self._read_lock():
                    problems.extend(f"shard {j}: {p}" for p in self.open_shard(j).check_structure())
            except StoreError as exc:
                problems.append(str(exc))
        return problems

    def size_bytes(self) -> int:
        if self.remote:   # what the bucket holds, as the manifest lists it (no download)
            files = [f for s in self.shards for f in (s.get("files") or [])]
            return sum(int(f["size"]) for f in files) if files else 0
        total = os.path.getsize(self.location)
        for j, s in enumerate(self.shards):
            try:
                total += self.open_shard(j).size_bytes()
            except StoreError:
                pass   # reported by verify; size is best effort
        return total

    def close(self) -> None:
        opened, self._open = getattr(self, "_open", {}), collections.OrderedDict()
        if getattr(self, "_pid", None) == os.getpid():
            for r in opened.values():
                r.close()
        if getattr(self, "_cache", None) is not None:
            self._cache.close()

    def discard_after_fork(self) -> None:
        for r in self._open.values():
            r.discard_after_fork()
        self._open.clear()
        self._reading = threading.RLock()   # one held by a thread of the parent would never be released
        if self._cache is not None:
            self._cache._check_pid()   # forget the parent's pins and thread, keep the plan


__all__ = ["ManifestStore", "ManifestReader", "ManifestWriter", "manifest_checksum", "read_manifest",
           "write_manifest", "parse_manifest", "resolve_location", "relative_location", "shard_entry",
           "MANIFEST_SUFFIX", "shard_formats", "shard_suffix"]
