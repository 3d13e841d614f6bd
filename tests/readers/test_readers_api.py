"""StoreDataset's torchvision-style API: ImageFolder attributes, labels-only targets, key lookup,
``with ds.reader:``, and detection with transforms.v2 + collate_detection in DataLoader workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packer
from packer.sample import make_dataset
from readers import StoreDataset, collate_detection


@pytest.fixture(scope="module", params=["lmdb", "hdf5", pytest.param("mongo", marks=pytest.mark.mongo)])
def class_store(request, tmp_path_factory):
    images, _ = make_dataset(tmp_path_factory.mktemp("api"), 12, kind="classes", seed=3)
    if request.param == "mongo":
        from tests import mongo_support

        out = mongo_support.new_store_location("api")
    else:
        out = tmp_path_factory.mktemp("apis") / ("s.lmdb" if request.param == "lmdb" else "s.h5")
    packer.build(images, None, out, format=request.param, workers=1,
                 report_path=tmp_path_factory.mktemp("r") / "r.json")
    yield out
    if request.param == "mongo":
        from tests import mongo_support

        mongo_support.drop_location(out)


@pytest.fixture(scope="module")
def box_store(boxes_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("apib") / "b.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    return out


def test_imagefolder_attributes(class_store):
    ds = StoreDataset(class_store)
    assert ds.classes == ["bird", "cat", "dog"]
    assert ds.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    assert ds.targets == [ds.reader.get(i).label for i in range(len(ds))]
    assert all(isinstance(t, int) for t in ds.targets)
    text = repr(ds)
    assert text.splitlines()[0] == "Dataset StoreDataset" and "Number of datapoints: 12" in text
    assert str(class_store) in text
    # usable by WeightedRandomSampler as ImageFolder's targets are
    weights = 1.0 / np.bincount(ds.targets)[ds.targets]
    sampler = torch.utils.data.WeightedRandomSampler(weights, len(ds), generator=torch.Generator().manual_seed(0))
    assert len(list(sampler)) == len(ds)


def test_targets_read_no_image_bytes(class_store, monkeypatch):
    ds = StoreDataset(class_store)
    reader = ds.reader
    monkeypatch.setattr(type(reader), "get_many", lambda *a, **k: pytest.fail("read image records"))
    monkeypatch.setattr(type(reader), "get", lambda *a, **k: pytest.fail("read image records"))
    assert len(ds.targets) == 12


def test_key_lookup_and_with_reader(class_store):
    ds = StoreDataset(class_store, return_key=True)
    key = ds[5][2]
    assert ds.index_of(key) == 5
    img, label, k = ds.get_key(key)
    assert k == key and torch.equal(img, ds[5][0])
    with pytest.raises(KeyError):
        ds.index_of("no/such.jpg")
    with ds.reader:
        assert ds.reader.get(0).key
    assert ds[0][2] == ds.reader.get(0).key        # the dataset reopened its reader


@pytest.mark.torchvision
def test_detection_transforms_move_boxes(box_store):
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    plain = StoreDataset(box_store, transforms=lambda img, tgt: (img, tgt))
    flipped = StoreDataset(box_store, transforms=v2.RandomHorizontalFlip(p=1.0))
    i = next(i for i in range(len(plain)) if len(plain[i][1]["boxes"]))
    img, tgt = plain[i]
    fimg, ftgt = flipped[i]
    assert isinstance(tgt["boxes"], tv_tensors.BoundingBoxes) and tgt["boxes"].canvas_size == tuple(img.shape[-2:])
    W = img.shape[-1]
    assert torch.equal(fimg, img.flip(-1))
    assert torch.allclose(ftgt["boxes"][:, 0], W - tgt["boxes"][:, 2], atol=1e-4)
    assert torch.equal(ftgt["labels"], tgt["labels"]) and tgt["labels"].dtype == torch.int64
    # the YOLO rows map to XYXY pixels
    rows = plain.reader.get(i).label
    assert torch.allclose(tgt["boxes"][:, 0], torch.from_numpy((rows[:, 1] - rows[:, 3] / 2) * W), atol=1e-3)
    crop = StoreDataset(box_store, transforms=v2.Compose([v2.RandomResizedCrop(64, antialias=True),
                                                          v2.SanitizeBoundingBoxes()]))
    cimg, ctgt = crop[i]
    assert cimg.shape[-2:] == (64, 64) and ctgt["boxes"].canvas_size == (64, 64)
    assert len(ctgt["boxes"]) == len(ctgt["labels"])


@pytest.mark.torchvision
@pytest.mark.timeout(180)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_detection_collate_in_workers(box_store, ctx):
    from torchvision.transforms import v2

    ds = StoreDataset(box_store, transforms=v2.RandomHorizontalFlip(p=0.5))
    with pytest.raises(RuntimeError):
        next(iter(torch.utils.data.DataLoader(ds, batch_size=8)))   # default_collate cannot
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate_detection,
                                         multiprocessing_context=ctx)
    seen = 0
    for images, targets in loader:
        assert len(images) == len(targets) <= 5
        assert {tuple(t["boxes"].shape[1:]) for t in targets} <= {(4,)}
        seen += len(images)
    assert seen == len(ds)
