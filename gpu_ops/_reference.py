"""Pure-torch reference implementations of the gpu_ops kernels.

Each function takes exactly the arguments of its ``torch.ops.gpu_ops`` schema (positional, already
validated and converted by :mod:`gpu_ops.ops`). They are the oracle the tests hold the C++/CUDA
kernels to, and the fallback when ``gpu_ops._C`` did not load. They favour being obviously right
over being fast (resized_crop_mirror_normalize loops over the batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "warp_affine",
    "resize",
    "crop_mirror_normalize",
    "resized_crop_mirror_normalize",
    "adjust_color",
    "resized_crop_mirror_normalize_ragged",
    "crop_mirror_normalize_ragged",
    "resize_ragged",
    "warp_affine_ragged",
]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _to_out(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Accumulator -> storage type; uint8 rounds half up and saturates, like the kernels."""
    if dtype == torch.uint8:
        return torch.floor(x.clamp(0, 255) + 0.5).to(torch.uint8)
    return x.to(dtype)


def _fill_as(fill: float, dtype: torch.dtype) -> float:
    if dtype == torch.uint8:  # OpenCV's saturate_cast<uchar>: round half to even, clamp
        return float(min(255.0, max(0.0, float(torch.tensor(fill, dtype=torch.float64).round()))))
    return fill


def warp_affine(input, matrix, out_h, out_w, interpolation, fill):
    """cv2.warpAffine(..., INTER_LINEAR or INTER_NEAREST | WARP_INVERSE_MAP, BORDER_CONSTANT).

    Integer output coordinates are pixel centres; ``matrix`` maps them to input coordinates, which
    OpenCV rounds in fixed point (1/1024 for the affine terms, then 1/32 pixel for bilinear).
    """
    B, C, H, W = input.shape
    if B * C * out_h * out_w == 0:
        return input.new_empty((B, C, out_h, out_w))
    dev = input.device
    M = matrix.to(torch.float64)
    xs = torch.arange(out_w, dtype=torch.float64, device=dev)
    ys = torch.arange(out_h, dtype=torch.float64, device=dev)
    nearest = interpolation == 0
    rd = 512 if nearest else 16
    adx = torch.round(M[:, 0, 0, None] * xs * 1024).long()
    ady = torch.round(M[:, 1, 0, None] * xs * 1024).long()
    X0 = torch.round((M[:, 0, 1, None] * ys + M[:, 0, 2, None]) * 1024).long() + rd
    Y0 = torch.round((M[:, 1, 1, None] * ys + M[:, 1, 2, None]) * 1024).long() + rd
    X = (X0[:, :, None] + adx[:, None, :]).reshape(B, 1, -1)
    Y = (Y0[:, :, None] + ady[:, None, :]).reshape(B, 1, -1)
    fill_v = _fill_as(fill, input.dtype)
    flat = input.reshape(B, C, H * W)

    def tap(xx, yy):
        ok = (xx >= 0) & (xx < W) & (yy >= 0) & (yy < H)
        if H * W == 0:
            return torch.full((B, C, xx.shape[-1]), fill_v, dtype=input.dtype, device=dev)
        idx = torch.where(ok, yy * W + xx, 0).expand(B, C, -1)
        v = torch.gather(flat, 2, idx)
        return torch.where(ok, v, torch.tensor(fill_v, dtype=input.dtype, device=dev))

    if nearest:
        out = tap(X >> 10, Y >> 10)
    else:
        X, Y = X >> 5, Y >> 5
        x0, y0, fx, fy = X >> 5, Y >> 5, X & 31, Y & 31
        taps = [tap(x0, y0), tap(x0 + 1, y0), tap(x0, y0 + 1), tap(x0 + 1, y0 + 1)]
        ws = [(32 - fx) * (32 - fy), fx * (32 - fy), (32 - fx) * fy, fx * fy]
        if input.dtype == torch.uint8:
            acc = sum(t.to(torch.int64) * w for t, w in zip(taps, ws))
            out = ((acc + 512) >> 10).to(torch.uint8)
        else:
            A = _acc_dtype(input.dtype)
            k = 1.0 / 1024.0
            acc = taps[0].to(A) * (ws[0].to(A) * k)
            for t, w in zip(taps[1:], ws[1:]):
                acc = acc + t.to(A) * (w.to(A) * k)
            out = acc.to(input.dtype)
    return out.reshape(B, C, out_h, out_w)


def resize(input, out_h, out_w, mode, antialias):
    """F.interpolate(bilinear, align_corners=False, antialias) or F.interpolate(area)."""
    B, C, H, W = input.shape
    if B * C * out_h * out_w == 0:
        return input.new_empty((B, C, out_h, out_w))
    x = input.to(_acc_dtype(input.dtype))
    if mode == 1:
        y = F.interpolate(x, size=(out_h, out_w), mode="area")
    else:
        y = F.interpolate(
            x, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=antialias
        )
    return _to_out(y, input.dtype)


