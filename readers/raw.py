"""Raw-bytes batch access on every store: checked JPEG bytes + sizes + labels, no CPU decode.

:func:`read_raw` reads a batch through the store's ``map_records`` (LMDB hands out zero-copy views
of its memory map), checks each record (data and field checksums, unless ``check=False``) and
copies the bytes ONCE into one (pinned, when CUDA is available) host buffer. :class:`RawReader`
opens one store handle per thread and reads the parts of a batch in parallel; :class:`RawDataset`
does the same in DataLoader worker processes. CPU-side (it decodes nothing): the GPU loader
(:mod:`readers.gpu`) and :class:`readers.CropDataset` both read through it.

Example:
    >>> rr = RawReader("train.lmdb", threads=8)                      # doctest: +SKIP
    >>> raw = rr.read([0, 5, 9])                                     # doctest: +SKIP
    >>> raw.datas()[0][:2].tolist(), raw.sizes[0].tolist()           # doctest: +SKIP
    ([255, 216], [375, 500])
"""
from __future__ import annotations

import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
import torch

from packer.core.errors import RecordError, StoreError
from packer.core.records import checksum_matches
from packer.stores import detect_format, open_store

__all__ = ["RawBatch", "RawDataset", "RawReader", "RecordFacts", "read_raw"]

#: Largest piece hashed in one xxhash call (its GIL-release threshold is 64 KiB).
_XXH_PIECE = 1 << 16

#: Fewest records per parallel part of a batch read (RawReader.read).
_MIN_PART = 64


@dataclass
class RawBatch:
    """A batch of stored bytes, as read (before any decode).

    Attributes:
        buffers: host uint8 tensors (pinned when CUDA is available) holding the bytes, one per
            part read in parallel.
        parts: per sample ``(buffer number, offset, length)``.
        sizes: int64 ``[B, 2]`` (height, width) per sample, from the record (no decode needed).
        indices, keys, labels, orientations: per sample.
        encoding: ``"jpeg"`` or ``"raw"`` (pixels of ``raw_shape``, HDF5 pixel mode).
        jpeg: per sample ``(coding, subsampling)`` as the store recorded them at build
            (``("", "")`` for stores that predate them): decoders route on it before decoding.
    """

    buffers: List[torch.Tensor]
    parts: List[tuple]
    sizes: torch.Tensor
    indices: List[int]
    keys: List[str]
    labels: list
    orientations: List[int]
    encoding: str = "jpeg"
    raw_shape: Optional[tuple] = None
    nbytes: int = field(default=0)
    jpeg: Optional[List[tuple]] = None

    def __len__(self) -> int:
        return len(self.parts)

    def datas(self) -> List[torch.Tensor]:
        """Each sample's bytes as a 1-D uint8 tensor view of its (pinned) buffer.

        Records read back to back into one buffer (the usual case) are cut with ONE
        ``split_with_sizes`` call rather than a slice each (each tensor call releases and re-takes
        the GIL, which the loader's other threads then contend for)."""
        out: List[torch.Tensor] = []
        run_start = 0
        parts = self.parts
        while run_start < len(parts):
            b, o, _ = parts[run_start]
            end, pos = run_start, o
            while end < len(parts) and parts[end][0] == b and parts[end][1] == pos:
                pos += parts[end][2]
                end += 1
            sizes = [n for _, _, n in parts[run_start:end]]
            out.extend(self.buffers[b][o:pos].split_with_sizes(sizes) if end - run_start > 1
                       else [self.buffers[b][o:pos]])
            run_start = end
        return out

    @staticmethod
    def concat(batches: Sequence["RawBatch"]) -> "RawBatch":
        """Batches read in parallel, as one (the buffers are kept, not copied)."""
        if len(batches) == 1:
            return batches[0]
        buffers, parts = [], []
        for rb in batches:
            base = len(buffers)
            buffers.extend(rb.buffers)
            parts.extend((b + base, o, n) for b, o, n in rb.parts)
        first = batches[0]
        return RawBatch(
            buffers, parts, torch.cat([b.sizes for b in batches]),
            [i for b in batches for i in b.indices], [k for b in batches for k in b.keys],
            [lab for b in batches for lab in b.labels], [o for b in batches for o in b.orientations],
            first.encoding, first.raw_shape, sum(b.nbytes for b in batches),
            None if any(b.jpeg is None for b in batches) else [j for b in batches for j in b.jpeg],
        )


