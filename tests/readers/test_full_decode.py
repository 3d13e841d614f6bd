"""readers.FullDecode: whole-batch full-size decode through gpu_ops.decode_jpeg_crops - byte-equal
to a plain libjpeg-turbo decode, errors naming the key, DataLoader workers, mixed sizes refused."""
from __future__ import annotations

import pytest
import torch

import packer
from packer.core.errors import RecordError, UsageError
from packer.core.integrity import turbo_decode
from packer.sample import make_dataset
from readers import CropDataset, FullDecode, collate_decoded
from readers.crops import decode_crops, op_available
from tests.corpus import cut_lmdb_record, cv_jpeg, jpeg_kinds, photo_of_size, same_size_lmdb

pytestmark = pytest.mark.skipif(not op_available(), reason="gpu_ops._C without decode_jpeg_crops")


def _turbo(jpeg, channels=3):
    return torch.from_numpy(turbo_decode(jpeg, pixel_format="gray" if channels == 1 else "rgb"))  # HWC


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(jpeg_kinds()))
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_full_size_is_byte_equal_to_turbo_decode(kind, layout):
    """Whole box, output = image size: the direct-row (HWC) and copy (CHW) paths, no resample."""
    jpeg = jpeg_kinds()[kind]
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
    jpeg = jpeg_kinds()[kind]
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
    jpeg = cv_jpeg(photo_of_size(64, 48, 9))
    h, w = _turbo(jpeg).shape[:2]
    bad = [jpeg[: len(jpeg) // 2], jpeg[:300] + bytes(200) + jpeg[500:], b"", jpeg]
    boxes = torch.tensor([[0, 0, h, w]] * 4, dtype=torch.float64)
    out, errors = decode_crops(bad, boxes, torch.zeros(4, dtype=torch.bool), (h, w), layout="HWC", dct_scale=1)
    assert [b for b, _ in errors] == [0, 1, 2]
    assert torch.equal(out[3], _turbo(jpeg))


@pytest.fixture(scope="module")
def same_size_store(tmp_path_factory):
    return same_size_lmdb(tmp_path_factory, "fd", 12, (97, 131), seed=3)


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
    packer.build(images, None, store, workers=1)
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
    packer.build(images, None, store, workers=1)
    cut_lmdb_record(store, 2)
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
    img = photo_of_size(60, 90, 11)
    (src / "rot.jpg").write_bytes(with_exif(cv_jpeg(img), 6))
    (src / "plain.jpg").write_bytes(cv_jpeg(img))
    (src / "tall.jpg").write_bytes(cv_jpeg(photo_of_size(90, 60, 12)))
    store = tmp_path / "s.lmdb"
    packer.build(tmp_path / "src", None, store, workers=1, exif="record")
    ds = CropDataset(store, FullDecode(), layout="HWC")
    rot, tall = ds.index_of("a/rot.jpg"), ds.index_of("a/tall.jpg")
    images, _ = ds.load_batch([rot, tall])
    rotated = torch.from_numpy(np.ascontiguousarray(np.rot90(turbo_decode(cv_jpeg(img)), -1)))
    assert images.shape == (2, 90, 60, 3)
    assert torch.equal(images[0], rotated)
    assert torch.equal(images[1], _turbo(cv_jpeg(photo_of_size(90, 60, 12))))
    with pytest.raises(UsageError, match="one image size per batch"):
        ds.load_batch([rot, ds.index_of("a/plain.jpg")])


# -- dct="fast" (libjpeg's IFAST IDCT, opt-in) --------------------------------------------------
# Measured (libjpeg-turbo 2.1.5): on these generated images (q90/q92) max |fast - exact| 6 levels,
# mean 1.01-1.05 (gray 3 / 0.49); on the benchmark's real photos (q90, 500x375 and 1920x1080)
# max 8, mean 0.98 per image on average, 1.15 at worst. The bounds leave room for other
# libjpeg-turbo builds, not for a wrong decode (a misplaced block or row is off by tens of levels).
FAST_MAX_DIFF, FAST_MEAN_DIFF = 12, 1.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(jpeg_kinds()))
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_fast_dct_is_close_to_exact_and_default_stays_exact(kind, layout):
    jpeg = jpeg_kinds()[kind]
    ref = _turbo(jpeg)
    h, w = ref.shape[:2]
    boxes, flips = FullDecode().params([(h, w)] * 2, [0, 1])
    exact, errors = decode_crops([jpeg] * 2, boxes, flips, (h, w), layout=layout, dct_scale=1)
    assert errors == []
    fast, errors = decode_crops([jpeg] * 2, boxes, flips, (h, w), layout=layout, dct_scale=1, dct="fast")
    assert errors == []
    if layout == "CHW":
        exact, fast = exact.permute(0, 2, 3, 1), fast.permute(0, 2, 3, 1)
    assert torch.equal(exact[0], ref) and torch.equal(exact[1], ref)  # the default is untouched
    assert torch.equal(fast[0], fast[1])
    d = (fast[0].int() - ref.int()).abs()
    assert d.max().item() <= FAST_MAX_DIFF and d.float().mean().item() <= FAST_MEAN_DIFF, \
        (kind, d.max().item(), d.float().mean().item())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["baseline-420", "progressive", "444", "gray", "restart-markers"])
