"""readers.FullDecode: whole-batch full-size decode through gpu_ops.decode_jpeg_crops - byte-equal
to a plain libjpeg-turbo decode, errors naming the key, DataLoader workers, mixed sizes refused."""
from __future__ import annotations

import pytest
import torch

from packer import api
from packer.errors import RecordError, UsageError
from packer.integrity import turbo_decode
from packer.sample import make_dataset
from readers import CropDataset, FullDecode, collate_decoded
from readers.crops import decode_crops, op_available
from tests.test_crop_decode import _cv_jpeg, _kinds, _photo

pytestmark = pytest.mark.skipif(not op_available(), reason="gpu_ops._C without decode_jpeg_crops")


def _turbo(jpeg, channels=3):
    return torch.from_numpy(turbo_decode(jpeg, pixel_format="gray" if channels == 1 else "rgb"))  # HWC


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(_kinds()))
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_full_size_is_byte_equal_to_turbo_decode(kind, layout):
    """Whole box, output = image size: the direct-row (HWC) and copy (CHW) paths, no resample."""
    jpeg = _kinds()[kind]
    ref = _turbo(jpeg)
    h, w = ref.shape[:2]
    fd = FullDecode()
    boxes, flips = fd.params([(h, w)] * 3, [0, 1, 2])
    out, errors = decode_crops([jpeg] * 3, boxes, flips, (h, w), layout=layout, dct_scale=1)
    assert errors == []
    for b in range(3):
        got = out[b] if layout == "HWC" else out[b].permute(1, 2, 0)
        assert torch.equal(got, ref), kind


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["baseline-420", "gray", "progressive-444-odd"])
def test_full_size_gray_strided_and_flipped_outputs(kind):
    """Luma output, a non-packed (strided) HWC buffer and a flip take the copy path: still exact."""
    jpeg = _kinds()[kind]
    ref = _turbo(jpeg)
    h, w = ref.shape[:2]
    boxes = torch.tensor([[0, 0, h, w]] * 2, dtype=torch.float64)
    gray, errors = decode_crops([jpeg] * 2, boxes, torch.zeros(2, dtype=torch.bool), (h, w), channels=1,
                                layout="HWC", dct_scale=1)
    assert errors == [] and torch.equal(gray[0], _turbo(jpeg, channels=1))
    big = torch.zeros((2, h, w, 4), dtype=torch.uint8)
    out, errors = decode_crops([jpeg] * 2, boxes, torch.tensor([False, True]), (h, w), layout="HWC",
                               out=big[..., :3], dct_scale=1)
    assert errors == []
    assert torch.equal(out[0], ref) and torch.equal(out[1], ref.flip(1))
    assert big[..., 3].eq(0).all()  # nothing written outside the view


