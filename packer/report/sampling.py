"""Seeded samples of a store: which records to look at, read in batches, and pixel statistics.

A report or ``packer info`` never reads every record of a large store: it reads a seeded
random sample (the same seed gives the same records), in sorted batches so that LMDB, HDF5
and MongoDB each read them in one round-trip per batch.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator, Optional

import numpy as np

from ..errors import RecordError, StoreError
from .images import decode_small

log = logging.getLogger(__name__)

#: Shorter side the pixel statistics are computed at. libjpeg-turbo's DCT scaling averages
#: 2x2 .. 8x8 blocks, which lowers the measured std a little; 64 px keeps that small.
PIXEL_STATS_MIN_SIDE = 64


def sample_indices(count: int, k: int, seed: int = 0) -> np.ndarray:
    """``min(k, count)`` distinct indices in ``0..count-1``, in seeded random order.

    The order is random so that any prefix is itself a random sample (thumbnails and pixel
    statistics use prefixes of the same draw).

    Example:
        >>> sample_indices(10, 3, seed=0).tolist()
        [8, 6, 5]
    """
    k = max(0, min(int(k), int(count)))
    if k == 0:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    if k * 4 >= count:
        return rng.permutation(count)[:k].astype(np.int64)
    return rng.choice(count, size=k, replace=False).astype(np.int64)


def read_sample(reader, indices, *, batch: int = 256,
                on_damaged: Optional[Callable] = None) -> Iterator:
    """Yield the records at ``indices`` (any order), batch by batch in sorted order.

    A batch that fails is retried one record at a time; each record that cannot be read
    is passed to ``on_damaged(index, key, reason)`` and skipped (the report lists it).
    """
    order = np.sort(np.asarray(indices, np.int64))
    for start in range(0, len(order), batch):
        idx = [int(i) for i in order[start:start + batch]]
        try:
            recs = reader.get_many(idx)
        except (RecordError, StoreError, IndexError):
            recs = []
            for i in idx:
                try:
                    recs.append(reader.get(i))
                except RecordError as exc:
                    if on_damaged:
                        on_damaged(i, exc.key, exc.reason)
                except (StoreError, IndexError) as exc:
                    if on_damaged:
                        on_damaged(i, None, str(exc))
        yield from recs


def pixel_stats(reader, count: int = 256, seed: int = 0, *, records=None) -> dict:
    """Per-channel mean and std of pixel values (0..1, RGB) over a seeded sample of records.

    These are the numbers ``torchvision.transforms.Normalize(mean, std)`` wants: pooled over
    all pixels, each image weighted by its full-size pixel count. Each record
    is decoded at a reduced DCT scale (shorter side >= :data:`PIXEL_STATS_MIN_SIDE`), so 256
    records take a fraction of a second. Records that fail their checksum or do not decode
    are left out and counted in ``skipped``.

    Args:
        reader: an open store reader.
        count: how many records to sample.
        seed: sample seed.
        records: records already read (then ``reader`` only supplies the encoding).

    Returns:
        ``{"mean": [r, g, b], "std": [r, g, b], "records": n, "skipped": m, "seed": seed,
        "min_side": PIXEL_STATS_MIN_SIDE}`` (mean/std None when nothing decoded).

    Example:
        >>> with open_store("train.lmdb") as s:              # doctest: +SKIP
        ...     st = pixel_stats(s, 256)
        >>> Normalize(st["mean"], st["std"])                  # doctest: +SKIP
    """
    unreadable = []
    if records is None:
        records = read_sample(reader, sample_indices(reader.metadata.count, count, seed),
                              on_damaged=lambda i, key, reason: unreadable.append(i))
    total = np.zeros(3, np.float64)
    total_sq = np.zeros(3, np.float64)
    pixels = used = skipped = 0
    for rec in records:
        if not rec.data_ok():
            skipped += 1
            continue
        try:
            img = decode_small(rec, min_side=PIXEL_STATS_MIN_SIDE, encoding=reader.encoding,
                               raw_shape=reader.raw_shape)
        except ValueError as exc:
            log.info("pixel stats: %s does not decode (%s); left out", rec.key, exc)
            skipped += 1
            continue
        flat = img.reshape(-1, 3).astype(np.float64) / 255.0
        # Weigh each image by its full-size pixel count: the statistic is the one a pass over
        # every full-resolution pixel gives, whatever scale each image was decoded at.
        weight = float(rec.width) * float(rec.height) / flat.shape[0]
        total += flat.sum(axis=0) * weight
        total_sq += np.square(flat).sum(axis=0) * weight
        pixels += flat.shape[0] * weight
        used += 1
    skipped += len(unreadable)
    out = {"records": used, "skipped": skipped, "seed": seed, "min_side": PIXEL_STATS_MIN_SIDE,
           "mean": None, "std": None}
    if pixels:
        mean = total / pixels
        std = np.sqrt(np.maximum(total_sq / pixels - mean ** 2, 0.0))
        out["mean"] = [round(float(v), 4) for v in mean]
        out["std"] = [round(float(v), 4) for v in std]
    return out
