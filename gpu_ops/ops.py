"""A Python function for every native op of ``gpu_ops._C``: validate and convert ->
``torch.ops.gpu_ops.<op>``, as torchvision wraps ``torch.ops.image.*``.

The augmentation kernels (``warp_affine``, ``resize``, ``crop_mirror_normalize``,
``resized_crop_mirror_normalize``, ``adjust_color``; their ``*_ragged`` forms through a
:class:`RaggedBatch` argument) and the CPU-only ops the readers call (:func:`decode_jpeg_crops`,
:func:`gather_check_xxh3`; :func:`has_kernel` says whether a build holds one). The one op
wrapped elsewhere is ``pack_ragged``: :meth:`RaggedBatch.from_list` and
:meth:`RaggedBatch.from_chw` in :mod:`gpu_ops.ragged` (which this module imports), with a
pure-torch path where the op is missing.

The kernels are reached through the PyTorch dispatcher, which picks the CPU or CUDA kernel from the
input's device. Fake (meta) kernels are registered here so ``torch.compile`` can trace the ops
without running them. When ``gpu_ops._C`` did not load, each kernel's wrapper calls the pure-torch
reference in :mod:`gpu_ops._reference` instead (see :mod:`gpu_ops._loader`); the CPU-only ops have
no reference and raise (their callers in ``readers`` have a Python path of their own).

All ops are batched and take per-sample parameters as tensors; they never draw random numbers
(see :mod:`gpu_ops.random` for samplers). No op supports autograd: these are data-pipeline ops.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from gpu_ops import _loader, _reference
from gpu_ops.ragged import RaggedBatch, as_ragged, is_ragged_input, to_device

__all__ = [
    "warp_affine",
    "invert_affine",
    "resize",
    "crop_mirror_normalize",
    "resized_crop_mirror_normalize",
    "adjust_color",
    "decode_jpeg_crops",
    "gather_check_xxh3",
    "has_kernel",
    "RaggedBatch",
    "EXTENSION_LOADED",
    "EXTENSION_ERROR",
]

EXTENSION_LOADED, EXTENSION_ERROR = _loader.load_extension()

TensorLike = Union[torch.Tensor, Sequence[float], float]
Size = Union[int, Tuple[int, int], Sequence[int]]

_IMAGE_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _op(name: str):
    if EXTENSION_LOADED:
        return getattr(torch.ops.gpu_ops, name).default
    return getattr(_reference, name)


# ------------------------------------------------------------------------------------------------
# Fake kernels: output metadata only, so torch.compile / FakeTensor can trace the ops.
# ------------------------------------------------------------------------------------------------
def _padded(n: int, m: int) -> int:
    return (n + m - 1) // m * m


if EXTENSION_LOADED:

    @torch.library.register_fake("gpu_ops::warp_affine")
    def _warp_affine_fake(input, matrix, out_h, out_w, interpolation, fill):
        return input.new_empty((input.shape[0], input.shape[1], out_h, out_w))

    @torch.library.register_fake("gpu_ops::resize")
    def _resize_fake(input, out_h, out_w, mode, antialias):
        return input.new_empty((input.shape[0], input.shape[1], out_h, out_w))

    @torch.library.register_fake("gpu_ops::crop_mirror_normalize")
    def _cmn_fake(input, crop, flip, mean, std, out_h, out_w, out_dtype, pad_multiple, fill):
        B, C = input.shape[0], input.shape[3]
        shape = (B, C, _padded(out_h, pad_multiple), _padded(out_w, pad_multiple))
        return input.new_empty(shape, dtype=out_dtype)

    @torch.library.register_fake("gpu_ops::resized_crop_mirror_normalize")
    def _rcmn_fake(
        input, boxes, flip, mean, std, out_h, out_w, out_dtype, antialias, pad_multiple, fill
    ):
        B, C = input.shape[0], input.shape[3]
        shape = (B, C, _padded(out_h, pad_multiple), _padded(out_w, pad_multiple))
        return input.new_empty(shape, dtype=out_dtype)

    @torch.library.register_fake("gpu_ops::resized_crop_mirror_normalize_ragged")
    def _rcmn_ragged_fake(
        data, index, channels, channels_first, boxes, sizes, flip, mean, std, out_h, out_w,
        out_dtype, antialias, fill
    ):
        return data.new_empty((index.shape[0], channels, out_h, out_w), dtype=out_dtype)

    @torch.library.register_fake("gpu_ops::crop_mirror_normalize_ragged")
    def _cmn_ragged_fake(
        data, index, channels, channels_first, crop, flip, mean, std, out_h, out_w, out_dtype,
        pad_multiple, fill
    ):
        shape = (index.shape[0], channels, _padded(out_h, pad_multiple), _padded(out_w, pad_multiple))
        return data.new_empty(shape, dtype=out_dtype)

    @torch.library.register_fake("gpu_ops::resize_ragged")
    def _resize_ragged_fake(data, index, channels, channels_first, out_h, out_w, mode, antialias):
        return data.new_empty((index.shape[0], channels, out_h, out_w))

    @torch.library.register_fake("gpu_ops::warp_affine_ragged")
    def _warp_ragged_fake(data, index, channels, channels_first, matrix, out_h, out_w, interpolation, fill):
        return data.new_empty((index.shape[0], channels, out_h, out_w))

    @torch.library.register_fake("gpu_ops::adjust_color")
    def _adjust_color_fake(input, brightness, contrast, saturation, hue):
        return torch.empty_like(input, memory_format=torch.contiguous_format)


# ------------------------------------------------------------------------------------------------
# Argument helpers
# ------------------------------------------------------------------------------------------------
def _size(size: Size, op: str) -> Tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 0:
        raise ValueError(f"gpu_ops.{op}: expected size as (height, width) >= 0, got {size}")
    return size


def _batched(images: torch.Tensor, op: str, layout: str) -> Tuple[torch.Tensor, bool]:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"gpu_ops.{op}: expected images as a torch.Tensor, got {type(images)}")
    if images.dim() == 3:
        return images.unsqueeze(0), True
    if images.dim() != 4:
        raise ValueError(
            f"gpu_ops.{op}: expected images of shape [B, {layout}] or [{layout}], "
            f"got {tuple(images.shape)}"
        )
    return images, False


def _check_dtype(images: torch.Tensor, op: str, allowed) -> None:
    if images.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"gpu_ops.{op}: expected images of dtype {names}, got {images.dtype}")


_CONST_CACHE: dict = {}


def _const(values, dtype: torch.dtype, device: torch.device, shape: tuple) -> torch.Tensor:
    """Small constant tensors (mean/std lists, default flips and crops) made once per device: a
    fresh torch.tensor(..., device="cuda") is a synchronous host-to-device copy on every call."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device).expand(shape).contiguous()
    key = (values, dtype, device, shape)
    t = _CONST_CACHE.get(key)
    if t is None:
        if len(_CONST_CACHE) >= 256:
            _CONST_CACHE.clear()
        t = torch.tensor(values, dtype=dtype).expand(shape).contiguous().to(device)
        _CONST_CACHE[key] = t
    if t.is_cuda:
        # Used on whatever stream is current now: tell the caching allocator, so clearing the
        # cache cannot hand this memory out again while a kernel on that stream still reads it.
        t.record_stream(torch.cuda.current_stream(t.device))
    return t


