"""Each batch split between the GPU and the CPU: ``GPULoader(..., decoder="mixed")``.

With a :class:`~readers.gpu.pipelines.TrainPipeline`, a share ``cpu_share`` of every batch's
images (spread evenly over its positions, :func:`takes`) has its crops decoded at the output size
on the CPU (:class:`~readers.gpu.cpucrops.CpuCropDecoder`, libjpeg-turbo on ``cpu_threads``
threads), and the rest is decoded whole on the GPU (the native engine,
:class:`~readers.gpu.engine.EngineDecoder`, on ``threads`` threads); the pipeline crops those and
resamples them, and only flips and normalizes the CPU's crops. Both halves run at once, and the
loader keeps two batches in flight (``submit_parts`` / ``collect``) as with either decoder alone.

Why: beside a model that leaves the GPU idle between its kernels (ResNet-18 on an H100, ~12k
img/s), the engine's decoding takes GPU time from training (it fed ResNet-18 at ~0.82x of
synthetic input, session 12), and crops on the CPU alone are CPU-bound below that rate on 16 cores
(~0.62x). A share of each batch on the CPU takes that share of the decoding off the GPU and uses
cores the engine leaves idle. For a model that keeps the GPU busy by itself (ResNet-50) all of it
on the CPU is best (``decoder="cpu-crops"``, 0.995x of synthetic); see docs/gpu.md, "Which feed
for which model", for the measured shares.

Where the images are decoded whole (another pipeline, or an image with an EXIF orientation still
to apply) the GPU decoder takes them all. A record that does not decode raises
:class:`~readers.gpu.decoders.DecodeError` with its position in the whole batch, whichever half
had it (the loader's ``RecordError`` names it, or ``on_error="skip"`` leaves it out).

Pixels: the CPU's crops are resampled from the decoded crop (at the DCT scale chosen), the GPU's
from the whole image, with the same boxes and flips; the two differ by a few levels at most (see
readers/gpu/cpucrops.py).

Example:
    >>> loader = GPULoader("train.lmdb", TrainPipeline(224, dtype=torch.bfloat16, channels_last=True),
    ...                    batch_size=256, shuffle=True, decoder=MixedDecoder("cuda", threads=12,
    ...                    cpu_share=0.3))  # doctest: +SKIP
"""
from __future__ import annotations

import functools
from typing import Callable, List, NamedTuple, Optional, Sequence

import torch

from gpu_ops import RaggedBatch
from packer.core.errors import UsageError
from readers.gpu.cpucrops import CpuCropDecoder
from readers.gpu.decoders import DecodeError, get_decoder, register_decoder

__all__ = ["MixedDecoder", "takes", "DEFAULT_CPU_SHARE"]

#: The share of each batch ``decoder="mixed"`` decodes on the CPU.
DEFAULT_CPU_SHARE = 0.3


def takes(i: int, share: float) -> bool:
    """Whether position ``i`` falls to the part of a split that takes ``share`` of all positions,
    spread evenly (``floor((i + 1) * share) > floor(i * share)``: every third for 1/3)."""
    return int((i + 1) * share) > int(i * share)


class _Half(NamedTuple):
    """One decoder's part of a submitted batch: the batch positions and what gives its
    RaggedBatch (the decoder's ``collect`` of what ``submit_parts`` queued, or for a decoder
    without that protocol its ``decode_ragged``, run at collect time)."""
    positions: List[int]
    get: Callable[[], RaggedBatch]


