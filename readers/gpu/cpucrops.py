"""Crops decoded on the CPU for ``GPULoader(..., decoder="cpu-crops")``: the GPU does no decoding.

With a :class:`~readers.gpu.pipelines.TrainPipeline` the loader draws each batch's crop boxes and
flips from the stored sizes before decoding (as for ROI decode, :mod:`readers.gpu.roi`); this
decoder then decodes every crop straight to the pipeline's output size with libjpeg-turbo on
``threads`` CPU threads (:func:`readers.crops.decode_crops`: the smallest DCT scale that still
covers the crop, only the rows and columns the crop touches, the resize in the same pass, the GIL
released), into one pinned batch, one copy to the device. A batch is cut into tasks of a few
records and the loader keeps two batches in flight (``submit_parts`` / ``collect``, as with the
native engine), so the threads decode the next batch while one finishes: one batch at a time on
all the threads left them idle at each batch's end (1.39x more images/s on an H100 at 12 threads;
:func:`readers.loader.default_threads_per_batch` measured the same for the CPU loader). The
pipeline then only flips and normalizes (its resampling of a crop already at the output size is
the identity). This is FFCV's split of the work: for a model that keeps the GPU busy by itself,
any decoding on the GPU takes GPU time from it (ResNet-50 on an H100, session 12: this decoder fed
it at 0.995-0.996x of synthetic input, the GPU engine at 0.93x; see docs/gpu.md, "Which feed for
which model").

Pixels: the crop is resampled on the CPU from the decoded crop (at the DCT scale chosen), with the
filter clipped to the box, as :class:`readers.RandomResizedCrop` does; the GPU decoders' full
decode resamples the whole image with the same box, so the two differ by the DCT-scale decode and
at the box borders, by a few levels.

With another pipeline (:class:`~readers.gpu.pipelines.ValPipeline`, detection, ``None``) or images
with an EXIF orientation still to apply, whole images are decoded, as ``decoder="turbojpeg"``. A
box reaching outside its JPEG (drawn from a stored size that is not the JPEG's: a store edited by
hand) is clipped to the image, with a warning naming the record, as the native engine clips its
windows; a record that does not decode raises :class:`~readers.gpu.decoders.DecodeError` (the
loader's ``RecordError`` naming it, or a skip with ``on_error="skip"``).

Example:
    >>> loader = GPULoader("train.lmdb", TrainPipeline(224, dtype=torch.bfloat16, channels_last=True),
    ...                    batch_size=256, shuffle=True, decoder="cpu-crops", threads=12)  # doctest: +SKIP
"""
from __future__ import annotations

import logging
from typing import List, NamedTuple, Optional, Sequence

import numpy as np
import torch

from gpu_ops import RaggedBatch
from packer.core.integrity import header_dimensions
from readers.crops import decode_crops, pack_bytes
from readers.gpu.decoders import DecodeError, as_array, register_decoder
from readers.gpu.pipelines import TrainPipeline
from readers.gpu.turbo import TurboJpegDecoder

log = logging.getLogger(__name__)

__all__ = ["CpuCropDecoder"]


class _Crops(NamedTuple):
    """Crops queued on the decode threads: the output, the boxes, ``(first position, future)``."""
    out: torch.Tensor
    boxes: torch.Tensor
    tasks: list


class _Submitted(NamedTuple):
    """A batch handed to :meth:`CpuCropDecoder.submit_parts`: its queued crops, or ``done``."""
    crops: Optional[_Crops] = None
    buffers: Optional[Sequence[torch.Tensor]] = None
    parts: Optional[Sequence] = None
    keys: Optional[Sequence[str]] = None
    done: Optional[RaggedBatch] = None


