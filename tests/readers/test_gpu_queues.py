"""CUDA's hardware queues for the GPU loader (readers/gpu/queues.py): importing readers.gpu sets
CUDA_DEVICE_MAX_CONNECTIONS=32 when it is unset and CUDA has not started, keeps a value already in
the environment, reports what it did in gpu_info(), and warns once when CUDA started first.

Each case runs in a fresh interpreter: the setting is made once per process, at import."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)

ENV = "CUDA_DEVICE_MAX_CONNECTIONS"


def _run(code: str, value: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if value is not None:
        env[ENV] = value
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


_REPORT = """
import json, os, warnings
import torch
{before}
import readers.gpu
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    first = readers.gpu.queues.warn_if_late(torch.device({device!r}))
    second = readers.gpu.queues.warn_if_late(torch.device({device!r}))
print(json.dumps({{"env": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                  "info": readers.gpu.gpu_info("cpu")["cuda_queues"], "warned": [first, second],
                  "messages": [str(w.message) for w in seen]}}))
"""


@pytest.mark.timeout(120)
def test_import_sets_32_queues_when_unset():
    out = _run(_REPORT.format(before="", device="cuda"))
    assert out["env"] == "32"
    assert out["info"] == {"value": "32", "source": "readers.gpu"}
    assert out["warned"] == [False, False] and out["messages"] == []


@pytest.mark.timeout(120)
def test_a_value_in_the_environment_is_kept():
    out = _run(_REPORT.format(before="", device="cuda"), value="1")
    assert out["env"] == "1"
    assert out["info"] == {"value": "1", "source": "environment"}
    assert out["warned"] == [False, False]


@pytest.mark.timeout(120)
def test_cuda_started_first_leaves_the_variable_alone_and_warns_once_for_a_cuda_device():
    # torch says CUDA has started (a GPU test below starts it for real).
    out = _run(_REPORT.format(before="torch.cuda.is_initialized = lambda: True", device="cuda"))
    assert out["env"] is None
    assert out["info"]["value"] is None and out["info"]["source"].startswith("too late")
    assert out["warned"] == [True, False]
    assert len(out["messages"]) == 1 and f"{ENV}=32" in out["messages"][0]


@pytest.mark.timeout(120)
def test_no_warning_for_a_cpu_loader():
    out = _run(_REPORT.format(before="torch.cuda.is_initialized = lambda: True", device="cpu"))
    assert out["warned"] == [False, False] and out["messages"] == []


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_on_a_gpu_a_loader_made_after_cuda_started_warns(require_cuda, classes_dataset, tmp_path):
    """CUDA really started (a tensor on the GPU) before readers.gpu was imported: GPULoader on the
    GPU warns with the fix; after a fresh import first, the same loader does not."""
    import packer

    store = tmp_path / "s.lmdb"
    assert packer.build(classes_dataset, None, str(store), "lmdb", workers=1).ok
    code = """
import json, warnings
import torch
{before}
from readers.gpu import GPULoader
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    loader = GPULoader({store!r}, None, batch_size=2, device="cuda", decoder="turbojpeg")
    n = sum(len(b.images) for b in loader)
print(json.dumps({{"n": n, "messages": [str(w.message) for w in seen if "hardware queues" in str(w.message)]}}))
"""
    late = _run(code.format(before="torch.zeros(1, device='cuda')", store=str(store)))
    assert late["n"] == 18 and len(late["messages"]) == 1, late
    early = _run(code.format(before="", store=str(store)))
    assert early["n"] == 18 and early["messages"] == [], early