class _Buffer:
    """A growable host byte buffer (pinned when CUDA is available): one copy per record."""

    def __init__(self, capacity: int, pin: bool):
        self.pin = pin
        self.t = self._alloc(max(capacity, 1 << 16))
        self.a = self.t.numpy()
        self.m = memoryview(self.a)
        self.pos = 0

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8, pin_memory=self.pin)

    def reserve(self, n: int) -> int:
        """Room for ``n`` more bytes (the buffer grows, keeping what it holds); returns ``pos``."""
        if self.pos + n > self.a.size:
            bigger = self._alloc(max(2 * self.a.size, self.pos + n))
            bigger.numpy()[: self.pos] = self.a[: self.pos]
            self.t, self.a = bigger, bigger.numpy()
            self.m = memoryview(self.a)
        return self.pos

    def append(self, data) -> tuple:
        # A memoryview copy keeps the GIL (a numpy copy drops and re-takes it for every record:
        # with the loader's other threads waiting, each re-take is a thread handoff).
        src = data if isinstance(data, memoryview) else memoryview(data)
        n = src.nbytes
        self.reserve(n)
        self.m[self.pos : self.pos + n] = src.cast("B") if src.format != "B" or src.ndim != 1 else src
        off = self.pos
        self.pos += n
        return off, n


#: ``PACKER_NATIVE_RECORDS``: records read before are checked (and copied) by gpu_ops' C++ op,
#: one call per batch with the GIL released (unset or ``1``), or by a Python loop that keeps the
#: GIL (``0``). The op is the default for every batch size: on an H100 host (16 cores) the GPU
#: loader's training rows ran 1-9% faster with it than with the loop on 7 of 8 rows (one 1%
#: slower), ~500 px batches (10 MB) included, and ResNet-18 trained 2-4% faster
#: (docs/benchmarks.md, "Record checks in C++"). Its one
#: cost is the GIL's return after the call (up to ``sys.getswitchinterval()``, 5 ms): on the
#: 2-core VM, beside a thread that runs pure Python without releasing the GIL, 10 MB batches read
#: 0.29-0.43x as fast through the op (scripts/bench_records.py); a training thread's torch calls
#: release the GIL, and there the op won.
NATIVE_RECORDS_ENV = "PACKER_NATIVE_RECORDS"
_GATHER_OP = None  # gpu_ops.ops.gather_check_xxh3 once its kernel is found; False: not in this build


def _native_wanted() -> bool:
    return os.environ.get(NATIVE_RECORDS_ENV, "").strip() != "0"


def _gather_op():
    """:func:`gpu_ops.ops.gather_check_xxh3` (``gpu_ops/csrc/cpu/records.cpp``: a batch of records
    checked against their XXH3-128 digests and copied into one buffer, in one call with the GIL
    released), or None where ``gpu_ops._C`` lacks it (not built, or built from older sources): the
    callers then do the same work in a Python loop."""
    global _GATHER_OP
    if _GATHER_OP is None:
        try:
            from gpu_ops import ops  # importing it loads gpu_ops._C (or warns once)

            found = ops.has_kernel("gather_check_xxh3")
        except (ImportError, RuntimeError):
            found = False
        _GATHER_OP = ops.gather_check_xxh3 if found else False
    return _GATHER_OP or None


