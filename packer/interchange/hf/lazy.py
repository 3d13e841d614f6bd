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


class LazyLocators(Sequence):
    """The scan's locators: ready ones (``range``, a path) as they are, and parquet/compressed
    arrow rows read when asked for, as ``("bytes", data)``.

    One streaming cursor serves the reads: asked in order (as the build does), each row group
    or record batch is read once, ``BATCH_ROWS`` rows at a time. Slices share nothing but the
    entries; pickling drops the cursor.

    Raises (from ``[]``):
        SourceError: the file cannot be read any more (changed since the scan).
    """

    def __init__(self, entries: list, column: str):
        self._entries = entries
        self._column = column
        self._cursor = None

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
        return {"_entries": self._entries, "_column": self._column, "_cursor": None}

    def _read(self, entry) -> bytes:
        kind, path, unit, row = entry
        c = self._cursor
        if c is None or c.where != (kind, path) or (unit, row) < (c.unit, c.start) or \
                (kind == "parquet" and unit != c.unit):
            self._cursor = c = _Cursor(kind, path, unit, self._column)
        try:
            while (c.unit, c.start + c.count) <= (unit, row):
                c.advance()
        except StopIteration:
            raise SourceError(f"{path}: row {row} of {'row group' if kind == 'parquet' else 'record batch'} "
                              f"{unit} is gone: the file changed since the scan",
                              [f"{path}: changed since the scan"]) from None
        except data_errors() as exc:
            self._cursor = None
            raise SourceError(f"{path}: {'row group' if kind == 'parquet' else 'record batch'} {unit} "
                              f"cannot be read any more: {one_line(exc)}", [f"{path}: {one_line(exc)}"]) from exc
        if c.unit != unit:
            raise SourceError(f"{path}: {kind} unit {unit} not found (the file changed since the scan)")
        value = c.data[row - c.start]
        if not value.is_valid:
            raise SourceError(f"{path}: row {row} of unit {unit} has no image bytes (changed since the scan)")
        return value.as_py()


class _Cursor:
    """Batches of one image column from ``unit`` (row group / record batch) on."""

    def __init__(self, kind: str, path: str, unit: int, column: str):
        self.where = (kind, path)
        self._column = column
        self._batches = self._parquet(path, unit) if kind == "parquet" else self._arrow(path, unit)
        self.unit, self.start, self.count, self.data = unit, 0, 0, None

    def advance(self) -> None:
        self.data = None
        unit, start, data = next(self._batches)
        self.unit, self.start, self.count, self.data = unit, start, len(data), data
        release_memory()

    def _parquet(self, path: str, group: int):
        _, pq = require_pyarrow()
        with pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False,
                            page_checksum_verification=True) as pf:
            start = 0
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=[self._column],
                                         use_threads=False):
                yield group, start, image_parts(batch.column(0))[0]
                start += batch.num_rows

    def _arrow(self, path: str, first: int):
        for index, batch, _, _ in arrow_batches(path, first):
            yield index, 0, image_parts(batch.column(batch.schema.get_field_index(self._column)))[0]