def _is_plain(value) -> bool:
    return isinstance(value, (bool, int, float)) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value)
    )


def _as_tensor(value, dtype: torch.dtype, device, shape: tuple) -> torch.Tensor:
    """`value` as a tensor on `device`; scalars and plain sequences of shape[-1] values come from
    the per-device cache, broadcast to `shape`."""
    if _is_plain(value):
        vals = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        if len(vals) == 1 and not isinstance(value, (list, tuple)):
            return _const(vals[0], dtype, torch.device(device), tuple(shape))
        if len(shape) == 1 and len(vals) == shape[0]:
            return _const(vals, dtype, torch.device(device), tuple(shape))
    return torch.as_tensor(value, dtype=dtype, device=device)


def _per_sample(value, batch: int, device, dtype, default, op: str, name: str) -> torch.Tensor:
    if value is None:
        value = default
    t = _as_tensor(value, dtype, device, (batch,))
    if t.dim() == 0:
        t = t.expand(batch)
    if t.shape != (batch,):
        raise ValueError(
            f"gpu_ops.{op}: expected {name} as a scalar or shape [{batch}], got {tuple(t.shape)}"
        )
    return t.contiguous()


def _channels(value: TensorLike, C: int, device, op: str, name: str) -> torch.Tensor:
    t = _as_tensor(value, torch.float32, device, (C,))
    if t.dim() == 0:
        t = t.expand(C)
    if t.shape != (C,):
        raise ValueError(
            f"gpu_ops.{op}: expected {name} as a scalar or {C} values (one per channel), "
            f"got shape {tuple(t.shape)}"
        )
    return t.contiguous()


def _out_dtype(dtype: torch.dtype, op: str) -> torch.dtype:
    if dtype not in _OUT_DTYPES:
        raise TypeError(f"gpu_ops.{op}: expected dtype float16, bfloat16, float32 or float64, got {dtype}")
    return dtype


def _pad_multiple(pad_multiple: int, op: str) -> int:
    if int(pad_multiple) < 1:
        raise ValueError(f"gpu_ops.{op}: expected pad_multiple >= 1, got {pad_multiple}")
    return int(pad_multiple)


