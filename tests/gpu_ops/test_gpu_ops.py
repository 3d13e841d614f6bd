"""Tests for gpu_ops: CPU kernels against the pure-torch reference and OpenCV / F.interpolate, CUDA
kernels against the CPU kernels (marked ``cuda``), fake kernels, the loader's fallback."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gpu_ops
from gpu_ops import _loader
from tests.gpu_ops_helpers import assert_close, check_kernel, cpu_and_cuda, prepare_device, use_reference

cv2 = pytest.importorskip("cv2")

needs_ext = pytest.mark.skipif(
    not gpu_ops.EXTENSION_LOADED, reason=f"gpu_ops._C did not load: {gpu_ops.EXTENSION_ERROR}"
)

DTYPES = [torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64]
# (reference, CUDA-vs-CPU) tolerances per dtype for ops whose float arithmetic may differ by
# rounding (FMA on the GPU, another summation order in F.interpolate).
TOL = {
    torch.uint8: dict(atol=1, rtol=0),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.float64: dict(atol=2e-5, rtol=1e-5),
}


def make_images(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return torch.rand(shape, generator=g, dtype=torch.float64).to(dtype)


def random_affine(B, H, W, out_h, out_w, seed=0):
    """Rotations, scales, shears and shifts around the image centre, some reaching outside it."""
    g = np.random.default_rng(seed)
    Ms = []
    for _ in range(B):
        a = g.uniform(-math.pi, math.pi)
        s = g.uniform(0.5, 1.6)
        sh = g.uniform(-0.3, 0.3)
        R = np.array([[s * math.cos(a), -s * math.sin(a) + sh], [s * math.sin(a), s * math.cos(a)]])
        c_out = np.array([(out_w - 1) / 2, (out_h - 1) / 2])
        c_in = np.array([(W - 1) / 2, (H - 1) / 2]) + g.uniform(-0.3, 0.3, 2) * [W, H]
        t = c_in - R @ c_out
        Ms.append(np.concatenate([R, t[:, None]], axis=1))
    return torch.tensor(np.stack(Ms), dtype=torch.float64)


def cv2_warp(img_chw: torch.Tensor, M, out_h, out_w, nearest, fill, inverse=True):
    """cv2.warpAffine channel by channel, with Intel IPP switched off for the call: where OpenCV
    hands warpAffine to IPP (Intel CPUs) it rounds differently near the borders (seen: up to 5
    grey levels on the H100 host); OpenCV's own implementation is the oracle."""
    img = img_chw.permute(1, 2, 0).contiguous().numpy()
    flags = cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR
    if inverse:
        flags |= cv2.WARP_INVERSE_MAP
    used_ipp = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    try:
        outs = [
            torch.from_numpy(cv2.warpAffine(
                np.ascontiguousarray(img[:, :, c]), np.asarray(M, dtype=np.float64), (out_w, out_h),
                flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=float(fill)))
            for c in range(img.shape[2])
        ]
    finally:
        cv2.ipp.setUseIPP(used_ipp)
    return torch.stack(outs)


