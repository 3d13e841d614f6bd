#!/usr/bin/env bash
# Install everything packer needs on a fresh Debian/Ubuntu machine (idempotent, fast when done):
#   - libturbojpeg0 (libjpeg-turbo's TurboJPEG library; PyTurboJPEG loads it at run time), hdf5-tools
#   - libjpeg-dev (libjpeg-turbo's headers, for gpu_ops' crop-aware JPEG decode)
#   - chromium (headless, for the HTML report tests)
#   - torch 2.14.1 + torchvision 0.29.1, only when no torch is installed (never replaces a CUDA
#     build you already have)
#   - packer itself (distribution packer-vision), editable, with the [dev,mongo] extras, compiling
#     the gpu_ops kernels at install against that torch (--no-build-isolation); where CI=true,
#     with FORCE_CUDA=1 so a CUDA compile error fails CI even on a machine without a GPU
#   - MongoDB's mongod 6.0.5 for the tests, in .mongod/ (scripts/mongo_server.sh install)
# Environment: PYTHON (default: see scripts/python_env.sh), PACKER_TORCH_SPEC (default
# "torch==2.14.1 torchvision==0.29.1"), FORCE_CUDA (default: 1 when CI=true, else auto).
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
if ! "$PY" -c 'import torch' 2>/dev/null; then
    spec="${PACKER_TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
    log "installing $spec"
    # shellcheck disable=SC2086
    pip_install $spec
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
bash scripts/mongo_server.sh install
PACKER_GPU_OPS_STRICT=1 PACKER_GPU_OPS_BUILD=0 "$PY" -c 'import packer, readers, gpu_ops; from packer.integrity import turbojpeg; turbojpeg()'
log "done"
