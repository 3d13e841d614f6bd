#!/usr/bin/env bash
# Fills .rkit/ (git-ignored) with what scripts/bench_remote.py needs beyond the GPU machine's image
# (its /opt/torch/.venv has torch, numpy, opencv, aiohttp, requests, werkzeug, jinja2, click, ...):
# the moto S3 server, boto3 / s3fs, the aws CLI (WebDataset's pipe:aws s3 cp), WebDataset, MosaicML
# MDS and LitData, pinned below, one version each, for a machine with no package index:
#
#   bash scripts/remote_wheels.sh [PYTHON_VERSION] [DEST] [PIECE_MB]   # defaults: 3.12, .rkit, 48
#
# The 33 wheels (61 MB; cp3X / abi3 manylinux x86_64 or pure Python) are downloaded with --no-deps
# into DEST/wheels, tarred (no compression: wheels are zips already; names sorted, owner and times
# fixed, so the same wheels give the same hash) and split into DEST/piece.00, .01, ... (48 MiB and
# about 10 MiB at 3.12); DEST/SHA256SUMS holds the whole tar's hash and the piece count, as
# scripts/dali_wheels.sh's does. Nothing the image already has is in here (installed with --no-deps;
# the pins were resolved against the image's own versions): lmdb, PyTurboJPEG and libturbojpeg come
# from .whl/ (scripts/gpu_wheels.sh). The kit was checked on the H200 (S3 server, boto3, s3fs,
# aws s3 cp, MDS, LitData and WebDataset through it); its known unmet pins (mosaicml-streaming wants
# numpy<2.2, transformers<5) are harmless here.
#
# Carried to the GPU machine one piece a call (each call carries at most 64 MiB):
#   1. carry .rkit/piece.00 .rkit/SHA256SUMS:   gpu_check.sh carry
#   2. carry .rkit/piece.01 .whl:               gpu_check.sh remote
# scripts/gpu_check.sh copies them to /tmp/packer_carry/rkit and, once every piece is there and the
# joined pieces match the hash, installs the wheels into /tmp/rkit_site (pip --target, no index, no
# deps; once per machine); its `remote` stage runs bench_remote.py with /tmp/rkit_site first on
# PYTHONPATH and /tmp/rkit_site/bin (aws) on PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYV=${1:-3.12}
DEST=${2:-.rkit}
PIECE_MB=${3:-48}
PINS=(
  # S3 server (moto's core and Flask, not the whole moto[server] extra: S3 needs none of the rest)
  moto==5.2.1 Flask==3.1.3 flask-cors==6.0.5 blinker==1.9.0 itsdangerous==2.2.0 xmltodict==1.0.4
  responses==0.26.3 py-partiql-parser==0.6.3 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  boto3==1.43.117 botocore==1.43.117 s3transfer==0.19.3 jmespath==1.1.0
  # s3fs; its fsspec is newer than the image's 2026.7.0, so the kit goes first on PYTHONPATH
  s3fs==2026.9.0 fsspec==2026.9.0 aiobotocore==3.10.0 aioitertools==0.13.0
  # aws CLI (bundles its own botocore; colorama is the image's)
  awscli==1.46.3 docutils==0.19 rsa==4.7.2 pyasn1==0.6.5
  webdataset==1.0.2 braceexpand==0.1.7
  mosaicml-streaming==0.13.0 catalogue==2.0.10 zstd==1.5.6.1 brotli==1.2.1 python-snappy==0.7.3 cramjam==2.14.0
  litdata==0.2.76 obstore==0.12.1
)
plat=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  plat+=(--platform "${p}_x86_64")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$DEST/wheels" "$DEST"/piece.* "$DEST/SHA256SUMS"
mkdir -p "$DEST/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${plat[@]}" -d "$DEST/wheels" "${PINS[@]}"
# One wheel a pin, none else.
have=$(ls "$DEST"/wheels/*.whl | wc -l)
[ "$have" = "${#PINS[@]}" ] || { echo "remote_wheels: $have wheels for ${#PINS[@]} pins" >&2; exit 1; }
du -sh "$DEST/wheels"
tar -C "$DEST" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$tmp/rkit.tar" wheels
split -b "${PIECE_MB}M" -d -a 2 "$tmp/rkit.tar" "$DEST/piece."
{ (cd "$tmp" && sha256sum rkit.tar); echo "pieces $(ls "$DEST"/piece.* | wc -l)"; echo "python $PYV"; } > "$DEST/SHA256SUMS"
# The pieces, joined, are the tar.
[ "$(cat "$DEST"/piece.* | sha256sum | cut -d' ' -f1)" = "$(awk 'NR == 1 {print $1}' "$DEST/SHA256SUMS")" ] \
  || { echo "remote_wheels: the joined pieces do not match the tar's hash" >&2; exit 1; }
ls -la "$DEST"/piece.* "$DEST/SHA256SUMS"
cat "$DEST/SHA256SUMS"
