"""Ragged batches: images of different sizes, as decoders produce them, packed for one launch.

A :class:`RaggedBatch` is one 1-D buffer holding every image back to back plus an ``index`` of
``[B, 3]`` int64 rows ``(offset, height, width)`` (offsets in elements). All images share the
channel count ``channels`` and one storage order: ``"HWC"`` (channels last, what libjpeg-turbo
gives) or ``"CHW"`` (channels first, what nvJPEG / ``torchvision.io.decode_jpeg`` give). This is the
form the ``*_ragged`` kernels take; the ops in :mod:`gpu_ops.ops` accept a list of images and pack
it here (one ``torch.cat`` of flat views, i.e. one copy kernel, plus one small host-to-device copy
of the index).

Images in a list are always given with the logical shape ``[H, W, C]``. A tensor stored channels
first (a ``[C, H, W]`` decode result viewed with ``.permute(1, 2, 0)``) is packed without a
transposing copy: the batch records ``layout="CHW"``.

Example:
    >>> imgs = [torch.zeros(4, 6, 3, dtype=torch.uint8), torch.ones(5, 2, 3, dtype=torch.uint8)]
    >>> rb = RaggedBatch.from_list(imgs)
    >>> rb.index.tolist(), rb.layout, rb.data.numel()
    ([[0, 4, 6], [72, 5, 2]], 'HWC', 102)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

__all__ = ["RaggedBatch", "as_ragged", "is_ragged_input", "to_device"]


def _explain(images, i: int) -> None:
    """Raises the precise error for image ``i`` of a list that failed the fast check."""
    first = images[0]
    for j, t in enumerate(images[: i + 1]):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gpu_ops: ragged image {j} is a {type(t).__name__}, expected a torch.Tensor")
        if t.dim() != 3:
            raise ValueError(f"gpu_ops: ragged image {j} has shape {tuple(t.shape)}, expected [H, W, C]")
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                f"gpu_ops: ragged image {j} is {t.dtype} on {t.device}, image 0 is "
                f"{first.dtype} on {first.device} (one dtype and device per batch)"
            )
        if t.shape[2] != first.shape[2]:
            raise ValueError(
                f"gpu_ops: ragged image {j} has {t.shape[2]} channels, image 0 has "
                f"{first.shape[2]} (shape {tuple(t.shape)}; [H, W, C] expected)"
            )
        if t.shape[0] < 1 or t.shape[1] < 1:
            raise ValueError(f"gpu_ops: ragged image {j} is empty (shape {tuple(t.shape)})")
    raise ValueError(f"gpu_ops: ragged image {i} is not a valid [H, W, C] image")


_PACK_OP = None


def _pack_op():
    """``torch.ops.gpu_ops.pack_ragged`` where the compiled extension holds it, else None (the
    pure-Python packing below then does the same work)."""
    global _PACK_OP
    if _PACK_OP is None:
        try:
            _PACK_OP = torch.ops.gpu_ops.pack_ragged.default
        except (AttributeError, RuntimeError):
            _PACK_OP = False
    return _PACK_OP or None


def _pack_fast(cls, images, chw_input: List[bool]):
    """One C++ call (checks, views, cat) with the GIL released once; None where the op is missing
    or refuses the list (the Python path then raises the precise error). ``chw_input``: one flag
    for all images or one per image, True where the image is given as ``[C, H, W]``."""
    op = _pack_op()
    if op is None:
        return None
    try:
        data, index, layout = op(images, chw_input)
    except (RuntimeError, TypeError):
        return None
    C = int(images[0].shape[0] if chw_input[0] else images[0].shape[2])
    return cls(data, to_device(index, data.device), index[:, 1:].contiguous(), C, "CHW" if layout else "HWC")


def _flat(t: torch.Tensor, order: str) -> torch.Tensor:
    """``t`` ([H, W, C]) as a 1-D tensor in storage ``order`` (a view when already stored so)."""
    if order == "CHW":
        return t.permute(2, 0, 1).reshape(-1)
    return t.reshape(-1)


@dataclass(frozen=True)
class RaggedBatch:
    """A packed batch of images of different sizes (see the module docstring).

    Attributes:
        data: 1-D tensor, every image back to back.
        index: int64 ``[B, 3]`` (offset, height, width) on ``data.device``.
        sizes: int64 ``[B, 2]`` (height, width) on the CPU (shapes known to the host without a
            device synchronisation; samplers and output sizes use it).
        channels: channels of every image.
        layout: ``"HWC"`` or ``"CHW"`` storage order of every image.
    """

    data: torch.Tensor
    index: torch.Tensor
    sizes: torch.Tensor
    channels: int
    layout: str

    def __len__(self) -> int:
        return int(self.index.shape[0])

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def channels_first(self) -> bool:
        return self.layout == "CHW"

    @classmethod
    def from_list(
        cls,
        images: Sequence[torch.Tensor],
        *,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        channels: Optional[int] = None,
    ) -> "RaggedBatch":
        """Packs ``[H, W, C]`` images (same dtype, device and C) into one buffer.

        Args:
            images: the images; each may be stored HWC or CHW (see module docstring). When the
                list mixes both, the minority is copied into the majority's order.
            device, dtype, channels: only needed for an empty list (defaults: CPU, uint8, 3).

        Raises:
            TypeError, ValueError: not tensors, not 3-D, mixed dtype / device / channels, empty
                images.
        """
        images = list(images)
        if not images:
            dev = torch.device(device) if device is not None else torch.device("cpu")
            return cls(
                torch.empty(0, dtype=dtype or torch.uint8, device=dev),
                torch.empty((0, 3), dtype=torch.int64, device=dev),
                torch.empty((0, 2), dtype=torch.int64),
                int(channels or 3),
                "HWC",
            )
        fast = _pack_fast(cls, images, [False])
        if fast is not None:
            return fast
        first = images[0]
        if not isinstance(first, torch.Tensor) or first.dim() != 3:
            _explain(images, 0)
        dt, dev, C = first.dtype, first.device, first.shape[2]
        shapes = []
        n_chw = 0
        for t in images:  # one cheap pass; the slow, precise message only when something is wrong
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.dtype != dt or t.device != dev:
                _explain(images, len(shapes))
            h, w, c = t.shape
            if c != C or h < 1 or w < 1:
                _explain(images, len(shapes))
            shapes.append((h, w))
            # Stored channels first: strides (W, 1, H * W) of a [C, H, W] tensor viewed as HWC.
            if t.stride() == (w, 1, h * w) and not (c == 1 or h * w == 1):
                n_chw += 1
        layout = "CHW" if 2 * n_chw > len(images) else "HWC"
        flats = [_flat(t, layout) for t in images]
        sizes = torch.tensor(shapes, dtype=torch.int64)
        numels = sizes[:, 0] * sizes[:, 1] * int(C)
        offsets = torch.cumsum(numels, 0) - numels
        data = torch.cat(flats) if len(flats) > 1 else flats[0].contiguous()
        index = torch.cat([offsets[:, None], sizes], dim=1)
        return cls(data, to_device(index, data.device), sizes, int(C), layout)

    @classmethod
    def from_chw(cls, images: Sequence[torch.Tensor], chw: Optional[Sequence[bool]] = None) -> "RaggedBatch":
        """Packs ``[C, H, W]`` images (what nvJPEG / ``torchvision.io.decode_jpeg`` return) as
        :meth:`from_list` packs their ``[H, W, C]`` views, without a per-image permute in Python.

        Args:
            images: the images.
            chw: per image, True where it is given ``[C, H, W]`` and False where ``[H, W, C]``
                (a batch split between decoders); default all True.

        Raises:
            TypeError, ValueError: as :meth:`from_list`.
        """
        images = list(images)
        flags = [True] if chw is None else [bool(c) for c in chw]
        if chw is not None and len(flags) != len(images):
            raise ValueError(f"gpu_ops: {len(flags)} chw flags for {len(images)} images")
        fast = _pack_fast(cls, images, flags) if images else None
        if fast is not None:
            return fast
        return cls.from_list([t.permute(1, 2, 0) if (flags[0] if chw is None else flags[i])
                              and isinstance(t, torch.Tensor) and t.dim() == 3 else t
                              for i, t in enumerate(images)])

    @classmethod
    def from_dense(cls, images: torch.Tensor, layout: str = "HWC") -> "RaggedBatch":
        """A dense ``[B, H, W, C]`` (``layout="HWC"``) or ``[B, C, H, W]`` (``"CHW"``) batch as a
        ragged one, without copying the pixels."""
        if images.dim() != 4:
            raise ValueError(f"gpu_ops: expected a dense batch [B, ...] of 4 dims, got {tuple(images.shape)}")
        if layout == "HWC":
            B, H, W, C = images.shape
        elif layout == "CHW":
            B, C, H, W = images.shape
        else:
            raise ValueError(f"gpu_ops: layout must be 'HWC' or 'CHW', got {layout!r}")
        per = H * W * C
        sizes = torch.tensor([[H, W]], dtype=torch.int64).expand(B, 2).contiguous()
        offsets = torch.arange(B, dtype=torch.int64)[:, None] * per
        index = torch.cat([offsets, sizes], dim=1)
        return cls(images.contiguous().reshape(-1), to_device(index, images.device), sizes, int(C), layout)

    def unbind(self) -> List[torch.Tensor]:
        """The images as ``[H, W, C]`` views of ``data``."""
        out = []
        C = self.channels
        for (h, w), off in zip(self.sizes.tolist(), self.index[:, 0].cpu().tolist()):
            flat = self.data[off : off + h * w * C]
            out.append(flat.view(h, w, C) if self.layout == "HWC" else flat.view(C, h, w).permute(1, 2, 0))
        return out

    def check(self, op: str) -> None:
        """Host-side bounds check (from ``sizes``), run by the ops before a launch.

        Raises:
            ValueError: an image reaches past the end of ``data``.
        """
        if len(self) == 0:
            return
        if self.sizes.shape != (len(self), 2):
            raise ValueError(f"gpu_ops.{op}: ragged sizes {tuple(self.sizes.shape)} "
                             f"do not match index [{len(self)}, 3]")
        total = int((self.sizes[:, 0] * self.sizes[:, 1]).sum()) * self.channels
        if total > self.data.numel():
            raise ValueError(
                f"gpu_ops.{op}: ragged batch of {len(self)} images needs {total} elements, "
                f"data holds {self.data.numel()}"
            )


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Small host tensor -> ``device`` without blocking the host (pinned staging copy)."""
    if device.type == "cpu":
        return t
    if torch.cuda.is_available() and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def is_ragged_input(images) -> bool:
    """True for a :class:`RaggedBatch` or a list / tuple of tensors."""
    return isinstance(images, RaggedBatch) or isinstance(images, (list, tuple))


def as_ragged(images, op: str) -> RaggedBatch:
    """A :class:`RaggedBatch` from a RaggedBatch or a list of ``[H, W, C]`` tensors, checked."""
    rb = images if isinstance(images, RaggedBatch) else RaggedBatch.from_list(images)
    rb.check(op)
    return rb
