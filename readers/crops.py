"""Crop-aware batch JPEG decode: the training and validation transforms of the CPU path.

A crop is chosen from the record's stored size *before* decoding, then
``gpu_ops.ops.decode_jpeg_crops`` (C++, libjpeg-turbo, ATen's thread pool, the GIL
released) decodes a whole batch straight into resized crops: each image at the smallest DCT scale
(1/8, 1/4, 1/2, 1) at which its crop still covers the output, and only the rows and columns of
the crop. Output is one preallocated uint8 tensor ``[B, 3, H, W]`` (or ``[B, H, W, 3]``),
optionally in pinned memory.

* :class:`RandomResizedCrop` draws boxes exactly as torchvision's ``RandomResizedCrop.get_params``
  (same scale/ratio/10 attempts/fallback, same calls on the random generator), plus a horizontal
  flip with probability ``flip_p``. With ``seed=None`` it draws from torch's global generator, as
  torchvision does (so ``torch.manual_seed`` gives torchvision's boxes); with ``seed=N`` each
  sample's box depends only on ``(N, epoch, index)``: replayable whatever the worker layout.
* :class:`ResizeCenterCrop` is ``Resize(resize)`` + ``CenterCrop(size)`` (validation).
* :class:`FullDecode` decodes whole images at their stored size (no resample: equal to a plain
  libjpeg-turbo decode); every record of a batch must have the same size.

Resampling is ``F.interpolate(mode="bilinear", antialias=True)`` of the crop (of the whole image
for ``ResizeCenterCrop``). At DCT scale 1 the result matches a full decode + crop + resize within
rounding (±1); at reduced scales libjpeg's scaled IDCT replaces the first 2-8x of downscaling, so
pixels differ by a few levels (the same trade FFCV and DALI make).

Example:
    >>> from readers.crops import RandomResizedCrop, decode_crops
    >>> rrc = RandomResizedCrop(224, seed=0)
    >>> boxes, flips = rrc.params([(1080, 1920)], indices=[0])
    >>> images, errors = decode_crops([jpeg_bytes], boxes, flips, (224, 224))   # doctest: +SKIP
"""
from __future__ import annotations

import logging
import math
import operator
from typing import Optional, Sequence

import numpy as np
import torch

from packer.core.errors import UsageError

log = logging.getLogger(__name__)

ERROR_BYTES = 200
_DCT_SCALES = {None: 0, 1: 8, 0.5: 4, 0.25: 2, 0.125: 1}
DCT_METHODS = ("exact", "fast")


def check_count(what: str, value) -> int:
    """``value`` as an int >= 1 (numpy ints too, not bools), else a UsageError naming ``what``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        n = 0
    if n < 1:
        raise UsageError(f"{what} must be an int >= 1, got {value!r}")
    return n


def _check_dct(dct) -> str:
    if dct not in DCT_METHODS:
        raise UsageError(f"dct must be 'exact' (libjpeg's ISLOW IDCT, the default) or 'fast' (IFAST, "
                         f"FFCV's TJFLAG_FASTDCT: quicker, pixels may differ by a few levels), got {dct!r}")
    return dct


def _pair(size) -> tuple[int, int]:
    if isinstance(size, int):
        return int(size), int(size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) <= 0:
        raise UsageError(f"size must be an int or (height, width) > 0, got {size!r}")
    return size


_OP_FOUND = False


def op_available() -> bool:
    """True when the compiled ``gpu_ops._C`` holds the decode kernel (a found kernel stays found:
    the answer is kept, not looked up again per batch)."""
    global _OP_FOUND
    if _OP_FOUND:
        return True
    try:
        from gpu_ops import ops  # importing it loads gpu_ops._C (or warns once)
    except ImportError:
        return False
    _OP_FOUND = ops.has_kernel("decode_jpeg_crops")
    return _OP_FOUND


# ---------------------------------------------------------------------------------------------
# Crop parameters
# ---------------------------------------------------------------------------------------------
def rrc_box(height: int, width: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
            generator: Optional[torch.Generator] = None) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` for an image of ``height x width``,
    drawing from ``generator`` (torch's global generator when None) in the same order.

    Returns:
        ``(top, left, h, w)`` in pixels.
    """
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1],
                                                         generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=generator).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=generator).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop_box(height: int, width: int, resize: int, size: tuple[int, int]) -> tuple:
    """The region of a ``height x width`` image that torchvision's ``Resize(resize)`` followed by
    ``CenterCrop(size)`` keeps, in source pixels (floats), and the resized image's size.

    Returns:
        ``((top, left, h, w), (resized_h, resized_w))``.
    """
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(resize * long / short)
    rh, rw = (resize, new_long) if height <= width else (new_long, resize)
    ch, cw = size
    if ch > rh or cw > rw:
        raise UsageError(f"center crop {ch}x{cw} is larger than the {rh}x{rw} resized image "
                         f"(resize={resize}); padding is not supported")
    top = int(round((rh - ch) / 2.0))
    left = int(round((rw - cw) / 2.0))
    sy, sx = height / rh, width / rw
    return (top * sy, left * sx, ch * sy, cw * sx), (rh, rw)


