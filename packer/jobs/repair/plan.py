"""Decide: per damaged record, from source, salvaged, quarantined, restored or lost.

:func:`plan_repair` scans the store (:mod:`.scan`) and decides what becomes of every record;
the plan is the report of a dry run, and what :mod:`.write` stages.
"""
from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Optional

from packer.core.errors import UsageError
from packer.core.progress import progress_bar
from packer.core.records import IndexHasher, Record, StoreMetadata, checksum
from packer.jobs.repair.salvage import salvage_jpeg
from packer.jobs.repair.scan import Slot, scan
from packer.jobs.repair.source import Source
from packer.jobs.reports import RepairReport
from packer.stores.salvage import infer_label_schema, metadata_is_provisional
from packer.stores.staging import Planned

ACTIONS = ("from-source", "salvaged", "quarantined", "restored", "index-rebuilt", "metadata-rebuilt",
           "lost")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _kept_fields(entry: dict) -> dict:
    """The record fields a quarantine entry kept (all of them: per-sample metadata, coding and
    subsampling included), for :meth:`Record.from_meta`."""
    wanted = Record.META_FIELDS + Record.OPTIONAL_META_FIELDS + ("metadata",)
    return {k: v for k, v in entry["record"].items() if k in wanted}


@dataclass
class RepairJob:
    """What one repair works on: the store, where its records are read from (``origin``: the
    store, or its backup when a killed repair is finished), the source, and how to write."""

    store_cls: type
    fmt: str
    location: str
    origin: str
    reader: object
    source: object
    labels: object
    restore: list
    progress: bool
    journal: Optional[dict]
    resume: bool
    overwrite: bool
    commit_bytes: Optional[int]
    reader_options: dict
    held: object = None


@dataclass
class RepairPlan:
    """What a repair decided: the live records of the result (with their sort keys), the
    quarantine of the result, and the records rebuilt without a known position."""

    meta: StoreMetadata
    provisional: bool
    src: Optional[Source]
    slots: list
    quarantine: list
    q_keys: dict
    q_from_source: dict
    live: list = field(default_factory=list)       # (sort key, Planned)
    new_q: list = field(default_factory=list)      # (quarantine entry, bytes)
    keyless: list = field(default_factory=list)    # actions of unreadable records whose key is lost
    unverified: list = field(default_factory=list)

    @property
    def good(self) -> list:
        return [s for s in self.slots if s.damage is None]

    @property
    def kept_q(self) -> list:
        """``(n, entry)`` of the quarantined records that stay quarantined."""
        return [(n, q) for n, q in enumerate(self.quarantine)
                if q["key"] not in self.restore and n not in self.q_from_source]

    restore: list = field(default_factory=list)


def _open_source(job: RepairJob, meta: StoreMetadata, provisional: bool) -> Optional[Source]:
    """The ``--source`` files (None without); a store whose metadata is lost takes its label
    schema and class names from them."""
    if job.source is None:
        if provisional:
            infer_label_schema(job.reader)
        return None
    if provisional:
        from packer.sources.folders import collect_sources
        probe = collect_sources(job.source, job.labels, allow_unlabeled=True)
        meta.label_schema = infer_label_schema(job.reader, probe.label_schema)
        meta.class_names = list(probe.class_names)
        meta.build_options = {"labels": probe.label_source, "images": str(probe.root)}
    return Source(job.source, job.labels, meta, job.location)