@pytest.mark.timeout(60)
def test_full_size_corrupt_data_is_a_per_sample_error():
    jpeg = _cv_jpeg(_photo(64, 48, 9))
    h, w = _turbo(jpeg).shape[:2]
    bad = [jpeg[: len(jpeg) // 2], jpeg[:300] + bytes(200) + jpeg[500:], b"", jpeg]
    boxes = torch.tensor([[0, 0, h, w]] * 4, dtype=torch.float64)
    out, errors = decode_crops(bad, boxes, torch.zeros(4, dtype=torch.bool), (h, w), layout="HWC", dct_scale=1)
    assert [b for b, _ in errors] == [0, 1, 2]
    assert torch.equal(out[3], _turbo(jpeg))


@pytest.fixture(scope="module")
def same_size_store(tmp_path_factory):
    images, _ = make_dataset(tmp_path_factory.mktemp("fd"), 12, kind="classes", sizes=((97, 131),), seed=3)
    out = tmp_path_factory.mktemp("fds") / "s.lmdb"
    api.build(images, None, out, workers=1)
    return out


def _expected(ds, indices, layout):
    imgs = []
    for i in indices:
        rec = ds.reader.get(i)
        ref = _turbo(bytes(rec.data))
        imgs.append(ref if layout == "HWC" else ref.permute(2, 0, 1))
    return torch.stack(imgs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_crop_dataset_full_decode_batch(same_size_store, layout):
    ds = CropDataset(same_size_store, FullDecode(), layout=layout, return_key=True)
    images, labels, keys = ds.load_batch([0, 5, 11, 5])
    assert images.dtype == torch.uint8
    assert images.shape == ((4, 97, 131, 3) if layout == "HWC" else (4, 3, 97, 131))
    assert torch.equal(images, _expected(ds, [0, 5, 11, 5], layout))
    assert labels.tolist() == [ds.reader.get(i).label for i in (0, 5, 11, 5)]
    assert keys[1] == keys[3] == ds.reader.get(5).key


def _loader_batches(ds, workers, ctx):
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=collate_decoded,
                                         multiprocessing_context=ctx if workers else None)
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_full_decode_in_dataloader_workers(same_size_store, ctx):
    ds = CropDataset(same_size_store, FullDecode(), layout="HWC")
    main = _loader_batches(ds, 0, None)
    workers = _loader_batches(ds, 2, ctx)
    assert [x.shape[0] for x, _ in main] == [5, 5, 2]
    for (x0, y0), (x1, y1) in zip(main, workers):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert torch.equal(torch.cat([x for x, _ in main]), _expected(ds, range(12), "HWC"))


@pytest.mark.timeout(60)
def test_mixed_sizes_are_refused_naming_keys_and_sizes(tmp_path):
    images, _ = make_dataset(tmp_path / "src", 6, kind="classes", seed=1)  # 3 different sizes
    store = tmp_path / "m.lmdb"
    api.build(images, None, store, workers=1)
    ds = CropDataset(store, FullDecode(), layout="HWC", on_error="skip")
    recs = [ds.reader.get(i) for i in range(len(ds))]
    by_size = {}
    for i, r in enumerate(recs):
        by_size.setdefault((r.height, r.width), []).append(i)
    assert len(by_size) >= 2
    (s0, idx0), (s1, idx1) = list(by_size.items())[:2]
    with pytest.raises(UsageError, match="one image size per batch") as info:
        ds.load_batch([idx0[0], idx1[0]])
    msg = str(info.value)
    assert recs[idx0[0]].key in msg and recs[idx1[0]].key in msg
    assert f"{s0[0]}x{s0[1]}" in msg and f"{s1[0]}x{s1[1]}" in msg
    images_, _ = ds.load_batch(idx0)  # one size: fine, at that size
    assert tuple(images_.shape[1:3]) == s0


@pytest.mark.timeout(60)
def test_damaged_record_raises_record_error_with_key(tmp_path):
    images, _ = make_dataset(tmp_path / "src", 6, kind="classes", sizes=((64, 80),), seed=4)
    store = tmp_path / "s.lmdb"
    api.build(images, None, store, workers=1)
    import lmdb

    env = lmdb.open(str(store), max_dbs=8, subdir=True)
    db = env.open_db(b"data")
    with env.begin(write=True, db=db) as txn:
        key = (2).to_bytes(8, "big")
        data = bytes(txn.get(key))
        txn.put(key, data[: len(data) // 2])
    env.close()
    with pytest.raises(RecordError, match="checksum"):
        CropDataset(store, FullDecode()).load_batch([0, 1, 2])
    unchecked = CropDataset(store, FullDecode(), layout="HWC", check=False)
    key = unchecked.reader.get(2).key
    with pytest.raises(RecordError, match="Premature end|does not decode") as info:
        unchecked.load_batch([0, 1, 2])
    assert key in str(info.value)
    skipping = CropDataset(store, FullDecode(), layout="HWC", on_error="skip", check=False)
    images_, labels = skipping.load_batch([0, 1, 2, 3])
    assert images_.shape == (3, 64, 80, 3) and skipping.skipped == 1


@pytest.mark.timeout(60)
def test_exif_rotated_records_decode_rotated_at_their_displayed_size(tmp_path):
    """``--exif record``: a 90-degree record is decoded, rotated, and batched at its rotated size
    with unrotated records of that size; a batch of it with the 60x90 original is mixed-size."""
    import numpy as np

    from tests.corpus import with_exif

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    img = _photo(60, 90, 11)
    (src / "rot.jpg").write_bytes(with_exif(_cv_jpeg(img), 6))
    (src / "plain.jpg").write_bytes(_cv_jpeg(img))
    (src / "tall.jpg").write_bytes(_cv_jpeg(_photo(90, 60, 12)))
    store = tmp_path / "s.lmdb"
    api.build(tmp_path / "src", None, store, workers=1, exif="record")
    ds = CropDataset(store, FullDecode(), layout="HWC")
    rot, tall = ds.index_of("a/rot.jpg"), ds.index_of("a/tall.jpg")
    images, _ = ds.load_batch([rot, tall])
    rotated = torch.from_numpy(np.ascontiguousarray(np.rot90(turbo_decode(_cv_jpeg(img)), -1)))
    assert images.shape == (2, 90, 60, 3)
    assert torch.equal(images[0], rotated)
    assert torch.equal(images[1], _turbo(_cv_jpeg(_photo(90, 60, 12))))
    with pytest.raises(UsageError, match="one image size per batch"):
        ds.load_batch([rot, ds.index_of("a/plain.jpg")])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["baseline-420", "gray", "progressive-444-odd"])
def test_fast_idct_is_close_to_exact_and_opt_in(kind):
    """fast_idct: libjpeg's IFAST IDCT (FFCV's default) - within a few grey levels of the exact
    decode, never the default (the default stays byte-equal to turbo_decode)."""
    jpeg = _kinds()[kind]
    ref = _turbo(jpeg)
    h, w = ref.shape[:2]
    boxes, flips = FullDecode(fast_idct=True).params([(h, w)] * 2, [0, 1])
    fast, errors = decode_crops([jpeg] * 2, boxes, flips, (h, w), layout="HWC", dct_scale=1, fast_idct=True)
    exact, _ = decode_crops([jpeg] * 2, boxes, flips, (h, w), layout="HWC", dct_scale=1)
    assert errors == [] and torch.equal(exact[0], ref)
    d = (fast[0].float() - ref.float()).abs()
    # Measured on these (noisy, synthetic) images: mean 0.5-1.0, max 3-6 grey levels.
    assert float(d.mean()) < 2.0 and float(d.max()) <= 24, (float(d.mean()), float(d.max()))
    assert not torch.equal(fast[0], ref)  # the flag reaches libjpeg
    assert FullDecode().fast_idct is False and FullDecode(fast_idct=True).fast_idct is True


@pytest.mark.timeout(60)
def test_decode_threads_give_the_same_batch_and_errors():
    """The op spreads samples over torch.get_num_threads() threads: the output and the per-sample
    errors do not depend on how many."""
    good = [_kinds()[k] for k in ("baseline-420", "progressive-444-odd", "gray")]
    jpegs = [good[i % 3] for i in range(12)]
    sizes = [tuple(_turbo(j).shape[:2]) for j in jpegs]
    jpegs[5] = jpegs[5][: len(jpegs[5]) // 2]  # cut short: that sample's error, the rest decode
    boxes = torch.tensor([[0, 0, h, w] for h, w in sizes], dtype=torch.float64)
    flips = torch.tensor([i % 2 == 0 for i in range(12)])
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            out, errors = decode_crops(jpegs, boxes, flips, (24, 32))
            assert [b for b, _ in errors] == [5], errors
            outs.append(out)
    finally:
        torch.set_num_threads(before)
    keep = [b for b in range(12) if b != 5]
    for out in outs[1:]:
        assert torch.equal(out[keep], outs[0][keep])
