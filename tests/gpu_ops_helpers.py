"""Shared helpers for the gpu_ops tests: device parametrization and one kernel check.

``cpu_and_cuda()`` follows torchvision's test/common_utils.py: the CUDA case carries the ``cuda``
marker and skips with a reason where there is no GPU, unless ``PACKER_REQUIRE_CUDA=1`` says a GPU
must be present (the GPU check script sets it), in which case it fails.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Dict, Iterable, Optional

import pytest
import torch

import gpu_ops.ops

REQUIRE_CUDA = os.environ.get("PACKER_REQUIRE_CUDA", "") == "1"


def cuda_available_or_skip() -> None:
    if torch.cuda.is_available():
        return
    if REQUIRE_CUDA:
        pytest.fail("PACKER_REQUIRE_CUDA=1 but torch.cuda.is_available() is False")
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


def gather_op_or_skip():
    """gpu_ops' record op (``gather_check_xxh3``), or a skip where gpu_ops._C lacks it (a failure
    with PACKER_GPU_OPS_STRICT=1)."""
    from readers.raw import _gather_op

    op = _gather_op()
    if op is None:
        if os.environ.get("PACKER_GPU_OPS_STRICT") == "1":
            pytest.fail("PACKER_GPU_OPS_STRICT=1 but gpu_ops._C lacks gather_check_xxh3")
        pytest.skip("gpu_ops._C lacks gather_check_xxh3 (build it: python -m gpu_ops.build)")
    return op


@pytest.fixture
def require_cuda():
    cuda_available_or_skip()


def cpu_and_cuda():
    """Parameter values for a ``device`` argument: "cpu", and "cuda" marked ``cuda``."""
    return ("cpu", pytest.param("cuda", marks=pytest.mark.cuda, id="cuda"))


def prepare_device(device: str) -> None:
    if device == "cuda":
        cuda_available_or_skip()


@contextlib.contextmanager
def use_reference():
    """Makes the public wrappers call the pure-torch reference instead of the kernels."""
    saved = gpu_ops.ops.EXTENSION_LOADED
    gpu_ops.ops.EXTENSION_LOADED = False
    try:
        yield
    finally:
        gpu_ops.ops.EXTENSION_LOADED = saved


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 0.0, rtol: float = 0.0,
                 msg: str = "") -> None:
    """Integer dtypes compare as integers within ``atol``; floats like torch.testing.assert_close."""
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{msg}: dtype {actual.dtype} != {expected.dtype}"
    actual, expected = actual.cpu(), expected.cpu()
    if not actual.dtype.is_floating_point:
        diff = (actual.to(torch.int64) - expected.to(torch.int64)).abs()
        worst = int(diff.max()) if diff.numel() else 0
        assert worst <= atol, f"{msg}: max integer difference {worst} > {atol} ({int((diff > atol).sum())} elements)"
        return
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=False, msg=lambda m: f"{msg}: {m}")


def _to(params: Dict, device) -> Dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}


def _slice(params: Dict, per_sample: Iterable[str], sl: slice) -> Dict:
    return {k: (v[sl] if k in per_sample else v) for k, v in params.items()}


def check_kernel(
    fn: Callable[..., torch.Tensor],
    images: torch.Tensor,
    params: Optional[Dict] = None,
    *,
    device: str = "cpu",
    per_sample: Iterable[str] = (),
    atol: float = 0.0,
    rtol: float = 0.0,
    cuda_atol: Optional[float] = None,
    cuda_rtol: Optional[float] = None,
    check_batched: bool = True,
    batch_atol: float = 0.0,
) -> torch.Tensor:
    """Runs ``fn(images, **params)`` on ``device`` and checks, like torchvision's check_kernel:

    * the result matches the pure-torch reference (``fn`` with the reference, on the CPU);
    * inputs are not mutated;
    * on CUDA, the result matches the CPU kernel (``cuda_atol``/``cuda_rtol``, default atol/rtol);
    * the batched result equals each sample run alone (exactly, unless ``batch_atol``: a CUDA
      reduction may sum in another order);
    * an empty batch gives an empty result of the right shape.

    ``per_sample`` names the params whose first dimension is the batch.
    """
    params = dict(params or {})
    per_sample = tuple(per_sample)
    x = images.to(device)
    p = _to(params, device)
    x_before = x.clone()
    p_before = {k: v.clone() for k, v in p.items() if isinstance(v, torch.Tensor)}
    out = fn(x, **p)
    assert torch.equal(x, x_before), "input images were mutated"
    for k, v in p_before.items():
        assert torch.equal(p[k], v), f"parameter {k} was mutated"
    assert out.device.type == torch.device(device).type

    with use_reference():
        ref = fn(images.cpu(), **_to(params, "cpu"))
    assert_close(out, ref, atol, rtol, "kernel vs reference")

    if torch.device(device).type == "cuda":
        cpu_out = fn(images.cpu(), **_to(params, "cpu"))
        assert_close(
            out,
            cpu_out,
            atol if cuda_atol is None else cuda_atol,
            rtol if cuda_rtol is None else cuda_rtol,
            "CUDA vs CPU kernel",
        )

    B = x.shape[0]
    if check_batched and B > 1:
        for i in range(B):
            one = fn(x[i : i + 1], **_slice(p, per_sample, slice(i, i + 1)))
            assert_close(one, out[i : i + 1], batch_atol, batch_atol and rtol, f"sample {i} alone vs batch")

    empty = fn(x[:0], **_slice(p, per_sample, slice(0, 0)))
    assert empty.shape == (0,) + tuple(out.shape[1:]), f"empty batch gave shape {tuple(empty.shape)}"
    return out
