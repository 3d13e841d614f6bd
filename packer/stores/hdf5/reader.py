"""The HDF5 reader: a published (or, in salvage, damaged) store opened lazily per process,
checked against the build it first read, records read one contiguous run per dataset read,
and the store's structure checked for verify.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Iterator, Sequence

import numpy as np

from packer.core.errors import RecordError, StoreError
from packer.core.records import Record, StoreMetadata, loads_bounded
from packer.stores.base import StoreReader, load_metadata, partial_location, remove_path, replaced_error, store_identity
from packer.stores.hdf5.layout import (
    BLOB_PAIRS,
    DEFAULT_CACHE_BYTES,
    LAYOUT_ATTR,
    MAX_COMPRESSION,
    META_ATTR,
    READ_DATASETS,
    ROW_DATASETS,
    open_h5,
)
from packer.stores.hdf5.salvage import read_raw_chunks

log = logging.getLogger(__name__)


class HDF5Reader(StoreReader):
    """Read-only view of a published HDF5 store; decodes nothing (see ``readers``).

    The h5py file is opened on first use in each process and re-opened after a fork, so a
    reader made in the parent of DataLoader workers is safe to use (and to pickle) in them.
    Every such (re-)open checks that the file at the path is still the store version whose
    metadata this reader read (its build id): a store rebuilt in place meanwhile raises
    StoreError, so one reader never hands out records of two stores.
    Per process it keeps the offsets datasets in memory (8 bytes per record each, read on first
    use), so that ``get`` costs one read per dataset it needs, not two.
    """

    def __init__(self, location: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 file_path: str | None = None, salvage: bool = False, lost_heap: str | None = None):
        """``file_path``: read that file (a padded copy made by salvage, removed by
        :meth:`release_salvage_copy`) while messages keep naming ``location``. ``salvage``: see
        :meth:`Store.open_salvage`. ``lost_heap``: the problem
        :func:`packer.stores.hdf5.salvage.cut_heap` found (the file's strings are then never read)."""
        self._lost_heap = lost_heap
        self._salvage_copy = str(file_path) if file_path else None
        self.location = str(location)
        self._path = str(file_path or location)
        self.cache_bytes = int(cache_bytes)
        self._file = None
        self._pid = None
        self._dsets = None
        self._key_index = None
        self._salvage = salvage
        self.salvage_problems = []
        self._identity = None   # build id of the metadata read at open; every later open checks it
        if not os.path.isfile(self._path):
            hint = " (a build is in progress or was interrupted; rerun it to resume)" \
                if os.path.exists(partial_location(self.location)) else ""
            raise StoreError(f"{self.location}: no HDF5 store here{hint}")
        try:
            self._inspect(self._h5())
        finally:
            # Hold no HDF5 handle until records are read, so a fork right after opening
            # (DataLoader workers) inherits nothing; get() opens the file where it reads.
            self.close()

    def _inspect(self, f) -> None:
        self.metadata = raw = None
        if self._lost_heap:
            # Reading a string of a global heap collection cut short never returns (HDF5 loops
            # on the zeros past the cut): nothing holding strings (metadata, keys) is read, and
            # no record is reachable.
            self.salvage_problems.append(self._lost_heap)
            self.layout, self.encoding, self.raw_shape, self._len = "jpeg", "jpeg", None, 0
            self.metadata = StoreMetadata(format="hdf5", count=0, label_schema="none",
                                          class_names=[], build_options={}, index_checksum="")
            return
        try:
            raw = f.attrs.get(META_ATTR)
            if raw is None:
                raise StoreError(f"{self.location}: incomplete store (no {META_ATTR} attribute; "
                                 f"the build did not finish)")
        except (StoreError, OSError, RuntimeError) as exc:
            self._metadata_problem(exc)
        try:
            self._inspect_layout(f)
            rows = "pixels" if self.layout == "pixels" else "keys"
            present, holder = self._len, f"rows in its '{rows}' dataset"
        except (OSError, RuntimeError, KeyError, ValueError, StoreError) as exc:
            why = str(exc) if isinstance(exc, StoreError) else f"{self.location}: HDF5 structure unreadable: {exc}"
            if not self._salvage:
                raise StoreError(why) from exc
            # No record is reachable; the metadata (if it read) still tells repair what to rebuild.
            self.salvage_problems.append(why)
            self.layout, self.encoding, self.raw_shape, self._len = "jpeg", "jpeg", None, 0
            # Every record takes more than 64 bytes of the file (its JSON fields alone).
            size = os.path.getsize(self._path)
            present, holder = size // 64, f"records a file of {size} bytes can hold (64 bytes each)"
        if raw is not None:
            try:
                self.metadata = load_metadata(self.location, raw, present, holder)
                self._identity = store_identity(self.metadata)
            except StoreError as exc:
                self._metadata_problem(exc)
        if self.metadata is None:
            self.metadata = StoreMetadata(format="hdf5", count=self._len, label_schema="none",
                                          class_names=[], build_options={}, index_checksum="")

    def _metadata_problem(self, exc) -> None:
        """Metadata missing or damaged: raise it, or in salvage keep it as a problem."""
        why = str(exc) if isinstance(exc, StoreError) else f"{self.location}: store metadata unreadable: {exc}"
        if not self._salvage:
            raise StoreError(why) from exc
        self.salvage_problems.append(why)
        self.metadata = None

    def _inspect_layout(self, f) -> None:
        layout = f.attrs.get(LAYOUT_ATTR, "jpeg")
        self.layout = layout.decode() if isinstance(layout, bytes) else str(layout)
        rows = "pixels" if self.layout == "pixels" else "keys"
        needed = ["keys", "checksums", "record_meta", "record_meta_offsets"]
        needed += ["pixels"] if self.layout == "pixels" else ["jpeg_bytes", "jpeg_offsets"]
        missing = [name for name in needed if name not in f]
        if missing:
            raise StoreError(f"{self.location}: dataset(s) {missing} missing ({self.layout} layout)")
        size = os.path.getsize(self._path)
        for name in READ_DATASETS:
            if name in f:
                _check_declared_size(self.location, f[name], size)
        if self.layout == "pixels":
            self.encoding = "raw"
            self.raw_shape = tuple(int(v) for v in f["pixels"].shape[1:])
        else:
            self.encoding = "jpeg"
            self.raw_shape = None
        # A published file never changes: the record count is read once.
        self._len = int(f[rows].shape[0])

    # -- process-local handle ------------------------------------------------------------------
    def _h5(self):
        """The h5py file of this process (opened lazily, re-opened after a fork)."""
        pid = os.getpid()
        if self._file is not None and self._pid == pid:
            return self._file
        self.discard_after_fork()
        # Chunk cache: room for ~100 JPEG chunks or pixel images per dataset; nslots a prime
        # well above the number of chunks that fit; w0 favours evicting fully read chunks.
        cache = dict(rdcc_nbytes=self.cache_bytes, rdcc_nslots=10007, rdcc_w0=0.75)
        try:
            self._file = open_h5(self._path, "r", False, **cache)
        except OSError as exc:
            m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(exc))
            if m:
                have, need = int(m.group(1)), int(m.group(2))
                raise StoreError(f"{self.location}: store file cut short: it holds {have} bytes, its superblock "
                                 f"says {need} ({need - have} bytes missing; an interrupted copy?) "
                                 f"(hint: packer repair) [{exc}]") from exc
            raise StoreError(f"{self.location}: cannot open HDF5 file: {exc}") from exc
        self._pid = pid
        if self._identity is not None:
            self._check_identity(self._file)
        return self._file

    def _check_identity(self, f) -> None:
        """StoreError (and the handle closed) unless ``f``, just opened at the store's path, holds
        the store version this reader read its metadata from: a publish renames a new file onto
        the path, so a re-open (after a fork, a close, an error) may find another store there."""
        try:
            raw = f.attrs.get(META_ATTR)
            found = "none (no metadata)" if raw is None else store_identity(StoreMetadata.from_json(raw))
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            found = f"unreadable ({exc})"
        if found != self._identity:
            self.close()
            raise replaced_error(self.location, self._identity, found)

    def _ds(self) -> dict:
        """Dataset handles of this process, looked up once (h5py lookups cost per call)."""
        f = self._h5()
        if self._dsets is None:
            try:
                d = {name: f[name] for name in READ_DATASETS if name in f}
            except (KeyError, OSError, RuntimeError) as exc:
                raise StoreError(f"{self.location}: HDF5 datasets unreadable: {exc}") from exc

            d["keys"] = d["keys"].asstr()
            d["sizes"] = {name: int(ds.shape[0]) for name, ds in d.items()}
            d["offsets"] = {}
            self._dsets = d
        return self._dsets

    def _offsets(self, name: str) -> np.ndarray:
        d = self._ds()
        o = d["offsets"].get(name)
        if o is None:
            o = d["offsets"][name] = d[name][:]
        return o

    def discard_after_fork(self) -> None:
        """Drop a handle opened by another process (the parent, before fork).

        The file is open read-only, so closing this process's copy writes nothing and leaves
        the parent's handle alone; without it HDF5 would hand the next open the inherited file
        state instead of a clean handle of our own.
        """
        inherited, self._file, self._dsets, self._key_index = self._file, None, None, None
        if inherited is not None and self._pid != os.getpid():
            try:
                inherited.close()
            except (OSError, ValueError, RuntimeError) as exc:
                log.debug("%s: closing the handle inherited through fork: %s", self.location, exc)
        elif inherited is not None:
            inherited.close()   # our own: a plain close
        self._pid = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_file=None, _pid=None, _dsets=None, _key_index=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    # -- contract --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def _check_index(self, index: int) -> int:
        if self._salvage and self._len == 0 and 0 <= index < self.metadata.count:
            raise RecordError(self.location, f"#{index}", "unreachable: the HDF5 structure is damaged", index)
        if self._len <= index < self.metadata.count:   # the metadata counts more than the file holds
            raise RecordError(self.location, f"#{index}", f"record missing: the file holds {self._len} records, "
                              f"its metadata says {self.metadata.count}", index)
        if not 0 <= index < self._len:
            valid = f"0..{self._len - 1}" if self._len else "none: the store is empty"
            raise IndexError(f"{self.location}: index {index} out of range ({valid})")
        return index

    def get(self, index: int) -> Record:
        index = self._check_index(int(index))
        return self._read_run(index, index + 1)[0]

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        """Records at ``indices`` in that order; each contiguous run is one read per dataset."""
        idx = [self._check_index(int(i)) for i in indices]
        got: dict[int, Record] = {}
        for s, e in _runs(sorted(set(idx))):
            for j, rec in enumerate(self._read_run(s, e)):
                got[s + j] = rec
        return [got[i] for i in idx]

    def _key(self, index: int) -> str:
        try:
            return self._ds()["keys"][index]
        except (OSError, ValueError, UnicodeDecodeError, RuntimeError, StoreError):
            return f"#{index}"

    def _blobs(self, data: str, offs: str, s: int, e: int) -> list:
        """Slices s..e-1 of a (data, offsets) pair, read with one call."""
        d = self._ds()
        o = self._offsets(offs)[s:e + 1].tolist()
        if len(o) != e - s + 1 or o[0] < 0 or o[-1] > d["sizes"][data] or \
                any(o[j] > o[j + 1] for j in range(e - s)):
            raise ValueError(f"'{offs}' entries {s}..{e} are inconsistent ({o[:3]}...)")
        lo = o[0]
        try:
            buf = d[data][lo:o[-1]]
        except (OSError, RuntimeError):
            if not self._salvage:
                raise
            buf = read_raw_chunks(d[data], lo, o[-1])
        return [buf[o[j] - lo:o[j + 1] - lo] for j in range(e - s)]

    def _read_run(self, s: int, e: int) -> list[Record]:
        """Records s..e-1 with one read per dataset. A run that fails is re-read record by
        record, so the error names the exact key."""
        try:
            metas = self._blobs("record_meta", "record_meta_offsets", s, e)
            blobs = self._data(s, e)
            labels = self._labels(s, e)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            if e - s > 1:
                return [rec for i in range(s, e) for rec in self._read_run(i, i + 1)]
            # h5py raises OSError when a chunk fails Fletcher32 or does not decompress, and
            # RuntimeError for damaged HDF5 structures (e.g. "wrong B-tree signature").
            reason = f"stored data unreadable (damaged chunk): {exc}" if isinstance(exc, (OSError, RuntimeError)) \
                else str(exc)
            raise RecordError(self.location, self._key(s), reason, s) from exc
        out = []
        for j in range(e - s):
            i = s + j
            try:
                meta = loads_bounded(metas[j].tobytes())
                label = meta.pop("label") if "label" in meta else labels[j]
                rec = Record.from_meta(dict(meta, label=label), blobs[j], self.metadata.label_schema)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise RecordError(self.location, self._key(i), f"record metadata is damaged: {exc}", i) from exc
            if rec.index != i:
                raise RecordError(self.location, rec.key, f"record says index {rec.index}, stored at {i}", i)
            out.append(rec)
        return out

    def read_labels(self, batch: int = 4096) -> list:
        """Labels from ``record_meta`` and the label datasets only (no image bytes), checked
        against each record's metadata checksum."""
        out = []
        for s in range(0, self.metadata.count, batch):
            e = min(self.metadata.count, s + batch)
            try:
                metas = self._blobs("record_meta", "record_meta_offsets", s, e)
                labels = self._labels(s, e)
            except (OSError, ValueError) as exc:
                raise RecordError(self.location, self._key(s), f"record metadata unreadable: {exc}", s) from exc
            for j in range(e - s):
                try:
                    meta = loads_bounded(metas[j].tobytes())
                    label = meta.pop("label") if "label" in meta else labels[j]
                    rec = Record.from_meta(dict(meta, label=label), b"", self.metadata.label_schema)
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    raise RecordError(self.location, self._key(s + j), f"record metadata is damaged: {exc}",
                                      s + j) from exc
                if not rec.meta_ok():
                    raise RecordError(self.location, rec.key, "record checksum mismatch: label or record "
                                      "fields are damaged", s + j)
                out.append(rec.label)
        return out

    def _data(self, s: int, e: int) -> list[bytes]:
        if self.layout == "pixels":
            arr = self._ds()["pixels"][s:e]
            return [arr[j].tobytes() for j in range(e - s)]
        return [b.tobytes() for b in self._blobs("jpeg_bytes", "jpeg_offsets", s, e)]

    def _labels(self, s: int, e: int) -> list:
        """JSON-style label values (see packer.core.records.label_from_json) for records s..e-1."""
        d = self._ds()
        schema = self.metadata.label_schema
        if schema == "class" and "class_ids" in d:
            return [int(v) for v in d["class_ids"][s:e]]
        if schema == "boxes" and "boxes" in d:
            return self._blobs("boxes", "box_offsets", s, e)
        if schema == "boxes":
            return [np.zeros((0, 5), np.float32) for _ in range(e - s)]
        return [None] * (e - s)

    def index_of(self, key: str) -> int:
        self._h5()   # a fork drops the lookup with the handle
        if self._key_index is None:
            keys = self._ds()["keys"][:]
            self._key_index = {k: i for i, k in enumerate(keys)}
        return self._key_index[key]

    def check_structure(self) -> list[str]:
        """Dataset lengths, offsets, duplicate keys, and keys/checksums against record_meta."""
        if self._lost_heap:
            return list(self.salvage_problems)   # reading on would hang (see _inspect)
        try:
            return self.salvage_problems + self._check_structure()
        except (OSError, RuntimeError, ValueError, KeyError, StoreError) as exc:
            # h5py's RuntimeError ("wrong B-tree signature") must not escape as a traceback.
            return self.salvage_problems + [f"{self.location}: HDF5 structure unreadable: {exc}"]

    def quarantine_bytes(self, n: int) -> bytes:
        try:
            ds = self._h5()[f"quarantine/{int(n)}"]
            _check_declared_size(self.location, ds, self.size_bytes())
            return ds[()].tobytes()
        except (KeyError, OSError, RuntimeError, ValueError) as exc:
            raise StoreError(f"{self.location}: quarantine entry {n} unreadable: {exc}") from exc

    def _check_structure(self) -> list[str]:
        d = self._ds()
        where, n = self.location, self._len
        problems = []
        for name in ROW_DATASETS:
            if name in d and d[name].shape[0] != n:
                problems.append(f"{where}: dataset '{name}' holds {d[name].shape[0]} entries, expected {n}")
        if self.metadata.label_schema == "class" and "class_ids" not in d and n:
            problems.append(f"{where}: label schema 'class' but no 'class_ids' dataset")
        for data, offs in BLOB_PAIRS:
            if offs not in d:
                continue
            try:
                o = d[offs][:]
            except (OSError, RuntimeError) as exc:
                problems.append(f"{where}: dataset '{offs}' unreadable: {exc}")
                continue
            if o.shape[0] != n + 1:
                problems.append(f"{where}: dataset '{offs}' holds {o.shape[0]} entries, expected {n + 1}")
            if o.size and o[0] != 0:
                problems.append(f"{where}: dataset '{offs}' starts at {o[0]}, expected 0")
            bad = np.flatnonzero(np.diff(o) < 0)
            if bad.size:
                problems.append(f"{where}: dataset '{offs}' decreases at {bad.size} place(s), first at index {bad[0]}")
            if o.size and o[-1] != d[data].shape[0]:
                problems.append(f"{where}: dataset '{offs}' ends at {o[-1]}, '{data}' holds {d[data].shape[0]}")
        if problems:
            return problems   # the comparison below would only repeat them
        try:
            keys = d["keys"][:].tolist()
            sums = d["checksums"][:].tolist()
        except (OSError, UnicodeDecodeError, RuntimeError) as exc:
            return [f"{where}: datasets 'keys' / 'checksums' unreadable: {exc}"]
        if len(set(keys)) != len(keys):
            seen, dups = set(), []
            for k in keys:
                if k in seen:
                    dups.append(k)
                seen.add(k)
            problems.append(f"{where}: {len(dups)} duplicate key(s), e.g. {dups[0]!r}")
        step = 65536
        for s in range(0, n, step):
            e = min(n, s + step)
            try:
                metas = self._blobs("record_meta", "record_meta_offsets", s, e)
            except (OSError, ValueError, RuntimeError):
                continue   # damaged chunks are reported per record by verify
            for j, raw in enumerate(metas):
                try:
                    meta = loads_bounded(raw.tobytes())
                except ValueError:
                    continue   # reported per record by verify
                if not isinstance(meta, dict):
                    continue   # reported per record by verify
                i = s + j
                if meta.get("key") != keys[i] or meta.get("checksum", "").encode() != sums[i]:
                    problems.append(f"{where}: record {i}: 'keys'/'checksums' say {keys[i]!r} "
                                    f"{sums[i].decode(errors='replace')}, record_meta says "
                                    f"{meta.get('key')!r} {meta.get('checksum')}")
        return problems

    def size_bytes(self) -> int:
        try:
            return os.path.getsize(self._path)
        except OSError:
            return 0

    def close(self) -> None:
        f, self._file = getattr(self, "_file", None), None
        self._dsets, self._key_index = None, None
        if f is not None and self._pid == os.getpid():
            f.close()

    def release_salvage_copy(self) -> None:
        """Remove the padded copy :meth:`HDF5Store.open_salvage` read through (if any)."""
        self.close()
        copy = getattr(self, "_salvage_copy", None)
        if copy:
            remove_path(os.path.dirname(copy))
            self._salvage_copy = None


