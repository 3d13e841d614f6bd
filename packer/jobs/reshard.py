"""Splitting a staged one-shard manifest into shards of about a target size, before it is
published to a bucket.

A build or convert on one machine writes one shard; a store read from a bucket is downloaded a
shard at a time into a node-local cache, so one 100 GB shard would need a 100 GB cache and
would give the first batch only after the whole download. :func:`split_shards` rewrites the
staged shard as ``ceil(bytes / shard_bytes)`` shards of equal record counts, in record order,
each written through the same :func:`packer.stores.staging.write_store` as convert (every
record's checksums checked on the way, each shard published atomically with its own statistics
and index checksum), then the manifest over them, then removes the one shard. The records, their
order, keys and checksums, and the manifest's metadata (count, statistics, classes) are those
of the one shard.

Example:
    >>> split_shards("stage/train.packer-manifest.json", 128 * 2**20)   # doctest: +SKIP
    8
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil

from packer.core.errors import RecordError
from packer.core.records import checksum
from packer.jobs.steps import add_stats
from packer.stores import get_store, open_store
from packer.stores.manifest import (
    manifest_checksum,
    read_manifest,
    resolve_location,
    shard_entry,
    shard_suffix,
    write_manifest,
)
from packer.stores.staging import Planned, write_store

log = logging.getLogger(__name__)

#: Shard size of a store published to a bucket, in bytes of its files (``-O shard_bytes=...``).
DEFAULT_SHARD_BYTES = 128 * 2**20
_BATCH = 256


def parse_bytes(value) -> int:
    """``128M``, ``1G``, ``65536`` -> bytes (K, M, G, T are powers of 1024).

    Raises:
        ValueError: not a positive size.
    """
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(text[-1:], 1)
    number = float(text[:-1] if text[-1:] in "KMGT" else text)
    if not number > 0:
        raise ValueError(f"shard size must be positive, got {value!r}")
    return int(number * mult)


def _bytes_of(path: str) -> int:
    if os.path.isdir(path):
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file() and e.name != "lock.mdb")
    return os.path.getsize(path)


def split_shards(manifest: str, shard_bytes: int) -> int:
    """Rewrite the one-shard manifest at ``manifest`` as shards of about ``shard_bytes`` each.

    Returns:
        The number of shards the manifest lists afterwards (a manifest of several shards, a shard
        already small enough, or one holding quarantined inputs is left as it is).

    Raises:
        RecordError: a record of the shard no longer matches its checksums (nothing is replaced).
    """
    meta, shards = read_manifest(manifest)
    if len(shards) != 1:
        return len(shards)
    entry = shards[0]
    src, fmt = resolve_location(manifest, entry["location"]), entry["format"]
    n = math.ceil(_bytes_of(src) / shard_bytes)
    if n <= 1 or entry["count"] < 2:
        return 1
    with open_store(src, fmt) as reader:
        if reader.metadata.quarantine:
            log.info("%s: not split: its shard holds quarantined inputs", manifest)
            return 1
        n = min(n, reader.metadata.count)
        per = math.ceil(reader.metadata.count / n)
        folder = os.path.dirname(src)
        entries = []
        for j in range(n):
            a, b = j * per, min(reader.metadata.count, (j + 1) * per)
            if a >= b:
                break
            loc = os.path.join(folder, f"part-{j:05d}-of-{n:05d}{shard_suffix(fmt)}")
            _write_part(reader, src, fmt, loc, a, b, {"index": j, "count": n})
            with open_store(loc, fmt) as part:
                entries.append(shard_entry(manifest, loc, fmt, part, shard={"index": j, "count": n}))
    new_meta = dataclasses.replace(meta, index_checksum=manifest_checksum(entries))
    write_manifest(manifest, new_meta, entries, overwrite=True, build_id=meta.build_id)
    shutil.rmtree(src) if os.path.isdir(src) else os.remove(src)
    log.info("%s: split into %d shards of about %d bytes", manifest, len(entries), shard_bytes)
    return len(entries)


def _write_part(reader, src: str, fmt: str, loc: str, a: int, b: int, shard: dict) -> None:
    """Records ``[a, b)`` of ``reader`` as the store ``loc``, checked, with their own statistics."""
    meta = reader.metadata
    stats: dict = {}

    def planned():
        for start in range(a, b, _BATCH):
            for rec in reader.get_many(range(start, min(b, start + _BATCH))):
                rec.data = bytes(rec.data)
                if not (rec.data_ok() and rec.meta_ok()):
                    raise RecordError(src, rec.key, "checksum mismatch while splitting into shards "
                                                    "(the staged store changed; rebuild)", rec.index)
                add_stats(stats, rec, meta.label_schema)
                yield Planned(rec)

    build_options = dict(meta.build_options or {}, shard=shard)
    part_meta = dataclasses.replace(meta, count=b - a, stats=stats, build_options=build_options, quarantine=[])
    options = dict((meta.build_options or {}).get("store_options") or {})
    store = get_store(fmt)
    options = {k: v for k, v in options.items() if k in store.writer_options}   # not the manifest's
    fingerprint = checksum(f"split {src} {meta.index_checksum} {a} {b}".encode())
    write_store(store, loc, fingerprint, planned(), b - a, part_meta, writer_options=options, overwrite=True)


__all__ = ["split_shards", "parse_bytes", "DEFAULT_SHARD_BYTES"]