class CropSpec:
    """Shared by the train and validation transforms: output size, layout, decode options."""

    clip_to_box = True

    def __init__(self, size, *, antialias: bool = True, dct_scale=None, dct: str = "exact"):
        self.size = _pair(size)
        self.antialias = bool(antialias)
        if dct_scale not in _DCT_SCALES:
            raise UsageError(f"dct_scale must be None (auto), 1, 0.5, 0.25 or 0.125, got {dct_scale!r}")
        self.dct_scale = dct_scale
        self.dct = _check_dct(dct)

    def params(self, sizes: Sequence[tuple[int, int]], indices: Sequence[int]):
        """Boxes ``[B, 4]`` float64 (top, left, h, w) and flips ``[B]`` bool for images of
        ``sizes`` = [(height, width), ...]."""
        raise NotImplementedError


class RandomResizedCrop(CropSpec):
    """torchvision's ``RandomResizedCrop(size, scale, ratio, antialias=True)`` +
    ``RandomHorizontalFlip(flip_p)``, applied while decoding.

    Args:
        size: output ``int`` or ``(height, width)``.
        scale, ratio: as torchvision.
        flip_p: probability of a horizontal flip (0 disables).
        seed: ``None``: torch's global generator (torchvision's behaviour; DataLoader seeds each
            worker). An ``int``: each sample's box depends only on (seed, epoch, index) - call
            :meth:`set_epoch` each epoch (a :class:`~readers.sampler.DistributedSampler`'s epoch).
        antialias: antialiased downscaling (torchvision's default for tensors).
        dct_scale: force a DCT scale (tests, benchmarks); ``None`` picks the smallest that covers.
        dct: ``"exact"`` (ISLOW IDCT) or ``"fast"`` (IFAST; used only for crops decoded at DCT
            scale 1, see :class:`FullDecode`).

    Example:
        >>> RandomResizedCrop(224, seed=1).params([(375, 500)], [7])[0].shape
        torch.Size([1, 4])
    """

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), *, flip_p: float = 0.5,
                 seed: Optional[int] = None, antialias: bool = True, dct_scale=None, dct: str = "exact"):
        super().__init__(size, antialias=antialias, dct_scale=dct_scale, dct=dct)
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise UsageError(f"need 0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1], got "
                             f"scale={scale!r} ratio={ratio!r}")
        if not 0.0 <= flip_p <= 1.0:
            raise UsageError(f"flip_p must be in [0, 1], got {flip_p!r}")
        self.scale, self.ratio = tuple(map(float, scale)), tuple(map(float, ratio))
        self.flip_p, self.seed, self.epoch = float(flip_p), seed, 0

    def set_epoch(self, epoch: int) -> None:
        """With ``seed`` set: boxes of the next draws depend on ``epoch`` too."""
        self.epoch = int(epoch)

    def _generator(self, index: int) -> Optional[torch.Generator]:
        if self.seed is None:
            return None
        g = torch.Generator()
        # One 63-bit seed per (seed, epoch, index), mixed so neighbouring indices are unrelated.
        mixed = (self.seed * 0x9E3779B97F4A7C15 + self.epoch * 0xBF58476D1CE4E5B9
                 + index * 0x94D049BB133111EB) & ((1 << 63) - 1)
        g.manual_seed(mixed)
        return g

    def params(self, sizes, indices):
        boxes = torch.empty((len(sizes), 4), dtype=torch.float64)
        flips = torch.zeros(len(sizes), dtype=torch.bool)
        for b, ((h, w), index) in enumerate(zip(sizes, indices)):
            g = self._generator(int(index))
            boxes[b] = torch.tensor(rrc_box(h, w, self.scale, self.ratio, g), dtype=torch.float64)
            if self.flip_p > 0:
                flips[b] = bool(torch.rand(1, generator=g).item() < self.flip_p)
        return boxes, flips

    def __repr__(self):
        return (f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio="
                f"{tuple(round(r, 4) for r in self.ratio)}, flip_p={self.flip_p}, seed={self.seed}"
                + (f", dct={self.dct!r})" if self.dct != "exact" else ")"))


