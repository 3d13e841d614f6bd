"""PyTorch Datasets over any packer store.

``StoreDataset`` opens its store lazily in the process that reads (DataLoader workers under
fork or spawn each open their own handle; nothing opened in the parent crosses a fork), checks
each record's checksum, decodes with libjpeg-turbo (optionally at reduced scale) and returns
``(image, label)``:

* image: ``uint8`` tensor, ``CHW`` (default) or ``HWC``;
* label: ``int`` class id (``-1`` unlabeled / no labels), a ``float32`` ``(N, 5)`` tensor of
  YOLO rows ``class cx cy w h`` (use :func:`readers.collate_boxes` for batches), or, for
  ``"objects"`` stores (COCO, VOC, YOLO-seg, masks), a torchvision-style target dict
  (:func:`readers.targets.decode_target`: ``BoundingBoxes`` XYXY pixels, ``labels``, ``Mask``...).
* with ``return_metadata=True``, the record's per-sample metadata dict comes last.

A damaged record raises :class:`packer.core.errors.RecordError` naming the store and key. Skipping
is an explicit option (``on_error="skip"``): skipped keys are logged and counted.

The Dataset records the build id of the store it opened (``build_id``); every reader it opens
later (in a DataLoader worker, after a fork, after a close) must read that same store version.
A store rebuilt in place (``--overwrite``, append, repair...) since raises
:class:`packer.core.errors.StoreError` ("the store was replaced since this Dataset was created"),
never a mix of two datasets in one epoch.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from packer.core.errors import DependencyError, RecordError, UsageError
from packer.core.integrity import apply_orientation
from packer.core.records import Record
from packer.core.remote import is_url as remote_is_url
from packer.core.uri import redact
from packer.stores import detect_format, get_store, open_store

from .decode import check_decoder, choose_scale, decode_jpeg, parse_scale
from .raw import remote_options

log = logging.getLogger(__name__)
_SKIP_COUNT_LOCK = threading.Lock()  # one per process: datasets are pickled into workers, locks are not


class StoreDataset(Dataset):
    """Dataset over a packer store of any format (LMDB, HDF5, MongoDB, ...).

    Args:
        location: store path or ``mongodb://host/db/collection``.
        format: store format (default: detected from ``location``).
        layout: ``"CHW"`` or ``"HWC"``.
        channels: 3 (RGB, gray images expanded) or 1 (gray, colour images converted).
        scale: decode at 1/2, 1/4 or 1/8 size in the DCT domain (``"1/2"``, ``0.25``, ``(1, 8)``).
        min_size: instead of ``scale``: per image, the smallest such scale that keeps the
            shorter side >= ``min_size``.
        decoder: ``"turbojpeg"`` (default) or ``"opencv"`` (only when you ask for it).
        check: verify each record's checksum before decoding (on by default).
        on_error: ``"raise"`` (default) or ``"skip"``: a bad record gives ``None`` from
            ``__getitem__`` and is left out of ``__getitems__`` batches; it is logged with its
            key and counted in ``skipped`` (per process). Use :func:`collate_skipping`.
        transform: applied to the image tensor.
        transforms: detection / segmentation hook, called as ``transforms(image, target)`` with
            ``image`` a ``tv_tensors.Image`` (CHW) and ``target`` a dict: ``boxes`` as
            ``tv_tensors.BoundingBoxes`` (XYXY pixels, so torchvision.transforms.v2 crops and
            flips move them), ``labels`` int64, ``key``, and for ``"objects"`` stores
            ``masks`` (``tv_tensors.Mask``) and ``polygons`` as ``tv_tensors.KeyPoints`` rings
            (moved too, with torchvision's key-point conventions: a horizontal flip maps x to
            W - 1 - x); it returns ``(image, target)`` (plus the metadata dict with
            ``return_metadata``). A
            class-label store gets ``{"labels": tensor(class_id), "key": key}``. Batch with
            :func:`collate_detection`. Needs layout ``"CHW"``.
        return_key: return ``(image, label, key)``.
        return_metadata: append the record's per-sample metadata dict (extra CSV columns, COCO
            image id...) to each sample.
        instance_masks: ``"objects"`` stores: add ``masks`` (N, H, W), one per object, from its
            polygon or RLE (see :func:`readers.targets.decode_target`).
        reader_options: passed to the backend (e.g. ``{"uri": ...}`` for MongoDB).
        cache_dir, cache_limit, storage_options: for a manifest in a bucket
            (``s3://bucket/train.packer-manifest.json``): the node-local shard cache (default
            ``PACKER_CACHE_DIR`` or ``~/.cache/packer/remote``), its size limit in bytes (``"20G"``
            works too; default unbounded) and fsspec options. Shards are downloaded whole into the
            cache, once per node, checked, evicted by next use in the sampler's order
            (docs/object-storage.md).

    Example:
        >>> ds = StoreDataset("train.lmdb", min_size=256, transform=Resize((256, 256)))  # doctest: +SKIP
        >>> loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=8,
        ...                                      collate_fn=collate_boxes)  # doctest: +SKIP
    """

    def __init__(self, location, *, format: Optional[str] = None, layout: str = "CHW",
                 channels: int = 3, scale=None, min_size: Optional[int] = None,
                 decoder: str = "turbojpeg", check: bool = True, on_error: str = "raise",
                 transform: Optional[Callable] = None, return_key: bool = False,
                 apply_exif: bool = True, reader_options: Optional[dict] = None,
                 return_metadata: bool = False, instance_masks: bool = False,
                 transforms: Optional[Callable] = None, cache_dir=None, cache_limit=None,
                 storage_options: Optional[dict] = None):
        if layout not in ("CHW", "HWC"):
            raise UsageError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
        if channels not in (1, 3):
            raise UsageError(f"channels must be 1 or 3, got {channels!r}")
        if on_error not in ("raise", "skip"):
            raise UsageError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if scale is not None and min_size is not None:
            raise UsageError("give scale or min_size, not both")
        if transforms is not None and (transform is not None or layout != "CHW"):
            raise UsageError("transforms= (image, target) needs layout='CHW' and no transform=")
        self.transforms = transforms
        self.location = str(location)
        self.reader_options = remote_options(reader_options, cache_dir, cache_limit, storage_options)
        self.format = format or detect_format(self.location)
        self.layout, self.channels, self.decoder = layout, channels, decoder
        self.scale = parse_scale(scale)
        self.min_size = min_size
        self.check, self.on_error, self.transform = check, on_error, transform
        self.return_key, self.apply_exif = return_key, apply_exif
        self.return_metadata, self.instance_masks = return_metadata, instance_masks
        self.skipped = 0
        check_decoder(decoder)
        # Read what we need from the store, then close it: no handle may cross a fork.
        with open_store(self.location, self.format, **self.reader_options) as reader:
            self.metadata = reader.metadata
            #: Identity of the store version opened here; every later reader must match it.
            self.build_id = reader.build_id
            self.encoding, self.raw_shape = reader.encoding, reader.raw_shape
            #: [0, end_0, end_1, ..., len]: global index ranges of the store's shards (one range
            #: for a plain store, one per shard for a manifest), for shard-local sampling.
            self.shard_boundaries = list(reader.shard_boundaries)
        if self.encoding == "raw" and (self.scale is not None or self.min_size is not None):
            raise UsageError(f"{self.location}: stores pre-decoded pixels; scale/min_size do not apply")
        self._reader = None
        self._pid = None

    # -- lazy, per-process reader ----------------------------------------------------------
    @property
    def reader(self):
        if self._reader is not None and self._pid == os.getpid() and getattr(self._reader, "closed", False):
            self._reader = None  # closed by `with ds.reader:` or reader.close(): open a new one
        if self._reader is None or self._pid != os.getpid():
            if self._reader is not None:
                # Inherited through fork: the handle is the parent's; let the backend release
                # only what is safe, then open our own.
                self._reader.discard_after_fork()
            self._reader = None
            reader = open_store(self.location, self.format, **self.reader_options)
            reader.expect_build(self.build_id, since="this Dataset was created", hint="make a new Dataset")
            self._reader, self._pid = reader, os.getpid()
        return self._reader

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_pid"] = None
        return state

    def close(self) -> None:
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing useful to report
            pass

    def plan_shards(self, order: Sequence[int], *, epoch: int = 0) -> None:
        """Hand the order in which shards will be read (manifest shard ids) to the shard cache of
        a store in a bucket, for every process of this rank on this node (the DataLoader's
        workers included); :class:`readers.DistributedSampler` calls it each epoch. A no-op for
        a local store."""
        if not get_store(self.format).composite or not remote_is_url(self.location):
            return
        from packer.stores.cache import cache_root, write_plan
        write_plan(cache_root(self.reader_options.get("cache_dir"), self.location), order, epoch=epoch)

    # -- torchvision ImageFolder API -------------------------------------------------------
    @property
    def classes(self) -> list:
        """Class names, indexed by class id (``[]`` for a store without names)."""
        return list(self.metadata.class_names)

    @property
    def class_to_idx(self) -> dict:
        """``{class name: class id}``, as ImageFolder."""
        return {name: i for i, name in enumerate(self.metadata.class_names)}

    @property
    def targets(self) -> list:
        """Every record's label in index order, read from record metadata only (no image bytes):
        ``int`` class ids (``-1`` unlabeled) or, for box stores, ``(N, 5)`` arrays. Cached.

        Example:
            >>> weights = 1.0 / np.bincount(ds.targets)[ds.targets]               # doctest: +SKIP
            >>> sampler = torch.utils.data.WeightedRandomSampler(weights, len(ds))  # doctest: +SKIP
        """
        if getattr(self, "_targets", None) is None:
            self._targets = self.reader.read_labels()
        return self._targets

    def index_of(self, key: str) -> int:
        """Index of the record with ``key`` (its path relative to the input folder).

        Raises:
            KeyError: no record has that key.
        """
        return int(self.reader.index_of(key))

    def get_key(self, key: str):
        """The sample (as ``ds[i]``) of the record with ``key``."""
        return self[self.index_of(key)]

    def __repr__(self) -> str:
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}",
                 f"    Root location: {redact(self.location)}", f"    Format: {self.format}"]
        if self.transform is not None:
            lines.append(f"    Transform: {self.transform!r}")
        if self.transforms is not None:
            lines.append(f"    Transforms: {self.transforms!r}")
        return "\n".join(lines)

    # -- sampling ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.metadata.count

    def __getitem__(self, index: int):
        batch = self._read([int(index)])
        return batch[0] if batch else None

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A whole batch from one storage round-trip (DataLoader calls this when batching).

        With ``on_error="skip"`` bad samples are left out, so a batch can be shorter.
        """
        return [s for s in self._read([int(i) for i in indices]) if s is not None]

    def _read(self, indices: list) -> list:
        skipped_before = self.skipped
        try:
            # Decoding inside map_records lets LMDB hand out zero-copy views of the map.
            return self.reader.map_records(indices, self._sample_or_skip)
        except RecordError as exc:
            if self.on_error == "raise":
                raise
            if len(indices) == 1:
                return [self._bad(exc)]
            self.skipped = skipped_before  # the batch is read again one by one below
            out = []
            for i in indices:  # isolate the unreadable record(s), keep the rest
                out.extend(self._read([i]))
            return out

    def _sample_or_skip(self, rec: Record):
        try:
            return self._sample(rec)
        except RecordError as exc:
            return self._bad(exc)

    def _bad(self, exc: RecordError):
        if self.on_error == "raise":
            raise exc
        with _SKIP_COUNT_LOCK:  # BatchLoader's read and decode threads may both skip records
            self.skipped += 1
        log.warning("skipping bad record (%d skipped in this process): %s", self.skipped, exc)
        return None

    def _sample(self, rec: Record):
        if self.check and not rec.data_ok():
            raise RecordError(self.location, rec.key, "checksum mismatch: stored bytes are damaged", rec.index)
        if self.check and not rec.meta_ok():
            raise RecordError(self.location, rec.key, "record checksum mismatch: label or record fields are "
                              "damaged", rec.index)
        img = self._decode(rec)
        if self.apply_exif and rec.orientation != 1:
            img = apply_orientation(img, rec.orientation)
        t = torch.from_numpy(img)
        if self.layout == "CHW":
            t = t.permute(2, 0, 1)
        if self.transform is not None:
            t = self.transform(t)
        label = rec.label
        if self.apply_exif and rec.orientation != 1 and isinstance(label, dict):
            from .targets import turned_label
            label = turned_label(label, rec.orientation, rec.width, rec.height)
        if self.transforms is not None:
            sample = self._with_target(t, rec, label)
            return sample + (dict(rec.metadata),) if self.return_metadata else sample
        label = _label_tensor(label, self.metadata.label_schema, img.shape[0], img.shape[1], self.instance_masks)
        sample = (t, label, rec.key) if self.return_key else (t, label)
        return sample + (dict(rec.metadata),) if self.return_metadata else sample

    def _with_target(self, image: torch.Tensor, rec: Record, label):
        from .targets import import_tv_tensors

        tv_tensors = import_tv_tensors("StoreDataset(transforms=...) targets")

        height, width = image.shape[-2:]
        target = {"key": rec.key}
        if self.metadata.label_schema == "objects":  # already BoundingBoxes / Mask (readers.targets)
            target.update(_label_tensor(label, "objects", height, width, self.instance_masks))
            if "polygons" in target:   # as KeyPoints, so v2 transforms move them with the image
                target["polygons"] = [[tv_tensors.KeyPoints(r, canvas_size=(height, width)) for r in rings]
                                      for rings in target["polygons"]]
        elif self.metadata.label_schema == "boxes":
            rows = torch.from_numpy(rec.label) if isinstance(rec.label, np.ndarray) else torch.zeros((0, 5))
            cx, cy, bw, bh = (rows[:, 1] * width, rows[:, 2] * height, rows[:, 3] * width,
                              rows[:, 4] * height)
            xyxy = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], dim=1)
            target["boxes"] = tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(height, width))
            target["labels"] = rows[:, 0].to(torch.int64)
        else:
            target["labels"] = torch.tensor(-1 if rec.label is None else int(rec.label))
        image, target = self.transforms(tv_tensors.Image(image), target)
        return image, target

    def _decode(self, rec: Record) -> np.ndarray:
        if self.encoding == "raw":
            arr = np.frombuffer(rec.data, dtype=np.uint8).copy()
            try:
                arr = arr.reshape(self.raw_shape)
            except ValueError:
                raise RecordError(self.location, rec.key, f"holds {arr.size} pixel bytes, expected shape "
                                  f"{self.raw_shape}", rec.index) from None
            return arr if self.channels == 3 else _to_gray(arr)
        scale = self.scale if self.min_size is None else choose_scale(rec.width, rec.height, self.min_size)
        try:
            return decode_jpeg(rec.data, channels=self.channels, scale=scale, decoder=self.decoder)
        except DependencyError:
            raise
        except ValueError as exc:
            raise RecordError(self.location, rec.key, f"JPEG does not decode: {exc}", rec.index) from exc


