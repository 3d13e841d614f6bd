"""The gpu_ops build decisions (gpu_ops/build.py, shared by setup.py and the on-demand build):
CUDA toolkit probe and FORCE_CUDA, compiler order, the post-build smoke test, the build cache.

Fast: nothing here compiles the kernels (scripts/check_install.sh and
tests/project/test_install.py do).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types

import pytest

from gpu_ops import _loader
from gpu_ops import build as gbuild

CUDA_TORCH = types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0"), __version__="2.14.1+cu130")
CPU_TORCH = types.SimpleNamespace(version=types.SimpleNamespace(cuda=None), __version__="2.13.0+cpu")
REAL_TOOLKIT = "/usr/local/cuda"


@pytest.fixture
def fake_toolkit(tmp_path):
    """A CUDA_HOME like the one torch guesses from an nvcc wrapper in /usr/local/bin: bin/nvcc
    runs, but there is no libcudart to link against."""
    home = tmp_path / "usr_local"
    (home / "bin").mkdir(parents=True)
    real = shutil.which("nvcc") or "/bin/false"
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    nvcc.chmod(0o755)
    return home


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("FORCE_CUDA", "CUDA_HOME", "CUDA_PATH", "CXX", "CC", gbuild.CACHE_ENV):
        monkeypatch.delenv(var, raising=False)


def test_sources_are_found_by_glob(tmp_path):
    root = tmp_path / "csrc"
    for rel in ("gpu_ops.cpp", "cpu/a.cpp", "cpu/new_op.cpp", "cuda/a.cu", "cuda/new_op.cu", "cuda/x.cuh"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("//\n")
    names = lambda paths: [os.path.relpath(p, root) for p in paths]  # noqa: E731
    assert names(gbuild.sources(str(root))) == ["gpu_ops.cpp", "cpu/a.cpp", "cpu/new_op.cpp"]
    assert names(gbuild.sources(str(root), cuda=True))[-2:] == ["cuda/a.cu", "cuda/new_op.cu"]
    d1 = gbuild.sources_digest(str(root))
    (root / "cuda" / "x.cuh").write_text("// changed\n")
    assert gbuild.sources_digest(str(root)) != d1      # a header change invalidates the cache


def test_toolkit_that_cannot_link_gives_cpu_build_and_reason(fake_toolkit, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit))
    t0 = time.monotonic()
    build_cuda, reason, home = gbuild.choose_cuda(CUDA_TORCH, "c++")
    assert time.monotonic() - t0 < 10
    assert not build_cuda and home is None
    assert "libcudart" in reason and str(fake_toolkit) in reason and "CUDA_HOME" in reason


def test_force_cuda_with_unusable_toolkit_fails_fast_with_the_reason(fake_toolkit, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit))
    monkeypatch.setenv("FORCE_CUDA", "1")
    t0 = time.monotonic()
    with pytest.raises(gbuild.BuildError, match="FORCE_CUDA=1 but no usable CUDA toolkit.*libcudart"):
        gbuild.choose_cuda(CUDA_TORCH, "c++")
    assert time.monotonic() - t0 < 10


def test_force_cuda_with_cpu_torch_fails(monkeypatch):
    monkeypatch.setenv("FORCE_CUDA", "1")
    with pytest.raises(gbuild.BuildError, match="CPU-only build"):
        gbuild.choose_cuda(CPU_TORCH, "c++")
    monkeypatch.delenv("FORCE_CUDA")
    assert gbuild.choose_cuda(CPU_TORCH, "c++")[:2] == (False, "torch 2.13.0+cpu is a CPU-only build")


def test_force_cuda_0_builds_cpu_without_probing(fake_toolkit, monkeypatch):
    monkeypatch.setenv("FORCE_CUDA", "0")
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit))
    assert gbuild.choose_cuda(CUDA_TORCH, "c++") == (False, "FORCE_CUDA=0", None)


def test_torch_guess_without_libcudart_falls_through_to_a_real_toolkit(fake_toolkit, monkeypatch):
    """torch guessed CUDA_HOME=/usr/local from an nvcc wrapper; /usr/local/cuda is the real one."""
    if not os.path.exists(os.path.join(REAL_TOOLKIT, "bin", "nvcc")):
        pytest.skip(f"no CUDA toolkit in {REAL_TOOLKIT}")
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", str(fake_toolkit))
    build_cuda, reason, home = gbuild.choose_cuda(CUDA_TORCH, "c++")
    assert build_cuda and os.path.realpath(home) == os.path.realpath(REAL_TOOLKIT), reason
    assert "passed the compile+link probe" in reason


def test_probe_refuses_a_toolkit_of_another_cuda_major():
    if not os.path.exists(os.path.join(REAL_TOOLKIT, "bin", "nvcc")):
        pytest.skip(f"no CUDA toolkit in {REAL_TOOLKIT}")
    why = gbuild.probe_cuda_toolkit(REAL_TOOLKIT, "c++", "11.8")
    assert why is not None and "torch was built with CUDA 11.8" in why


def test_compiler_candidates_start_with_cxx_and_have_no_duplicates(monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    cands = gbuild.compiler_candidates()
    assert cands[0][0] == "g++"
    real = [os.path.realpath(shutil.which(c)) for c, _ in cands]
    assert len(real) == len(set(real))
    assert all(shutil.which(cc) for _, cc in cands)


def _shared_lib(tmp_path, body: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = tmp_path / "lib.c", tmp_path / "lib.so"
    src.write_text(body)
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=60)
    return str(lib)


def test_smoke_test_reports_a_crash_not_a_pass(tmp_path):
    lib = _shared_lib(tmp_path, "#include <signal.h>\n"
                               "__attribute__((constructor)) static void boom(void) { raise(SIGSEGV); }\n")
    ok, detail, crashed = gbuild.smoke_test(lib, timeout=120)
    assert not ok and crashed and "crashed the process (signal 11)" in detail


def test_smoke_test_fails_a_library_without_the_self_test(tmp_path):
    lib = _shared_lib(tmp_path, "int nothing(void) { return 0; }\n")
    ok, detail, crashed = gbuild.smoke_test(lib, timeout=120)
    assert not ok and not crashed and "smoke test failed" in detail   # no rebuild for this one


def test_smoke_test_passes_the_built_extension():
    import glob

    libs = glob.glob(os.path.join(gbuild.PACKAGE_DIR, "_C*.so"))
    if not libs:
        pytest.skip("gpu_ops/_C*.so is not built in place")
    ok, detail, _ = gbuild.smoke_test(libs[0], timeout=180)
    assert ok and detail in ("cpu", "cpu+cuda"), detail


def test_cached_library_needs_matching_sources(tmp_path, monkeypatch):
    monkeypatch.setenv(gbuild.CACHE_ENV, str(tmp_path))
    d = gbuild.cache_dir()
    assert d.startswith(str(tmp_path)) and "torch" in os.path.basename(d)
    os.makedirs(d)
    lib = os.path.join(d, "gpu_ops_C.so")
    open(lib, "wb").close()
    man = {"library": lib, "sources": "0" * 64}
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f)
    assert gbuild.cached_library() is None            # built from other sources
    man["sources"] = gbuild.sources_digest()
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(man, f)
    assert gbuild.cached_library() == lib


def test_on_demand_build_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(_loader.BUILD_ENV, "0")
    assert not _loader._on_demand_allowed()
    monkeypatch.setenv(_loader.BUILD_ENV, "1")
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "gpu_ops.build"], raising=False)
    assert not _loader._on_demand_allowed()          # `python -m gpu_ops.build` builds by itself
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "train.py"], raising=False)
    assert _loader._on_demand_allowed()


def test_setup_py_without_torch_installs_without_kernels(tmp_path):
    """What pip's build isolation does: setup.py runs where torch cannot be imported."""
    repo = os.path.dirname(gbuild.PACKAGE_DIR)
    code = ("import sys, runpy; sys.modules['torch'] = None; "
            "sys.argv = ['setup.py', '--name']; runpy.run_path('setup.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "packer-vision"
    assert "compiles them on first use" in r.stderr
    r = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "FORCE_CUDA": "1"})
    assert r.returncode != 0 and "FORCE_CUDA=1 but torch is not importable" in r.stderr
