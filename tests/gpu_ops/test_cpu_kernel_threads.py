"""gpu_ops' CPU kernels split their rows over torch.get_num_threads() threads
(gpu_ops/csrc/cpu/parallel.h): any thread count gives the same bytes as one thread, on dense and
ragged batches, with row counts that do not divide evenly."""
from __future__ import annotations

import contextlib

import pytest
import torch

import gpu_ops

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not gpu_ops.EXTENSION_LOADED,
                                 reason=f"gpu_ops._C did not load: {gpu_ops.EXTENSION_ERROR}")]

MEAN, STD = [120.0, 110.0, 100.0], [60.0, 55.0, 50.0]


@contextlib.contextmanager
def threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _batch(b=7, h=53, w=67, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, h, w, 3), dtype=torch.uint8, generator=g)


def _ragged(seed=1):
    g = torch.Generator().manual_seed(seed)
    sizes = [(37, 41), (64, 23), (19, 80), (55, 55), (8, 9)]
    return [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g) for h, w in sizes]


def _cases():
    nhwc = _batch()
    nchw = nhwc.permute(0, 3, 1, 2).contiguous()
    crop = torch.tensor([[0, 0], [-3, 5], [10, -2], [4, 4], [20, 30], [1, 1], [0, 7]])
    flip = torch.tensor([True, False, True, False, True, True, False])
    boxes = torch.tensor([[2, 3, 40, 50], [0, 0, 53, 67], [10, 5, 20, 60], [5, 5, 30, 30], [1, 2, 3, 4],
                          [0, 10, 50, 50], [7, 7, 40, 40]])
    theta = torch.tensor([[0.9, 0.1, 3.0], [-0.1, 0.95, 2.0]]).expand(7, 2, 3).contiguous()
    ragged = _ragged()
    rb = torch.tensor([[2, 3, 30, 30], [0, 0, 60, 20], [1, 5, 15, 70], [5, 5, 45, 45], [0, 0, 8, 9]])
    return {
        "crop_mirror_normalize": lambda: gpu_ops.crop_mirror_normalize(
            nhwc, MEAN, STD, size=(29, 31), crop=crop, flip=flip, pad_multiple=8, fill=3.0),
        "resized_crop_mirror_normalize": lambda: gpu_ops.resized_crop_mirror_normalize(
            nhwc, boxes, (33, 27), MEAN, STD, flip=flip, antialias=True),
        "resize": lambda: gpu_ops.resize(nchw, (31, 45), antialias=True),
        "resize_float": lambda: gpu_ops.resize(nchw.float(), (71, 29)),
        "warp_affine": lambda: gpu_ops.warp_affine(nchw.float(), theta, (47, 61)),
        "warp_affine_nearest": lambda: gpu_ops.warp_affine(nchw, theta, (47, 61), interpolation="nearest"),
        "adjust_color": lambda: gpu_ops.adjust_color(nchw, brightness=1.1, contrast=0.8, saturation=1.3, hue=0.07),
        "ragged_rcmn": lambda: gpu_ops.resized_crop_mirror_normalize(
            ragged, rb, (24, 20), MEAN, STD, flip=flip[:5], antialias=True),
        "ragged_cmn": lambda: gpu_ops.crop_mirror_normalize(ragged, MEAN, STD, size=(16, 18),
                                                            crop=crop[:5], flip=flip[:5], pad_multiple=8),
        "ragged_resize": lambda: gpu_ops.resize(ragged, (21, 17)),
        "ragged_warp": lambda: gpu_ops.warp_affine(ragged, theta[:5], (30, 30)),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_every_thread_count_gives_the_bytes_of_one_thread(name):
    fn = _cases()[name]
    with threads(1):
        one = fn()
    for n in (2, 3, 8):
        with threads(n):
            many = fn()
        assert many.dtype == one.dtype and many.shape == one.shape
        assert torch.equal(many, one), f"{name}: {n} threads differ from 1 thread"


def test_threads_inside_dataloader_style_single_thread_process():
    """torch.set_num_threads(1) (what DataLoader workers run with) runs inline and still works."""
    fn = _cases()["crop_mirror_normalize"]
    with threads(1):
        a = fn()
    with threads(1):
        b = fn()
    assert torch.equal(a, b)
