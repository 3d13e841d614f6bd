"""Reading every record of an open store, in index order, each checked against its checksum:
what ``packer export`` and the interchange exporters write from.

Example:
    >>> with open_store("train.lmdb") as reader:             # doctest: +SKIP
    ...     keys = [rec.key for rec in iter_records(reader)]
"""
from __future__ import annotations

from typing import Iterator, Optional

from packer.core.errors import RecordError

__all__ = ["iter_records", "pixels_as_png", "CHECKSUM_MISMATCH"]

#: The reason a record that fails its checksum is refused with.
CHECKSUM_MISMATCH = "checksum mismatch (hint: packer repair first)"


def iter_records(reader, *, batch: int = 256, check: bool = True, location: Optional[str] = None,
                 bar=None) -> Iterator:
    """Every record of ``reader``, in index order, read ``batch`` at a time (``get_many``).

    Args:
        reader: an open store reader (:func:`packer.stores.open_store`).
        batch: records per ``get_many`` call.
        check: raise for a record whose bytes do not match their checksum.
        location: the store as the error names it (default ``reader.location``).
        bar: a progress bar (:func:`packer.core.progress.progress_bar`) advanced by one per
            record read, before its check.

    Yields:
        Record: each record of the store.

    Raises:
        RecordError: ``check`` and a record's bytes do not match their checksum (repair the
            store first).
    """
    count = reader.metadata.count
    where = reader.location if location is None else location
    for start in range(0, count, batch):
        for rec in reader.get_many(range(start, min(start + batch, count))):
            if bar is not None:
                bar.update(1)
            if check and not rec.data_ok():
                raise RecordError(where, rec.key, CHECKSUM_MISMATCH, rec.index)
            yield rec


def pixels_as_png(rec, reader, *, location: Optional[str] = None) -> bytes:
    """A record of decoded pixels (a store whose ``encoding`` is ``"raw"``: uint8 RGB of
    ``reader.raw_shape``) as lossless PNG bytes.

    Raises:
        RecordError: the PNG encoder fails (named by ``location``, default ``reader.location``).
    """
    import cv2
    import numpy as np

    arr = np.frombuffer(bytes(rec.data), np.uint8).reshape(reader.raw_shape)
    if arr.ndim == 3 and arr.shape[2] == 3:
        arr = cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".png", arr)
    if not ok:
        raise RecordError(reader.location if location is None else location, rec.key, "PNG encode failed",
                          rec.index)
    return buf.tobytes()
