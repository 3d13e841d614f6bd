"""Builds the compiled kernels of gpu_ops: one place for every way they get built.

Three ways, all with the same choices (sources by glob, CUDA or not, compiler, smoke test):

* **at install** (``setup.py``, when torch is importable in the build environment, e.g.
  ``pip install --no-build-isolation .`` or ``scripts/install.sh``): ``gpu_ops/_C*.so`` in the package;
* **explicitly**: ``python -m gpu_ops.build`` compiles into the cache (below) now, with the log shown;
* **on first use**: ``import gpu_ops`` finds no ``gpu_ops._C`` and no cached build, logs a warning
  and runs this file in a subprocess (``PACKER_GPU_OPS_BUILD=0`` turns that off).

The cache is ``$PACKER_GPU_OPS_CACHE`` or ``~/.cache/packer/gpu_ops/<python>-torch<version>/``; a
build there is reused while the kernel sources and torch are unchanged (``manifest.json``).

CUDA: ``FORCE_CUDA=1`` builds the CUDA kernels or fails at once with the reason; ``FORCE_CUDA=0``
builds the CPU kernels only; unset, CUDA kernels are built when torch is a CUDA build and a CUDA
toolkit passes a probe (its ``nvcc`` compiles a tiny kernel and the result links against the
toolkit's ``libcudart``: seconds, before minutes of compiling), else the CPU kernels are built and a
warning says why. The toolkit is ``$CUDA_HOME``/``$CUDA_PATH`` when set, else the first usable of:
torch's guess (``which nvcc``), ``/usr/local/cuda``, the directory ``nvcc`` itself reports.

Compiler: ``$CXX`` (else ``c++``) first. Each build is smoke-tested in a fresh interpreter: an
argument error (``TORCH_CHECK``) must raise ``RuntimeError``. Where it crashes instead (seen with a
toolchain whose libstdc++ differs from torch's), the build is redone with the next compiler of
``/usr/bin/g++``, ``/usr/bin/c++``, torch's own compiler, ``/usr/bin/g++-NN``; if none works it fails.

This file imports neither ``gpu_ops`` nor (at module level) torch, so ``setup.py`` loads it by path.

Example::

    python -m gpu_ops.build              # compile now (cache), print where
    FORCE_CUDA=1 python -m gpu_ops.build # CUDA kernels or a clear error
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

log = logging.getLogger("gpu_ops.build")

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(PACKAGE_DIR, "csrc")
CACHE_ENV = "PACKER_GPU_OPS_CACHE"
# -g0 last: setuptools' builds (pip install --no-build-isolation, setup.py build_ext) pass Python's
# own CFLAGS, -g among them (a 19.7 MB CPU library, 0.8 MB without; the 2-core VM compiles it in
# 79 s instead of 99: docs/benchmarks.md, "Install and kernel build times").
CXX_FLAGS = ["-O3", "-ffp-contract=off", "-g0"]
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
# cpu/jpeg_decode.cpp uses libjpeg-turbo's libjpeg API (apt: libjpeg62-turbo-dev / libjpeg-dev;
# dnf: libjpeg-turbo-devel).
LIBRARIES = ["jpeg"]
DEFAULT_ARCH = ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]
SMOKE_MARK = "GPU_OPS_SMOKE_OK"
PROBE_TIMEOUT_S = 120


class BuildError(RuntimeError):
    """The kernels cannot be built as asked (the message says why and what to do)."""


# ----------------------------------------------------------------------------------------- sources
def sources(root: str = CSRC, cuda: bool = False) -> List[str]:
    """Absolute paths of the kernel sources, by glob (a new ``cpu/<op>.cpp`` is picked up as is).

    Args:
        root: the ``csrc`` directory.
        cuda: include ``cuda/*.cu``.

    Returns:
        ``*.cpp`` + ``cpu/*.cpp`` (+ ``cuda/*.cu``), each group sorted.
    """
    patterns = ["*.cpp", os.path.join("cpu", "*.cpp")] + ([os.path.join("cuda", "*.cu")] if cuda else [])
    return [p for pat in patterns for p in sorted(glob.glob(os.path.join(root, pat)))]


SOURCE_SUFFIXES = (".cpp", ".cu", ".h", ".hpp", ".cuh")  # what setup.cfg's package_data ships


def sources_digest(root: str = CSRC) -> str:
    """SHA-256 over every source and header under ``root`` (names and bytes): the cache key."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root and "engine" in dirnames:
            dirnames.remove("engine")  # the native decoder is built on its own (gpu_ops/engine.py)
        dirnames.sort()
        for name in sorted(f for f in filenames if f.endswith(SOURCE_SUFFIXES)):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


# -------------------------------------------------------------------------------------------- CUDA
def _libcudart_dirs(home: str) -> List[str]:
    dirs = [os.path.join(home, "lib64"), os.path.join(home, "lib")]
    dirs += sorted(glob.glob(os.path.join(home, "targets", "*", "lib")))
    return [d for d in dirs if glob.glob(os.path.join(d, "libcudart.so*"))]


def _nvcc_top() -> Optional[str]:
    """The toolkit root that ``nvcc`` on PATH reports (follows wrapper scripts)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.M)
    return os.path.normpath(os.path.join(m.group(1).strip(), "..")) if m else None


def cuda_home_candidates(torch_guess: Optional[str]) -> Tuple[List[str], bool]:
    """Toolkit roots to try, and whether the user named one (``CUDA_HOME``/``CUDA_PATH``)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return [os.environ[var]], True
    cands = [torch_guess, "/usr/local/cuda"]
    top = _nvcc_top()
    if top:
        cands.append(top)
    seen, out = set(), []
    for c in cands:
        if c and os.path.realpath(c) not in seen:
            seen.add(os.path.realpath(c))
            out.append(c)
    return out, False


def probe_cuda_toolkit(home: str, cxx: str, torch_cuda: Optional[str]) -> Optional[str]:
    """Checks that ``home`` can build a CUDA extension; returns None when it can, else why not.

    nvcc must exist and match torch's CUDA major version, ``libcudart`` must be in the toolkit's
    library directory, and a one-kernel ``.cu`` must compile with nvcc and link into a shared
    library against ``-lcudart`` with the host compiler (what torch's build does, in seconds).
    """
    nvcc = os.path.join(home, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        return f"{nvcc} does not exist"
    libdirs = _libcudart_dirs(home)
    if not libdirs:
        return f"no libcudart.so under {home} (lib64/, lib/, targets/*/lib/): a toolkit that cannot link"
    try:
        ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{nvcc} --version failed: {exc}"
    m = re.search(r"release (\d+)\.(\d+)", ver)
    if torch_cuda and m and m.group(1) != torch_cuda.split(".")[0]:
        return f"nvcc is CUDA {m.group(1)}.{m.group(2)} but torch was built with CUDA {torch_cuda}"
    with tempfile.TemporaryDirectory(prefix="gpu_ops_probe_") as tmp:
        cu = os.path.join(tmp, "probe.cu")
        with open(cu, "w") as f:
            f.write("__global__ void k(int* x) { x[threadIdx.x] = 1; }\n"
                    "extern \"C\" int probe() { int* p = nullptr; k<<<1, 1>>>(p);"
                    " return (int)cudaGetLastError(); }\n")
        obj, lib = os.path.join(tmp, "probe.o"), os.path.join(tmp, "probe.so")
        cmds = [
            [nvcc, "-c", cu, "-o", obj, "-Xcompiler", "-fPIC", "-ccbin", cxx],
            [cxx, "-shared", obj, "-o", lib, *(f"-L{d}" for d in libdirs), "-lcudart"],
        ]
        for cmd in cmds:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as exc:
                return f"`{' '.join(cmd)}` could not run: {exc}"
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                return f"`{' '.join(cmd)}` failed: {' | '.join(tail)}"
    return None