def _digest_fn(algorithm: Optional[str]):
    """The raw-digest function of a store's checksum algorithm (None: not known, no fast path)."""
    if algorithm == "xxh3-128":
        import xxhash

        def xxh3_digest(data) -> bytes:
            # xxhash drops the GIL for inputs over 64 KiB; fed in 64 KiB pieces (same digest) it
            # keeps it: ~20 us per 350 kB photo, less than one contended thread handoff costs.
            mv = memoryview(data)
            if mv.nbytes <= _XXH_PIECE:
                return xxhash.xxh3_128_digest(mv)
            h = xxhash.xxh3_128()
            for s in range(0, mv.nbytes, _XXH_PIECE):
                h.update(mv[s : s + _XXH_PIECE])
            return h.digest()

        return xxh3_digest
    if algorithm == "blake2b-128":
        import hashlib

        return lambda data: hashlib.blake2b(data, digest_size=16).digest()
    return None


class RecordFacts:
    """What a batch needs of each record besides its bytes, kept after the record's first checked
    read: key, label, size, EXIF orientation, JPEG coding/subsampling and the data checksum.

    Later reads of that record then fetch only its bytes (``StoreReader.map_data``: one LMDB
    ``get``) and check them against the kept checksum, instead of parsing and re-checking the
    metadata JSON each time (that was ~60% of a read's cost: 46 -> 10 us per ~30 kB record on the
    2-core VM). The metadata was checked (its own checksum) when it was kept; the bytes are checked
    on every read. Memory: ~50 bytes per record of the store up front (numpy arrays and two lists),
    plus the key and label objects of the records read, e.g. ~150 MB for ImageNet-1k's 1.28M records
    in a process that reads them all (``cache_facts=False`` turns it off).

    Thread-safe for the reader threads of one process (a row is marked known only once written).
    """

    def __init__(self, count: int, algorithm: Optional[str]):
        self.count = int(count)
        self.algorithm = algorithm
        self.digest_of = _digest_fn(algorithm)
        self.known = np.zeros(self.count, dtype=bool)
        self.hw = np.zeros((self.count, 2), dtype=np.int64)
        self.orientation = np.zeros(self.count, dtype=np.uint8)
        self.jpeg_code = np.zeros(self.count, dtype=np.uint8)
        self.digest = np.zeros((self.count, 16), dtype=np.uint8)
        self.keys: list = [None] * self.count
        self.labels: list = [None] * self.count
        # Where each record's bytes lie in the store's data file (LMDB), once known: later reads
        # copy them out of this object's own read-only map of that file, with no store call.
        self.offset = np.full(self.count, -1, dtype=np.int64)
        self.length = np.zeros(self.count, dtype=np.int64)
        self._file_id = None
        self._file = None
        self._file_view: Optional[memoryview] = None
        self._file_tensor: Optional[torch.Tensor] = None
        self._jpeg_table: List[tuple] = [("", "")]
        self._jpeg_codes = {("", ""): 0}
        self._lock = threading.Lock()

    @property
    def usable(self) -> bool:
        return self.digest_of is not None

    def all_known(self, indices: Sequence[int]) -> bool:
        return bool(self.known[indices].all()) if len(indices) else True

    def in_file(self, indices) -> bool:
        """True when every record's bytes can be read from this object's map of the data file."""
        return self._file_view is not None and bool((self.offset[indices] >= 0).all())

    def file_view(self, offset: int, length: int) -> memoryview:
        return self._file_view[offset : offset + length]

    def check_file_covers(self, ends) -> None:
        """Raises StoreError when the mapped data file is now shorter than the largest of
        ``ends`` (where records read before end): it was cut short since it was mapped, and
        reading those pages would kill the process (SIGBUS). One ``fstat``; a cut made after it
        still crashes (see ``LMDBReader._begin``)."""
        ends = np.asarray(ends)
        end = int(ends.max()) if ends.size else 0
        have = os.fstat(self._file.fileno()).st_size
        if have < end:
            raise StoreError(f"{self._file.name}: store file cut short while open: it now holds {have} "
                             f"bytes, records read before end at {end}; reading on would crash the "
                             f"process (hint: packer verify)")

    def native_spans(self, idx: np.ndarray, check: bool, location: str,
                     out: Optional[torch.Tensor] = None, threads: int = 1) -> bool:
        """Checks the bytes of known records ``idx`` (where ``check``) in this object's map of the
        data file and, with ``out``, copies them back to back into it first (the copy is what is
        checked): one C++ call with the GIL released (:func:`_gather_op`), on ``threads`` threads.
        False where that op is not used (not built, a checksum other than XXH3-128, or
        ``PACKER_NATIVE_RECORDS=0``): the caller loops in Python.

        Raises:
            RecordError: the first record whose bytes do not match (naming its key).
        """
        if self.algorithm != "xxh3-128" or not _native_wanted():
            return False
        op = _gather_op()
        if op is None:
            return False
        starts = self.offset[idx]
        spans = torch.from_numpy(np.stack([starts, starts + self.length[idx]], axis=1))
        digests = torch.from_numpy(self.digest[idx]) if check else None
        # The call is this path's one GIL release: the verdict is read with numpy, since a torch
        # call on it would release the GIL again, and with the loader's other Python threads
        # waiting each re-take is a thread handoff (up to sys.getswitchinterval(), 5 ms).
        bad = np.flatnonzero(op(self.file_tensor(), spans, digests, out, int(threads)).numpy())
        if bad.size:
            i = int(idx[int(bad[0])])
            raise RecordError(location, self.keys[i], "checksum mismatch: stored bytes are damaged", i)
        return True

    def check_bytes(self, index: int, data, location: str) -> None:
        """Raises RecordError (naming the record's key) unless ``data`` matches record
        ``index``'s kept checksum."""
        if self.digest_of(data) != self.digest[index].tobytes():
            raise RecordError(location, self.keys[index], "checksum mismatch: stored bytes are damaged", index)

    def file_tensor(self) -> torch.Tensor:
        """The whole map of the data file as a read-only uint8 tensor (made once; keeps the map
        open while any tensor or view of it lives). Only for reading: the pages are the file's."""
        t = self._file_tensor
        if t is None:
            with warnings.catch_warnings():  # "non-writable array": nothing ever writes through it
                warnings.simplefilter("ignore", UserWarning)
                t = self._file_tensor = torch.from_numpy(np.frombuffer(self._file_view, dtype=np.uint8))
        return t

    def read_in_place(self, indices: Sequence[int], check: bool, location: str) -> Optional[tuple]:
        """``(file tensor, spans)`` of known records whose bytes lie in this object's map of the data
        file, each checked against its kept checksum where ``check``; ``spans`` is int64
        ``[B, 2]`` (start, end) into the file tensor. None when any record is not known or not in
        the map (read it with :func:`read_raw`).

        Nothing is copied: a decoder reads the bytes straight from the page cache. The bytes
        checked are the ones decoded, as long as the store file is not rewritten in place
        meanwhile (LMDB never rewrites a live record's pages; a replaced store is a new file, and
        this map keeps the old one).

        Raises:
            RecordError: a record's bytes do not match its checksum (naming its key).
        """
        idx = np.asarray(indices, dtype=np.int64)
        if not (self.usable and self.all_known(idx) and self.in_file(idx)):
            return None
        starts, lengths = self.offset[idx], self.length[idx]
        ends = starts + lengths
        self.check_file_covers(ends)
        if check and not self.native_spans(idx, True, location):
            for i, o, n in zip(indices, starts.tolist(), lengths.tolist()):
                self.check_bytes(i, self._file_view[o : o + n], location)
        spans = torch.from_numpy(np.stack([starts, ends], axis=1))
        return self.file_tensor(), spans

    def _attach(self, path: str, file_id) -> bool:
        """Maps the store's data file (once); False where offsets from ``file_id`` do not apply."""
        if self._file_id is not None:
            return self._file_id == file_id
        import mmap

        with self._lock:
            if self._file_id is None:
                try:
                    f = open(path, "rb")  # kept open: check_file_covers asks it for the size now
                    st = os.fstat(f.fileno())
                    if (st.st_dev, st.st_ino) != tuple(file_id):
                        f.close()
                        return False  # replaced since the store was opened
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                except (OSError, ValueError):
                    return False
                self._file, self._file_view = f, memoryview(mm)
                self._file_id = tuple(file_id)
        return self._file_id == tuple(file_id)

    def keep_offset(self, index: int, offset: Optional[int], length: int, data_file) -> None:
        """Records where ``index``'s checked bytes lie in ``data_file`` = (path, identity)."""
        if offset is None or offset < 0 or not 0 <= index < self.count or not self._attach(*data_file):
            return
        if offset + length <= len(self._file_view):
            self.length[index] = length
            self.offset[index] = offset

    def keep(self, rec) -> None:
        """Keeps the facts of a record whose data and metadata were just checked."""
        if self.digest_of is None or not 0 <= rec.index < self.count:
            return
        jpeg = (rec.coding, rec.subsampling)
        code = self._jpeg_codes.get(jpeg)
        if code is None:
            with self._lock:
                code = self._jpeg_codes.setdefault(jpeg, len(self._jpeg_table))
                if code == len(self._jpeg_table):
                    self._jpeg_table.append(jpeg)
        try:
            digest = np.frombuffer(bytes.fromhex(rec.checksum), dtype=np.uint8)
        except (TypeError, ValueError):  # unchecked read of damaged metadata: keep nothing
            return
        if digest.size != 16:
            return
        i = rec.index
        self.hw[i] = (rec.height, rec.width)
        self.orientation[i] = rec.orientation
        self.jpeg_code[i] = code
        self.digest[i] = digest
        self.keys[i], self.labels[i] = rec.key, rec.label
        self.known[i] = True

    def jpeg(self, indices) -> List[tuple]:
        table = self._jpeg_table
        return [table[c] for c in self.jpeg_code[indices].tolist()]


