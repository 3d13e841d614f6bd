"""HDF5 store: one ``.h5`` file, chunked and Fletcher32-checksummed, readable by standard tools.

Layout (``h5ls -r store.h5`` shows it; every dataset has a ``description`` attribute)::

    /                 attrs: packer_layout ("jpeg" or "pixels"), packer_metadata (StoreMetadata
                      JSON, written last: its presence marks a complete store)
    /jpeg_bytes       uint8  (total_bytes,)   every record's JPEG bytes, back to back      [jpeg]
    /jpeg_offsets     int64  (N+1,)           record i is jpeg_bytes[off[i]:off[i+1]]      [jpeg]
    /pixels           uint8  (N, H, W, 3)     decoded RGB, one image per chunk           [pixels]
    /keys             utf-8 strings (N,)      image path relative to the IMAGES folder
    /checksums        ascii  (N,)             BLAKE2b-128 hex of the stored bytes / pixels
    /class_ids        int64  (N,)             class labels ("class" stores)
    /boxes            float32 (M, 5)          YOLO rows class cx cy w h, all records     ("boxes")
    /box_offsets      int64  (N+1,)           record i owns boxes[off[i]:off[i+1]]       ("boxes")
    /record_meta      uint8  (bytes,)         Record fields but data and label, JSON per record
    /record_meta_offsets int64 (N+1,)         record i = record_meta[off[i]:off[i+1]]

The JPEG bytes live in one chunked 1-D dataset plus offsets rather than a variable-length
dataset: h5py's vlen reads are slow and HDF5 >= 1.12.1 refuses filters (Fletcher32 included)
on vlen data. Fletcher32 on ``jpeg_bytes`` / ``pixels`` / ``record_meta`` makes a damaged chunk
fail to read; the reader turns that into :class:`~packer.errors.RecordError` naming the key.
``record_meta`` repeats key and checksum so that ``get`` reads only numeric datasets (string
datasets cost ~10x more per read in h5py); ``keys`` and ``checksums`` are there for people and
tools (``h5dump -d keys``), ``index_of`` and the index checksum.

Pixel mode (writer option ``pixels=HxW``) stores decoded, resized RGB instead of JPEG bytes:
no decode at read time, at the cost of size (``compression=lzf|gzip[:level]`` helps).

Writes go to ``<out>.partial`` (resume state in ``/_resume_state`` while building) and the
file is renamed onto ``<out>`` at publish. Readers open the file lazily in the process that
uses them (re-opening after a fork), read-only and without HDF5 file locking (NFS-safe).

Example:
    >>> from packer.stores import open_store                     # doctest: +SKIP
    >>> with open_store("train.h5") as store:
    ...     rec = store.get(0); print(rec.key, rec.label, store.encoding)
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from typing import Iterator, Sequence

import numpy as np

from ..diskspace import disk_full, is_disk_full, require_room
from ..errors import (DependencyError, DiskFullError, ImageError, RecordError, ResumeMismatchError, StoreError,
                      UsageError)
from ..records import Record, StoreMetadata, checksum, loads_bounded
from . import register_store
from .base import (ResumeState, Store, StoreReader, StoreWriter, load_metadata, parse_size, replaced_error,
                   store_identity,
                   partial_location, remove_path)

log = logging.getLogger(__name__)

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
META_ATTR = "packer_metadata"
LAYOUT_ATTR = "packer_layout"
OPTIONS_ATTR = "packer_writer_options"
STATE_DSET = "_resume_state"
CLEAN_ATTR = "_closed_cleanly"      # on a partial file: closed by the writer, not killed

DEFAULT_CHUNK_BYTES = 128 << 10     # jpeg_bytes chunk: a few records; small random-read overhead
DEFAULT_CACHE_BYTES = 16 << 20      # reader chunk cache per dataset (rdcc_nbytes)
_ROWS_PER_CHUNK = 1024              # per-record datasets (keys, checksums, offsets, ...)
_CHECKSUM_LEN = 32                  # BLAKE2b-128 hex
_READ_DATASETS = ("jpeg_bytes", "jpeg_offsets", "pixels", "keys", "checksums", "record_meta",
                  "record_meta_offsets", "class_ids", "boxes", "box_offsets")
#: (data, offsets) pairs: record i is data[offsets[i]:offsets[i+1]]
_BLOB_PAIRS = (("jpeg_bytes", "jpeg_offsets"), ("record_meta", "record_meta_offsets"), ("boxes", "box_offsets"))
#: datasets with one entry per record
_ROW_DATASETS = ("keys", "checksums", "class_ids", "pixels")
#: Room kept free beyond a batch's own bytes: B-tree nodes, heaps, the resume state and the
#: clean-close mark. HDF5 must never meet a full disk (see HDF5Writer._writing).
_WRITE_MARGIN = 4 << 20
#: How much any HDF5 compression filter can shrink data (deflate's limit is about 1032:1): a
#: dataset declaring more bytes than this times the file's size cannot be stored in the file.
_MAX_COMPRESSION = 1100


def _h5py():
    try:
        import h5py
    except ImportError as exc:
        raise DependencyError("the HDF5 store needs the 'h5py' package (pip install h5py)") from exc
    return h5py


def _open_h5(path: str, mode: str, locking, **kw):
    """``h5py.File`` with a file-locking mode, on HDF5 builds too old to take one as well.

    Readers pass ``locking=False`` (read-only opens need no lock, and locks fail on NFS,
    h5py#1082); writers pass ``"best-effort"`` (lock where the file system can).
    """
    h5py = _h5py()
    try:
        return h5py.File(path, mode, locking=locking, **kw)
    except (TypeError, ValueError) as exc:
        if "lock" not in str(exc):
            raise
        # HDF5 < 1.10.7 / 1.12.1: only the environment variable switches locking off, and
        # only when the user has not chosen a setting.
        if locking is False:
            os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
        return h5py.File(path, mode, **kw)


_partial = partial_location



# ---------------------------------------------------------------------------------------
# Option parsing: values come as strings from the CLI (-O pixels=224x224) or typed from Python
# ---------------------------------------------------------------------------------------
def parse_pixels(value) -> tuple[int, int] | None:
    """``"224x224"`` / ``"224"`` / ``(224, 224)`` / ``None`` -> ``(H, W)`` or None (JPEG mode)."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    if isinstance(value, str):
        parts = re.split(r"[xX,\s]+", value.strip())
        try:
            dims = [int(p) for p in parts if p]
        except ValueError:
            dims = []
    elif isinstance(value, (int, np.integer)):
        dims = [int(value)]
    else:
        try:
            dims = [int(v) for v in value]
        except (TypeError, ValueError):
            dims = []
    if len(dims) == 1:
        dims = dims * 2
    if len(dims) != 2 or not all(0 < d <= 65535 for d in dims):
        raise UsageError(f"hdf5: option pixels={value!r} is not a size; expected HxW, e.g. pixels=224x224")
    return dims[0], dims[1]


def parse_compression(value) -> tuple[str | None, int | None]:
    """``"lzf"`` / ``"gzip"`` / ``"gzip:6"`` / ``None`` -> (h5py compression, level)."""
    if value is None or value is False:
        return None, None
    text = str(value).strip().lower()
    if text in ("", "none", "off", "false"):
        return None, None
    if text == "lzf":
        return "lzf", None
    m = re.fullmatch(r"gzip(?::(\d))?", text)
    if m:
        return "gzip", int(m.group(1) or 4)
    raise UsageError(f"hdf5: option compression={value!r} not understood; choose none, lzf, gzip or gzip:LEVEL (1-9)")


def parse_bytes(value, name: str) -> int:
    """``131072`` / ``"128K"`` / ``"1M"`` -> bytes (at least 1 KiB)."""
    return parse_size(value, store="hdf5", option=name, minimum=1024)


# ---------------------------------------------------------------------------------------
# Pixel mode conversion
# ---------------------------------------------------------------------------------------
def decode_resize(data, size: tuple[int, int], orientation: int = 1) -> np.ndarray:
    """JPEG bytes -> uint8 RGB ``(H, W, 3)`` resized to ``size`` = (H, W).

    EXIF in the bytes is ignored; ``orientation`` (the record's, "still to apply") is applied
    before resizing. INTER_AREA when shrinking (both sides), INTER_LINEAR otherwise.

    Raises:
        ValueError: the bytes do not decode.
    """
    import cv2

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if img is None:
        raise ValueError("OpenCV could not decode the JPEG")
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if orientation != 1:
        from ..integrity import apply_orientation
        img = apply_orientation(img, orientation)
    h, w = size
    if img.shape[:2] != (h, w):
        shrink = h <= img.shape[0] and w <= img.shape[1]
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return np.ascontiguousarray(img, dtype=np.uint8)


def to_pixel_record(record: Record, size: tuple[int, int]) -> Record:
    """The record as pixel mode stores it: data = RGB pixel bytes, checksum of those bytes.

    ``source_checksum`` / ``source_size`` keep describing the original input file.
    """
    try:
        pixels = decode_resize(record.data, size, int(record.orientation))
    except ValueError as exc:
        raise ImageError(record.key, f"cannot decode for HDF5 pixel mode: {exc}") from exc
    data = pixels.tobytes()
    converted = record.converted
    if record.orientation != 1:
        applied = f"exif-orientation {record.orientation} applied"
        converted = f"{converted}, {applied}" if converted else applied
    return Record(index=record.index, key=record.key, data=data, label=record.label,
                  width=size[1], height=size[0], channels=3, source_format=record.source_format,
                  converted=converted, orientation=1, checksum=checksum(data),
                  source_checksum=record.source_checksum, source_size=record.source_size,
                  notes=list(record.notes), metadata=dict(record.metadata))


def _is_class(label) -> bool:
    return isinstance(label, (int, np.integer)) and not isinstance(label, bool)


def _box_rows(label) -> np.ndarray | None:
    """Boxes label as float32 (N, 5); None for class ids and "no label"."""
    if label is None or _is_class(label) or isinstance(label, dict):
        return None
    return np.asarray(label, dtype=np.float32).reshape(-1, 5)


def _record_meta(record: Record) -> bytes:
    """Every Record field but data and label (those have datasets of their own), compact JSON."""
    d = record.meta_dict()
    label = d.pop("label")
    if record.label is None or isinstance(record.label, dict):
        # "no label" differs from class -1 / zero boxes; label-model dicts have no dataset
        d["label"] = label
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


def _append_blobs(f, data_name: str, offs_name: str, n: int, blobs: Sequence[np.ndarray]) -> None:
    """Append one blob per record to a (data, offsets) pair holding ``n`` records."""
    offs, data = f[offs_name], f[data_name]
    start = int(offs[n])
    ends = start + np.cumsum([len(b) for b in blobs], dtype=np.int64)
    if ends[-1] > start:
        data.resize(int(ends[-1]), axis=0)
        data[start:] = np.concatenate(blobs)
    offs.resize(n + len(blobs) + 1, axis=0)
    offs[n + 1:] = ends


@register_store
class HDF5Store(Store):
    """One HDF5 file (``.h5``): JPEG bytes (default) or decoded pixels, Fletcher32-checked."""

    name = "hdf5"
    description = "single HDF5 file: JPEG bytes in a chunked dataset, or pre-decoded pixels (pixels=HxW)"
    writer_options = {
        "pixels": "HxW: store decoded RGB resized to H x W instead of JPEG bytes (no decode at read time)",
        "compression": "pixel mode only: none (default), lzf, gzip or gzip:LEVEL",
        "chunk_bytes": f"chunk size of the JPEG byte dataset (default {DEFAULT_CHUNK_BYTES >> 10}K)",
    }
    reader_options = {
        "cache_bytes": f"HDF5 chunk cache per dataset (default {DEFAULT_CACHE_BYTES >> 20}M)",
    }
    suffixes = (".h5", ".hdf5")

    @classmethod
    def claims(cls, location: str) -> bool:
        try:
            with open(location, "rb") as fh:
                return fh.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
        except OSError:   # missing, a directory, unreadable
            return False

    @classmethod
    def exists(cls, location: str) -> bool:
        # Any file there would be replaced at publish: build refuses early unless overwrite.
        return os.path.lexists(location)

    @classmethod
    def is_store(cls, location: str, **connection) -> bool:
        """An HDF5 file whose root carries packer's ``packer_layout`` attribute (written when
        the file is created, so staging files and stores whose metadata was lost count). A file
        HDF5 cannot open (cut short, killed mid-write) counts when the attribute's name is in
        its first 64 KiB, where the root group's header is; another program's HDF5 does not."""
        if not cls.claims(location):
            return False
        try:
            with _open_h5(str(location), "r", False) as f:
                return LAYOUT_ATTR in f.attrs
        except OSError as exc:
            log.debug("%s: HDF5 refuses it (%s); looking for packer's attribute", location, exc)
        try:
            with open(location, "rb") as fh:
                return LAYOUT_ATTR.encode() in fh.read(1 << 16)
        except OSError:
            return False

    @classmethod
    def create_writer(cls, location: str, **options) -> "HDF5Writer":
        commit_bytes = options.pop("commit_bytes", None)
        cls.check_options(options, "writer")
        kw = {} if commit_bytes is None else {"commit_bytes": int(commit_bytes)}
        pixels = parse_pixels(options.get("pixels"))
        compression = parse_compression(options.get("compression"))
        if compression[0] and pixels is None:
            raise UsageError("hdf5: option compression applies to pixel mode only (JPEG bytes do not "
                             "compress); add pixels=HxW or drop compression")
        chunk_bytes = parse_bytes(options.get("chunk_bytes", DEFAULT_CHUNK_BYTES), "chunk_bytes")
        return HDF5Writer(str(location), pixels=pixels, compression=compression,
                          chunk_bytes=chunk_bytes, **kw)

    @classmethod
    def open_reader(cls, location: str, **options) -> "HDF5Reader":
        cls.check_options(options, "reader")
        cache = parse_bytes(options.get("cache_bytes", DEFAULT_CACHE_BYTES), "cache_bytes")
        return HDF5Reader(str(location), cache_bytes=cache)

    @classmethod
    def open_salvage(cls, location: str, **options) -> "HDF5Reader":
        """A reader that survives missing metadata and a file cut short.

        HDF5 refuses a file shorter than its superblock's end-of-file address; salvage reads a
        copy padded with zeros (sparse) to that size. The chunk B-trees are written near the
        end of the file, so a file cut short usually keeps no readable record: those are rebuilt
        from ``--source`` by repair.
        """
        cls.check_options(options, "reader")
        location = str(location)
        try:
            return HDF5Reader(location, salvage=True)
        except StoreError as exc:
            m = re.search(r"stored_eof = (\d+)", str(exc))
            if not m:
                raise
            need, cut = int(m.group(1)), str(exc)
        import tempfile
        tmp = tempfile.mkdtemp(prefix=".salvage-", dir=os.path.dirname(os.path.abspath(location)))
        copy = os.path.join(tmp, "store.h5")
        try:
            import shutil
            shutil.copyfile(location, copy)
            os.truncate(copy, need)
            reader = HDF5Reader(location, file_path=copy, salvage=True, lost_heap=_cut_heap(location))
        except OSError as exc:
            remove_path(tmp)
            if is_disk_full(exc):
                raise disk_full(copy, cause=exc, needed=os.path.getsize(location),
                                what="a padded copy of the store to read it") from exc
            raise StoreError(f"{location}: cannot make a padded copy to read the store: {exc}") from exc
        except BaseException:
            remove_path(tmp)
            raise
        reader._salvage_copy = copy
        reader.salvage_problems.insert(0, cut)
        return reader


class HDF5Writer(StoreWriter):
    """Builds ``<location>.partial`` and renames it onto ``location`` at publish."""

    def __init__(self, location: str, *, pixels=None, compression=(None, None),
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, **kw):
        super().__init__(location, **kw)
        self.pixels = pixels
        self.compression, self.compression_level = compression
        self.chunk_bytes = int(chunk_bytes)
        self._file = None
        self._count = 0
        self._write_failed = False
        self._held = []   # dataset handles kept open while writing (see _hold)

    # -- options that shape the file: a partial made with others cannot be resumed -------------
    def _layout_options(self) -> dict:
        return {"layout": "pixels" if self.pixels else "jpeg",
                "pixels": list(self.pixels) if self.pixels else None,
                "compression": self.compression, "compression_level": self.compression_level,
                "chunk_bytes": self.chunk_bytes}

    def add(self, record: Record) -> None:
        """Queue one record; in pixel mode it is decoded and resized here (errors name the key)."""
        if self.pixels is not None:
            record = to_pixel_record(record, self.pixels)
        super().add(record)

    # -- staging ------------------------------------------------------------------------------
    def _open_staging(self, fingerprint: str, resume: bool) -> ResumeState:
        part = _partial(self.location)
        remove_path(part + ".recover")          # left by a resume that was itself interrupted
        require_room(self.location, _WRITE_MARGIN, staging=part if os.path.exists(part) else None,
                     what="opening the staging file")
        with self._writing("opening the staging file", _WRITE_MARGIN):
            return self._open_or_create(part, fingerprint, resume)

    def _open_or_create(self, part: str, fingerprint: str, resume: bool) -> ResumeState:
        if os.path.exists(part) and not resume:
            log.info("discarding partial build %s (--no-resume)", part)
            remove_path(part)
        if os.path.exists(part):
            state = self._reopen(part, fingerprint)
            if state is not None:
                return state
            self._close(mark_clean=False)
            remove_path(part)
        self._file = self._new_file(part)
        state = ResumeState(fingerprint=fingerprint)
        self._save_state(state)
        self._file.flush()
        return state

    def _new_file(self, path: str):
        try:
            f = _open_h5(path, "w", "best-effort")
        except OSError as exc:
            raise StoreError(f"{path}: cannot create the HDF5 file: {exc}") from exc
        self._file, self._count, self._write_failed = f, 0, False
        self._create_datasets()
        return f

    def _reopen(self, part: str, fingerprint: str) -> ResumeState | None:
        """Reopen an interrupted build; None when it cannot be trusted (caller starts fresh).

        A file closed cleanly (an error, on_corrupt=fail, Ctrl-C) is cut back to the committed
        records. A file without the clean-close mark was killed: HDF5 is not crash-safe (a kill
        can leave torn chunks or heap blocks it rewrote in place), so the committed records are
        checked against their checksums and copied into a new file, never written to again.
        """
        try:
            ro = _open_h5(part, "r", "best-effort")
        except OSError as exc:
            log.warning("%s: cannot reopen the interrupted build (%s); starting it again from scratch",
                        part, exc)
            return None
        try:
            try:
                state = ResumeState.from_dict(loads_bounded(ro[STATE_DSET][()].tobytes()))
                saved_options = loads_bounded(ro.attrs[OPTIONS_ATTR])
                clean = bool(ro.attrs.get(CLEAN_ATTR, False))
            except (KeyError, ValueError, TypeError, OSError) as exc:
                log.warning("%s: resume state unreadable (%s); starting the build again from scratch", part, exc)
                return None
            if state.fingerprint != fingerprint or saved_options != self._layout_options():
                what = "inputs or options" if state.fingerprint != fingerprint else \
                    f"HDF5 options {saved_options} (now {self._layout_options()})"
                raise ResumeMismatchError(
                    f"{part}: a partial build made from other {what} is in the way "
                    f"(hint: pass --no-resume to discard it, or overwrite, or rerun the original command)")
            if not clean:
                log.warning("%s was not closed cleanly (killed, or a write failed): checking the %d committed "
                            "records and copying them to a fresh file", part, state.next_index)
                problem = self._recover(ro, part, state)
                if problem:
                    log.warning("%s: cannot resume (%s); starting the build again from scratch", part, problem)
                    return None
                log.info("resuming %s at input %d (%d records checked and kept)", part, state.next_input,
                         state.next_index)
                return state
        finally:
            ro.close()
        try:
            self._file = _open_h5(part, "r+", "best-effort")
            del self._file.attrs[CLEAN_ATTR]   # until the next clean close, a kill is detectable
            self._file.flush()
        except (OSError, KeyError) as exc:
            log.warning("%s: cannot reopen the interrupted build for writing (%s); starting it again "
                        "from scratch", part, exc)
            return None
        problem = self._truncate(state.next_index)
        if problem:
            log.warning("%s: cannot resume (%s); starting the build again from scratch", part, problem)
            return None
        log.info("resuming %s at input %d (%d records committed)", part, state.next_input, state.next_index)
        return state

    def _recover(self, old, part: str, state: ResumeState) -> str:
        """Copy records 0..state.next_index-1 of ``old``, each checked, into a new ``part``.

        Returns a problem ('' when every record was intact and the new file is in place).
        """
        tmp = part + ".recover"
        # The copy needs about as much room as the records it copies: a full disk must stop the
        # resume (the partial kept), never make it start over.
        need = os.path.getsize(part) + _WRITE_MARGIN
        require_room(self.location, need, staging=part, what="resuming (a checked copy of the interrupted build)")
        self._new_file(tmp)
        try:
            with self._writing("resuming (a checked copy of the interrupted build)", need):
                self._hold()
                for s in range(0, state.next_index, 1024):
                    self._append(list(_committed_records(old, s, min(state.next_index, s + 1024))))
                self._save_state(state)
                self._file.flush()
        except DiskFullError:
            self._close(mark_clean=False)
            remove_path(tmp)
            raise
        except (OSError, ValueError, KeyError, TypeError, StoreError) as exc:
            self._close(mark_clean=False)
            remove_path(tmp)
            return str(exc)
        os.replace(tmp, part)                # the open handle follows the file
        return ""

    def _create_datasets(self) -> None:
        f = self._file
        rows = (_ROWS_PER_CHUNK,)
        f.attrs[LAYOUT_ATTR] = "pixels" if self.pixels else "jpeg"
        f.attrs[OPTIONS_ATTR] = json.dumps(self._layout_options(), sort_keys=True)
        f.attrs["description"] = ("packer image store; attribute packer_metadata (JSON) is written "
                                  "last and marks a complete store")
        if self.pixels:
            h, w = self.pixels
            d = f.create_dataset("pixels", shape=(0, h, w, 3), maxshape=(None, h, w, 3), dtype="u1",
                                 chunks=(1, h, w, 3), fletcher32=True, compression=self.compression,
                                 compression_opts=self.compression_level)
            d.attrs["description"] = f"decoded RGB uint8, record i = pixels[i] ({h}x{w}x3), one image per chunk"
        else:
            d = f.create_dataset("jpeg_bytes", shape=(0,), maxshape=(None,), dtype="u1",
                                 chunks=(self.chunk_bytes,), fletcher32=True)
            d.attrs["description"] = "JPEG bytes of every record, back to back"
            d = f.create_dataset("jpeg_offsets", data=np.zeros(1, np.int64), maxshape=(None,), chunks=rows)
            d.attrs["description"] = "record i = jpeg_bytes[jpeg_offsets[i]:jpeg_offsets[i+1]]"
        d = f.create_dataset("keys", shape=(0,), maxshape=(None,), dtype=_h5py().string_dtype("utf-8"),
                             chunks=rows)
        d.attrs["description"] = "image path relative to the IMAGES folder"
        d = f.create_dataset("checksums", shape=(0,), maxshape=(None,), dtype=f"S{_CHECKSUM_LEN}", chunks=rows)
        d.attrs["description"] = "BLAKE2b-128 hex of the stored bytes (JPEG bytes or pixels)"
        d = f.create_dataset("record_meta", shape=(0,), maxshape=(None,), dtype="u1", chunks=(64 << 10,),
                             fletcher32=True)
        d.attrs["description"] = ("Record fields but data and label, UTF-8 JSON per record: key checksum "
                                  "width height channels source_format converted orientation ...")
        d = f.create_dataset("record_meta_offsets", data=np.zeros(1, np.int64), maxshape=(None,), chunks=rows)
        d.attrs["description"] = "record i = record_meta[record_meta_offsets[i]:record_meta_offsets[i+1]]"

    def _ensure_label_datasets(self, records: Sequence[Record]) -> None:
        """Create class_ids / boxes datasets on first use (back-filled for earlier records)."""
        f = self._file
        rows = (_ROWS_PER_CHUNK,)
        if "class_ids" not in f and any(_is_class(r.label) for r in records):
            d = f.create_dataset("class_ids", data=np.full(self._count, -1, np.int64), maxshape=(None,),
                                 chunks=rows)
            d.attrs["description"] = "class id of record i (-1: unlabeled); names in packer_metadata"
            self._held.append(d)
        if "boxes" not in f and any(_box_rows(r.label) is not None for r in records):
            d = f.create_dataset("boxes", shape=(0, 5), maxshape=(None, 5), dtype="f4", chunks=(_ROWS_PER_CHUNK, 5))
            d.attrs["description"] = "YOLO rows: class cx cy w h (normalized), all records back to back"
            self._held.append(d)
            d = f.create_dataset("box_offsets", data=np.zeros(self._count + 1, np.int64), maxshape=(None,),
                                 chunks=rows)
            d.attrs["description"] = "record i owns boxes[box_offsets[i]:box_offsets[i+1]]"
            self._held.append(d)

    def _truncate(self, count: int) -> str:
        """Cut every dataset back to ``count`` records; returns a problem ('' when fine)."""
        f = self._file
        try:
            n = f["keys"].shape[0]
            if n < count:
                return f"state says {count} records but only {n} keys are present"
            for name in _ROW_DATASETS:
                if name in f:
                    if f[name].shape[0] < count:
                        return f"dataset {name} holds {f[name].shape[0]} records, state says {count}"
                    f[name].resize(count, axis=0)
            for data, offs in _BLOB_PAIRS:
                if offs not in f:
                    continue
                o = f[offs]
                if o.shape[0] < count + 1:
                    return f"dataset {offs} holds {o.shape[0]} entries, state says {count} records"
                kept = o[: count + 1]
                if kept[0] != 0 or np.any(np.diff(kept) < 0) or kept[-1] > f[data].shape[0]:
                    return f"dataset {offs} is inconsistent"
                o.resize(count + 1, axis=0)
                f[data].resize(int(kept[-1]), axis=0)
            f.flush()
        except (OSError, KeyError, ValueError) as exc:
            return f"cannot truncate to {count} records: {exc}"
        self._count = count
        return ""

    # -- committing --------------------------------------------------------------------------
    def _append(self, records: Sequence[Record]) -> None:
        """Append records to every dataset (no state, no flush)."""
        if not records:
            return
        f, n, k = self._file, self._count, len(records)
        for j, rec in enumerate(records):
            if rec.index != n + j:
                raise StoreError(f"{self.location}: record {rec.key!r} has index {rec.index}, "
                                 f"expected {n + j} (records must be added in index order)")
        self._ensure_label_datasets(records)
        if self.pixels:
            h, w = self.pixels
            arr = np.empty((k, h, w, 3), np.uint8)
            for j, rec in enumerate(records):
                buf = np.frombuffer(rec.data, np.uint8)
                if buf.size != h * w * 3:
                    raise StoreError(f"{self.location}: key {rec.key!r}: {buf.size} pixel bytes, "
                                     f"expected {h}x{w}x3")
                arr[j] = buf.reshape(h, w, 3)
            d = f["pixels"]
            d.resize(n + k, axis=0)
            d[n:] = arr
        else:
            _append_blobs(f, "jpeg_bytes", "jpeg_offsets", n, [np.frombuffer(r.data, np.uint8) for r in records])
        _append_blobs(f, "record_meta", "record_meta_offsets", n,
                      [np.frombuffer(_record_meta(r), np.uint8) for r in records])
        for name, values in (("keys", [r.key for r in records]),
                             ("checksums", [r.checksum.encode("ascii") for r in records])):
            d = f[name]
            d.resize(n + k, axis=0)
            d[n:] = values
        if "class_ids" in f:
            d = f["class_ids"]
            d.resize(n + k, axis=0)
            d[n:] = [int(r.label) if _is_class(r.label) else -1 for r in records]
        if "boxes" in f:
            rows = [_box_rows(r.label) for r in records]
            _append_blobs(f, "boxes", "box_offsets", n,
                          [np.zeros((0, 5), np.float32) if r is None else r for r in rows])
        self._count = n + k

    def _save_state(self, state: ResumeState) -> None:
        # A dataset, not an attribute: the rejects list can outgrow attribute size limits.
        raw = np.frombuffer(json.dumps(state.to_dict()).encode(), np.uint8)
        f = self._file
        if STATE_DSET not in f:
            d = f.create_dataset(STATE_DSET, shape=(0,), maxshape=(None,), dtype="u1", chunks=(4096,))
            d.attrs["description"] = "build progress (ResumeState JSON); removed at publish"
        d = f[STATE_DSET]
        d.resize(raw.size, axis=0)
        d[:] = raw

    def _write_batch(self, records: Sequence[Record], state: ResumeState) -> None:
        if self._file is None or self._write_failed:
            raise StoreError(f"{self.location}: writer is closed" + (" after a failed write" if self._write_failed
                                                                      else ""))
        what = f"a batch of {len(records)} records"
        need = self._batch_bytes(records, state)
        require_room(self.location, need, staging=_partial(self.location), what=what)
        with self._writing(what, need):
            self._hold()
            self._append(records)
            self._file.flush()          # records reach the file before the state that counts them
            self._save_state(state)
            self._file.flush()

    def _batch_bytes(self, records: Sequence[Record], state: ResumeState) -> int:
        """Bytes a batch may add to the file: its data, record fields, keys and labels, the
        resume state (written anew), partly filled chunks, and the margin for HDF5's own."""
        fields = sum(len(r.data) + 2 * len(r.key.encode()) + 1024 for r in records)
        return fields + 2 * len(json.dumps(state.to_dict())) + 2 * self.chunk_bytes + _WRITE_MARGIN

    @contextlib.contextmanager
    def _writing(self, what: str, needed: int):
        """Run HDF5 writes; an error from h5py detaches the file and raises StoreError
        (DiskFullError when the disk is full), naming the output and ``what`` was written.

        HDF5 cannot go on after a failed write: flushing or closing the file then (even at
        interpreter exit) crashes the process (SIGSEGV in H5Fflush, HDF5 2.0), so the room is
        checked before every write (``require_room``) and, should a write fail anyway (another
        program filled the disk meanwhile), the file's descriptor is pointed at /dev/null before
        HDF5 touches it again: its close then succeeds, and the partial file, marked as not
        closed cleanly, is checked record by record on resume.
        """
        try:
            yield
        except (OSError, RuntimeError) as exc:
            self._write_failed = True
            self._detach()
            part = _partial(self.location)
            if is_disk_full(exc, self.location, needed):
                raise disk_full(self.location, needed=needed, staging=part, what=what, cause=exc) from exc
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"{part}: HDF5 write failed ({what}): {first} "
                             f"(hint: rerun to resume, or pass --no-resume to start over)") from exc

    def _hold(self) -> None:
        """Keep a handle on every dataset of the file until it is closed.

        HDF5 writes a dataset's cached chunks when its last handle closes; h5py closes handles
        in ``__dealloc__``, where an error (a full disk) is printed and swallowed, and HDF5 then
        crashes at the next flush. Held open, the chunks are written by ``flush()``, whose
        error is raised and handled (:meth:`_writing`).
        """
        h5py = _h5py()
        f = self._file
        self._held = [obj for obj in (f[name] for name in f) if isinstance(obj, h5py.Dataset)]

    def _detach(self) -> None:
        """Point the open HDF5 file's descriptor at /dev/null (see :meth:`_writing`): HDF5's
        later writes of this handle (its close) succeed and change nothing on disk."""
        f = self._file
        if f is None:
            return
        try:
            fd = f.id.get_vfd_handle()
        except (OSError, RuntimeError, ValueError) as exc:
            log.debug("%s: no file descriptor to detach: %s", _partial(self.location), exc)
            return
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)

    def iter_index(self) -> Iterator[tuple[int, str, str]]:
        f = self._file
        step = 65536
        for s in range(0, self._count, step):
            e = min(s + step, self._count)
            keys = f["keys"].asstr()[s:e]
            sums = f["checksums"][s:e]
            for j in range(e - s):
                yield s + j, keys[j], sums[j].decode("ascii")

    def _publish(self, metadata: StoreMetadata, overwrite: bool) -> None:
        part, final = _partial(self.location), self.location
        if metadata.count != self._count:
            raise StoreError(f"{part}: metadata says {metadata.count} records, the file holds {self._count}")
        if os.path.lexists(final) and not overwrite:
            raise UsageError(f"{final} exists (hint: --overwrite replaces it)")
        f = self._file
        raw = metadata.to_json().decode()
        need = 2 * len(raw) + _WRITE_MARGIN
        require_room(self.location, need, staging=part, what="publishing")
        with self._writing("the store metadata", need):
            if STATE_DSET in f:
                del f[STATE_DSET]
            f.attrs[META_ATTR] = raw   # last: marks the file complete
            f.flush()
        self._close(mark_clean=False, strict=True)
        _fsync(part)
        old = None
        if os.path.isdir(final):
            # os.replace cannot put a file over a folder (e.g. an LMDB store of the same name).
            # A fresh name: a "<out>.old" of the user's (a backup, say) is never touched.
            old = f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:12]}"
            os.rename(final, old)
        # rename(2) is atomic: readers see the old store or the whole new one, never a mix.
        os.replace(part, final)
        _fsync(os.path.dirname(os.path.abspath(final)))
        if old is not None:
            remove_path(old)

    def write_quarantine(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Quarantined bytes go to datasets ``/quarantine/<n>`` (uint8, one per entry)."""
        what = f"{len(items)} quarantined record(s)"
        need = sum(len(data) + 1024 for _, data in items) + _WRITE_MARGIN
        require_room(self.location, need, staging=_partial(self.location), what=what)
        with self._writing(what, need):
            g = self._file.require_group("quarantine")
            g.attrs["description"] = ("records taken out of the store by packer repair; the entries are "
                                      "listed in packer_metadata.quarantine")
            for n, data in items:
                if str(n) in g:
                    del g[str(n)]
                self._held.append(g.create_dataset(str(n), data=np.frombuffer(bytes(data), np.uint8)))
            self._file.flush()

    def _close(self, mark_clean: bool = True, strict: bool = False) -> None:
        """Close the file; ``mark_clean``: mark it closed cleanly first (unless a write failed).
        A failure detaches the file (see :meth:`_writing`) and is logged, or with ``strict``
        (publish) raised: a file whose close failed is never published."""
        f = self._file
        if f is None:
            return
        try:
            with self._writing("closing the staging file", _WRITE_MARGIN):
                if mark_clean and not self._write_failed:
                    f.flush()                       # everything first, then the mark
                    f.attrs[CLEAN_ATTR] = True
                f.close()
        except StoreError as exc:
            try:
                f.close()   # detached: HDF5 finishes closing without touching the file
            except (OSError, RuntimeError) as again:
                log.debug("%s: closing the detached file: %s", _partial(self.location), again)
            if strict:
                raise
            # Closing must not mask the error that led here (it says what to do).
            log.info("%s: %s", _partial(self.location), exc)
        finally:
            self._file, self._held = None, []


def _committed_records(f, s: int, e: int) -> Iterator[Record]:
    """Records s..e-1 of a partial file, each checked (checksum, key, index); raises ValueError."""
    mo = f["record_meta_offsets"][s:e + 1]
    metas = f["record_meta"][int(mo[0]):int(mo[-1])]
    keys = f["keys"].asstr()[s:e]
    sums = f["checksums"][s:e]
    if "pixels" in f:
        pixels = f["pixels"][s:e]
        datas = [pixels[j].tobytes() for j in range(e - s)]
    else:
        jo = f["jpeg_offsets"][s:e + 1]
        buf = f["jpeg_bytes"][int(jo[0]):int(jo[-1])]
        datas = [buf[int(jo[j]) - int(jo[0]):int(jo[j + 1]) - int(jo[0])].tobytes() for j in range(e - s)]
    class_ids = f["class_ids"][s:e] if "class_ids" in f else None
    if "boxes" in f:
        bo = f["box_offsets"][s:e + 1]
        rows = f["boxes"][int(bo[0]):int(bo[-1])]
        boxes = [rows[int(bo[j]) - int(bo[0]):int(bo[j + 1]) - int(bo[0])] for j in range(e - s)]
    else:
        boxes = None
    for j in range(e - s):
        i = s + j
        meta = loads_bounded(metas[int(mo[j]) - int(mo[0]):int(mo[j + 1]) - int(mo[0])].tobytes())
        if "label" in meta:
            label = meta.pop("label")
        elif boxes is not None and (class_ids is None or len(boxes[j])):
            label = boxes[j]
        else:
            label = int(class_ids[j]) if class_ids is not None else None
        fields = {name: meta[name] for name in Record.META_FIELDS if name != "label"}
        fields.update({name: meta[name] for name in Record.OPTIONAL_META_FIELDS if name in meta})
        rec = Record(data=datas[j], label=label, metadata=meta.get("metadata") or {}, **fields)
        if rec.index != i or rec.key != keys[j] or rec.checksum.encode() != sums[j] or not rec.data_ok():
            raise ValueError(f"record {i} ({keys[j]!r}) is damaged")
        yield rec


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass   # some file systems refuse fsync on directories; the rename stays atomic
    finally:
        os.close(fd)


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
        """``file_path``: read that file (a padded copy made by salvage) while messages keep
        naming ``location``. ``salvage``: see :meth:`Store.open_salvage`. ``lost_heap``: the
        problem :func:`_cut_heap` found (the file's strings are then never read)."""
        self._lost_heap = lost_heap
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
                if os.path.exists(_partial(self.location)) else ""
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
        for name in _READ_DATASETS:
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
            self._file = _open_h5(self._path, "r", False, **cache)
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
                d = {name: f[name] for name in _READ_DATASETS if name in f}
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
            buf = _read_raw_chunks(d[data], lo, o[-1])
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
        """JSON-style label values (see packer.records.label_from_json) for records s..e-1."""
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
        for name in _ROW_DATASETS:
            if name in d and d[name].shape[0] != n:
                problems.append(f"{where}: dataset '{name}' holds {d[name].shape[0]} entries, expected {n}")
        if self.metadata.label_schema == "class" and "class_ids" not in d and n:
            problems.append(f"{where}: label schema 'class' but no 'class_ids' dataset")
        for data, offs in _BLOB_PAIRS:
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
    room = file_size * (1 if ds.compression is None else _MAX_COMPRESSION)
    if declared > room:
        what = f"{shape[0]} images of {shape[1]}x{shape[2]}x{shape[3]} pixels" if name == "pixels" else \
            f"shape {shape} of {ds.dtype}"
        raise StoreError(f"{location}: dataset '{name}' declares {what} ({declared:,} bytes), more than the "
                         f"{file_size:,}-byte file can hold")


_HEAP_SIGNATURE = b"GCOL\x01\x00\x00\x00"   # global heap collection: magic, version 1, reserved


def _cut_heap(path: str) -> str | None:
    """A problem when the file at ``path`` (cut short) ends inside a global heap collection
    (where HDF5 keeps variable-length strings: attributes, keys), else None.

    Read through a copy padded with zeros, such a collection's tail reads as objects of size
    0, and HDF5 2.0 loops forever on them (``H5HG__cache_heap_deserialize``) at the first
    string read: ``verify`` of a store cut to 4 KiB hung. Collections are found by their
    signature; one that starts before the cut and is sized past it is lost.
    """
    import mmap

    size = os.path.getsize(path)
    if size < len(_HEAP_SIGNATURE) + 8:
        return None
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = mm.find(_HEAP_SIGNATURE)
        while pos != -1:
            if pos + 16 <= size:
                length = int.from_bytes(mm[pos + 8:pos + 16], "little")
                if pos + length > size and 4096 <= length < (1 << 40):
                    return (f"{path}: the file ends inside an HDF5 global heap (bytes {pos}..{pos + length}, "
                            f"the file holds {size}): the store metadata and keys kept there are lost, "
                            f"no record is reachable (hint: packer repair --source IMAGES rebuilds it)")
            pos = mm.find(_HEAP_SIGNATURE, pos + 1)
    return None


def _read_raw_chunks(ds, lo: int, hi: int) -> np.ndarray:
    """``ds[lo:hi]`` of an uncompressed 1-D uint8 dataset read chunk by chunk as stored,
    without the Fletcher32 check (salvage).

    One flipped byte fails a whole chunk's Fletcher32, taking every record in it down; read
    raw, each record's own checksum then says which one is damaged. Raises OSError when the
    dataset is compressed or a chunk cannot be read at all.
    """
    if ds.compression is not None or ds.chunks is None or ds.ndim != 1:
        raise OSError(f"{ds.name}: cannot read around a damaged chunk of a compressed dataset")
    size = ds.chunks[0]
    tail = 4 if ds.fletcher32 else 0
    parts = []
    for k in range(lo // size, (hi - 1) // size + 1):
        _, raw = ds.id.read_direct_chunk((k * size,))
        parts.append(np.frombuffer(raw[:len(raw) - tail] if tail else raw, np.uint8))
    buf = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    start = lo - (lo // size) * size
    return buf[start:start + hi - lo]


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