# ------------------------------------------------------------------------------------------------
# Ops
# ------------------------------------------------------------------------------------------------
def invert_affine(matrix: torch.Tensor) -> torch.Tensor:
    """Inverts 2x3 affine matrices in float64 exactly as OpenCV (``cv2.invertAffineTransform``).

    Args:
        matrix: ``[..., 2, 3]``.

    Returns:
        ``[..., 2, 3]`` float64; a singular matrix inverts to zeros in its 2x2 part, as OpenCV.

    Example:
        >>> invert_affine(torch.tensor([[2.0, 0, 4], [0, 2, 6]]))[0].tolist()
        [0.5, -0.0, -2.0]
    """
    M = torch.as_tensor(matrix, dtype=torch.float64)
    a, b, c = M[..., 0, 0], M[..., 0, 1], M[..., 0, 2]
    d, e, f = M[..., 1, 0], M[..., 1, 1], M[..., 1, 2]
    D = a * e - b * d
    D = torch.where(D != 0, 1.0 / torch.where(D != 0, D, 1.0), torch.zeros_like(D))
    A11, A22 = e * D, a * D
    A12, A21 = b * -D, d * -D
    b1 = -A11 * c - A12 * f
    b2 = -A21 * c - A22 * f
    return torch.stack((torch.stack((A11, A12, b1), -1), torch.stack((A21, A22, b2), -1)), -2)


def warp_affine(
    images: torch.Tensor,
    matrix: torch.Tensor,
    size: Size,
    *,
    interpolation: str = "bilinear",
    fill: float = 0.0,
    inverse_map: bool = True,
) -> torch.Tensor:
    """Per-sample affine warp, ``cv2.warpAffine`` semantics (bit-exact on uint8).

    Args:
        images: ``[B, C, H, W]`` or ``[C, H, W]``; uint8, float16, bfloat16, float32 or float64.
            Or a ragged batch: a list of ``[H, W, C]`` images of different sizes or a
            :class:`~gpu_ops.ragged.RaggedBatch` (one launch; output ``[B, C, out_h, out_w]``).
        matrix: ``[B, 2, 3]`` (or ``[2, 3]`` for the whole batch), in pixel coordinates where
            integers are pixel centres, as OpenCV. With ``inverse_map=True`` (default) it maps
            OUTPUT pixels to INPUT pixels, i.e. ``cv2.warpAffine(img, M, (W, H),
            flags=INTER_LINEAR | WARP_INVERSE_MAP)``; with ``inverse_map=False`` it maps input to
            output like plain ``cv2.warpAffine`` and is inverted here as OpenCV does.
        size: ``(out_h, out_w)`` (or one int).
        interpolation: ``"bilinear"`` (OpenCV INTER_LINEAR: coordinates rounded to 1/32 pixel) or
            ``"nearest"``.
        fill: border value for taps outside the input (BORDER_CONSTANT); rounded for uint8.
        inverse_map: see ``matrix``.

    Returns:
        ``[B, C, out_h, out_w]`` (or ``[C, out_h, out_w]``), dtype of ``images``.

    Raises:
        ValueError, TypeError: bad shapes, dtypes or mode.

    Example:
        >>> img = torch.arange(12, dtype=torch.uint8).view(1, 1, 3, 4)
        >>> shift = torch.tensor([[1.0, 0, 1], [0, 1, 0]])  # output x reads input x + 1
        >>> warp_affine(img, shift, (3, 4))[0, 0, 0].tolist()
        [1, 2, 3, 0]
    """
    if is_ragged_input(images):
        return _warp_affine_ragged(images, matrix, size, interpolation, fill, inverse_map)
    images, unbatched = _batched(images, "warp_affine", "C, H, W")
    _check_dtype(images, "warp_affine", _IMAGE_DTYPES)
    B = images.shape[0]
    M = torch.as_tensor(matrix, dtype=torch.float64, device=images.device)
    M, interp = _warp_args(M, B, interpolation, inverse_map, "warp_affine")
    out_h, out_w = _size(size, "warp_affine")
    out = _op("warp_affine")(images, M.contiguous(), out_h, out_w, interp, float(fill))
    return out[0] if unbatched else out