# ------------------------------------------------------------------------------------------------
# warp_affine
# ------------------------------------------------------------------------------------------------
def smooth_images(shape, dtype, seed=0):
    """Random images with at most ~45 grey levels per pixel of gradient: OpenCV's two warp
    implementations (see below) then agree with ours within 1 level."""
    B, C, H, W = shape
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand((B, C, max(2, H // 6), max(2, W // 6)), generator=g, dtype=torch.float64)
    x = F.interpolate(coarse, size=(H, W), mode="bilinear", align_corners=True)
    return (x * 255).round().to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)


def _opencv_warp_is_fixed_point() -> bool:
    """OpenCV computes warpAffine(INTER_LINEAR) in fixed point (1/32 pixel) up to 4.10, and where
    4.11+ does not dispatch its new float32 warp kernels (float coordinates with FMA; which path
    runs depends on the version and the CPU). Our kernels follow the fixed-point definition, so the
    bit-exact test below runs only where OpenCV does too."""
    x = make_images((1, 3, 37, 53), torch.uint8, seed=99)
    M = random_affine(1, 37, 53, 41, 47, seed=98)
    with use_reference():
        ours = gpu_ops.warp_affine(x, M, (41, 47))
    return torch.equal(ours[0], cv2_warp(x[0], M[0].numpy(), 41, 47, False, 0))


OPENCV_FIXED_POINT = _opencv_warp_is_fixed_point()


def interior(M, H, W, out_h, out_w):
    """Output pixels whose 2x2 bilinear taps lie inside the image with a 1-pixel margin."""
    ys, xs = np.mgrid[0:out_h, 0:out_w].astype(np.float64)
    M = np.asarray(M, dtype=np.float64)
    sx = M[0, 0] * xs + M[0, 1] * ys + M[0, 2]
    sy = M[1, 0] * xs + M[1, 1] * ys + M[1, 2]
    return torch.from_numpy((sx >= 1) & (sx <= W - 2) & (sy >= 1) & (sy <= H - 2))


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("shape,out", [((3, 3, 37, 53), (41, 47)), ((2, 1, 1, 1), (3, 2)), ((2, 4, 16, 9), (5, 31))])
def test_warp_affine_matches_opencv(interpolation, dtype, shape, out):
    """Within 1 grey level of cv2.warpAffine on smooth images, fixed-point OpenCV (4.x) or float32
    OpenCV (5.0). Where the output blends with the border fill the image is not smooth: OpenCV 5's
    exact coordinates and our 1/32-pixel ones then differ by up to |image - fill| / 64 + rounding
    (seen: 5 levels with cv2 5.0.0)."""
    B, C, H, W = shape
    x = smooth_images(shape, dtype, seed=1)
    M = random_affine(B, H, W, *out, seed=2)
    fill = 7 if dtype == torch.uint8 else 0.25
    got = gpu_ops.warp_affine(x, M, out, interpolation=interpolation, fill=fill)
    level = 1 if dtype == torch.uint8 else 1 / 255
    for b in range(B):
        want = cv2_warp(x[b], M[b].numpy(), *out, interpolation == "nearest", fill)
        diff = (got[b].double() - want.double()).abs()
        inside = interior(M[b], H, W, *out).expand_as(diff)
        if interpolation == "bilinear":
            worst = float(diff[inside].max()) if inside.any() else 0.0
            assert worst <= level * 1.0001, f"sample {b}: max diff {worst} inside"
            # Border: 1/64 pixel of coordinate difference times a jump of up to 255 levels, + rounding.
            assert diff.max() <= 6 * level * 1.0001, f"sample {b}: max diff at the border {diff.max()}"
        else:  # a coordinate within rounding error of a pixel boundary may pick the neighbour
            assert (diff > level * 1.0001).double().mean() <= 0.005, f"sample {b}: {(diff > level).sum()} pixels"
        if OPENCV_FIXED_POINT:
            assert diff.max() == 0 if dtype == torch.uint8 else diff.max() < 1e-5


@pytest.mark.skipif(not OPENCV_FIXED_POINT,
                    reason=f"cv2 {cv2.__version__} uses its float32 warp kernels here, not fixed point")
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("shape,out", [((3, 3, 37, 53), (41, 47)), ((2, 1, 1, 1), (3, 2)), ((2, 4, 16, 9), (5, 31))])
def test_warp_affine_bit_exact_vs_opencv_fixed_point(interpolation, dtype, shape, out):
    B, C, H, W = shape
    x = make_images(shape, dtype, seed=1)
    M = random_affine(B, H, W, *out, seed=2)
    fill = 7 if dtype == torch.uint8 else 0.25
    got = gpu_ops.warp_affine(x, M, out, interpolation=interpolation, fill=fill)
    for b in range(B):
        want = cv2_warp(x[b], M[b].numpy(), *out, interpolation == "nearest", fill)
        assert_close(got[b], want, atol=0 if dtype == torch.uint8 else 1e-5, rtol=1e-5, msg=f"sample {b}")


def test_warp_affine_forward_matrix_matches_opencv():
    x = smooth_images((2, 3, 29, 31), torch.uint8, seed=3)
    M = random_affine(2, 29, 31, 29, 31, seed=4)
    fwd = gpu_ops.invert_affine(M)  # a forward (input -> output) matrix
    got = gpu_ops.warp_affine(x, fwd, (29, 31), inverse_map=False)
    for b in range(2):
        want = cv2_warp(x[b], fwd[b].numpy(), 29, 31, False, 0, inverse=False)
        if OPENCV_FIXED_POINT:
            assert_close(got[b], want, atol=0, msg=f"sample {b}")
        else:
            inside = interior(M[b], 29, 31, 29, 31).expand_as(got[b])
            assert_close(got[b][inside], want[inside], atol=1, msg=f"sample {b} (interior)")


@pytest.mark.parametrize("fill,expected", [(300.0, 255), (127.5, 128), (126.5, 126), (-3.0, 0)])
def test_warp_affine_uint8_fill_rounds_like_opencv(fill, expected):
    x = make_images((1, 1, 4, 4), torch.uint8)
    M = torch.tensor([[1.0, 0, 100], [0, 1, 0]])  # everything outside
    out = gpu_ops.warp_affine(x, M, (2, 2), fill=fill)
    assert out.unique().tolist() == [expected]
    assert cv2_warp(x[0], M.numpy(), 2, 2, False, fill).unique().tolist() == [expected]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_warp_affine_kernel(device, interpolation, dtype):
    prepare_device(device)
    x = make_images((3, 3, 23, 18), dtype, seed=5)
    M = random_affine(3, 23, 18, 19, 26, seed=6)
    tol = dict(atol=0, rtol=0) if dtype == torch.uint8 or interpolation == "nearest" else TOL[dtype]
    check_kernel(
        lambda im, matrix: gpu_ops.warp_affine(im, matrix, (19, 26), interpolation=interpolation, fill=0.5),
        x, {"matrix": M}, device=device, per_sample=("matrix",), **tol,
    )


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_warp_affine_odd_inputs(device):
    prepare_device(device)
    # Non-contiguous input (channels-last strides and a strided slice), 1x1 images and outputs.
    x = make_images((2, 16, 12, 3), torch.uint8, seed=7).permute(0, 3, 1, 2)[:, :, ::2]
    assert not x.is_contiguous()
    M = random_affine(2, 8, 12, 5, 7, seed=8)
    check_kernel(lambda im, matrix: gpu_ops.warp_affine(im, matrix, (5, 7)), x, {"matrix": M},
                 device=device, per_sample=("matrix",))
    one = make_images((1, 2, 1, 1), torch.float32, seed=9).to(device)
    out = gpu_ops.warp_affine(one, torch.eye(2, 3), (1, 1))
    assert_close(out, one)
    unb = gpu_ops.warp_affine(one[0], torch.eye(2, 3), (1, 1))
    assert unb.shape == (2, 1, 1)


def test_warp_affine_errors():
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"expected matrix \[2, 2, 3\]"):
        gpu_ops.warp_affine(x, torch.zeros(3, 2, 3), (4, 4))
    with pytest.raises(ValueError, match="interpolation"):
        gpu_ops.warp_affine(x, torch.eye(2, 3), (4, 4), interpolation="cubic")
    with pytest.raises(TypeError, match="dtype"):
        gpu_ops.warp_affine(x.to(torch.int32), torch.eye(2, 3), (4, 4))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        gpu_ops.warp_affine(x[0, 0], torch.eye(2, 3), (4, 4))


@needs_ext
def test_warp_affine_cpp_checks_state_expected_and_observed():
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"expected matrix of shape \[2, 2, 3\], got \[2, 3, 2\]"):
        torch.ops.gpu_ops.warp_affine(x, torch.zeros(2, 3, 2, dtype=torch.float64), 4, 4, 1, 0.0)


