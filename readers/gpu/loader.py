"""Store -> GPU batches with prefetch: read, copy and decode the next batches while the model runs.

:class:`GPULoader` runs three background threads per epoch, joined by bounded queues:

1. *read*: takes batches of indices from any torch ``Sampler`` / ``BatchSampler`` (the readers'
   DDP exact-once sampler included: the loader never makes its own), reads each batch's checked
   bytes with :class:`~readers.raw.RawReader` (parallel threads, pinned buffers);
2. *decode*: on its own CUDA stream, decodes (the decoder's path chosen per batch by
   :func:`readers.gpu.roi.decode_batch` / :func:`~readers.gpu.roi.submit_batch` from its declared
   capabilities) and records an event;
3. *pipeline*: on a third stream that waits on that event, packs the ragged batch and runs the
   pipeline (one kernel launch for the resampling), records an event.

The consumer's stream waits on that event (no host synchronisation) and every output tensor is
``record_stream``-ed on the consumer's stream, so the caching allocator never hands its memory to
the next batch while the model still reads it. Both queues are bounded (``prefetch`` batches), so
memory stays bounded. An error in a thread reaches the consumer as the same exception (a
:class:`~packer.core.errors.RecordError` names the store and key); stopping early, ``close()``, garbage
collection or interpreter exit stop and join the threads (they are daemons: never a hang at exit).

The outputs are plain tensors made outside the model, so a ``torch.compile``'d model consumes them
like any other input.

Example:
    >>> loader = GPULoader("train.lmdb", TrainPipeline(224), batch_size=256, shuffle=True, seed=0)  # doctest: +SKIP
    >>> for epoch in range(90):                                                                   # doctest: +SKIP
    ...     loader.set_epoch(epoch)
    ...     for images, labels in loader:
    ...         loss = model(images, labels)
"""
from __future__ import annotations

import collections
import logging
import queue
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import torch
import xxhash
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from gpu_ops import RaggedBatch
from packer.core.errors import PackerError, RecordError, UsageError
from readers.gpu import queues
from readers.gpu.decoders import DecodeError, adopt, get_decoder
from readers.gpu.feeds import FeedChoice
from readers.gpu.pipelines import DetectionBatch, DetectionPipeline, TrainPipeline
from readers.gpu.roi import decode_batch, submit_batch
from readers.raw import RawBatch, RawDataset, RawReader
from readers.stalls import DEFAULT_TIMEOUT_S, check_timeout, stalled

log = logging.getLogger(__name__)

__all__ = ["GPULoader", "Batch", "batch_seed"]

_POLL_S = 0.1
#: How long closing waits for each background thread: 30 s, 1 s after a stall (a thread stuck in
#: a call that never returns would not stop anyway; it is a daemon).
_JOIN_S, _JOIN_AFTER_STALL_S = 30.0, 1.0
_warned_no_cuda = False


def _cpu_without_cuda() -> str:
    """``"cpu"``, the device a GPULoader without ``device=`` falls back to where CUDA is not
    available, said once per process (a warning): GPU batches that are silently CPU batches would
    surprise a training script."""
    global _warned_no_cuda
    if not _warned_no_cuda:
        _warned_no_cuda = True
        warnings.warn("GPULoader: no CUDA device here (torch.cuda.is_available() is False), so it decodes and "
                      "makes its batches on the CPU; pass device=\"cpu\" to ask for that (and not see this)",
                      RuntimeWarning, stacklevel=3)
    return "cpu"


def batch_seed(seed: int, epoch: int, indices: Sequence[int]) -> int:
    """The generator seed of one batch: a function of the seed, the epoch and the batch's sample
    indices only, so a resumed or replayed epoch draws the same parameters for the same batch.

    The indices enter through one XXH3-128 digest of their int64 bytes (a SeedSequence over 256
    indices cost 0.75 ms of GIL-holding Python per batch)."""
    digest = xxhash.xxh3_128_intdigest(np.asarray(indices, dtype=np.int64).tobytes())
    words = [int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF] + [(digest >> s) & 0xFFFFFFFF for s in (0, 32, 64, 96)]
    ss = np.random.SeedSequence(words)
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> 1)


@dataclass
class Batch:
    """One batch: ``images`` (the pipeline's output), ``labels`` (tensor of class ids for class
    stores, else a list), ``keys`` and ``indices``; ``detection`` for :class:`DetectionPipeline`.

    Unpacks as ``images, labels = batch``."""

    images: Any
    labels: Any
    keys: List[str]
    indices: List[int]

    def __iter__(self):
        return iter((self.images, self.labels))


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


