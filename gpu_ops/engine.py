"""packer's native decoder (``decoder="engine"``): build, load and why not.

The native decoder (``csrc/engine/``; ``engine.h`` maps its files) is the host side of GPU JPEG
decode in C++: a thread pool with the GIL released, one nvJPEG decoder state per thread (the
Huffman stage on the CPU threads, or on the GPU for large images), the GPU's hardware JPEG decoder
(nvJPEG's hardware backend, on lanes of their own) beside it, all writing one packed HWC batch (a
:class:`gpu_ops.RaggedBatch`). :mod:`readers.gpu.engine` wraps it as the ``"engine"`` decoder. (Its
Python names keep the word engine: this module, the ``Engine`` class, ``PACKER_ENGINE_*``
settings; docs/architecture.md's glossary says which "engine" is which.)

It needs nvJPEG's header and library: ``$CUDA_HOME`` (a full CUDA toolkit has both) or the
``nvidia-nvjpeg`` wheel (``pip install 'packer-vision[engine]'``), and a CUDA build of torch. It is
compiled on first use into ``<gpu_ops cache>-engine`` (about 40 s; ``python -m gpu_ops.engine``
compiles it now, ``PACKER_GPU_OPS_BUILD=0`` forbids building) and reused while its sources and
torch are unchanged. Where it cannot be built or loaded, :func:`load` returns ``None`` and
:func:`status` says why; the readers then use the Python decoders.

Example:
    >>> from gpu_ops import engine                                   # doctest: +SKIP
    >>> mod = engine.load()                                          # doctest: +SKIP
    >>> engine.status()                                              # doctest: +SKIP
    {'available': True, 'reason': 'built ...', 'library': '...'}
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from typing import List, NamedTuple, Optional, Sequence, Tuple

from gpu_ops import build

log = logging.getLogger("gpu_ops.engine")

ENGINE_DIR = os.path.join(build.CSRC, "engine")
MODULE = "packer_engine"
BUILD_ENV = "PACKER_GPU_OPS_BUILD"

_lock = threading.Lock()
_state: dict = {}


class NvJpeg(NamedTuple):
    """Where nvJPEG is: its include directory, library directory and library file."""

    include: str
    libdir: str
    library: str


def find_nvjpeg(cuda_home: Optional[str] = None) -> Optional[NvJpeg]:
    """nvJPEG's header and shared library: ``cuda_home`` (or ``$CUDA_HOME``) first, then the
    ``nvidia-nvjpeg`` wheel (``nvidia/cu13`` or ``nvidia/nvjpeg``); None where neither has both."""
    roots = []
    for home in (cuda_home, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            roots += [(os.path.join(home, "include"), os.path.join(home, d)) for d in ("lib64", "lib")]
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        for base in list(getattr(nvidia, "__path__", [])):
            for sub in ("cu13", "cu12", "nvjpeg"):
                roots.append((os.path.join(base, sub, "include"), os.path.join(base, sub, "lib")))
    except ImportError:
        pass
    for inc, libdir in roots:
        if not os.path.exists(os.path.join(inc, "nvjpeg.h")):
            continue
        libs = sorted(glob.glob(os.path.join(libdir, "libnvjpeg.so*")), key=len)
        if libs:
            return NvJpeg(inc, libdir, os.path.basename(libs[0]))
    return None


def sources(root: str = ENGINE_DIR) -> List[str]:
    """The native decoder's translation units (``csrc/engine/*.cpp``, by glob, sorted)."""
    return sorted(glob.glob(os.path.join(root, "*.cpp")))