# ------------------------------------------------------------------------------------------------
# resize
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bilinear", True), ("area", False)])
@pytest.mark.parametrize("out", [(7, 5), (31, 40), (13, 64)])
def test_resize_matches_interpolate(mode, antialias, out):
    x = make_images((2, 3, 17, 33), torch.float32, seed=10)
    got = gpu_ops.resize(x, out, mode=mode, antialias=antialias)
    kw = dict(align_corners=False, antialias=antialias) if mode == "bilinear" else {}
    assert_close(got, F.interpolate(x, size=out, mode=mode, **kw), atol=1e-5, rtol=1e-5)
    x8 = make_images((2, 3, 17, 33), torch.uint8, seed=11)
    got8 = gpu_ops.resize(x8, out, mode=mode, antialias=antialias)
    if mode == "bilinear":  # torch's own uint8 path rounds its intermediate: within 1
        assert_close(got8, F.interpolate(x8, size=out, mode=mode, **kw), atol=1)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bilinear", True), ("area", False)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_resize_kernel(device, mode, antialias, dtype):
    prepare_device(device)
    x = make_images((2, 3, 21, 30), dtype, seed=12)
    for out in [(9, 13), (40, 41)]:
        check_kernel(lambda im: gpu_ops.resize(im, out, mode=mode, antialias=antialias), x,
                     device=device, **TOL[dtype])


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_resize_odd_inputs(device):
    prepare_device(device)
    x = make_images((2, 5, 9, 1), torch.float32, seed=13).permute(0, 3, 1, 2)  # non-contiguous
    check_kernel(lambda im: gpu_ops.resize(im, (3, 4), antialias=True), x, device=device, **TOL[torch.float32])
    one = torch.full((1, 1, 1, 1), 0.75, device=device)
    assert_close(gpu_ops.resize(one, (3, 2)), torch.full((1, 1, 3, 2), 0.75, device=device))
    with pytest.raises(ValueError, match="mode"):
        gpu_ops.resize(one, (2, 2), mode="bicubic")