def plan_repair(job: RepairJob, report: RepairReport) -> Optional[RepairPlan]:
    """Find what is damaged and decide what to do with each record (the report's actions);
    None when there is nothing to repair.

    Raises:
        UsageError: ``restore`` names a key that is not quarantined; the source cannot give
            what a record needs (see :class:`Source`).
    """
    reader, location = job.reader, job.location
    meta = reader.metadata
    provisional = metadata_is_provisional(meta)
    src = _open_source(job, meta, provisional)
    report.store_problems = list(reader.check_structure())
    bar = progress_bar(meta.count, 0, job.progress, "checking")
    try:
        slots = scan(reader, bar)
    finally:
        bar.close()
    hasher = IndexHasher(meta.checksum_algorithm)
    for s in slots:
        hasher.update(s.index, s.record.key if s.record else "", s.record.checksum if s.record else "missing")
    intact = all(s.damage is None for s in slots)
    if not provisional and hasher.hexdigest() != meta.index_checksum and intact:
        report.store_problems.append(f"{location}: index checksum mismatch")
    quarantine = list(meta.quarantine or [])
    q_keys = {q["key"]: n for n, q in enumerate(quarantine)}
    unknown = [k for k in job.restore if k not in q_keys]
    if unknown:
        raise UsageError(f"{location}: not in the quarantine area: {unknown} "
                         f"(quarantined: {sorted(q_keys) or 'none'})")
    plan = RepairPlan(meta, provisional, src, slots, quarantine, q_keys,
                      _quarantined_from_source(src, quarantine, job.restore, meta), restore=list(job.restore))
    if intact and not report.store_problems and not provisional and not job.restore \
            and not plan.q_from_source and (src is None or not _missing_keys(src, slots, quarantine)):
        report.nothing_to_repair = True
        report.records = len(slots)
        report.quarantined = len(quarantine)
        return None
    _decide(plan, reader, report)
    _rebuild_missing(plan, report)
    _restore_quarantined(plan, reader, report)
    _note_store_actions(plan, report)
    report.unrepaired = [a for a in report.actions if a["action"] == "lost"]
    report.quarantined = len(plan.kept_q) + len(plan.new_q)
    plan.live = _sorted_live(plan.live, slots)
    report.records = len(plan.live)
    return plan


def _quarantined_from_source(src: Optional[Source], quarantine: list, restore: list,
                             meta: StoreMetadata) -> dict:
    """Quarantined records whose original file is at hand, rebuilt from it: ``{n: Record}``."""
    out = {}
    if src is None:
        return out
    for n, q in enumerate(quarantine):
        if q["key"] not in src.labels or q["key"] in restore:
            continue
        try:
            expect = Record.from_meta(_kept_fields(q), b"", meta.label_schema)
        except (ValueError, TypeError, KeyError):
            continue
        # Its fields as the store held them, when they were intact (only its bytes were bad).
        expect.meta_checksum = q["record"].get("stored_meta_checksum", "")
        if src.bytes_only and not expect.meta_ok():
            continue   # its labels would have to come from the source: it stays quarantined
        rec, _ = src.record(q["key"], expect, keep_fields=expect.meta_ok())
        if rec is not None:
            out[n] = rec
    return out


def _decide(plan: RepairPlan, reader, report: RepairReport) -> None:
    """Per slot: keep it, rebuild it from source, salvage it, quarantine it, or call it lost."""
    src, meta = plan.src, plan.meta
    for s in plan.slots:
        if s.damage is None:
            plan.live.append(((s.index, s.record.key, False), Planned(s.record)))
            continue
        act = {"key": s.key, "index": s.index, "damage": s.damage}
        if s.key is None and s.record is None:
            if src is None:
                report.actions.append(dict(act, action="lost", detail="record unreadable and its key is lost; "
                                                                      "pass --source to rebuild it"))
            else:
                plan.keyless.append(act)   # rebuilt from the source files the store lacks
            continue
        if src is not None and s.key is not None:
            rec, why = src.record(s.key, s.record, keep_fields=s.record is not None and s.record.meta_ok())
            if rec is not None:
                plan.live.append(((s.index, s.key, False), Planned(rec, stored=False)))
                report.actions.append(dict(act, action="from-source", detail=f"rebuilt from {src.src.path(s.key)}"))
                continue
            act["source"] = why
        if _salvaged(plan, s, reader, act, report):
            continue
        if s.record is not None:
            entry = {"key": s.record.key, "index": s.index, "reason": s.damage, "at": now(),
                     "record": s.record.meta_dict(), "checksum": checksum(s.record.data, meta.checksum_algorithm),
                     "size": len(s.record.data)}
            entry["record"]["stored_meta_checksum"] = s.record.meta_checksum
            plan.new_q.append((entry, bytes(s.record.data)))
            report.actions.append(dict(act, action="quarantined",
                                       detail="moved to the quarantine area with its bytes"))
        else:
            report.actions.append(dict(act, action="lost", detail=(
                act.get("source") or "record unreadable: nothing left to keep; pass --source to rebuild it")))


def _salvaged(plan: RepairPlan, s: Slot, reader, act: dict, report: RepairReport) -> bool:
    """Keep a JPEG whose fields verify and whose bytes only lost their EOI, completed."""
    if s.record is None or reader.encoding != "jpeg" or not s.record.meta_ok() or s.record.data_ok():
        return False
    fixed = salvage_jpeg(s.record.data, s.record.channels)
    if fixed is None:
        return False
    data, what = fixed
    rec = dataclasses.replace(s.record, data=data, checksum=checksum(data), notes=list(s.record.notes) + [what])
    plan.live.append(((s.index, s.key, False), Planned(rec)))
    report.actions.append(dict(act, action="salvaged", detail=what))
    return True


