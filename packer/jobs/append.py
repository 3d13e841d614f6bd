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
is checked as verify will read it (:class:`packer.stores.staging.StagedCheck`) before it is staged,
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
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packer.core.errors import RecordError, SourceError, StoreError, UsageError
from packer.core.progress import progress_bar
from packer.core.records import CHECKSUM_ALGORITHM, StoreMetadata, sealed_with
from packer.core.writes import writes_to
from packer.jobs.merge import merge_stats
from packer.jobs.options import BuildOptions
from packer.jobs.pack import pack
from packer.jobs.publish import append_to_bucket, is_bucket
from packer.jobs.reports import BuildReport, default_report_path, write_build_report
from packer.jobs.steps import add_stats, check_images, fingerprint
from packer.jobs.verify import verify
from packer.sources.classes import apply_class_map
from packer.sources.folders import Sources, collect_sources
from packer.stores import detect_format, get_store, open_store, output_format
from packer.stores.manifest import ManifestReader, manifest_checksum, shard_entry, shard_suffix, write_manifest
from packer.stores.outputs import check_output
from packer.stores.staging import Stage
from packer.version import __version__

log = logging.getLogger(__name__)

#: Inputs read and checked per round (old records and new images together).
CHUNK = 256


@dataclass
class AppendPlan:
    """What an append will write: old record ``i`` (or its replacement), then the fresh inputs."""

    location: str
    format: str
    old: StoreMetadata
    sources: Sources
    present: dict          # key -> old index, of the keys already in the store
    fresh: list            # input positions of the new keys
    steps: list            # ("old", index) | ("new", input position), in the new version's order
    fingerprint: str
    options: BuildOptions
    report_path: Path


@writes_to("store", what="the append")
def append(store, images, labels=None, *, replace: bool = False, reader_options: Optional[dict] = None,
           options: Optional[BuildOptions] = None, storage_options: Optional[dict] = None,
           **settings) -> BuildReport:
    """Add the images under ``images`` (with ``labels``) to the published ``store``.

    Args:
        store: a published store (LMDB, HDF5, MongoDB), or a manifest (the new images become a
            new shard), also in a bucket (``s3://.../NAME.packer-manifest.json``: downloaded,
            appended, the new shard uploaded and the manifest written last; see
            :mod:`packer.jobs.publish`; ``storage_options`` for its fsspec options).
        images / labels: as for :func:`packer.build`.
        replace: replace records whose key is already in the store (else refused).
        reader_options: the store's reader options (e.g. ``uri``).
        options / settings: :class:`~packer.jobs.options.BuildOptions` (``quality``, ``exif``,
            ``workers`` (default 1 here), ``on_corrupt``, ``resume``, ``allow_unlabeled``,
            ``no_labels``, ``commit_bytes``, ``report_path``, ``progress``).

    Returns:
        :class:`packer.jobs.reports.BuildReport` of the new version (``records`` = new total).

    Raises:
        UsageError: keys already present (listed), label schema mismatch, a manifest.
        SourceError: a class not in the store's class map (named), label problems.
        StoreError: the new version would not verify (names the key and why); nothing published.
    """
    if options is None:
        settings.setdefault("workers", 1)
    options, unknown = BuildOptions.split_kwargs(settings, options)
    if unknown:
        raise TypeError(f"append() got unexpected keyword argument(s) {sorted(unknown)}")
    location = str(store)
    reader_options = dict(reader_options or {})
    if is_bucket(location):
        return append_to_bucket(location, images, labels, run_append=append, options=options,
                                reader_options=reader_options, storage_options=storage_options, replace=replace)
    # The store is replaced by its new version: it must not be, hold or lie inside the new inputs.
    check_output(location, inputs=[("images", images), ("labels", labels)], overwrite=True,
                 connection={k: v for k, v in reader_options.items() if k == "uri"})
    fmt = detect_format(location)
    if get_store(fmt).composite:
        if replace:
            raise UsageError(f"{location}: --replace is not supported on a manifest (append to the shard "
                             f"holding the key, or rebuild that shard and merge again)")
        return _append_shard(location, images, labels, reader_options=reader_options, options=options)
    plan = _plan(location, fmt, images, labels, replace, reader_options, options)
    store_cls = get_store(fmt)
    conn = {k: v for k, v in reader_options.items() if k in store_cls.connection_options}
    store_options = dict(plan.old.build_options.get("store_options") or {})
    bar = progress_bar(len(plan.steps), 0, options.progress, "appending")
    try:
        with Stage(store_cls, location, plan.fingerprint, label_schema=plan.old.label_schema,
                   algorithm=plan.old.checksum_algorithm, purpose="append", connection=conn,
                   writer_options=dict(store_options, commit_bytes=options.commit_bytes, **conn),
                   resume=options.resume, bar=bar) as stage, \
                open_store(location, fmt, **reader_options) as reader:
            converted, notes, stopped = _stage_all(plan, stage, reader)
            publish = (not (stage.state.rejects or plan.sources.unreadable) or options.on_corrupt == "skip") \
                and not stopped
            if publish:
                _publish(plan, stage, reader)
            else:
                stage.writer.flush()
    finally:
        bar.close()
    state = stage.state
    report = BuildReport(location=location, format=fmt, published=publish, records=state.next_index,
                         inputs=len(plan.sources.keys), rejected=list(plan.sources.unreadable) + list(state.rejects),
                         converted=converted, notes=notes, ignored=list(plan.sources.ignored),
                         resumed_from=stage.resumed_from, report_path=str(plan.report_path),
                         label_schema=plan.old.label_schema)
    write_build_report(plan.report_path, report, {"append": True, "replaced": sorted(plan.present),
                                                  "stopped_early": stopped})
    return report


