"""Loads the compiled kernels, ``gpu_ops._C``, once.

When the extension cannot be loaded (not built, built against another torch, missing library), the
ops fall back to the pure-torch reference in :mod:`gpu_ops._reference` and ONE ``RuntimeWarning``
says why, carrying the load error. ``PACKER_GPU_OPS_STRICT=1`` turns that into an ``ImportError``
(CI sets it, so a broken build fails the tests instead of running them on the slow path).

Where ``gpu_ops._C`` was never built (``pip install`` under build isolation has no torch to build
against), the kernels come from the on-demand build of :mod:`gpu_ops.build`: a cached build for
this torch and these sources is loaded, or one is compiled now in a subprocess (minutes, once,
logged as a warning); ``PACKER_GPU_OPS_BUILD=0`` turns that off (ops then fall back as above).

A build without CUDA kernels on a machine with a GPU is handled the same way: the reference is
registered as the ``CUDA`` kernel of each op (so dispatch still goes through the dispatcher) and one
warning says so; under ``PACKER_GPU_OPS_STRICT=1`` that is an error too.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import warnings
from typing import Callable, Optional, Tuple

import torch

STRICT_ENV = "PACKER_GPU_OPS_STRICT"
BUILD_ENV = "PACKER_GPU_OPS_BUILD"
log = logging.getLogger("gpu_ops")
OP_NAMES = (
    "warp_affine",
    "resize",
    "crop_mirror_normalize",
    "resized_crop_mirror_normalize",
    "adjust_color",
    "resized_crop_mirror_normalize_ragged",
    "crop_mirror_normalize_ragged",
    "resize_ragged",
    "warp_affine_ragged",
)

# Keeps the Library object that holds reference CUDA kernels alive (registrations die with it).
_cuda_fallback_lib: Optional[torch.library.Library] = None


def strict() -> bool:
    """True when ``PACKER_GPU_OPS_STRICT`` asks for load failures to be errors."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _on_demand_allowed() -> bool:
    if os.environ.get(BUILD_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    # `python -m gpu_ops.build` imports this package first; it builds by itself, verbosely.
    argv = getattr(sys, "orig_argv", [])
    return not any(a == "-m" and b == "gpu_ops.build" for a, b in zip(argv, argv[1:]))


def _load_on_demand(not_built: ImportError) -> None:
    """Loads the cached build of :mod:`gpu_ops.build`, compiling it first if needed.

    Raises:
        ImportError: no build could be made or loaded (chained to the cause).
    """
    from gpu_ops import build

    lib = build.cached_library()
    if lib is None:
        log.warning(
            "gpu_ops: gpu_ops._C was not built at install (%s); compiling the kernels for torch %s "
            "now, once (a few minutes; cached in %s). `python -m gpu_ops.build` does this ahead of "
            "time; %s=0 turns it off.", not_built, torch.__version__, build.cache_dir(), BUILD_ENV)
        try:
            r = subprocess.run(build.command("--quiet"), capture_output=True, text=True, timeout=3600)
        except subprocess.TimeoutExpired as exc:
            raise ImportError("gpu_ops: the on-demand build took more than an hour") from exc
        lib = build.cached_library()
        if r.returncode != 0 or lib is None:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-5:])
            raise ImportError(f"gpu_ops: the on-demand build failed (exit {r.returncode}): {tail}"
                              " (run `python -m gpu_ops.build` to see the whole log)") from not_built
    try:
        torch.ops.load_library(lib)
    except OSError as exc:
        raise ImportError(f"gpu_ops: the cached build {lib} does not load: {exc}") from exc


def _register_reference_for_cuda() -> None:
    global _cuda_fallback_lib
    from gpu_ops import _reference

    lib = torch.library.Library("gpu_ops", "IMPL")
    for name in OP_NAMES:
        lib.impl(name, getattr(_reference, name), "CUDA")
    _cuda_fallback_lib = lib


def _check_schemas() -> None:
    """ImportError when the loaded library lacks ops of these sources (built from older ones)."""
    missing = [n for n in OP_NAMES if not hasattr(torch.ops.gpu_ops, n)]
    if missing:
        raise ImportError(f"gpu_ops._C was built from older sources: it lacks the ops {missing}")


def load_extension(
    import_module: Callable[[str], object] = importlib.import_module,
) -> Tuple[bool, Optional[BaseException]]:
    """Imports ``gpu_ops._C``; returns ``(loaded, error)``.

    Args:
        import_module: the importer (tests pass a failing one).

    Returns:
        ``(True, None)`` when the kernels are registered with ``torch.ops.gpu_ops``, else
        ``(False, the load error)`` after one warning.

    Raises:
        ImportError: the extension failed to load, or lacks CUDA kernels on a CUDA machine, and
            ``PACKER_GPU_OPS_STRICT=1``.
    """
    try:
        try:
            import_module("gpu_ops._C")
        except ModuleNotFoundError as exc:
            if exc.name != "gpu_ops._C" or import_module is not importlib.import_module \
                    or not _on_demand_allowed():
                raise
            _load_on_demand(exc)
        _check_schemas()
    except (ImportError, OSError) as exc:
        if strict():
            raise ImportError(
                f"gpu_ops: the compiled extension gpu_ops._C failed to load "
                f"({type(exc).__name__}: {exc}) and {STRICT_ENV}=1 forbids the fallback "
                "(hint: rebuild with `pip install --no-build-isolation -e .`)"
            ) from exc
        warnings.warn(
            f"gpu_ops: the compiled extension gpu_ops._C failed to load ({type(exc).__name__}: "
            f"{exc}); all gpu_ops ops fall back to the pure-torch reference (correct but slow). "
            f"Rebuild with `pip install --no-build-isolation -e .`; set {STRICT_ENV}=1 to make "
            "this an error.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False, exc
    has_cuda_kernels = torch._C._dispatch_has_kernel_for_dispatch_key(
        "gpu_ops::warp_affine", "CUDA"
    )
    if torch.cuda.is_available() and not has_cuda_kernels:
        msg = (
            f"gpu_ops: gpu_ops._C holds CPU kernels only (build {torch.ops.gpu_ops._build_info()!r})"
            " but CUDA is available"
        )
        if strict():
            raise ImportError(f"{msg} and {STRICT_ENV}=1 (hint: rebuild with FORCE_CUDA=1)")
        warnings.warn(
            f"{msg}; CUDA tensors use the pure-torch reference. Rebuild with FORCE_CUDA=1 "
            "`pip install --no-build-isolation -e .` for the CUDA kernels.",
            RuntimeWarning,
            stacklevel=3,
        )
        _register_reference_for_cuda()
    return True, None