class ResizeCenterCrop(CropSpec):
    """torchvision's ``Resize(resize, antialias=True)`` + ``CenterCrop(size)``, applied while
    decoding (the usual validation transform). Deterministic.

    Example:
        >>> ResizeCenterCrop(256, 224).params([(375, 500)], [0])[0][0, 2].item()
        334.8...                                                                  # doctest: +SKIP
    """

    clip_to_box = False

    def __init__(self, resize: int = 256, size=224, *, antialias: bool = True, dct_scale=None,
                 dct: str = "exact"):
        super().__init__(size, antialias=antialias, dct_scale=dct_scale, dct=dct)
        self.resize = int(resize)

    def params(self, sizes, indices):
        boxes = torch.tensor([center_crop_box(h, w, self.resize, self.size)[0] for h, w in sizes],
                             dtype=torch.float64).reshape(-1, 4)
        return boxes, torch.zeros(len(sizes), dtype=torch.bool)

    def __repr__(self):
        extra = f", dct={self.dct!r}" if self.dct != "exact" else ""
        return f"{type(self).__name__}(resize={self.resize}, size={self.size}{extra})"


class FullDecode(CropSpec):
    """Decode every record at its stored size (no crop, no resize, no flip) with the batch op.

    The box is the whole image and the output its own size at DCT scale 1; the kernel then skips
    resampling: with ``layout="HWC"`` libjpeg-turbo writes the rows straight into the batch
    tensor, with ``"CHW"`` the decoded image is copied in. Pixels equal a plain libjpeg-turbo
    full decode (:func:`packer.core.integrity.turbo_decode`) exactly.

    ``dct="fast"`` decodes with libjpeg's IFAST integer IDCT instead (what FFCV's decoder uses,
    TurboJPEG's ``TJFLAG_FASTDCT``, whose pixels it equals): ~7% less decode time on 500x375
    photos; on the benchmark's q90 photos pixels differ from the exact decode by 0.98 levels on
    average and 8 at most (``tests/readers/test_full_decode.py`` checks the bound); no longer equal
    to ``turbo_decode``. Opt-in: the default stays exact. Records taking the slow EXIF path decode
    exactly either way.

    A batch is one tensor, so all records of a batch must share one size (stores of a fixed-size
    benchmark set, or built resized to one size). A batch of mixed sizes is refused with a
    :class:`~packer.core.errors.UsageError` naming the keys and their sizes - it is a property of the
    store, not of one record, so it is not skipped by ``on_error="skip"``; decode such stores with
    :class:`~readers.dataset.StoreDataset` (one tensor per sample) or a
    :class:`ResizeCenterCrop`.

    Args:
        dct: ``"exact"`` (default, ISLOW) or ``"fast"`` (IFAST).

    Example:
        >>> FullDecode().params([(375, 500)], [0])[0].tolist()
        [[0.0, 0.0, 375.0, 500.0]]
    """

    def __init__(self, dct: str = "exact"):
        self.size, self.antialias, self.dct_scale = None, False, 1
        self.dct = _check_dct(dct)

    def params(self, sizes, indices):
        boxes = torch.tensor([(0, 0, h, w) for h, w in sizes], dtype=torch.float64).reshape(-1, 4)
        return boxes, torch.zeros(len(sizes), dtype=torch.bool)

    def batch_size_of(self, sizes: Sequence[tuple[int, int]], keys: Sequence) -> tuple[int, int]:
        """The batch's one ``(height, width)``.

        Raises:
            UsageError: the records differ in size (names up to 8 keys with their sizes).
        """
        distinct = sorted(set(sizes))
        if len(distinct) <= 1:
            return distinct[0] if distinct else (1, 1)
        first = sizes[0]
        odd = [f"{k!r} {h}x{w}" for k, (h, w) in zip(keys, sizes) if (h, w) != first][:8]
        raise UsageError(f"FullDecode needs one image size per batch: {keys[0]!r} is {first[0]}x{first[1]} "
                         f"(height x width) but {', '.join(odd)}; {len(distinct)} sizes in this batch. "
                         f"Use StoreDataset (a tensor per sample) or ResizeCenterCrop for mixed sizes")

    def __repr__(self):
        return f"{type(self).__name__}(dct={self.dct!r})" if self.dct != "exact" else f"{type(self).__name__}()"


