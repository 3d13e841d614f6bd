"""Shared plumbing of repair, convert, append and merge: writing a whole store through a
backend's writer, and checking what was staged before it is published.

:func:`write_store` stages records with ``store_cls.create_writer`` exactly as a build does
(``<out>.partial`` or a staging collection, resumable after a kill through the writer's own
resume state), keeps quarantined bytes, and publishes atomically. The caller decides what
goes in; everything here is format-agnostic.

:class:`StagedCheck` is the gate in front of ``publish``: every record is checked as
``packer verify`` will read it back from the result (its fields decode under the store's label
schema, they and the bytes match their checksums), then the staged index is read back (no gap,
the count expected, every record at its index under its key). A result that fails is never
published: the old store, if any, stays in place as it was. ``write_store`` (repair, convert),
``append`` and ``merge --copy`` all stage through it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
from typing import Callable, Iterable, Optional

import numpy as np

from packer.core.diskspace import more_needed
from packer.core.errors import DiskFullError, StoreError
from packer.core.locking import output_lock
from packer.core.records import LABEL_SCHEMAS, IndexHasher, Record, StoreMetadata, sealed_with
from packer.stores.base import partial_location

log = logging.getLogger(__name__)

#: Fault injection for the kill tests: SIGKILL this process at a named step of repair/convert
#: (``swap``: after the old store was moved aside, before the new one is published).
FAULT_KILL_AT_ENV = "PACKER_FAULT_KILL_AT"


def fault_point(name: str) -> None:
    """SIGKILL this process when ``$PACKER_FAULT_KILL_AT`` names this step (tests only)."""
    if os.environ.get(FAULT_KILL_AT_ENV) == name:
        log.warning("%s=%s: killing this process to test recovery", FAULT_KILL_AT_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


def hash_staged_index(writer, location: str, algorithm: Optional[str] = None,
                      on_entry: Optional[Callable[[int, str], None]] = None) -> tuple[int, str]:
    """Count and index checksum of what ``writer`` staged, checking the indices run 0, 1, 2, ...

    A build seals its metadata with this before publishing, so a staging area with a hole is
    never published; append, merge and repair/convert read the index back through
    :meth:`StagedCheck.seal`, which checks this and more.

    Args:
        writer: a backend writer after ``flush()`` (its ``iter_index()`` yields (index, key,
            record checksum) in index order).
        location: the output, for the error message.
        algorithm: the store's checksum algorithm (default: the current one).
        on_entry: called with (index, key) of every staged record, in index order.

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
        if on_entry is not None:
            on_entry(idx, key)
        n += 1
    return n, hasher.hexdigest()


def _label_kind(label) -> str:
    """A short description of a label for messages (a boxes array can be long)."""
    if label is None:
        return "no label"
    if isinstance(label, dict):
        return "an 'objects' label"
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        return f"class id {int(label)}"
    return f"{type(label).__name__} of shape {np.shape(label)}"


