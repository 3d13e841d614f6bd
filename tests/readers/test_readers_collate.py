"""The README's DataLoader example: images of different sizes reach ``collate_boxes`` resized to
one size by ``readers.Resize``; without it the collate says what to do instead of torch.stack's
'stack expects each tensor to be equal size'."""
from __future__ import annotations

import pickle

import pytest
import torch

from packer import build
from packer.core.errors import UsageError
from packer.sample import make_dataset
from readers import Resize, StoreDataset, collate_boxes


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("front")
    images, labels = make_dataset(root / "data", 12, kind="boxes", seed=11)
    loc = str(root / "train.lmdb")
    build(images, labels, loc, format="lmdb", progress=False)
    return loc


@pytest.mark.timeout(120)
def test_readme_dataloader_example_runs_with_workers(mixed_store):
    ds = StoreDataset(mixed_store, min_size=256, transform=Resize((256, 256)))
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate_boxes)
    seen = 0
    for images, boxes in loader:
        assert images.shape[1:] == (3, 256, 256) and images.dtype == torch.uint8
        assert boxes.shape[1] == 6 and (boxes[:, 0] < len(images)).all()
        seen += len(images)
    assert seen == len(ds) == 12


def test_collate_boxes_names_the_fix_for_mixed_sizes(mixed_store):
    ds = StoreDataset(mixed_store, min_size=256)
    sizes = {tuple(ds[i][0].shape) for i in range(len(ds))}
    assert len(sizes) > 1   # the sample has several image sizes: the case the README hit
    with pytest.raises(UsageError, match=r"Resize\(\(H, W\)\).*collate_detection"):
        collate_boxes([ds[i] for i in range(len(ds))])


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_resize_matches_interpolate_and_pickles(layout):
    g = torch.Generator().manual_seed(0)
    chw = torch.randint(0, 256, (3, 37, 53), dtype=torch.uint8, generator=g)
    img = chw if layout == "CHW" else chw.permute(1, 2, 0).contiguous()
    op = pickle.loads(pickle.dumps(Resize((20, 24), layout=layout)))
    out = op(img)
    want = torch.nn.functional.interpolate(chw[None].float(), size=(20, 24), mode="bilinear",
                                           align_corners=False, antialias=True)[0].round().clamp(0, 255)
    want = want.to(torch.uint8)
    assert torch.equal(out, want if layout == "CHW" else want.permute(1, 2, 0))
    assert Resize(7)(chw).shape == (3, 7, 7)
    assert Resize((37, 53))(chw) is chw   # already that size: returned as it is


@pytest.mark.parametrize("size,layout", [((0, 5), "CHW"), ((5,), "CHW"), (5, "NCHW")])
def test_resize_refuses_bad_arguments(size, layout):
    with pytest.raises(UsageError):
        Resize(size, layout=layout)


@pytest.mark.timeout(120)
def test_coco_export_of_a_yolo_store_without_class_names(tmp_path):
    """A YOLO store of bare class ids exports as COCO with one category per id used (it was an
    IndexError in write_coco)."""
    import json

    from packer.jobs.export import export
    images, labels = make_dataset(tmp_path / "d", 8, kind="boxes", seed=3)
    for names in labels.rglob("classes.txt"):
        names.unlink()
    loc = str(tmp_path / "boxes.lmdb")
    build(images, labels, loc, format="lmdb", workers=1)
    rep = export(loc, tmp_path / "out", labels_form="coco")
    assert rep.ok
    doc = json.loads(next((tmp_path / "out").rglob("*.json")).read_text())
    ids = {a["category_id"] for a in doc["annotations"]}
    assert ids and ids <= {c["id"] for c in doc["categories"]}
