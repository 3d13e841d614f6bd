"""Builds the one native extension, ``gpu_ops._C``, when it can; all metadata lives in setup.cfg.

Building needs no torch. When torch is importable here (``pip install --no-build-isolation``,
``scripts/install.sh``, ``python setup.py build_ext --inplace``) the kernels are compiled now,
against that torch. Under pip's default build isolation torch is not importable (pip builds in a
fresh environment and we do not ask it to download a second torch of possibly another version and
CUDA flavour), so the package installs without them and ``gpu_ops`` compiles them on first use
(cached) or when you run ``python -m gpu_ops.build``. See the "Install" section of README.md.

The choices (sources by glob, CUDA or not with a compile+link probe of the toolkit, ``FORCE_CUDA``,
architectures, compiler, smoke test) live in ``gpu_ops/build.py``, shared with the on-demand build:
``FORCE_CUDA=1`` builds CUDA or fails at once; ``FORCE_CUDA=0`` builds CPU only; unset builds CUDA
where torch is a CUDA build and a toolkit passes the probe, else CPU with a warning. After the build
the library is loaded in a fresh interpreter and an argument error must raise ``RuntimeError``;
where it crashes, it is rebuilt with the next known-good compiler (``/usr/bin/g++``, ...).
"""

import importlib.util
import os
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _say(msg):
    print(f"gpu_ops: {msg}", file=sys.stderr)


def _build_module():
    """gpu_ops/build.py, loaded by path (importing the gpu_ops package would load the kernels)."""
    spec = importlib.util.spec_from_file_location("_gpu_ops_build", os.path.join(ROOT, "gpu_ops", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _setup_with_extension(torch, cpp_extension):
    b = _build_module()
    cxx, _ = b.compiler_candidates(torch)[0]
    try:
        build_cuda, reason, home = b.choose_cuda(torch, cxx)
    except b.BuildError as exc:
        raise SystemExit(f"gpu_ops: {exc}") from exc
    rel = lambda paths: [os.path.relpath(p, ROOT) for p in paths]  # noqa: E731 - setuptools wants relative
    flags = b.extension_flags(build_cuda)
    if build_cuda:
        cpp_extension.CUDA_HOME = home  # torch reads this global for include and link paths
        _say(f"building CPU and CUDA kernels ({reason})")
        ext = cpp_extension.CUDAExtension(
            "gpu_ops._C", rel(b.sources(cuda=True)), define_macros=[("GPU_OPS_WITH_CUDA", None)],
            extra_compile_args=flags, libraries=b.LIBRARIES)
    else:
        msg = f"building CPU kernels only ({reason})"
        _say(msg if os.environ.get("FORCE_CUDA") == "0" or torch.version.cuda is None else "WARNING: " + msg)
        ext = cpp_extension.CppExtension("gpu_ops._C", rel(b.sources()), extra_compile_args=flags,
                                         libraries=b.LIBRARIES)

    class BuildExt(cpp_extension.BuildExtension.with_options(use_ninja=True)):
        """Builds, smoke-tests the result in a fresh interpreter, rebuilds with the next compiler
        when an argument error crashes instead of raising."""

        def run(self):
            failures = []
            for i, (cxx, cc) in enumerate(b.compiler_candidates(torch)):
                if i:
                    self.force = True
                    # run() turned the compiler name into an object; a fresh one must read CXX/CC.
                    self.compiler = None
                    shutil.rmtree(self.build_temp, ignore_errors=True)
                with b.compiler_env(cxx, cc):
                    super().run()
                lib = os.path.join(self.build_lib, self.get_ext_filename("gpu_ops._C"))
                ok, detail, crashed = b.smoke_test(lib)
                if ok:
                    _say(f"built {lib} ({detail}) with {cxx}; smoke test passed")
                    return
                failures.append(f"{cxx}: {detail}")
                if not crashed:  # e.g. does not load: another compiler would not change that
                    break
                _say(f"the build with {cxx} is broken ({detail}); rebuilding with the next compiler")
            raise SystemExit("gpu_ops: the built extension does not work: " + "; ".join(failures))

    setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})


try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    if os.environ.get("FORCE_CUDA") == "1":
        raise SystemExit(
            "gpu_ops: FORCE_CUDA=1 but torch is not importable in this build environment (pip's "
            "build isolation hides it): install torch, then `pip install --no-build-isolation ...`"
        ) from None
    _say(
        "torch is not importable in this build environment (pip's build isolation hides the torch "
        "you installed): installing without compiled kernels. gpu_ops compiles them on first use "
        "(cached), or run `python -m gpu_ops.build`; `pip install --no-build-isolation` compiles "
        "them at install."
    )
    setup()
else:
    _setup_with_extension(torch, cpp_extension)
