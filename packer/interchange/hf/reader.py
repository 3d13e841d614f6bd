"""Hugging Face scan: every row of the chosen split, its key, locator, label and metadata, with
damaged row groups and record batches listed."""
from __future__ import annotations

import logging
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from packer.core import remote
from packer.core.errors import SourceError, UsageError
from packer.core.integrity import sniff_format
from packer.core.paths import safe_relative
from packer.interchange.base import Scan, ScanOptions, class_ids, pin_of_object
from packer.interchange.hf.arrow import (
    BATCH_ROWS,
    READ_BUFFER,
    arrow_batches,
    data_errors,
    image_parts,
    one_line,
    release_memory,
    require_pyarrow,
)
from packer.interchange.hf.bucket import open_object, url_layout
from packer.interchange.hf.columns import Columns, Values, columns_of, label_of, metadata_of, source_name
from packer.interchange.hf.layout import Layout, detect_local, find_layout, read_head
from packer.interchange.hf.lazy import LazyLocators

log = logging.getLogger(__name__)


_EXTENSIONS = {"jpeg": "jpg", "tiff": "tif"}


@dataclass
class _Row:
    where: tuple          # a locator, or a lazy entry ("parquet"|"arrow", file, unit, row)
    display: str
    row: int              # index in the split
    path: Optional[str]
    ext: str
    label: object
    metadata: dict


class _Scanner:
    """The state of one scan: the split's rows so far, the problems, the columns."""

    def __init__(self, layout: Layout, options: ScanOptions, where: str):
        self.layout, self.options, self.where = layout, options, where
        self.cols: Optional[Columns] = None
        self.rows: list = []
        self.problems: list = []
        self.next_row = 0     # index in the split of the next row

    def rel(self, path: str) -> str:
        root = self.layout.root
        if remote.is_url(path):   # the root of a dataset in a bucket is a prefix ending in "/"
            return path[len(root):] if path.startswith(root) else remote.basename(path)
        return Path(os.path.relpath(path, root)).as_posix()

    def open(self, path: str):
        """What to read ``path`` through: the path itself (a local file), or the object opened
        pinned to the version listed; None (a problem recorded) for an object the bucket lacks."""
        if not remote.is_url(path):
            return path
        info = self.layout.objects.get(path)
        if info is None:
            self.problem(self.rel(path), f"cannot read: {remote.RemoteError(path, 'no such object')}")
            return None
        return open_object(info, self.layout.storage_options)

    def lazy_pin(self, path: str) -> tuple:
        """What a lazy entry of ``path`` carries after ``(kind, path, unit, row)``: nothing for a
        local file; the object's ObjectInfo and storage_options, for the worker to open it pinned."""
        if not remote.is_url(path):
            return ()
        return (self.layout.objects[path], self.layout.storage_options)

    def range_pin(self, path: str) -> tuple:
        """What a range locator of ``path`` carries after ``(range, path, offset, size)``."""
        info = self.layout.objects.get(path)
        return pin_of_object(path, info, self.layout.storage_options) if info is not None else ()

    def problem(self, where: str, reason: str, kind: str = "damaged") -> None:
        log.warning("%s: %s", where, reason, extra={"packer_damaged_input": True})
        self.problems.append({"path": where, "reason": reason, "kind": kind})

    def columns_for(self, schema, rel: str) -> Optional[Columns]:
        """The columns (chosen on the first file); None when this file lacks them."""
        if self.cols is None:
            self.cols = columns_of(schema, self.options, self.where)
            return self.cols
        missing = [c for c in self.cols.read if c not in schema.names]
        if missing:
            self.problem(rel, f"no column {', '.join(missing)} (the first file has it): file skipped")
            return None
        return self.cols

    def take(self, batch, rel: str, entry, ranges=None) -> list:
        """The rows of one record batch. ``entry(i)`` is the lazy entry of its row ``i``;
        ``ranges`` (arrow) the ``(offset, size)`` of each row's bytes in the file."""
        cols = self.cols
        img = batch.column(batch.schema.get_field_index(cols.image))
        data, paths = image_parts(img)
        n = batch.num_rows
        columns = [batch.column(batch.schema.get_field_index(c)).to_pylist() if c else [None] * n for c in
                   (cols.label, cols.objects, "packer_label" if cols.packer else None,
                    "packer_metadata" if cols.metadata else None)]
        out = []
        for i in range(n):
            row = self.next_row + i
            display = f"{rel}:row {row}"
            v = Values(*(col[i] for col in columns))
            got = self._one(data, paths, i, display, v, entry, ranges)
            if got is not None:
                out.append(_Row(got[0], display, row, paths[i], got[1], got[2], got[3]))
        self.next_row += batch.num_rows
        del data, img
        release_memory()
        return out

    def _one(self, data, paths, i, display, v: Values, entry, ranges):
        """(locator, ext, label, metadata) of one row, or None (a problem was recorded)."""
        if data[i].is_valid:
            buf = data[i].as_buffer()
            where = entry(i) if ranges is None else \
                ("range", entry(i)[1], *ranges[i]) + self.range_pin(entry(i)[1])
            head = buf[:16].to_pybytes()
        else:   # Image() of local files, not embedded: the path is all there is (read from a
            # local dataset only: a dataset in a bucket never makes the build read this machine's files)
            buf = None
            where = None if remote.is_url(self.layout.root) else _local_file(paths[i], self.layout.root)
            try:
                head = read_head(where, 16) if where else None
            except OSError as exc:
                head, paths[i] = None, f"{paths[i]} ({exc.strerror or exc})"
            if head is None:
                self.problem(display, f"no image bytes, and its path {paths[i]!r} is no readable file")
                return None
        kind = sniff_format(head)
        ext = _EXTENSIONS.get(kind, kind if kind not in ("empty", "unknown") else "bin")

        def data_of():
            return buf.to_pybytes() if buf is not None else Path(where).read_bytes()

        try:
            label = label_of(self.cols, v, data_of)
            metadata = metadata_of(v.metadata)
        except (ValueError, TypeError, OSError) as exc:
            self.problem(display, f"unusable label: {one_line(exc)}", "bad label")
            return None
        if label is None and self.cols.schema != "none" and not self.options.allow_unlabeled:
            self.problem(display, f"an image but no label ({source_name(self.cols)} is empty)", "unlabeled")
            return None
        return where, ext, label, metadata