# ------------------------------------------------------------------------------------------------
# crop_mirror_normalize
# ------------------------------------------------------------------------------------------------
MEAN = [123.675, 116.28, 103.53, 90.0]
STD = [58.395, 57.12, 57.375, 50.0]


def chain_cmn(x, crop, flip, size, C, dtype):
    """What users write: per-sample slice + flip, then permute().float().sub().div()."""
    outs = []
    for b in range(x.shape[0]):
        t, l = crop[b].tolist()
        s = x[b, t : t + size[0], l : l + size[1]]
        if flip[b]:
            s = s.flip(1)
        outs.append(s)
    y = torch.stack(outs).permute(0, 3, 1, 2).float()
    m = torch.tensor(MEAN[:C]).view(1, C, 1, 1)
    sd = torch.tensor(STD[:C]).view(1, C, 1, 1)
    return y.sub(m).div(sd).to(dtype)


@pytest.mark.parametrize("C", [1, 3, 4])
def test_crop_mirror_normalize_matches_chain(C):
    x = make_images((4, 31, 45, C), torch.uint8, seed=14)
    crop = torch.tensor([[0, 0], [3, 7], [10, 2], [5, 14]])
    flip = torch.tensor([False, True, True, False])
    got = gpu_ops.crop_mirror_normalize(x, MEAN[:C], STD[:C], size=(21, 31), crop=crop, flip=flip)
    assert_close(got, chain_cmn(x, crop, flip, (21, 31), C, torch.float32), atol=1e-5, rtol=1e-6)