@register_decoder
class CpuCropDecoder(TurboJpegDecoder):
    """libjpeg-turbo decoding the train pipeline's crops at its output size on the CPU (see the
    module docstring); whole images otherwise, as :class:`TurboJpegDecoder`.

    Args:
        threads: CPU decode threads (the GIL released).
        device: where the batches go (``GPULoader`` passes its device).
        dct: ``"exact"`` (libjpeg's ISLOW IDCT) or ``"fast"`` (IFAST, at DCT scale 1 only).
    """

    name = "cpu-crops"

    def __init__(self, threads: int = 4, device="cpu", dct: str = "exact"):
        super().__init__(threads)
        self.device = torch.device(device)
        self.dct = dct
        self.size: Optional[tuple] = None  # the pipeline's output size, once bound
        self.antialias = True

    @classmethod
    def from_settings(cls, device: torch.device, threads: int) -> "CpuCropDecoder":
        """The decoder ``get_decoder("cpu-crops", device, threads)`` gives."""
        return cls(threads, device)

    @property
    def supports_roi(self) -> bool:
        """Crops are decoded (the loader draws the boxes first) once a TrainPipeline is bound."""
        return self.size is not None

    def bind_pipeline(self, pipeline, device=None) -> None:
        """Called by ``GPULoader`` with its pipeline and device: a :class:`TrainPipeline`'s crops
        are decoded at its output size, with its antialias setting, and go to ``device`` (a
        decoder object made for another device follows the loader's); any other pipeline gets
        whole images."""
        if device is not None:
            self.device = torch.device(device)
        if isinstance(pipeline, TrainPipeline):
            self.size, self.antialias = pipeline.output_size, bool(pipeline.antialias)
        else:
            self.size = None
            log.info("cpu-crops: %s is not a TrainPipeline: whole images are decoded (as turbojpeg)",
                     type(pipeline).__name__)

    def _start(self, records, regions: Sequence[tuple]) -> "_Crops":
        """Queues the crops of the boxes ``regions`` on the decode threads and returns at once.
        ``records``: ``(data, spans)`` pairs, the records back to back in batch order (``spans``
        ``[n, 2]`` int64 start/end in ``data``), as :func:`~readers.crops.decode_crops` takes
        them; each is cut into tasks of a few records, one ``decode_crops`` call on one thread
        each, so that the next batch's tasks fill the threads a finishing batch leaves idle."""
        h, w = self.size
        out = torch.empty((len(regions), h, w, 3), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        boxes = torch.tensor([list(r) for r in regions], dtype=torch.float64).reshape(-1, 4)
        flips = torch.zeros(len(regions), dtype=torch.bool)  # the pipeline flips
        step = max(1, -(-len(regions) // (2 * self.threads)))  # about two tasks per thread a batch
        pool, tasks, first = self._executor(), [], 0
        for data, spans in records:
            for a in range(0, len(spans), step):
                lo, hi = first + a, first + min(a + step, len(spans))
                tasks.append((lo, pool.submit(decode_crops, (data, spans[a:a + step]), boxes[lo:hi], flips[lo:hi],
                                              (h, w), layout="HWC", out=out[lo:hi], antialias=self.antialias,
                                              clip_to_box=True, dct=self.dct, threads=1)))
            first += len(spans)
        return _Crops(out, boxes, tasks)

    def _finish(self, crops: "_Crops", keys: Optional[Sequence[str]], record) -> torch.Tensor:
        """The ``[B, h, w, 3]`` uint8 host crops (pinned for CUDA) of :meth:`_start`, once every
        task is done; ``record(i)``: sample ``i``'s bytes (for a second try, :meth:`_clipped`).

        Raises:
            DecodeError: a record that does not decode (its position and key).
        """
        errors, failure = [], None
        for first, task in crops.tasks:  # every task waited for before raising: they write into out
            try:
                _, errs = task.result()
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others finish
                failure = failure or exc
                continue
            errors += [(first + pos, msg) for pos, msg in errs]
        if failure is not None:
            raise failure
        out, boxes = crops.out, crops.boxes
        for pos, msg in sorted(errors):
            key = None if keys is None else keys[pos]
            if not self._clipped(record(pos), boxes[pos], out[pos:pos + 1], key):
                raise DecodeError(pos, key, msg)
        return out

    def _clipped(self, data: np.ndarray, box: torch.Tensor, out: torch.Tensor, key) -> bool:
        """A box drawn from a stored size that is not the JPEG's (a store edited by hand, say):
        the crop of the box clipped to the image, into ``out``, with a warning naming the record,
        as the native engine clips its windows. False where the JPEG's size is unknown or the box
        fits it (the record is damaged)."""
        size = header_dimensions(data.tobytes(), "jpeg")
        if size is None:
            return False
        W, H = size

        def inside(start: float, length: float, n: int) -> tuple:  # (start, length) of the span within [0, n)
            a, b = max(start, 0.0), min(start + length, float(n))
            if b - a < 1.0:  # nothing of the box is inside: the nearest pixel
                a = min(max(start, 0.0), n - 1.0)
                b = a + 1.0
            return a, b - a

        (top, bh), (left, bw) = inside(float(box[0]), float(box[2]), H), inside(float(box[1]), float(box[3]), W)
        fit = torch.tensor([[top, left, bh, bw]], dtype=torch.float64)
        if torch.equal(fit[0], box):
            return False
        _, errs = decode_crops([data], fit, torch.zeros(1, dtype=torch.bool), self.size, layout="HWC", out=out,
                               antialias=self.antialias, clip_to_box=True, dct=self.dct, threads=1)
        if errs:
            return False
        log.warning("cpu-crops: %s: crop box %s is not inside the %dx%d JPEG (its stored size is not the "
                    "JPEG's); cropped %s instead", key, [round(v, 1) for v in box.tolist()], W, H,
                    [round(v, 1) for v in fit[0].tolist()])
        return True

    def submit_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None) -> "_Submitted":
        """Queues the batch's crops (``parts``: ``(buffer, offset, length)`` rows in ``buffers``,
        as the loader reads them; ``regions``: the crop boxes) on the decode threads and returns at
        once; :meth:`collect` gives its batch. The loader keeps two batches in flight, so the next
        batch decodes while this one's last crops finish and while it is handed on (as with the
        native engine). Whole images (no regions, or some None) are decoded now."""
        whole = regions is None or self.size is None or not len(parts)
        if whole or any(r is None for r in regions):  # whole images: all, or some beside crops
            datas = [buffers[b][o:o + n] for b, o, n in parts]
            if whole:
                return _Submitted(done=self.decode_ragged(datas, self.device, keys))
            images = self.decode(datas, self.device, keys, regions=regions)
            return _Submitted(done=RaggedBatch.from_list(images, device=self.device))
        records, first = [], 0  # the records read into one buffer are decoded in place
        while first < len(parts):
            end = first
            while end < len(parts) and parts[end][0] == parts[first][0]:
                end += 1
            spans = torch.tensor([[o, o + n] for _, o, n in parts[first:end]], dtype=torch.int64)
            records.append((buffers[parts[first][0]], spans))
            first = end
        return _Submitted(self._start(records, regions), buffers, parts, keys)

    def collect(self, pending: "_Submitted") -> RaggedBatch:
        """The submitted batch as one HWC :class:`gpu_ops.RaggedBatch` on the device (waits for
        its crops; the copy to the device is queued on the current stream).

        Raises:
            DecodeError: a record that does not decode (its position and key).
        """
        if pending.crops is None:
            return pending.done
        buffers, parts = pending.buffers, pending.parts
        host = self._finish(pending.crops, pending.keys,
                            lambda i: buffers[parts[i][0]][parts[i][1]:parts[i][1] + parts[i][2]].numpy())
        return RaggedBatch.from_dense(host if self.device.type == "cpu" else host.to(self.device, non_blocking=True))

    def decode_parts(self, buffers: Sequence[torch.Tensor], parts, keys: Optional[Sequence[str]] = None,
                     regions=None) -> RaggedBatch:
        """The batch's records (see :meth:`submit_parts`) as one HWC :class:`gpu_ops.RaggedBatch`
        on the device: each region (a crop box) decoded to the output size; whole images where
        there are no regions.

        Raises:
            DecodeError: a record that does not decode (its position and key).
        """
        return self.collect(self.submit_parts(buffers, parts, keys, regions))

    def decode(self, datas: Sequence, device, keys: Optional[Sequence[str]] = None,
               regions: Optional[Sequence[Optional[tuple]]] = None) -> List[torch.Tensor]:
        """``[H, W, 3]`` uint8 images on ``device``: each region's crop at the output size, whole
        images where the region is None (or no regions are given)."""
        if regions is None or self.size is None or all(r is None for r in regions):
            return super().decode(datas, device, keys)
        device = torch.device(device)
        arrays: List[Optional[np.ndarray]] = [None] * len(datas)
        crop = [i for i, r in enumerate(regions) if r is not None]
        try:
            data, offsets = pack_bytes([as_array(datas[i]) for i in crop])
            started = self._start([(data, torch.stack((offsets[:-1], offsets[1:]), dim=1))], [regions[i] for i in crop])
            host = self._finish(started, [keys[i] for i in crop] if keys is not None else None,
                                lambda j: as_array(datas[crop[j]]))
        except DecodeError as exc:
            raise DecodeError(crop[exc.position], exc.key, exc.reason) from exc
        for j, i in enumerate(crop):
            arrays[i] = host[j].numpy()
        whole = [i for i, r in enumerate(regions) if r is None]
        try:
            for i, arr in zip(whole, self.decode_host([datas[i] for i in whole],
                                                      [keys[i] for i in whole] if keys is not None else None)):
                arrays[i] = arr
        except DecodeError as exc:
            raise DecodeError(whole[exc.position], exc.key, exc.reason) from exc
        return self._to_device(arrays, device)
