"""The native engine as a decoder: ``decoder="engine"``, and what ``"auto"`` picks on a CUDA device
where it builds and loads.

:mod:`gpu_ops.engine` builds and loads the C++ engine (``gpu_ops/csrc/engine/engine.cpp``): a thread
pool that runs the host side of a batch with the GIL released (header parse, nvJPEG's CPU Huffman
stage with one decoder state per thread, the hardware JPEG engine's batched decode beside it) and
writes the whole batch into one packed HWC buffer on the GPU, handed on as a
:class:`gpu_ops.RaggedBatch` with no per-image Python. The loader passes it the reader's pinned
buffers and ``(buffer, offset, length)`` rows as they are (:meth:`EngineDecoder.decode_parts`).

With ``roi=True`` the train pipeline's random-resized-crop boxes are drawn from the stored sizes
before decoding (:mod:`readers.gpu.roi`) and the engine decodes only those windows, on its threads
and on the hardware JPEG engine alike; the batch then holds the windows.

Images nvJPEG will not decode (CMYK, 12-bit, a stream it rejects) are decoded by libjpeg-turbo and
copied into their slot (``fallbacks`` counts them, each logged with its key); an image libjpeg-turbo
cannot decode either raises :class:`~readers.gpu.decoders.DecodeError` with its position and key,
as every decoder does.

Where the engine cannot be built or loaded, constructing the decoder raises
:class:`~packer.core.errors.DependencyError` with the reason; :func:`engine_status` (also in
``readers.gpu.gpu_info()``) says why. A batch that does not finish within
``PACKER_ENGINE_TIMEOUT_S`` (120 s) raises ``RuntimeError`` naming the stage it stopped in, instead
of hanging; ``PACKER_ENGINE_TRACE=1`` prints one line per stage of every batch to stderr.

The hardware JPEG engine's share of a batch runs in up to two lanes at once (two decoder states,
threads and streams) for images of up to ~1 Mpx, where one call at a time is bound by its host
thread; larger images take one lane (the engine itself is their limit).
``PACKER_ENGINE_HW_LANES`` (1-8, read when an engine is made) sets the lanes;
``PACKER_ENGINE_HW_PREALLOCATE=0`` skips ``nvjpegDecodeBatchedPreAllocate`` (nvJPEG's memory pool for
the hardware backend, as nvImageCodec turns on).

The balanced share (``hardware_share=-1``) follows one of two rules, by image size: for images
over ~1 Mpx (one lane; the hardware engine itself the limit) the share that makes the threads'
part and the hardware call take equally long (starting at 0.8), for smaller ones a hill climb on
the batch's time per pixel that starts at the hardware engine alone and steps toward the threads
only where that makes batches faster (``PACKER_ENGINE_BALANCE=equal`` or ``climb`` picks one for
all). While the hardware call runs, the pool reads the headers of the next queued batch
(``PACKER_ENGINE_PREREAD=0`` turns that off) and its output is allocated
(``PACKER_ENGINE_PREPARE_NEXT=0`` turns that off), so the hardware decoder starts it without
waiting for this batch's last GPU work; its plan waits for its own turn. The pool's threads run at a nice increment of 5
(``PACKER_ENGINE_POOL_NICE``), so the lanes' host threads and the caller's thread win a contended
core.

Example:
    >>> dec = EngineDecoder("cuda", threads=12)                       # doctest: +SKIP
    >>> batch = dec.decode_ragged(jpeg_bytes_list, "cuda", keys=keys)  # doctest: +SKIP
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

from gpu_ops import RaggedBatch
from gpu_ops import engine as native
from packer.core.errors import DependencyError
from readers.gpu.decoders import DecodeError, Decoder, new_decoder, register_decoder

log = logging.getLogger(__name__)

__all__ = ["EngineDecoder", "Pending", "engine_status", "STATUS_OK", "STATUS_BAD_HEADER"]

#: Per-image status codes of the engine (engine.cpp's ``Status``).
STATUS_OK, STATUS_BAD_HEADER, STATUS_UNSUPPORTED, STATUS_DECODE_FAILED = 0, 1, 2, 3
#: Share of the hardware-capable pixels sent to the hardware JPEG engine; the rest is decoded by
#: the threads. ``-1`` lets the engine balance the two from each batch's timings.
DEFAULT_HARDWARE_SHARE = -1.0
#: Images above this many pixels get nvJPEG's GPU-assisted Huffman stage instead of the CPU one
#: (DALI's hybrid_huffman_threshold default).
GPU_HUFFMAN_PIXELS = 1_000_000


#: Engines with a batch that never finished (see PACKER_ENGINE_TIMEOUT_S): kept alive, since their
#: threads may still be inside a CUDA or nvJPEG call that uses them.
_STUCK: list = []


def engine_status() -> dict:
    """``{"available": bool, "reason": str}`` for the native engine (building it if needed)."""
    return native.status()


@dataclass
class Pending:
    """A batch submitted to the engine (see :meth:`EngineDecoder.submit_parts`)."""

    ticket: int
    buffers: List[torch.Tensor]
    rows: torch.Tensor
    keys: Optional[Sequence[str]]
    regions: Optional[torch.Tensor] = None


@register_decoder
class EngineDecoder(Decoder):
    """The native engine (see the module docstring).

    Args:
        device: the CUDA device.
        threads: host threads of the engine (Huffman decode, header parse).
        hardware_share: fraction of the hardware-capable pixels for the hardware JPEG engine, or
            ``-1`` (default) to balance it from the timings of each batch.
        gpu_huffman_pixels: images larger than this use the GPU Huffman stage.
        fallback_threads: libjpeg-turbo threads for images nvJPEG will not decode.
        roi: decode only the crop windows a train pipeline draws before decoding (``supports_roi``).

    Raises:
        DependencyError: the engine is not available here (the reason says why).
    """

    name = "engine"

    def __init__(self, device="cuda", threads: int = 4, hardware_share: float = DEFAULT_HARDWARE_SHARE,
                 gpu_huffman_pixels: int = GPU_HUFFMAN_PIXELS, fallback_threads: int = 2, roi: bool = False):
        device = torch.device(device)
        if device.type != "cuda":
            raise DependencyError("the native engine decodes on a CUDA device only")
        mod = native.load()
        if mod is None:
            raise DependencyError(f"the native engine is unavailable: {native.status()['reason']}")
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        try:
            self._engine = mod.Engine(index, int(threads), float(hardware_share), int(gpu_huffman_pixels))
        except RuntimeError as exc:
            raise DependencyError(f"the native engine could not start: {exc}") from exc
        self.threads = int(threads)
        self.supports_roi = bool(roi)
        self._fallback: Optional[Decoder] = None
        self._fallback_threads = fallback_threads
        self.fallbacks = 0
        #: images decoded by the hardware JPEG engine / by the threads, since construction.
        self.stats = {"hardware": 0, "threads": 0}
        self._hw_failures_seen = 0

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "EngineDecoder":
        """The decoder ``get_decoder("engine", device, threads)`` gives."""
        return cls(device, threads=threads)

    @property
    def hardware(self) -> bool:
        """Whether the hardware JPEG engine is used (and :attr:`hardware_reason` if not)."""
        return bool(self._engine.hardware)

    @property
    def hardware_reason(self) -> str:
        return str(self._engine.hardware_reason)

    @property
    def hardware_failures(self) -> int:
        """Hardware batches that failed as a whole (their images were decoded on the threads);
        :attr:`hardware_error` says why the last one did."""
        return int(self._engine.hardware_failures)

    @property
    def hardware_error(self) -> str:
        return str(self._engine.hardware_error)

    @property
    def hardware_share(self) -> float:
        """The share of pixels now sent to the hardware engine (moves when balancing)."""
        return float(self._engine.hardware_share)

    # -- decode ----------------------------------------------------------------------------------
    def submit_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None) -> "Pending":
        """Queues a batch given as ``(buffer, offset, length)`` rows into host ``buffers`` (what
        :class:`readers.raw.RawBatch` holds) and returns at once; :meth:`collect` gives its
        :class:`RaggedBatch`. The engine works on it in its own thread meanwhile, so the caller
        can read, submit the next batch or run Python while it decodes (the loader keeps two in
        flight). The output is ready on the stream current at submit time.

        ``regions``: per image the window to decode, ``(top, left, height, width)`` or None (the
        whole image); a window reaching outside its image is clipped to it (the batch's sizes say
        what was decoded)."""
        rows = parts if isinstance(parts, torch.Tensor) else torch.tensor(parts, dtype=torch.int64).reshape(-1, 3)
        bufs = list(buffers)
        win = _regions_tensor(regions, len(rows))
        return Pending(self._engine.submit(bufs, rows, win), bufs, rows, keys, win)

    def collect(self, pending: "Pending") -> RaggedBatch:
        """The HWC :class:`RaggedBatch` of a submitted batch (waits for it).

        Raises:
            DecodeError: an image neither nvJPEG nor libjpeg-turbo decodes (position and key).
        """
        try:
            data, index, sizes, status, messages, by_hw = self._engine.result(pending.ticket)
        except RuntimeError as exc:
            if "did not finish" in str(exc):  # its threads may still hold this engine: never free it
                _STUCK.append(self._engine)
            raise
        self.stats["hardware"] += int(by_hw)
        self.stats["threads"] += len(pending.rows) - int(by_hw)
        failures = self.hardware_failures
        if failures and not self._hw_failures_seen:  # slower, not wrong: said once, not per batch
            log.warning("packer engine: the hardware JPEG engine refused a batch (%s); its images were decoded "
                        "on the threads, and so will those of any batch it refuses", self.hardware_error)
        self._hw_failures_seen = failures
        batch = RaggedBatch(data=data, index=index, sizes=sizes, channels=3, layout="HWC")
        bad = torch.nonzero(status).flatten().tolist()
        if bad:
            batch = self._repair(batch, bad, status, messages, pending.buffers, pending.rows, pending.keys,
                                 pending.regions)
        return batch

    def decode_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None) -> RaggedBatch:
        """:meth:`submit_parts` and :meth:`collect` in one call."""
        return self.collect(self.submit_parts(buffers, parts, keys, regions))

    @property
    def last_timings(self) -> dict:
        """Host milliseconds of the engine's last batch: header pass, the threads' part, the
        hardware batch, the whole batch."""
        return dict(zip(("header", "threads", "hardware", "batch"), self._engine.last_timings))

    def _repair(self, batch: RaggedBatch, bad: List[int], status: torch.Tensor, messages: List[str],
                buffers, rows: torch.Tensor, keys, regions: Optional[torch.Tensor] = None) -> RaggedBatch:
        """Decodes the images nvJPEG gave up on with libjpeg-turbo (cut to their windows, as the
        engine clips them): into their slots, or (an image whose header nvJPEG could not even size)
        by repacking the batch."""
        datas = [buffers[int(rows[i, 0])][int(rows[i, 1]):int(rows[i, 1]) + int(rows[i, 2])] for i in bad]
        names = [keys[i] if keys is not None else f"image {i}" for i in bad]
        try:
            host = self._cpu().decode_host(datas, names)
        except DecodeError as exc:  # also damaged for libjpeg-turbo: the position in this batch
            pos = bad[exc.position]
            raise DecodeError(pos, keys[pos] if keys is not None else None,
                              f"{exc.reason} (nvJPEG: {messages[pos]})") from exc
        if regions is not None:
            host = [_window(arr, regions[i].tolist()) for i, arr in zip(bad, host)]
        for i, arr, name in zip(bad, host, names):
            self.fallbacks += 1
            log.warning("nvJPEG did not decode %s (%s); decoded with libjpeg-turbo instead (%d fallbacks so far)",
                        name, messages[i], self.fallbacks)
        if all(int(status[i]) != STATUS_BAD_HEADER for i in bad) and all(
                tuple(a.shape[:2]) == tuple(batch.sizes[i].tolist()) and a.ndim == 3 and a.shape[2] == 3
                for i, a in zip(bad, host)):
            for i, arr in zip(bad, host):
                off, (h, w) = int(batch.index[i, 0]), batch.sizes[i].tolist()
                batch.data[off:off + h * w * 3].copy_(torch.from_numpy(np.ascontiguousarray(arr)).flatten(),
                                                      non_blocking=False)
            return batch
        images = batch.unbind()
        for i, arr in zip(bad, host):
            a = arr if arr.ndim == 3 else arr[:, :, None]
            images[i] = torch.from_numpy(np.ascontiguousarray(a)).to(self.device).expand(-1, -1, 3).contiguous()
        return RaggedBatch.from_list(images)

    @staticmethod
    def _host_buffers(datas: Sequence):
        """The images as host buffers and their ``(buffer, offset, length)`` rows: CPU uint8
        tensors as they are (pinned or not); bytes copied once, back to back, into one pinned
        buffer.

        Pageable tensors are not packed into a pinned buffer first: packing them with one
        ``torch.cat`` (session 9) cost the decode-alone rows of ``bench_vs_dali.py`` half to two
        thirds of their images/s on an H100 (~500 px, 4 threads: 25,888 -> 6,355-11,602 img/s,
        3.6 -> 11.5-13.1 CPU cores; torch's idle intra-op threads spin after each copy), and a
        single-threaded copy still cost ~15% (session 12, docs/benchmarks/vs_dali.md)."""
        if len(datas) and all(isinstance(d, torch.Tensor) for d in datas):
            for i, t in enumerate(datas):
                if t.device.type != "cpu" or t.dtype != torch.uint8:
                    raise TypeError(f"engine: image {i} must be bytes or a CPU uint8 tensor, got {t.dtype} "
                                    f"on {t.device}")
            flat = [t.reshape(-1) for t in datas]  # a contiguous copy of a strided tensor, else a view
            return flat, torch.tensor([(i, 0, t.numel()) for i, t in enumerate(flat)],
                                      dtype=torch.int64).reshape(-1, 3)
        views = [memoryview(d.numpy() if isinstance(d, torch.Tensor) else d).cast("B") for d in datas]
        sizes = [v.nbytes for v in views]
        buf = torch.empty(max(1, sum(sizes)), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        host, rows, pos = buf.numpy(), [], 0
        for v, n in zip(views, sizes):
            host[pos:pos + n] = np.frombuffer(v, dtype=np.uint8)
            rows.append((0, pos, n))
            pos += n
        return [buf], torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)

    def submit(self, datas: Sequence, keys: Optional[Sequence[str]] = None, regions=None) -> "Pending":
        """:meth:`submit_parts` for a batch of bytes or CPU uint8 tensors: queues it and returns at
        once; :meth:`collect` gives its :class:`RaggedBatch`."""
        bufs, rows = self._host_buffers(datas)
        return self.submit_parts(bufs, rows, keys, regions)

    def decode_ragged(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
                      regions=None) -> RaggedBatch:
        """The batch (bytes or CPU uint8 tensors) as one HWC :class:`RaggedBatch` on the device
        (only the windows, where ``regions`` names them: see :meth:`submit_parts`)."""
        return self.collect(self.submit(datas, keys, regions))

    def decode(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
               regions=None) -> List[torch.Tensor]:
        """The batch as ``[H, W, 3]`` uint8 tensors on the device (views of one buffer)."""
        if not len(datas):
            return []
        return self.decode_ragged(datas, device, keys, regions).unbind()

    def _cpu(self) -> Decoder:
        if self._fallback is None:
            self._fallback = new_decoder("turbojpeg", self._fallback_threads)
        return self._fallback

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()


def _regions_tensor(regions, n: int) -> Optional[torch.Tensor]:
    """Windows ``(top, left, height, width)`` or None per image as the engine's int64 ``[n, 4]``
    (height 0: the whole image); None where no image has a window."""
    if regions is None:
        return None
    if isinstance(regions, torch.Tensor):
        win = regions.to(torch.int64).reshape(-1, 4)
    else:
        if all(r is None for r in regions):
            return None
        win = torch.tensor([(0, 0, 0, 0) if r is None else tuple(int(v) for v in r) for r in regions],
                           dtype=torch.int64).reshape(-1, 4)
    if win.shape[0] != n:
        raise ValueError(f"engine: {win.shape[0]} regions for {n} images")
    return win


def _window(arr: np.ndarray, region) -> np.ndarray:
    """``arr`` [H, W, ...] cut to ``region`` (top, left, height, width) clipped to it, as the
    engine clips windows (height <= 0, nothing inside, or all of it: the whole image)."""
    top, left, h, w = (int(v) for v in region)
    if h <= 0 or w <= 0:
        return arr
    H, W = arr.shape[:2]
    t, l = min(max(top, 0), H), min(max(left, 0), W)
    b, r = min(H, max(top + h, t)), min(W, max(left + w, l))
    if b <= t or r <= l:
        return arr
    return arr[t:b, l:r]
