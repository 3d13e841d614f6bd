"""Samplers of per-sample augmentation parameters (kornia's generate_parameters / apply split).

The kernels never draw random numbers: these classes draw them (on the CPU, from a
``torch.Generator`` if given, so runs replay exactly) and return tensors that the ops take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch

__all__ = ["RandomResizedCrop", "ResizedCropParams", "RandomColorJitter", "ColorJitterParams"]


@dataclass(frozen=True)
class ResizedCropParams:
    """``boxes``: int64 ``[B, 4]`` (top, left, height, width); ``flip``: bool ``[B]``."""

    boxes: torch.Tensor
    flip: torch.Tensor


class RandomResizedCrop:
    """Draws torchvision's RandomResizedCrop boxes (and horizontal flips) for a whole batch.

    Per sample, like ``torchvision.transforms.RandomResizedCrop.get_params``: up to 10 tries of an
    area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``; if none fits, a centred
    crop with the ratio clamped to ``ratio``. Draws are vectorised over the batch (so the random
    stream differs from torchvision's, not the distribution).

    Args:
        size: output size, kept for :meth:`__call__`.
        scale, ratio: as torchvision.
        flip_p: probability of a horizontal flip per sample.

    Example:
        >>> p = RandomResizedCrop(224).generate_parameters(4, 375, 500, generator=torch.Generator().manual_seed(0))
        >>> p.boxes.shape, p.flip.dtype
        (torch.Size([4, 4]), torch.bool)
    """

    def __init__(
        self,
        size: Union[int, Tuple[int, int]],
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip_p: float = 0.5,
    ) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.scale = scale
        self.ratio = ratio
        self.flip_p = flip_p

    def _draw_cpu(self, B: int, n: int, height, width, generator):
        """The same draws as the tensor code below (same random numbers, same formulas), with
        two torch calls and the rest in numpy: a loader's pipeline thread calls this per batch,
        and every torch call there drops and re-takes the GIL that the loader's other threads
        wait for (numpy on small arrays keeps it)."""
        u, v, ty, tx = torch.rand((4, B, n), generator=generator, dtype=torch.float64).numpy()
        flip = torch.rand((B,), generator=generator, dtype=torch.float32).numpy() < self.flip_p
        Hs = np.broadcast_to(np.asarray(height, dtype=np.float64).reshape(-1), (B,))[:, None]
        Ws = np.broadcast_to(np.asarray(width, dtype=np.float64).reshape(-1), (B,))[:, None]
        area = Hs * Ws
        target_area = area * (self.scale[0] + u * (self.scale[1] - self.scale[0]))
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(log_lo + v * (log_hi - log_lo))
        w = np.round(np.sqrt(target_area * aspect)).astype(np.int64)
        h = np.round(np.sqrt(target_area / aspect)).astype(np.int64)
        Hi, Wi = Hs.astype(np.int64), Ws.astype(np.int64)
        ok = (w > 0) & (w <= Wi) & (h > 0) & (h <= Hi)
        top = np.floor(ty * np.maximum(Hi - h + 1, 1)).astype(np.int64)
        left = np.floor(tx * np.maximum(Wi - w + 1, 1)).astype(np.int64)
        first = np.argmax(ok, axis=1)[:, None]  # first fitting try (0 if none)
        pick = lambda t: np.take_along_axis(t, first, axis=1)[:, 0]  # noqa: E731
        boxes = np.stack((pick(top), pick(left), pick(h), pick(w)), axis=1)
        Hf, Wf = Hs[:, 0], Ws[:, 0]
        in_ratio = Wf / Hf
        fw = np.where(in_ratio > self.ratio[1], np.round(Hf * self.ratio[1]), Wf).astype(np.int64)
        fh = np.where(in_ratio < self.ratio[0], np.round(Wf / self.ratio[0]), Hf).astype(np.int64)
        fallback = np.stack(((Hi[:, 0] - fh) // 2, (Wi[:, 0] - fw) // 2, fh, fw), axis=1)
        boxes = np.where(ok.any(axis=1)[:, None], boxes, fallback)
        return torch.from_numpy(np.ascontiguousarray(boxes)), torch.from_numpy(flip)

    def generate_parameters(
        self,
        batch_size: int,
        height: Union[int, torch.Tensor],
        width: Union[int, torch.Tensor],
        generator: Optional[torch.Generator] = None,
        device: Union[str, torch.device, None] = None,
        tries: int = 10,
    ) -> ResizedCropParams:
        """Draws boxes for ``batch_size`` images of ``height`` x ``width`` (ints, or ``[B]``
        tensors for images of different sizes; see also :meth:`sample`).

        The draws run on the generator's device (``device`` when no generator is given, else the
        CPU), so a CUDA generator draws on the GPU without a host round trip.

        Returns:
            :class:`ResizedCropParams` on ``device`` (default: where the draws ran).
        """
        B, n = batch_size, tries
        draw_dev = generator.device if generator is not None else torch.device(device or "cpu")
        if draw_dev.type == "cpu":
            boxes, flip = self._draw_cpu(B, n, height, width, generator)
            out_dev = device if device is not None else draw_dev
            return ResizedCropParams(boxes.to(out_dev), flip.to(out_dev))
        Hs = torch.as_tensor(height, dtype=torch.float64).to(draw_dev).expand(B)[:, None]
        Ws = torch.as_tensor(width, dtype=torch.float64).to(draw_dev).expand(B)[:, None]
        rand = lambda shape, dt=torch.float64: torch.rand(shape, generator=generator, dtype=dt, device=draw_dev)  # noqa: E731
        area = Hs * Ws
        u = rand((B, n))
        target_area = area * (self.scale[0] + u * (self.scale[1] - self.scale[0]))
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        v = rand((B, n))
        aspect = torch.exp(log_lo + v * (log_hi - log_lo))
        w = torch.round(torch.sqrt(target_area * aspect)).long()
        h = torch.round(torch.sqrt(target_area / aspect)).long()
        Hi, Wi = Hs.long(), Ws.long()
        ok = (w > 0) & (w <= Wi) & (h > 0) & (h <= Hi)
        ty = rand((B, n))
        tx = rand((B, n))
        top = torch.floor(ty * (Hi - h + 1).clamp(min=1)).long()
        left = torch.floor(tx * (Wi - w + 1).clamp(min=1)).long()
        first = torch.argmax(ok.to(torch.int8), dim=1)  # first fitting try (0 if none)
        pick = lambda t: t.gather(1, first[:, None])[:, 0]  # noqa: E731
        boxes = torch.stack((pick(top), pick(left), pick(h), pick(w)), dim=1)
        # Fallback: centred crop with the aspect ratio clamped into `ratio`, per sample.
        Hf, Wf = Hs[:, 0], Ws[:, 0]
        in_ratio = Wf / Hf
        fw = torch.where(in_ratio > self.ratio[1], torch.round(Hf * self.ratio[1]), Wf)
        fh = torch.where(in_ratio < self.ratio[0], torch.round(Wf / self.ratio[0]), Hf)
        fh, fw = fh.long(), fw.long()
        fallback = torch.stack(((Hi[:, 0] - fh) // 2, (Wi[:, 0] - fw) // 2, fh, fw), dim=1)
        boxes = torch.where(ok.any(dim=1)[:, None], boxes, fallback)
        flip = rand((B,), torch.float32) < self.flip_p
        out_dev = device if device is not None else draw_dev
        return ResizedCropParams(boxes.to(out_dev), flip.to(out_dev))

    def sample(
        self,
        sizes: torch.Tensor,
        generator: Optional[torch.Generator] = None,
        device: Union[str, torch.device, None] = None,
    ) -> ResizedCropParams:
        """Draws one box and flip per image for images of per-sample ``sizes``.

        Args:
            sizes: int ``[B, 2]`` (height, width) per image, e.g. ``RaggedBatch.sizes``.
            generator: a seeded ``torch.Generator`` (CPU or CUDA) for replayable draws.
            device: where the parameters go (and where draws run without a generator).

        Example:
            >>> sizes = torch.tensor([[375, 500], [1080, 1920]])
            >>> p = RandomResizedCrop(224).sample(sizes, torch.Generator().manual_seed(0))
            >>> bool((p.boxes[:, 2] <= sizes[:, 0]).all())
            True
        """
        sizes = torch.as_tensor(sizes)
        if sizes.dim() != 2 or sizes.shape[1] != 2:
            raise ValueError(f"RandomResizedCrop.sample: expected sizes [B, 2] (height, width), "
                             f"got {tuple(sizes.shape)}")
        return self.generate_parameters(sizes.shape[0], sizes[:, 0], sizes[:, 1], generator=generator, device=device)

    def __call__(
        self,
        images: torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        generator: Optional[torch.Generator] = None,
        **kwargs,
    ) -> torch.Tensor:
        """Draws parameters for uint8 NHWC ``images`` (or a ragged batch) and applies
        :func:`gpu_ops.resized_crop_mirror_normalize` (``kwargs`` go to it)."""
        from gpu_ops.ops import resized_crop_mirror_normalize
        from gpu_ops.ragged import RaggedBatch, is_ragged_input

        if is_ragged_input(images):
            if not isinstance(images, RaggedBatch):
                images = RaggedBatch.from_list(images)
            p = self.sample(images.sizes, generator=generator, device=images.device)
        else:
            B, H, W, _ = images.shape
            p = self.generate_parameters(B, H, W, generator=generator, device=images.device)
        return resized_crop_mirror_normalize(
            images, p.boxes, self.size, mean, std, flip=p.flip, **kwargs
        )


@dataclass(frozen=True)
class ColorJitterParams:
    """Per-sample float32 ``[B]`` factors for :func:`gpu_ops.adjust_color`."""

    brightness: torch.Tensor
    contrast: torch.Tensor
    saturation: torch.Tensor
    hue: torch.Tensor


class RandomColorJitter:
    """Draws per-sample ColorJitter factors (torchvision ranges: ``[max(0, 1-x), 1+x]`` for
    brightness, contrast and saturation, ``[-hue, hue]`` for hue).

    Example:
        >>> j = RandomColorJitter(0.4, 0.4, 0.4, 0.1)
        >>> x = torch.rand(4, 3, 8, 8)
        >>> j(x, generator=torch.Generator().manual_seed(0)).shape
        torch.Size([4, 3, 8, 8])
    """

    def __init__(
        self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0, hue: float = 0.0
    ) -> None:
        if not 0.0 <= hue <= 0.5:
            raise ValueError(f"RandomColorJitter: expected hue in [0, 0.5], got {hue}")
        self.brightness, self.contrast, self.saturation, self.hue = brightness, contrast, saturation, hue

    def generate_parameters(
        self,
        batch_size: int,
        generator: Optional[torch.Generator] = None,
        device: Union[str, torch.device, None] = None,
    ) -> ColorJitterParams:
        def draw(lo: float, hi: float) -> torch.Tensor:
            u = torch.rand((batch_size,), generator=generator)
            return (lo + u * (hi - lo)).to(device)

        return ColorJitterParams(
            draw(max(0.0, 1 - self.brightness), 1 + self.brightness),
            draw(max(0.0, 1 - self.contrast), 1 + self.contrast),
            draw(max(0.0, 1 - self.saturation), 1 + self.saturation),
            draw(-self.hue, self.hue),
        )

    def __call__(self, images: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Draws factors for ``[B, 3, H, W]`` images and applies :func:`gpu_ops.adjust_color`."""
        from gpu_ops.ops import adjust_color

        p = self.generate_parameters(images.shape[0], generator=generator, device=images.device)
        return adjust_color(
            images, brightness=p.brightness, contrast=p.contrast, saturation=p.saturation, hue=p.hue
        )
