"""The fast CPU training path: whole batches decoded into crops by one compiled call.

:class:`CropDataset` is a :class:`~readers.dataset.StoreDataset` whose ``__getitems__`` (what a
DataLoader calls once per batch, in its workers or in the main process) reads the batch's records,
checks their checksums, draws the crop boxes from the records' stored sizes and hands all JPEGs to
``gpu_ops.decode_jpeg_crops`` at once (see :mod:`readers.crops`). The batch comes back as one
``uint8`` tensor; :func:`collate_decoded` passes it through without a per-sample stack.

Example:
    >>> from torch.utils.data import DataLoader
    >>> from readers import CropDataset, RandomResizedCrop, collate_decoded
    >>> ds = CropDataset("train.lmdb", RandomResizedCrop(224))                     # doctest: +SKIP
    >>> loader = DataLoader(ds, batch_size=128, num_workers=8, shuffle=True,
    ...                     collate_fn=collate_decoded, pin_memory=True)           # doctest: +SKIP
    >>> images, labels = next(iter(loader))   # [128, 3, 224, 224] uint8, [128] int64  # doctest: +SKIP
"""
from __future__ import annotations

import logging
import math
import os
import threading
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from packer.core.errors import RecordError, UsageError
from packer.core.integrity import apply_orientation
from readers.crops import (
    CropSpec,
    FullDecode,
    RandomResizedCrop,
    ResizeCenterCrop,
    decode_crops,
    op_available,
    pack_bytes,
    reference_crop,
)
from readers.dataset import StoreDataset
from readers.decode import decode_jpeg
from readers.raw import RecordFacts, read_raw
from readers.shared_batches import storage_holders, to_main, worker_ring

log = logging.getLogger(__name__)

__all__ = ["CropDataset", "DecodedBatch", "OutputPool", "collate_decoded", "RandomResizedCrop", "ResizeCenterCrop",
           "FullDecode"]


class PreparedBatch(NamedTuple):
    """A batch read and checked, its boxes drawn, not decoded yet (:meth:`CropDataset.prepare_batch`)."""

    items: list          # (bytes, key, index, label, height, width, orientation) per record
    packed: Optional[tuple]  # (data, offsets [B+1]) back to back, (map, spans [B, 2]) in place, or None
    boxes: torch.Tensor
    flips: torch.Tensor
    out_size: tuple