class StagedCheck:
    """The gate in front of ``publish``: what a writer of a whole store stages, checked as
    ``packer verify`` will read the result back.

    Hand every record to :meth:`record` just before the writer gets it; once everything is
    staged and flushed, :meth:`seal` reads the staged index back and returns the count and
    index checksum to publish with. A record or an index that would not verify raises
    StoreError naming the store, the key and what is wrong, inside the caller's ``with
    writer:``, so nothing is published and the old store (if any) stays as it was; the staging
    area keeps only records that passed, so a rerun resumes as after a kill.

    Checked per record, as verify checks each record it reads:

    * its fields, serialized as the backends store them (:meth:`Record.meta_to_json`), decode
      under the store's label schema through the decode every reader uses
      (:meth:`Record.from_meta`): a class id in a store of boxes fails here as it would fail
      every read ("cannot reshape array of size 1 into shape (5)");
    * the fields decoded match the record checksum written with them (a label that decodes to
      another value, e.g. a class id in a store of no labels, would read back as damaged);
    * the bytes match their checksum.

    Not checked: the JPEG decode of ``verify --deep``. Records rebuilt from source files and
    salvaged ones were strictly decoded on the way in, records copied from a store are the
    bytes that verified there, and ``repair --restore`` puts a quarantined record back as it
    was, on purpose (its report then says the store does not verify --deep).

    Checked for the staging area: indices run 0..n-1 without a gap, n is the count expected,
    and each index this run staged holds the key handed to the writer for it.

    Args:
        location: the output, for messages.
        label_schema: the label schema the published metadata will name.
        algorithm: the store's checksum algorithm (of its index checksum).
        first_index: the writer's ``state.next_index`` after ``open``: records below it were
            staged, and checked, by an earlier run that this one resumes.

    Example:
        >>> check = StagedCheck("out.lmdb", "boxes", meta.checksum_algorithm, state.next_index)  # doctest: +SKIP
        >>> writer.add(check.record(rec))                                    # doctest: +SKIP
        >>> n, index_sum = check.seal(writer, expected=total)                # doctest: +SKIP
    """

    def __init__(self, location: str, label_schema: str, algorithm: Optional[str] = None, first_index: int = 0):
        if label_schema not in LABEL_SCHEMAS:
            raise StoreError(f"{location}: label schema {label_schema!r} is none of {', '.join(LABEL_SCHEMAS)}; "
                             f"nothing published")
        self.location = location
        self.label_schema = label_schema
        self.algorithm = algorithm
        self.first_index = int(first_index)
        self._handed = IndexHasher()   # (index, key) of every record this run handed to the writer
        self._next = self.first_index

    def _refuse(self, rec: Record, why: str) -> StoreError:
        return StoreError(f"{self.location}: key {rec.key!r} (index {rec.index}): would not verify in the "
                          f"result: {why}; nothing published")

    def record(self, rec: Record) -> Record:
        """Check ``rec`` (its final index set) as verify would read it back; returns it.

        Raises:
            StoreError: it would not verify (the message names the store, the key and why).
        """
        if rec.index != self._next:
            raise self._refuse(rec, f"handed over at index {rec.index}, expected {self._next}")
        try:
            back = Record.from_meta(json.loads(rec.meta_to_json()), rec.data, self.label_schema)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise self._refuse(rec, f"its label ({_label_kind(rec.label)}) does not fit the store's label "
                                    f"schema {self.label_schema!r}: record metadata would be damaged: {exc}") from exc
        if not back.meta_ok():
            raise self._refuse(rec, f"its label ({_label_kind(rec.label)}) reads back as "
                                    f"{_label_kind(back.label)} under the store's label schema "
                                    f"{self.label_schema!r}: record checksum mismatch")
        if not back.data_ok():
            raise self._refuse(rec, "its bytes do not match their checksum")
        self._handed.update(rec.index, rec.key, "")
        self._next += 1
        return rec

    def seal(self, writer, expected: Optional[int] = None) -> tuple[int, str]:
        """Read the staged index back (after ``writer.flush()``): ``(count, index_checksum)``.

        Args:
            writer: the backend writer (its ``iter_index()`` yields (index, key, record checksum)).
            expected: the number of records the staging area must hold (default: as many as
                were handed over, resumed ones included).

        Raises:
            StoreError: a gap, another count, or a key that is not the one handed over.
        """
        staged = IndexHasher()   # (index, key) of what this run staged, to compare with what it handed over

        def note(idx: int, key: str) -> None:
            if idx >= self.first_index:
                staged.update(idx, key, "")

        try:
            n, index_sum = hash_staged_index(writer, self.location, self.algorithm, on_entry=note)
        except StoreError as exc:
            raise StoreError(f"{exc}; nothing published") from exc
        expected = self._next if expected is None else int(expected)
        if n != expected:
            raise StoreError(f"{self.location}: staging area holds {n} records, expected {expected}; "
                             f"nothing published")
        if staged.hexdigest() != self._handed.hexdigest():
            raise StoreError(f"{self.location}: the staged index does not list the keys handed to the writer "
                             f"(indices {self.first_index}..{n - 1}); nothing published")
        return n, index_sum


