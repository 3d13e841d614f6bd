"""The journal and backup of a repair: a killed repair finishes on rerun.

Before the rewrite a journal next to the store (``Store.write_journal``) names the backup
location the old store will move to and the phase: ``staging`` (the old store is in place) or
``swap`` (it may have moved aside). A rerun finds it (:func:`resume_point`): after ``swap``, a
published result is finished, and otherwise the repair starts again from the backup.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

from packer.core.errors import StoreError, UsageError
from packer.stores import detect_format, get_store
from packer.stores.outputs import check_output

log = logging.getLogger(__name__)


def source_inputs(source, labels) -> list:
    return [("--source images", source), ("--source labels", labels)]


def check_backup(backup: str, location: str, source, labels, conn: dict) -> None:
    """The backup location must be free or hold the old store an interrupted repair moved there
    (a packer store), and lie outside the store and the source.

    Raises:
        UsageError: naming the backup location and what is there.
    """
    check_output(backup, inputs=[("store", location)] + source_inputs(source, labels), overwrite=True,
                 connection=conn)


def connection(store_cls, options: dict) -> dict:
    return {k: v for k, v in options.items() if k in store_cls.connection_options}


def detect_repair_format(location: str, format: Optional[str]) -> str:
    """The format of the store at ``location``, or of the one a killed repair left in its journal."""
    if format:
        get_store(format)
        return format
    try:
        return detect_format(location)
    except StoreError:
        journal = str(location).rstrip("/") + ".repair-journal.json"
        if os.path.exists(journal):
            with open(journal, encoding="utf-8") as fh:
                return json.load(fh)["format"]
        raise


def resume_point(store_cls, location: str, source, labels, reader_options: dict) -> tuple:
    """Where a repair of ``location`` starts: ``(journal, origin, resume, overwrite)``.

    Without a journal, or with one of the ``staging`` phase: from the store itself (``origin``
    is ``location``), resuming its staged rewrite. After ``swap``: a result that was published
    is finished (the journal removed, None returned for it); otherwise the old store, complete
    in the backup, is where the records are read from, and the rewrite starts afresh.

    Raises:
        UsageError: the journal's backup location holds something else (see :func:`check_backup`).
    """
    conn = connection(store_cls, reader_options)
    journal = store_cls.read_journal(location, **conn)
    if journal and journal.get("backup"):
        check_backup(journal["backup"], location, source, labels, conn)
    if not (journal and journal.get("phase") == "swap"):
        return journal, location, True, False
    if _opens(store_cls, location, reader_options):
        log.info("%s: an earlier repair was published; finishing it", location)
        store_cls.write_journal(location, None, **conn)
        return None, location, True, False
    # Killed between moving the old store aside and publishing the new one: the old store is
    # complete in the backup; rebuild from it.
    store_cls.move_store(location, journal["backup"], **conn)
    return journal, journal["backup"], False, True


def enter_phase(store_cls, location: str, phase: str, backup: str, started: str, conn: dict) -> None:
    """Write the journal of a repair entering ``phase`` (``staging`` or ``swap``)."""
    store_cls.write_journal(location, {"phase": phase, "backup": backup, "format": store_cls.name,
                                       "started": started}, **conn)


def _opens(store_cls, location: str, options: dict) -> bool:
    try:
        store_cls.open_reader(location, **options).close()
        return True
    except (StoreError, UsageError):
        return False


def drop_journal(store_cls, location: str, conn: dict) -> None:
    """Remove the journal of a repair that stopped before touching the store, without masking
    the error that stopped it (a server gone is logged)."""
    try:
        store_cls.write_journal(location, None, **conn)
    except (StoreError, OSError) as exc:
        log.warning("%s: could not remove the repair journal: %s", location, exc)


__all__ = ["detect_repair_format", "resume_point", "enter_phase", "check_backup", "connection", "drop_journal",
           "source_inputs"]
