"""Reading a damaged store: what verify and repair share when its metadata is gone.

A backend's salvage reader (``Store.open_salvage``) reads what is left of a store whose
metadata or index is damaged, with stand-in metadata; these helpers recognize that metadata,
infer the label schema the records were built with, and let go of the reader. They live
beside the Store contract, below the jobs (:mod:`packer.jobs.verify`,
:mod:`packer.jobs.repair`) that use them. Not a backend (see ``BACKENDS`` in ``__init__``).
"""
from __future__ import annotations

from typing import Optional

from packer.core.errors import RecordError, StoreError
from packer.core.records import StoreMetadata


def infer_label_schema(reader, hint: Optional[str] = None) -> str:
    """The label schema of a store whose metadata is lost: the one under which records' own
    meta checksums verify (the checksum covers the label as the build wrote it)."""
    candidates = [hint] if hint else []
    candidates += [s for s in ("class", "boxes", "none") if s not in candidates]
    n = reader.metadata.count
    for i in range(min(n, 64)):
        for schema in candidates:
            reader.metadata.label_schema = schema
            try:
                rec = reader.get(i)
            except (RecordError, StoreError, IndexError):
                continue
            if rec.meta_ok():
                return schema
    reader.metadata.label_schema = candidates[0]
    return candidates[0]


def metadata_is_provisional(meta: StoreMetadata) -> bool:
    """True for the stand-in metadata a salvage reader makes when the store's own is gone."""
    return not meta.index_checksum


def release(reader) -> None:
    """Close a (salvage) reader and drop any temporary copy it read through."""
    rel = getattr(reader, "release_salvage_copy", None)
    if rel is not None:
        rel()
    reader.close()


__all__ = ["infer_label_schema", "metadata_is_provisional", "release"]
