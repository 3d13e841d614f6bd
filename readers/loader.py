"""BatchLoader: a CropDataset's batches in one process, read and decoded ahead on two threads.

Without DataLoader workers a :class:`~readers.train.CropDataset` batch is one Python half (read the
records, check their checksums, draw the boxes: under the GIL, on one core) followed by one
compiled half (the decode, GIL released, on ``torch.get_num_threads()`` threads). Run one after
the other, every core but one idles during the first half, and the consumer (a training step)
waits for both. :class:`BatchLoader` runs the first half of batch ``k + 1`` on a read thread while
the decode thread decodes batch ``k`` and the caller uses batch ``k - 1``: the loader FFCV has
(reading and decoding overlapped on threads), without worker processes, so batches stay in
reusable buffers and never cross processes. Two batches are decoded at once where ``prefetch``
allows: with one, every batch ends on its slowest image while the other decode threads idle, and
the read thread's time slices stall the decode (measured on 2 cores, 500x375 full decode: 2,060
img/s with one batch at a time against 2,770 with two, interleaved epochs of one run).

Example:
    >>> from readers import BatchLoader, CropDataset, RandomResizedCrop
    >>> torch.set_num_threads(8)                        # the decode threads  # doctest: +SKIP
    >>> ds = CropDataset("train.lmdb", RandomResizedCrop(224))               # doctest: +SKIP
    >>> loader = BatchLoader(ds, batch_size=256, shuffle=True, seed=0)       # doctest: +SKIP
    >>> for epoch in range(90):                                              # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for images, labels in loader: ...
"""
from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, Optional

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

from packer.errors import UsageError

from .train import CropDataset, collate_decoded

__all__ = ["BatchLoader"]


class BatchLoader:
    """Iterates ``(images, labels)`` batches of a :class:`CropDataset` (``+ keys`` with
    ``return_key``), reading up to ``prefetch`` batches ahead of the caller.

    Args:
        dataset: the :class:`~readers.train.CropDataset`.
        batch_size: records per batch.
        shuffle: a new random order every epoch, replayable from ``(seed, epoch)``.
        sampler: an index sampler instead (e.g. :class:`readers.DistributedSampler`; its
            ``set_epoch`` is called by :meth:`set_epoch`). Not with ``shuffle``.
        drop_last: drop the last batch when it is short.
        seed: the shuffle's seed (``shuffle=True`` only).
        prefetch: batches in flight (read, being decoded or decoded) beside the one the caller
            holds (>= 1; 2 or more lets the read of one batch overlap the decode of the one
            before). Each decoded batch waiting is one batch buffer of memory. The default 3 (FFCV's
            ``batches_ahead``) measured 3-5% more img/s than 2 (2 cores, 500x375 full decode, with
            and without a 10 ms training step); 4 added about 1% more.

    The decode uses ``torch.get_num_threads()`` threads (``torch.set_num_threads(n)``) per batch,
    with up to two batches decoding at once (``prefetch >= 2``); one more thread reads. Batches
    come from the dataset's :class:`~readers.train.OutputPool`: a buffer is decoded into again
    only once nothing holds its batch. An error while reading or decoding a
    batch (``RecordError`` naming the key, with the dataset's ``on_error="raise"``) is raised by
    the iteration at that batch; batches already read ahead are dropped.

    Resume mid-epoch: :meth:`state_dict` counts the batches handed out this epoch;
    :meth:`load_state_dict` makes the next iteration skip that many (without reading them), so
    with a seeded order the rest of the epoch is the same as it would have been.
    """

    def __init__(self, dataset: CropDataset, batch_size: int = 1, *, shuffle: bool = False,
                 sampler: Optional[Sampler] = None, drop_last: bool = False, seed: int = 0,
                 prefetch: int = 3):
        if not isinstance(dataset, CropDataset):
            raise UsageError(f"BatchLoader reads a readers.CropDataset, got {type(dataset).__name__}; "
                             f"use torch.utils.data.DataLoader for other datasets")
        if shuffle and sampler is not None:
            raise UsageError("BatchLoader: give shuffle=True or a sampler, not both")
        if int(batch_size) < 1 or int(prefetch) < 1:
            raise UsageError(f"BatchLoader: batch_size and prefetch must be >= 1, got {batch_size}, {prefetch}")
        self.dataset, self.batch_size, self.drop_last = dataset, int(batch_size), bool(drop_last)
        self.shuffle, self.seed, self.prefetch = bool(shuffle), int(seed), int(prefetch)
        self.sampler = sampler if sampler is not None else SequentialSampler(dataset)
        pool = dataset.output_pool
        if pool is not None:  # room for the batches in flight, the caller's, and one it still holds
            pool.keep = max(pool.keep, self.prefetch + 3)
        self.epoch = 0
        self._done = 0   # batches handed out in the current epoch
        self._skip = 0   # batches to skip at the next iteration (load_state_dict)

    def set_epoch(self, epoch: int) -> None:
        """The epoch for the shuffle, the sampler and a seeded crop (replayable per epoch)."""
        self.epoch = int(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        self.dataset.set_epoch(self.epoch)

    def _batches(self) -> BatchSampler:
        sampler = self.sampler
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            sampler = RandomSampler(self.dataset, generator=gen)
        return BatchSampler(sampler, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return len(self._batches())

    def state_dict(self) -> dict:
        """Where this epoch stands: ``{"epoch", "batches"}`` (batches handed out so far)."""
        return {"epoch": self.epoch, "batches": self._done}

    def load_state_dict(self, state: dict) -> None:
        """Continue an epoch from :meth:`state_dict`: sets the epoch; the next iteration skips
        the batches already handed out."""
        self.set_epoch(int(state["epoch"]))
        self._skip = int(state["batches"])

    def __iter__(self) -> Iterator:
        skip, self._skip = self._skip, 0
        self._done = skip
        index_lists = iter(self._batches())
        for _ in range(skip):
            if next(index_lists, None) is None:
                return
        ds = self.dataset
        # One read thread, so reads stay in batch order; a batch's decode waits for its read, and
        # the read of the next batch runs meanwhile. Two decode threads (each running a batch on
        # the op's own threads): the second batch fills the cores the first one's last images and
        # the read thread leave idle. Batches are still handed out in order (the futures' order).
        reader = ThreadPoolExecutor(1, thread_name_prefix="packer-read")
        decoder = ThreadPoolExecutor(min(2, self.prefetch), thread_name_prefix="packer-decode")
        pending: collections.deque[Future] = collections.deque()

        def submit_next() -> bool:
            indices = next(index_lists, None)
            if indices is None:
                return False
            read = reader.submit(ds.prepare_batch, indices)
            pending.append(decoder.submit(lambda: ds.decode_batch(read.result())))
            return True

        try:
            while len(pending) < self.prefetch and submit_next():
                pass
            while pending:
                batch = pending.popleft().result()
                submit_next()
                self._done += 1
                yield collate_decoded(batch)
                del batch  # the buffer may be reused once the caller drops its batch too
        finally:
            for fut in pending:
                fut.cancel()
            reader.shutdown(wait=True, cancel_futures=True)
            decoder.shutdown(wait=True, cancel_futures=True)

    def __repr__(self) -> str:
        return (f"BatchLoader(batch_size={self.batch_size}, shuffle={self.shuffle}, prefetch={self.prefetch}, "
                f"threads={torch.get_num_threads()}, drop_last={self.drop_last})\n  {self.dataset!r}")
