"""Ragged batches in gpu_ops: one call on images of different sizes equals per-image dense calls,
the CPU and CUDA kernels match the pure-torch reference, and CUDA matches CPU (CUDA cases are
marked ``cuda``)."""

from __future__ import annotations

import pytest
import torch

import gpu_ops
from gpu_ops import RaggedBatch
from tests.gpu_ops_helpers import assert_close, cpu_and_cuda, prepare_device, use_reference

SIZES = [(30, 41), (17, 55), (64, 20), (1, 1), (33, 33)]
MEAN, STD = [123.7, 116.3, 103.5], [58.4, 57.1, 57.4]


def images(dtype=torch.uint8, C=3, seed=0, sizes=SIZES):
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in sizes:
        if dtype == torch.uint8:
            out.append(torch.randint(0, 256, (h, w, C), generator=g, dtype=torch.uint8))
        else:
            out.append(torch.rand((h, w, C), generator=g, dtype=torch.float64).to(dtype))
    return out


def chw_stored(imgs):
    """The same images stored channels first (as torchvision's decode_jpeg returns them)."""
    return [im.permute(2, 0, 1).contiguous().permute(1, 2, 0) for im in imgs]


def on(dev, imgs):
    return [im.to(dev) for im in imgs]


def packed(imgs, channels_first):
    """The images as one ragged buffer stored channels first or last (RaggedBatch.from_list):
    (data, index, channels_first). One channel is the same either way (stored channels last)."""
    rb = gpu_ops.RaggedBatch.from_list(chw_stored(imgs) if channels_first else imgs)
    assert rb.channels_first == channels_first or rb.channels == 1
    return rb.data, rb.index, rb.channels_first