def _plan(location: str, fmt: str, images, labels, replace: bool, reader_options: dict,
          options: BuildOptions) -> AppendPlan:
    """Read the store's metadata and the new inputs; decide the new version's order.

    Raises:
        UsageError: a pixel store, another label schema; SourceError: keys already present.
    """
    with open_store(location, fmt, **reader_options) as reader:
        old = reader.metadata
        if reader.encoding != "jpeg":
            raise UsageError(f"{location}: stores decoded pixels; append works on stores of JPEG bytes "
                             f"(rebuild, or build the new images separately and merge)")
        sources = collect_sources(images, labels, allow_unlabeled=options.allow_unlabeled,
                                  no_labels=options.no_labels)
        if sources.label_schema != old.label_schema:
            raise UsageError(f"{location}: holds {old.label_schema!r} labels, the new images have "
                             f"{sources.label_schema!r} labels")
        if old.class_names:
            sources = apply_class_map(sources, list(old.class_names), f"the class map of {location}")
        present = {}
        for key in sources.keys:
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
    steps = [("new", replaced_at[i]) if i in replaced_at else ("old", i) for i in range(old.count)]
    steps += [("new", p) for p in fresh]
    content = {"quality": options.quality, "exif": options.exif,
               "store_options": dict(old.build_options.get("store_options") or {}),
               "append_to": old.index_checksum, "replace": bool(replace)}
    # Appended images follow the store's own --max-size, as the build's did.
    if old.build_options.get("max_size") is not None:
        content["max_size"] = int(old.build_options["max_size"])
    report_path = Path(options.report_path) if options.report_path else default_report_path(location)
    return AppendPlan(location, fmt, old, sources, present, fresh, steps, fingerprint(fmt, sources, content),
                      options, report_path)


def _stage_all(plan: AppendPlan, stage: Stage, reader) -> tuple[list, list, bool]:
    """Stage the new version from the resume point on, a chunk at a time: old records copied
    after their checksums are checked, new images checked on workers. Returns ``(converted,
    notes, stopped)``."""
    converted, notes = [], []
    for start in range(stage.state.next_input, len(plan.steps), CHUNK):
        if _stage_chunk(plan, stage, reader, plan.steps[start:start + CHUNK], converted, notes):
            return converted, notes, True
    return converted, notes, False


