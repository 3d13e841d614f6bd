"""Repair of one store (LMDB, HDF5, MongoDB): find, decide, rewrite, publish.

:func:`repair_store` is what :func:`packer.jobs.repair.repair` runs for a store (a manifest is
repaired shard by shard by :mod:`packer.jobs.repair_manifest`, through this). The steps:

* **find** (:func:`scan`): what ``verify --deep`` finds, per record, through the salvage reader;
* **decide** (:func:`plan_repair`): from source, salvaged, quarantined, restored or lost, per
  record; the plan is the report of a dry run;
* **rewrite** (:func:`write_repaired`): stage the live records through
  :func:`packer.stores.staging.write_store`, move the old store aside as a backup (a journal
  makes a killed repair finish on rerun), publish atomically.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Optional

from packer.core.errors import ImageError, RecordError, SourceError, StoreError, UnreachableError, UsageError
from packer.core.integrity import process_image, turbo_decode
from packer.core.locking import output_lock
from packer.core.progress import progress_bar
from packer.core.records import IndexHasher, Record, StoreMetadata, checksum, checksum_matches
from packer.jobs.reports import RepairReport
from packer.jobs.salvage import infer_label_schema, metadata_is_provisional, release
from packer.jobs.steps import add_stats
from packer.jobs.verify import deep_check, verify
from packer.stores import detect_format, get_store
from packer.stores.outputs import check_output
from packer.stores.staging import Planned, fault_point, write_store
from packer.version import __version__

log = logging.getLogger(__name__)

ACTIONS = ("from-source", "salvaged", "quarantined", "restored", "index-rebuilt", "metadata-rebuilt",
           "lost")
_EOI = b"\xff\xd9"


# ---------------------------------------------------------------------------------------
# Helpers shared with verify/convert
# ---------------------------------------------------------------------------------------
def salvage_jpeg(data: bytes, channels: int) -> Optional[tuple[bytes, str]]:
    """Complete a JPEG that lost its EOI marker; None unless the result decodes cleanly.

    Only a JPEG whose scan is whole but whose end marker is gone can be completed: a scan cut
    short does not decode cleanly under the strict decode and is never padded.
    """
    data = bytes(data)
    if not data.startswith(b"\xff\xd8") or data.endswith(_EOI):
        return None
    # A lost tail often reads back as zeros (a store's fixed-size slot, a sparse file): try
    # without them first.
    stripped = data.rstrip(b"\0")
    for body in dict.fromkeys([stripped, data]):
        fixed = (body[:-1] if body.endswith(b"\xff") else body) + _EOI
        try:
            turbo_decode(fixed, pixel_format="gray" if channels == 1 else "rgb", strict=True)
        except ValueError:
            continue
        zeros = f", {len(data) - len(body)} zero byte(s) dropped" if len(body) < len(data) else ""
        return fixed, f"salvaged: EOI marker lost (restored{zeros}); the scan is whole and decodes cleanly"
    return None




# ---------------------------------------------------------------------------------------
# Scan: what verify --deep finds, per record, with the record when it is readable
# ---------------------------------------------------------------------------------------
@dataclass
class _Slot:
    index: int
    record: Optional[Record]       # as read (None when unreadable)
    damage: Optional[str]          # None when the record is good
    key: Optional[str] = None


def scan(reader, bar=None) -> list[_Slot]:
    """Every record as read, with what ``verify --deep`` finds wrong with it (None when good)."""
    slots = []
    for i in range(reader.metadata.count):
        try:
            rec = reader.get(i)
        except RecordError as exc:
            key = None if exc.key.startswith("#") else exc.key
            slots.append(_Slot(i, None, exc.reason, key))
        except UnreachableError:
            raise   # a server that went away has not lost the record
        except (StoreError, IndexError) as exc:
            slots.append(_Slot(i, None, f"unreadable: {exc}"))
        else:
            rec.data = bytes(rec.data)
            if not rec.meta_ok():
                damage = "record checksum mismatch: the label or other record fields changed since the build"
            elif not rec.data_ok():
                damage = "checksum mismatch: the stored bytes changed since the build"
            else:
                damage = deep_check(rec, reader.encoding, reader.raw_shape)
            slots.append(_Slot(i, rec, damage, rec.key))
        if bar is not None:
            bar.update(1)
    return slots


# ---------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------
class _Source:
    """The original files, and their labels mapped to the store's class ids.

    Labels: a record whose stored fields still verify keeps them (label, per-sample metadata,
    notes) and takes only its bytes from the original file; the source's labels go only into
    records whose own fields are damaged or lost. Either way the source must give labels of the
    store's label schema, or it is refused here, before anything is written (a record rebuilt
    with labels of another schema cannot be read back: the issue of ``--source IMAGES`` alone,
    class folders, on a store of YOLO boxes).

    Raises:
        UsageError: the source's label schema is not the store's (the message says what to pass).
        SourceError: the source folders or labels are unreadable.
    """

    def __init__(self, images, labels, meta: StoreMetadata, location: str = "STORE"):
        from packer.sources.folders import collect_sources
        opts = meta.build_options or {}
        self.built_from = opts.get("labels")
        # IMAGES alone on a store whose labels came from elsewhere (YOLO boxes, COCO...): the
        # files give bytes only. Records whose stored labels verify keep them; only a record that
        # needs its labels from the source asks for LABELS (see record()).
        self.bytes_only = (labels is None and meta.label_schema != "none"
                           and self.built_from != "class-per-subfolder")
        try:
            # A store of no labels is rebuilt from its images alone (IMAGES with no LABELS).
            self.src = collect_sources(images, labels, allow_unlabeled=True,
                                       no_labels=labels is None and (meta.label_schema == "none" or self.bytes_only))
        except SourceError as exc:
            raise SourceError(f"--source: {exc}", exc.problems) from exc
        from packer.stores.mongo import redact
        self.location = redact(location)   # messages never show a connection string's password
        self.images = images
        if self.src.label_schema != meta.label_schema and not self.bytes_only:
            raise UsageError(self._schema_mismatch(images, labels, meta))
        self.labels = dict(zip(self.src.keys, self.src.labels))
        # Per-sample metadata the build stored with the label (extra CSV columns, a YOLO file's text).
        self.metadata = dict(zip(self.src.keys, self.src.metadata))
        names = list(meta.class_names or [])
        self.remap = None
        if names and self.src.class_names and names != list(self.src.class_names):
            ids = {n: i for i, n in enumerate(names)}
            self.remap = {i: ids.get(n) for i, n in enumerate(self.src.class_names)}
        self.quality = int(opts.get("quality", 95))
        self.exif = opts.get("exif", "apply")
        # A store built with --max-size holds downscaled images: a rebuilt record must be too.
        self.max_size = opts.get("max_size")

    def _schema_mismatch(self, images, labels, meta: StoreMetadata) -> str:
        given = f"--source {images}" + (f" {labels}" if labels is not None else "")
        built = f" (built with labels from {self.built_from})" if self.built_from else ""
        if meta.label_schema == "none":
            hint = f"pass the IMAGES folder alone: packer repair {self.location} --source IMAGES"
        elif self.built_from == "class-per-subfolder":
            hint = (f"pass the IMAGES folder alone, its class folders are the store's labels: "
                    f"packer repair {self.location} --source IMAGES")
        else:
            hint = (f"pass the LABELS the store was built from{f' ({self.built_from})' if self.built_from else ''}: "
                    f"packer repair {self.location} --source IMAGES LABELS")
        return (f"{self.location}: holds {meta.label_schema!r} labels{built}, but {given} gives "
                f"{self.src.label_schema!r} labels ({self.src.label_source}); records rebuilt with them would "
                f"not verify, so nothing was changed. Hint: {hint}")

    def keys(self) -> list:
        return list(self.src.keys)

    def label(self, key):
        lab = self.labels[key]
        if self.remap is not None and isinstance(lab, int) and lab >= 0:
            mapped = self.remap.get(lab)
            if mapped is None:
                raise UsageError(f"--source: class {self.src.class_names[lab]!r} of {key} is not a class of the "
                                 f"store; nothing was changed (hint: pass the LABELS the store was built from"
                                 f"{f' ({self.built_from})' if self.built_from else ''}: "
                                 f"packer repair {self.location} --source IMAGES LABELS)")
            return mapped
        return lab

    def record(self, key: str, expect: Optional[Record], keep_fields: bool = False) -> tuple[Optional[Record], str]:
        """(record from the original file, why not).

        Args:
            key: the record's key.
            expect: the damaged record as read (or as its quarantine entry kept it), None when
                unreadable: the original file must be the one it was built from.
            keep_fields: ``expect``'s fields verify (only its bytes are bad): the record keeps
                its label, per-sample metadata and notes, and takes its bytes (and what
                describes them) from the file. Otherwise the label comes from the source.
        """
        if key not in self.labels:
            return None, f"{key} is not in --source"
        if self.bytes_only and (expect is None or not keep_fields):
            raise UsageError(
                f"{self.location}: {key} needs its labels from the source (its stored labels are "
                f"{'lost' if expect is None else 'damaged'}), and --source {self.images} gives images "
                f"only; nothing was changed. Hint: pass the LABELS the store was built from"
                f"{f' ({self.built_from})' if self.built_from else ''}: "
                f"packer repair {self.location} --source IMAGES LABELS")
        path = self.src.path(key)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            return None, f"{path}: cannot read: {exc.strerror or exc}"
        try:
            rec = process_image(key, raw, quality=self.quality, exif=self.exif, max_size=self.max_size)
        except ImageError as exc:
            return None, f"{path}: {exc.reason}"
        same_bytes = False
        if expect is not None:
            same_file = checksum_matches(raw, expect.source_checksum)   # either algorithm (old stores)
            same_bytes = checksum_matches(rec.data, expect.checksum)
            if not (same_file or same_bytes):
                return None, (f"{path}: differs from the file the record was built from "
                              f"(checksum {checksum(raw)}, record says {expect.source_checksum})")
        if expect is None or not keep_fields:
            return dataclasses.replace(rec, label=self.label(key), metadata=dict(self.metadata.get(key) or {})), ""
        if same_bytes:
            # The file gives back the very bytes the record held: the record is the one built.
            return dataclasses.replace(expect, data=rec.data, meta_checksum=""), ""
        # Same original file, encoded differently now (another libjpeg): the bytes and what
        # describes them come from the file, the label and what came with it from the record.
        notes = list(rec.notes) + [n for n in expect.notes if n not in rec.notes]
        return dataclasses.replace(rec, label=expect.label, metadata=dict(expect.metadata), notes=notes), ""


# ---------------------------------------------------------------------------------------
# repair
# ---------------------------------------------------------------------------------------
def _kept_fields(entry: dict) -> dict:
    """The record fields a quarantine entry kept (all of them: per-sample metadata, coding and
    subsampling included), for :meth:`Record.from_meta`."""
    wanted = Record.META_FIELDS + Record.OPTIONAL_META_FIELDS + ("metadata",)
    return {k: v for k, v in entry["record"].items() if k in wanted}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _source_inputs(source, labels) -> list:
    return [("--source images", source), ("--source labels", labels)]


def _check_backup(backup: str, location: str, source, labels, conn: dict) -> None:
    """The backup location must be free or hold the old store an interrupted repair moved there
    (a packer store), and lie outside the store and the source.

    Raises:
        UsageError: naming the backup location and what is there.
    """
    check_output(backup, inputs=[("store", location)] + _source_inputs(source, labels), overwrite=True,
                 connection=conn)


def _connection(store_cls, options: dict) -> dict:
    return {k: v for k, v in options.items() if k in store_cls.connection_options}


def _opens(store_cls, location: str, options: dict) -> bool:
    try:
        store_cls.open_reader(location, **options).close()
        return True
    except (StoreError, UsageError):
        return False


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


def repair_store(location, source=None, labels=None, *, format: Optional[str] = None, dry_run: bool = False,
                 restore=(), report_path=None, progress: bool = False, commit_bytes: Optional[int] = None,
                 **reader_options) -> RepairReport:
    """Repair the store at ``location``: a store, not a manifest. The arguments, the result and
    the errors are :func:`packer.jobs.repair.repair`'s."""
    location = str(location)
    fmt = detect_repair_format(location, format)
    store_cls = get_store(fmt)
    conn = _connection(store_cls, reader_options)
    restore = list(restore or [])
    # The store is rewritten in place (its backup next to it): never inside, over or around the
    # files it is rebuilt from.
    check_output(location, inputs=_source_inputs(source, labels), kind="place")
    with (contextlib.nullcontext() if dry_run else output_lock(location, store_cls, purpose="repair", **conn)) as held:
        journal = None if dry_run else store_cls.read_journal(location, **conn)
        if journal and journal.get("backup"):
            _check_backup(journal["backup"], location, source, labels, conn)
        origin, resume, overwrite = location, True, False
        if journal and journal.get("phase") == "swap":
            if _opens(store_cls, location, reader_options):
                log.info("%s: an earlier repair was published; finishing it", location)
                store_cls.write_journal(location, None, **conn)
                journal = None
            else:
                # Killed between moving the old store aside and publishing the new one: the
                # old store is complete in the backup; rebuild from it.
                store_cls.move_store(location, journal["backup"], **conn)
                origin, resume, overwrite = journal["backup"], False, True
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
    src: Optional[_Source]
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