def check_three_ways(fn, imgs, device, atol=0.0, rtol=0.0, cuda_atol=None):
    """fn(list) on `device` == fn with the reference on the CPU; CUDA == CPU kernel; CHW-stored
    input gives the same result. Returns the device result."""
    prepare_device(device)
    out = fn(on(device, imgs))
    with use_reference():
        ref = fn(imgs)
    assert_close(out, ref, atol, rtol, "ragged kernel vs reference")
    if device == "cuda":
        assert_close(out, fn(imgs), atol if cuda_atol is None else cuda_atol, rtol, "CUDA vs CPU kernel")
    assert_close(fn(on(device, chw_stored(imgs))), out, 0, 0, "CHW-stored vs HWC-stored input")
    return out


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rcmn_ragged_equals_per_image(device, antialias, dtype):
    imgs = images()
    sizes = torch.tensor([im.shape[:2] for im in imgs])
    p = gpu_ops.RandomResizedCrop(24).sample(sizes, torch.Generator().manual_seed(1))

    def fn(x):
        return gpu_ops.resized_crop_mirror_normalize(x, p.boxes, (24, 20), MEAN, STD, flip=p.flip,
                                                     antialias=antialias, dtype=dtype)

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    out = check_three_ways(fn, imgs, device, **tol)
    assert out.shape == (len(imgs), 3, 24, 20) and out.dtype == dtype
    for i, im in enumerate(imgs):
        one = gpu_ops.resized_crop_mirror_normalize(im.to(device)[None], p.boxes[i : i + 1], (24, 20), MEAN, STD,
                                                    flip=p.flip[i : i + 1], antialias=antialias, dtype=dtype)
        assert_close(out[i : i + 1], one, **tol, msg=f"sample {i} ragged vs dense")


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_rcmn_per_sample_sizes_pad_like_detection(device):
    imgs = images(sizes=[(40, 60), (25, 25), (70, 31)])
    sizes = torch.tensor([[20, 30], [25, 25], [35, 15]])
    boxes = torch.tensor([[0, 0, 40, 60], [0, 0, 25, 25], [0, 0, 70, 31]])

    def fn(x):
        return gpu_ops.resized_crop_mirror_normalize(x, boxes, None, MEAN, STD, sizes=sizes, pad_multiple=32,
                                                     fill=-1.0, antialias=True)

    out = check_three_ways(fn, imgs, device, atol=1e-5, rtol=1e-5)
    assert out.shape == (3, 3, 64, 32)  # max (35, 30) rounded up to 32
    for i, (h, w) in enumerate(sizes.tolist()):
        one = gpu_ops.resized_crop_mirror_normalize(imgs[i].to(device), boxes[i], (h, w), MEAN, STD, antialias=True)
        assert_close(out[i, :, :h, :w], one, 1e-5, 1e-5, f"sample {i}")
        assert bool((out[i, :, h:, :] == -1).all()) and bool((out[i, :, :, w:] == -1).all())
    # A dense batch with per-sample sizes goes the same way (no copy of the pixels).
    dense = torch.stack([im[:25, :25] for im in imgs]).to(device)
    o2 = gpu_ops.resized_crop_mirror_normalize(dense, [0, 0, 25, 25], None, MEAN, STD, sizes=sizes)
    assert o2.shape == (3, 3, 35, 30)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_cmn_ragged_equals_per_image(device):
    imgs = images()
    crop = torch.tensor([[0, 0], [-3, 5], [10, -2], [0, 0], [5, 5]])
    flip = torch.tensor([True, False, True, False, True])

    def fn(x):
        return gpu_ops.crop_mirror_normalize(x, MEAN, STD, size=(16, 18), crop=crop, flip=flip, pad_multiple=8,
                                             fill=7.0)

    out = check_three_ways(fn, imgs, device, atol=1e-6, rtol=1e-6)
    assert out.shape == (5, 3, 16, 24)
    for i, im in enumerate(imgs):
        one = gpu_ops.crop_mirror_normalize(im.to(device), MEAN, STD, size=(16, 18), crop=crop[i].tolist(),
                                            flip=bool(flip[i]), pad_multiple=8, fill=7.0)
        assert_close(out[i], one, 1e-6, 1e-6, f"sample {i}")
    # Default crop: centred per sample.
    centred = gpu_ops.crop_mirror_normalize(on(device, imgs), MEAN, STD, size=(8, 8))
    for i, im in enumerate(imgs):
        one = gpu_ops.crop_mirror_normalize(im.to(device), MEAN, STD, size=(8, 8))
        assert_close(centred[i], one, 1e-6, 1e-6, "centred")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bilinear", True), ("area", False)])
def test_resize_ragged_equals_per_image(device, dtype, mode, antialias):
    imgs = images(dtype)

    def fn(x):
        return gpu_ops.resize(x, (13, 21), mode=mode, antialias=antialias)

    tol = dict(atol=1) if dtype == torch.uint8 else dict(atol=2e-5, rtol=1e-5)
    out = check_three_ways(fn, imgs, device, **tol)
    assert out.shape == (5, 3, 13, 21) and out.dtype == dtype
    for i, im in enumerate(imgs):
        one = gpu_ops.resize(im.to(device).permute(2, 0, 1)[None].contiguous(), (13, 21), mode=mode,
                             antialias=antialias)
        assert_close(out[i : i + 1], one, **tol, msg=f"sample {i}")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
def test_warp_affine_ragged_equals_per_image(device, interpolation):
    imgs = images()
    g = torch.Generator().manual_seed(5)
    M = torch.zeros(5, 2, 3, dtype=torch.float64)
    ang = torch.rand(5, generator=g, dtype=torch.float64) * 3.0
    M[:, 0, 0], M[:, 0, 1], M[:, 1, 0], M[:, 1, 1] = ang.cos(), -ang.sin(), ang.sin(), ang.cos()
    M[:, :, 2] = torch.rand(5, 2, generator=g, dtype=torch.float64) * 20

    def fn(x):
        return gpu_ops.warp_affine(x, M, (19, 23), interpolation=interpolation, fill=9)

    out = check_three_ways(fn, imgs, device)
    for i, im in enumerate(imgs):
        one = gpu_ops.warp_affine(im.to(device).permute(2, 0, 1)[None].contiguous(), M[i : i + 1], (19, 23),
                                  interpolation=interpolation, fill=9)
        assert_close(out[i : i + 1], one, 0, 0, f"sample {i}")