def _stage_chunk(plan: AppendPlan, stage: Stage, reader, chunk: list, converted: list, notes: list) -> bool:
    """Stage one chunk of steps; True when ``on_corrupt="stop"`` stopped at a damaged input."""
    old, sources, opts = plan.old, plan.sources, plan.options
    old_idx = [i for kind, i in chunk if kind == "old"]
    olds = dict(zip(old_idx, reader.get_many(old_idx)))
    max_size = old.build_options.get("max_size")
    tasks = [(p, str(sources.path(sources.keys[p])), sources.keys[p], opts.quality, opts.exif,
              None if max_size is None else int(max_size), opts.max_pixels)
             for kind, p in chunk if kind == "new"]
    workers = max(1, int(opts.workers or 1))
    checked = {p: (rec, why) for p, rec, why in check_images(tasks, workers, workers * 16)}
    for kind, i in chunk:
        if kind == "old":
            rec = olds[i]
            if not rec.data_ok() or not rec.meta_ok():
                raise RecordError(plan.location, rec.key, "checksum mismatch: not copying a damaged "
                                  "record into the new version (run packer verify / repair)", i)
            rec = dataclasses.replace(rec, data=bytes(rec.data), checksum_algorithm=old.checksum_algorithm)
        else:
            rec, why = checked[i]
            key = sources.keys[i]
            if rec is None:
                stage.reject(key, why)
                log.warning("%s: %s", sources.path(key), why)
                stage.advance()
                if opts.on_corrupt == "stop":
                    return True
                continue
            rec = dataclasses.replace(rec, label=sources.labels[i])
            if old.checksum_algorithm != CHECKSUM_ALGORITHM:   # the store keeps its algorithm
                rec = sealed_with(rec, old.checksum_algorithm, raw=Path(sources.path(key)).read_bytes())
            if rec.converted:
                converted.append({"path": key, "converted": rec.converted})
            notes.extend({"path": key, "note": n} for n in rec.notes)
        rec = stage.add(rec)
        add_stats(stage.state.stats, rec, old.label_schema)
        stage.advance()
    return False


def _publish(plan: AppendPlan, stage: Stage, reader) -> None:
    """Seal the new version and publish it over the old one (which keeps its quarantine)."""
    old, sources, state = plan.old, plan.sources, stage.state
    n, index_sum = stage.seal(expected=state.next_index)
    # Records an earlier repair quarantined stay in the quarantine area, bytes and all.
    quarantine = list(old.quarantine or [])
    old_stats = old.stats or {}
    stats = dict(state.stats, inputs=old_stats.get("inputs", old.count) + len(sources.keys),
                 rejected=old_stats.get("rejected", 0) + len(state.rejects),
                 ignored=old_stats.get("ignored", 0) + len(sources.ignored))
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    history = list(old.build_options.get("appended", []))
    history.append({"images": str(sources.root), "labels": sources.label_source, "added": len(plan.fresh),
                    "replaced": len(plan.present), "rejected": len(state.rejects), "at": now})
    meta = StoreMetadata(format=plan.format, count=n, label_schema=old.label_schema,
                         class_names=list(old.class_names), label_info=dict(old.label_info or {}),
                         build_options=dict(old.build_options, appended=history),
                         index_checksum=index_sum, packer_version=__version__,
                         checksum_algorithm=old.checksum_algorithm, quarantine=quarantine,
                         history=list(old.history or []), created=now, stats=stats)
    items = [(q, reader.quarantine_bytes(q)) for q in range(len(quarantine))]
    stage.publish(meta, overwrite=True, quarantine=items,
                  before_publish=reader.close)   # let go of the old version before it is replaced


def _append_shard(location, images, labels, *, reader_options: dict, options: BuildOptions) -> BuildReport:
    """Append to a manifest in time proportional to the new images: build them as one new shard
    (class map pinned to the manifest's) and publish a manifest listing it, atomically."""
    import hashlib
    import os

    reader = ManifestReader(location, shard_options=reader_options)
    try:
        old, shards = reader.metadata, list(reader.shards)
        sources = collect_sources(images, labels, allow_unlabeled=options.allow_unlabeled,
                                  no_labels=options.no_labels)
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
                             f"append-{len(shards):05d}-{tag}{shard_suffix(fmt)}")
    os.makedirs(os.path.dirname(shard_loc), exist_ok=True)
    rep = pack(images, labels, shard_loc, output_format(shard_loc, fmt),
               options.replace(classes=location if old.class_names else None))
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
