"""The locators of a Hugging Face scan, read lazily: parquet pages are compressed, so a row's
image bytes are read when the build asks for them, through one streaming cursor."""
from __future__ import annotations

from collections.abc import Sequence

from packer.core.errors import SourceError
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
from packer.interchange.hf.bucket import open_object


class LazyLocators(Sequence):
    """The scan's locators: ready ones (``range``, a path) as they are, and parquet/compressed
    arrow rows read when asked for, as ``("bytes", data)``.

    A lazy entry is ``(kind, file, unit, row)`` (``kind`` ``"parquet"``/``"arrow"``, ``unit`` the
    row group or record batch); for an object in a bucket it goes on with the object's
    :class:`~packer.core.remote.ObjectInfo` (URL, size, the version the scan listed) and
    fsspec's ``storage_options``: the process that reads the row (the build's, a Dask worker)
    opens the object itself, pinned to that version, so a file replaced since the scan is an
    error naming it, never a row of the new file.

    One streaming cursor serves the reads: asked in order (as the build does), each row group
    or record batch is read once, ``BATCH_ROWS`` rows at a time, and a parquet file's footer
    once. Slices share nothing but the entries; pickling drops the cursor and the open file.

    Raises (from ``[]``):
        SourceError: the file cannot be read any more (changed since the scan).
        RemoteError: the object changed since the scan, is gone, or cannot be reached.
    """

    def __init__(self, entries: list, column: str):
        self._entries = entries
        self._column = column
        self._cursor = None
        self._open = None     # (file, opened object or None, ParquetFile): the parquet file read last

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyLocators(self._entries[i], self._column)
        entry = self._entries[i]
        if not (isinstance(entry, tuple) and entry[0] in ("parquet", "arrow")):
            return entry
        return "bytes", self._read(entry)

    def __getstate__(self):
        return {"_entries": self._entries, "_column": self._column, "_cursor": None, "_open": None}

    def close(self) -> None:
        """Close the file read last (reading again opens it again)."""
        self._cursor = None
        if self._open is not None:
            _, obj, pf = self._open
            self._open = None
            pf.close()
            if obj is not None:
                obj.close()

    def _parquet(self, path: str, pin: tuple):
        """The ParquetFile of ``path``, kept open while the reads stay in it (one footer read)."""
        if self._open is not None and self._open[0] == path:
            return self._open[2]
        self.close()
        _, pq = require_pyarrow()
        obj = open_object(*pin) if pin else None
        try:
            pf = pq.ParquetFile(obj if obj is not None else path, buffer_size=READ_BUFFER, pre_buffer=False,
                                page_checksum_verification=True)
        except BaseException:
            if obj is not None:
                obj.close()
            raise
        self._open = (path, obj, pf)
        return pf

    def _read(self, entry) -> bytes:
        kind, path, unit, row = entry[:4]
        pin = entry[4:]
        c = self._cursor
        what = "row group" if kind == "parquet" else "record batch"
        try:
            if c is None or c.where != (kind, path) or (unit, row) < (c.unit, c.start) or \
                    (kind == "parquet" and unit != c.unit):
                self._cursor = None
                source = self._parquet(path, pin) if kind == "parquet" else (open_object(*pin) if pin else path)
                self._cursor = c = _Cursor(kind, path, source, unit, self._column)
            while (c.unit, c.start + c.count) <= (unit, row):
                c.advance()
        except StopIteration:
            raise SourceError(f"{path}: row {row} of {what} {unit} is gone: the file changed since the scan",
                              [f"{path}: changed since the scan"]) from None
        except data_errors() as exc:
            self.close()
            raise SourceError(f"{path}: {what} {unit} cannot be read any more: {one_line(exc)}",
                              [f"{path}: {one_line(exc)}"]) from exc
        except BaseException:
            self.close()
            raise
        if c.unit != unit:
            raise SourceError(f"{path}: {kind} unit {unit} not found (the file changed since the scan)")
        value = c.data[row - c.start]
        if not value.is_valid:
            raise SourceError(f"{path}: row {row} of unit {unit} has no image bytes (changed since the scan)")
        return value.as_py()


class _Cursor:
    """Batches of one image column from ``unit`` (row group / record batch) on, read from
    ``source``: an open ParquetFile, or (arrow) a local path or an opened object."""

    def __init__(self, kind: str, path: str, source, unit: int, column: str):
        self.where = (kind, path)
        self._column = column
        self._batches = self._parquet(source, unit) if kind == "parquet" else self._arrow(source, unit)
        self.unit, self.start, self.count, self.data = unit, 0, 0, None

    def advance(self) -> None:
        self.data = None
        unit, start, data = next(self._batches)
        self.unit, self.start, self.count, self.data = unit, start, len(data), data
        release_memory()

    def _parquet(self, pf, group: int):
        start = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=[self._column],
                                     use_threads=False):
            yield group, start, image_parts(batch.column(0))[0]
            start += batch.num_rows

    def _arrow(self, source, first: int):
        for index, batch, _, _ in arrow_batches(source, first):
            yield index, 0, image_parts(batch.column(batch.schema.get_field_index(self._column)))[0]
