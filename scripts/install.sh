#!/usr/bin/env bash
# Install everything packer needs on a fresh Debian/Ubuntu machine (idempotent, fast when done):
#   - libturbojpeg0 (libjpeg-turbo's TurboJPEG library; PyTurboJPEG loads it at run time)
#   - chromium (headless, for the HTML report tests)
#   - torch, only when none is installed (never replaces a CUDA build you already have)
#   - packer itself, editable, with the [dev,mongo] extras, building the gpu_ops extension
#   - the MongoDB-compatible test server (SecantusDB) in its own venv, .venv-mongo/
# Environment: PYTHON (default: see scripts/python_env.sh), PACKER_TORCH_SPEC (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python_env.sh
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
log() { echo "install: $*" >&2; }

need_apt=()
ldconfig -p 2>/dev/null | grep -q 'libturbojpeg\.so\.0' || need_apt+=(libturbojpeg0)
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
    log "installing ${PACKER_TORCH_SPEC:-torch==2.13.0}"
    pip_install "${PACKER_TORCH_SPEC:-torch==2.13.0}"
fi
pip_install setuptools wheel ninja
# --no-build-isolation: the extension must build against the torch installed above.
log "pip install -e .[dev,mongo] (builds gpu_ops)"
pip_install --no-build-isolation --use-pep517 -e ".[dev,mongo]"
bash scripts/mongo_server.sh install
"$PY" -c 'import packer, readers, gpu_ops; from packer.integrity import turbojpeg; turbojpeg()'
log "done"
