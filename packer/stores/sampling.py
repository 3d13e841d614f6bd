"""Seeded samples of a store: which records to look at, read in batches, and pixel statistics.

A report or ``packer info`` never reads every record of a large store: it reads a seeded
random sample (the same seed gives the same records), in sorted batches so that LMDB, HDF5
and MongoDB each read them in one round-trip per batch. Records are decoded at a reduced DCT
scale (:func:`decode_small`): a thumbnail of a 4000 px photograph costs about a 500 px decode.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator, Optional

import numpy as np

from packer.core.errors import RecordError, StoreError
from packer.core.integrity import apply_orientation, turbo_decode
from packer.core.records import Record

log = logging.getLogger(__name__)

#: Shorter side the pixel statistics are computed at. libjpeg-turbo's DCT scaling averages
#: 2x2 .. 8x8 blocks, which lowers the measured std a little; 64 px keeps that small.
PIXEL_STATS_MIN_SIDE = 64


def dct_scale(width: int, height: int, min_side: int):
    """Smallest libjpeg-turbo DCT scale (1/8, 1/4, 1/2) keeping the shorter side >= ``min_side``,
    as ``(num, den)``, or None for full size.

    The same rule as ``readers.decode.choose_scale``; not imported from there because importing
    ``readers`` imports torch (seconds), which a report or ``packer info`` does not need.

    Example:
        >>> dct_scale(500, 375, 64)
        (1, 4)
    """
    for den in (8, 4, 2):
        if min(-(-width // den), -(-height // den)) >= min_side:
            return (1, den)
    return None


def decode_small(rec: Record, *, min_side: int, encoding: str = "jpeg", raw_shape=None,
                 strict: bool = True) -> np.ndarray:
    """Decode ``rec`` to an RGB HxWx3 uint8 array whose shorter side is about ``min_side`` or more.

    JPEG records decode at the smallest libjpeg-turbo DCT scale that keeps ``min_side``; raw
    pixel records (HDF5 pixel mode) are reshaped to ``raw_shape`` and subsampled. EXIF
    orientation still to apply (``rec.orientation != 1``) is applied, as the readers do, so
    the labels line up with what training sees.

    Args:
        rec: a record read from a store.
        min_side: smallest acceptable shorter side of the result (the result may be larger).
        encoding / raw_shape: the store reader's ``encoding`` and ``raw_shape``.
        strict: decoder warnings raise (``False`` shows what a damaged JPEG still holds).

    Returns:
        HxWx3 uint8 array.

    Raises:
        ValueError: the data does not decode (cleanly, with ``strict``), or raw bytes have the
            wrong length.

    Example:
        >>> img = decode_small(store.get(0), min_side=128)   # doctest: +SKIP
    """
    if encoding == "raw":
        shape = tuple(int(v) for v in raw_shape)
        arr = np.frombuffer(rec.data, dtype=np.uint8)
        if arr.size != int(np.prod(shape)):
            raise ValueError(f"holds {arr.size} pixel bytes, expected {int(np.prod(shape))}")
        img = arr.reshape(shape)
        step = max(1, min(shape[0], shape[1]) // max(1, min_side))
        img = img[::step, ::step]
    else:
        sf = dct_scale(int(rec.width), int(rec.height), int(min_side))
        img = turbo_decode(rec.data, pixel_format="rgb", scaling_factor=sf, strict=strict)
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    if rec.orientation != 1:
        img = apply_orientation(img, int(rec.orientation))
    return np.ascontiguousarray(img)


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