def _read_known(reader, indices: List[int], facts: RecordFacts, check: bool, buf: "_Buffer",
                threads: int = 1) -> RawBatch:
    """read_raw for records whose facts are kept: bytes only, checked against the kept checksum."""
    location = getattr(reader, "location", "?")

    def take(index, data):
        off, n = buf.append(data)
        if check:
            facts.check_bytes(index, buf.a[off : off + n], location)
        return (0, off, n)

    idx = np.asarray(indices, dtype=np.int64)
    if facts.in_file(idx):  # straight from the map of the data file: no store call
        starts, lengths = facts.offset[idx], facts.length[idx]
        facts.check_file_covers(starts + lengths)
        total = int(lengths.sum())
        base = buf.reserve(total)
        if facts.native_spans(idx, check, location, buf.t[base : base + total], threads):  # C++, no GIL
            offsets = base + np.cumsum(lengths) - lengths
            parts = [(0, o, n) for o, n in zip(offsets.tolist(), lengths.tolist())]
            buf.pos = base + total
        else:
            view = facts.file_view
            parts = [take(i, view(o, n)) for i, o, n in zip(indices, starts.tolist(), lengths.tolist())]
    else:
        parts = reader.map_data(indices, take)
    return RawBatch(
        [buf.t[: buf.pos]], parts, torch.from_numpy(facts.hw[idx]), list(indices),
        [facts.keys[i] for i in indices], [facts.labels[i] for i in indices],
        facts.orientation[idx].tolist(), reader.encoding, reader.raw_shape, buf.pos, facts.jpeg(idx),
    )