def resize(
    images: torch.Tensor, size: Size, *, mode: str = "bilinear", antialias: bool = False
) -> torch.Tensor:
    """Batched resize with ``F.interpolate`` semantics (align_corners=False).

    ``mode="bilinear"``: the triangle filter of ``F.interpolate(mode="bilinear")``. With
    ``antialias=True`` and downscaling, the filter is widened by the scale factor so every input
    pixel contributes (``F.interpolate(..., antialias=True)``, PIL's BILINEAR reduce); for upscaling
    ``antialias`` changes nothing. ``mode="area"``: the mean over each output pixel's window
    ``[floor(i*in/out), ceil((i+1)*in/out))`` (``F.interpolate(mode="area")``), the choice for
    integer downscale factors. uint8 results round half up; no intermediate rounding.

    Args:
        images: ``[B, C, H, W]`` or ``[C, H, W]``; uint8, float16, bfloat16, float32, float64.
            Or a ragged batch: a list of ``[H, W, C]`` images of different sizes or a
            :class:`~gpu_ops.ragged.RaggedBatch` (one launch; output ``[B, C, out_h, out_w]``).
        size: ``(out_h, out_w)`` or one int.
        mode: ``"bilinear"`` or ``"area"``.
        antialias: see above (bilinear only).

    Returns:
        ``[B, C, out_h, out_w]`` (or unbatched), dtype of ``images``.

    Example:
        >>> resize(torch.ones(2, 3, 8, 8), (4, 4), antialias=True).shape
        torch.Size([2, 3, 4, 4])
    """
    if is_ragged_input(images):
        return _resize_ragged(images, size, mode, antialias)
    images, unbatched = _batched(images, "resize", "C, H, W")
    _check_dtype(images, "resize", _IMAGE_DTYPES)
    mode_id = _resize_mode(mode, "resize")
    out_h, out_w = _size(size, "resize")
    if images.shape[0] > 0 and images.shape[2] * images.shape[3] == 0 and out_h * out_w > 0:
        raise ValueError(f"gpu_ops.resize: expected non-empty images, got {tuple(images.shape)}")
    out = _op("resize")(images, out_h, out_w, mode_id, bool(antialias))
    return out[0] if unbatched else out


