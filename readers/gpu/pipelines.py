"""GPU pipelines: decoded images of different sizes -> the network's input batch, one launch each.

Each pipeline is a small configured object called as ``pipeline(images, generator=..., labels=...)``
with ``images`` a list of ``[H, W, C]`` uint8 tensors (decoder output, any sizes) or a
:class:`gpu_ops.RaggedBatch`. Random parameters are drawn on the CPU from ``generator`` (so a seed
replays a run exactly, and the CPU and CUDA paths see the same draws) and copied to the device
without blocking. The same code runs on CPU tensors (CPU kernels), which is how the tests check it.

* :class:`TrainPipeline`: RandomResizedCrop (torchvision's scale / ratio) + horizontal flip
  (+ optional colour jitter) + normalize -> float32 / float16 / bfloat16 NCHW (or channels_last).
* :class:`ValPipeline`: resize the shorter side + centre crop + normalize, in one resampling pass.
* :class:`DetectionPipeline`: keep-ratio rescale to e.g. (1333, 800), normalize, pad to a multiple of
  32, with mmdetection's per-image metadata and the label boxes rescaled.

Example:
    >>> pipe = TrainPipeline(224, dtype=torch.bfloat16, channels_last=True)
    >>> x = pipe(decoded_images, generator=torch.Generator().manual_seed(0))  # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

import gpu_ops
from gpu_ops.ragged import RaggedBatch, to_device

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "TrainPipeline", "ValPipeline", "DetectionPipeline",
           "DetectionBatch", "boxes_to_original"]

#: ImageNet statistics in pixel units (0..255), as torchvision's weights use them.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def _ragged(images) -> RaggedBatch:
    return images if isinstance(images, RaggedBatch) else RaggedBatch.from_list(images)


def _size2(size) -> Tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@dataclass
class TrainPipeline:
    """RandomResizedCrop + flip (+ colour jitter) + normalize, per-sample parameters.

    Args:
        size: output (height, width) or one int.
        scale, ratio: RandomResizedCrop area fraction and aspect ratio ranges (torchvision's).
        flip_p: probability of a horizontal flip.
        color_jitter: ``(brightness, contrast, saturation, hue)`` as torchvision's ColorJitter, or
            ``None``. Applied in that fixed order (one extra pass over the output).
        mean, std: per channel, pixel units.
        dtype: float32, float16 or bfloat16 (float64 too).
        channels_last: return a channels_last tensor.
        antialias: widen the filter when downscaling (torchvision's default for tensors).
    """

    size: Union[int, Tuple[int, int]] = 224
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip_p: float = 0.5
    color_jitter: Optional[Tuple[float, float, float, float]] = None
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    antialias: bool = True

    def __post_init__(self):
        self._rrc = gpu_ops.RandomResizedCrop(_size2(self.size), self.scale, self.ratio, self.flip_p)
        self._jitter = gpu_ops.RandomColorJitter(*self.color_jitter) if self.color_jitter else None

    @property
    def output_size(self) -> Tuple[int, int]:
        """``(height, width)`` of the images it returns (``size`` as a pair)."""
        return _size2(self.size)

    def sample(self, sizes: torch.Tensor, generator: Optional[torch.Generator] = None):
        """The crop boxes and flips for images of ``sizes`` [B, 2], drawn as ``__call__`` draws them
        (ROI decode draws them from the stored sizes before decoding: :mod:`readers.gpu.roi`)."""
        return self._rrc.sample(sizes, generator=generator)

    def __call__(self, images, generator: Optional[torch.Generator] = None, labels=None,
                 params=None) -> torch.Tensor:
        """``[B, 3, H, W]`` of ``dtype`` from decoded images (list or RaggedBatch); ``params``:
        boxes and flips drawn already (:meth:`sample`), else drawn here from ``generator``."""
        rb = _ragged(images)
        dev = rb.device
        p = params if params is not None else self._rrc.sample(rb.sizes, generator=generator)
        boxes, flip = to_device(p.boxes, dev), to_device(p.flip, dev)
        size = _size2(self.size)
        if self._jitter is None:
            x = gpu_ops.resized_crop_mirror_normalize(rb, boxes, size, list(self.mean), list(self.std), flip=flip,
                                                      dtype=self.dtype, antialias=self.antialias)
            return _layout(x, self.channels_last)
        x = gpu_ops.resized_crop_mirror_normalize(rb, boxes, size, 0.0, 255.0, flip=flip, dtype=torch.float32,
                                                  antialias=self.antialias)
        j = self._jitter.generate_parameters(len(rb), generator=generator)
        x = gpu_ops.adjust_color(x, brightness=to_device(j.brightness, dev), contrast=to_device(j.contrast, dev),
                                 saturation=to_device(j.saturation, dev), hue=to_device(j.hue, dev))
        C = x.shape[1]
        mean = torch.tensor([m / 255.0 for m in self.mean], dtype=torch.float32).view(1, C, 1, 1)
        inv = torch.tensor([255.0 / s for s in self.std], dtype=torch.float32).view(1, C, 1, 1)
        x = ((x - to_device(mean, dev)) * to_device(inv, dev)).to(self.dtype)
        return _layout(x, self.channels_last)


@dataclass
class ValPipeline:
    """Resize the shorter side to ``resize`` + centre crop ``crop`` + normalize (torchvision's
    ``Resize(resize) + CenterCrop(crop)``), fused into one resampling of the source window that
    the crop covers (the window is rounded to whole source pixels).

    Args:
        resize: shorter side after resizing (e.g. 256).
        crop: output (height, width) or one int (e.g. 224).
        mean, std, dtype, channels_last, antialias: as :class:`TrainPipeline`.
    """

    resize: int = 256
    crop: Union[int, Tuple[int, int]] = 224
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    antialias: bool = True

    def boxes(self, sizes: torch.Tensor) -> torch.Tensor:
        """Source windows ``[B, 4]`` (top, left, height, width) for images of ``sizes`` [B, 2]."""
        ch, cw = _size2(self.crop)
        rows = []
        for h, w in sizes.tolist():
            # torchvision's Resize(int): the shorter side becomes `resize`, the longer one is truncated.
            if h <= w:
                nh, nw = self.resize, int(self.resize * w / h)
            else:
                nh, nw = int(self.resize * h / w), self.resize
            sy, sx = h / nh, w / nw
            top, left = int(round((nh - ch) / 2.0)), int(round((nw - cw) / 2.0))
            rows.append([int(round(top * sy)), int(round(left * sx)), max(1, int(round(ch * sy))),
                         max(1, int(round(cw * sx)))])
        return torch.tensor(rows, dtype=torch.int64).reshape(-1, 4)

    def __call__(self, images, generator: Optional[torch.Generator] = None, labels=None) -> torch.Tensor:
        rb = _ragged(images)
        boxes = to_device(self.boxes(rb.sizes), rb.device)
        x = gpu_ops.resized_crop_mirror_normalize(rb, boxes, _size2(self.crop), list(self.mean), list(self.std),
                                                  dtype=self.dtype, antialias=self.antialias)
        return _layout(x, self.channels_last)


@dataclass
class DetectionBatch:
    """Output of :class:`DetectionPipeline`.

    Attributes:
        images: ``[B, 3, Hp, Wp]`` normalised, padded (bottom and right) to a multiple of 32.
        metas: per image, mmdetection's ``img_metas``: ``ori_shape`` (h, w), ``img_shape`` (h, w)
            after rescaling, ``pad_shape`` and ``batch_input_shape`` (Hp, Wp), ``scale_factor``
            (w_scale, h_scale), ``flip`` (False), plus ``key`` / ``index`` when known.
        bboxes: per image, float32 ``[N, 4]`` x1, y1, x2, y2 in pixels of the RESCALED image (from
            YOLO label rows), or ``None`` without box labels.
        labels: per image, int64 ``[N]`` class ids, or ``None``.
    """

    images: torch.Tensor
    metas: List[dict]
    bboxes: Optional[List[torch.Tensor]] = None
    labels: Optional[List[torch.Tensor]] = None

    def record_stream(self, stream) -> None:
        self.images.record_stream(stream)


def boxes_to_original(bboxes: torch.Tensor, meta: dict) -> torch.Tensor:
    """Boxes (x1, y1, x2, y2) predicted on the rescaled image -> pixels of the original image."""
    sw, sh = meta["scale_factor"]
    scale = torch.tensor([sw, sh, sw, sh], dtype=bboxes.dtype, device=bboxes.device)
    return bboxes / scale


@dataclass
class DetectionPipeline:
    """mmdetection's test pipeline on the GPU: ``Resize(scale, keep_ratio=True)``, normalize,
    ``Pad(size_divisor=32)``; one launch for the whole ragged batch.

    Args:
        scale: (long edge, short edge) limits as mmdetection's ``scale=(1333, 800)``; with
            ``keep_ratio=False`` the exact (width, height).
        keep_ratio: keep the aspect ratio (scale factor ``min(1333 / long, 800 / short)``).
        pad_multiple: pad the batch to a multiple of this (mmdetection's ``pad_size_divisor``).
        pad_value: padding value in output (normalised) units.
        mean, std, dtype, channels_last: as :class:`TrainPipeline`.
        antialias: off by default, as OpenCV's INTER_LINEAR (mmcv.imresize) that models were
            trained with.
    """

    scale: Tuple[int, int] = (1333, 800)
    keep_ratio: bool = True
    pad_multiple: int = 32
    pad_value: float = 0.0
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    antialias: bool = False

    def rescaled_sizes(self, sizes: torch.Tensor) -> torch.Tensor:
        """``[B, 2]`` (height, width) after rescaling images of ``sizes`` (mmcv.rescale_size)."""
        out = []
        long_e, short_e = max(self.scale), min(self.scale)
        for h, w in sizes.tolist():
            if self.keep_ratio:
                f = min(long_e / max(h, w), short_e / min(h, w))
                out.append([int(h * f + 0.5), int(w * f + 0.5)])
            else:
                out.append([int(self.scale[1]), int(self.scale[0])])
        return torch.tensor(out, dtype=torch.int64).reshape(-1, 2)

    def __call__(self, images, generator: Optional[torch.Generator] = None, labels=None,
                 keys: Optional[Sequence[str]] = None, indices: Optional[Sequence[int]] = None) -> DetectionBatch:
        rb = _ragged(images)
        B, dev = len(rb), rb.device
        new = self.rescaled_sizes(rb.sizes)
        full = torch.cat([torch.zeros(B, 2, dtype=torch.int64), rb.sizes], dim=1)
        x = gpu_ops.resized_crop_mirror_normalize(rb, to_device(full, dev), None, list(self.mean), list(self.std),
                                                  sizes=new, dtype=self.dtype, antialias=self.antialias,
                                                  pad_multiple=self.pad_multiple, fill=self.pad_value)
        Hp, Wp = int(x.shape[2]), int(x.shape[3])
        metas = []
        for b, ((h, w), (nh, nw)) in enumerate(zip(rb.sizes.tolist(), new.tolist())):
            m = {"ori_shape": (h, w), "img_shape": (nh, nw), "pad_shape": (Hp, Wp), "batch_input_shape": (Hp, Wp),
                 "scale_factor": (nw / w, nh / h), "flip": False, "flip_direction": None}
            if keys is not None:
                m["key"] = keys[b]
            if indices is not None:
                m["index"] = int(indices[b])
            metas.append(m)
        bboxes = cls = None
        if labels is not None and any(isinstance(lab, (np.ndarray, torch.Tensor)) for lab in labels):
            bboxes, cls = [], []
            for lab, (nh, nw) in zip(labels, new.tolist()):
                rows = torch.as_tensor(np.asarray(lab if lab is not None else np.zeros((0, 5)), dtype=np.float32))
                rows = rows.reshape(-1, 5)
                cx, cy, bw, bh = rows[:, 1] * nw, rows[:, 2] * nh, rows[:, 3] * nw, rows[:, 4] * nh
                bboxes.append(torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), dim=1))
                cls.append(rows[:, 0].to(torch.int64))
        return DetectionBatch(_layout(x, self.channels_last), metas, bboxes, cls)