def choose_cuda(torch_mod, cxx: str) -> Tuple[bool, str, Optional[str]]:
    """Decides whether to build the CUDA kernels.

    Args:
        torch_mod: the imported ``torch``.
        cxx: the host compiler the probe links with.

    Returns:
        ``(build_cuda, reason, cuda_home)``.

    Raises:
        BuildError: ``FORCE_CUDA=1`` and CUDA cannot be built (the reason says why), at once.
    """
    from torch.utils import cpp_extension

    force = os.environ.get("FORCE_CUDA", "").strip()
    if force == "0":
        return False, "FORCE_CUDA=0", None
    if torch_mod.version.cuda is None:
        why = f"torch {torch_mod.__version__} is a CPU-only build"
        if force == "1":
            raise BuildError(f"FORCE_CUDA=1 but {why}; install a CUDA build of torch")
        return False, why, None
    cands, named = cuda_home_candidates(cpp_extension.CUDA_HOME)
    if not cands:
        why = "no CUDA toolkit found (no nvcc on PATH; set CUDA_HOME)"
        if force == "1":
            raise BuildError(f"FORCE_CUDA=1 but {why}")
        return False, why, None
    problems = []
    for home in cands:
        problem = probe_cuda_toolkit(home, cxx, torch_mod.version.cuda)
        if problem is None:
            tag = "FORCE_CUDA=1" if force == "1" else f"torch {torch_mod.__version__} is a CUDA build"
            return True, f"{tag}, CUDA toolkit {home} passed the compile+link probe", home
        problems.append(f"{home}: {problem}")
    why = "no usable CUDA toolkit (" + "; ".join(problems) + ")"
    if named:
        why += " [from CUDA_HOME/CUDA_PATH]"
    if force == "1":
        raise BuildError(f"FORCE_CUDA=1 but {why}")
    return False, why, None