def test_crop_mirror_normalize_outside_and_padding():
    x = make_images((2, 6, 5, 3), torch.uint8, seed=15)
    crop = torch.tensor([[-2, -1], [4, 3]])
    out = gpu_ops.crop_mirror_normalize(x, 0.0, 1.0, size=(4, 4), crop=crop, pad_multiple=8, fill=-9.0)
    assert out.shape == (2, 3, 8, 8)
    assert (out[:, :, 4:] == -9).all() and (out[:, :, :, 4:] == -9).all()
    assert (out[0, :, :2] == -9).all() and (out[0, :, :, :1] == -9).all()
    assert_close(out[0, :, 2:4, 1:4], x[0, :2, :3].permute(2, 0, 1).float())
    assert_close(out[1, :, :2, :2], x[1, 4:, 3:].permute(2, 0, 1).float())
    assert (out[1, :, 2:4] == -9).all() and (out[1, :, :, 2:4] == -9).all()


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("C", [1, 2, 3, 4])
def test_crop_mirror_normalize_kernel(device, out_dtype, C):
    prepare_device(device)
    B, H, W = 5, 19, 37
    x = make_images((B, H, W, C), torch.uint8, seed=16 + C)
    g = torch.Generator().manual_seed(C)
    # Windows inside, across the edges and fully outside; widths that are and are not multiples of 4.
    for size, pad in [((12, 16), 1), ((11, 13), 1), ((16, 21), 32), ((H, W), 4)]:
        crop = torch.stack([torch.randint(-4, H - size[0] + 5, (B,), generator=g),
                            torch.randint(-5, W - size[1] + 6, (B,), generator=g)], 1)
        crop[0] = torch.tensor([0, 0])
        crop[1] = torch.tensor([H + 3, -W - 2])
        flip = torch.rand(B, generator=g) < 0.5
        check_kernel(
            lambda im, crop, flip: gpu_ops.crop_mirror_normalize(
                im, MEAN[:C], STD[:C], size=size, crop=crop, flip=flip, dtype=out_dtype,
                pad_multiple=pad, fill=0.5),
            x, {"crop": crop, "flip": flip}, device=device, per_sample=("crop", "flip"),
        )


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_crop_mirror_normalize_odd_inputs(device):
    prepare_device(device)
    # Non-contiguous NHWC view (odd storage offset) and a 1x1 image.
    base = make_images((3, 9, 11, 3), torch.uint8, seed=20)
    x = base[1:, 1:, 2:]  # offset storage, strided
    assert not x.is_contiguous()
    check_kernel(lambda im, flip: gpu_ops.crop_mirror_normalize(im, MEAN[:3], STD[:3], flip=flip),
                 x, {"flip": torch.tensor([True, False])}, device=device, per_sample=("flip",))
    one = torch.full((1, 1, 1, 3), 200, dtype=torch.uint8, device=device)
    out = gpu_ops.crop_mirror_normalize(one, 100.0, 50.0, pad_multiple=2)
    assert out.shape == (1, 3, 2, 2) and (out[..., 0, 0] == 2.0).all() and out.sum() == 6.0


