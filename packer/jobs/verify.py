"""verify and info: what a store holds, and whether every record still is what was built.

``verify`` reads every record and checks its checksums (``deep``: decodes it too), lists every
problem (key, index, reason) without stopping at the first, and reads what is left of a store
whose metadata is damaged through the backend's salvage reader. A manifest is verified shard by
shard, against the counts and checksums it lists.
"""
from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import asdict
from typing import Optional

import numpy as np

from packer.core.errors import RecordError, StoreError, UnreachableError, UsageError
from packer.core.integrity import turbo_decode
from packer.core.progress import progress_bar
from packer.core.records import CHECKSUM_ALGORITHMS, IndexHasher, Record
from packer.core.uri import redact
from packer.jobs.publish import fetch_manifest, is_bucket, remote_info
from packer.jobs.reports import InfoReport, Problem, VerifyReport
from packer.stores import detect_format, get_store, open_store
from packer.stores.base import partial_location
from packer.stores.manifest import ManifestReader
from packer.stores.salvage import infer_label_schema, metadata_is_provisional, release
from packer.stores.sampling import pixel_stats

log = logging.getLogger(__name__)


def deep_check(rec: Record, encoding: str, raw_shape) -> Optional[str]:
    """Why ``rec`` fails ``verify --deep`` (its JPEG does not decode cleanly to its recorded
    size; raw pixels of the wrong length), or None."""
    if encoding == "raw":
        expected = int(np.prod(raw_shape))
        return None if len(rec.data) == expected else f"holds {len(rec.data)} pixel bytes, expected {expected}"
    try:
        img = turbo_decode(rec.data, pixel_format="gray" if rec.channels == 1 else "rgb", strict=True)
    except ValueError as exc:
        return f"does not decode cleanly: {exc}"
    if img.shape[:2] != (rec.height, rec.width):
        return f"decodes to {img.shape[1]}x{img.shape[0]}, record says {rec.width}x{rec.height}"
    return None


def require_location(location: str) -> None:
    """UsageError for a local path that names nothing (a typo, not a damaged store)."""
    if "://" in location or os.path.lexists(location) or os.path.lexists(partial_location(location)):
        return
    shown = redact(location)
    hint = f" (a server store is written mongodb://{shown})" if shown != location else ""
    raise UsageError(f"{shown}: no such file or folder{hint}")


