"""One batch decoded by two GPU decoders at once: the hardware JPEG engine (nvImageCodec) and
nvJPEG's CUDA decoder (torchvision), as DALI's ``hw_decoder_load`` splits a batch.

An H100 has hardware JPEG engines (NVJPG) beside its CUDA cores; either alone leaves the other
idle. :class:`SplitDecoder` sends a share ``hw_share`` of each batch's baseline JPEGs to the engine
(nvImageCodec, on its own CUDA stream, from a helper thread: both libraries release the GIL while
they decode) and the rest, progressive JPEGs included, to ``torchvision.io.decode_jpeg`` on the
caller's stream, then joins them: the caller's stream waits on the engine's event, and
:meth:`SplitDecoder.decode_ragged` packs both kinds of output (the engine's ``[H, W, C]`` and
nvJPEG's ``[C, H, W]``) into one :class:`gpu_ops.RaggedBatch` in one C++ call.

Which images go to the engine comes from the store's recorded JPEG facts (``RawBatch.jpeg``: coding
and subsampling), or the bytes' frame header for stores built before them: the engine takes
baseline JPEGs of the usual subsamplings only (see :func:`readers.gpu.nvimgcodec.route`). The share
is spread evenly over the batch (every other image for 0.5), so both decoders see the same mix of
sizes.

Example:
    >>> dec = SplitDecoder(hw_share=0.5)                                   # doctest: +SKIP
    >>> rb = dec.decode_ragged(jpeg_tensors, "cuda", keys=keys)            # doctest: +SKIP
    >>> dec.routed                                                         # doctest: +SKIP
    Counter({'hw': 128, 'nvjpeg': 128})
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

import torch

from packer.core.errors import UsageError
from readers.gpu.decoders import DecodeError, Decoder, new_decoder, register_decoder

__all__ = ["SplitDecoder", "DEFAULT_HW_SHARE", "spread"]

#: Share of each batch's baseline JPEGs given to the hardware engine. Measured on the H100: see
#: docs/benchmarks/vs_dali.md (the benchmark sweeps it: scripts/bench_vs_dali.py --split-sweep).
DEFAULT_HW_SHARE = 0.5

# Engine images kept referenced until the caller's stream has copied them (nvImageCodec owns their
# memory; freeing it must wait for the pack kernel that reads it).
_KEEP_BATCHES = 4


def spread(candidates: Sequence[int], share: float) -> List[int]:
    """``round(share * len(candidates))`` of ``candidates``, spread evenly over them, from the
    first (every other one for 0.5).

    Example:
        >>> spread(list(range(8)), 0.5), spread(list(range(4)), 0.0), spread([3, 5], 1.0)
        ([0, 2, 4, 6], [], [3, 5])
    """
    n = len(candidates)
    take = min(n, max(0, round(share * n)))
    return [candidates[(i * n) // take] for i in range(take)] if take else []


@register_decoder
class SplitDecoder(Decoder):
    """Hardware JPEG engine + nvJPEG CUDA decode at once, on one batch. See the module docstring.

    Args:
        device: the CUDA device (default: the current one).
        hw_share: share (0..1) of each batch's baseline JPEGs sent to the hardware engine.
        cpu_share: share (0..1) of each batch decoded by libjpeg-turbo on ``threads`` CPU threads
            and uploaded in one copy, at the same time (DALI's CPU share of its hybrid decode).
        threads: CPU threads for nvImageCodec.
        fallback_threads: libjpeg-turbo threads for images neither GPU decoder takes.

    Attributes:
        routed: images per decoder so far (``hw``, ``cpu``, ``nvjpeg``).

    Raises:
        DependencyError: nvImageCodec or torchvision missing, or no CUDA device.
        UsageError: ``hw_share`` outside [0, 1].
    """

    name = "split"

    def __init__(self, device=None, hw_share: float = DEFAULT_HW_SHARE, threads: int = 4, fallback_threads: int = 2,
                 cpu_share: float = 0.0):
        for name, v in (("hw_share", hw_share), ("cpu_share", cpu_share)):
            if not 0.0 <= float(v) <= 1.0:
                raise UsageError(f"{name} must be in [0, 1], got {v!r}")
        if float(hw_share) + float(cpu_share) > 1.0:
            raise UsageError(f"hw_share + cpu_share must be at most 1, got {hw_share} + {cpu_share}")
        self.hw_share, self.cpu_share = float(hw_share), float(cpu_share)
        # The parts by name from the registry (decoder modules never import each other).
        self._cpu = new_decoder("turbojpeg", threads) if self.cpu_share > 0 else None
        self._engine = new_decoder("nvimgcodec", device, hw_load=1.0, threads=threads,
                                   fallback_threads=fallback_threads)
        self.device = self._engine.device
        self._nvjpeg = new_decoder("nvjpeg", fallback_threads=fallback_threads)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="packer-hw-decode")
        self._cpu_exec: Optional[ThreadPoolExecutor] = None
        self._cpu_stream = None
        self._stream = torch.cuda.Stream(self.device)
        self._keep: collections.deque = collections.deque()
        self.routed: collections.Counter = collections.Counter()

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "SplitDecoder":
        """The decoder ``get_decoder("split", device, threads)`` gives: half the threads for the fallback."""
        return cls(device, threads=threads, fallback_threads=max(1, threads // 2))

    @property
    def fallbacks(self) -> int:
        return self._engine.fallbacks + self._nvjpeg.fallbacks

    def routes(self, datas: Sequence, jpeg: Optional[Sequence[tuple]] = None) -> List[str]:
        """Per image ``"hw"`` (may go to the engine) or another route (nvJPEG); see
        :meth:`readers.gpu.nvimgcodec.NvImageCodecDecoder.routes`. Its presence makes the loader pass the
        store's facts."""
        return self._engine.routes(datas, jpeg)

    def _engine_part(self, datas, keys, jpeg):
        with torch.cuda.stream(self._stream):
            imgs = self._engine.decode(datas, self.device, keys=keys, jpeg=jpeg)
            event = torch.cuda.Event()
            event.record(self._stream)
        return imgs, event

    def _split(self, datas, keys, jpeg):
        """(positions sent to the engine, their images, the rest's positions, their [C,H,W] images)."""
        if jpeg is not None and len(jpeg) != len(datas):
            jpeg = None
        routes = self.routes(datas, jpeg)
        hw_candidates = [i for i, r in enumerate(routes) if r == "hw"]
        hw = spread(hw_candidates, self.hw_share)
        taken = set(hw)
        # The CPU share: taken from what is left, spread over the batch like the engine's.
        cpu = spread([i for i in range(len(datas)) if i not in taken],
                     self.cpu_share / (1.0 - self.hw_share) if self.cpu_share and self.hw_share < 1 else 0.0)
        taken.update(cpu)
        rest = [i for i in range(len(datas)) if i not in taken]
        pick = lambda seq, idx: None if seq is None else [seq[i] for i in idx]  # noqa: E731
        future = cpu_future = None
        if hw:
            future = self._pool.submit(self._engine_part, pick(datas, hw), pick(keys, hw), pick(jpeg, hw))
        if cpu:  # libjpeg-turbo on its own threads (the GIL is free while it decodes), one upload
            cpu_future = self._cpu_pool().submit(self._cpu_part, pick(datas, cpu), pick(keys, cpu))
        rest_imgs: List[torch.Tensor] = []
        cpu_imgs: List[torch.Tensor] = []
        try:
            if rest:  # [C, H, W]; one bad image: one by one, CPU fallback
                rest_imgs = self._nvjpeg.decode_chw(pick(datas, rest), self.device, pick(keys, rest))
        except DecodeError as exc:
            raise _at(exc, rest, keys) from exc
        finally:
            hw_imgs: List[torch.Tensor] = []
            if future is not None:
                try:
                    hw_imgs, event = future.result()
                except DecodeError as exc:
                    raise _at(exc, hw, keys) from exc
                torch.cuda.current_stream(self.device).wait_event(event)
            if cpu_future is not None:
                try:
                    cpu_imgs, cpu_event = cpu_future.result()
                except DecodeError as exc:
                    raise _at(exc, cpu, keys) from exc
                torch.cuda.current_stream(self.device).wait_event(cpu_event)
                if cpu_imgs:  # one device buffer, made on the CPU-share stream, read on this one
                    cpu_imgs[0].record_stream(torch.cuda.current_stream(self.device))
        self.routed["hw"] += len(hw)
        self.routed["cpu"] += len(cpu)
        self.routed["nvjpeg"] += len(rest)
        # The CPU share comes back [H, W, C] like the engine's: returned with it.
        return hw + cpu, list(hw_imgs) + list(cpu_imgs), rest, rest_imgs

    def _cpu_part(self, datas, keys):
        """libjpeg-turbo on the CPU threads, then one pinned upload on this decoder's CPU-share
        stream; returns the images and the event the caller's stream waits on."""
        if self._cpu_stream is None:
            self._cpu_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._cpu_stream):
            imgs = self._cpu.decode(datas, self.device, keys)
            event = torch.cuda.Event()
            event.record(self._cpu_stream)
        return imgs, event

    def _cpu_pool(self) -> ThreadPoolExecutor:
        if self._cpu_exec is None:
            self._cpu_exec = ThreadPoolExecutor(1, thread_name_prefix="packer-cpu-share")
        return self._cpu_exec

    def decode_ragged(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
                      jpeg: Optional[Sequence[tuple]] = None):
        """The batch as one :class:`gpu_ops.RaggedBatch` on this decoder's device.

        Raises:
            DecodeError: an image no decoder (libjpeg-turbo included) decodes, at its batch position.
        """
        from gpu_ops import RaggedBatch

        _check_device(device, self.device)
        if not len(datas):
            return RaggedBatch.from_list([], device=self.device)
        hw, hw_imgs, rest, rest_imgs = self._split(datas, keys, jpeg)
        images: List[Optional[torch.Tensor]] = [None] * len(datas)
        chw = [False] * len(datas)
        for i, t in zip(hw, hw_imgs):
            images[i] = t
        for i, t in zip(rest, rest_imgs):
            images[i], chw[i] = t, True
        rb = RaggedBatch.from_chw(images, chw=chw)
        if hw_imgs:  # keep the engine's buffers until the pack above has read them
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            self._keep.append((done, hw_imgs))
            while len(self._keep) > _KEEP_BATCHES:
                self._keep.popleft()[0].synchronize()
        return rb

    def decode(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
               jpeg: Optional[Sequence[tuple]] = None) -> List[torch.Tensor]:
        """The batch as ``[H, W, 3]`` uint8 CUDA tensors in the order given (nvJPEG's as views of
        its ``[C, H, W]`` output). The engine's images stay referenced by the returned tensors."""
        _check_device(device, self.device)
        hw, hw_imgs, rest, rest_imgs = self._split(datas, keys, jpeg)
        out: List[Optional[torch.Tensor]] = [None] * len(datas)
        for i, t in zip(hw, hw_imgs):
            out[i] = t
        for i, t in zip(rest, rest_imgs):
            out[i] = t.permute(1, 2, 0)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._cpu_exec is not None:
            self._cpu_exec.shutdown(wait=True)
        if self._cpu is not None:
            self._cpu.close()
        while self._keep:
            self._keep.popleft()[0].synchronize()
        self._engine.close()
        self._nvjpeg.close()


def _check_device(device, mine: torch.device) -> None:
    if device is not None and torch.device(device).type != "cuda":
        raise UsageError(f"SplitDecoder decodes on CUDA devices only, got {device!r}")


def _at(exc: DecodeError, positions: List[int], keys) -> DecodeError:
    """A sub-batch's DecodeError at its position in the whole batch."""
    pos = positions[exc.position]
    return DecodeError(pos, None if keys is None else keys[pos], exc.reason)
