#!/usr/bin/env bash
# Fills .dali/ (git-ignored) with NVIDIA DALI (the competing loader of scripts/bench_vs_dali.py and
# the dali feed of scripts/bench_train_gpu.py) and its small dependencies for a GPU machine with
# no package index, cut into pieces that one device call each can carry (a call carries at most
# 64 MiB; DALI's wheel alone is ~190 MB):
#
#   bash scripts/dali_wheels.sh [PYTHON_VERSION] [DEST] [PIECE_MB]   # defaults: 3.12, .dali, 50
#
# Writes DEST/piece.00, piece.01, ... (one tar of the wheels, split) and DEST/SHA256SUMS (the
# whole tar's hash and the piece count). Carry DEST/SHA256SUMS with the first piece, then one
# piece a call to the same warm machine (pieces already there stay: they are ignored files), e.g.
# carry [".dali/SHA256SUMS", ".dali/piece.00"], then [".dali/piece.01"], ... Once all pieces are
# there, scripts/gpu_check.sh joins them, checks the hash and installs DALI into its own
# --target (/tmp/dali_site: an install into the .whl target would share the nvidia/ namespace
# folder, which the next --upgrade install of the .whl wheels wipes).
# Left out: nvidia-libnvcomp-cu13 (30 MB; DALI's compression operators only), and what the GPU
# machine's image already has (numpy, six, packaging, nvImageCodec from .whl/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYV=${1:-3.12}
DEST=${2:-.dali}
PIECE_MB=${3:-50}
DALI=${DALI_VERSION:-2.4.0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  plat+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${plat[@]}" -d "$tmp/wheels" "nvidia-dali-cuda130==$DALI" 'astunparse>=1.6,<=1.6.3' 'gast>=0.3.3,<=0.7.0' \
  makefun 'libcst~=1.8' nvtx optree
rm -rf "$DEST" && mkdir -p "$DEST"
tar -C "$tmp" -cf "$tmp/dali.tar" wheels
split -b "${PIECE_MB}M" -d -a 2 "$tmp/dali.tar" "$DEST/piece."
{ (cd "$tmp" && sha256sum dali.tar); echo "pieces $(ls "$DEST"/piece.* | wc -l)"; } > "$DEST/SHA256SUMS"
ls -la "$DEST"
cat "$DEST/SHA256SUMS"