def verify(location, *, deep: bool = False, format: Optional[str] = None, batch: int = 256,
           progress: bool = False, **reader_options) -> VerifyReport:
    """Check a store: metadata, index, every record's checksum (and with ``deep``, decode).

    Every bad record is listed (key, index, reason); nothing stops at the first problem. A
    bucket store (``s3://.../NAME.packer-manifest.json``) is downloaded once into a temporary
    folder, each file checked by size and xxh3_128 against the manifest, then verified there
    (:func:`packer.jobs.publish.verify_remote`).

    Raises:
        UsageError: ``location`` names nothing (a local path that does not exist).
        UnreachableError: the store's server cannot be reached (within one read timeout): the
            store was not checked, and is not reported damaged.

    Example:
        >>> rep = verify("train.lmdb", deep=True)     # doctest: +SKIP
        >>> rep.ok, [str(p) for p in rep.problems]     # doctest: +SKIP
        (True, [])
    """
    location = str(location)
    if is_bucket(location):   # a bucket store: downloaded once, every file checked, verified here
        return verify_remote(location, deep=deep, progress=progress, batch=batch,
                             storage_options=reader_options.pop("storage_options", None), **reader_options)
    require_location(location)
    fmt = format or detect_format(location)
    if get_store(fmt).composite:   # a dataset of shards: each shard verified, and the checksum chain
        return verify_manifest(location, deep=deep, batch=batch, progress=progress, **reader_options)
    try:
        reader = open_store(location, fmt, **reader_options)
    except UnreachableError:
        raise   # nothing was read: not a damaged store, and no second try through the salvage reader
    except StoreError as exc:
        # Store-level damage (metadata gone, file cut short): report it, and still check every
        # record that reads, through the backend's salvage reader.
        reader = _salvage_reader(location, fmt, exc, reader_options)
        if reader is None:
            return VerifyReport(location, fmt, 0, 0, deep, [Problem(str(exc))])
    with _released(reader):
        meta = reader.metadata
        problems = [Problem(p) for p in reader.check_structure()]
        n_present = len(reader)
        if n_present != meta.count:
            problems.append(Problem(f"{redact(location)}: holds {n_present} records, metadata says {meta.count}"))
        if meta.checksum_algorithm not in CHECKSUM_ALGORITHMS:
            return VerifyReport(location, fmt, meta.count, 0, deep, problems + [Problem(
                f"{redact(location)}: metadata names checksum algorithm {meta.checksum_algorithm!r}; this packer "
                f"knows {', '.join(CHECKSUM_ALGORITHMS)} (hint: upgrade packer)")])
        hasher = IndexHasher(meta.checksum_algorithm)
        checked = unreadable = 0
        bar = progress_bar(meta.count, 0, progress, "verifying")
        try:
            for start in range(0, meta.count, batch):
                idx = list(range(start, min(start + batch, meta.count)))
                recs = _read_batch(reader, idx, problems)
                for i, rec in zip(idx, recs):
                    bar.update(1)
                    if rec is None:
                        hasher.update(i, "", "missing")
                        unreadable += 1
                        continue
                    checked += 1
                    hasher.update(rec.index, rec.key, rec.checksum)
                    if not rec.data_ok():
                        problems.append(Problem("checksum mismatch: the stored bytes changed since the build",
                                                rec.key, i))
                        continue
                    if not rec.meta_ok():
                        problems.append(Problem("record checksum mismatch: the label or other record fields "
                                                "changed since the build", rec.key, i))
                        continue
                    if deep:
                        why = deep_check(rec, reader.encoding, reader.raw_shape)
                        if why:
                            problems.append(Problem(why, rec.key, i))
        finally:
            bar.close()
        if unreadable:
            # The index checksum covers every record's key and checksum; with records unreadable
            # it cannot be recomputed, and a mismatch would only repeat the problems above.
            log.info("%s: index checksum not checked: %d record(s) could not be read", redact(location), unreadable)
        elif meta.index_checksum and hasher.hexdigest() != meta.index_checksum:
            problems.append(Problem(f"{redact(location)}: index checksum mismatch (records were added, removed, "
                                    f"reordered or renamed since the build)"))
        return VerifyReport(location, fmt, meta.count, checked, deep, problems)


def _read_batch(reader, idx: list, problems: list) -> list:
    """The records at ``idx`` (None for each that cannot be read, with its problem added).

    Raises:
        UnreachableError: the server went away: what is left unread is not damaged.
    """
    try:
        return reader.get_many(idx)
    except UnreachableError:
        raise
    except (RecordError, StoreError, IndexError):
        pass
    recs = []
    for i in idx:  # find which records of the batch are bad
        try:
            recs.append(reader.get(i))
        except RecordError as exc:
            problems.append(Problem(exc.reason, exc.key, i))
            recs.append(None)
        except UnreachableError:
            raise
        except StoreError as exc:
            problems.append(Problem(str(exc), None, i))
            recs.append(None)
        except IndexError as exc:
            problems.append(Problem(f"missing: {exc}", None, i))
            recs.append(None)
    return recs


def _salvage_reader(location: str, fmt: str, exc: StoreError, reader_options: dict):
    """The backend's salvage reader after ``open_store`` failed with ``exc`` (None if none)."""
    try:
        reader = get_store(fmt).open_salvage(location, **reader_options)
    except (StoreError, UsageError) as exc2:
        log.debug("%s: salvage open failed too: %s", redact(location), exc2)
        return None
    if str(exc) not in reader.salvage_problems:
        reader.salvage_problems.insert(0, str(exc))
    if metadata_is_provisional(reader.metadata):
        infer_label_schema(reader)
    return reader


class _released:
    """``with``: close a reader and drop a salvage copy it read through."""

    def __init__(self, reader):
        self.reader = reader

    def __enter__(self):
        return self.reader

    def __exit__(self, *exc):
        release(self.reader)
        return False