def extension_flags(build_cuda: bool) -> Dict[str, List[str]]:
    """Compiler flags for the ``cxx`` and (CUDA builds) ``nvcc`` steps."""
    flags = {"cxx": list(CXX_FLAGS)}
    if build_cuda:
        nvcc = list(NVCC_FLAGS)
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            nvcc += DEFAULT_ARCH
        flags["nvcc"] = nvcc
    return flags


# ------------------------------------------------------------------------------------- compilers
def _cc_for(cxx: str) -> str:
    d, b = os.path.split(cxx)
    cc = b.replace("g++", "gcc").replace("clang++", "clang")
    if cc == b:
        cc = b.replace("c++", "cc")
    return os.path.join(d, cc) if d else cc


def compiler_candidates(torch_mod=None) -> List[Tuple[str, str]]:
    """(CXX, CC) pairs to try in order: the configured one, then known-good system compilers."""
    first = os.environ.get("CXX") or "c++"
    cands = [(first, os.environ.get("CC") or _cc_for(first))]
    extra = ["/usr/bin/g++", "/usr/bin/c++"]
    if torch_mod is not None:
        m = re.search(r"CXX_COMPILER=([^,\s]+)", torch_mod.__config__.show())
        if m:
            extra.append(m.group(1))
    extra += sorted(glob.glob("/usr/bin/g++-[0-9]*"), reverse=True)
    for cxx in extra:
        cands.append((cxx, _cc_for(cxx)))
    seen, out = set(), []
    for cxx, cc in cands:
        path = shutil.which(cxx)
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            continue
        seen.add(key)
        out.append((cxx, cc if shutil.which(cc) else cxx))
    return out