def test_fast_dct_equals_turbojpeg_fastdct(kind):
    """The same trade as FFCV's decoder: TurboJPEG with TJFLAG_FASTDCT gives these exact pixels."""
    turbojpeg = pytest.importorskip("turbojpeg")
    jpeg = jpeg_kinds()[kind]
    ref = torch.from_numpy(turbojpeg.TurboJPEG().decode(jpeg, pixel_format=turbojpeg.TJPF_RGB,
                                                        flags=turbojpeg.TJFLAG_FASTDCT))
    h, w = ref.shape[:2]
    boxes, flips = FullDecode().params([(h, w)], [0])
    fast, errors = decode_crops([jpeg], boxes, flips, (h, w), layout="HWC", dct_scale=1, dct="fast")
    assert errors == [] and torch.equal(fast[0], ref)


@pytest.mark.timeout(60)
def test_fast_dct_damaged_data_is_a_per_sample_error():
    jpeg = cv_jpeg(photo_of_size(64, 48, 9))
    h, w = _turbo(jpeg).shape[:2]
    bad = [jpeg[: len(jpeg) // 2], jpeg[:300] + bytes(200) + jpeg[500:], b"", b"not a jpeg" * 10, jpeg]
    boxes = torch.tensor([[0, 0, h, w]] * 5, dtype=torch.float64)
    out, errors = decode_crops(bad, boxes, torch.zeros(5, dtype=torch.bool), (h, w), layout="HWC",
                               dct_scale=1, dct="fast")
    assert [b for b, _ in errors] == [0, 1, 2, 3]
    assert all(msg for _, msg in errors)
    d = (out[4].int() - _turbo(jpeg).int()).abs()
    assert d.max().item() <= FAST_MAX_DIFF


@pytest.mark.timeout(60)
def test_dct_is_validated():
    from readers import RandomResizedCrop, ResizeCenterCrop

    for make in (lambda: FullDecode(dct="slow"), lambda: RandomResizedCrop(8, dct="ifast"),
                 lambda: ResizeCenterCrop(8, 8, dct=None)):
        with pytest.raises(UsageError, match="dct must be 'exact'"):
            make()
    with pytest.raises(UsageError, match="dct must be"):
        decode_crops([b"x"], torch.zeros((1, 4), dtype=torch.float64), torch.zeros(1, dtype=torch.bool), (4, 4),
                     dct="FAST")
    assert repr(FullDecode(dct="fast")) == "FullDecode(dct='fast')" and repr(FullDecode()) == "FullDecode()"


@pytest.mark.timeout(60)
def test_crop_dataset_fast_dct_batch_and_truncated_record_names_key(tmp_path, same_size_store):
    ds = CropDataset(same_size_store, FullDecode(dct="fast"), layout="HWC")
    images, _ = ds.load_batch([0, 5, 11])
    d = (images.int() - _expected(ds, [0, 5, 11], "HWC").int()).abs()
    assert d.max().item() <= FAST_MAX_DIFF and d.float().mean().item() <= FAST_MEAN_DIFF
    images_, _ = make_dataset(tmp_path / "src", 4, kind="classes", sizes=((64, 80),), seed=4)
    store = tmp_path / "t.lmdb"
    packer.build(images_, None, store, workers=1)
    import lmdb

    env = lmdb.open(str(store), max_dbs=8, subdir=True)
    with env.begin(write=True, db=env.open_db(b"data")) as txn:
        k = (1).to_bytes(8, "big")
        txn.put(k, bytes(txn.get(k))[:-200])  # truncated: no EOI, part of the scan missing
    env.close()
    unchecked = CropDataset(store, FullDecode(dct="fast"), layout="HWC", check=False)
    with pytest.raises(RecordError, match="does not decode") as info:
        unchecked.load_batch([0, 1, 2])
    assert unchecked.reader.get(1).key in str(info.value)


# -- threads -------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("dct", ["exact", "fast"])
def test_threads_give_the_same_batch(dct):
    kinds = jpeg_kinds()
    jpegs = [kinds[k] for k in ("baseline-420", "progressive", "444", "restart-markers")] * 5
    h, w = _turbo(jpegs[0]).shape[:2]
    boxes, flips = FullDecode().params([(h, w)] * len(jpegs), list(range(len(jpegs))))
    before = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out, errors = decode_crops(jpegs, boxes, flips, (h, w), layout="HWC", dct_scale=1, dct=dct)
            assert errors == []
            outs.append(out)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


# -- output buffer reuse (OutputPool) -----------------------------------------------------------
@pytest.mark.timeout(60)
def test_reused_buffers_never_overwrite_a_batch_still_held(same_size_store):
    ds = CropDataset(same_size_store, FullDecode(), layout="HWC")
    want = {i: _expected(ds, [i], "HWC")[0] for i in range(12)}
    held = []
    for step in range(8):  # hold every batch: nothing may be reused
        idx = [(step + j) % 12 for j in range(3)]
        images, _ = ds.load_batch(idx)
        held.append((idx, images))
    for idx, images in held:
        assert torch.equal(images, torch.stack([want[i] for i in idx]))
    assert ds.output_pool.reused == 0
    # Derived holders keep a buffer too: a slice, a numpy array, a DLPack capsule.
    a, _ = ds.load_batch([0, 1])
    part = a[1]
    arr = ds.load_batch([2, 3])[0].numpy()
    capsule = torch.utils.dlpack.to_dlpack(ds.load_batch([4, 5])[0])
    del a
    for _ in range(6):
        ds.load_batch([6, 7])
    assert torch.equal(part, want[1])
    assert torch.equal(torch.from_numpy(arr), torch.stack([want[2], want[3]]))
    assert torch.equal(torch.utils.dlpack.from_dlpack(capsule), torch.stack([want[4], want[5]]))


@pytest.mark.timeout(60)
def test_released_buffers_are_reused_and_loop_results_stay_right(same_size_store):
    ds = CropDataset(same_size_store, FullDecode(), layout="HWC")
    want = _expected(ds, range(12), "HWC")
    loader = torch.utils.data.DataLoader(ds, batch_size=5, collate_fn=collate_decoded)
    for _ in range(3):  # the usual loop: the previous batch is still held while the next decodes
        got = []
        for images, _ in loader:
            got.append(images.clone())
        assert torch.equal(torch.cat(got), want)
    assert ds.output_pool.reused > 0
    off = CropDataset(same_size_store, FullDecode(), layout="HWC", reuse_output=False)
    assert off.output_pool is None
    assert torch.equal(off.load_batch([3, 4])[0], want[3:5])


@pytest.mark.timeout(60)
def test_a_buffer_sent_to_shared_memory_is_never_reused(same_size_store):
    ds = CropDataset(same_size_store, FullDecode(), layout="HWC")
    images, _ = ds.load_batch([0, 1])
    images.share_memory_()  # what a multiprocessing queue does to a tensor it sends
    keep = images.clone()
    del images
    for _ in range(4):
        ds.load_batch([5, 6])
    assert all(not b.untyped_storage().is_shared() for b, _ in ds.output_pool._bufs)
    assert torch.equal(keep, _expected(ds, [0, 1], "HWC"))


@pytest.mark.timeout(60)
def test_concurrent_threads_get_their_own_buffers(same_size_store):
    from concurrent.futures import ThreadPoolExecutor

    ds = CropDataset(same_size_store, FullDecode(), layout="HWC")
    want = _expected(ds, range(12), "HWC")
    jobs = [[(s + j) % 12 for j in range(4)] for s in range(24)]
    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda idx: (idx, ds.load_batch(idx)[0]), jobs))
    for idx, images in results:
        assert torch.equal(images, want[idx])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_fast_dct_and_pool_in_dataloader_workers(same_size_store, ctx):
    ds = CropDataset(same_size_store, FullDecode(dct="fast"), layout="HWC")
    ds.load_batch([0, 1])  # the parent's pool has a buffer before the fork
    main = _loader_batches(ds, 0, None)
    workers = _loader_batches(ds, 2, ctx)
    for (x0, y0), (x1, y1) in zip(main, workers):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_decoded,
                                         multiprocessing_context=ctx)
    held = [x for x, _ in loader]  # batches from workers, all held at once
    assert torch.equal(torch.cat(held), torch.cat([x for x, _ in main]))