def info(location, *, format: Optional[str] = None, pixel_sample: int = 256, seed: int = 0,
         **reader_options) -> InfoReport:
    """Count, size, image-size distribution, label summary and build options of a store.

    ``pixel_sample`` records (seeded by ``seed``) are decoded at reduced scale for the
    per-channel pixel mean/std in ``InfoReport.pixels`` (0 skips it). For a bucket store
    (``s3://.../NAME.packer-manifest.json``) only the manifest is read: no pixel sample.
    """
    location = str(location)
    if is_bucket(location):   # a bucket store: its manifest alone, no shard read (no pixel sample)
        return remote_info(location, storage_options=reader_options.get("storage_options"))
    require_location(location)
    fmt = format or detect_format(location)
    with open_store(location, fmt, **reader_options) as reader:
        pixels = pixel_stats(reader, pixel_sample, seed) if pixel_sample > 0 else None
        return InfoReport(location, fmt, reader.metadata.count, reader.size_bytes(),
                          asdict(reader.metadata), reader.encoding,
                          list(reader.raw_shape) if reader.raw_shape else None, pixels)


def verify_manifest(location: str, *, deep: bool = False, batch: int = 256, progress: bool = False,
                    **reader_options):
    """Verify a manifest: its own checksum, then every shard completely, and that each shard's
    count and index checksum are those the manifest lists. Problems name the shard; record
    problems carry the global index."""
    try:
        reader = ManifestReader(location, shard_options={k: v for k, v in reader_options.items()
                                                          if k != "max_open"})
    except StoreError as exc:
        return VerifyReport(location, "manifest", 0, 0, deep, [Problem(str(exc))])
    problems, checked = [], 0
    bar = progress_bar(len(reader.shards), 0, progress, "verifying shards")
    try:
        for j, entry in enumerate(reader.shards):
            loc, offset = reader.shard_location(j), reader.shard_boundaries[j]
            opts = {k: v for k, v in reader_options.items() if k in get_store(entry["format"]).reader_options}
            try:
                rep = verify(loc, deep=deep, format=entry["format"], batch=batch, **opts)
            except UsageError as exc:  # the shard's path names nothing: it is missing, not a typo of ours
                problems.append(Problem(f"shard {j} ({loc}): missing: {exc}"))
                bar.update(1)
                continue
            checked += rep.checked
            for p in rep.problems:
                problems.append(Problem(f"shard {j} ({loc}): {p.reason}", p.key,
                                        None if p.index is None else offset + p.index))
            if rep.count != int(entry["count"]):
                problems.append(Problem(f"shard {j} ({loc}): holds {rep.count} records, the manifest says "
                                        f"{entry['count']}"))
            try:
                with open_store(loc, entry["format"], **opts) as r:
                    if r.metadata.index_checksum != entry["index_checksum"]:
                        problems.append(Problem(f"shard {j} ({loc}): index checksum {r.metadata.index_checksum} "
                                                f"differs from the manifest's {entry['index_checksum']} (the "
                                                f"shard was rebuilt or replaced after the merge)"))
                    if list(r.metadata.class_names) != list(reader.metadata.class_names) or \
                            r.metadata.label_schema != reader.metadata.label_schema:
                        problems.append(Problem(f"shard {j} ({loc}): class map or label schema differs "
                                                f"from the manifest's"))
            except StoreError:
                pass   # already reported by the shard's verify
            bar.update(1)
    finally:
        bar.close()
        reader.close()
    return VerifyReport(location, "manifest", reader.metadata.count, checked, deep, problems)


def verify_remote(url: str, *, deep: bool = False, progress: bool = False, batch: int = 256,
                  storage_options: Optional[dict] = None, **reader_options) -> VerifyReport:
    """``verify`` of a bucket store: downloads every shard once into a temporary folder, checks
    each file's size and xxh3_128 against the manifest (:func:`packer.jobs.publish.fetch_manifest`),
    then verifies as a local store; problems name the objects, not the temporary copies."""
    with tempfile.TemporaryDirectory(prefix="packer-verify-") as tmp:
        try:
            local, fetched = fetch_manifest(url, tmp, storage_options=storage_options)
        except (StoreError, UsageError) as exc:
            return VerifyReport(url, "manifest", 0, 0, deep, [Problem(str(exc))])
        rep = verify_manifest(local, deep=deep, progress=progress, batch=batch, **reader_options)
        shown, base = redact(url), os.path.dirname(local) + os.sep
        for p in rep.problems:
            p.reason = p.reason.replace(local, shown).replace(base, shown.rpartition("/")[0] + "/")
    rep.location = shown
    rep.problems = [Problem(m) for m in fetched] + rep.problems
    return rep


__all__ = ["verify", "info", "verify_manifest", "verify_remote", "deep_check", "require_location"]
