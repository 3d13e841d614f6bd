"""Rewrite: stage the live records, move the old store aside as a backup, publish.

Through :func:`packer.stores.staging.write_store` (the result is checked as verify will read it
before anything is published), journalled by :mod:`.journal`.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import uuid

from packer.core.errors import StoreError
from packer.core.progress import progress_bar
from packer.core.records import StoreMetadata, checksum, checksum_matches
from packer.jobs.repair.journal import check_backup, connection, drop_journal, enter_phase
from packer.jobs.repair.plan import ACTIONS, RepairJob, RepairPlan, now
from packer.jobs.repair.source import Source
from packer.jobs.reports import RepairReport
from packer.jobs.steps import add_stats
from packer.stores.staging import fault_point, write_store
from packer.version import __version__

log = logging.getLogger(__name__)


def _repaired_metadata(plan: RepairPlan, store_cls, report: RepairReport) -> StoreMetadata:
    """The metadata of the result: its quarantine, a history entry, the record count."""
    meta = plan.meta
    q_meta = [q for _, q in plan.kept_q] + [entry for entry, _ in plan.new_q]
    history = list(meta.history or []) + [{
        "action": "repair", "at": now(), "packer_version": __version__,
        "original_index_checksum": _original_index_checksum(meta),
        "unverified": list(plan.unverified),
        "summary": {a: sum(1 for x in report.actions if x["action"] == a) for a in ACTIONS
                    if any(x["action"] == a for x in report.actions)}}]
    new_meta = dataclasses.replace(meta, quarantine=q_meta, history=history, format=store_cls.name)
    new_meta.stats = _recounted_stats(meta, (planned.record for _, planned in plan.live))
    return new_meta


#: Statistics of the build itself (its inputs), not of the records a store holds: kept by repair.
BUILD_FACTS = ("inputs", "rejected", "ignored")


def _recounted_stats(meta: StoreMetadata, records) -> dict:
    """The statistics ``info`` shows, counted again over the records the repaired store holds
    (sizes, bytes, channels, sources, labels...), so that no figure still counts a record the
    repair took out or misses one it rebuilt; what the build was given (:data:`BUILD_FACTS`) is
    kept as it was."""
    stats: dict = {}
    for rec in records:
        add_stats(stats, rec, meta.label_schema)
    stats["records"] = stats.get("records", 0)
    old = meta.stats or {}
    return dict(stats, **{k: old[k] for k in BUILD_FACTS if k in old})


def write_repaired(job: RepairJob, plan: RepairPlan, report: RepairReport) -> None:
    """Stage the live records, move the old store aside as a backup, publish the repaired one
    (journalled: a killed repair finishes on rerun), and mark what could not be verified."""
    store_cls, location, meta = job.store_cls, job.location, plan.meta
    q_items = [(j, job.reader.quarantine_bytes(n)) for j, (n, _) in enumerate(plan.kept_q)]
    q_items += [(len(q_items) + j, data) for j, (_, data) in enumerate(plan.new_q)]
    new_meta = _repaired_metadata(plan, store_cls, report)
    plan_fp = checksum(json.dumps({"origin": job.origin, "index": meta.index_checksum,
                                   "actions": report.actions, "n": len(plan.live)}, sort_keys=True,
                                  default=str).encode())
    backup = (job.journal or {}).get("backup") or store_cls.side_location(
        location, ".repair-backup-" + datetime.datetime.now().strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6])
    conn = connection(store_cls, job.reader_options)
    check_backup(backup, location, job.source, job.labels, conn)
    enter_phase(store_cls, location, "staging", backup, now(), conn)
    swapping = []   # set once the old store starts moving aside

    def move_aside():
        swapping.append(True)
        enter_phase(store_cls, location, "swap", backup, now(), conn)
        if job.origin == location and store_cls.store_exists(location, **conn):
            store_cls.move_store(location, backup, **conn)
            if store_cls.store_exists(location, **conn):
                raise StoreError(f"{location}: could not move the old store aside to {backup}")
        fault_point("swap")

    writer_options = dict((meta.build_options or {}).get("store_options") or {}, **conn)
    bar = progress_bar(len(plan.live), 0, job.progress, "repairing")
    try:
        published, _ = write_store(store_cls, location, plan_fp, (p for _, p in plan.live), len(plan.live),
                                   new_meta, writer_options=writer_options, quarantine=q_items,
                                   resume=job.resume, overwrite=job.overwrite, commit_bytes=job.commit_bytes,
                                   before_publish=move_aside, bar=bar, held=job.held)
    except StoreError:
        # Stopped before the swap (e.g. the staged result would not verify): the old store is
        # in place, untouched, and the journal has nothing to finish. After the swap began it
        # says where the old store went, and stays for the rerun.
        if not swapping and job.origin == location:
            drop_journal(store_cls, location, conn)
        raise
    finally:
        bar.close()
    store_cls.write_journal(location, None, **conn)
    report.backup = backup
    _check_unverified(plan, published, report)
    log.info("%s: repaired (%d actions); old store kept at %s", location, len(report.actions), backup)


def _check_unverified(plan: RepairPlan, published: StoreMetadata, report: RepairReport) -> None:
    """Records rebuilt without their own fields are accepted when the result matches the
    original build's index checksum (or, that lost too, the survivors match --source)."""
    if not plan.unverified:
        return
    orig = _original_index_checksum(plan.meta)
    if (orig and published.index_checksum == orig) or (not orig and _source_matches_survivors(plan.src, plan.good)):
        for a in report.actions:
            if a["key"] in plan.unverified:
                a["detail"] += (" (checked: the store's index checksum matches the original build)"
                                if orig else
                                " (checked: every record that survived matches its file in --source, "
                                "and the build's index checksum was lost with the metadata)")
        return
    for a in report.actions:
        if a["key"] in plan.unverified:
            a["detail"] += (" (UNVERIFIED: the record's own fields were lost, and the rebuilt store "
                            "does not match the original build's index checksum)")
    report.unrepaired.extend(a for a in report.actions if a["key"] in plan.unverified)


def _source_matches_survivors(src: Source, good: list) -> bool:
    """Evidence that ``--source`` is what the store was built from, when the build's index
    checksum is lost: every surviving record's original-file checksum matches its file."""
    if not good:
        return False
    for s in good:
        try:
            if not checksum_matches(src.src.path(s.record.key).read_bytes(), s.record.source_checksum):
                return False
        except OSError:
            return False
    return True


def _original_index_checksum(meta: StoreMetadata) -> str:
    """The index checksum of the store as built (kept in the history by earlier repairs)."""
    for h in meta.history or []:
        if "original_index_checksum" in h:
            return h["original_index_checksum"]   # "" when the metadata was lost: unknown
    return meta.index_checksum


__all__ = ["write_repaired", "BUILD_FACTS"]
