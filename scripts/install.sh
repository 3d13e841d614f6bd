#!/usr/bin/env bash
# Install everything packer needs on a fresh Debian/Ubuntu machine (idempotent, fast when done):
#   - libturbojpeg0 (libjpeg-turbo's TurboJPEG library; PyTurboJPEG loads it at run time), hdf5-tools
#   - libjpeg-dev (libjpeg-turbo's headers, for gpu_ops' crop-aware JPEG decode)
#   - chromium (headless, for the HTML report tests)
#   - torch, only when no torch is installed (never replaces a build you already have): the CUDA
#     build 2.14.1 + torchvision 0.29.1 where an NVIDIA driver is present, else the CPU build
#     2.13.0+cpu + torchvision 0.28.0+cpu from PyTorch's CPU wheel index (CI does the same: it runs
#     what a user without a GPU runs). Where that index does not answer, the CPU torch alone (from
#     wherever pip finds it; PyPI's torchvision is built for the CUDA torch and does not load with
#     it): said so, and the tests that need torchvision skip, naming the command that installs it.
#     A CPU torch already installed without torchvision gets the matching CPU torchvision the same way
#   - packer itself (distribution packer-vision), editable, with the [dev,mongo] extras, compiling
#     the gpu_ops kernels at install against that torch (--no-build-isolation)
#   - MongoDB's mongod 6.0.5 for the tests, in .mongod/ (scripts/mongo_server.sh install)
# It says first which Python it installs into: a virtualenv, the .venv/ it makes where the system
# Python is externally managed (PEP 668), or else that interpreter's own site-packages (pyenv,
# conda: ~1.7 GB there; make .venv/ first, `python3 -m venv .venv`, to keep it apart).
# Environment: PYTHON (default: see scripts/python_env.sh), PACKER_TORCH_SPEC (overrides the torch
# choice above), PACKER_TORCH_CPU_INDEX (the CPU wheel index), FORCE_CUDA (default: 0 with the CPU
# torch, else auto). The CUDA compile check runs in CI as scripts/check_install.sh's cuda stage.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python_env.sh
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
log() { echo "install: $*" >&2; }
log "$(install_target_message)"   # before anything is installed: where it all goes

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
CPU_INDEX="${PACKER_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
cpu_index=(--extra-index-url "$CPU_INDEX" --retries 1 --timeout 10)
no_torchvision() {  # no_torchvision WHAT PIP_OUTPUT
    log "no torchvision: $1 could not be installed (pip: $(grep -m 1 '^ERROR' <<<"$2" || tail -n 1 <<<"$2"))."
    log "  PyPI's torchvision is built for the CUDA torch and does not load with the CPU one. Going on"
    log "  without it: the tests that need it skip, saying what to install; readers' detection targets"
    log "  and transforms=... need it (pip install $1 --index-url $CPU_INDEX, once that index answers)"
}
# torch: never replace one that imports (a CUDA build you chose stays). Without one: the CUDA build
# (with torchvision) where an NVIDIA driver is present; else the CPU build (~0.7 GB instead of
# ~5.5 GB) with its torchvision from PyTorch's CPU wheel index, or alone where that index does not
# answer (the torch from wherever pip finds that version).
has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; }
cpu_torchvision_tried=""
if ! "$PY" -c 'import torch' 2>/dev/null; then
    if [ -n "${PACKER_TORCH_SPEC:-}" ]; then
        log "installing $PACKER_TORCH_SPEC"
        # shellcheck disable=SC2086
        pip_install $PACKER_TORCH_SPEC
    elif has_nvidia_gpu; then
        log "installing torch==2.14.1 torchvision==0.29.1 (CUDA: an NVIDIA driver is present)"
        pip_install torch==2.14.1 torchvision==0.29.1
    else
        export FORCE_CUDA="${FORCE_CUDA:-0}"   # no GPU, CPU torch: CPU kernels only
        cpu_torchvision_tried=1
        log "installing torch==2.13.0+cpu torchvision==0.28.0+cpu (no NVIDIA driver: the CPU build)"
        if ! out="$(pip_install "${cpu_index[@]}" torch==2.13.0+cpu torchvision==0.28.0+cpu 2>&1)"; then
            no_torchvision torchvision==0.28.0 "$out"
            pip_install "${cpu_index[@]}" torch==2.13.0+cpu
        fi
    fi
fi
pip_install setuptools wheel ninja
# --no-build-isolation: the kernels compile now, against the torch installed above (with build
# isolation pip would hide it and gpu_ops would compile them on first use instead).
log "pip install -e .[dev,mongo] (compiles gpu_ops${FORCE_CUDA:+, FORCE_CUDA=$FORCE_CUDA})"
t0=$(date +%s)
pip_install --no-build-isolation -e ".[dev,mongo]"
log "packer installed in $(( $(date +%s) - t0 )) s"
# A CPU torch you already had, without torchvision: add the torchvision built for it (never PyPI's).
if [ -z "$cpu_torchvision_tried" ] && [ -z "${PACKER_TORCH_SPEC:-}" ] \
        && ! "$PY" -c 'import torchvision' 2>/dev/null \
        && tv="$("$PY" -c 'import torch; from readers.targets import matching_torchvision as m
v = torch.__version__; print((m(v) or "") if v.endswith("+cpu") else "")' 2>/dev/null)" && [ -n "$tv" ]; then
    log "installing torchvision==$tv+cpu (the build for the installed CPU torch)"
    out="$(pip_install "${cpu_index[@]}" "torchvision==$tv+cpu" 2>&1)" || no_torchvision "torchvision==$tv" "$out"
fi
# MDS export and its tests use MosaicML streaming, which imports torchvision and transformers and
# pins transformers<5 / numpy<2.2 (clashing with datasets 5) and every cloud SDK: installed apart,
# without its pins, where torchvision is (scripts/test.sh then requires it).
if "$PY" -c 'import torchvision' 2>/dev/null && ! "$PY" -c 'import streaming' 2>/dev/null; then
    log "installing mosaicml-streaming (--no-deps) and what it imports"
    pip_install zstd Brotli python-snappy catalogue 'transformers>=4.40'
    pip_install --no-deps 'mosaicml-streaming==0.13.0'
fi
bash scripts/mongo_server.sh install
PACKER_GPU_OPS_STRICT=1 PACKER_GPU_OPS_BUILD=0 "$PY" -c 'import packer, readers, gpu_ops; from packer.core.integrity import turbojpeg; turbojpeg()'
log "done"
