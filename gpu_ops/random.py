"""Samplers of per-sample augmentation parameters (kornia's generate_parameters / apply split).

The kernels never draw random numbers: these classes draw them (on the CPU, from a
``torch.Generator`` if given, so runs replay exactly) and return tensors that the ops take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

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

    def generate_parameters(
        self,
        batch_size: int,
        height: int,
        width: int,
        generator: Optional[torch.Generator] = None,
        device: Union[str, torch.device, None] = None,
        tries: int = 10,
    ) -> ResizedCropParams:
        """Draws boxes for ``batch_size`` images of ``height`` x ``width``.

        Returns:
            :class:`ResizedCropParams` on ``device`` (default CPU).
        """
        B, n = batch_size, tries
        area = float(height * width)
        u = torch.rand((B, n), generator=generator, dtype=torch.float64)
        target_area = area * (self.scale[0] + u * (self.scale[1] - self.scale[0]))
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        v = torch.rand((B, n), generator=generator, dtype=torch.float64)
        aspect = torch.exp(log_lo + v * (log_hi - log_lo))
        w = torch.round(torch.sqrt(target_area * aspect)).long()
        h = torch.round(torch.sqrt(target_area / aspect)).long()
        ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        ty = torch.rand((B, n), generator=generator, dtype=torch.float64)
        tx = torch.rand((B, n), generator=generator, dtype=torch.float64)
        top = torch.floor(ty * (height - h + 1).clamp(min=1)).long()
        left = torch.floor(tx * (width - w + 1).clamp(min=1)).long()
        first = torch.argmax(ok.to(torch.int8), dim=1)  # first fitting try (0 if none)
        pick = lambda t: t.gather(1, first[:, None])[:, 0]  # noqa: E731
        boxes = torch.stack((pick(top), pick(left), pick(h), pick(w)), dim=1)
        # Fallback: centred crop with the aspect ratio clamped into `ratio`.
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            fw, fh = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            fh, fw = height, int(round(height * self.ratio[1]))
        else:
            fw, fh = width, height
        fallback = torch.tensor([(height - fh) // 2, (width - fw) // 2, fh, fw], dtype=torch.int64)
        boxes = torch.where(ok.any(dim=1)[:, None], boxes, fallback)
        flip = torch.rand((B,), generator=generator) < self.flip_p
        return ResizedCropParams(boxes.to(device), flip.to(device))

    def __call__(
        self,
        images: torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        generator: Optional[torch.Generator] = None,
        **kwargs,
    ) -> torch.Tensor:
        """Draws parameters for uint8 NHWC ``images`` and applies
        :func:`gpu_ops.resized_crop_mirror_normalize` (``kwargs`` go to it)."""
        from gpu_ops.ops import resized_crop_mirror_normalize

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