def read_raw(reader, indices: Sequence[int], *, check: bool = True, pin: Optional[bool] = None,
             capacity: int = 0, facts: Optional[RecordFacts] = None, threads: int = 1) -> RawBatch:
    """Reads ``indices`` from an open store reader into one host buffer, checked.

    Args:
        reader: an open :class:`packer.stores.base.StoreReader` (any backend).
        indices: record indices, in the order wanted.
        check: verify each record's data and field checksums (RecordError when damaged).
        pin: page-locked buffer (default: when CUDA is available), for asynchronous H2D copies.
        capacity: first guess of the batch's bytes (the buffer grows as needed).
        facts: a :class:`RecordFacts` of this store: records read before are read as bytes only
            (checked against the kept checksum); the others are read in full and kept.
        threads: threads of the C++ check-and-copy of records read before (where gpu_ops holds
            it: :meth:`RecordFacts.native_spans`).

    Raises:
        RecordError: a damaged or unreadable record, naming the store and key.
    """
    pin = torch.cuda.is_available() if pin is None else pin
    buf = _Buffer(capacity or 1 << 20, pin)
    location = getattr(reader, "location", "?")
    indices = [int(i) for i in indices]
    if (facts is not None and facts.usable and getattr(reader, "supports_map_data", False)
            and reader.encoding == "jpeg" and facts.all_known(indices)):
        return _read_known(reader, indices, facts, check, buf, threads)
    keep = facts.keep if facts is not None and facts.usable else None
    offset_of = getattr(reader, "file_offset", None) if keep is not None else None
    data_file = reader.data_file() if offset_of is not None else None

    def take(rec):
        # Copy first (numpy copies without the GIL, and takes the page faults of a memory-mapped
        # store there), then check the copy: hot in cache, and it is the bytes that will be used.
        off, n = buf.append(rec.data)
        if check and not checksum_matches(buf.a[off : off + n], rec.checksum, rec.checksum_algorithm):
            raise RecordError(location, rec.key, "checksum mismatch: stored bytes are damaged", rec.index)
        if check and not rec.meta_ok():
            raise RecordError(location, rec.key, "record checksum mismatch: label or record fields are damaged",
                              rec.index)
        if keep is not None:
            keep(rec)
            if offset_of is not None:
                facts.keep_offset(rec.index, offset_of(rec.data), n, data_file)
        return (off, n, rec.height, rec.width, rec.index, rec.key, rec.label, rec.orientation,
                (rec.coding, rec.subsampling))

    rows = reader.map_records(indices, take)
    sizes = torch.tensor([[r[2], r[3]] for r in rows], dtype=torch.int64).reshape(-1, 2)
    return RawBatch(
        [buf.t[: buf.pos]], [(0, r[0], r[1]) for r in rows], sizes, [r[4] for r in rows],
        [r[5] for r in rows], [r[6] for r in rows], [r[7] for r in rows],
        reader.encoding, reader.raw_shape, buf.pos, [r[8] for r in rows],
    )