def _normalize_nchw(v, mean, std, fill, valid, pad_h, pad_w, out_dtype):
    """v: [B, h, w, C] float32 pixel values -> normalised, filled, padded, NCHW, out_dtype."""
    y = (v - mean) * (1.0 / std)
    y = torch.where(valid[..., None], y, torch.tensor(fill, dtype=torch.float32, device=v.device))
    y = y.permute(0, 3, 1, 2)
    y = F.pad(y, (0, pad_w, 0, pad_h), value=fill)
    return y.to(out_dtype).contiguous()


def _padded(n, m):
    return (n + m - 1) // m * m


def crop_mirror_normalize(input, crop, flip, mean, std, out_h, out_w, out_dtype, pad_multiple, fill):
    """uint8 NHWC -> out_dtype NCHW: crop at (top, left), optional horizontal flip of the window,
    (x - mean) * (1 / std), pixels outside the image and padding set to ``fill``."""
    B, H, W, C = input.shape
    Hp, Wp = _padded(out_h, pad_multiple), _padded(out_w, pad_multiple)
    if B * C * Hp * Wp == 0:
        return input.new_empty((B, C, Hp, Wp), dtype=out_dtype)
    dev = input.device
    ar_h = torch.arange(out_h, device=dev)
    ar_w = torch.arange(out_w, device=dev)
    ys = crop[:, 0, None] + ar_h  # [B, h]
    xs = crop[:, 1, None] + torch.where(flip[:, None], out_w - 1 - ar_w, ar_w)  # [B, w]
    valid = ((ys >= 0) & (ys < H))[:, :, None] & ((xs >= 0) & (xs < W))[:, None, :]
    if H * W == 0:
        v = torch.zeros((B, out_h, out_w, C), dtype=torch.float32, device=dev)
        return _normalize_nchw(v, mean, std, fill, valid, Hp - out_h, Wp - out_w, out_dtype)
    bi = torch.arange(B, device=dev)[:, None, None]
    v = input[bi, ys.clamp(0, max(H - 1, 0))[:, :, None], xs.clamp(0, max(W - 1, 0))[:, None, :]]
    return _normalize_nchw(
        v.float(), mean, std, fill, valid, Hp - out_h, Wp - out_w, out_dtype
    )


def resized_crop_mirror_normalize(
    input, boxes, flip, mean, std, out_h, out_w, out_dtype, antialias, pad_multiple, fill
):
    """Per sample: crop box (top, left, height, width) clipped to the image, resized to
    (out_h, out_w) with F.interpolate(bilinear, align_corners=False, antialias), optional
    horizontal flip, normalised, NCHW, padded with ``fill``. No intermediate rounding."""
    B, H, W, C = input.shape
    Hp, Wp = _padded(out_h, pad_multiple), _padded(out_w, pad_multiple)
    if B * C * Hp * Wp == 0:
        return input.new_empty((B, C, Hp, Wp), dtype=out_dtype)
    outs = []
    for b in range(B):
        top, left, h, w = (int(v) for v in boxes[b].tolist())
        top = min(max(top, 0), H - 1)
        left = min(max(left, 0), W - 1)
        h = min(max(h, 1), H - top)
        w = min(max(w, 1), W - left)
        crop = input[b, top : top + h, left : left + w].permute(2, 0, 1)[None].float()
        r = F.interpolate(
            crop, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=antialias
        )
        if bool(flip[b]):
            r = r.flip(-1)
        outs.append(r[0].permute(1, 2, 0))
    v = torch.stack(outs)
    valid = torch.ones((B, out_h, out_w), dtype=torch.bool, device=input.device)
    return _normalize_nchw(v, mean, std, fill, valid, Hp - out_h, Wp - out_w, out_dtype)


def _gray(x):
    return 0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]