@contextlib.contextmanager
def compiler_env(cxx: str, cc: str) -> Iterator[None]:
    """Sets CXX and CC (torch's ninja build and nvcc's -ccbin read them) for the block."""
    old = {k: os.environ.get(k) for k in ("CXX", "CC")}
    os.environ["CXX"], os.environ["CC"] = cxx, cc
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------------------------ smoke test
_SMOKE = r"""
import sys, torch
torch.ops.load_library(sys.argv[1])
info = torch.ops.gpu_ops._build_info()
try:
    torch.ops.gpu_ops._self_test_check(7)
except RuntimeError as e:
    assert "expected 0, got 7" in str(e), str(e)
    print("%s", info)
else:
    sys.exit("an argument error did not raise")
"""


class SmokeResult(NamedTuple):
    """What :func:`smoke_test` saw: ``ok``; ``detail`` (build info, or what went wrong); ``crashed``
    (the process died of a signal: the compiler's fault, worth a rebuild with another one)."""

    ok: bool
    detail: str
    crashed: bool = False


def smoke_test(library: str, timeout: float = 180) -> SmokeResult:
    """Loads a built library in a fresh interpreter; an argument error must raise RuntimeError.

    Returns:
        A :class:`SmokeResult`; ``detail`` is ``cpu``/``cpu+cuda`` when it passed.
    """
    code = _SMOKE % SMOKE_MARK
    try:
        r = subprocess.run([sys.executable, "-c", code, library], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return SmokeResult(False, f"the smoke test did not finish within {timeout:.0f} s")
    if r.returncode == 0 and SMOKE_MARK in r.stdout:
        return SmokeResult(True, r.stdout.split(SMOKE_MARK, 1)[1].strip())
    if r.returncode < 0:
        return SmokeResult(False, f"an argument error crashed the process (signal {-r.returncode}) "
                                  "instead of raising", crashed=True)
    tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
    return SmokeResult(False, f"smoke test failed (exit {r.returncode}): {tail}")


# ------------------------------------------------------------------------------ cached (JIT) build
def cache_dir() -> str:
    """Where on-demand and explicit builds go (one directory per Python and torch version)."""
    import torch

    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "packer", "gpu_ops")
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}"
    return os.path.join(base, re.sub(r"[^A-Za-z0-9_.+-]", "_", tag))


def cached_library() -> Optional[str]:
    """The cached build for these sources and this torch, or None (never builds)."""
    try:
        with open(os.path.join(cache_dir(), "manifest.json")) as f:
            man = json.load(f)
    except (OSError, ValueError):
        return None
    lib = man.get("library", "")
    if man.get("sources") != sources_digest() or not os.path.exists(lib):
        return None
    return lib


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a second process waits for the first build, then reuses it
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_RUN_BY_PATH = ("import importlib.util, sys; "
                "s = importlib.util.spec_from_file_location('_gpu_ops_build', sys.argv[1]); "
                "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
                "sys.exit(m.main(sys.argv[2:]))")


def command(*args: str) -> List[str]:
    """The command line that runs this file's :func:`main` with ``args`` in a child interpreter.

    Loaded by path, not run as a script: a script's directory goes first on ``sys.path``, where
    ``gpu_ops/random.py`` would shadow the standard library's ``random``.
    """
    return [sys.executable, "-c", _RUN_BY_PATH, os.path.abspath(__file__), *args]


def _compile(out: str, cxx: str, cc: str, build_cuda: bool, home: Optional[str], verbose: bool,
             timeout: float) -> Optional[str]:
    """Compiles once in a child process (a built library is loaded there, never here, so a second
    attempt can register the same operator namespace). Returns None on success, else the error."""
    cmd = command("--compile-into", out)
    cmd += ["--cuda-home", home] if build_cuda else ["--cpu"]
    if not verbose:
        cmd.append("--quiet")
    env = dict(os.environ, CXX=cxx, CC=cc)
    try:
        r = subprocess.run(cmd, env=env, timeout=timeout, text=True,
                           stdout=None if verbose else subprocess.PIPE,
                           stderr=None if verbose else subprocess.STDOUT)
    except subprocess.TimeoutExpired:
        return f"compiling took more than {timeout:.0f} s"
    if r.returncode != 0:
        tail = " | ".join((r.stdout or "").strip().splitlines()[-8:])
        return f"compile failed (exit {r.returncode}){': ' + tail if tail else ''}"
    return None


