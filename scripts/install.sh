#!/usr/bin/env bash
# Install everything packer needs on a fresh Debian/Ubuntu machine (idempotent, fast when done):
#   - libturbojpeg0 (libjpeg-turbo's TurboJPEG library; PyTurboJPEG loads it at run time), hdf5-tools
#   - libjpeg-dev (libjpeg-turbo's headers, for gpu_ops' crop-aware JPEG decode)
#   - chromium (headless, for the HTML report tests)
#   - torch, only when no torch is installed (never replaces a build you already have): the CUDA
#     build 2.14.1 + torchvision 0.29.1 where an NVIDIA driver is present or CI=true, else the CPU
#     build 2.13.0+cpu (no torchvision; its tests skip)
#   - packer itself (distribution packer-vision), editable, with the [dev,mongo] extras, compiling
#     the gpu_ops kernels at install against that torch (--no-build-isolation); where CI=true,
#     with FORCE_CUDA=1 so a CUDA compile error fails CI even on a machine without a GPU
#   - MongoDB's mongod 6.0.5 for the tests, in .mongod/ (scripts/mongo_server.sh install)
# Environment: PYTHON (default: see scripts/python_env.sh), PACKER_TORCH_SPEC (overrides the torch
# choice above), PACKER_TORCH_CPU_INDEX (the CPU wheel index), FORCE_CUDA (default: 1 when
# CI=true, 0 with the CPU torch, else auto).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python_env.sh
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
log() { echo "install: $*" >&2; }

need_apt=()
ldconfig -p 2>/dev/null | grep -q 'libturbojpeg\.so\.0' || need_apt+=(libturbojpeg0)
# libjpeg-turbo's libjpeg API headers: gpu_ops' decode_jpeg_crops links it (libjpeg-dev pulls
# libjpeg62-turbo-dev on Debian, libjpeg-turbo8-dev on Ubuntu).
[ -f /usr/include/jpeglib.h ] || need_apt+=(libjpeg-dev)
command -v h5ls >/dev/null 2>&1 || need_apt+=(hdf5-tools)
# Headless browser for the HTML report tests (tests/browser.py; Debian's package name).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    log "apt-get install ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ -n "${PACKER_NEEDS_VENV:-}" ] && [ ! -x "$PY" ]; then
    log "system python is externally managed (PEP 668): creating .venv"
    python3 -m venv --system-site-packages .venv
fi
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
# torch: never replace one that imports (a CUDA build you chose stays). Without one: the CUDA build
# (with torchvision) where an NVIDIA driver is present, and in CI (which compiles the CUDA kernels
# and runs the torchvision comparisons); else the CPU build (~0.7 GB instead of ~5.5 GB), from
# PyTorch's CPU wheel index when it answers, else from wherever pip finds that version. No
# torchvision then: PyPI's torchvision is built for the CUDA torch; its tests skip with a reason.
has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; }
torch_ok() {
    if [ "${CI:-}" = "true" ]; then "$PY" -c 'import torch, torchvision' 2>/dev/null
    else "$PY" -c 'import torch' 2>/dev/null; fi
}
if ! torch_ok; then
    if [ -n "${PACKER_TORCH_SPEC:-}" ]; then
        spec="$PACKER_TORCH_SPEC"; index=()
    elif [ "${CI:-}" = "true" ] || has_nvidia_gpu; then
        spec="torch==2.14.1 torchvision==0.29.1"; index=()
    else
        spec="torch==2.13.0+cpu"
        index=(--extra-index-url "${PACKER_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
               --retries 1 --timeout 10)
        export FORCE_CUDA="${FORCE_CUDA:-0}"   # no GPU, CPU torch: CPU kernels only
    fi
    log "installing $spec"
    # shellcheck disable=SC2086
    pip_install "${index[@]}" $spec
fi
pip_install setuptools wheel ninja
if [ "${CI:-}" = "true" ] && [ -z "${FORCE_CUDA:-}" ]; then
    export FORCE_CUDA=1   # CI has nvcc but no GPU: compile the CUDA kernels anyway, or fail
fi
# --no-build-isolation: the kernels compile now, against the torch installed above (with build
# isolation pip would hide it and gpu_ops would compile them on first use instead).
log "pip install -e .[dev,mongo] (compiles gpu_ops${FORCE_CUDA:+, FORCE_CUDA=$FORCE_CUDA})"
t0=$(date +%s)
pip_install --no-build-isolation -e ".[dev,mongo]"
log "packer installed in $(( $(date +%s) - t0 )) s"
# MDS export and its tests use MosaicML streaming, which imports torchvision and transformers and
# pins transformers<5 / numpy<2.2 (clashing with datasets 5) and every cloud SDK: installed apart,
# without its pins, where torchvision is (the CUDA torch; scripts/test.sh then requires it).
if "$PY" -c 'import torchvision' 2>/dev/null && ! "$PY" -c 'import streaming' 2>/dev/null; then
    log "installing mosaicml-streaming (--no-deps) and what it imports"
    pip_install zstd Brotli python-snappy catalogue 'transformers>=4.40'
    pip_install --no-deps 'mosaicml-streaming==0.13.0'
fi
bash scripts/mongo_server.sh install
PACKER_GPU_OPS_STRICT=1 PACKER_GPU_OPS_BUILD=0 "$PY" -c 'import packer, readers, gpu_ops; from packer.core.integrity import turbojpeg; turbojpeg()'
log "done"