def test_ragged_batch_packing():
    imgs = images(sizes=[(4, 6), (5, 2)])
    rb = RaggedBatch.from_list(imgs)
    assert rb.index.tolist() == [[0, 4, 6], [72, 5, 2]] and rb.layout == "HWC" and len(rb) == 2
    assert all(torch.equal(a, b) for a, b in zip(rb.unbind(), imgs))
    rb2 = RaggedBatch.from_list(chw_stored(imgs))
    assert rb2.layout == "CHW" and all(torch.equal(a, b) for a, b in zip(rb2.unbind(), imgs))
    mixed = RaggedBatch.from_list([imgs[0], chw_stored(imgs)[1]])  # one copied into the other's order
    assert all(torch.equal(a, b) for a, b in zip(mixed.unbind(), imgs))
    empty = RaggedBatch.from_list([])
    assert len(empty) == 0
    out = gpu_ops.resized_crop_mirror_normalize(empty, torch.zeros(0, 4, dtype=torch.int64), 8, 0.0, 1.0)
    assert out.shape == (0, 3, 8, 8)


def test_ragged_bad_input_names_the_problem():
    imgs = images(sizes=[(4, 6), (5, 2)])
    with pytest.raises(ValueError, match="image 1 has 1 channels"):
        RaggedBatch.from_list([imgs[0], imgs[1][:, :, :1]])
    with pytest.raises(ValueError, match=r"image 1 has shape \(5, 2\)"):
        RaggedBatch.from_list([imgs[0], imgs[1][:, :, 0]])
    with pytest.raises(ValueError, match="image 0 is torch.float32"):
        RaggedBatch.from_list([imgs[0].float(), imgs[1]])
    with pytest.raises(ValueError, match="image 0 is empty"):
        RaggedBatch.from_list([imgs[0][:0]])
    with pytest.raises(ValueError, match=r"expected boxes \[2, 4\]"):
        gpu_ops.resized_crop_mirror_normalize(imgs, torch.zeros(3, 4, dtype=torch.int64), 8, 0.0, 1.0)
    with pytest.raises(ValueError, match="need size"):
        gpu_ops.crop_mirror_normalize(imgs, 0.0, 1.0)
    rb = RaggedBatch.from_list(imgs)
    short = RaggedBatch(rb.data[:50], rb.index, rb.sizes, 3, "HWC")
    with pytest.raises(ValueError, match="needs 102 elements, data holds 50"):
        gpu_ops.resize(short, 4)


@pytest.mark.skipif(not gpu_ops.EXTENSION_LOADED, reason=f"gpu_ops._C did not load: {gpu_ops.EXTENSION_ERROR}")
def test_cpu_kernel_checks_bounds_itself():
    """Called directly (no wrapper), the CPU kernel refuses an index outside the buffer."""
    data = torch.zeros(10, dtype=torch.uint8)
    index = torch.tensor([[0, 2, 2], [8, 2, 2]])
    with pytest.raises(RuntimeError, match="sample 1 .* does not lie inside the packed buffer of 10"):
        torch.ops.gpu_ops.resize_ragged(data, index, 1, False, 2, 2, 0, False)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_sampler_per_sample_sizes(device):
    prepare_device(device)
    sizes = torch.tensor([[375, 500], [1080, 1920], [50, 3000], [3000, 40]])
    rrc = gpu_ops.RandomResizedCrop(224)
    gen = torch.Generator(device=device).manual_seed(7)
    p = rrc.sample(sizes, gen)
    assert p.boxes.device.type == device
    b = p.boxes.cpu()
    assert bool((b[:, 0] >= 0).all() and (b[:, 1] >= 0).all())
    assert bool((b[:, 0] + b[:, 2] <= sizes[:, 0]).all() and (b[:, 1] + b[:, 3] <= sizes[:, 1]).all())
    again = rrc.sample(sizes, torch.Generator(device=device).manual_seed(7))
    assert torch.equal(p.boxes, again.boxes) and torch.equal(p.flip, again.flip)
    # Same draws as one scalar-size call per size when all sizes are equal.
    same = torch.tensor([[375, 500]] * 6)
    a = rrc.sample(same, torch.Generator().manual_seed(3))
    c = rrc.generate_parameters(6, 375, 500, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.boxes, c.boxes) and torch.equal(a.flip, c.flip)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("channels_first", [False, True])
