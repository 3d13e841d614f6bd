"""Append new images to a published store (``packer append STORE IMAGES [LABELS]``).

Strategy: copy-on-write. A new version of the store is written in the backend's staging area
(``<store>.partial`` or the staging collection) exactly like a build: first the published
records, copied byte for byte with their checksums checked, then the new images, checked and
encoded as a build does. It is published over the old version with the backend's atomic
publish, so a reader sees the old store or the new one, never a mix (LMDB: a reader that opens
during the two renames finds no store for that instant and gets a clear error; HDF5: one
``rename(2)``; MongoDB: the metadata document is the switch, and readers opened before it refuse
the new records). The cost is a full copy of the store per append (time and, until publish,
twice the disk space); append in batches, or use a manifest (``packer merge``) to add shards
in O(1) instead.

Resumable: a killed append continues from its staging area when rerun with the same inputs.
The store's class map is used (``--classes`` semantics: a class not in it is an error naming
it), the label schema must match, and keys already present are refused unless ``replace``
(a replaced record keeps its index). Count, index checksum, statistics and build options are
recomputed for the new version, so ``verify`` passes after. Every record of the new version
is checked as verify will read it (:class:`packer.storeio.StagedCheck`) before it is staged,
and the staged index before the publish: a version that would not verify is never published,
and the old one stays as it was. On a manifest, the new shard is verified before the manifest
lists it.

Example:
    >>> append("train.lmdb", "new_images/", None)          # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
from pathlib import Path
from typing import Optional

from . import __version__
from .errors import RecordError, SourceError, StoreError, UsageError
from .integrity import DEFAULT_MAX_PIXELS
from .locking import output_lock
from .outputs import check_output
from .records import CHECKSUM_ALGORITHM, StoreMetadata, sealed_with
from .sources import collect_sources
from .storeio import StagedCheck
from .stores import detect_format, get_store, open_store
from .stores.base import DEFAULT_COMMIT_BYTES

log = logging.getLogger(__name__)


def append(store, images, labels=None, *, replace: bool = False, quality: int = 95, exif: str = "apply",
           workers: Optional[int] = 1, on_corrupt: str = "fail", resume: bool = True,
           allow_unlabeled: bool = False, no_labels: bool = False,
           commit_bytes: int = DEFAULT_COMMIT_BYTES, reader_options: Optional[dict] = None,
           report_path=None, progress: bool = False):
    """Add the images under ``images`` (with ``labels``) to the published ``store``.

    Args:
        store: a published store (LMDB, HDF5, MongoDB). Manifests: append to a shard, or build
            a new shard and ``packer merge`` it in.
        images / labels / allow_unlabeled / no_labels / quality / exif / on_corrupt / workers:
            as for :func:`packer.build`.
        replace: replace records whose key is already in the store (else refused).
        resume: continue an interrupted append of the same inputs.

    Returns:
        :class:`packer.api.BuildReport` of the new version (``records`` = new total).

    Raises:
        UsageError: keys already present (listed), label schema mismatch, a manifest.
        SourceError: a class not in the store's class map (named), label problems.
        StoreError: the new version would not verify (names the key and why); nothing published.
    """
    from .api import (BuildReport, _add_stats, _fingerprint, _ordered_results,
                      _progress_bar, _write_report, default_report_path)
    from .classes import apply_class_map

    location = str(store)
    # The store is replaced by its new version: it must not be, hold or lie inside the new inputs.
    check_output(location, inputs=[("images", images), ("labels", labels)], overwrite=True,
                 connection={k: v for k, v in (reader_options or {}).items() if k == "uri"})
    fmt = detect_format(location)
    if fmt == "manifest":
        if replace:
            raise UsageError(f"{location}: --replace is not supported on a manifest (append to the shard "
                             f"holding the key, or rebuild that shard and merge again)")
        return _append_shard(location, images, labels, quality=quality, exif=exif, workers=workers,
                             on_corrupt=on_corrupt, resume=resume, allow_unlabeled=allow_unlabeled,
                             no_labels=no_labels, commit_bytes=commit_bytes, reader_options=reader_options,
                             report_path=report_path, progress=progress)
    store_cls = get_store(fmt)
    reader_options = dict(reader_options or {})
    with open_store(location, fmt, **reader_options) as reader:
        old = reader.metadata
        if reader.encoding != "jpeg":
            raise UsageError(f"{location}: stores decoded pixels; append works on stores of JPEG bytes "
                             f"(rebuild, or build the new images separately and merge)")
        sources = collect_sources(images, labels, allow_unlabeled=allow_unlabeled, no_labels=no_labels)
        if sources.label_schema != old.label_schema:
            raise UsageError(f"{location}: holds {old.label_schema!r} labels, the new images have "
                             f"{sources.label_schema!r} labels")
        if old.class_names:
            sources = apply_class_map(sources, list(old.class_names), f"the class map of {location}")
        present = {}
        for pos, key in enumerate(sources.keys):
            try:
                present[key] = reader.index_of(key)
            except KeyError:
                pass
    if present and not replace:
        raise SourceError(f"{location}: {len(present)} key(s) are already in the store; nothing was written "
                          f"(hint: --replace replaces them)", [f"{k}: already at index {i}" for k, i in
                                                                sorted(present.items(), key=lambda kv: kv[1])])
    pos_of = {k: p for p, k in enumerate(sources.keys)}
    replaced_at = {i: pos_of[k] for k, i in present.items()}          # old index -> new input position
    fresh = [p for p, k in enumerate(sources.keys) if k not in present]
    # The combined task list: old record i (or its replacement), then the fresh inputs.
    plan = [("new", replaced_at[i]) if i in replaced_at else ("old", i) for i in range(old.count)]
    plan += [("new", p) for p in fresh]

    store_options = dict(old.build_options.get("store_options") or {})
    content = {"quality": int(quality), "exif": exif, "store_options": store_options, "append_to": old.index_checksum,
               "replace": bool(replace)}
    # Appended images follow the store's own --max-size, as the build's did.
    max_size = old.build_options.get("max_size")
    if max_size is not None:
        content["max_size"] = int(max_size)
    fingerprint = _fingerprint(fmt, sources, content)
    report_path = Path(report_path) if report_path else default_report_path(location)
    workers = max(1, int(workers or 1))
    converted, notes = [], []
    conn = {k: v for k, v in reader_options.items() if k in store_cls.connection_options}
    with output_lock(location, store_cls, purpose="append", **conn), \
            store_cls.create_writer(location, commit_bytes=commit_bytes, **store_options, **conn) as writer, \
            open_store(location, fmt, **reader_options) as reader:
        state = writer.open(fingerprint, resume=resume)
        resumed_from = state.next_input
        # Every record is checked as verify will read the new version, before the writer gets it.
        check = StagedCheck(location, old.label_schema, old.checksum_algorithm, state.next_index)
        bar = _progress_bar(len(plan), state.next_input, progress, "appending")
        stopped = False
        try:
            for start in range(state.next_input, len(plan), 256):
                chunk = plan[start:start + 256]
                olds = {i: r for i, r in zip([i for kind, i in chunk if kind == "old"],
                                             reader.get_many([i for kind, i in chunk if kind == "old"]))}
                tasks = [(p, str(sources.path(sources.keys[p])), sources.keys[p], int(quality), exif,
                          content.get("max_size"), DEFAULT_MAX_PIXELS)
                         for kind, p in chunk if kind == "new"]
                checked = {p: (rec, why) for p, rec, why in _ordered_results(tasks, workers, workers * 16)}
                for kind, i in chunk:
                    if kind == "old":
                        rec = olds[i]
                        if not rec.data_ok() or not rec.meta_ok():
                            raise RecordError(location, rec.key, "checksum mismatch: not copying a damaged "
                                              "record into the new version (run packer verify / repair)", i)
                        rec = dataclasses.replace(rec, index=state.next_index, data=bytes(rec.data),
                                                  checksum_algorithm=old.checksum_algorithm)
                    else:
                        rec, why = checked[i]
                        key = sources.keys[i]
                        if rec is None:
                            state.rejects.append({"path": key, "reason": why})
                            log.warning("%s: %s", sources.path(key), why)
                            state.next_input += 1
                            writer.checkpoint(state)
                            bar.update(1)
                            if on_corrupt == "stop":
                                stopped = True
                                break
                            continue
                        rec = dataclasses.replace(rec, index=state.next_index, label=sources.labels[i])
                        if old.checksum_algorithm != CHECKSUM_ALGORITHM:   # the store keeps its algorithm
                            rec = sealed_with(rec, old.checksum_algorithm,
                                              raw=Path(sources.path(key)).read_bytes())
                        if rec.converted:
                            converted.append({"path": key, "converted": rec.converted})
                        notes.extend({"path": key, "note": n} for n in rec.notes)
                    writer.add(check.record(rec))
                    _add_stats(state.stats, rec, old.label_schema)
                    state.next_index += 1
                    state.next_input += 1
                    writer.checkpoint(state)
                    bar.update(1)
                if stopped:
                    break
        finally:
            bar.close()
        writer.flush()
        publish = (not (state.rejects or sources.unreadable) or on_corrupt == "skip") and not stopped
        if publish:
            n, index_sum = check.seal(writer, expected=state.next_index)
            # Records an earlier repair quarantined stay in the quarantine area, bytes and all.
            quarantine = list(old.quarantine or [])
            if quarantine:
                writer.write_quarantine([(q, reader.quarantine_bytes(q)) for q in range(len(quarantine))])
            old_stats = old.stats or {}
            stats = dict(state.stats, inputs=old_stats.get("inputs", old.count) + len(sources.keys),
                         rejected=old_stats.get("rejected", 0) + len(state.rejects),
                         ignored=old_stats.get("ignored", 0) + len(sources.ignored))
            now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            history = list(old.build_options.get("appended", []))
            history.append({"images": str(sources.root), "labels": sources.label_source, "added": len(fresh),
                            "replaced": len(present), "rejected": len(state.rejects), "at": now})
            meta = StoreMetadata(format=fmt, count=n, label_schema=old.label_schema,
                                 class_names=list(old.class_names), label_info=dict(old.label_info or {}),
                                 build_options=dict(old.build_options, appended=history),
                                 index_checksum=index_sum, packer_version=__version__,
                                 checksum_algorithm=old.checksum_algorithm, quarantine=quarantine,
                                 history=list(old.history or []),
                                 created=now, stats=stats)
            reader.close()   # let go of the old version before it is replaced
            writer.publish(meta, overwrite=True)
    report = BuildReport(location=location, format=fmt, published=publish, records=state.next_index,
                         inputs=len(sources.keys), rejected=list(sources.unreadable) + list(state.rejects),
                         converted=converted,
                         notes=notes, ignored=list(sources.ignored), resumed_from=resumed_from,
                         report_path=str(report_path), label_schema=old.label_schema)
    _write_report(report_path, report, {"append": True, "replaced": sorted(present), "stopped_early": stopped})
    return report



def _append_shard(location, images, labels, *, reader_options, report_path, **build_kwargs):
    """Append to a manifest in time proportional to the new images: build them as one new shard
    (class map pinned to the manifest's) and publish a manifest listing it, atomically."""
    import hashlib
    import os

    from .api import build, verify
    from .merge import merge_stats
    from .stores.manifest import (ManifestReader, SHARD_SUFFIX, manifest_checksum, shard_entry,
                                  write_manifest)

    reader_options = dict(reader_options or {})
    reader = ManifestReader(location, shard_options=reader_options)
    try:
        old, shards = reader.metadata, list(reader.shards)
        sources = collect_sources(images, labels, allow_unlabeled=build_kwargs.get("allow_unlabeled", False),
                                  no_labels=build_kwargs.get("no_labels", False))
        if sources.label_schema != old.label_schema:
            raise UsageError(f"{location}: holds {old.label_schema!r} labels, the new images have "
                             f"{sources.label_schema!r} labels")
        present = []
        for key in sources.keys:
            try:
                present.append(f"{key}: already at index {reader.index_of(key)}")
            except KeyError:
                pass
    finally:
        reader.close()
    if present:
        raise SourceError(f"{location}: {len(present)} key(s) are already in the dataset; nothing was written",
                          present)
    fmt = shards[-1]["format"] if shards else old.build_options.get("shard_format", "lmdb")
    tag = hashlib.blake2b(f"{old.index_checksum}\0{os.path.abspath(images)}".encode(), digest_size=6).hexdigest()
    shard_loc = os.path.join(location.rstrip("/") + ".shards",
                             f"append-{len(shards):05d}-{tag}{SHARD_SUFFIX.get(fmt, '.' + fmt)}")
    os.makedirs(os.path.dirname(shard_loc), exist_ok=True)
    rep = build(images, labels, shard_loc, fmt, classes=location if old.class_names else None,
                report_path=report_path, **build_kwargs)
    if not rep.published:
        return rep
    # The manifest is what readers open: it lists the new shard only once the shard verifies
    # and holds the manifest's kind of labels. A shard that fails stays where it was built,
    # listed by nothing, for inspection.
    checked = verify(shard_loc, format=fmt)
    if not checked.ok:
        shown = "; ".join(str(p) for p in checked.problems[:5])
        more = f" and {len(checked.problems) - 5} more" if len(checked.problems) > 5 else ""
        raise StoreError(f"{location}: the new shard {shard_loc} does not verify ({shown}{more}); "
                         f"manifest not changed")
    with open_store(shard_loc, fmt) as r:
        if r.metadata.label_schema != old.label_schema or list(r.metadata.class_names) != list(old.class_names):
            raise StoreError(f"{location}: the new shard {shard_loc} holds {r.metadata.label_schema!r} labels of "
                             f"classes {list(r.metadata.class_names)}, the manifest {old.label_schema!r} labels of "
                             f"classes {list(old.class_names)}; manifest not changed")
        entry = shard_entry(location, shard_loc, fmt, r)
        new_stats = r.metadata.stats
    entries = shards + [entry]
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    history = list(old.build_options.get("appended", [])) + [
        {"images": str(sources.root), "added": entry["count"], "shard": entry["location"], "at": now}]
    meta = dataclasses.replace(old, count=old.count + entry["count"], index_checksum=manifest_checksum(entries),
                               stats=merge_stats([old.stats, new_stats]), created=now,
                               build_options=dict(old.build_options, appended=history))
    write_manifest(location, meta, entries, overwrite=True)   # the atomic switch to the new version
    return dataclasses.replace(rep, location=location, format="manifest", records=meta.count)
