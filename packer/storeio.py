"""Shared plumbing of repair and convert: writing a whole store through a backend's writer.

:func:`write_store` stages records with ``store_cls.create_writer`` exactly as a build does
(``<out>.partial`` or a staging collection, resumable after a kill through the writer's own
resume state), keeps quarantined bytes, and publishes atomically. The caller decides what
goes in; everything here is format-agnostic.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from typing import Callable, Iterable, Optional

from .errors import StoreError
from .records import IndexHasher, Record, StoreMetadata, sealed_with

log = logging.getLogger(__name__)

#: Fault injection for the kill tests: SIGKILL this process at a named step of repair/convert
#: (``swap``: after the old store was moved aside, before the new one is published).
FAULT_KILL_AT_ENV = "PACKER_FAULT_KILL_AT"


def fault_point(name: str) -> None:
    """SIGKILL this process when ``$PACKER_FAULT_KILL_AT`` names this step (tests only)."""
    if os.environ.get(FAULT_KILL_AT_ENV) == name:
        log.warning("%s=%s: killing this process to test recovery", FAULT_KILL_AT_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


def hash_staged_index(writer, location: str, algorithm: Optional[str] = None) -> tuple[int, str]:
    """Count and index checksum of what ``writer`` staged, checking the indices run 0, 1, 2, ...

    Every writer of a whole store (build, append, merge, repair/convert) seals its metadata with
    this before publishing, so a staging area with a hole is never published.

    Args:
        writer: a backend writer after ``flush()`` (its ``iter_index()`` yields (index, key,
            record checksum) in index order).
        location: the output, for the error message.
        algorithm: the store's checksum algorithm (default: the current one).

    Returns:
        ``(count, index_checksum)``.

    Raises:
        StoreError: an index is missing from the staging area.

    Example:
        >>> n, index_sum = hash_staged_index(writer, "out.lmdb", meta.checksum_algorithm)  # doctest: +SKIP
    """
    hasher, n = IndexHasher(algorithm), 0
    for idx, key, rec_sum in writer.iter_index():
        if idx != n:
            raise StoreError(f"{location}: staging area has a gap at index {n} (found {idx})")
        hasher.update(idx, key, rec_sum)
        n += 1
    return n, hasher.hexdigest()


@contextlib.contextmanager
def output_lock(location: str, store_cls=None, *, purpose: str, **connection):
    """Exclusive hold on ``location`` while repair/convert/append/merge write it: the same lock
    a build takes (:func:`packer.locking.output_lock`), so no two writers of one output run at
    once. Yields the :class:`~packer.locking.HeldLock`.

    Raises:
        LockedError: another writer holds it (the message names host, pid and since when).
    """
    from .locking import output_lock as take

    with take(location, store_cls, purpose=purpose, **connection) as held:
        yield held


@dataclasses.dataclass
class Planned:
    """One record to write: ``stored`` is True when it is already in the target's encoding
    (copied from a store), False when it comes from a source image (the writer converts it,
    e.g. to HDF5 pixels)."""

    record: Record
    stored: bool = True


def write_store(store_cls, location: str, fingerprint: str, planned: Iterable[Planned], total: int,
                metadata: StoreMetadata, *, writer_options: dict, quarantine: list[tuple[int, bytes]] = (),
                resume: bool = True, overwrite: bool = False, commit_bytes: Optional[int] = None,
                before_publish: Optional[Callable[[], None]] = None, bar=None,
                expect_index_checksum: Optional[str] = None) -> StoreMetadata:
    """Stage ``planned`` records (index = position) and publish them with ``metadata``.

    ``planned`` is consumed lazily; after a resume, items before the writer's resume point are
    read and dropped here. ``expect_index_checksum``: refuse to publish unless the staged
    index has it (convert: the source's). ``metadata.count`` and
    ``index_checksum`` are recomputed from what was staged. ``before_publish`` runs after
    everything is staged and before the store appears (repair moves the old store aside there).

    Returns:
        The metadata as published.

    Raises:
        StoreError: the staging area does not hold what was written.
    """
    opts = dict(writer_options)
    if commit_bytes is not None:
        opts["commit_bytes"] = int(commit_bytes)
    algorithm = metadata.checksum_algorithm
    with store_cls.create_writer(location, **opts) as writer:
        state = writer.open(fingerprint, resume=resume)
        if state.next_input and bar is not None:
            bar.update(state.next_input)
        for pos, item in enumerate(planned):
            if pos < state.next_input:
                continue
            # Every record of one store under the store's algorithm (a BLAKE2b store stays one).
            rec = sealed_with(dataclasses.replace(item.record, index=state.next_index), algorithm)
            (writer.add_stored if item.stored else writer.add)(rec)
            state.next_index += 1
            state.next_input = pos + 1
            writer.checkpoint(state)
            if bar is not None:
                bar.update(1)
        writer.flush()
        if state.next_input != total:
            raise StoreError(f"{location}: staged {state.next_input} records, expected {total}")
        n, index_sum = hash_staged_index(writer, location, algorithm)
        if expect_index_checksum is not None and index_sum != expect_index_checksum:
            raise StoreError(f"{location}: staged index checksum {index_sum} differs from the "
                             f"source's {expect_index_checksum}; nothing published")
        if quarantine:
            writer.write_quarantine(list(quarantine))
        meta = dataclasses.replace(metadata, count=n, index_checksum=index_sum)
        if before_publish is not None:
            before_publish()
        writer.publish(meta, overwrite=overwrite)
    return meta
