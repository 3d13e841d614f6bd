"""The HDF5 writer: builds ``<out>.partial`` batch by batch (records, then the resume state),
resumes or recovers an interrupted build, never lets HDF5 meet a full disk, and renames the
finished file onto ``<out>`` at publish, its metadata attribute written last.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from typing import Iterator, Sequence

import numpy as np

from packer.core.diskspace import disk_full, is_disk_full, require_room
from packer.core.errors import DiskFullError, ResumeMismatchError, StoreError, UsageError
from packer.core.records import Record, StoreMetadata, loads_bounded
from packer.stores.base import ResumeState, StoreWriter, partial_location, remove_path
from packer.stores.hdf5.layout import (
    BLOB_PAIRS,
    CHECKSUM_LEN,
    CLEAN_ATTR,
    DEFAULT_CHUNK_BYTES,
    LAYOUT_ATTR,
    META_ATTR,
    OPTIONS_ATTR,
    ROW_DATASETS,
    ROWS_PER_CHUNK,
    STATE_DSET,
    WRITE_MARGIN,
    import_h5py,
    open_h5,
)
from packer.stores.hdf5.pixels import to_pixel_record

log = logging.getLogger(__name__)


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
        part = partial_location(self.location)
        remove_path(part + ".recover")          # left by a resume that was itself interrupted
        require_room(self.location, WRITE_MARGIN, staging=part if os.path.exists(part) else None,
                     what="opening the staging file")
        with self._writing("opening the staging file", WRITE_MARGIN):
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
            f = open_h5(path, "w", "best-effort")
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
            ro = open_h5(part, "r", "best-effort")
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
            self._file = open_h5(part, "r+", "best-effort")
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
        need = os.path.getsize(part) + WRITE_MARGIN
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
        rows = (ROWS_PER_CHUNK,)
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
        d = f.create_dataset("keys", shape=(0,), maxshape=(None,), dtype=import_h5py().string_dtype("utf-8"),
                             chunks=rows)
        d.attrs["description"] = "image path relative to the IMAGES folder"
        d = f.create_dataset("checksums", shape=(0,), maxshape=(None,), dtype=f"S{CHECKSUM_LEN}", chunks=rows)
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
        rows = (ROWS_PER_CHUNK,)
        if "class_ids" not in f and any(_is_class(r.label) for r in records):
            d = f.create_dataset("class_ids", data=np.full(self._count, -1, np.int64), maxshape=(None,),
                                 chunks=rows)
            d.attrs["description"] = "class id of record i (-1: unlabeled); names in packer_metadata"
            self._held.append(d)
        if "boxes" not in f and any(_box_rows(r.label) is not None for r in records):
            d = f.create_dataset("boxes", shape=(0, 5), maxshape=(None, 5), dtype="f4", chunks=(ROWS_PER_CHUNK, 5))
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
            for name in ROW_DATASETS:
                if name in f:
                    if f[name].shape[0] < count:
                        return f"dataset {name} holds {f[name].shape[0]} records, state says {count}"
                    f[name].resize(count, axis=0)
            for data, offs in BLOB_PAIRS:
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
        require_room(self.location, need, staging=partial_location(self.location), what=what)
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
        return fields + 2 * len(json.dumps(state.to_dict())) + 2 * self.chunk_bytes + WRITE_MARGIN

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
            part = partial_location(self.location)
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
        h5py = import_h5py()
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
            log.debug("%s: no file descriptor to detach: %s", partial_location(self.location), exc)
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
        part, final = partial_location(self.location), self.location
        if metadata.count != self._count:
            raise StoreError(f"{part}: metadata says {metadata.count} records, the file holds {self._count}")
        if os.path.lexists(final) and not overwrite:
            raise UsageError(f"{final} exists (hint: --overwrite replaces it)")
        f = self._file
        raw = metadata.to_json().decode()
        need = 2 * len(raw) + WRITE_MARGIN
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
        try:
            os.replace(part, final)
        except OSError:
            if old is not None:   # the store that was there goes back: a failed publish changes nothing
                os.rename(old, final)
            raise
        _fsync(os.path.dirname(os.path.abspath(final)))
        if old is not None:
            remove_path(old)

    def write_quarantine(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Quarantined bytes go to datasets ``/quarantine/<n>`` (uint8, one per entry)."""
        what = f"{len(items)} quarantined record(s)"
        need = sum(len(data) + 1024 for _, data in items) + WRITE_MARGIN
        require_room(self.location, need, staging=partial_location(self.location), what=what)
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
            with self._writing("closing the staging file", WRITE_MARGIN):
                if mark_clean and not self._write_failed:
                    f.flush()                       # everything first, then the mark
                    f.attrs[CLEAN_ATTR] = True
                f.close()
        except StoreError as exc:
            try:
                f.close()   # detached: HDF5 finishes closing without touching the file
            except (OSError, RuntimeError) as again:
                log.debug("%s: closing the detached file: %s", partial_location(self.location), again)
            if strict:
                raise
            # Closing must not mask the error that led here (it says what to do).
            log.info("%s: %s", partial_location(self.location), exc)
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