def _compile_into(out: str, build_cuda: bool, home: Optional[str], verbose: bool) -> None:
    """The child side of :func:`_compile`: torch's JIT build (ninja) into ``out``."""
    from torch.utils import cpp_extension

    if home:
        cpp_extension.CUDA_HOME = home  # torch reads this global when it writes the link line
    flags = extension_flags(build_cuda)
    defines = ["-DGPU_OPS_WITH_CUDA"] if build_cuda else []
    cpp_extension.load(
        name="gpu_ops_C", sources=sources(cuda=build_cuda), extra_cflags=flags["cxx"] + defines,
        extra_cuda_cflags=(flags["nvcc"] + defines) if build_cuda else None,
        extra_ldflags=["-l" + lib for lib in LIBRARIES],
        build_directory=out, verbose=verbose, with_cuda=build_cuda, is_python_module=False)


def build_cached(verbose: bool = False, timeout: float = 3600) -> str:
    """Compiles the kernels into :func:`cache_dir` (unless a good build is there) and returns the
    library's path.

    Args:
        verbose: show the compiler's output.
        timeout: seconds allowed for each compile attempt.

    Raises:
        BuildError: no compiler produced a library that passes the smoke test, or FORCE_CUDA=1
            cannot be honoured (raised before compiling).
    """
    import torch

    out = cache_dir()
    with file_lock(out + ".lock"):
        lib = cached_library()
        if lib is not None:
            log.info("gpu_ops: cached build %s is up to date", lib)
            return lib
        failures = []
        for cxx, cc in compiler_candidates(torch):
            build_cuda, reason, home = choose_cuda(torch, cxx)
            log.warning("gpu_ops: building the %s kernels with %s (%s) into %s",
                        "CPU and CUDA" if build_cuda else "CPU", cxx, reason, out)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            t0 = time.monotonic()
            err = _compile(out, cxx, cc, build_cuda, home, verbose, timeout)
            if err is not None:
                # A compile error is the sources' or the toolchain's fault, not the ABI's: another
                # compiler would spend minutes failing the same way.
                raise BuildError(f"gpu_ops: the build with {cxx} failed: {err}")
            lib = os.path.join(out, "gpu_ops_C.so")
            ok, detail, crashed = smoke_test(lib)
            if ok:
                with open(os.path.join(out, "manifest.json"), "w") as f:
                    json.dump({"library": lib, "sources": sources_digest(), "torch": torch.__version__,
                               "build": detail, "cxx": cxx, "reason": reason,
                               "seconds": round(time.monotonic() - t0, 1)}, f, indent=1)
                log.warning("gpu_ops: built %s (%s) with %s in %.0f s", lib, detail, cxx,
                            time.monotonic() - t0)
                return lib
            failures.append(f"{cxx}: {detail}")
            if not crashed:  # e.g. does not load: another compiler would not change that
                break
            log.warning("gpu_ops: the build with %s is broken (%s); trying the next compiler", cxx, detail)
        raise BuildError("gpu_ops: no compiler built working kernels: " + "; ".join(failures))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m gpu_ops.build [--quiet] [--print-path]``: compile into the cache now."""
    p = argparse.ArgumentParser(prog="python -m gpu_ops.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--quiet", action="store_true", help="no compiler output")
    p.add_argument("--force", action="store_true", help="rebuild even when the cache is up to date")
    p.add_argument("--compile-into", help=argparse.SUPPRESS)  # internal: one attempt (child)
    p.add_argument("--cuda-home", help=argparse.SUPPRESS)
    p.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.compile_into:
        _compile_into(args.compile_into, not args.cpu, args.cuda_home, verbose=not args.quiet)
        return 0
    if args.force:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(cache_dir(), "manifest.json"))
    try:
        lib = build_cached(verbose=not args.quiet)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
