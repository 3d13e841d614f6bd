"""Dataset decoding options: layout, reduced scale, min_size, EXIF, decoders, missing library."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packer
from packer.core.errors import DependencyError, UsageError
from packer.core.integrity import apply_orientation, turbo_decode
from readers import StoreDataset, choose_scale, collate_boxes, parse_scale
from readers.decode import scaled_size
from tests import corpus


@pytest.fixture(scope="module")
def store(boxes_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("rd") / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    return out


def test_layouts_and_labels(store):
    chw = StoreDataset(store)
    hwc = StoreDataset(store, layout="HWC")
    img, boxes = chw[0]
    assert img.dtype == torch.uint8 and img.shape[0] == 3
    assert img.permute(1, 2, 0).equal(hwc[0][0])
    assert boxes.dtype == torch.float32 and boxes.shape[1] == 5
    gray = StoreDataset(store, channels=1)[5][0]
    assert gray.shape[0] == 1


@pytest.mark.parametrize("scale", ["1/2", 0.25, (1, 8)])
def test_reduced_scale_decode(store, scale):
    full = StoreDataset(store, layout="HWC")[0][0]
    small = StoreDataset(store, layout="HWC", scale=scale)[0][0]
    f = parse_scale(scale)
    w, h = scaled_size(full.shape[1], full.shape[0], f)
    assert small.shape == (h, w, 3)


def test_min_size_picks_smallest_fast_scale():
    assert choose_scale(500, 375, 90) == parse_scale("1/4")  # 125x94 keeps 90
    assert choose_scale(500, 375, 100) == parse_scale("1/2")
    assert choose_scale(500, 375, 375) is None
    assert choose_scale(500, 375, 1000) is None  # never upsample; full size is the best we have


def test_min_size_dataset(store):
    ds = StoreDataset(store, min_size=60, layout="HWC")
    for i in range(6):
        assert min(ds[i][0].shape[:2]) >= 60 or min(ds.reader.get(i).width, ds.reader.get(i).height) < 60


def test_opencv_decoder_only_when_asked(store):
    t = StoreDataset(store, layout="HWC")[1][0].numpy().astype(int)
    o = StoreDataset(store, layout="HWC", decoder="opencv")[1][0].numpy().astype(int)
    assert t.shape == o.shape and np.abs(t - o).mean() < 2
    with pytest.raises(UsageError):
        StoreDataset(store, decoder="pillow")


def test_exif_recorded_is_applied_at_read_time(tmp_path):
    j = corpus.good_jpeg(3, 30, 50)
    (tmp_path / "i" / "c").mkdir(parents=True)
    (tmp_path / "i" / "c" / "r.jpg").write_bytes(corpus.with_exif(j, 6))
    out = tmp_path / "s.lmdb"
    packer.build(tmp_path / "i", None, out, workers=1, exif="record")
    img = StoreDataset(out, layout="HWC")[0][0].numpy()
    assert img.shape == (50, 30, 3)
    assert np.array_equal(img, apply_orientation(turbo_decode(j), 6))
    raw = StoreDataset(out, layout="HWC", apply_exif=False)[0][0]
    assert raw.shape == (30, 50, 3)


def test_collate_boxes(store):
    ds = StoreDataset(store, min_size=10, scale=None)
    same = [i for i in range(24) if ds.reader.get(i).width == 500][:3]
    images, boxes = collate_boxes([ds[i] for i in same])
    assert images.shape[0] == 3 and boxes.shape[1] == 6
    assert set(boxes[:, 0].tolist()) <= {0.0, 1.0, 2.0}


def test_missing_libturbojpeg_names_the_install(monkeypatch, store):
    import turbojpeg

    from packer.core import integrity

    def no_lib(*a, **k):
        raise OSError("libturbojpeg.so.0: cannot open shared object file")
    monkeypatch.setattr(integrity, "_TURBO", None)
    monkeypatch.setattr(turbojpeg, "TurboJPEG", no_lib)
    with pytest.raises(DependencyError, match="apt-get install libturbojpeg0"):
        StoreDataset(store)
    assert StoreDataset(store, decoder="opencv")[0][0].shape[0] == 3


def test_unlabeled_box_images_read_as_no_boxes(tmp_path):
    for i in range(3):
        (tmp_path / "i").mkdir(exist_ok=True)
        (tmp_path / "i" / f"{i}.jpg").write_bytes(corpus.good_jpeg(i, 32, 32))
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "1.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    out = tmp_path / "s.lmdb"
    rep = packer.build(tmp_path / "i", tmp_path / "l", out, workers=1, allow_unlabeled=True)
    assert rep.ok
    ds = StoreDataset(out)
    images, boxes = collate_boxes([ds[i] for i in range(3)])
    assert images.shape == (3, 3, 32, 32)
    assert torch.equal(boxes, torch.tensor([[1.0, 0.0, 0.5, 0.5, 0.2, 0.2]]))
    assert ds.metadata.stats["unlabeled"] == 2 and ds.metadata.stats["boxes"] == 1
