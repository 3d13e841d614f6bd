"""``packer repair MANIFEST``: repair each shard store, then re-seal the manifest.

A manifest (:mod:`packer.stores.manifest`) holds no record itself: its records live in the
shard stores it lists. Repairing it means repairing every shard with its own format's repair
(:func:`packer.jobs.repair.store.repair_store`: quarantine, salvage, index and metadata rebuilds, backups, journal)
and then rewriting the manifest's entries (count, index checksum, first/last key) and its
metadata (count, manifest checksum, quarantine) atomically, so that it lists the repaired shards.

The manifest is rewritten only for a shard that now verifies: a shard that changed since the
manifest was written for another reason than a repair and still verifies is re-listed as it is
(the manifest is the user's list of stores; repair brings it in line with them), and that is
reported as a ``manifest-updated`` action naming the shard.

``--source``/``--restore`` name files or keys of one shard: they are refused on a manifest with
the shard stores listed (run repair on the shard that holds them).

Example:
    >>> rep = repair("train.packer-manifest.json")     # doctest: +SKIP
    >>> [(a["shard"], a["action"]) for a in rep.actions]  # doctest: +SKIP
    [(1, 'quarantined'), (1, 'manifest-updated')]
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from packer.core.errors import StoreError, UsageError
from packer.core.locking import output_lock
from packer.jobs.merge import merge_stats
from packer.jobs.repair.store import repair_store
from packer.jobs.reports import RepairReport
from packer.jobs.verify import verify
from packer.stores import get_store
from packer.stores.manifest import manifest_checksum, read_manifest, resolve_location, shard_entry, write_manifest

log = logging.getLogger(__name__)


def repair_manifest(location: str, source=None, labels=None, *, dry_run: bool = False, restore=(),
                    report_path=None, progress: bool = False, commit_bytes: Optional[int] = None,
                    **reader_options):
    """Repair every shard of the manifest at ``location`` and re-seal the manifest.

    Args:
        location: the manifest file.
        source, labels, restore: refused (they belong to one shard's repair).
        dry_run / report_path / progress / commit_bytes / reader_options: as for
            :func:`packer.jobs.repair.repair` (each shard's plan is written next to the shard).

    Returns:
        RepairReport of the manifest: actions of every shard with ``shard`` (its position) and
        the global ``index``; ``backup`` lists each repaired shard's backup, ``;``-separated.

    Raises:
        UsageError: ``source``/``labels``/``restore`` given (the message lists the shard stores).
        StoreError: the manifest itself cannot be read.
    """
    meta, shards = read_manifest(location)
    locs = [resolve_location(location, s["location"]) for s in shards]
    if source is not None or labels is not None or list(restore or []):
        raise UsageError(f"{location} is a manifest: --source and --restore belong to the store that holds "
                         f"the records; repair the shard stores: {', '.join(locs)}")
    report = RepairReport(location, "manifest", dry_run, True)
    offset, backups, entries, quarantine, stats = 0, [], [], [], []
    with output_lock(location, purpose="repair"):
        for j, (entry, loc) in enumerate(zip(shards, locs)):
            cls = get_store(entry["format"])
            opts = {k: v for k, v in reader_options.items() if k in cls.reader_options}
            sub = repair_store(loc, format=entry["format"], dry_run=dry_run, progress=progress,
                               commit_bytes=commit_bytes, **opts)
            for a in sub.actions:
                a = dict(a, shard=j, shard_location=loc)
                if a.get("index") is not None:
                    a["index"] = offset + int(a["index"])
                report.actions.append(a)
            report.unrepaired.extend(dict(a, shard=j) for a in sub.unrepaired)
            report.store_problems.extend(f"shard {j} ({loc}): {p}" for p in sub.store_problems)
            report.nothing_to_repair &= sub.nothing_to_repair
            if sub.backup:
                backups.append(sub.backup)
            if sub.verified is False:
                report.verified = False
            if dry_run:
                offset += int(entry["count"])
                continue
            try:
                with cls.open_reader(loc, **opts) as r:
                    new = shard_entry(location, loc, entry["format"], r, shard=entry.get("shard"))
                    quarantine.extend(dict(q, shard=j, index=offset + int(q.get("index", 0)))
                                      for q in (r.metadata.quarantine or []))
                    stats.append(r.metadata.stats)
            except StoreError as exc:   # still unreadable after its repair: listed, manifest kept
                report.unrepaired.append({"action": "lost", "shard": j, "key": None, "index": None,
                                          "damage": str(exc), "detail": "shard unreadable after repair"})
                new = dict(entry)
            if (new["count"], new["index_checksum"]) != (int(entry["count"]), entry["index_checksum"]):
                report.actions.append({"action": "manifest-updated", "shard": j, "shard_location": loc,
                                       "key": None, "index": None,
                                       "damage": "shard differs from its manifest entry",
                                       "detail": f"count {entry['count']} -> {new['count']}"})
                report.nothing_to_repair = False
            entries.append(new)
            offset += int(new["count"])
        report.records = offset
        report.quarantined = sum(1 for a in report.actions if a["action"] == "quarantined")
        if not dry_run and not report.nothing_to_repair and not report.unrepaired:
            new_meta = dataclasses.replace(meta, count=offset, index_checksum=manifest_checksum(entries),
                                           quarantine=quarantine,
                                           stats=merge_stats(stats, same_tree=all(e.get("shard") for e in entries))
                                           if stats else meta.stats)
            write_manifest(location, new_meta, entries, overwrite=True)
            report.verified = verify(location, deep=True, format="manifest", **reader_options).ok
        report.backup = ";".join(backups) or None
        report.save(report_path)
    log.info("%s: %d shard(s) repaired, %d action(s)", location, len(shards), len(report.actions))
    return report


__all__ = ["repair_manifest"]