class DecodedBatch(list):
    """What :meth:`CropDataset.__getitems__` returns: behaves as the list of ``(image, label)``
    samples (views into one batch tensor, made on access), so ``default_collate`` works; and
    carries ``images`` ``[B, ...]`` uint8, ``labels`` ``[B]`` int64 and ``keys`` for
    :func:`collate_decoded`, which returns them without copying."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, keys: list, return_key: bool):
        super().__init__()
        self.images, self.labels, self.keys, self.return_key = images, labels, keys, return_key

    def __len__(self):
        return self.images.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        sample = (self.images[i], int(self.labels[i]))
        return (*sample, self.keys[i]) if self.return_key else sample

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self):
        return len(self) > 0


def collate_decoded(batch):
    """Collate for :class:`CropDataset`: ``(images, labels)`` (``+ keys`` with ``return_key``)
    straight from the decoded batch; falls back to ``default_collate`` for plain sample lists.

    Use it as the DataLoader's ``collate_fn`` with workers: the batches then come in buffers the
    workers reuse once the main process drops them (:mod:`readers.shared_batches`); with another
    collate they are still right, in fresh shared memory per batch."""
    if isinstance(batch, DecodedBatch):
        # In a DataLoader worker a batch in one of the worker's reusable buffers travels as that
        # buffer, and the main process frees it for reuse when the batch dies there.
        out = (to_main(batch.images), batch.labels)
        return (*out, list(batch.keys)) if batch.return_key else out
    from torch.utils.data import default_collate

    return default_collate(list(batch))


class OutputPool:
    """Batch buffers of one process, handed out again once no tensor holds them any more.

    A fresh ``torch.empty`` per batch costs page faults and zeroing of every page the kernel maps
    in (at 1920x1080, 32 images = 199 MB: glibc maps it anew each time; measured ~1,500 minor
    faults and ~3.7 ms of CPU per image on top of a ~5 ms decode). FFCV reuses its buffers
    outright; here a buffer is reused only when its storage's reference count shows that nothing
    but the pool holds it: every batch handed out is a *view* (its own tensor on the storage), so
    a consumer that still holds that batch, a slice of it, a ``.numpy()`` array of it or a
    DLPack capsule keeps the buffer out of reuse. A buffer whose storage was moved to shared
    memory (sent to another process) is dropped, never reused. Not used for pinned batches (torch's
    pinned-memory allocator pools those and tracks asynchronous copies) nor in DataLoader workers
    (their batches cross processes). Holding the raw ``data_ptr()`` of a batch after dropping every
    tensor of it is not tracked: do not do that.

    Args:
        keep: at most this many buffers are kept (a training loop holds one batch while the next
            is decoded, a prefetcher a few more); extra buffers are plain allocations.
    """

    def __init__(self, keep: int = 4):
        self.keep = int(keep)
        self._bufs: list = []   # (flat uint8 tensor, its holder count when only the pool holds it)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.reused = self.allocated = 0

    def take(self, shape: tuple) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``shape``: a view of a free kept buffer, or new."""
        numel = math.prod(int(n) for n in shape)
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's buffers are the parent's
                self._bufs, self._pid = [], os.getpid()
            self._bufs = [(b, base) for b, base in self._bufs if not b.untyped_storage().is_shared()]
            for buf, base in self._bufs:
                if buf.numel() >= numel and storage_holders(buf) <= base:
                    self.reused += 1
                    return buf[:numel].view(shape)  # the view holds the storage until dropped
            self.allocated += 1
            buf = torch.empty(max(numel, 1), dtype=torch.uint8)
            if len(self._bufs) < self.keep:
                self._bufs.append((buf, storage_holders(buf)))
            return buf[:numel].view(shape)

    def __getstate__(self):
        return {"keep": self.keep}

    def __setstate__(self, state):
        self.__init__(state["keep"])


