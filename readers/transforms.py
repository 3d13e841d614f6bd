"""Small picklable image transforms for :class:`readers.StoreDataset` (``transform=``).

They work on the uint8 tensors the dataset returns (``CHW`` or ``HWC``) and survive pickling into
DataLoader workers under fork and spawn (no lambdas). Normalized ``cx cy w h`` boxes stay right
through a resize, so a fixed-size resize is all ``collate_boxes`` needs::

    ds = StoreDataset("train.lmdb", min_size=256, transform=Resize((256, 256)))
"""
from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F

from packer.core.errors import UsageError


class Resize:
    """Resize a uint8 image tensor to ``size`` (``(height, width)``, or one int for a square).

    Bilinear with antialiasing when downscaling (``F.interpolate(..., antialias=True)``, what
    torchvision's ``Resize`` does on tensors), rounded back to uint8. The aspect ratio is not kept.

    Args:
        size: ``(height, width)`` or ``n`` for ``(n, n)``.
        layout: ``"CHW"`` (default, what ``StoreDataset`` returns) or ``"HWC"``.

    Raises:
        UsageError: a size that is not positive, an unknown layout.
    """

    def __init__(self, size: Union[int, Sequence[int]], layout: str = "CHW"):
        hw = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
        if len(hw) != 2 or min(hw) <= 0:
            raise UsageError(f"Resize: size must be a positive int or (height, width), got {size!r}")
        if layout not in ("CHW", "HWC"):
            raise UsageError(f"Resize: layout must be 'CHW' or 'HWC', got {layout!r}")
        self.size, self.layout = hw, layout

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        chw = image if self.layout == "CHW" else image.permute(2, 0, 1)
        if tuple(chw.shape[-2:]) == self.size:
            return image
        out = F.interpolate(chw[None].float(), size=self.size, mode="bilinear", align_corners=False,
                            antialias=True)[0]
        out = out.round_().clamp_(0, 255).to(torch.uint8)
        return out if self.layout == "CHW" else out.permute(1, 2, 0).contiguous()

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, layout={self.layout!r})"