def test_all_channels_of_a_pixel_at_once_equal_one_channel_at_a_time(device, channels_first):
    """Images of up to 4 channels are resampled all channels of a pixel at once (common.h's
    resample_pixel / sample_window_pixel), more channels one channel at a time (resample_at /
    sample_window): the first 4 channels of a 5-channel image must come out bit for bit as the
    4-channel image cut from it, for bilinear, antialiased and area resizes, windows wider than
    32 columns (the per-channel fallback) and upscales, and for crop-resize-normalize (ragged and
    dense; on the CPU those two run a separable kernel of their own)."""
    prepare_device(device)
    sizes = [(37, 53), (120, 90), (40, 700), (5, 5)]
    five = images(torch.uint8, C=5, seed=3, sizes=sizes)

    def pack(C):
        data, index, _ = packed([im[..., :C] for im in five], channels_first)
        return data.to(device), index.to(device)

    (d5, i5), (d4, i4) = pack(5), pack(4)
    for oh, ow in [(13, 9), (224, 224), (60, 8)]:
        for mode, aa in [(0, False), (0, True), (1, False)]:
            a = torch.ops.gpu_ops.resize_ragged(d5, i5, 5, channels_first, oh, ow, mode, aa)[:, :4]
            b = torch.ops.gpu_ops.resize_ragged(d4, i4, 4, channels_first, oh, ow, mode, aa)
            assert torch.equal(a, b), f"resize to {oh}x{ow}, mode {mode}, antialias {aa}"
    # Crop-resize-normalize takes 1 to 4 channels: against the 5-channel float resize above (one
    # channel at a time; uint8 and float sources sum the same floats), normalized here, with whole-
    # image boxes and no flip. The dense op: the images of one size.
    mean, std = torch.tensor([100.0, 120.0, 140.0, 160.0], device=device), torch.tensor([50.0, 51.0, 52.0, 53.0],
                                                                                        device=device)
    no_flip = torch.zeros(len(sizes), dtype=torch.bool, device=device)
    whole = torch.tensor([[0, 0, h, w] for h, w in sizes], device=device)
    same = torch.stack([im[:37, :53, :4] for im in five[:2]]).to(device)  # the dense op: one size
    for aa in (False, True):
        ref = torch.ops.gpu_ops.resize_ragged(d5.float(), i5, 5, channels_first, 24, 20, 0, aa)[:, :4]
        ref = (ref - mean.view(1, 4, 1, 1)) * (1.0 / std).view(1, 4, 1, 1)
        out = torch.ops.gpu_ops.resized_crop_mirror_normalize_ragged(
            d4, i4, 4, channels_first, whole, torch.tensor([[24, 20]] * len(sizes), device=device), no_flip, mean,
            std, 24, 20, torch.float32, aa, 0.0)
        assert torch.equal(out, ref), f"ragged crop-resize-normalize, antialias {aa}"
        ref = torch.ops.gpu_ops.resize_ragged(d5[: 37 * 53 * 5].float(), i5[:1], 5, channels_first, 24, 20, 0, aa)
        ref = (ref[:, :4] - mean.view(1, 4, 1, 1)) * (1.0 / std).view(1, 4, 1, 1)
        out = torch.ops.gpu_ops.resized_crop_mirror_normalize(
            same, whole[:1].repeat(2, 1), no_flip[:2], mean, std, 24, 20, torch.float32, aa, 1, 0.0)
        assert torch.equal(out[:1], ref), f"dense crop-resize-normalize, antialias {aa}"