def _check_declared_size(location: str, ds, file_size: int) -> None:
    """StoreError when dataset ``ds`` declares more bytes than a file of ``file_size`` bytes can
    hold (HDF5 reads unwritten chunks as zeros, so a small file may declare terabytes: reading
    it would allocate them). Pixel datasets must also be (N, H, W, 1 or 3) uint8."""
    name = ds.name.rsplit("/", 1)[-1]
    shape = tuple(int(v) for v in ds.shape)
    if name == "pixels" and (len(shape) != 4 or shape[3] not in (1, 3) or ds.dtype != np.uint8):
        raise StoreError(f"{location}: dataset 'pixels' is {ds.dtype} of shape {shape}, expected uint8 "
                         f"(N, H, W, 3)")
    declared = int(np.prod(shape, dtype=object)) * ds.dtype.itemsize
    room = file_size * (1 if ds.compression is None else MAX_COMPRESSION)
    if declared > room:
        what = f"{shape[0]} images of {shape[1]}x{shape[2]}x{shape[3]} pixels" if name == "pixels" else \
            f"shape {shape} of {ds.dtype}"
        raise StoreError(f"{location}: dataset '{name}' declares {what} ({declared:,} bytes), more than the "
                         f"{file_size:,}-byte file can hold")


def _runs(sorted_unique: Sequence[int]) -> Iterator[tuple[int, int]]:
    """[2, 3, 4, 8, 9, 11] -> (2, 5), (8, 10), (11, 12)."""
    it = iter(sorted_unique)
    start = prev = next(it, None)
    if start is None:
        return
    for i in it:
        if i != prev + 1:
            yield start, prev + 1
            start = i
        prev = i
    yield start, prev + 1
