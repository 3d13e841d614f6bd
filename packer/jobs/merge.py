"""Merge stores into one dataset: a manifest (logical) or one store (physical copy).

A logical merge reads each shard's metadata and at most two records, so it takes time in
proportion to the number of shards, not records; the result is a manifest
(:mod:`packer.stores.manifest`) that reads as one store. ``copy=True`` instead copies every
record, bytes untouched (no re-encoding), into one new store of any format, checking each
record's checksums on the way; the copy is resumable like a build, and is checked as verify
will read it (:class:`packer.stores.staging.StagedCheck`) before it is published: a copy that would
not verify is never published.

Shards must agree on label schema, class names and encoding; merge refuses otherwise and names
the shards that disagree. Shards of one sharded build (``--shard I/N``) are put in shard order;
a missing or doubled shard, or shards of another input list, are refused (``allow_partial``
accepts a subset). Stores that are not shards keep the order given.

Keys are unique across the shards of one sharded build by construction. Across other stores a
logical merge does not check it (that would read every key); ``index_of`` then returns the first
shard's record. ``--copy`` into LMDB or MongoDB refuses a duplicate key (unique key index).

Example:
    >>> merge(["a.lmdb", "b.lmdb"], "ab.packer-manifest.json")            # doctest: +SKIP
    >>> merge(["ab.packer-manifest.json"], "ab.h5", copy=True, format="hdf5")  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from packer.core.errors import RecordError, StoreError, UsageError
from packer.core.progress import progress_bar
from packer.core.records import CHECKSUM_ALGORITHM, StoreMetadata, checksum, checksum_matches, sealed_with
from packer.core.uri import redact
from packer.core.writes import writes_to
from packer.jobs.publish import is_bucket, merge_to_bucket
from packer.jobs.reports import MergeReport
from packer.stores import detect_format, get_store, open_store, output_format
from packer.stores.base import DEFAULT_COMMIT_BYTES
from packer.stores.manifest import manifest_checksum, read_manifest, resolve_location, shard_entry, write_manifest
from packer.stores.outputs import check_output
from packer.stores.staging import Stage
from packer.version import __version__

log = logging.getLogger(__name__)


@dataclass
class _Input:
    location: str
    format: str
    metadata: StoreMetadata
    entry: dict


def _expand(stores: Sequence[str], reader_options: dict, copy: bool = False) -> list[_Input]:
    """Open each input's metadata; a manifest given as input contributes its shards (a manifest
    in a bucket, which only ``copy`` takes, is one input read through the shard cache)."""
    out = []
    for loc in stores:
        loc = str(loc)
        fmt = detect_format(loc)
        if is_bucket(loc):
            if not copy:
                raise UsageError(f"{redact(loc)}: a merge without --copy writes a manifest over its inputs' "
                                 f"files, and this one is in a bucket: add --copy (its records are "
                                 f"downloaded, checked and copied into the merged store)")
        elif get_store(fmt).composite:
            _, shards = read_manifest(loc)
            out.extend(_expand([resolve_location(loc, s["location"]) for s in shards], reader_options, copy))
            continue
        opts = {k: v for k, v in reader_options.items() if k in get_store(fmt).reader_options}
        with open_store(loc, fmt, **opts) as r:
            entry = shard_entry("/", loc, fmt, r)
        out.append(_Input(loc, fmt, r.metadata, dict(entry, location=loc)))
    return out


def _check_agreement(inputs: list[_Input]) -> None:
    """UsageError naming the shards whose label schema, class names or encoding differ."""
    if not inputs:
        raise UsageError("merge needs at least one store")
    ref = inputs[0]
    for what, get in (("label schema", lambda i: i.metadata.label_schema),
                      ("class map", lambda i: list(i.metadata.class_names)),
                      ("encoding", lambda i: (i.entry.get("encoding"), i.entry.get("raw_shape")))):
        bad = [i for i in inputs if get(i) != get(ref)]
        if bad:
            names = ", ".join(f"{i.location} ({get(i)!r})" for i in bad[:10])
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise UsageError(f"cannot merge: {what} differs from {ref.location} ({get(ref)!r}): {names}{more} "
                             f"(hint: rebuild with --classes {ref.location} to pin one class map)"
                             if what == "class map" else
                             f"cannot merge: {what} differs from {ref.location} ({get(ref)!r}): {names}{more}")


def _order(inputs: list[_Input], allow_partial: bool) -> list[_Input]:
    """Shards of one sharded build in shard order (complete unless allow_partial)."""
    infos = [i.entry.get("shard") for i in inputs]
    if not all(infos):
        if any(infos):
            log.warning("merging shards and non-shard stores: keeping the order given")
        return inputs
    builds = {(s["inputs_checksum"], s["count"]) for s in infos}
    if len(builds) > 1:
        raise UsageError("cannot merge: the shards come from different sharded builds (other input lists or "
                         "shard counts): " + ", ".join(f"{i.location} (shard {s['index']}/{s['count']})"
                                                        for i, s in zip(inputs, infos)))
    by_index = {}
    for i, s in zip(inputs, infos):
        if s["index"] in by_index:
            raise UsageError(f"cannot merge: shard {s['index']}/{s['count']} given twice: "
                             f"{by_index[s['index']].location} and {i.location}")
        by_index[s["index"]] = i
    count = infos[0]["count"]
    missing = [k for k in range(count) if k not in by_index]
    if missing and not allow_partial:
        shown = ", ".join(str(k) for k in missing[:20]) + (" ..." if len(missing) > 20 else "")
        raise UsageError(f"cannot merge: {len(missing)} of {count} shards missing (shard index {shown}); "
                         f"hint: --allow-partial merges a subset")
    return [by_index[k] for k in sorted(by_index)]


_MIN_KEYS = ("width_min", "height_min")
_MAX_KEYS = ("width_max", "height_max", "boxes_max_per_image")


def merge_stats(stats: Sequence[dict], same_tree: bool = False) -> dict:
    """Combine build statistics: counts add, minima/maxima combine, count tables add per key.

    ``same_tree``: the stores are shards of one input tree, so ``ignored`` (files of the whole
    tree) is counted once, not per shard.
    """
    out: dict = {}
    for st in stats:
        for k, v in st.items():
            if isinstance(v, dict):
                d = out.setdefault(k, {})
                for kk, vv in v.items():
                    d[kk] = d.get(kk, 0) + vv
            elif k in _MIN_KEYS:
                out[k] = min(out.get(k, v), v)
            elif k in _MAX_KEYS:
                out[k] = max(out.get(k, v), v)
            elif k == "ignored" and same_tree:
                out[k] = v
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    return out


def _merged_metadata(inputs: list[_Input], fmt: str, count: int, index_checksum: str, extra: dict) -> StoreMetadata:
    ref = inputs[0].metadata
    same_tree = all(i.entry.get("shard") for i in inputs)
    build_options = {k: v for k, v in ref.build_options.items() if k != "shard"}
    build_options.update(extra)
    return StoreMetadata(format=fmt, count=count, label_schema=ref.label_schema,
                         class_names=list(ref.class_names), build_options=build_options,
                         index_checksum=index_checksum, packer_version=__version__,
                         created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         stats=merge_stats([i.metadata.stats for i in inputs], same_tree=same_tree))


@writes_to("out", what="the merge")
def merge(stores: Sequence[str], out: str, *, copy: bool = False, format: Optional[str] = None,
          overwrite: bool = False, allow_partial: bool = False, resume: bool = True,
          commit_bytes: int = DEFAULT_COMMIT_BYTES, store_options: Optional[dict] = None,
          reader_options: Optional[dict] = None, progress: bool = False,
          storage_options: Optional[dict] = None) -> MergeReport:
    """Merge ``stores`` (any formats; manifests expand to their shards) into ``out``.

    Args:
        stores: store locations, in order (shards of one sharded build are put in shard order).
        out: the manifest file to write, or with ``copy`` the store to create; a bucket manifest
            (``s3://bucket/NAME.packer-manifest.json``) gets the shards (or, with ``copy``, one
            copied shard) uploaded beside it, the manifest last (:mod:`packer.jobs.publish`).
        copy: physical merge into one store of ``format`` (default: what ``out``'s name says, as
            for :func:`packer.build`, else the first input's format).
        overwrite: replace what is at ``out``.
        allow_partial: accept a subset of a sharded build's shards.
        resume: (copy) continue an interrupted copy of the same inputs.
        commit_bytes / store_options: (copy) as for :func:`packer.build`.
        reader_options: passed to the inputs' readers (e.g. ``uri`` for MongoDB).
        progress: tqdm bar (copy).
        storage_options: fsspec options of a bucket ``out``.

    Returns:
        MergeReport.

    Raises:
        UsageError: disagreeing or doubled shards, existing ``out``; StoreError: unreadable or
        damaged input (a copy checks every record's checksums and stops at a damaged one), or
        a copy that would not verify (nothing is published).
    """
    t0 = time.perf_counter()
    out = str(out)
    if is_bucket(out):
        return merge_to_bucket(stores, out, overwrite=overwrite, storage_options=storage_options, run_merge=merge,
                               copy=copy, format=format, allow_partial=allow_partial, resume=resume,
                               commit_bytes=commit_bytes, store_options=store_options,
                               reader_options=reader_options, progress=progress)
    reader_options = dict(reader_options or {})
    expanded = _expand(stores, reader_options, copy)
    # What the merge reads: the stores named and every shard of a manifest among them.
    read = [("store", str(s)) for s in stores] + [("shard", i.location) for i in expanded]
    inputs = _order(expanded, allow_partial)
    _check_agreement(inputs)
    count = sum(int(i.entry["count"]) for i in inputs)
    if not copy:
        if format is not None and not get_store(format).composite:
            raise UsageError(f"--format {format} needs --copy (a logical merge writes a manifest)")
        entries = [dict(i.entry, location=_rel(out, i.location)) for i in inputs]
        meta = _merged_metadata(inputs, "manifest", count, manifest_checksum(entries),
                                {"merged_from": len(entries)})
        check_output(out, inputs=read, overwrite=overwrite, fmt="manifest")
        write_manifest(out, meta, entries, overwrite=overwrite)
        log.info("%s: manifest over %d shards, %d records", out, len(entries), count)
        return MergeReport(out, "manifest", len(entries), count, False, time.perf_counter() - t0)
    # as a build infers it from the output's name; a name that says nothing: the first input's
    fmt = output_format(out, format, default=inputs[0].format)
    if get_store(fmt).composite:
        raise UsageError("--copy needs a store format to copy into (e.g. --format lmdb)")
    if inputs[0].entry.get("encoding", "jpeg") != "jpeg":
        raise UsageError("cannot --copy stores of decoded pixels; merge them logically (without --copy)")
    return _copy(inputs, out, fmt, count, overwrite=overwrite, resume=resume, commit_bytes=commit_bytes,
                 store_options=dict(store_options or {}), reader_options=reader_options,
                 progress=progress, t0=t0, read=read)


def _rel(out: str, location: str) -> str:
    from packer.stores.manifest import relative_location
    return relative_location(out, location)


def _copy(inputs, out, fmt, count, *, overwrite, resume, commit_bytes, store_options, reader_options,
          progress, t0, read) -> MergeReport:
    """``merge --copy``: every input's records, checked, staged into one new store and published."""
    store_cls = get_store(fmt)
    connection = {k: v for k, v in store_options.items() if k in store_cls.connection_options}
    check_output(out, inputs=read, overwrite=overwrite, fmt=fmt, connection=connection)
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"merge": [[i.entry["count"], i.entry["index_checksum"]] for i in inputs],
                         "format": fmt, "options": {k: v for k, v in store_options.items()
                                                    if k not in connection}}, sort_keys=True).encode())
    # Inputs all of one checksum algorithm (e.g. BLAKE2b stores built before XXH3) keep it; a mix
    # is re-sealed under the current one (each record checked under its own first).
    algorithms = {i.metadata.checksum_algorithm for i in inputs}
    algorithm = algorithms.pop() if len(algorithms) == 1 else CHECKSUM_ALGORITHM
    bar = progress_bar(count, 0, progress, "copying")
    try:
        with Stage(store_cls, out, h.hexdigest(), label_schema=inputs[0].metadata.label_schema,
                   algorithm=algorithm, purpose="merge --copy", connection=connection,
                   writer_options=dict(store_options, commit_bytes=commit_bytes), resume=resume,
                   bar=bar) as stage:
            done = 0
            for inp in inputs:
                _copy_input(stage, inp, done, reader_options, algorithm)
                done += int(inp.entry["count"])
            n, index_sum = stage.seal(expected=count)
            quarantine = _quarantines(inputs, reader_options, algorithm)
            meta = dataclasses.replace(_merged_metadata(inputs, fmt, n, index_sum,
                                       {"merged_from": len(inputs), "store_options": {
                                           k: v for k, v in store_options.items() if k not in connection}}),
                                       checksum_algorithm=algorithm, quarantine=[q for q, _ in quarantine])
            stage.publish(meta, overwrite=overwrite,
                          quarantine=[(j, data) for j, (_, data) in enumerate(quarantine)])
    finally:
        bar.close()
    return MergeReport(out, fmt, len(inputs), n, True, time.perf_counter() - t0, stage.resumed_from)