_DONE = object()


def _labels(raw: RawBatch, schema: str):
    if schema == "class":
        return torch.tensor([-1 if lab is None else int(lab) for lab in raw.labels], dtype=torch.int64)
    return list(raw.labels)


class GPULoader:
    """Batches from a packer store through a decoder and a GPU pipeline, with prefetch.

    Args:
        source: store location (or a :class:`~readers.raw.RawReader`).
        pipeline: a callable ``pipeline(images, generator=..., labels=...)`` such as
            :class:`~readers.gpu.pipelines.TrainPipeline`; ``None`` returns the decoded images
            (a list of ``[H, W, C]`` tensors).
        batch_size, shuffle, drop_last: as DataLoader, when no ``batch_sampler`` is given.
        sampler: any ``Sampler`` of indices (e.g. a DistributedSampler), batched here.
        batch_sampler: any ``BatchSampler`` (yields lists of indices); excludes the above.
        device: ``"cuda"`` (default when available) or ``"cpu"``. Left out where CUDA is not
            available: the CPU, with a RuntimeWarning (once per process) saying so.
        decoder: ``"auto"``, ``"engine"`` (the native engine: readers/gpu/engine.py), ``"nvjpeg"``,
            ``"turbojpeg"``, ``"nvimgcodec"``, ``"cpu-crops"`` (a TrainPipeline's crops decoded at
            its output size on the CPU: readers/gpu/cpucrops.py) or a decoder object (a
            :class:`~readers.gpu.decoders.Decoder`: the contract, in readers/gpu/decoders.py).
            ``"auto"`` takes the native engine on a CUDA device (else the next GPU decoder, see
            :func:`~readers.gpu.decoders.get_decoder`); with a TrainPipeline there it also
            measures the crops decoded on the CPU against it, as the training loop consumes the
            batches, and keeps the faster feed (:attr:`feed`, :mod:`readers.gpu.feeds`).
        threads: CPU threads of the decoder (the native engine's Huffman threads, the CPU
            decoders' threads) and, up to 4, of reading (``read_threads``).
        read_threads: threads reading records; default ``min(threads, 4)``: reading is GIL-bound
            Python, and more reader threads contend with the decoder for the GIL (H100 bench: 4
            beat 12 at 1080p by 30-40%).
        prefetch: batches read and decoded ahead (per stage); memory is bounded by it.
        seed: seeds shuffling and every batch's random parameters (see :func:`batch_seed`).
        check: verify record checksums while reading.
        on_error: ``"raise"`` (default) or ``"skip"``: a damaged record is left out of its batch,
            logged with its key and counted in ``skipped``.
        reader_options: passed to the store backend.
        cache_dir, cache_limit, storage_options: for a manifest in a bucket
            (``s3://bucket/train.packer-manifest.json``): the node-local shard cache, its limit
            in bytes and fsspec options (docs/object-storage.md).
        workers: read in this many DataLoader worker processes (persistent, pinned transfer)
            instead of ``threads`` threads of this process: per-record Python work then does not
            compete with decode for this process's GIL (the fast choice for small images).
        timeout: seconds the consumer waits for one batch before it raises ``RuntimeError``
            naming where each of the loader's threads is (a decoder or a storage that stopped
            answering), instead of hanging; ``None`` or ``0`` waits for ever (DataLoader's
            ``timeout=0``). Only the waiting counts, not the training step between batches. The
            default, 1800 s, is above any wait packer itself bounds and a shard of a bucket's manifest
            downloading whole (:mod:`readers.stalls`).

    Raises:
        UsageError: conflicting sampler arguments or a bad option.
    """

    def __init__(self, source, pipeline=None, *, batch_size: int = 256, shuffle: bool = False,
                 drop_last: bool = False, sampler: Optional[Iterable[int]] = None,
                 batch_sampler: Optional[Iterable[Sequence[int]]] = None, device=None, decoder="auto",
                 threads: int = 4, read_threads: Optional[int] = None, prefetch: int = 2, seed: int = 0,
                 check: bool = True,
                 on_error: str = "raise", reader_options: Optional[dict] = None, workers: int = 0,
                 cache_dir=None, cache_limit=None, storage_options: Optional[dict] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT_S):
        if on_error not in ("raise", "skip"):
            raise UsageError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.timeout = check_timeout(timeout)
        if batch_sampler is not None and (sampler is not None or shuffle or drop_last):
            raise UsageError("batch_sampler excludes sampler, shuffle and drop_last")
        if sampler is not None and shuffle:
            raise UsageError("sampler excludes shuffle")
        self.reader = source if isinstance(source, RawReader) else RawReader(
            source, threads=read_threads or min(int(threads), 4), check=check, reader_options=reader_options,
            cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else _cpu_without_cuda()
        self.device = torch.device(device)
        queues.warn_if_late(self.device)
        self.decoder = get_decoder(decoder, self.device, threads)
        self._decoder = adopt(self.decoder)  # the contract the dispatch reads (readers/gpu/decoders.py)
        self.pipeline = pipeline
        self._decoder.bind_pipeline(pipeline, self.device)  # decoder="cpu-crops" works to its output size
        self.prefetch = max(1, int(prefetch))
        #: ``decoder="auto"`` with a train pipeline on the GPU: the decoders it measures and picks
        #: from, batch by batch (the engine, then the crops on the CPU), and the
        #: :class:`~readers.gpu.feeds.FeedChoice` that picks (its ``counts`` and ``rounds`` say
        #: what it chose and why); None where one decoder does all.
        self.feed: Optional[FeedChoice] = None
        self._decoders = [self._decoder]
        if decoder == "auto":
            self._offer_cpu_crops(threads)
        self._seq = 0  # batches handed to the decode stage, over all epochs (FeedChoice's numbering)
        self.seed, self.epoch, self.on_error = int(seed), 0, on_error
        self.skipped = 0
        #: Host seconds spent per stage since construction (read, decode, pipeline, waiting for
        #: a batch in the consumer): where a slow loader loses its time.
        self.stats = {"read_s": 0.0, "decode_s": 0.0, "pipeline_s": 0.0, "wait_s": 0.0, "batches": 0}
        if batch_sampler is None:
            if sampler is None:
                sampler = (RandomSampler(range(len(self.reader)), generator=self._shuffle_gen())
                           if shuffle else SequentialSampler(range(len(self.reader))))
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.workers = int(workers)
        self._dl = None
        if self.workers > 0:
            # Persistent worker processes read the raw batches (no GIL shared with decode); the
            # DataLoader pins them on the way in.
            ds = RawDataset(self.reader.location, format=self.reader.format, check=check, on_error=on_error,
                            reader_options=self.reader.reader_options, build_id=self.reader.build_id)
            self._dl = torch.utils.data.DataLoader(
                ds, batch_sampler=batch_sampler, num_workers=self.workers, collate_fn=RawDataset.collate,
                pin_memory=self.device.type == "cuda", persistent_workers=True, prefetch_factor=2)
        self._threads: List[threading.Thread] = []
        self._stop: Optional[threading.Event] = None
        self._queues: List[queue.Queue] = []
        self._closer = weakref.finalize(self, GPULoader._shutdown, [], [], None)

    def _offer_cpu_crops(self, threads: int) -> None:
        """For ``decoder="auto"``: where a train pipeline runs on the GPU and the auto pick decodes
        there, the crops decoded on the CPU (``cpu-crops``) are measured against it and the faster
        feed of the training loop kept (:mod:`readers.gpu.feeds`)."""
        if not (self.device.type == "cuda" and isinstance(self.pipeline, TrainPipeline)
                and self.decoder.name not in ("turbojpeg", "cpu-crops")):
            return
        try:
            alt = adopt(get_decoder("cpu-crops", self.device, threads))
        except PackerError as exc:
            log.info("decoder auto: %s alone (the crops on the CPU are not available: %s)", self.decoder.name, exc)
            return
        alt.bind_pipeline(self.pipeline, self.device)
        self._decoders.append(alt)
        # Batches decoded ahead of the consumer: two in flight in the decoder, one handed on, one
        # in the pipeline stage, ``prefetch`` waiting, one being consumed.
        self.feed = FeedChoice([d.name for d in self._decoders], lag=self.prefetch + 5)

    # -- epochs ---------------------------------------------------------------------------------
    def _shuffle_gen(self) -> torch.Generator:
        self._gen = torch.Generator().manual_seed(self.seed)
        return self._gen

    def set_epoch(self, epoch: int) -> None:
        """Reseeds shuffling and the per-batch parameters; passed on to the sampler when it has
        ``set_epoch`` (DistributedSampler and the readers' samplers)."""
        self.epoch = int(epoch)
        for s in (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if s is not None and hasattr(s, "set_epoch"):
                s.set_epoch(epoch)
        if hasattr(self, "_gen"):
            self._gen.manual_seed(self.seed * 1_000_003 + self.epoch)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    # -- threads --------------------------------------------------------------------------------
    def _put(self, q: queue.Queue, item, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue, stop: threading.Event):
        while not stop.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return _DONE

    def _read_batch(self, idx: List[int]) -> Optional[RawBatch]:
        try:
            return self.reader.read(idx)
        except RecordError:
            if self.on_error == "raise":
                raise
            good = []
            for i in idx:  # isolate the damaged record(s)
                try:
                    good.append(self.reader.read([i]))
                except RecordError as one:
                    self._skip(one)
            return RawBatch.concat(good) if good else None

    def _skip(self, exc: BaseException) -> None:
        self.skipped += 1
        log.warning("skipping bad record (%d skipped): %s", self.skipped, exc)

    def _reader_loop(self, batches: Iterator, q: queue.Queue, stop: threading.Event) -> None:
        try:
            if self._dl is not None:
                batches = iter(self._dl)
            for idx in batches:
                if stop.is_set():
                    return
                t0 = time.perf_counter()
                if self._dl is not None:
                    for msg in idx.get("skipped", ()):
                        self._skip(msg)
                    raw = RawDataset.to_raw(idx)
                else:
                    raw = self._read_batch(list(idx))
                self.stats["read_s"] += time.perf_counter() - t0
                if raw is not None and not self._put(q, raw, stop):
                    return
            self._put(q, _DONE, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who re-raises it
            self._put(q, _Failure(exc), stop)

    def _decode(self, raw: RawBatch, decoder=None):
        """Decoded [H, W, C] images of ``raw`` on the device, as a list or one RaggedBatch
        (:func:`readers.gpu.roi.decode_batch`) by ``decoder`` (default: the loader's); damaged
        ones raised or skipped."""
        decoder = decoder or self._decoder
        try:
            return decode_batch(decoder, self.pipeline, raw, self._batch_seed(raw), self.device)
        except DecodeError as exc:
            return self._undecodable(raw, exc, decoder)

    def _batch_seed(self, raw: RawBatch) -> int:
        return batch_seed(self.seed, self.epoch, raw.indices)

    def _undecodable(self, raw: RawBatch, exc: DecodeError, decoder=None):
        """A record of ``raw`` does not decode: RecordError naming it, or (``on_error="skip"``) it
        is left out and the rest decoded again."""
        pos = exc.position
        err = RecordError(self.reader.location, raw.keys[pos], f"JPEG does not decode: {exc.reason}",
                          raw.indices[pos])
        if self.on_error == "raise":
            raise err from exc
        self._skip(err)
        self._drop(raw, [i for i in range(len(raw)) if i != pos])
        return self._decode(raw, decoder)

    @staticmethod
    def _drop(raw: RawBatch, keep: List[int]) -> None:
        raw.parts = [raw.parts[i] for i in keep]
        raw.sizes = raw.sizes[keep]
        for name in ("indices", "keys", "labels", "orientations"):
            setattr(raw, name, [getattr(raw, name)[i] for i in keep])
        if raw.jpeg is not None:
            raw.jpeg = [raw.jpeg[i] for i in keep]

    def _run_pipeline(self, raw: RawBatch, imgs: List[torch.Tensor]) -> Batch:
        t0 = time.perf_counter()
        plan = raw.roi  # set by the decode step (readers/gpu/roi.py), fitted to the sizes decoded
        gen = plan.generator if plan is not None else torch.Generator().manual_seed(self._batch_seed(raw))
        schema = self.reader.metadata.label_schema
        if self.pipeline is None:
            out = imgs
        elif isinstance(self.pipeline, DetectionPipeline):
            out = self.pipeline(imgs, generator=gen, labels=raw.labels, keys=raw.keys, indices=raw.indices)
        elif plan is not None:
            out = self.pipeline(imgs, generator=gen, labels=raw.labels, params=plan.params)
        else:
            out = self.pipeline(imgs, generator=gen, labels=raw.labels)
        self.stats["pipeline_s"] += time.perf_counter() - t0
        self.stats["batches"] += 1
        return Batch(out, _labels(raw, schema), raw.keys, raw.indices)

    def _stream(self):
        return torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _decode_loop(self, qin: queue.Queue, qout: queue.Queue, stop: threading.Event) -> None:
        """Stage 2: decode on its own stream; hands (raw, images, event, seq) to the pipeline stage
        (``seq``: the batch's number for :attr:`feed`, which picks its decoder).

        A decoder that ``submits`` (the native engine, cpu-crops) gets the next batch before the
        current one is collected (:func:`readers.gpu.roi.submit_batch`): it decodes in its own
        threads while this one waits for the GIL, hands a batch on, or reads the queue."""
        stream = self._stream()
        # Host buffers stay referenced until the GPU work that reads them is done (a decoder may
        # copy from pinned memory asynchronously without telling the caching host allocator).
        in_flight: collections.deque = collections.deque()
        ahead: collections.deque = collections.deque()  # (raw, finish, seq, decoder) submitted, oldest first

        def emit(raw, decode, seq) -> bool:
            t0 = time.perf_counter()
            event = None
            if stream is None:
                imgs = decode()
            else:
                with torch.cuda.stream(stream):
                    imgs = decode()
                    event = torch.cuda.Event()
                    event.record(stream)
            self.stats["decode_s"] += time.perf_counter() - t0
            if not self._put(qout, (raw, imgs, event, seq), stop):
                return False
            if event is not None:
                in_flight.append((event, raw))
                while len(in_flight) > self.prefetch + 2:
                    in_flight.popleft()[0].synchronize()
            return True

        def emit_oldest() -> bool:
            raw, finish, seq, decoder = ahead.popleft()
            return emit(raw, lambda: self._collect(raw, finish, decoder), seq)

        try:
            while True:
                raw = self._get(qin, stop)
                if raw is _DONE or isinstance(raw, _Failure):
                    while ahead:
                        if not emit_oldest():
                            return
                    self._put(qout, raw, stop)
                    return
                if len(raw) == 0:
                    continue
                seq, self._seq = self._seq, self._seq + 1
                decoder = self._decoders[self.feed.pick(seq)] if self.feed is not None else self._decoder
                if decoder.submits:  # two batches in flight; None: this one decodes now
                    t0 = time.perf_counter()
                    with torch.cuda.stream(stream):
                        finish = submit_batch(decoder, self.pipeline, raw, self._batch_seed(raw))
                    self.stats["decode_s"] += time.perf_counter() - t0
                    if finish is not None:
                        ahead.append((raw, finish, seq, decoder))
                        if len(ahead) >= 2 and not emit_oldest():
                            return
                        continue
                while ahead:  # keep the batches in order
                    if not emit_oldest():
                        return
                if not emit(raw, lambda: self._decode(raw, decoder), seq):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who re-raises it
            self._put(qout, _Failure(exc), stop)

    def _collect(self, raw: RawBatch, finish, decoder=None):
        """The submitted batch's images (``finish()``: see :func:`readers.gpu.roi.submit_batch`); a
        damaged record handled as :meth:`_decode` does, by the ``decoder`` that had the batch."""
        try:
            return finish()
        except DecodeError as exc:
            return self._undecodable(raw, exc, decoder)

    def _pipeline_loop(self, qin: queue.Queue, qout: queue.Queue, stop: threading.Event) -> None:
        """Stage 3: the pipeline on its own stream (overlaps the next batch's decode)."""
        stream = self._stream()
        try:
            while True:
                item = self._get(qin, stop)
                if item is _DONE or isinstance(item, _Failure):
                    self._put(qout, item, stop)
                    return
                raw, imgs, dec_event, seq = item
                if stream is None:
                    batch, event = self._run_pipeline(raw, imgs), None
                else:
                    with torch.cuda.stream(stream):
                        if dec_event is not None:
                            stream.wait_event(dec_event)
                        # Made on the decode stream, read on this one.
                        for t in ((imgs.data, imgs.index) if isinstance(imgs, RaggedBatch) else imgs):
                            if t.is_cuda:
                                t.record_stream(stream)
                        batch = self._run_pipeline(raw, imgs)
                        event = torch.cuda.Event()
                        event.record(stream)
                del imgs, item
                if not self._put(qout, (batch, event, seq), stop):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who re-raises it
            self._put(qout, _Failure(exc), stop)

    @staticmethod
    def _shutdown(threads: List[threading.Thread], queues: List[queue.Queue], stop: Optional[threading.Event],
                  join_s=(_JOIN_S,), _finalizing=sys.is_finalizing) -> None:
        if stop is not None:
            stop.set()
        if _finalizing():
            # A loop left suspended is closed at interpreter exit, when modules (queue's own
            # included) are half torn down: draining would raise. The threads are daemons.
            return
        for t in threads:
            t.join(timeout=join_s[0])
            if t.is_alive():
                log.warning("GPULoader thread %s did not stop within %g s", t.name, join_s[0])
        for q in queues:
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break

    def close(self) -> None:
        """Stops and joins the background threads of the running epoch (idempotent)."""
        self._closer()
        self._threads, self._queues, self._stop = [], [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        self.reader.close()
        if self._dl is not None and getattr(self._dl, "_iterator", None) is not None:
            self._dl._iterator._shutdown_workers()  # persistent workers: stop them now
            self._dl._iterator = None
        for d in self._decoders:
            d.close()
        return False

    # -- consumer -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        self.close()  # a new epoch ends the previous one's threads
        if self.feed is not None:
            self.feed.restart()
        stop = threading.Event()
        q_raw: queue.Queue = queue.Queue(self.prefetch)
        q_dec: queue.Queue = queue.Queue(1)
        q_out: queue.Queue = queue.Queue(self.prefetch)
        batches = iter(self.batch_sampler)
        threads = [
            threading.Thread(target=self._reader_loop, args=(batches, q_raw, stop), name="packer-gpu-read",
                             daemon=True),
            threading.Thread(target=self._decode_loop, args=(q_raw, q_dec, stop), name="packer-gpu-decode",
                             daemon=True),
            threading.Thread(target=self._pipeline_loop, args=(q_dec, q_out, stop), name="packer-gpu-pipeline",
                             daemon=True),
        ]
        self._threads, self._queues, self._stop = threads, [q_raw, q_dec, q_out], stop
        self._join_s = [_JOIN_S]
        self._closer = weakref.finalize(self, GPULoader._shutdown, self._threads, self._queues, stop, self._join_s)
        for t in threads:
            t.start()
        return self._consume(q_out, stop)

    def _consume(self, q_out: queue.Queue, stop: threading.Event) -> Iterator[Batch]:
        # (seq, when the consumer asked for it) of the batch before, and when it asked for the next:
        # the period of the one before, for feed (readers/gpu/feeds.py)
        asked, asked_at = None, None
        waiting = None  # since when the consumer has waited for the batch it asked for
        try:
            while True:
                t0 = time.perf_counter()
                if waiting is None:
                    waiting = t0
                if asked_at is None:
                    asked_at = t0
                    if asked is not None and self.feed is not None:
                        self.feed.observe(asked[0], t0 - asked[1])
                try:
                    item = q_out.get(timeout=1.0 if self.timeout is None else min(1.0, self.timeout))
                except queue.Empty:
                    if not any(t.is_alive() for t in self._threads):
                        raise RuntimeError("GPULoader: the background threads stopped without a result") from None
                    if self.timeout is not None and time.perf_counter() - waiting > self.timeout:
                        self._join_s[0] = _JOIN_AFTER_STALL_S
                        raise stalled("GPULoader", self.timeout, self._threads, __file__) from None
                    continue
                self.stats["wait_s"] += time.perf_counter() - waiting
                waiting = None
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                batch, event, seq = item
                asked, asked_at = (seq, asked_at), None
                if event is not None:
                    cur = torch.cuda.current_stream(self.device)
                    cur.wait_event(event)
                    _record(batch, cur)
                yield batch
        finally:
            if self._stop is stop:
                self.close()
            else:
                GPULoader._shutdown([], [q_out], stop)


def _record(batch: Batch, stream) -> None:
    """Tell the caching allocator that ``stream`` uses the batch's tensors."""
    out = batch.images
    if isinstance(out, torch.Tensor):
        out.record_stream(stream)
    elif isinstance(out, DetectionBatch):
        out.record_stream(stream)
    elif isinstance(out, (list, tuple)):
        for t in out:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(stream)
    if isinstance(batch.labels, torch.Tensor) and batch.labels.is_cuda:
        batch.labels.record_stream(stream)