def remote_options(reader_options: Optional[dict], cache_dir=None, cache_limit=None,
                   storage_options: Optional[dict] = None) -> dict:
    """``reader_options`` with the keywords of a store in a bucket added (``cache_dir``,
    ``cache_limit``, ``storage_options``: see docs/object-storage.md); only those given."""
    out = dict(reader_options or {})
    for k, v in (("cache_dir", cache_dir), ("cache_limit", cache_limit), ("storage_options", storage_options)):
        if v is not None:
            out[k] = str(v) if k == "cache_dir" else v
    return out


class RawReader:
    """Reads raw batches from a store with ``threads`` parallel readers (one handle per thread,
    opened lazily in the thread and process that uses it; safe to pickle into workers).

    Args:
        location: store path, ``mongodb://...``, or a manifest in a bucket
            (``s3://bucket/train.packer-manifest.json``).
        format: store format (default: detected).
        threads: parallel readers per batch (a batch is split into this many parts).
        check: verify checksums (see :func:`read_raw`).
        reader_options: passed to the backend.
        cache_dir, cache_limit, storage_options: for a manifest in a bucket: the node-local
            shard cache and its size limit in bytes, and fsspec options (docs/object-storage.md).
        cache_facts: keep each record's checked metadata after its first read
            (:class:`RecordFacts`), so later epochs read and check the bytes alone.
    """

    def __init__(self, location, *, format: Optional[str] = None, threads: int = 4, check: bool = True,
                 reader_options: Optional[dict] = None, cache_facts: bool = True,
                 cache_dir=None, cache_limit=None, storage_options: Optional[dict] = None):
        self.location = str(location)
        self.format = format or detect_format(self.location)
        self.threads = max(1, int(threads))
        self.check = check
        self.reader_options = remote_options(reader_options, cache_dir, cache_limit, storage_options)
        r = open_store(self.location, self.format, **self.reader_options)
        self.metadata = r.metadata
        #: Identity of the store version opened here: every per-thread handle must match it.
        self.build_id = r.build_id
        self.encoding, self.raw_shape = r.encoding, r.raw_shape
        self.cache_facts = cache_facts
        self._facts: Optional[RecordFacts] = None
        # The handle opened here serves this thread's reads (no second open, for a bucket no
        # second fetch of the manifest); other threads open their own in _reader().
        self._local = threading.local()
        self._local.reader, self._local.pid = r, os.getpid()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pid = None
        self._capacity = 0
        self._handles: list = [(os.getpid(), r)]     # (opening process, handle)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.metadata.count

    def __getstate__(self):
        d = self.__dict__.copy()
        d.update(_local=None, _pool=None, _pid=None, _handles=[], _lock=None, _facts=None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._local = threading.local()
        self._lock = threading.Lock()

    def _reader(self):
        r = getattr(self._local, "reader", None)
        if r is None or self._local.pid != os.getpid():
            self._local.reader = None
            r = open_store(self.location, self.format, **self.reader_options)
            # Kept facts and other threads' handles are of the store first opened: never mix.
            r.expect_build(self.build_id, since="this RawReader was created", hint="make a new RawReader")
            self._local.reader, self._local.pid = r, os.getpid()
            with self._lock:
                self._handles.append((os.getpid(), r))
        return r

    def facts(self) -> Optional[RecordFacts]:
        """This process's :class:`RecordFacts` of the store (None with ``cache_facts=False``)."""
        if not self.cache_facts:
            return None
        if self._facts is None:
            with self._lock:
                if self._facts is None:
                    self._facts = RecordFacts(self.metadata.count, self.metadata.checksum_algorithm)
        return self._facts

    def _read_part(self, idx: Sequence[int], threads: int = 1) -> RawBatch:
        return read_raw(self._reader(), idx, check=self.check, capacity=self._capacity // self.threads,
                        facts=self.facts(), threads=threads)

    def read(self, indices: Sequence[int]) -> RawBatch:
        """The records at ``indices`` (in that order), checked, in pinned host memory.

        Raises:
            RecordError: a damaged record (store and key named).
        """
        indices = [int(i) for i in indices]
        # Parts of at least _MIN_PART records: reading is mostly GIL-holding Python, so finer
        # splits only hand the GIL around (H100: GPULoader with 12 reader threads ran 30-40% slower
        # than with 4 at 1080p; on the 2-core VM 1-2 parts beat 4 and 12 with a no-op decoder).
        n = min(self.threads, max(1, len(indices) // _MIN_PART))
        facts = self.facts()
        if n > 1 and facts is not None and facts.usable and facts.all_known(indices) and getattr(
                self._reader(), "supports_map_data", False):
            n = 1  # bytes-only reads (~5 us a record): one part, no GIL handed between threads
            op_threads = self.threads  # ... checked and copied on this many C++ threads, where built
        else:
            op_threads = 1
        if n == 1:
            rb = self._read_part(indices, op_threads)
        else:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="packer-raw")
                self._pid = os.getpid()
            step = -(-len(indices) // n)
            parts = [indices[i : i + step] for i in range(0, len(indices), step)]
            rb = RawBatch.concat(list(self._pool.map(self._read_part, parts)))
        self._capacity = max(self._capacity, int(rb.nbytes * 1.25))
        return rb

    def close(self) -> None:
        """Stops the threads and closes every handle this process opened."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None
        with self._lock:
            handles, self._handles = self._handles, []
            self._local = threading.local()  # a read after close() opens fresh handles
        for pid, h in handles:
            if pid == os.getpid():           # a forked child leaves its parent's handles alone
                h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing useful to report
            pass


class RawDataset(torch.utils.data.Dataset):
    """Raw batches for DataLoader worker processes (``GPULoader(..., workers=N)``): reading runs
    outside the main process, so the per-record Python work (LMDB/HDF5/MongoDB calls, checksums)
    does not compete for the main process's GIL with the decode and pipeline threads.

    ``__getitems__(indices)`` returns one batch as a dict of plain tensors and lists (what a
    DataLoader can pass through shared memory and pin): ``data`` (uint8, the bytes back to back),
    ``parts``, ``sizes``, ``indices``, ``keys``, ``labels``, ``orientations``, ``skipped`` (messages
    of records left out with ``on_error="skip"``), or ``{"error": (store, key, reason, index)}``
    for a damaged record (re-raised as RecordError by the loader, type and key intact).
    Use ``collate_fn=RawDataset.collate`` (the identity).
    """

    def __init__(self, location, *, format: Optional[str] = None, check: bool = True, on_error: str = "raise",
                 reader_options: Optional[dict] = None, cache_facts: bool = True,
                 build_id: Optional[str] = None, cache_dir=None, cache_limit=None,
                 storage_options: Optional[dict] = None):
        """``build_id``: the store version the workers must read (a :class:`RawReader`'s, so
        that the loader's reader and its workers read one store); default: the one opened now."""
        self.location, self.format = str(location), format or detect_format(str(location))
        self.check, self.on_error = check, on_error
        self.reader_options = remote_options(reader_options, cache_dir, cache_limit, storage_options)
        with open_store(self.location, self.format, **self.reader_options) as r:
            if build_id is not None:
                r.expect_build(build_id, since="its RawReader was created", hint="make a new loader")
            self.count = r.metadata.count
            self._algorithm = r.metadata.checksum_algorithm
            self.build_id = r.build_id
        self.cache_facts = cache_facts
        self._reader = None
        self._facts = None
        self._pid = None

    def __len__(self) -> int:
        return self.count

    def __getstate__(self):
        d = self.__dict__.copy()
        d.update(_reader=None, _pid=None, _facts=None)
        return d

    def _open(self):
        if self._reader is None or self._pid != os.getpid():
            if self._reader is not None:
                self._reader.discard_after_fork()
            self._reader = None
            reader = open_store(self.location, self.format, **self.reader_options)
            reader.expect_build(self.build_id, since="this Dataset was created", hint="make a new Dataset")
            self._reader, self._pid = reader, os.getpid()
            self._facts = RecordFacts(self.count, self._algorithm) if self.cache_facts else None
        return self._reader

    def __getitem__(self, index: int):
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> dict:
        reader = self._open()
        skipped: List[str] = []
        try:
            parts = [read_raw(reader, list(indices), check=self.check, pin=False, facts=self._facts)]
        except RecordError as exc:
            if self.on_error == "raise":
                return {"error": (exc.store, exc.key, exc.reason, exc.index)}
            parts = []
            for i in indices:  # isolate the damaged record(s)
                try:
                    parts.append(read_raw(reader, [i], check=self.check, pin=False, facts=self._facts))
                except RecordError as one:
                    skipped.append(str(one))
        if not parts:
            return {"empty": True, "skipped": skipped}
        rb = RawBatch.concat(parts)
        data = torch.cat(rb.buffers) if len(rb.buffers) > 1 else rb.buffers[0]
        starts = np.cumsum([0] + [int(b.numel()) for b in rb.buffers])
        return {"data": data, "parts": [(0, int(starts[b]) + o, n) for b, o, n in rb.parts], "sizes": rb.sizes,
                "indices": rb.indices, "keys": rb.keys, "labels": rb.labels, "orientations": rb.orientations,
                "encoding": rb.encoding, "raw_shape": rb.raw_shape, "skipped": skipped, "jpeg": rb.jpeg}

    @staticmethod
    def collate(batch):
        return batch

    @staticmethod
    def to_raw(d: dict) -> Optional[RawBatch]:
        """The batch dict back as a RawBatch (None for an empty one); RecordError for an error."""
        if "error" in d:
            raise RecordError(*d["error"])
        if d.get("empty"):
            return None
        return RawBatch([d["data"]], d["parts"], d["sizes"], d["indices"], d["keys"], d["labels"], d["orientations"],
                        d["encoding"], d["raw_shape"], int(d["data"].numel()), d.get("jpeg"))
