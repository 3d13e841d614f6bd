#!/usr/bin/env bash
# Fills .dali/ (git-ignored) with NVIDIA DALI (the competing loader of scripts/bench_vs_dali.py and
# the dali feed of scripts/bench_train_gpu.py) and its small dependencies for a GPU machine with
# no package index, cut into pieces that one device call each can carry (a call carries at most
# 64 MiB; DALI's wheel alone is 199 MB):
#
#   bash scripts/dali_wheels.sh [PYTHON_VERSION] [DEST] [PIECE_MB]   # defaults: 3.12, .dali, 48
#
# The wheels are installed here into a staging folder for that one Python (pip --target with
# --python-version: nothing runs), the extension modules built for every other Python are dropped
# (DALI ships backend_impl and python_function_plugin for 3.10-3.15t), and the folder is packed as
# one tar.xz (xz -9: about 3x smaller than the wheel's zip), split into DEST/piece.00, .01, ...
# DEST/SHA256SUMS holds the whole archive's hash and the piece count.
#
# On the GPU machine each call carries one piece (the first call SHA256SUMS too);
# scripts/gpu_check.sh copies what a call carried to /tmp/packer_carry/dali (outside the checkout,
# so nothing relies on ignored files left in it) and, once every piece is there, joins them, checks
# the hash and unpacks the folder as /tmp/dali_site (a folder of its own: sharing the .whl
# target's nvidia/ namespace folder, the next --upgrade install of those wheels would wipe it).
# Left out: nvidia-libnvcomp-cu13 (30 MB; DALI's compression operators only), and what the GPU
# machine's image already has (numpy, six, packaging, nvImageCodec from .whl/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYV=${1:-3.12}
DEST=${2:-.dali}
PIECE_MB=${3:-48}
DALI=${DALI_VERSION:-2.4.0}
tag=cpython-${PYV/./}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  plat+=(--platform "${p}_x86_64")
done
python3 -m pip install -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${plat[@]}" --no-compile --target "$tmp/site" "nvidia-dali-cuda130==$DALI" 'astunparse>=1.6,<=1.6.3' \
  'gast>=0.3.3,<=0.7.0' makefun 'libcst~=1.8' nvtx optree
# Extension modules of the other Pythons (name.cpython-3XY[t]-....so), never loaded by this one.
find "$tmp/site" -name '*.cpython-3*.so' ! -name "*.${tag}-*" -print -delete | sed 's#.*/#dropped: #'
rm -rf "$tmp/site/bin"
du -sh "$tmp/site"
tar -C "$tmp/site" -cf - . | xz -T0 -9 > "$tmp/dali.tar.xz"
rm -rf "$DEST" && mkdir -p "$DEST"
split -b "${PIECE_MB}M" -d -a 2 "$tmp/dali.tar.xz" "$DEST/piece."
{ (cd "$tmp" && sha256sum dali.tar.xz); echo "pieces $(ls "$DEST"/piece.* | wc -l)"; echo "python $PYV"; } > "$DEST/SHA256SUMS"
ls -la "$DEST"
cat "$DEST/SHA256SUMS"
