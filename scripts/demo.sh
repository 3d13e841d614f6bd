#!/usr/bin/env bash
# The main job on a small generated sample: build an LMDB store, verify it, read it back.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python_env.sh
rm -rf sample && mkdir -p sample
"$PY" scripts/make_sample.py sample/data -n 48
"$PY" -m packer build --format lmdb sample/data/images sample/data/labels -o sample/train.lmdb
"$PY" -m packer verify --deep sample/train.lmdb
"$PY" -m packer info sample/train.lmdb
"$PY" - <<'PY'
import torch
from readers import StoreDataset, collate_list

ds = StoreDataset("sample/train.lmdb", min_size=64)
loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate_list)
n = sum(len(batch) for batch in loader)
image, boxes = ds[0]
print(f"read back {n} samples with 2 workers; first: image {tuple(image.shape)} {image.dtype}, "
      f"{len(boxes)} boxes")
assert n == len(ds) == 48
PY