def _local_file(path: Optional[str], root: str) -> Optional[str]:
    """A path-only image (``Image()`` of local files, not embedded): the file, when it exists."""
    if not path:
        return None
    for p in (path, os.path.join(root, path)):
        if os.path.isfile(p):
            return p
    return None


def _scan_file(sc: _Scanner, path: str) -> None:
    """Scan one file of the layout (a local path, or an object read pinned to its listed
    version). An object that cannot be read for good (replaced or deleted since the listing) is
    the file's problem, its rows so far kept; one the retry budget did not overcome stops the scan."""
    source = sc.open(path)
    if source is None:
        return
    try:
        (_scan_arrow if sc.layout.kind == "arrow" else _scan_parquet)(sc, path, source)
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        sc.problem(sc.rel(path), f"cannot read: {exc}; the rest of the file is not read")
    finally:
        if not isinstance(source, str):
            source.close()


def _scan_parquet(sc: _Scanner, path: str, source) -> None:
    _, pq = require_pyarrow()
    errors = data_errors()
    rel = sc.rel(path)
    pin = sc.lazy_pin(path)
    try:
        pf = pq.ParquetFile(source, buffer_size=READ_BUFFER, pre_buffer=False, page_checksum_verification=True)
        meta = pf.metadata
    except errors as exc:
        sc.problem(rel, f"not a readable parquet file (footer): {one_line(exc)}")
        return
    with pf:
        if sc.columns_for(pf.schema_arrow, rel) is None:
            sc.next_row += meta.num_rows
            return
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            first, rows, start, mark = sc.next_row, [], 0, len(sc.problems)
            try:
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=sc.cols.read,
                                             use_threads=False):
                    rows += sc.take(batch, rel, lambda i, s=start: ("parquet", path, group, s + i) + pin)
                    start += batch.num_rows
            except errors as exc:
                del sc.problems[mark:]   # its rows are lost as a whole
                sc.problem(f"{rel}:row group {group}", f"cannot read rows {first}-{first + n - 1}: {one_line(exc)}")
                rows = []
            sc.rows += rows
            sc.next_row = first + n


def _ranges(data, body, body_offset: int) -> Optional[list]:
    """``(offset, size)`` in the file of each value of a binary array that lies, uncompressed, in
    an IPC message body; None when the values are not there (a compressed body)."""
    pa, _ = require_pyarrow()
    bufs = data.buffers()
    if len(bufs) < 3 or bufs[1] is None:
        return None
    if bufs[2] is None:   # every value empty or null
        return [(body_offset, 0)] * len(data)
    dtype = np.int64 if pa.types.is_large_binary(data.type) else np.int32
    offs = np.frombuffer(bufs[1], dtype=dtype)[data.offset:data.offset + len(data) + 1]
    base = bufs[2].address - body.address
    if base < 0 or base + bufs[2].size > body.size:
        return None
    return [(body_offset + base + int(offs[i]), int(offs[i + 1] - offs[i])) for i in range(len(data))]