def _to_gray(rgb: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[:, :, None]


def _label_tensor(label, schema: str, height: int = 0, width: int = 0, instance_masks: bool = False):
    if schema == "objects":
        from .targets import decode_target
        return decode_target(label, height, width, instance_masks=instance_masks)
    if isinstance(label, np.ndarray):
        return torch.from_numpy(label)
    if schema == "boxes":  # an image kept with --allow-unlabeled: no boxes to train on
        return torch.zeros((0, 5), dtype=torch.float32)
    return -1 if label is None else int(label)


class LMDBDataset(StoreDataset):
    """:class:`StoreDataset` over an LMDB store."""

    def __init__(self, location, **kwargs):
        super().__init__(location, format="lmdb", **kwargs)


class HDF5Dataset(StoreDataset):
    """:class:`StoreDataset` over an HDF5 store."""

    def __init__(self, location, **kwargs):
        super().__init__(location, format="hdf5", **kwargs)


class MongoDataset(StoreDataset):
    """:class:`StoreDataset` over a MongoDB store (``mongodb://host/db/collection``)."""

    def __init__(self, location, **kwargs):
        super().__init__(location, format="mongo", **kwargs)


def collate_list(batch):
    """Keep the batch as a list of samples (images of different sizes)."""
    return list(batch)


def collate_boxes(batch):
    """Collate ``(image, boxes)`` samples: images stacked (same size required), boxes as one
    ``(M, 6)`` tensor ``[batch_index, class, cx, cy, w, h]`` (the YOLO convention)."""
    batch = [b for b in batch if b is not None]
    shapes = {tuple(b[0].shape) for b in batch}
    if len(shapes) > 1:
        raise UsageError(f"collate_boxes stacks images of one size, got {len(shapes)} sizes "
                         f"({', '.join('x'.join(map(str, s)) for s in sorted(shapes)[:3])}...): "
                         f"give the dataset transform=readers.Resize((H, W)), or batch lists "
                         f"with collate_detection")
    images = torch.stack([b[0] for b in batch])
    rows = [torch.cat([torch.full((len(b[1]), 1), float(i)), b[1]], dim=1) for i, b in enumerate(batch)]
    boxes = torch.cat(rows) if rows else torch.zeros((0, 6))
    rest = [list(x) for x in zip(*[b[2:] for b in batch])]
    return (images, boxes, *rest)


def collate_detection(batch):
    """Collate detection / segmentation samples of different image sizes and box counts:
    ``(images, targets)`` as two tuples (torchvision's detection models take lists), skipping
    ``None`` (``on_error="skip"``). ``default_collate`` cannot stack such samples."""
    batch = [b for b in batch if b is not None]
    if not batch:
        return (), ()
    return tuple(zip(*batch))


def collate_skipping(batch):
    """default_collate after dropping ``None`` (samples skipped with ``on_error="skip"``)."""
    from torch.utils.data import default_collate

    return default_collate([b for b in batch if b is not None])
