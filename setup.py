"""Builds the one native extension, ``gpu_ops._C``; all metadata lives in setup.cfg.

The CPU kernels are built everywhere. The CUDA kernels are added when CUDA is usable:
``torch.cuda.is_available()``, or a CUDA build of torch with a CUDA toolkit (``CUDA_HOME``), which
covers building on a machine without a GPU. ``FORCE_CUDA=1`` builds them or fails; ``FORCE_CUDA=0``
builds the CPU kernels only. The choice is printed, never made silently.

Architectures: ``TORCH_CUDA_ARCH_LIST`` when set (torch's BuildExtension honours it), otherwise
Hopper machine code (sm_90) plus compute_90 PTX for newer GPUs.
"""

import glob
import os
import sys

from setuptools import setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as exc:  # pragma: no cover - setup-time message
    raise SystemExit(
        "packer's setup.py needs torch to build gpu_ops._C; install torch first, then "
        "`pip install --no-build-isolation -e .`"
    ) from exc

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("gpu_ops", "csrc")
# cpu/jpeg_decode.cpp uses libjpeg-turbo's libjpeg API (apt: libjpeg62-turbo-dev / libjpeg-turbo-devel).
LIBRARIES = ["jpeg"]


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, CSRC, pattern)))


def _want_cuda():
    """Returns (build_cuda, reason)."""
    force = os.environ.get("FORCE_CUDA", "").strip()
    has_toolkit = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if force == "1":
        if torch.version.cuda is None:
            raise SystemExit(
                f"FORCE_CUDA=1 but the installed torch {torch.__version__} is a CPU-only build; "
                "install a CUDA build of torch"
            )
        if cpp_extension.CUDA_HOME is None:
            raise SystemExit(
                "FORCE_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME or put nvcc on PATH)"
            )
        return True, "FORCE_CUDA=1"
    if force == "0":
        return False, "FORCE_CUDA=0"
    if torch.cuda.is_available() and has_toolkit:
        return True, "a CUDA device and toolkit are present"
    if has_toolkit:
        return True, f"torch {torch.__version__} is a CUDA build and CUDA_HOME={cpp_extension.CUDA_HOME}"
    return False, (
        f"no CUDA toolkit usable with torch {torch.__version__} "
        f"(torch.version.cuda={torch.version.cuda}, CUDA_HOME={cpp_extension.CUDA_HOME})"
    )


def _extension():
    build_cuda, reason = _want_cuda()
    sources = _sources("*.cpp") + _sources(os.path.join("cpu", "*.cpp"))
    cxx = ["-O3", "-ffp-contract=off"]
    if not build_cuda:
        print(f"gpu_ops: building CPU kernels only ({reason})", file=sys.stderr)
        return cpp_extension.CppExtension(
            "gpu_ops._C", sources, extra_compile_args={"cxx": cxx}, libraries=LIBRARIES
        )
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        nvcc += ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]
    print(f"gpu_ops: building CPU and CUDA kernels ({reason})", file=sys.stderr)
    return cpp_extension.CUDAExtension(
        "gpu_ops._C",
        sources + _sources(os.path.join("cuda", "*.cu")),
        define_macros=[("GPU_OPS_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        libraries=LIBRARIES,
    )


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
