"""``packer convert``: any store to any other format, bytes as they are.

Records are copied without decoding or re-encoding: bytes, labels, checksums, keys, order, the
quarantine area, class names, notes, build metadata and history all carry over. Each record
is checked on arrival (its checksums recomputed: bytes and fields); the target is staged and
published atomically by the target backend's writer, exactly as a build, so a killed convert
resumes where it stopped when run again. What was staged is checked as verify will read it
(:class:`packer.stores.staging.StagedCheck`) before it is published: a target that would not verify is
never published.

HDF5 pixel-mode stores hold decoded pixels, not JPEGs: they convert only to HDF5 pixel mode of
the same size (any other target would need an encode, which convert never does).

Example:
    >>> rep = convert("train.lmdb", "train.h5", format="hdf5")   # doctest: +SKIP
    >>> rep.records                                              # doctest: +SKIP
    1000
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from typing import Optional

from packer.core.errors import RecordError, StoreError, UsageError
from packer.core.locking import output_lock
from packer.core.progress import progress_bar
from packer.core.records import checksum, checksum_matches
from packer.core.uri import redact
from packer.core.writes import writes_to
from packer.jobs.publish import convert_to_bucket, is_bucket
from packer.jobs.reports import ConvertReport
from packer.stores import detect_format, get_store, open_store, output_format
from packer.stores.iterate import iter_records
from packer.stores.outputs import check_output
from packer.stores.staging import Planned, write_store
from packer.version import __version__

log = logging.getLogger(__name__)


@writes_to("dst", what="the convert")
def convert(src, dst, format: Optional[str] = None, *, src_format: Optional[str] = None, overwrite: bool = False,
            resume: bool = True, store_options: Optional[dict] = None, src_options: Optional[dict] = None,
            commit_bytes: Optional[int] = None, progress: bool = False,
            storage_options: Optional[dict] = None) -> ConvertReport:
    """Copy the store ``src`` into a new store ``dst`` of ``format``.

    Args:
        src: the store to read (any format; it must verify: repair it first otherwise).
        dst: where to publish the new store; a bucket manifest
            (``s3://bucket/NAME.packer-manifest.json``) is staged here as one shard of ``format``
            (``lmdb``/``hdf5``; ``manifest``: LMDB) and uploaded (:mod:`packer.jobs.publish`).
        format: the target format (a name from :func:`packer.available_formats`); default:
            from ``dst`` as :func:`packer.build` infers it (:func:`packer.stores.output_format`).
        src_format: the source's format (detected when None).
        overwrite: replace an existing store at ``dst``.
        resume: continue a killed convert of the same source into the same target.
        store_options: target writer options (e.g. ``uri`` for MongoDB); content options of the
            source (HDF5 ``pixels``) carry over by themselves.
        src_options: source reader options (e.g. ``uri``).
        commit_bytes: write-batch size.
        progress: tqdm progress bar.
        storage_options: fsspec options of a bucket ``dst``.

    Returns:
        ConvertReport.

    Raises:
        UsageError: ``dst`` exists, or the target cannot hold the source's records as they are.
        RecordError: a source record fails its checksums (nothing is published).
        StoreError: the target would not verify (names the key and why); nothing is published.
    """

    src, dst = str(src), str(dst)
    if is_bucket(dst):
        return convert_to_bucket(src, dst, format, overwrite=overwrite, storage_options=storage_options,
                                 run_convert=convert, report_cls=ConvertReport, src_format=src_format, resume=resume,
                                 store_options=store_options, src_options=src_options,
                                 commit_bytes=commit_bytes, progress=progress)
    src_format = src_format or detect_format(src)
    target = get_store(output_format(dst, format))
    if target.composite:
        raise UsageError(f"{dst}: convert copies records into one store; a manifest lists stores "
                         f"(hint: packer merge {src} --out {dst} writes one over existing stores)")
    store_options = dict(store_options or {})
    conn = {k: v for k, v in store_options.items() if k in target.connection_options}
    check_output(dst, inputs=[("source store", src)], overwrite=overwrite, fmt=target.name, connection=conn)
    with output_lock(dst, target, purpose="convert", **conn) as held, \
            open_store(src, src_format, **dict(src_options or {})) as reader:
        meta = reader.metadata
        writer_options = {**_content_options(reader, target, store_options, src), **store_options}
        fingerprint = checksum(json.dumps({"src": src, "index": meta.index_checksum, "count": meta.count,
                                           "format": target.name, "options": writer_options},
                                          sort_keys=True, default=str).encode())
        quarantine = _checked_quarantine(reader, src)
        new_meta = _converted_metadata(meta, target, writer_options, src, src_format)
        bar = progress_bar(meta.count, 0, progress, "converting")
        try:
            published, resumed = write_store(
                target, dst, fingerprint, _checked_records(reader, src, src_format), meta.count, new_meta,
                writer_options=writer_options, quarantine=quarantine, resume=resume, overwrite=overwrite,
                commit_bytes=commit_bytes, bar=bar, held=held,
                # a manifest's is over its shard list; its records are checked one by one and
                # each shard against its entry
                expect_index_checksum=None if get_store(src_format).composite else meta.index_checksum)
        finally:
            bar.close()
    return ConvertReport(src, src_format, dst, target.name, published.count, len(quarantine),
                         resumed, published.index_checksum)


def _content_options(reader, target, store_options: dict, src: str) -> dict:
    """The source's content options that carry over to the target (HDF5 pixel mode).

    Raises:
        UsageError: the target cannot hold the source's records as they are.
    """
    content = dict((reader.metadata.build_options or {}).get("store_options") or {})
    if reader.encoding == "raw":
        if not target.can_hold_pixels:
            raise UsageError(f"{src}: holds decoded pixels (HDF5 pixel mode); {target.name} stores "
                             f"hold JPEG bytes, and convert never re-encodes (build {target.name} from "
                             f"the images instead)")
        return {"pixels": "x".join(str(v) for v in reader.raw_shape[:2]),
                **{k: v for k, v in content.items() if k == "compression"}}
    if store_options.get("pixels"):
        raise UsageError(f"{src}: holds JPEG bytes; pixel mode would decode and resize them, and "
                         f"convert never re-encodes (build with -O pixels=HxW from the images)")
    return {}   # backend tuning of the source (map_size, chunk_bytes) is not the target's


def _checked_records(reader, src: str, src_format: str):
    """The source's records in index order, each checked against its checksums.

    Raises:
        RecordError: a damaged record, or (manifests) a key listed by two shards.
    """
    # A logical merge does not check keys across its shards (that reads every key); one
    # store must hold each key once, whatever the target backend enforces.
    seen = set() if get_store(src_format).composite else None
    for rec in iter_records(reader, check=False):
        if seen is not None:
            if rec.key in seen:
                raise RecordError(src, rec.key, "key listed twice by the manifest's shards; one "
                                                "store holds each key once", rec.index)
            seen.add(rec.key)
        rec.data = bytes(rec.data)
        if not rec.data_ok():
            raise RecordError(src, rec.key, "checksum mismatch: the stored bytes changed since "
                                            "the build (hint: packer repair first)", rec.index)
        if not rec.meta_ok():
            raise RecordError(src, rec.key, "record checksum mismatch (hint: packer repair first)", rec.index)
        yield Planned(rec)


def _checked_quarantine(reader, src: str) -> list:
    """The source's quarantined ``(n, bytes)``, each checked against its checksum."""
    meta = reader.metadata
    quarantine = [(n, reader.quarantine_bytes(n)) for n in range(len(meta.quarantine or []))]
    for (n, data), q in zip(quarantine, meta.quarantine or []):
        if not checksum_matches(data, q.get("checksum"), meta.checksum_algorithm):
            raise StoreError(f"{src}: quarantine entry {n} ({q.get('key')!r}): bytes do not match "
                             f"their checksum")
    return quarantine


def _converted_metadata(meta, target, writer_options: dict, src: str, src_format: str):
    """The source's metadata for the target: its format, store options and history."""
    build_options = dict(meta.build_options or {})
    build_options["store_options"] = {k: v for k, v in writer_options.items()
                                      if k not in target.connection_options}
    history = list(meta.history or []) + [{
        "action": "convert", "from": redact(src), "from_format": src_format,
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "packer_version": __version__}]
    return dataclasses.replace(meta, format=target.name, build_options=build_options, history=history)


__all__ = ["convert", "ConvertReport"]
