"""BatchLoader: a CropDataset's batches in one process, read and decoded ahead on two threads.

Without DataLoader workers a :class:`~readers.train.CropDataset` batch is one Python half (read the
records, check their checksums, draw the boxes: under the GIL, on one core) followed by one
compiled half (the decode, GIL released, on ``torch.get_num_threads()`` threads). Run one after
the other, every core but one idles during the first half, and the consumer (a training step)
waits for both. :class:`BatchLoader` runs the first half of batch ``k + 1`` on a read thread while
the decode thread decodes batch ``k`` and the caller uses batch ``k - 1``: the loader FFCV has
(reading and decoding overlapped on threads), without worker processes, so batches stay in
reusable buffers and never cross processes. Several batches decode at once, each on a few of the
threads: with one batch on all of them, every batch ends on its slowest image while the other
threads idle, and the read thread's time slices stall the decode (2 cores, 500x375 full decode:
2,060 img/s with one batch at a time against 2,770 with two; on 16 CPUs with 14 threads, 8,731
img/s with one batch on 14 threads plus the next against 11,363 with 8 batches on 2 threads each).

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
import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Iterator, Optional

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

from packer.core.errors import UsageError

from .crops import check_count
from .stalls import DEFAULT_TIMEOUT_S, check_timeout, stalled
from .train import CropDataset, collate_decoded

# Numbers each iteration's threads (BatchLoader.__iter__).
_runs = itertools.count()

__all__ = ["BatchLoader"]


def default_threads_per_batch(total: int) -> int:
    """Threads one batch decodes on when ``total`` decode threads are available (see
    :meth:`BatchLoader.plan`): ``ceil(total / 8)``, so about ``total / per_batch`` batches decode
    at once, each on few threads.

    Few threads per batch waste little at each batch's end (its last images decode while its
    other threads idle) and keep the loader near ``total`` threads in all. Measured (500x375 full
    decode, batch 32, 16-CPU host, ``total`` 14): 2 threads per batch, 8 batches at once: 11,363
    img/s; 1 and 15: 10,662; 4 and 5: 10,378; 7 and 3: 9,971; 14 and 2 (the earlier plan, 28
    threads): 8,731. At ``total`` 8 and 4 on that host one thread per batch was the most
    img/s per thread in use. On 2 cores 1 or 2 threads per batch measured the same."""
    return max(1, -(-int(total) // 8))


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
            before). Each batch in flight is one batch buffer of memory. Default: the batches
            decoding at once plus three, so that up to three decoded batches can wait for a
            slower training step while every decode thread still has a batch (2 cores, 500x375
            full decode, 10 ms step: 6 in flight gave 3.8% more img/s than 4, ahead in 10 of 11
            interleaved rounds; with no step it makes no difference).
        threads_per_batch: decode threads per batch (default
            :func:`default_threads_per_batch`).
        timeout: seconds the iteration waits for one batch before it raises ``RuntimeError``
            naming where the loader's threads are, instead of hanging (a read or a decode that
            never returns); ``None`` or ``0`` waits for ever. Default 1800 s
            (:mod:`readers.stalls`).

    The decode keeps to about ``torch.get_num_threads()`` threads (``torch.set_num_threads(n)``)
    in all: several batches decode at once, each on ``threads_per_batch`` of them (see
    :meth:`plan`); one more thread reads. Batches come from the dataset's
    :class:`~readers.train.OutputPool`: a buffer is decoded into again only once nothing holds its
    batch. An error while reading or decoding a
    batch (``RecordError`` naming the key, with the dataset's ``on_error="raise"``) is raised by
    the iteration at that batch; batches already read ahead are dropped.

    Resume mid-epoch: :meth:`state_dict` counts the batches handed out this epoch;
    :meth:`load_state_dict` makes the next iteration skip that many (without reading them), so
    with a seeded order the rest of the epoch is the same as it would have been.
    """

    def __init__(self, dataset: CropDataset, batch_size: int = 1, *, shuffle: bool = False,
                 sampler: Optional[Sampler] = None, drop_last: bool = False, seed: int = 0,
                 prefetch: Optional[int] = None, threads_per_batch: Optional[int] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT_S):
        if not isinstance(dataset, CropDataset):
            raise UsageError(f"BatchLoader reads a readers.CropDataset, got {type(dataset).__name__}; "
                             f"use torch.utils.data.DataLoader for other datasets")
        if shuffle and sampler is not None:
            raise UsageError("BatchLoader: give shuffle=True or a sampler, not both")
        self.dataset, self.drop_last = dataset, bool(drop_last)
        self.batch_size = check_count("BatchLoader: batch_size", batch_size)
        self.prefetch = None if prefetch is None else check_count("BatchLoader: prefetch", prefetch)
        self.threads_per_batch = (None if threads_per_batch is None
                                  else check_count("BatchLoader: threads_per_batch", threads_per_batch))
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.timeout = check_timeout(timeout)
        self.sampler = sampler if sampler is not None else SequentialSampler(dataset)
        self.epoch = 0
        self._done = 0   # batches handed out in the current epoch
        self._skip = 0   # batches to skip at the next iteration (load_state_dict)

    def set_epoch(self, epoch: int) -> None:
        """The epoch for the shuffle, the sampler and a seeded crop (replayable per epoch)."""
        self.epoch = int(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        self.dataset.set_epoch(self.epoch)

    def plan(self) -> tuple[int, int, int]:
        """``(threads_per_batch, batches_at_once, prefetch)`` for ``torch.get_num_threads()`` now.

        ``batches_at_once`` is enough batches to keep every thread busy plus one, so that the next
        batch fills the threads a finishing batch leaves idle (so ``total + threads_per_batch``
        threads at most); ``prefetch`` (unless given) is that plus three: decoded batches
        waiting for the caller, and the next being read, do not take a decode thread's batch
        away (batches are read as the caller takes them: with room for only one, a slow step
        left the decode threads without work). A given ``prefetch`` caps ``batches_at_once``."""
        total = torch.get_num_threads()
        per_batch = min(self.threads_per_batch or default_threads_per_batch(total), total)
        at_once = -(-total // per_batch) + 1
        prefetch = self.prefetch if self.prefetch is not None else at_once + 3
        return per_batch, min(at_once, prefetch), prefetch

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
        per_batch, at_once, prefetch = self.plan()
        if ds.output_pool is not None:  # room for the batches in flight, the caller's, one it still holds
            ds.output_pool.keep = max(ds.output_pool.keep, prefetch + 3)
        # One read thread, so reads stay in batch order; a batch's decode waits for its read, and
        # the read of the next batch runs meanwhile. `at_once` decode threads, each running a batch
        # on `per_batch` threads of the op: another batch fills the cores a batch's last images and
        # the read thread leave idle. Batches are still handed out in order (the futures' order).
        # Each iteration's threads named apart (packer-read.N_0, packer-decode.N_0, ...): a stall
        # names this iteration's threads only, not another loader's in the same process.
        run = next(_runs)
        names = (f"packer-read.{run}", f"packer-decode.{run}")
        reader = ThreadPoolExecutor(1, thread_name_prefix=names[0])
        decoder = ThreadPoolExecutor(at_once, thread_name_prefix=names[1])
        ours = tuple(n + "_" for n in names)  # the executors name their threads PREFIX_0, PREFIX_1, ...
        pending: collections.deque[Future] = collections.deque()

        def submit_next() -> bool:
            indices = next(index_lists, None)
            if indices is None:
                return False
            read = reader.submit(ds.prepare_batch, indices)
            pending.append(decoder.submit(lambda: ds.decode_batch(read.result(), per_batch)))
            return True

        stuck = False
        try:
            while len(pending) < prefetch and submit_next():
                pass
            while pending:
                try:
                    batch = pending.popleft().result(timeout=self.timeout)
                except FutureTimeout:
                    stuck = True  # its threads may never return: closing does not wait for them
                    threads = [t for t in threading.enumerate() if t.name.startswith(ours)]
                    raise stalled("BatchLoader", self.timeout, threads) from None
                submit_next()
                self._done += 1
                yield collate_decoded(batch)
                del batch  # the buffer may be reused once the caller drops its batch too
        finally:
            for fut in pending:
                fut.cancel()
            reader.shutdown(wait=not stuck, cancel_futures=True)
            decoder.shutdown(wait=not stuck, cancel_futures=True)

    def __repr__(self) -> str:
        per_batch, at_once, prefetch = self.plan()
        return (f"BatchLoader(batch_size={self.batch_size}, shuffle={self.shuffle}, prefetch={prefetch}, "
                f"threads={torch.get_num_threads()} ({at_once} batches at once on {per_batch} each), "
                f"drop_last={self.drop_last})\n  {self.dataset!r}")