def _rebuild_missing(plan: RepairPlan, report: RepairReport) -> None:
    """Records whose key is lost (e.g. a file cut short): rebuilt from the source files the
    store does not hold, accepted by the index checksum after the rewrite."""
    src = plan.src
    if src is None:
        return
    for key in _missing_keys(src, plan.slots, plan.quarantine):
        rec, why = src.record(key, None)
        if rec is None:
            report.actions.append({"key": key, "index": None, "damage": "not in the store",
                                   "action": "lost", "detail": why})
            continue
        plan.live.append(((None, key, True), Planned(rec, stored=False)))
        plan.unverified.append(key)
        report.actions.append({"key": key, "index": None, "damage": "lost from the store",
                               "action": "from-source", "detail": f"rebuilt from {src.src.path(key)}"})
    for act in plan.keyless[len(plan.unverified):]:
        report.actions.append(dict(act, action="lost", detail="record unreadable, its key is lost, and "
                                                              "--source holds no file the store lacks"))


def _restore_quarantined(plan: RepairPlan, reader, report: RepairReport) -> None:
    """Restores: quarantined bytes go back, at the position they had; quarantined records
    rebuilt from source go back too."""
    for key in plan.restore:
        n = plan.q_keys[key]
        entry = plan.quarantine[n]
        data = reader.quarantine_bytes(n)
        # The user takes the record back as it is: checksums are recomputed over what it holds
        # now, and its notes keep why it was quarantined (verify --deep still decodes it).
        rec = Record.from_meta(_kept_fields(entry), data, plan.meta.label_schema)
        rec.checksum = checksum(data)
        rec.notes = list(rec.notes) + [f"restored from quarantine as it was; quarantined for: {entry['reason']}"]
        plan.live.append(((entry["index"], key, True), Planned(rec)))
        report.actions.append({"key": key, "index": entry["index"], "damage": entry["reason"],
                               "action": "restored", "detail": "put back from the quarantine area as it was"})
    for n, rec in plan.q_from_source.items():
        q = plan.quarantine[n]
        plan.live.append(((q["index"], q["key"], True), Planned(rec, stored=False)))
        report.actions.append({"key": q["key"], "index": q["index"], "damage": q["reason"],
                               "action": "from-source",
                               "detail": f"quarantined record rebuilt from {plan.src.src.path(q['key'])}"})


def _note_store_actions(plan: RepairPlan, report: RepairReport) -> None:
    """The store-level actions: index or metadata rebuilt; what is lost with the metadata."""
    if report.store_problems or plan.provisional:
        report.actions.append({"key": None, "index": None, "damage": "; ".join(report.store_problems),
                               "action": "metadata-rebuilt" if plan.provisional else "index-rebuilt",
                               "detail": "store rewritten: index, counts and metadata recomputed"})
    if plan.provisional and plan.src is None:
        report.actions.append({"key": None, "index": None, "damage": "store metadata lost",
                               "action": "lost", "detail": (
                                   "class names, build options and the record count of the build are gone: "
                                   "records after the last one that survived cannot be found; pass --source "
                                   "(and LABELS) to rebuild them and the class names")})


def _missing_keys(src: Source, slots: list, quarantine: list) -> list:
    present = {s.key for s in slots if s.key is not None} | {q["key"] for q in quarantine}
    return [k for k in src.keys() if k not in present]


def _sorted_live(live: list, slots: list) -> list:
    """Records keep their order. When the store is in key order (as a build makes it), records
    coming back (from source, from quarantine) go where their key sorts; otherwise a record
    coming back from quarantine goes to the position it had, and rebuilt ones without a known
    position go last, in key order."""
    keys = [s.key for s in slots if s.key is not None]
    if keys == sorted(keys):
        return sorted(live, key=lambda it: it[0][1])
    known = sorted((it for it in live if it[0][0] is not None), key=lambda it: (it[0][0], not it[0][2]))
    return known + sorted((it for it in live if it[0][0] is None), key=lambda it: it[0][1])



__all__ = ["ACTIONS", "RepairJob", "RepairPlan", "plan_repair", "now"]
