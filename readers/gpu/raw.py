"""Raw-bytes batch access on every store: checked JPEG bytes + sizes + labels, no CPU decode.

:func:`read_raw` reads a batch through the store's ``map_records`` (LMDB hands out zero-copy views
of its memory map), checks each record (data and field checksums, unless ``check=False``) and
copies the bytes ONCE into one (pinned, when CUDA is available) host buffer. :class:`RawReader`
opens one store handle per thread and reads the parts of a batch in parallel.

Example:
    >>> rr = RawReader("train.lmdb", threads=8)                      # doctest: +SKIP
    >>> raw = rr.read([0, 5, 9])                                     # doctest: +SKIP
    >>> raw.datas()[0][:2].tolist(), raw.sizes[0].tolist()           # doctest: +SKIP
    ([255, 216], [375, 500])
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
import torch

from packer.errors import RecordError
from packer.records import checksum_matches
from packer.stores import detect_format, open_store

__all__ = ["RawBatch", "RawReader", "read_raw"]


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
        """Each sample's bytes as a 1-D uint8 tensor view of its (pinned) buffer."""
        return [self.buffers[b][o : o + n] for b, o, n in self.parts]

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
        self.pos = 0

    def _alloc(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8, pin_memory=self.pin)

    def append(self, data) -> tuple:
        src = np.frombuffer(data, dtype=np.uint8)
        n = src.size
        if self.pos + n > self.a.size:
            bigger = self._alloc(max(2 * self.a.size, self.pos + n))
            bigger.numpy()[: self.pos] = self.a[: self.pos]
            self.t, self.a = bigger, bigger.numpy()
        self.a[self.pos : self.pos + n] = src
        off = self.pos
        self.pos += n
        return off, n


def read_raw(reader, indices: Sequence[int], *, check: bool = True, pin: Optional[bool] = None,
             capacity: int = 0) -> RawBatch:
    """Reads ``indices`` from an open store reader into one host buffer, checked.

    Args:
        reader: an open :class:`packer.stores.base.StoreReader` (any backend).
        indices: record indices, in the order wanted.
        check: verify each record's data and field checksums (RecordError when damaged).
        pin: page-locked buffer (default: when CUDA is available), for asynchronous H2D copies.
        capacity: first guess of the batch's bytes (the buffer grows as needed).

    Raises:
        RecordError: a damaged or unreadable record, naming the store and key.
    """
    pin = torch.cuda.is_available() if pin is None else pin
    buf = _Buffer(capacity or 1 << 20, pin)
    location = getattr(reader, "location", "?")

    def take(rec):
        # Copy first (numpy copies without the GIL, and takes the page faults of a memory-mapped
        # store there), then check the copy: hot in cache, and it is the bytes that will be used.
        off, n = buf.append(rec.data)
        if check and not checksum_matches(buf.a[off : off + n], rec.checksum, rec.checksum_algorithm):
            raise RecordError(location, rec.key, "checksum mismatch: stored bytes are damaged", rec.index)
        if check and not rec.meta_ok():
            raise RecordError(location, rec.key, "record checksum mismatch: label or record fields are damaged",
                              rec.index)
        return (off, n, rec.height, rec.width, rec.index, rec.key, rec.label, rec.orientation,
                (rec.coding, rec.subsampling))

    rows = reader.map_records([int(i) for i in indices], take)
    sizes = torch.tensor([[r[2], r[3]] for r in rows], dtype=torch.int64).reshape(-1, 2)
    return RawBatch(
        [buf.t[: buf.pos]], [(0, r[0], r[1]) for r in rows], sizes, [r[4] for r in rows],
        [r[5] for r in rows], [r[6] for r in rows], [r[7] for r in rows],
        reader.encoding, reader.raw_shape, buf.pos, [r[8] for r in rows],
    )


class RawReader:
    """Reads raw batches from a store with ``threads`` parallel readers (one handle per thread,
    opened lazily in the thread and process that uses it; safe to pickle into workers).

    Args:
        location: store path or ``mongodb://...``.
        format: store format (default: detected).
        threads: parallel readers per batch (a batch is split into this many parts).
        check: verify checksums (see :func:`read_raw`).
        reader_options: passed to the backend.
    """

    def __init__(self, location, *, format: Optional[str] = None, threads: int = 4, check: bool = True,
                 reader_options: Optional[dict] = None):
        self.location = str(location)
        self.format = format or detect_format(self.location)
        self.threads = max(1, int(threads))
        self.check = check
        self.reader_options = dict(reader_options or {})
        with open_store(self.location, self.format, **self.reader_options) as r:
            self.metadata = r.metadata
            self.encoding, self.raw_shape = r.encoding, r.raw_shape
        self._local = threading.local()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pid = None
        self._capacity = 0
        self._handles: list = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.metadata.count

    def __getstate__(self):
        d = self.__dict__.copy()
        d.update(_local=None, _pool=None, _pid=None, _handles=[], _lock=None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._local = threading.local()
        self._lock = threading.Lock()

    def _reader(self):
        r = getattr(self._local, "reader", None)
        if r is None or self._local.pid != os.getpid():
            r = open_store(self.location, self.format, **self.reader_options)
            self._local.reader, self._local.pid = r, os.getpid()
            with self._lock:
                self._handles.append(r)
        return r

    def _read_part(self, idx: Sequence[int]) -> RawBatch:
        return read_raw(self._reader(), idx, check=self.check, capacity=self._capacity // self.threads)

    def read(self, indices: Sequence[int]) -> RawBatch:
        """The records at ``indices`` (in that order), checked, in pinned host memory.

        Raises:
            RecordError: a damaged record (store and key named).
        """
        indices = [int(i) for i in indices]
        n = min(self.threads, max(1, len(indices) // 8))
        if n == 1:
            rb = self._read_part(indices)
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
        for h in handles:
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
                 reader_options: Optional[dict] = None):
        self.location, self.format = str(location), format or detect_format(str(location))
        self.check, self.on_error = check, on_error
        self.reader_options = dict(reader_options or {})
        with open_store(self.location, self.format, **self.reader_options) as r:
            self.count = r.metadata.count
        self._reader = None
        self._pid = None

    def __len__(self) -> int:
        return self.count

    def __getstate__(self):
        d = self.__dict__.copy()
        d.update(_reader=None, _pid=None)
        return d

    def _open(self):
        if self._reader is None or self._pid != os.getpid():
            if self._reader is not None:
                self._reader.discard_after_fork()
            self._reader = open_store(self.location, self.format, **self.reader_options)
            self._pid = os.getpid()
        return self._reader

    def __getitem__(self, index: int):
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> dict:
        reader = self._open()
        skipped: List[str] = []
        try:
            parts = [read_raw(reader, list(indices), check=self.check, pin=False)]
        except RecordError as exc:
            if self.on_error == "raise":
                return {"error": (exc.store, exc.key, exc.reason, exc.index)}
            parts = []
            for i in indices:  # isolate the damaged record(s)
                try:
                    parts.append(read_raw(reader, [i], check=self.check, pin=False))
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
