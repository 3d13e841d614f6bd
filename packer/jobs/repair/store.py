"""Repair of one store (LMDB, HDF5, MongoDB): find, decide, rewrite, publish.

:func:`repair_store` is what :func:`packer.jobs.repair.repair` runs for a store (a manifest is
repaired shard by shard by :mod:`packer.jobs.repair.manifest`, through this). The steps:

* **find** (:func:`packer.jobs.repair.scan.scan`): what ``verify --deep`` finds, per record,
  through the salvage reader;
* **decide** (:func:`packer.jobs.repair.plan.plan_repair`): from source, salvaged, quarantined,
  restored or lost, per record; the plan is the report of a dry run;
* **rewrite** (:func:`packer.jobs.repair.write.write_repaired`): stage the live records through
  :func:`packer.stores.staging.write_store`, move the old store aside as a backup (a journal,
  :mod:`packer.jobs.repair.journal`, makes a killed repair finish on rerun), publish atomically.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Optional

from packer.core.locking import output_lock
from packer.jobs.repair.journal import connection, detect_repair_format, resume_point, source_inputs
from packer.jobs.repair.plan import RepairJob, plan_repair
from packer.jobs.repair.write import write_repaired
from packer.jobs.reports import RepairReport
from packer.jobs.verify import verify
from packer.stores import get_store
from packer.stores.outputs import check_output
from packer.stores.salvage import release

log = logging.getLogger(__name__)


def repair_store(location, source=None, labels=None, *, format: Optional[str] = None, dry_run: bool = False,
                 restore=(), report_path=None, progress: bool = False, commit_bytes: Optional[int] = None,
                 **reader_options) -> RepairReport:
    """Repair the store at ``location``: a store, not a manifest. The arguments, the result and
    the errors are :func:`packer.jobs.repair.repair`'s."""
    location = str(location)
    fmt = detect_repair_format(location, format)
    store_cls = get_store(fmt)
    conn = connection(store_cls, reader_options)
    restore = list(restore or [])
    # The store is rewritten in place (its backup next to it): never inside, over or around the
    # files it is rebuilt from.
    check_output(location, inputs=source_inputs(source, labels), kind="place")
    with (contextlib.nullcontext() if dry_run else output_lock(location, store_cls, purpose="repair", **conn)) as held:
        journal, origin, resume, overwrite = (None, location, True, False) if dry_run else resume_point(
            store_cls, location, source, labels, reader_options)
        reader = store_cls.open_salvage(origin, **reader_options)
        try:
            job = RepairJob(store_cls, fmt, location, origin, reader, source, labels, restore, progress, journal,
                            resume, overwrite, commit_bytes, reader_options, held)
            report = _repair(job, dry_run)
        finally:
            release(reader)
        if not dry_run and not report.nothing_to_repair:
            report.verified = verify(location, deep=True, format=fmt, **reader_options).ok
        report.save(report_path)
    return report


def _repair(job: RepairJob, dry_run: bool) -> RepairReport:
    """Find, decide, and (unless ``dry_run``) rewrite; returns the report."""
    report = RepairReport(job.location, job.fmt, dry_run, False)
    plan = plan_repair(job, report)
    if plan is not None and not dry_run:
        write_repaired(job, plan, report)
    return report


__all__ = ["repair_store"]