# ---------------------------------------------------------------------------------------------
# The batch decode
# ---------------------------------------------------------------------------------------------
def pack_bytes(chunks: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate byte strings into one uint8 tensor + int64 offsets ``[B + 1]``."""
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for c, a, b in zip(chunks, offsets[:-1], offsets[1:]):
        data[a:b] = np.frombuffer(c, dtype=np.uint8)
    return torch.from_numpy(data), torch.from_numpy(offsets)


def alloc_output(batch: int, size, channels: int = 3, layout: str = "CHW",
                 pin_memory: bool = False) -> torch.Tensor:
    """An uninitialised uint8 batch ``[B, C, H, W]`` (``CHW``) or ``[B, H, W, C]`` (``HWC``)."""
    h, w = _pair(size)
    shape = (batch, channels, h, w) if layout == "CHW" else (batch, h, w, channels)
    return torch.empty(shape, dtype=torch.uint8, pin_memory=pin_memory)


def decode_crops(chunks: Sequence, boxes: torch.Tensor, flips: torch.Tensor, size, *,
                 channels: int = 3, layout: str = "CHW", out: Optional[torch.Tensor] = None,
                 antialias: bool = True, clip_to_box: bool = True, dct_scale=None, dct: str = "exact",
                 pin_memory: bool = False, threads: Optional[int] = None) -> tuple[torch.Tensor, list]:
    """Decode a batch of JPEGs into resized crops with one call into compiled code.

    Args:
        chunks: JPEG byte strings (bytes / memoryview / uint8 arrays), or a pre-packed
            ``(data, offsets)`` pair from :func:`pack_bytes`, or ``(data, spans)`` with int64
            ``spans`` ``[B, 2]``: record ``b`` is ``data[spans[b, 0]:spans[b, 1]]`` (records
            anywhere in ``data``, e.g. a map of a store file).
        boxes: ``[B, 4]`` float64 ``(top, left, height, width)`` in stored-image pixels.
        flips: ``[B]`` bool, mirror horizontally.
        size: output ``(height, width)``.
        channels: 3 (RGB; gray JPEGs expanded) or 1 (luma).
        layout: ``"CHW"`` -> ``[B, C, H, W]``; ``"HWC"`` -> ``[B, H, W, C]``.
        out: write here instead (uint8, that shape, any strides; e.g. pinned).
        clip_to_box: filter taps stay inside the box (crop-then-resize) or may use the image
            around it (resize-then-crop, :class:`ResizeCenterCrop`).
        dct_scale: ``None`` (auto) or a forced 1, 0.5, 0.25, 0.125.
        dct: ``"exact"`` (libjpeg's ISLOW IDCT) or ``"fast"`` (IFAST, FFCV's choice; at DCT
            scale 1 only - the reduced scales have one IDCT each).
        threads: decode threads for this call; ``None``: ``torch.get_num_threads()``.

    Returns:
        ``(images, errors)``: ``errors`` is a list of ``(batch_position, message)`` for samples
        that did not decode (their pixels in ``images`` are unspecified).

    Raises:
        RuntimeError: the compiled kernel is missing (rebuild gpu_ops), or bad arguments.
    """
    h, w = _pair(size)
    fast_dct = _check_dct(dct) == "fast"
    if threads is not None:
        threads = check_count("decode_crops: threads", threads)
    if layout not in ("CHW", "HWC"):
        raise UsageError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    if channels not in (1, 3):
        raise UsageError(f"channels must be 1 or 3, got {channels!r}")
    data, offsets = chunks if isinstance(chunks, tuple) else pack_bytes(chunks)
    batch = offsets.size(0) if offsets.dim() == 2 else offsets.numel() - 1  # spans [B, 2] or packed
    if out is None:
        out = alloc_output(batch, (h, w), channels, layout, pin_memory)
    errors = torch.zeros((batch, ERROR_BYTES), dtype=torch.uint8)
    if batch == 0:
        return out, []
    if not op_available():
        raise RuntimeError("gpu_ops._C lacks decode_jpeg_crops (rebuild: FORCE_CUDA=0 python3 setup.py "
                           "build_ext --inplace, with libjpeg-turbo's headers installed)")
    from gpu_ops import ops

    ops.decode_jpeg_crops(data, offsets, boxes, flips, out, errors, layout == "HWC", _DCT_SCALES[dct_scale],
                          bool(antialias), bool(clip_to_box), fast_dct, int(threads or 0))
    bad = torch.nonzero(errors[:, 0]).flatten().tolist()
    return out, [(b, bytes(errors[b]).split(b"\0", 1)[0].decode("utf-8", "replace")) for b in bad]


def reference_crop(image: torch.Tensor, box, flip: bool, size, *, antialias: bool = True,
                   clip_to_box: bool = True) -> torch.Tensor:
    """The pure-torch oracle: crop (or resize whole, then crop) a decoded ``[C, H, W]`` uint8
    image like the kernel does at DCT scale 1; used by tests and for EXIF-rotated records.

    With ``clip_to_box`` the box must be integral (RandomResizedCrop); otherwise it must come
    from :func:`center_crop_box`.
    """
    import torch.nn.functional as F

    h, w = _pair(size)
    top, left, bh, bw = (float(v) for v in box)
    x = image.unsqueeze(0).float()
    if clip_to_box:
        t, l, bh_i, bw_i = int(round(top)), int(round(left)), int(round(bh)), int(round(bw))
        x = x[:, :, t:t + bh_i, l:l + bw_i]
        y = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=antialias)
    else:
        H, W = image.shape[-2:]
        rh, rw = int(round(H * h / bh)), int(round(W * w / bw))
        y = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False, antialias=antialias)
        t, l = int(round(top * rh / H)), int(round(left * rw / W))
        y = y[:, :, t:t + h, l:l + w]
    if flip:
        y = y.flip(-1)
    return y[0].clamp(0, 255).add(0.5).floor().to(torch.uint8)