class Stage:
    """One job's staging area, from the output lock to the atomic publish: the path every job
    that writes a store takes (build, append, convert, merge --copy, repair).

    The named steps, in order::

        with Stage(store_cls, out, fingerprint, label_schema=..., purpose="build") as stage:
            for each input from stage.state.next_input on:      # resume point of a killed run
                stage.add(record)                               # checked, indexed, handed over
                stage.advance()                                 # commit point (resumable)
            n, index_sum = stage.seal(expected)                 # staged index read back
            stage.publish(metadata)                             # atomic; else nothing appears

    ``__enter__`` takes the output lock (:func:`packer.core.locking.output_lock`: one writer per
    output), creates the backend writer, runs ``under_lock`` (a caller's last check of the output,
    now that nobody else can publish there and the writer has claimed its staging area) and opens
    the writer's resume state. Every record goes
    through :class:`StagedCheck` before the writer gets it. An exception inside the ``with``
    publishes nothing and keeps the staging area for a rerun.

    Args:
        store_cls: the backend (:func:`packer.stores.get_store`).
        location: the output.
        fingerprint: what identifies this job's inputs and options: a rerun with the same
            fingerprint resumes the staging area, another one starts over.
        label_schema / algorithm: of the store being written (see :class:`StagedCheck`).
        purpose: the lock's purpose, shown to a second writer ("build", "append", ...).
        connection: backend connection options (e.g. MongoDB ``uri``).
        writer_options: backend writer options (``commit_bytes``, HDF5 ``pixels``...).
        resume: continue a staging area of the same fingerprint (else start over).
        bar: a progress bar (``update(n)``), advanced by :meth:`advance` and by a resume.
        under_lock: called once the lock is held and the writer created, before its state is opened.
        held: the output lock when the caller already holds it (a :class:`HeldLock`), else
            the stage takes it.
    """

    def __init__(self, store_cls, location: str, fingerprint: str, *, label_schema: str,
                 algorithm: Optional[str] = None, purpose: str, connection: Optional[dict] = None,
                 writer_options: Optional[dict] = None, resume: bool = True, bar=None,
                 under_lock: Optional[Callable[[], None]] = None, held=None):
        self.store_cls, self.location, self.fingerprint = store_cls, location, fingerprint
        self.label_schema, self.algorithm, self.purpose = label_schema, algorithm, purpose
        self.connection = dict(connection or {})
        self.writer_options = dict(writer_options or {})
        self.resume, self.bar, self.under_lock = resume, bar, under_lock
        self.held, self.writer, self.state, self.check = held, None, None, None
        self.resumed_from = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Stage":
        with self._stack as stack:
            if self.held is None:
                self.held = stack.enter_context(output_lock(self.location, self.store_cls, purpose=self.purpose,
                                                     **self.connection))
            self.writer = stack.enter_context(self.store_cls.create_writer(self.location, **self.writer_options))
            if self.under_lock is not None:
                self.under_lock()
            self.state = self.writer.open(self.fingerprint, resume=self.resume)
            self.resumed_from = self.state.next_input
            self.check = StagedCheck(self.location, self.label_schema, self.algorithm, self.state.next_index)
            if self.state.next_input and self.bar is not None:
                self.bar.update(self.state.next_input)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> bool:
        if isinstance(exc[1], KeyboardInterrupt):
            # For the CLI's last line: a staging area to resume from, or nothing kept (False).
            exc[1].packer_kept = self.kept()
        return self._stack.__exit__(*exc)

    def kept(self):
        """Where the committed work waits for a rerun (``<out>.partial``, or the staging area
        of a server store), or False when nothing was committed yet (by this run or one before)."""
        committed = self.resumed_from > 0 or getattr(self.writer, "_commits", 0) > 0
        if not committed:
            return False
        return f"the staging area of {self.location}" if "://" in self.location else partial_location(self.location)

    def add(self, rec: Record, *, stored: bool = False) -> Record:
        """Stage ``rec`` at the next index, checked as verify will read it; returns it as staged.
        ``stored``: the bytes are already in the store's encoding (copied from a store), else
        the writer converts them (e.g. HDF5 pixels)."""
        rec = self.check.record(dataclasses.replace(rec, index=self.state.next_index))
        (self.writer.add_stored if stored else self.writer.add)(rec)
        self.state.next_index += 1
        return rec

    def reject(self, path: str, reason: str, *, unreachable: bool = False) -> None:
        """List an input that could not be stored (it goes into the report); ``unreachable``: its
        storage did not answer within the retry budget (the input may be whole)."""
        self.state.rejects.append({"path": path, "reason": reason, **({"unreachable": True} if unreachable else {})})

    def advance(self, inputs: int = 1) -> None:
        """Count ``inputs`` more inputs as done: the resume point moves past them once their
        records are committed."""
        self.state.next_input += inputs
        self.writer.checkpoint(self.state)
        if self.bar is not None:
            self.bar.update(inputs)

    def seal(self, expected: Optional[int] = None) -> tuple[int, str]:
        """Flush, then read the staged index back (:meth:`StagedCheck.seal`): ``(count,
        index_checksum)`` to publish with."""
        self.writer.flush()
        return self.check.seal(self.writer, expected=expected)

    def publish(self, metadata: StoreMetadata, *, overwrite: bool = False, quarantine=(),
                before_publish: Optional[Callable[[], None]] = None) -> None:
        """Write the quarantined ``(n, bytes)`` items, run ``before_publish``, check the lock is
        still ours, and publish atomically with ``metadata``."""
        if quarantine:
            self.writer.write_quarantine(list(quarantine))
        if before_publish is not None:
            before_publish()
        self.held.check()   # still the only writer (a heartbeat lock could have been taken over)
        self.writer.publish(metadata, overwrite=overwrite)


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
                expect_index_checksum: Optional[str] = None, held=None) -> tuple[StoreMetadata, int]:
    """Stage ``planned`` records (index = position) through a :class:`Stage`, check them, and
    publish them with ``metadata``; the whole job of convert and repair.

    ``planned`` is consumed lazily; after a resume, items before the writer's resume point are
    read and dropped here. A result that would not verify (e.g. a label that does not fit
    ``metadata.label_schema``) raises StoreError and is never published, and ``before_publish``
    does not run. ``expect_index_checksum``: refuse to publish unless the staged index has it
    (convert: the source's). ``metadata.count`` and ``index_checksum`` are recomputed from what
    was staged. ``before_publish`` runs after everything is staged and checked, and before the
    store appears (repair moves the old store aside there). ``held``: the output lock, which the
    caller holds (:func:`output_lock`).

    Returns:
        ``(metadata as published, records resumed from an earlier run)``.

    Raises:
        StoreError: a record would not verify in the result, or the staging area does not hold
            what was written; nothing is published.
    """
    opts = dict(writer_options)
    if commit_bytes is not None:
        opts["commit_bytes"] = int(commit_bytes)
    with Stage(store_cls, location, fingerprint, label_schema=metadata.label_schema,
               algorithm=metadata.checksum_algorithm, purpose="write", writer_options=opts,
               resume=resume, bar=bar, held=held) as stage:
        _stage_planned(stage, planned, total, metadata.checksum_algorithm)
        if stage.state.next_input != total:
            raise StoreError(f"{location}: staged {stage.state.next_input} records, expected {total}")
        n, index_sum = stage.seal(expected=total)
        if expect_index_checksum is not None and index_sum != expect_index_checksum:
            raise StoreError(f"{location}: staged index checksum {index_sum} differs from the "
                             f"source's {expect_index_checksum}; nothing published")
        meta = dataclasses.replace(metadata, count=n, index_checksum=index_sum)
        stage.publish(meta, overwrite=overwrite, quarantine=quarantine, before_publish=before_publish)
    return meta, stage.resumed_from


def _stage_planned(stage: Stage, planned: Iterable[Planned], total: int, algorithm: Optional[str]) -> None:
    """Hand ``planned`` to ``stage`` from its resume point on; a full disk says about what the
    rest needs."""
    first, handed = stage.state.next_input, 0   # bytes handed over by this run: a full disk's estimate
    for pos, item in enumerate(planned):
        if pos < stage.state.next_input:
            continue
        # Every record of one store under the store's algorithm (a BLAKE2b store stays one).
        rec = stage.add(sealed_with(dataclasses.replace(item.record, index=stage.state.next_index), algorithm),
                        stored=item.stored)
        handed += len(rec.data)
        try:
            stage.advance()
        except DiskFullError as exc:   # a batch did not fit: say about what the rest needs
            left = total - stage.state.next_input
            raise more_needed(exc, handed * left // (stage.state.next_input - first), "the rest") from exc
