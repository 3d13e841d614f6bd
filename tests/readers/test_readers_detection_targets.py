"""StoreDataset's detection hook over an "objects" store built from COCO: targets carry
readers.targets' BoundingBoxes / Mask that torchvision.transforms.v2 moves, and
return_metadata is honoured with transforms too."""
from __future__ import annotations

import json

import pytest
import torch

import packer
from readers import StoreDataset
from tests import label_corpus as lc

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def coco_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    images, path, coco = lc.make_coco(root / "src")
    loc = str(root / "c.lmdb")
    assert packer.build(images, path, loc, "lmdb", workers=1).ok
    return loc, coco


@pytest.mark.torchvision
def test_objects_store_targets_move_with_v2(coco_store):
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    loc, coco = coco_store
    plain = StoreDataset(loc, transforms=lambda img, tgt: (img, tgt), instance_masks=True)
    flipped = StoreDataset(loc, transforms=v2.RandomHorizontalFlip(p=1.0), instance_masks=True)
    i = plain.index_of("a.jpg")
    img, tgt = plain[i]
    fimg, ftgt = flipped[i]
    H, W = img.shape[-2:]
    assert isinstance(tgt["boxes"], tv_tensors.BoundingBoxes) and tgt["boxes"].canvas_size == (H, W)
    # COCO's bbox [x, y, w, h] in pixels -> XYXY; categories map to the store's class ids
    want = sorted([a["bbox"] for a in coco["annotations"] if a["image_id"] == 10])
    got = sorted([[x1, y1, x2 - x1, y2 - y1] for x1, y1, x2, y2 in tgt["boxes"].tolist()])
    assert torch.allclose(torch.tensor(got), torch.tensor(want, dtype=torch.float32), atol=1e-3)
    assert torch.equal(fimg, img.flip(-1))
    assert torch.allclose(ftgt["boxes"][:, 0], W - tgt["boxes"][:, 2], atol=1e-4)
    assert isinstance(tgt["masks"], tv_tensors.Mask) and tgt["masks"].shape == (2, H, W)
    assert torch.equal(ftgt["masks"], tgt["masks"].flip(-1))        # masks move with the image
    names = plain.metadata.class_names
    cat = {c["id"]: c["name"] for c in coco["categories"]}
    assert sorted(names[c] for c in tgt["labels"].tolist()) == sorted(
        cat[a["category_id"]] for a in coco["annotations"] if a["image_id"] == 10)
    # polygons are KeyPoints: the flip moves them too (torchvision's key-point flip: W - 1 - x)
    ring, fring = tgt["polygons"][0][0], ftgt["polygons"][0][0]
    assert isinstance(ring, tv_tensors.KeyPoints) and ring.canvas_size == (H, W)
    assert torch.allclose(fring[:, 0], W - 1 - ring[:, 0]) and torch.equal(fring[:, 1], ring[:, 1])
    # a resize scales boxes and canvas together
    small = StoreDataset(loc, transforms=v2.Resize((H // 2, W // 2), antialias=True))
    simg, stgt = small[i]
    assert stgt["boxes"].canvas_size == (H // 2, W // 2)
    assert torch.allclose(stgt["boxes"], tgt["boxes"] / 2, atol=0.51)


@pytest.mark.torchvision
def test_return_metadata_with_transforms(coco_store):
    loc, _ = coco_store
    ds = StoreDataset(loc, transforms=lambda img, tgt: (img, tgt), return_metadata=True)
    for i in range(len(ds)):
        sample = ds[i]
        assert len(sample) == 3
        img, tgt, meta = sample
        rec = ds.reader.get(i)
        assert meta == dict(rec.metadata) and tgt["key"] == rec.key
        json.dumps(meta)
    assert len(StoreDataset(loc, transforms=lambda img, tgt: (img, tgt))[0]) == 2