def _copy_input(stage: Stage, inp: _Input, first: int, reader_options: dict, algorithm: str) -> None:
    """Stage the records of one input (its global positions start at ``first``) from the
    stage's resume point on, after checking it is still what was listed."""
    n = int(inp.entry["count"])
    if first + n <= stage.state.next_input:
        return
    opts = {k: v for k, v in reader_options.items() if k in get_store(inp.format).reader_options}
    with open_store(inp.location, inp.format, **opts) as r:
        if r.metadata.index_checksum != inp.entry["index_checksum"] or r.metadata.count != n:
            raise StoreError(f"{inp.location}: changed since it was listed (count or index checksum)")
        for start in range(max(0, stage.state.next_input - first), n, 256):
            for rec in r.get_many(range(start, min(n, start + 256))):
                if not rec.data_ok() or not rec.meta_ok():
                    raise RecordError(inp.location, rec.key, "checksum mismatch: not copying a "
                                      "damaged record (run packer verify / repair)", rec.index)
                rec = dataclasses.replace(rec, data=bytes(rec.data))
                if algorithm != r.metadata.checksum_algorithm:   # mixed inputs: one algorithm out
                    rec = sealed_with(rec, algorithm)
                stage.add(dataclasses.replace(rec, checksum_algorithm=algorithm))
                stage.advance()


def _quarantines(inputs, reader_options: dict, algorithm: str) -> list:
    """The inputs' quarantine areas, in input order: (entry, bytes), each entry's ``index`` moved
    to the merged store's positions (input offset + its own) and its ``checksum`` under
    ``algorithm``; bytes are checked against the entry's checksum first (StoreError if not)."""
    out, offset = [], 0
    for inp in inputs:
        if inp.metadata.quarantine:
            opts = {k: v for k, v in reader_options.items() if k in get_store(inp.format).reader_options}
            with open_store(inp.location, inp.format, **opts) as r:
                for j, q in enumerate(r.metadata.quarantine):
                    data = bytes(r.quarantine_bytes(j))
                    if not checksum_matches(data, q.get("checksum"), r.metadata.checksum_algorithm):
                        raise StoreError(f"{inp.location}: quarantine entry {j} ({q.get('key')!r}): bytes do "
                                         f"not match their checksum")
                    out.append((dict(q, index=offset + int(q.get("index", 0)),
                                     checksum=checksum(data, algorithm)), data))
        offset += int(inp.entry["count"])
    return out