def _repair(job: RepairJob, dry_run: bool) -> RepairReport:
    """Find, decide, and (unless ``dry_run``) rewrite; returns the report."""
    report = RepairReport(job.location, job.fmt, dry_run, False)
    plan = plan_repair(job, report)
    if plan is not None and not dry_run:
        write_repaired(job, plan, report)
    return report


def _open_source(job: RepairJob, meta: StoreMetadata, provisional: bool) -> Optional[_Source]:
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
    return _Source(job.source, job.labels, meta, job.location)


def plan_repair(job: RepairJob, report: RepairReport) -> Optional[RepairPlan]:
    """Find what is damaged and decide what to do with each record (the report's actions);
    None when there is nothing to repair.

    Raises:
        UsageError: ``restore`` names a key that is not quarantined; the source cannot give
            what a record needs (see :class:`_Source`).
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


def _quarantined_from_source(src: Optional[_Source], quarantine: list, restore: list,
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
            entry = {"key": s.record.key, "index": s.index, "reason": s.damage, "at": _now(),
                     "record": s.record.meta_dict(), "checksum": checksum(s.record.data, meta.checksum_algorithm),
                     "size": len(s.record.data)}
            entry["record"]["stored_meta_checksum"] = s.record.meta_checksum
            plan.new_q.append((entry, bytes(s.record.data)))
            report.actions.append(dict(act, action="quarantined",
                                       detail="moved to the quarantine area with its bytes"))
        else:
            report.actions.append(dict(act, action="lost", detail=(
                act.get("source") or "record unreadable: nothing left to keep; pass --source to rebuild it")))


def _salvaged(plan: RepairPlan, s: _Slot, reader, act: dict, report: RepairReport) -> bool:
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


def _repaired_metadata(plan: RepairPlan, store_cls, report: RepairReport) -> StoreMetadata:
    """The metadata of the result: its quarantine, a history entry, the record count."""
    meta = plan.meta
    q_meta = [q for _, q in plan.kept_q] + [entry for entry, _ in plan.new_q]
    history = list(meta.history or []) + [{
        "action": "repair", "at": _now(), "packer_version": __version__,
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
    conn = _connection(store_cls, job.reader_options)
    _check_backup(backup, location, job.source, job.labels, conn)
    store_cls.write_journal(location, {"phase": "staging", "backup": backup, "format": store_cls.name,
                                       "started": _now()}, **conn)
    swapping = []   # set once the old store starts moving aside

    def move_aside():
        swapping.append(True)
        store_cls.write_journal(location, {"phase": "swap", "backup": backup, "format": store_cls.name,
                                           "started": _now()}, **conn)
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
            _drop_journal(store_cls, location, conn)
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


def _drop_journal(store_cls, location: str, conn: dict) -> None:
    """Remove the journal of a repair that stopped before touching the store, without masking
    the error that stopped it (a server gone is logged)."""
    try:
        store_cls.write_journal(location, None, **conn)
    except (StoreError, OSError) as exc:
        log.warning("%s: could not remove the repair journal: %s", location, exc)


def _source_matches_survivors(src: _Source, good: list) -> bool:
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


def _missing_keys(src: _Source, slots: list, quarantine: list) -> list:
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


__all__ = ["repair_store", "RepairReport", "salvage_jpeg", "scan", "plan_repair", "write_repaired", "ACTIONS"]
