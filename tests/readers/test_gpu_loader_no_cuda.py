"""GPULoader on a machine without CUDA: the CPU batches it then makes are said once, not silent.

``device=None`` (the default) picks CUDA where it is available; where it is not, the loader works on
the CPU and warns once per process; ``device="cpu"`` asks for that and warns nothing.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from readers.gpu import GPULoader, ValPipeline
from readers.gpu import loader as loader_mod
from tests.corpus import class_store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return class_store(tmp_path_factory.mktemp("nocuda"), 4, seed=5)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loader_mod, "_warned_no_cuda", False)


def _batches(loader):
    with loader:
        return [images for images, _labels in loader]


def test_without_cuda_the_default_device_is_the_cpu_and_it_says_so_once(store, no_cuda):
    with pytest.warns(RuntimeWarning, match=r"no CUDA device here .* on the CPU; pass device=\"cpu\""):
        loader = GPULoader(store, ValPipeline(32, 32), batch_size=2, threads=1)
    assert loader.device.type == "cpu"
    out = _batches(loader)
    assert len(out) == 2 and all(b.device.type == "cpu" and b.shape == (2, 3, 32, 32) for b in out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the second loader of the process: no second warning
        GPULoader(store, ValPipeline(32, 32), batch_size=2, threads=1).close()


def test_asking_for_the_cpu_warns_nothing(store, no_cuda):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = GPULoader(store, ValPipeline(32, 32), batch_size=2, threads=1, device="cpu")
    assert loader.device.type == "cpu" and len(_batches(loader)) == 2
    assert loader_mod._warned_no_cuda is False