def crop_mirror_normalize(
    images: torch.Tensor,
    mean: TensorLike,
    std: TensorLike,
    *,
    size: Optional[Size] = None,
    crop: Optional[Union[torch.Tensor, Sequence[int]]] = None,
    flip: Optional[Union[torch.Tensor, bool]] = None,
    dtype: torch.dtype = torch.float32,
    pad_multiple: int = 1,
    fill: float = 0.0,
) -> torch.Tensor:
    """Fused crop + horizontal flip + normalize + NHWC->NCHW + cast (DALI CropMirrorNormalize).

    One pass from decoder output (uint8 NHWC) to the network's input:
    ``out[b, c, y, x] = (img[b, top + y, left + x', c] - mean[c]) * (1 / std[c])`` with
    ``x' = out_w - 1 - x`` where ``flip[b]``. Window pixels outside the image, and the padding that
    rounds the output up to a multiple of ``pad_multiple`` (bottom and right), are ``fill``.

    Args:
        images: uint8 ``[B, H, W, C]`` or ``[H, W, C]``, C in 1..4; or a ragged batch (a list of
            ``[H, W, C]`` images of different sizes, or a :class:`~gpu_ops.ragged.RaggedBatch`),
            processed in one launch; ``size`` is then required.
        mean, std: per channel, in pixel units (0..255), scalar or C values.
        size: ``(out_h, out_w)``; default: the image size.
        crop: ``[B, 2]`` int (top, left) per sample, or one (top, left); default: centred.
        flip: ``[B]`` bool per sample, or one bool; default: no flip.
        dtype: float32 (default), float16, bfloat16 or float64.
        pad_multiple: round the output height and width up to a multiple of this (e.g. 32).
        fill: value of out-of-image pixels and padding (in output units).

    Returns:
        ``[B, C, Hp, Wp]`` (or ``[C, Hp, Wp]``) of ``dtype``.

    Example:
        >>> x = torch.full((2, 4, 4, 3), 128, dtype=torch.uint8)
        >>> crop_mirror_normalize(x, 127.5, 64.0, size=(2, 2), pad_multiple=4).shape
        torch.Size([2, 3, 4, 4])
    """
    op = "crop_mirror_normalize"
    if is_ragged_input(images):
        return _cmn_ragged(images, mean, std, size, crop, flip, dtype, pad_multiple, fill)
    images, unbatched = _batched(images, op, "H, W, C")
    _check_dtype(images, op, (torch.uint8,))
    B, H, W, C = images.shape
    if not 1 <= C <= 4:
        raise ValueError(f"gpu_ops.{op}: expected 1 to 4 channels (NHWC), got {C} (shape {tuple(images.shape)})")
    out_h, out_w = (H, W) if size is None else _size(size, op)
    dev = images.device
    if crop is None:
        crop = ((H - out_h) // 2, (W - out_w) // 2)
    if _is_plain(crop) and len(crop) == 2:  # the common fixed crop: a cached constant, no copy
        crop_t = _const(tuple(int(c) for c in crop), torch.int64, torch.device(dev), (B, 2))
    else:
        crop_t = _device_rows(crop, B, 2, dev, op, "crop", "(top, left)")
    flip_t = _per_sample(flip, B, dev, torch.bool, False, op, "flip")
    out = _op(op)(
        images,
        crop_t.contiguous(),
        flip_t,
        _channels(mean, C, dev, op, "mean"),
        _channels(std, C, dev, op, "std"),
        out_h,
        out_w,
        _out_dtype(dtype, op),
        _pad_multiple(pad_multiple, op),
        float(fill),
    )
    return out[0] if unbatched else out


def resized_crop_mirror_normalize(
    images: torch.Tensor,
    boxes: Union[torch.Tensor, Sequence[int]],
    size: Optional[Size],
    mean: TensorLike,
    std: TensorLike,
    *,
    flip: Optional[Union[torch.Tensor, bool]] = None,
    dtype: torch.dtype = torch.float32,
    antialias: bool = False,
    pad_multiple: int = 1,
    fill: float = 0.0,
    sizes: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused RandomResizedCrop + flip + normalize: per-sample box resized to ``size`` in one pass.

    Per sample ``b``: the box ``(top, left, height, width)`` (clipped to the image) is resampled to
    ``size`` exactly as ``F.interpolate(crop, size, mode="bilinear", align_corners=False,
    antialias=antialias)`` would, mirrored if ``flip[b]``, then normalised as in
    :func:`crop_mirror_normalize`; nothing is rounded in between. Use
    :class:`gpu_ops.random.RandomResizedCrop` to draw boxes and flips. For detection inference pass
    the whole image as the box, the scaled size as ``size`` and ``pad_multiple=32``.

    Args:
        images: uint8 ``[B, H, W, C]`` or ``[H, W, C]``, C in 1..4; or a ragged batch of images
            of different sizes (a list of ``[H, W, C]`` tensors, e.g. decoder output, or a
            :class:`~gpu_ops.ragged.RaggedBatch`), processed in one launch.
        boxes: ``[B, 4]`` int (top, left, height, width), or one box for all.
        size: ``(out_h, out_w)`` or one int. With ``sizes``: the canvas size (default: the largest
            of ``sizes``), before rounding up to ``pad_multiple``.
        sizes: optional int64 ``[B, 2]`` per-sample output sizes (height, width): sample ``b`` is
            resized to ``sizes[b]`` and placed top-left on the canvas, the rest is ``fill``
            (detection batches: keep-ratio rescale, pad to a multiple of 32). Give it on the CPU
            (a CUDA tensor costs one synchronisation to size the canvas).
        mean, std: per channel, pixel units.
        flip: ``[B]`` bool or one bool; default no flip.
        dtype: output dtype (float32, float16, bfloat16, float64).
        antialias: widen the filter when downscaling (``F.interpolate(antialias=True)``).
        pad_multiple: round the output up to a multiple of this, filled with ``fill``.
        fill: padding value (output units).

    Returns:
        ``[B, C, Hp, Wp]`` (or unbatched) of ``dtype``.

    Example:
        >>> x = torch.randint(0, 256, (2, 50, 60, 3), dtype=torch.uint8)
        >>> boxes = torch.tensor([[0, 0, 50, 60], [10, 5, 20, 30]])
        >>> resized_crop_mirror_normalize(x, boxes, 32, 128.0, 64.0, flip=torch.tensor([True, False])).shape
        torch.Size([2, 3, 32, 32])
    """
    op = "resized_crop_mirror_normalize"
    if is_ragged_input(images) or sizes is not None:
        return _rcmn_ragged(images, boxes, size, mean, std, flip, dtype, antialias, pad_multiple, fill, sizes)
    images, unbatched = _batched(images, op, "H, W, C")
    _check_dtype(images, op, (torch.uint8,))
    B, H, W, C = images.shape
    if not 1 <= C <= 4:
        raise ValueError(f"gpu_ops.{op}: expected 1 to 4 channels (NHWC), got {C} (shape {tuple(images.shape)})")
    if B > 0 and H * W == 0:
        raise ValueError(f"gpu_ops.{op}: expected non-empty images, got {tuple(images.shape)}")
    out_h, out_w = _size(size, op)
    dev = images.device
    boxes_t = torch.as_tensor(boxes, dtype=torch.int64, device=dev)
    if boxes_t.dim() == 1:
        boxes_t = boxes_t.expand(B, 4)
    if tuple(boxes_t.shape) != (B, 4):
        raise ValueError(f"gpu_ops.{op}: expected boxes [{B}, 4] or one (top, left, height, width), "
                         f"got {tuple(boxes_t.shape)}")
    flip_t = _per_sample(flip, B, dev, torch.bool, False, op, "flip")
    out = _op(op)(
        images,
        boxes_t.contiguous(),
        flip_t,
        _channels(mean, C, dev, op, "mean"),
        _channels(std, C, dev, op, "std"),
        out_h,
        out_w,
        _out_dtype(dtype, op),
        bool(antialias),
        _pad_multiple(pad_multiple, op),
        float(fill),
    )
    return out[0] if unbatched else out


# ------------------------------------------------------------------------------------------------
# Ragged forms: images of different sizes, one launch per batch (see gpu_ops.ragged)
# ------------------------------------------------------------------------------------------------
def _ragged_op(name: str):
    return _op(name + "_ragged")


def _device_rows(value, B: int, cols: int, dev, op: str, name: str, what: str) -> torch.Tensor:
    """Per-sample int64 rows on ``dev``: device tensors stay there; host values are copied."""
    on_device = isinstance(value, torch.Tensor) and value.device.type != "cpu"
    t = value.to(dev, torch.int64) if on_device else torch.as_tensor(value, dtype=torch.int64)
    if t.dim() == 1:
        t = t.expand(B, cols)
    if tuple(t.shape) != (B, cols):
        raise ValueError(f"gpu_ops.{op}: expected {name} [{B}, {cols}] or one {what}, got {tuple(t.shape)}")
    return t.contiguous() if on_device else to_device(t.contiguous(), torch.device(dev))


def _rcmn_ragged(images, boxes, size, mean, std, flip, dtype, antialias, pad_multiple, fill, sizes):
    op = "resized_crop_mirror_normalize"
    if isinstance(images, torch.Tensor):
        images, unbatched = _batched(images, op, "H, W, C")
        _check_dtype(images, op, (torch.uint8,))
        rb = RaggedBatch.from_dense(images, "HWC")
    else:
        rb, unbatched = as_ragged(images, op), False
    if rb.dtype != torch.uint8:
        raise TypeError(f"gpu_ops.{op}: expected uint8 images, got {rb.dtype}")
    B, C, dev = len(rb), rb.channels, rb.device
    if not 1 <= C <= 4:
        raise ValueError(f"gpu_ops.{op}: expected 1 to 4 channels, got {C}")
    pm = _pad_multiple(pad_multiple, op)
    if sizes is None:
        if size is None:
            raise ValueError(f"gpu_ops.{op}: expected size (out_h, out_w) or per-sample sizes")
        out_h, out_w = _size(size, op)
        sizes_host = torch.tensor([[out_h, out_w]], dtype=torch.int64).expand(B, 2)
        sizes_t = _const((out_h, out_w), torch.int64, torch.device(dev), (B, 2))
    else:
        sizes_host = torch.as_tensor(sizes, dtype=torch.int64).cpu()
        if tuple(sizes_host.shape) != (B, 2):
            raise ValueError(f"gpu_ops.{op}: expected sizes [{B}, 2] (height, width), got {tuple(sizes_host.shape)}")
        if B and int(sizes_host.min()) < 0:
            raise ValueError(f"gpu_ops.{op}: expected sizes >= 0, got {sizes_host.tolist()}")
        if size is None:
            out_h = int(sizes_host[:, 0].max()) if B else 0
            out_w = int(sizes_host[:, 1].max()) if B else 0
        else:
            out_h, out_w = _size(size, op)
        sizes_t = _device_rows(sizes, B, 2, dev, op, "sizes", "(height, width)")
    out_h, out_w = _padded(out_h, pm), _padded(out_w, pm)
    out = _ragged_op(op)(
        rb.data,
        rb.index,
        C,
        rb.channels_first,
        _device_rows(boxes, B, 4, dev, op, "boxes", "(top, left, height, width)"),
        sizes_t,
        _per_sample(flip, B, dev, torch.bool, False, op, "flip"),
        _channels(mean, C, dev, op, "mean"),
        _channels(std, C, dev, op, "std"),
        out_h,
        out_w,
        _out_dtype(dtype, op),
        bool(antialias),
        float(fill),
    )
    return out[0] if unbatched else out


def _cmn_ragged(images, mean, std, size, crop, flip, dtype, pad_multiple, fill):
    op = "crop_mirror_normalize"
    rb = as_ragged(images, op)
    if rb.dtype != torch.uint8:
        raise TypeError(f"gpu_ops.{op}: expected uint8 images, got {rb.dtype}")
    B, C, dev = len(rb), rb.channels, rb.device
    if not 1 <= C <= 4:
        raise ValueError(f"gpu_ops.{op}: expected 1 to 4 channels, got {C}")
    if size is None:
        raise ValueError(f"gpu_ops.{op}: images of different sizes need size=(out_h, out_w)")
    out_h, out_w = _size(size, op)
    if crop is None:  # centred per sample
        crop = torch.stack(((rb.sizes[:, 0] - out_h) // 2, (rb.sizes[:, 1] - out_w) // 2), dim=1)
    out = _ragged_op(op)(
        rb.data,
        rb.index,
        C,
        rb.channels_first,
        _device_rows(crop, B, 2, dev, op, "crop", "(top, left)"),
        _per_sample(flip, B, dev, torch.bool, False, op, "flip"),
        _channels(mean, C, dev, op, "mean"),
        _channels(std, C, dev, op, "std"),
        out_h,
        out_w,
        _out_dtype(dtype, op),
        _pad_multiple(pad_multiple, op),
        float(fill),
    )
    return out


def _resize_mode(mode: str, op: str) -> int:
    """The kernels' code for a resize ``mode`` (dense and ragged resize share it)."""
    modes = {"bilinear": 0, "area": 1}
    if mode not in modes:
        raise ValueError(f"gpu_ops.{op}: expected mode 'bilinear' or 'area', got {mode!r}")
    return modes[mode]


def _warp_args(M: torch.Tensor, B: int, interpolation: str, inverse_map: bool, op: str):
    """Checked ``[B, 2, 3]`` output->input matrices and the interpolation code of warp_affine
    (dense and ragged share it). ``M`` is float64 on the images' device, ``[2, 3]`` or ``[B, 2, 3]``."""
    if M.dim() == 2:
        M = M.expand(B, 2, 3)
    if tuple(M.shape) != (B, 2, 3):
        raise ValueError(f"gpu_ops.{op}: expected matrix [{B}, 2, 3] or [2, 3], got {tuple(M.shape)}")
    if not inverse_map:
        M = invert_affine(M)
    modes = {"nearest": 0, "bilinear": 1}
    if interpolation not in modes:
        raise ValueError(f"gpu_ops.{op}: expected interpolation 'bilinear' or 'nearest', got {interpolation!r}")
    return M, modes[interpolation]


def _resize_ragged(images, size, mode, antialias):
    op = "resize"
    rb = as_ragged(images, op)
    _check_dtype(rb.data, op, _IMAGE_DTYPES)
    mode_id = _resize_mode(mode, op)
    out_h, out_w = _size(size, op)
    return _ragged_op(op)(rb.data, rb.index, rb.channels, rb.channels_first, out_h, out_w, mode_id, bool(antialias))


def _warp_affine_ragged(images, matrix, size, interpolation, fill, inverse_map):
    op = "warp_affine"
    rb = as_ragged(images, op)
    _check_dtype(rb.data, op, _IMAGE_DTYPES)
    B = len(rb)
    M = torch.as_tensor(matrix, dtype=torch.float64)
    if M.device.type == "cpu" and rb.device.type != "cpu":
        M = to_device(M.contiguous(), rb.device)
    M = M.to(rb.device)
    M, interp = _warp_args(M, B, interpolation, inverse_map, op)
    out_h, out_w = _size(size, op)
    return _ragged_op(op)(
        rb.data, rb.index, rb.channels, rb.channels_first, M.contiguous(), out_h, out_w, interp, float(fill)
    )


def adjust_color(
    images: torch.Tensor,
    *,
    brightness: Optional[TensorLike] = None,
    contrast: Optional[TensorLike] = None,
    saturation: Optional[TensorLike] = None,
    hue: Optional[TensorLike] = None,
) -> torch.Tensor:
    """Per-sample brightness, contrast, saturation and hue in one fused pass (+ one reduction).

    Semantics of ``torchvision.transforms.v2.functional.adjust_{brightness,contrast,saturation,
    hue}`` applied in that fixed order (ColorJitter shuffles the order per call), with values in
    [0, 1] (uint8 is divided by 255 and rounded back once at the end, where torchvision rounds
    after every step). Contrast blends with the mean grey level of the brightness-adjusted image.

    Args:
        images: RGB ``[B, 3, H, W]`` or ``[3, H, W]``; uint8, float16, bfloat16, float32, float64.
        brightness, contrast, saturation: factors (1 = unchanged), scalar or ``[B]``.
        hue: shift in turns, in [-0.5, 0.5] (0 = unchanged), scalar or ``[B]``.

    Returns:
        Same shape and dtype as ``images``.

    Example:
        >>> x = torch.rand(4, 3, 8, 8)
        >>> adjust_color(x, brightness=torch.tensor([1.0, 1.2, 0.8, 1.0]), hue=0.1).shape
        torch.Size([4, 3, 8, 8])
    """
    op = "adjust_color"
    images, unbatched = _batched(images, op, "3, H, W")
    _check_dtype(images, op, _IMAGE_DTYPES)
    if images.shape[1] != 3:
        raise ValueError(f"gpu_ops.{op}: expected RGB images [B, 3, H, W], got {tuple(images.shape)}")
    B, dev = images.shape[0], images.device
    args = [
        _per_sample(v, B, dev, torch.float32, d, op, n)
        for v, d, n in (
            (brightness, 1.0, "brightness"),
            (contrast, 1.0, "contrast"),
            (saturation, 1.0, "saturation"),
            (hue, 0.0, "hue"),
        )
    ]
    out = _op(op)(images, *args)
    return out[0] if unbatched else out


# ------------------------------------------------------------------------------------------------
# CPU-only ops the readers call: no reference fallback (the readers have their own slow path), so
# each wrapper raises when the compiled kernel is missing; ``has_kernel`` says so beforehand.
# ------------------------------------------------------------------------------------------------
def has_kernel(name: str, device: str = "CPU") -> bool:
    """True when ``gpu_ops._C`` is loaded and holds a ``device`` kernel for op ``name``.

    Args:
        name: the op's name in the ``gpu_ops`` namespace, e.g. ``"decode_jpeg_crops"``.
        device: a dispatch key, ``"CPU"`` or ``"CUDA"``.

    Returns:
        False where the extension did not load, or was built from sources without the op.
    """
    if not EXTENSION_LOADED:
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"gpu_ops::{name}", device)
    except RuntimeError:  # no such op registered
        return False


_NATIVE: dict = {}  # op name -> its OpOverload, once found (a kernel found stays found)


def _native(name: str):
    op = _NATIVE.get(name)
    if op is None:
        if not has_kernel(name):
            raise RuntimeError(f"gpu_ops._C lacks {name} (not built, or built from older sources: "
                               "rebuild with `python -m gpu_ops.build`, libjpeg-turbo's headers installed)")
        op = _NATIVE[name] = getattr(torch.ops.gpu_ops, name).default
    return op


def decode_jpeg_crops(
    data: torch.Tensor,
    offsets: torch.Tensor,
    boxes: torch.Tensor,
    flip: torch.Tensor,
    out: torch.Tensor,
    errors: torch.Tensor,
    channels_last: bool,
    dct_scale: int = 0,
    antialias: bool = True,
    clip_to_box: bool = True,
    fast_dct: bool = False,
    threads: int = 0,
) -> None:
    """Decodes a batch of JPEGs straight into resized crops, in place (``cpu/jpeg_decode.cpp``:
    libjpeg-turbo on ATen's thread pool, the GIL released for the call). CPU only.

    :func:`readers.crops.decode_crops` is the friendly front (packing, sizes, error list); this is
    the op itself, with ``boxes`` and ``flip`` converted to the dtypes the kernel takes.

    Args:
        data: 1-D contiguous uint8, the JPEG bytes back to back.
        offsets: int64 ``[B + 1]`` (image b is ``data[offsets[b]:offsets[b+1]]``) or ``[B, 2]``
            (start, end) spans.
        boxes: ``[B, 4]`` top, left, height, width in stored pixels (any float dtype).
        flip: ``[B]``, True where the crop is mirrored left-right.
        out: uint8 ``[B, C, H, W]`` (or ``[B, H, W, C]`` with ``channels_last``), ``C`` 1 or 3:
            written in place, its ``H x W`` the output size.
        errors: uint8 ``[B, >=16]``, written in place: row b gets sample b's NUL-terminated
            message, empty where it decoded.
        channels_last: ``out`` is ``[B, H, W, C]``.
        dct_scale: 0 picks the smallest DCT scale that still covers the crop, else k of k/8
            (1, 2, 4 or 8).
        antialias: antialiased downscaling (as ``torchvision``'s ``antialias=True``).
        clip_to_box: the crop is the box (RandomResizedCrop); False resizes the whole image and
            cuts the box out of it (center crop).
        fast_dct: libjpeg's IFAST integer IDCT instead of the exact ISLOW one.
        threads: decode threads for this call (0: ``torch.get_num_threads()``).

    Raises:
        RuntimeError: ``gpu_ops._C`` lacks the kernel, or an argument has the wrong shape, dtype
            or device (the kernel's message names it). A JPEG that does not decode is no error:
            its row of ``errors`` says why.
    """
    _native("decode_jpeg_crops")(data, offsets, boxes.to(torch.float64).contiguous(),
                                 flip.to(torch.bool).contiguous(), out, errors, bool(channels_last),
                                 int(dct_scale), bool(antialias), bool(clip_to_box), bool(fast_dct),
                                 int(threads))


def gather_check_xxh3(
    data: torch.Tensor,
    spans: torch.Tensor,
    digests: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    threads: int = 0,
) -> torch.Tensor:
    """Checks a batch of records against their XXH3-128 digests and, with ``out``, copies them
    back to back into it first (``cpu/records.cpp``: one call, the GIL released). CPU only.

    No argument is converted here, on purpose: every torch call hands the GIL back and forth, and
    :meth:`readers.raw.RecordIndex.native_spans` calls this once per batch beside other threads.

    Args:
        data: 1-D contiguous uint8 (a store file's map, or any buffer).
        spans: int64 ``[B, 2]``: record b is ``data[spans[b][0]:spans[b][1]]``.
        digests: uint8 ``[B, 16]``, canonical (big-endian) XXH3-128 as
            ``xxhash.xxh3_128_digest`` gives it; None: no check.
        out: 1-D contiguous uint8 of at least the records' total length, not overlapping
            ``data``: record b is copied after the ones before it and the copy is what is
            checked. None: nothing copied.
        threads: threads for the call (0: ``torch.get_num_threads()``).

    Returns:
        bool ``[B]``: True where a record's digest does not match (all False without digests).

    Raises:
        RuntimeError: ``gpu_ops._C`` lacks the kernel, or a bad argument (a span outside
            ``data``, ``out`` too small or overlapping ``data``, wrong dtypes or shapes).
    """
    return _native("gather_check_xxh3")(data, spans, digests, out, threads)