def _scan_arrow(sc: _Scanner, path: str, source) -> None:
    errors = data_errors()
    rel = sc.rel(path)
    pin = sc.lazy_pin(path)
    current = 0   # the record batch being read
    try:
        for index, batch, body, body_offset in arrow_batches(source):
            current = index
            if index == 0 and sc.columns_for(batch.schema, rel) is None:
                return
            batch.validate(full=True)   # offsets inside their buffers: a damaged batch stops here
            batch = batch.select(sc.cols.read)
            data, _ = image_parts(batch.column(0))
            ranges = _ranges(data, body, body_offset)
            if ranges is not None and not _range_ok(source, data, ranges):
                ranges = None
            sc.rows += sc.take(batch, rel, lambda i, k=index: ("arrow", path, k, i) + pin, ranges)
            current = index + 1
    except errors as exc:
        sc.problem(f"{rel}:record batch {current}",
                   f"cannot read record batch {current} and the rest of the file (rows from {sc.next_row}): "
                   f"{one_line(exc)}")


def _range_ok(source, data, ranges: list) -> bool:
    """The first non-empty value's range, read from the file, equals the value (else the offsets
    are not file offsets: fall back to reading the bytes through the batch). ``source``: a local
    path, or the object being scanned (read there and put back where it was: the batch just read
    is still in its read-ahead windows, so this costs no request)."""
    for i, (offset, size) in enumerate(ranges):
        if size and data[i].is_valid:
            if isinstance(source, str):
                with open(source, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(size) == data[i].as_py()
            at = source.tell()
            try:
                source.seek(offset)
                return source.read(size) == data[i].as_py()
            finally:
                source.seek(at)
    return True


def _safe_key(path: Optional[str]) -> Optional[str]:
    """The ``path`` field as a store key: a relative POSIX path as it is, else its base name."""
    if not path:
        return None
    path = path.replace("\\", "/")
    if safe_relative(path) is None:
        return path
    base = posixpath.basename(path)
    return base if base and safe_relative(base) is None else None


def detect(path, storage_options: Optional[dict] = None) -> bool:
    """True for a ``save_to_disk`` folder, a parquet file, folder or pattern (hub layout); in a
    bucket too (``path`` a URL: listed once; ``storage_options``: fsspec's)."""
    text = os.fspath(path)
    if not remote.is_url(text):
        return detect_local(text)
    try:
        return bool(url_layout(text, None, storage_options).files)
    except (SourceError, UsageError, remote.RemoteError):
        return False


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List the samples of a Hugging Face dataset (see the module docstring).

    Raises:
        UsageError: an unknown split, or the image/label column is ambiguous or missing.
        SourceError: the folder's ``state.json``/``dataset_dict.json`` cannot be read, or no file.
        DependencyError: pyarrow is not installed.
        RemoteError: a dataset in a bucket cannot be reached within the retry budget.
    """
    options = options or ScanOptions()
    text = os.fspath(path)
    layout = url_layout(text, options.split, options.storage_options) if remote.is_url(text) else \
        find_layout(text, options.split)
    sc = _Scanner(layout, options, text)
    for f in layout.files:
        _scan_file(sc, f)
    out = Scan(root=text, problems=sc.problems, fingerprint=_fingerprint(layout))
    cols = sc.cols
    if cols is None:
        return out
    keys = [_safe_key(r.path) for r in sc.rows]
    if not all(keys) or len(set(keys)) != len(keys):
        keys = [f"{layout.split}/{r.row}.{r.ext}" for r in sc.rows]
    if cols.schema == "objects":
        from packer.labels.model import as_label_model

        for r in sc.rows:
            r.label = as_label_model(r.label)
    names = list(cols.class_names)
    if cols.strings:   # class names in a string column: ids in their sorted order
        sc.rows, names = class_ids(sc.rows, None, "", out.problems, untied="keep")
    out.keys, out.labels, out.class_names, out.label_schema = keys, [r.label for r in sc.rows], names, cols.schema
    out.displays = [r.display for r in sc.rows]
    out.metadata = [r.metadata for r in sc.rows]
    out.locators = LazyLocators([r.where for r in sc.rows], cols.image)
    out.label_source = f"hf {layout.kind} ({source_name(cols)})"
    return out


def _fingerprint(layout: Layout) -> list:
    """``(file, size, mtime_ns)`` per local file; ``(URL, size, ETag)`` per object, as listed."""
    out = []
    for f in layout.files:
        if remote.is_url(f):
            info = layout.objects.get(f)
            if info is not None:   # else listed as a problem by the scan
                out.append((f, info.size, info.version))
            continue
        try:
            st = os.stat(f)
        except OSError:
            continue   # listed as a problem by the scan
        out.append((f, st.st_size, st.st_mtime_ns))
    return out