def source_digest(root: str = ENGINE_DIR) -> str:
    """SHA-256 over the native decoder's sources and headers (names and bytes): with torch's
    version, the cache key."""
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "*"))):
        if path.endswith(build.SOURCE_SUFFIXES):
            h.update(os.path.basename(path).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def cache_dir() -> str:
    """Where the native decoder is built: beside gpu_ops' own cached build, not inside it (a
    rebuild of the kernels empties their folder, and would pull this one from under a build of
    the native decoder running at the same time)."""
    return build.cache_dir() + "-engine"


def _manifest() -> dict:
    try:
        with open(os.path.join(cache_dir(), "manifest.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def cached_library() -> Optional[str]:
    """The cached native decoder for these sources and this torch, or None (never builds)."""
    man = _manifest()
    lib = man.get("library", "")
    return lib if man.get("source") == source_digest() and os.path.exists(lib) else None


def _why_not_buildable(torch_mod) -> Optional[str]:
    if torch_mod.version.cuda is None:
        return f"torch {torch_mod.__version__} is a CPU-only build"
    if find_nvjpeg() is None:
        return ("nvJPEG's header and library were not found (a full CUDA toolkit in $CUDA_HOME, or "
                "pip install 'packer-vision[engine]' for the nvidia-nvjpeg wheel)")
    return None


_SMOKE = r"""
import importlib.machinery, importlib.util, sys
import torch  # loads libc10 & co., which the engine links against
loader = importlib.machinery.ExtensionFileLoader("packer_engine", sys.argv[1])
spec = importlib.util.spec_from_file_location("packer_engine", sys.argv[1], loader=loader)
mod = importlib.util.module_from_spec(spec); loader.exec_module(mod)
try:
    mod.Engine(0, 0, 0.5, 1)
except RuntimeError as e:
    assert "threads must be" in str(e), str(e)
    print("ENGINE_SMOKE_OK")
"""


def _smoke(lib: str) -> Tuple[Optional[str], bool]:
    """``(None, False)`` when the built native decoder loads and an argument error raises; else the problem
    and whether the process crashed (a broken toolchain: worth another compiler)."""
    try:
        r = subprocess.run([sys.executable, "-c", _SMOKE, lib], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "the smoke test did not finish within 120 s", False
    if r.returncode == 0 and "ENGINE_SMOKE_OK" in r.stdout:
        return None, False
    tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
    return f"smoke test failed (exit {r.returncode}): {tail}", r.returncode < 0


def _compilers(torch_mod):
    """gpu_ops' own compiler first (the one its smoke test passed), then its candidates."""
    cands = build.compiler_candidates(torch_mod)
    try:
        with open(os.path.join(build.cache_dir(), "manifest.json")) as f:
            cxx = json.load(f).get("cxx")
    except (OSError, ValueError):
        cxx = None
    return ([c for c in cands if c[0] == cxx] + [c for c in cands if c[0] != cxx]) if cxx else cands


def build_cached(verbose: bool = False, timeout: float = 900) -> str:
    """Compiles the native decoder into :func:`cache_dir` unless a good build is there; returns its path.

    Raises:
        build.BuildError: it cannot be built here (the message says why).
    """
    import torch

    out = cache_dir()
    with build.file_lock(out + ".lock"):
        lib = cached_library()
        if lib is not None:
            return lib
        why = _why_not_buildable(torch)
        if why:
            raise build.BuildError(f"packer engine: {why}")
        failures = []
        for cxx, cc in _compilers(torch):
            ok, reason, home = build.choose_cuda(torch, cxx)
            if not ok:
                raise build.BuildError(f"packer engine: {reason}")
            nv = find_nvjpeg(home)
            log.warning("packer engine: building the native nvJPEG engine with %s into %s (nvJPEG from %s)",
                        cxx, out, nv.libdir)
            lib = _compile(out, cxx, cc, home, verbose, timeout)
            problem, crashed = _smoke(lib)
            if problem is None:
                with open(os.path.join(out, "manifest.json"), "w") as f:
                    json.dump({"library": lib, "source": source_digest(), "torch": torch.__version__,
                               "nvjpeg": nv._asdict(), "cxx": cxx}, f, indent=1)
                return lib
            failures.append(f"{cxx}: {problem}")
            if not crashed:  # does not load, say: another compiler would not change that
                break
            log.warning("packer engine: the build with %s is broken (%s); trying the next compiler", cxx, problem)
        raise build.BuildError("packer engine: no compiler built a working engine: " + "; ".join(failures))


def _compile(out: str, cxx: str, cc: str, home: str, verbose: bool, timeout: float) -> str:
    """One attempt in a child process (``--compile-into``); returns the built library's path."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = [sys.executable, "-m", "gpu_ops.engine", "--compile-into", out, "--cuda-home", home]
    if not verbose:
        cmd.append("--quiet")
    try:
        r = subprocess.run(cmd, env=dict(os.environ, CXX=cxx, CC=cc), timeout=timeout, text=True,
                           stdout=None if verbose else subprocess.PIPE,
                           stderr=None if verbose else subprocess.STDOUT)
    except subprocess.TimeoutExpired:
        raise build.BuildError(f"packer engine: compiling took more than {timeout:.0f} s") from None
    if r.returncode != 0:
        tail = " | ".join((r.stdout or "").strip().splitlines()[-8:])
        raise build.BuildError(f"packer engine: compile failed (exit {r.returncode}): {tail}")
    lib = _built_library(out)
    if lib is None:
        raise build.BuildError(f"packer engine: the compile left no {MODULE}*.so in {out}")
    return lib


def _built_library(out: str) -> Optional[str]:
    libs = glob.glob(os.path.join(out, MODULE + "*.so"))
    return libs[0] if libs else None


def _compile_into(out: str, home: str, verbose: bool) -> None:
    """The child side of :func:`build_cached`: torch's JIT build (ninja) of the native decoder."""
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = home
    # No kernels in the native decoder: the arch list only has to be non-empty where no GPU is visible.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    nv = find_nvjpeg(home)
    if nv is None:
        raise SystemExit("nvJPEG not found")
    cpp_extension.load(
        name=MODULE, sources=sources(), extra_cflags=["-O3", "-DGPU_OPS_WITH_CUDA"],
        extra_include_paths=[nv.include],
        extra_ldflags=[f"-L{nv.libdir}", f"-l:{nv.library}", f"-Wl,-rpath,{nv.libdir}"],
        build_directory=out, verbose=verbose, with_cuda=True, is_python_module=False)


def _import(path: str):
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load():
    """The native decoder's Python module (class ``Engine``), building it on first use; None where it
    cannot be built or loaded (:func:`status` says why, once, as a warning)."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        mod, reason = None, ""
        try:
            import torch

            why = _why_not_buildable(torch) or (None if torch.cuda.is_available() else "no CUDA device is visible")
            lib = cached_library()
            if why:
                reason = why
            elif lib is None and os.environ.get(BUILD_ENV, "1") == "0":
                reason = f"not built yet and {BUILD_ENV}=0 forbids building it (python -m gpu_ops.engine)"
            else:
                lib = lib or build_cached()
                mod = _import(lib)
                reason = f"built {lib} (nvJPEG {mod.nvjpeg_version()})"
        except (build.BuildError, ImportError, OSError) as exc:
            reason = str(exc)
        if mod is None:
            log.warning("packer engine unavailable: %s", reason)
        _state.update(module=mod, reason=reason)
        return mod


def status() -> dict:
    """``{"available": bool, "reason": str}``: whether the native decoder loads, and why (not)."""
    load()
    return {"available": _state["module"] is not None, "reason": _state["reason"]}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m gpu_ops.engine``: build the native decoder now and print where it is."""
    p = argparse.ArgumentParser(prog="python -m gpu_ops.engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--quiet", action="store_true", help="no compiler output")
    p.add_argument("--compile-into", help=argparse.SUPPRESS)
    p.add_argument("--cuda-home", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.compile_into:
        _compile_into(args.compile_into, args.cuda_home, verbose=not args.quiet)
        return 0
    try:
        lib = build_cached(verbose=not args.quiet)
    except build.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
