#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what scripts/gpu_check.sh installs on a GPU machine that has
# PyTorch but no package index: wheels of lmdb, PyTurboJPEG (built here: it ships only as an
# sdist), nvImageCodec and nvJPEG for that machine's Python, and this machine's libturbojpeg.so.0.
#
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION] [DEST]    # defaults: 3.12, .whl
#
# Then carry .whl (and .bench/sets/small.lmdb for the ddp stage: scripts/get_bench_images.sh +
# scripts/make_bench_sets.py) to the machine and run scripts/gpu_check.sh there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYV=${1:-3.12}
DEST=${2:-.whl}
mkdir -p "$DEST"
plat=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  plat+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${plat[@]}" -d "$DEST" lmdb nvidia-nvimgcodec-cu13 nvidia-nvjpeg
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" 'PyTurboJPEG>=1.7.3,<2'
python3 -m pip wheel -q --no-deps -w "$DEST" "$tmp"/*.tar.gz
lib=$(ldconfig -p | awk '/libturbojpeg\.so\.0 .*x86-64/ {print $NF; exit}')
[ -n "$lib" ] || { echo "gpu_wheels: libturbojpeg.so.0 not found (apt-get install libturbojpeg0)" >&2; exit 1; }
cp -aL "$lib" "$DEST/libturbojpeg.so.0"
ls -la "$DEST"
du -sh "$DEST"