class CropDataset(StoreDataset):
    """Decode-into-crops dataset over any packer store of JPEG records with class labels.

    Args:
        location: store path or ``mongodb://...`` URL.
        crop: a :class:`~readers.crops.RandomResizedCrop` (training),
            :class:`~readers.crops.ResizeCenterCrop` (validation) or
            :class:`~readers.crops.FullDecode` (stored size; one size per batch).
        layout: ``"CHW"`` (``[B, C, H, W]``) or ``"HWC"`` (``[B, H, W, C]``).
        channels: 3 (RGB) or 1 (luma).
        pin_memory: allocate each batch in pinned memory (for reading in the main process;
            with DataLoader workers use the DataLoader's ``pin_memory=True``).
        reuse_output: in the main process (no DataLoader workers) and without ``pin_memory``,
            decode into kept batch buffers once nothing holds them any more (see
            :class:`OutputPool`); ``False`` allocates every batch anew.
        **kwargs: :class:`StoreDataset` options (``check``, ``on_error``, ``return_key``,
            ``apply_exif``, ``reader_options``, ``format``, and for a manifest in a bucket
            ``cache_dir``, ``cache_limit``, ``storage_options``).

    Records with an EXIF orientation still to apply (built with ``--exif record``) take the
    exact slow path: full decode, rotate, then the same crop and resize in torch.

    Raises:
        UsageError: the store holds raw pixels or boxes, or ``crop`` is not a crop spec.
        RecordError: (from reads) a record is damaged, naming the store and key.
    """

    def __init__(self, location, crop: CropSpec, *, layout: str = "CHW", channels: int = 3,
                 pin_memory: bool = False, reuse_output: bool = True, **kwargs):
        if not isinstance(crop, CropSpec):
            raise UsageError(f"crop must be a readers.RandomResizedCrop or readers.ResizeCenterCrop, "
                             f"got {type(crop).__name__}")
        for opt in ("scale", "min_size", "transform", "transforms"):
            if kwargs.get(opt) is not None:
                raise UsageError(f"CropDataset does not take {opt}=: the crop decides the decode")
        super().__init__(location, layout=layout, channels=channels, **kwargs)
        if self.encoding != "jpeg":
            raise UsageError(f"{self.location}: stores pre-decoded pixels; CropDataset decodes JPEG records")
        if self.metadata.label_schema == "boxes":
            raise UsageError(f"{self.location}: holds boxes; random crops would have to move them - use "
                             f"StoreDataset(transforms=...) with torchvision.transforms.v2")
        if not op_available():
            raise UsageError("CropDataset needs gpu_ops._C with decode_jpeg_crops (rebuild the extension: "
                             "FORCE_CUDA=0 python3 setup.py build_ext --inplace)")
        self.crop, self.pin_memory = crop, bool(pin_memory)
        self.output_pool: Optional[OutputPool] = OutputPool() if reuse_output else None

    #: Read batches through the kept record facts (see :meth:`_fetch_packed`).
    _FAST_READ = True

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_facts_obj", None)  # holds a map of the store file: each process keeps its own
        state.pop("_facts_pid", None)
        return state

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to a seeded crop (replayable boxes per (seed, epoch, index))."""
        if hasattr(self.crop, "set_epoch"):
            self.crop.set_epoch(epoch)

    def __getitem__(self, index: int):
        batch = self.__getitems__([int(index)])
        return batch[0] if len(batch) else None

    def __getitems__(self, indices: Sequence[int]) -> DecodedBatch:
        return self.decode_batch(self.prepare_batch(indices))

    def load_batch(self, indices: Sequence[int]):
        """``(images, labels)`` for ``indices`` with one decode call (no DataLoader needed)."""
        return collate_decoded(self.__getitems__(indices))

    # -- the batch path -----------------------------------------------------------------------
    def _take(self, rec):
        """Checks one record and copies what the batch needs out of the (maybe zero-copy) read."""
        try:
            if self.check and not rec.data_ok():
                raise RecordError(self.location, rec.key, "checksum mismatch: stored bytes are damaged",
                                  rec.index)
            if self.check and not rec.meta_ok():
                raise RecordError(self.location, rec.key, "record checksum mismatch: label or record "
                                  "fields are damaged", rec.index)
        except RecordError as exc:
            return self._bad(exc)
        return (bytes(rec.data), rec.key, rec.index, rec.label, rec.height, rec.width,
                rec.orientation if self.apply_exif else 1)

    def _fetch(self, indices: list) -> list:
        try:
            return self.reader.map_records(indices, self._take)
        except RecordError as exc:
            if self.on_error == "raise" or len(indices) == 1:
                return [self._bad(exc)]
            out = []
            for i in indices:  # isolate the unreadable record(s), keep the rest
                out.extend(self._fetch([i]))
            return out

    def _facts(self):
        """This process's kept record facts (readers.raw.RecordFacts), made on first use."""
        facts = self.__dict__.get("_facts_obj")
        if facts is None or self.__dict__.get("_facts_pid") != os.getpid():
            facts = RecordFacts(self.metadata.count, self.metadata.checksum_algorithm)
            self.__dict__.update(_facts_obj=facts, _facts_pid=os.getpid())
        return facts

    def _fetch_packed(self, indices: list):
        """``(items, (data, offsets))`` read in one go, checked, through the kept record facts;
        None where a record is damaged (the per-record path then isolates it). Each item's bytes
        are a view into ``data``.

        Records read before whose bytes lie in the store file's map are not copied at all:
        ``data`` is the map and ``offsets`` their ``[B, 2]`` spans in it (the copy into a batch
        buffer was 2-3% of the CPU of a 500x375 full decode). Others (first reads, stores
        without a map) are read into one buffer, ``offsets`` ``[B + 1]``, keeping their facts."""
        facts = self._facts()
        try:
            in_place = facts.read_in_place(indices, self.check, self.location)
            if in_place is not None:
                return self._items_in_place(indices, facts, *in_place)
            rb = read_raw(self.reader, indices, check=self.check, pin=False, facts=facts)
        except RecordError:
            return None
        data = rb.buffers[0]
        starts = [o for _, o, _ in rb.parts]
        if rb.encoding != "jpeg" or len(rb.buffers) != 1 or any(
                o != (starts[k - 1] + rb.parts[k - 1][2] if k else 0) for k, o in enumerate(starts)):
            return None  # not back to back in one buffer (never for read_raw today): the usual path
        offsets = torch.tensor(starts + [int(rb.nbytes)], dtype=torch.int64)
        view = data.numpy()
        sizes = rb.sizes.tolist()
        items = [(view[o : o + n], key, index, label, h, w, orient if self.apply_exif else 1)
                 for (_, o, n), key, index, label, (h, w), orient in zip(
                     rb.parts, rb.keys, rb.indices, rb.labels, sizes, rb.orientations)]
        return items, (data[: int(rb.nbytes)], offsets)

    def _items_in_place(self, indices: list, facts, data: torch.Tensor, spans: torch.Tensor):
        view = data.numpy()
        idx = np.asarray(indices, dtype=np.int64)
        orients = facts.orientation[idx].tolist() if self.apply_exif else [1] * len(indices)
        items = [(view[a:b], facts.keys[i], i, facts.labels[i], h, w, orient)
                 for i, (a, b), (h, w), orient in zip(indices, spans.tolist(), facts.hw[idx].tolist(), orients)]
        return items, (data, spans)

    def prepare_batch(self, indices: Sequence[int]) -> "PreparedBatch":
        """The first half of a batch: read and check the records, draw the crop boxes.

        Runs Python under the GIL (reads, checksums, boxes); :meth:`decode_batch` then runs the
        compiled decode with the GIL released. :class:`~readers.loader.BatchLoader` runs the two
        halves of consecutive batches on different threads so that they overlap."""
        indices = [int(i) for i in indices]
        fetched = self._fetch_packed(indices) if self._FAST_READ else None
        packed = None
        if fetched is not None:
            items, packed = fetched
        else:
            items = [it for it in self._fetch(indices) if it is not None]
        sizes = [(w, h) if orient >= 5 else (h, w) for _, _, _, _, h, w, orient in items]
        boxes, flips = self.crop.params(sizes, [it[2] for it in items])
        # FullDecode: the output is the batch's own image size (refused when sizes differ)
        out_size = (self.crop.batch_size_of(sizes, [it[1] for it in items])
                    if isinstance(self.crop, FullDecode) else self.crop.size)
        return PreparedBatch(items, packed, boxes, flips, out_size)

    def decode_batch(self, prepared: "PreparedBatch", threads: Optional[int] = None) -> DecodedBatch:
        """The second half of a batch: decode :meth:`prepare_batch`'s records into one tensor, on
        ``threads`` threads (``None``: ``torch.get_num_threads()``)."""
        items, packed, boxes, flips, out_size = prepared
        if packed is not None and packed[1].dim() == 2:
            # Read in place from the map of the store file, maybe several batches ago: a file cut
            # short since then would SIGBUS in the decode; StoreError instead (one fstat).
            self._facts().check_file_covers(packed[1][:, 1].numpy())
        images = self._alloc((len(items),) + self._sample_shape(out_size))
        fast = [b for b, it in enumerate(items) if it[6] == 1]
        errors = []
        if fast:
            data, offsets = packed if packed is not None else pack_bytes([items[b][0] for b in fast])
            if len(fast) == len(items):
                _, errors = decode_crops((data, offsets), boxes, flips, out_size,
                                         channels=self.channels, layout=self.layout, out=images,
                                         antialias=self.crop.antialias, clip_to_box=self.crop.clip_to_box,
                                         dct_scale=self.crop.dct_scale, dct=self.crop.dct, threads=threads)
            else:
                sel = torch.tensor(fast)
                if packed is not None:  # the packed buffer holds every record: take the fast ones
                    data, offsets = pack_bytes([items[b][0] for b in fast])
                part, errors = decode_crops((data, offsets), boxes[sel], flips[sel], out_size,
                                            channels=self.channels, layout=self.layout,
                                            antialias=self.crop.antialias,
                                            clip_to_box=self.crop.clip_to_box, dct_scale=self.crop.dct_scale,
                                            dct=self.crop.dct, threads=threads)
                images[sel] = part
                errors = [(fast[b], msg) for b, msg in errors]
        for b, it in enumerate(items):
            if it[6] != 1:
                try:
                    images[b] = self._slow_sample(it, boxes[b], bool(flips[b]), out_size)
                except RecordError as exc:
                    errors.append((b, str(exc)))
        bad = set()
        for b, msg in sorted(errors):
            _, key, index = items[b][:3]
            exc = RecordError(self.location, key, f"JPEG does not decode: {msg}", index)
            self._bad(exc)  # raises unless on_error="skip"
            bad.add(b)
        keep = [b for b in range(len(items)) if b not in bad]
        labels = torch.tensor([self._class_id(items[b][3]) for b in keep], dtype=torch.int64)
        keys = [items[b][1] for b in keep]
        if bad:
            images = images[torch.tensor(keep, dtype=torch.long)]
        return DecodedBatch(images, labels, keys, self.return_key)

    def _alloc(self, shape: tuple) -> torch.Tensor:
        """The batch tensor. In a DataLoader worker it is in shared memory at once (sending a
        tensor to the main process otherwise copies it into a new shared segment, a second pass
        over every pixel), from the worker's :class:`~readers.shared_batches.SharedBatchRing`: a
        buffer the main process has let go of (see :func:`collate_decoded`). In the main process
        it comes from :attr:`output_pool` (a buffer nothing holds any more) unless pinned."""
        from torch.utils.data import get_worker_info

        if self.pin_memory:
            return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        if get_worker_info() is not None:
            return worker_ring().take(shape)
        if self.output_pool is not None:
            return self.output_pool.take(shape)
        return torch.empty(shape, dtype=torch.uint8)

    def _sample_shape(self, size=None) -> tuple:
        h, w = self.crop.size if size is None else size
        return (self.channels, h, w) if self.layout == "CHW" else (h, w, self.channels)

    @staticmethod
    def _class_id(label) -> int:
        return -1 if label is None else int(label)

    def _slow_sample(self, item, box, flip: bool, size=None) -> torch.Tensor:
        data, key, index, _, _, _, orientation = item
        data = bytes(data)
        try:
            img = decode_jpeg(data, channels=self.channels)
        except ValueError as exc:
            raise RecordError(self.location, key, f"JPEG does not decode: {exc}", index) from exc
        img = torch.from_numpy(apply_orientation(img, orientation)).permute(2, 0, 1)
        if isinstance(self.crop, FullDecode):
            out = img  # the rotated image is the whole output
        else:
            out = reference_crop(img, box, flip, self.crop.size, antialias=self.crop.antialias,
                                 clip_to_box=self.crop.clip_to_box)
        return out if self.layout == "CHW" else out.permute(1, 2, 0)

    def __repr__(self):
        return super().__repr__() + f"\n    Crop: {self.crop!r}"