@register_decoder
class MixedDecoder:
    """A share of each batch's crops decoded on the CPU, the rest decoded whole on the GPU (see
    the module docstring).

    Args:
        device: the CUDA device (``"cpu"`` with ``gpu="turbojpeg"``: both halves on the CPU).
        threads: the GPU decoder's threads (the engine's host threads).
        cpu_share: the share of each batch's images cropped on the CPU, 0 to 1.
        cpu_threads: the CPU crops' decode threads (default: ``threads``).
        gpu: the decoder of the rest, a name or a decoder object (default ``"engine"``).

    Raises:
        UsageError: ``cpu_share`` outside [0, 1].
        DependencyError: the GPU decoder is not available here.
    """

    name = "mixed"

    def __init__(self, device="cuda", threads: int = 4, cpu_share: float = DEFAULT_CPU_SHARE,
                 cpu_threads: Optional[int] = None, gpu="engine"):
        if not 0.0 <= float(cpu_share) <= 1.0:
            raise UsageError(f"mixed decoder: cpu_share must be in [0, 1], got {cpu_share!r}")
        self.device = torch.device(device)
        self.cpu_share = float(cpu_share)
        self.threads = int(threads)
        self.gpu = get_decoder(gpu, self.device, self.threads)
        self.cpu = CpuCropDecoder(int(cpu_threads or threads), self.device)

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "MixedDecoder":
        """The decoder ``get_decoder("mixed", device, threads)`` gives (``cpu_share`` 0.3, the CPU
        crops on as many threads as the engine)."""
        return cls(device, threads)

    @property
    def supports_roi(self) -> bool:
        """The loader draws the crop boxes before decoding once a TrainPipeline is bound."""
        return self.cpu.supports_roi

    def bind_pipeline(self, pipeline, device=None) -> None:
        """Called by ``GPULoader``: a :class:`TrainPipeline`'s crops are split (see
        :meth:`CpuCropDecoder.bind_pipeline`); any other pipeline gets whole images from the GPU
        decoder."""
        if device is not None:
            self.device = torch.device(device)
        self.cpu.bind_pipeline(pipeline, device)

    def window_positions(self, n: int) -> List[bool]:
        """Which of a batch's ``n`` images are cropped on the CPU (decoded as windows): ``cpu_share``
        of them, spread evenly (:func:`takes`)."""
        return [takes(i, self.cpu_share) for i in range(n)]

    # -- decode ----------------------------------------------------------------------------------
    def submit_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None) -> List[_Half]:
        """Queues the batch (``parts``: ``(buffer, offset, length)`` rows into ``buffers``) on both
        decoders and returns at once; :meth:`collect` gives it. ``regions``: the crop box of each
        image the CPU crops, None for each the GPU decodes whole (the loader's ROI plan, from
        :meth:`window_positions`)."""
        rows = parts.tolist() if isinstance(parts, torch.Tensor) else [tuple(p) for p in parts]
        n = len(rows)
        crop = [i for i in range(n) if regions is not None and regions[i] is not None and self.cpu.size is not None]
        whole = sorted(set(range(n)) - set(crop))
        halves = []
        for positions, dec, windows in ((whole, self.gpu, None), (crop, self.cpu, regions)):
            if not positions:
                continue
            sub_rows = [rows[i] for i in positions]
            sub_keys = [keys[i] for i in positions] if keys is not None else None
            sub_regions = [windows[i] for i in positions] if windows is not None else None
            if callable(getattr(dec, "submit_parts", None)):
                pending = dec.submit_parts(buffers, sub_rows, sub_keys, sub_regions)
                halves.append(_Half(positions, functools.partial(dec.collect, pending)))
            else:  # a decoder without an asynchronous protocol (turbojpeg): decoded at collect time
                datas = [buffers[b][o:o + m] for b, o, m in sub_rows]
                halves.append(_Half(positions, functools.partial(dec.decode_ragged, datas, self.device, sub_keys)))
        return halves

    def collect(self, pending: List[_Half]) -> RaggedBatch:
        """The submitted batch as one HWC :class:`gpu_ops.RaggedBatch` in batch order (waits for
        both halves; the CPU crops' copy to the device is queued on the current stream).

        Raises:
            DecodeError: a record that does not decode (its position in the batch and key).
        """
        got, failure = [], None
        for h in pending:  # both halves waited for before raising
            try:
                got.append((h.positions, h.get()))
            except DecodeError as exc:
                failure = failure or DecodeError(h.positions[exc.position], exc.key, exc.reason)
        if failure is not None:
            raise failure
        return _merge(got)

    def decode_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None) -> RaggedBatch:
        """:meth:`submit_parts` and :meth:`collect` in one call."""
        return self.collect(self.submit_parts(buffers, parts, keys, regions))

    def decode_ragged(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
                      regions=None) -> RaggedBatch:
        """The batch (bytes or CPU uint8 tensors) as one HWC :class:`RaggedBatch` (crops where
        ``regions`` names a box, whole images elsewhere)."""
        bufs = [torch.frombuffer(bytearray(d), dtype=torch.uint8) if not isinstance(d, torch.Tensor)
                else d.reshape(-1) for d in datas]
        return self.decode_parts(bufs, [(i, 0, b.numel()) for i, b in enumerate(bufs)], keys, regions)

    def decode(self, datas: Sequence, device=None, keys: Optional[Sequence[str]] = None,
               regions=None) -> List[torch.Tensor]:
        """``[H, W, 3]`` uint8 images: each region's crop at the output size, whole images where
        the region is None (or no regions are given)."""
        return self.decode_ragged(datas, device, keys, regions).unbind() if len(datas) else []

    def close(self) -> None:
        for dec in (self.gpu, self.cpu):
            close = getattr(dec, "close", None)
            if close:
                close()


def _merge(halves: List[tuple]) -> RaggedBatch:
    """``(positions, RaggedBatch)`` halves -> one RaggedBatch in batch order: the halves' data
    back to back (one device copy), the index rows moved to their positions (offsets shifted)."""
    if len(halves) == 1:
        return halves[0][1]
    first = halves[0][1]
    for _, rb in halves[1:]:
        if (rb.layout, rb.channels, rb.dtype, rb.device) != (first.layout, first.channels, first.dtype, first.device):
            raise ValueError(f"mixed decoder: halves differ: {rb.layout}/{rb.channels}/{rb.dtype}/{rb.device} and "
                             f"{first.layout}/{first.channels}/{first.dtype}/{first.device}")
    indexes, sizes, order, offset = [], [], [], 0
    for positions, rb in halves:
        idx = rb.index.clone()
        idx[:, 0] += offset
        indexes.append(idx)
        sizes.append(rb.sizes)
        order += positions
        offset += rb.data.numel()
    perm = torch.empty(len(order), dtype=torch.int64)
    perm[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(order))
    data = torch.cat([rb.data for _, rb in halves])
    index = torch.cat(indexes)[perm.to(first.device)]
    return RaggedBatch(data, index, torch.cat(sizes)[perm].contiguous(), first.channels, first.layout)