@pytest.mark.cuda
@pytest.mark.parametrize("channels_first", [False, True])
def test_cuda_resampling_equals_the_cpu_kernels_bit_for_bit(channels_first):
    """The resampling arithmetic of common.h spells out every rounding (add_rn / mul_rn), so nvcc
    fuses nothing into an fma and the CUDA kernels give the CPU kernels' bits (the CPU's crop-
    resize runs its own separable kernel, the same sums in the same order): plain and antialiased
    bilinear and area resizes, down and up, and crop-resize-normalize with random boxes and flips,
    ragged and dense, 1 to 4 channels and 5 (one channel at a time)."""
    prepare_device("cuda")
    sizes = [(37, 53), (120, 90), (40, 700), (5, 5), (375, 500)]
    for C in (1, 3, 4, 5):
        data, index, layout = packed(images(torch.uint8, C=C, seed=C, sizes=sizes), channels_first)
        for src in (data, data.float()):
            for oh, ow in [(13, 9), (224, 224), (60, 8)]:
                for mode, aa in [(0, False), (0, True), (1, False)]:
                    args = (C, layout, oh, ow, mode, aa)
                    cpu = torch.ops.gpu_ops.resize_ragged(src, index, *args)
                    cuda = torch.ops.gpu_ops.resize_ragged(src.cuda(), index.cuda(), *args).cpu()
                    assert torch.equal(cuda, cpu), f"resize {src.dtype} C={C} to {oh}x{ow}, mode {mode}, aa {aa}"
        if C > 4:
            continue
        p = gpu_ops.RandomResizedCrop(24).sample(torch.tensor(sizes), torch.Generator().manual_seed(C))
        mean, std = torch.tensor([100.0, 120.0, 140.0, 160.0][:C]), torch.tensor([50.0, 51.0, 52.0, 53.0][:C])
        out_sizes = torch.tensor([[24, 20]] * len(sizes))
        dense = torch.stack(images(torch.uint8, C=C, seed=9, sizes=[(375, 500)] * 3))
        q = gpu_ops.RandomResizedCrop(224).sample(torch.tensor([[375, 500]] * 3), torch.Generator().manual_seed(2))
        for aa in (False, True):
            args = (C, layout)
            rest = (mean, std, 24, 20, torch.float32, aa, 0.0)
            cpu = torch.ops.gpu_ops.resized_crop_mirror_normalize_ragged(
                data, index, *args, p.boxes, out_sizes, p.flip, *rest)
            cuda = torch.ops.gpu_ops.resized_crop_mirror_normalize_ragged(
                data.cuda(), index.cuda(), *args, p.boxes.cuda(), out_sizes.cuda(), p.flip.cuda(),
                *(t.cuda() if isinstance(t, torch.Tensor) else t for t in rest)).cpu()
            assert torch.equal(cuda, cpu), f"ragged crop-resize-normalize C={C}, aa {aa}"
            dense_rest = (mean, std, 224, 224, torch.float32, aa, 1, 0.0)
            cpu = torch.ops.gpu_ops.resized_crop_mirror_normalize(dense, q.boxes, q.flip, *dense_rest)
            cuda = torch.ops.gpu_ops.resized_crop_mirror_normalize(
                dense.cuda(), q.boxes.cuda(), q.flip.cuda(),
                *(t.cuda() if isinstance(t, torch.Tensor) else t for t in dense_rest)).cpu()
            assert torch.equal(cuda, cpu), f"dense crop-resize-normalize C={C}, aa {aa}"