def _shift_hue(x, hue):
    """torchvision.transforms.v2.functional.adjust_hue on [B, 3, H, W] floats in [0, 1], with a
    per-sample hue factor [B, 1, 1]."""
    r, g, _ = x.unbind(dim=1)
    minc, maxc = torch.aminmax(x, dim=1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    div = torch.where(eqc, ones, cr).unsqueeze(1)
    rc, gc, bc = ((maxc.unsqueeze(1) - x) / div).unbind(dim=1)
    neq_r = maxc != r
    eq_g = maxc == g
    hr = (bc - gc) * (~neq_r)
    hg = (2.0 + rc - bc) * (eq_g & neq_r)
    hb = (4.0 + gc - rc) * (neq_r & ~eq_g)
    h = torch.fmod((hr + hg + hb) * (1.0 / 6.0) + 1.0, 1.0)
    h = h + hue
    h = h - torch.floor(h)
    v = maxc
    h6 = h * 6.0
    fi = torch.floor(h6)
    f = h6 - fi
    i = torch.remainder(fi.to(torch.int32), 6)
    sxv = s * v
    p = (v - sxv).clamp(0.0, 1.0)
    q = (v - sxv * f).clamp(0.0, 1.0)
    t = (sxv * f + p).clamp(0.0, 1.0)
    mask = i.unsqueeze(1) == torch.arange(6, device=x.device).view(1, -1, 1, 1)
    a1 = torch.stack((v, q, p, p, t, v), dim=1)
    a2 = torch.stack((t, v, v, q, p, p), dim=1)
    a3 = torch.stack((p, p, t, v, v, q), dim=1)
    a4 = torch.stack((a1, a2, a3), dim=1)  # [B, 3, 6, H, W]
    return (a4 * mask.unsqueeze(1)).sum(dim=2)


def adjust_color(input, brightness, contrast, saturation, hue):
    """Per-sample brightness, contrast, saturation, hue (torchvision v2 semantics, fixed order) on
    [B, 3, H, W]; uint8 is processed as x / 255 and rounded back."""
    B = input.shape[0]
    if input.numel() == 0:
        return input.clone()
    u8 = input.dtype == torch.uint8
    x = input.float() / 255.0 if u8 else input.float()
    bf, cf, sf, hf = (t.view(B, 1, 1, 1) for t in (brightness, contrast, saturation, hue))
    x = (x * bf).clamp(0.0, 1.0)
    mean = _gray(x).to(torch.float64).mean(dim=(-2, -1)).float().view(B, 1, 1, 1)
    x = (cf * x + (1.0 - cf) * mean).clamp(0.0, 1.0)
    g = _gray(x).unsqueeze(1)
    x = (sf * x + (1.0 - sf) * g).clamp(0.0, 1.0)
    x = torch.where(hf != 0, _shift_hue(x, hf.view(B, 1, 1)), x)
    if u8:
        return _to_out(x * 255.0, torch.uint8)
    return x.to(input.dtype)


# ------------------------------------------------------------------------------------------------
# Ragged batches: each sample cut out of the packed buffer and run through the dense reference.
# ------------------------------------------------------------------------------------------------
def _ragged_samples(data, index, channels, channels_first):
    """[1, H, W, C] views (HWC order) of every sample of a packed buffer."""
    out = []
    for off, h, w in index.cpu().tolist():
        flat = data[off : off + h * w * channels]
        img = flat.view(channels, h, w).permute(1, 2, 0) if channels_first else flat.view(h, w, channels)
        out.append(img[None])
    return out


def resized_crop_mirror_normalize_ragged(
    data, index, channels, channels_first, boxes, sizes, flip, mean, std, out_h, out_w, out_dtype,
    antialias, fill
):
    """Per sample: the dense reference at its own size ``sizes[b]``, placed top-left on an
    ``out_h x out_w`` canvas of ``fill``."""
    B = index.shape[0]
    out = torch.full((B, channels, out_h, out_w), fill, dtype=out_dtype, device=data.device)
    for b, img in enumerate(_ragged_samples(data, index, channels, channels_first)):
        rh, rw = (min(int(v), m) for v, m in zip(sizes[b].tolist(), (out_h, out_w)))
        if rh <= 0 or rw <= 0:
            continue
        r = resized_crop_mirror_normalize(
            img.contiguous(), boxes[b : b + 1], flip[b : b + 1], mean, std, rh, rw, out_dtype,
            antialias, 1, fill
        )
        out[b, :, :rh, :rw] = r[0]
    return out


def crop_mirror_normalize_ragged(
    data, index, channels, channels_first, crop, flip, mean, std, out_h, out_w, out_dtype,
    pad_multiple, fill
):
    """Per sample: the dense reference."""
    B = index.shape[0]
    Hp, Wp = _padded(out_h, pad_multiple), _padded(out_w, pad_multiple)
    out = torch.empty((B, channels, Hp, Wp), dtype=out_dtype, device=data.device)
    for b, img in enumerate(_ragged_samples(data, index, channels, channels_first)):
        out[b] = crop_mirror_normalize(
            img.contiguous(), crop[b : b + 1], flip[b : b + 1], mean, std, out_h, out_w, out_dtype,
            pad_multiple, fill
        )[0]
    return out


def resize_ragged(data, index, channels, channels_first, out_h, out_w, mode, antialias):
    """Per sample: the dense reference on its ``[1, C, H, W]`` image."""
    B = index.shape[0]
    out = torch.empty((B, channels, out_h, out_w), dtype=data.dtype, device=data.device)
    for b, img in enumerate(_ragged_samples(data, index, channels, channels_first)):
        out[b] = resize(img.permute(0, 3, 1, 2).contiguous(), out_h, out_w, mode, antialias)[0]
    return out


def warp_affine_ragged(data, index, channels, channels_first, matrix, out_h, out_w, interpolation, fill):
    """Per sample: the dense reference on its ``[1, C, H, W]`` image."""
    B = index.shape[0]
    out = torch.empty((B, channels, out_h, out_w), dtype=data.dtype, device=data.device)
    for b, img in enumerate(_ragged_samples(data, index, channels, channels_first)):
        out[b] = warp_affine(
            img.permute(0, 3, 1, 2).contiguous(), matrix[b : b + 1], out_h, out_w, interpolation, fill
        )[0]
    return out