def test_crop_mirror_normalize_errors():
    x = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8"):
        gpu_ops.crop_mirror_normalize(x.float(), 0.0, 1.0)
    with pytest.raises(ValueError, match="3 values"):
        gpu_ops.crop_mirror_normalize(x, [1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match=r"flip as a scalar or shape \[2\]"):
        gpu_ops.crop_mirror_normalize(x, 0.0, 1.0, flip=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="pad_multiple"):
        gpu_ops.crop_mirror_normalize(x, 0.0, 1.0, pad_multiple=0)
    with pytest.raises(ValueError, match="1 to 4 channels"):
        gpu_ops.crop_mirror_normalize(torch.zeros(1, 4, 4, 5, dtype=torch.uint8), 0.0, 1.0)


# ------------------------------------------------------------------------------------------------
# resized_crop_mirror_normalize
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("antialias", [False, True])
def test_resized_crop_mirror_normalize_matches_torch_chain(antialias):
    x = make_images((3, 40, 50, 3), torch.uint8, seed=21)
    boxes = torch.tensor([[0, 0, 40, 50], [5, 7, 13, 29], [20, 1, 19, 48]])
    flip = torch.tensor([True, False, True])
    got = gpu_ops.resized_crop_mirror_normalize(x, boxes, (24, 20), MEAN[:3], STD[:3], flip=flip, antialias=antialias)
    for b in range(3):
        t, l, h, w = boxes[b].tolist()
        crop = x[b : b + 1, t : t + h, l : l + w].permute(0, 3, 1, 2).float()
        r = F.interpolate(crop, size=(24, 20), mode="bilinear", align_corners=False, antialias=antialias)
        if flip[b]:
            r = r.flip(-1)
        want = (r - torch.tensor(MEAN[:3]).view(1, 3, 1, 1)) / torch.tensor(STD[:3]).view(1, 3, 1, 1)
        assert_close(got[b : b + 1], want, atol=1e-4, rtol=1e-5, msg=f"sample {b}")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("out_dtype,C",
                         [(torch.float32, 3), (torch.float16, 3), (torch.float32, 1), (torch.bfloat16, 4)])
def test_resized_crop_mirror_normalize_kernel(device, antialias, out_dtype, C):
    prepare_device(device)
    B, H, W = 4, 33, 47
    x = make_images((B, H, W, C), torch.uint8, seed=22)
    p = gpu_ops.RandomResizedCrop(16).generate_parameters(B, H, W, generator=torch.Generator().manual_seed(C))
    boxes = p.boxes.clone()
    boxes[0] = torch.tensor([-3, 40, 100, 100])  # clipped to the image
    tol = dict(atol=1e-4, rtol=1e-5) if out_dtype == torch.float32 else TOL[out_dtype]
    for size, pad in [((16, 16), 1), ((9, 70), 32)]:
        check_kernel(
            lambda im, boxes, flip: gpu_ops.resized_crop_mirror_normalize(
                im, boxes, size, MEAN[:C], STD[:C], flip=flip, dtype=out_dtype,
                antialias=antialias, pad_multiple=pad, fill=-1.0),
            x, {"boxes": boxes, "flip": p.flip}, device=device, per_sample=("boxes", "flip"), **tol,
        )


def test_random_resized_crop_parameters():
    H, W = 60, 90
    p = gpu_ops.RandomResizedCrop(32, scale=(0.2, 0.6)).generate_parameters(
        500, H, W, generator=torch.Generator().manual_seed(0))
    t, l, h, w = p.boxes.unbind(1)
    assert (t >= 0).all() and (l >= 0).all() and (t + h <= H).all() and (l + w <= W).all()
    frac = (h * w).double() / (H * W)
    assert frac.min() > 0.15 and frac.max() < 0.65
    assert 0.35 < p.flip.double().mean() < 0.65
    again = gpu_ops.RandomResizedCrop(32, scale=(0.2, 0.6)).generate_parameters(
        500, H, W, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.boxes, p.boxes) and torch.equal(again.flip, p.flip)


# ------------------------------------------------------------------------------------------------
# adjust_color
# ------------------------------------------------------------------------------------------------
def color_factors(B, seed=0):
    p = gpu_ops.RandomColorJitter(0.5, 0.5, 0.5, 0.3).generate_parameters(
        B, generator=torch.Generator().manual_seed(seed))
    hue = p.hue.clone()
    hue[0] = 0.0
    return {"brightness": p.brightness, "contrast": p.contrast, "saturation": p.saturation, "hue": hue}


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", DTYPES)
def test_adjust_color_kernel(device, dtype):
    prepare_device(device)
    x = make_images((4, 3, 13, 22), dtype, seed=23)
    x[1, :, :3] = x[1, 0:1, :3]  # grey pixels (hue undefined)
    tol = TOL[dtype] if dtype != torch.float32 else dict(atol=1e-5, rtol=1e-5)
    check_kernel(lambda im, **kw: gpu_ops.adjust_color(im, **kw), x, color_factors(4),
                 device=device, per_sample=("brightness", "contrast", "saturation", "hue"),
                 batch_atol=tol["atol"], **tol)


@pytest.mark.torchvision
def test_adjust_color_matches_torchvision():
    from torchvision.transforms.v2 import functional as v2
    x = make_images((3, 3, 11, 17), torch.float32, seed=24)
    f = torch.tensor([0.6, 1.0, 1.4])
    hues = torch.tensor([-0.3, 0.1, 0.45])
    for b in range(3):
        for kw, fn, val in [("brightness", v2.adjust_brightness, f[b]), ("contrast", v2.adjust_contrast, f[b]),
                            ("saturation", v2.adjust_saturation, f[b]), ("hue", v2.adjust_hue, hues[b])]:
            got = gpu_ops.adjust_color(x[b], **{kw: float(val)})
            assert_close(got, fn(x[b], float(val)), atol=2e-5, rtol=1e-5, msg=kw)


def test_adjust_color_identity_and_errors():
    x = make_images((2, 3, 5, 6), torch.uint8, seed=25)
    assert torch.equal(gpu_ops.adjust_color(x), x)
    with pytest.raises(ValueError, match="RGB"):
        gpu_ops.adjust_color(x[:, :2])
    with pytest.raises(ValueError, match=r"brightness as a scalar or shape \[2\]"):
        gpu_ops.adjust_color(x, brightness=torch.ones(3))


# ------------------------------------------------------------------------------------------------
# Dispatcher integration: fake kernels, torch.compile, loader
# ------------------------------------------------------------------------------------------------
def _op_cases():
    x = make_images((2, 3, 9, 10), torch.uint8)
    nhwc = make_images((2, 9, 10, 3), torch.uint8)
    f = torch.ones(2)
    m, s = torch.tensor(MEAN[:3]), torch.tensor(STD[:3])
    flip = torch.tensor([True, False])
    return [
        ("warp_affine", (x, random_affine(2, 9, 10, 5, 6), 5, 6, 1, 0.0)),
        ("resize", (x.float(), 4, 7, 0, True)),
        ("crop_mirror_normalize",
         (nhwc, torch.zeros(2, 2, dtype=torch.int64), flip, m, s, 5, 6, torch.float16, 4, 0.0)),
        ("resized_crop_mirror_normalize",
         (nhwc, torch.tensor([[0, 0, 9, 10], [1, 2, 5, 5]]), flip, m, s, 5, 6, torch.float32, False, 8, 0.0)),
        ("adjust_color", (x, f, f * 1.2, f * 0.8, f * 0.1)),
    ]


@needs_ext
@pytest.mark.parametrize("name,args", _op_cases(), ids=[c[0] for c in _op_cases()])
def test_opcheck(name, args):
    op = getattr(torch.ops.gpu_ops, name).default
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@needs_ext
def test_torch_compile_traces_the_ops():
    def pipeline(imgs, boxes, flip):
        x = gpu_ops.resized_crop_mirror_normalize(imgs, boxes, 8, MEAN[:3], STD[:3], flip=flip)
        return gpu_ops.warp_affine(x, torch.eye(2, 3), (8, 8)) * 2

    args = (make_images((2, 12, 14, 3), torch.uint8), torch.tensor([[0, 0, 12, 14], [2, 3, 6, 7]]),
            torch.tensor([False, True]))
    compiled = torch.compile(pipeline, backend="aot_eager", fullgraph=True)
    assert_close(compiled(*args), pipeline(*args))


def test_loader_falls_back_with_one_warning(monkeypatch):
    monkeypatch.delenv(_loader.STRICT_ENV, raising=False)

    def broken(name):
        raise ImportError("libcudart.so.13: cannot open shared object file")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded, err = _loader.load_extension(broken)
    assert not loaded and "libcudart" in str(err)
    assert len(caught) == 1 and "libcudart.so.13" in str(caught[0].message)
    assert "PACKER_GPU_OPS_STRICT" in str(caught[0].message)


def test_loader_strict_raises(monkeypatch):
    monkeypatch.setenv(_loader.STRICT_ENV, "1")

    def broken(name):
        raise OSError("undefined symbol: _ZN3c10")

    with pytest.raises(ImportError, match="undefined symbol") as info:
        _loader.load_extension(broken)
    assert isinstance(info.value.__cause__, OSError)


def test_fallback_ops_run_on_reference():
    """In a fresh interpreter where gpu_ops._C cannot load: one warning, ops still work."""
    code = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["gpu_ops._C"] = None  # makes `import gpu_ops._C` raise ImportError
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import torch, gpu_ops
            x = torch.randint(0, 256, (2, 8, 9, 3), dtype=torch.uint8)
            y = gpu_ops.crop_mirror_normalize(x, 1.0, 2.0, flip=True)
            z = gpu_ops.warp_affine(y, torch.eye(2, 3), (4, 4))
        msgs = [str(m.message) for m in w if "gpu_ops" in str(m.message)]
        assert not gpu_ops.EXTENSION_LOADED and len(msgs) == 1, msgs
        assert y.shape == (2, 3, 8, 9) and z.shape == (2, 3, 4, 4)
        print("ok")
        """
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != _loader.STRICT_ENV}
    env[_loader.BUILD_ENV] = "0"  # no on-demand build of the (hidden) kernels either
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
