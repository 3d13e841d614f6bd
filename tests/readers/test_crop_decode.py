"""gpu_ops.decode_jpeg_crops (C++, libjpeg-turbo) and CropDataset: against a full decode + crop +
resize reference, odd JPEG kinds, corrupt data, torchvision's crop distribution, DataLoader workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import packer
from packer.core.errors import RecordError, UsageError
from packer.core.integrity import turbo_decode
from packer.sample import make_dataset
from readers import CropDataset, DecodedBatch, RandomResizedCrop, ResizeCenterCrop, collate_decoded
from readers.crops import center_crop_box, decode_crops, op_available, reference_crop
from tests import REPO
from tests.corpus import cv_jpeg, jpeg_kinds, photo_of_size

pytestmark = pytest.mark.skipif(not op_available(), reason="gpu_ops._C without decode_jpeg_crops")


def _full(jpeg, channels=3):
    img = turbo_decode(jpeg, pixel_format="gray" if channels == 1 else "rgb")
    return torch.from_numpy(img).permute(2, 0, 1)


def _check_close(out, ref, max_diff=1, mean_diff=0.05):
    d = (out.int() - ref.int()).abs()
    assert d.max().item() <= max_diff and d.float().mean().item() <= mean_diff, \
        (d.max().item(), d.float().mean().item())


@pytest.mark.parametrize("kind", list(jpeg_kinds()))
def test_matches_full_decode_crop_resize(kind):
    """At DCT scale 1 the kernel equals decode + crop + F.interpolate(antialias) within rounding."""
    jpeg = jpeg_kinds()[kind]
    full = _full(jpeg)
    H, W = full.shape[-2:]
    rrc = RandomResizedCrop((24, 40), seed=3)
    boxes, flips = rrc.params([(H, W)] * 6, list(range(6)))
    boxes[0] = torch.tensor([0, 0, H, W], dtype=torch.float64)   # whole image (upscales 1x1)
    flips[0] = True
    out, errors = decode_crops([jpeg] * 6, boxes, flips, (24, 40), dct_scale=1)
    assert errors == []
    for b in range(6):
        _check_close(out[b], reference_crop(full, boxes[b], bool(flips[b]), (24, 40)))


@pytest.mark.torchvision
@pytest.mark.parametrize("kind", ["baseline-420", "444", "gray", "progressive"])
def test_validation_resize_center_crop(kind):
    jpeg = jpeg_kinds()[kind]
    full = _full(jpeg)
    vc = ResizeCenterCrop(80, 64, dct_scale=1)
    boxes, flips = vc.params([tuple(full.shape[-2:])], [0])
    out, errors = decode_crops([jpeg], boxes, flips, 64, clip_to_box=False, dct_scale=1)
    assert errors == []
    _check_close(out[0], reference_crop(full, boxes[0], False, 64, clip_to_box=False))
    # the reference itself is torchvision's Resize + CenterCrop
    from torchvision.transforms import v2

    tv = v2.Compose([v2.Resize(80, antialias=True), v2.CenterCrop(64)])(full.float()).round().clamp(0, 255)
    _check_close(out[0], tv.to(torch.uint8), max_diff=1, mean_diff=0.05)


def test_reduced_dct_scale_is_close_and_auto_picks_it():
    """Big crops to a small output decode at 1/2..1/8: a few levels off the full-size reference."""
    jpeg = cv_jpeg(photo_of_size(720, 1280, 7))
    full = _full(jpeg)
    boxes = torch.tensor([[0, 0, 720, 1280], [100, 200, 500, 640], [10, 20, 300, 300]], dtype=torch.float64)
    flips = torch.tensor([False, True, False])
    auto, errors = decode_crops([jpeg] * 3, boxes, flips, 64)
    assert errors == []
    for s in (0.5, 0.25, 0.125):
        forced, _ = decode_crops([jpeg] * 3, boxes, flips, 64, dct_scale=s)
        for b in range(3):
            ref = reference_crop(full, boxes[b], bool(flips[b]), 64)
            d = (forced[b].int() - ref.int()).abs().float()
            assert d.mean().item() < 3.0, (s, b, d.mean().item())
    # auto: box 0 (720 rows -> 64) may use 1/8 (90 >= 64): identical to forcing 1/8 there
    eighth, _ = decode_crops([jpeg], boxes[:1], flips[:1], 64, dct_scale=0.125)
    assert torch.equal(auto[0], eighth[0])


def test_layouts_channels_batching_and_out_buffer():
    kinds = jpeg_kinds()
    jpegs = [kinds["baseline-420"], kinds["gray"], kinds["444"]]
    boxes = torch.tensor([[5, 7, 100, 120], [0, 0, 203, 301], [50, 60, 30, 31]], dtype=torch.float64)
    flips = torch.tensor([True, False, True])
    chw, _ = decode_crops(jpegs, boxes, flips, (32, 48))
    hwc, _ = decode_crops(jpegs, boxes, flips, (32, 48), layout="HWC")
    assert chw.shape == (3, 3, 32, 48) and hwc.shape == (3, 32, 48, 3)
    assert torch.equal(chw.permute(0, 2, 3, 1), hwc)
    for b in range(3):  # batched equals one at a time
        one, _ = decode_crops([jpegs[b]], boxes[b:b + 1], flips[b:b + 1], (32, 48))
        assert torch.equal(one[0], chw[b])
    gray, _ = decode_crops(jpegs, boxes, flips, (32, 48), channels=1)
    assert gray.shape == (3, 1, 32, 48)
    # a strided destination (e.g. a slice of a bigger pinned buffer) is written in place
    big = torch.zeros((3, 3, 40, 48), dtype=torch.uint8)
    decode_crops(jpegs, boxes, flips, (32, 48), out=big[:, :, 4:36])
    assert torch.equal(big[:, :, 4:36], chw) and big[:, :, :4].sum() == 0
    empty, errors = decode_crops([], torch.zeros((0, 4), dtype=torch.float64), torch.zeros(0, dtype=torch.bool), 8)
    assert empty.shape == (0, 3, 8, 8) and errors == []


@pytest.mark.timeout(60)
def test_corrupt_data_is_an_error_per_sample_never_a_crash():
    good = cv_jpeg(photo_of_size(48, 64, 8))
    bad = {
        "truncated": good[: len(good) // 2],
        "no-eoi": good[:-2],
        "empty": b"",
        "not-jpeg": b"hello world, not a jpeg",
        "header-only": good[:200],
        "cmyk": None,
    }
    from tests.corpus import cmyk_jpeg

    bad["cmyk"] = cmyk_jpeg()[0]
    names = list(bad)
    jpegs = [good] + [bad[n] for n in names] + [good]
    n = len(jpegs)
    # whole-image boxes: the decode reaches the damage (a crop decodes only its own rows)
    boxes = torch.tensor([[0, 0, 48, 64]] * n, dtype=torch.float64)
    out, errors = decode_crops(jpegs, boxes, torch.zeros(n, dtype=torch.bool), 16)
    failed = dict(errors)
    assert 0 not in failed and n - 1 not in failed
    for i, name in enumerate(names, start=1):
        assert i in failed and failed[i], (name, failed)
    assert "Premature end" in failed[1] or "libjpeg" in failed[1]
    ok, _ = decode_crops([good], boxes[:1], torch.zeros(1, dtype=torch.bool), 16)
    assert torch.equal(out[0], ok[0]) and torch.equal(out[-1], ok[0])
    # A crop above a truncation point decodes from intact data only (rows below it are never
    # decoded; the record checksum covers them): the same pixels as from the intact file.
    top = torch.tensor([[0, 0, 16, 16]], dtype=torch.float64)
    tall = cv_jpeg(photo_of_size(512, 64, 9))
    a, err_a = decode_crops([tall], top, torch.zeros(1, dtype=torch.bool), 8)
    b, err_b = decode_crops([tall[: len(tall) * 3 // 4]], top, torch.zeros(1, dtype=torch.bool), 8)
    assert err_a == err_b == [] and torch.equal(a, b)
    # a box outside the image is refused, naming the box
    _, errors = decode_crops([good], torch.tensor([[0, 0, 999, 10]], dtype=torch.float64),
                             torch.zeros(1, dtype=torch.bool), 8)
    assert "not inside" in errors[0][1]


def test_records_as_spans_anywhere_in_data():
    """offsets [B, 2]: records at any place and order in one buffer (a store file's map) decode
    like the same records packed back to back; spans outside the buffer are refused."""
    jpegs = [cv_jpeg(photo_of_size(40 + 8 * i, 56, 20 + i)) for i in range(4)]
    order = [2, 0, 3, 2, 1]                             # out of order, one record twice
    gap = b"\x00garbage between records\xff\xd8"
    blob, starts = bytearray(gap), {}
    for i, j in enumerate(jpegs):
        starts[i] = len(blob)
        blob += j + gap
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    spans = torch.tensor([[starts[i], starts[i] + len(jpegs[i])] for i in order], dtype=torch.int64)
    boxes = torch.tensor([[0, 0, 40, 56]] * len(order), dtype=torch.float64)
    flips = torch.tensor([False, True, False, False, True])
    got, errors = decode_crops((data, spans), boxes, flips, 24)
    want, want_errors = decode_crops([jpegs[i] for i in order], boxes, flips, 24)
    assert errors == want_errors == [] and torch.equal(got, want)
    # full-size HWC output: libjpeg writes the rows straight into the batch, from the spans
    full = torch.tensor([[0, 0, 40, 56]], dtype=torch.float64)
    one = torch.tensor([[starts[0], starts[0] + len(jpegs[0])]], dtype=torch.int64)
    got, _ = decode_crops((data, one), full, torch.zeros(1, dtype=torch.bool), (40, 56), layout="HWC")
    assert torch.equal(got[0], _full(jpegs[0]).permute(1, 2, 0))
    # a span that ends where a record's bytes do not (cut short) is that sample's decode error
    cut = torch.tensor([[starts[1], starts[1] + len(jpegs[1]) // 2]], dtype=torch.int64)
    _, errors = decode_crops((data, cut), full, torch.zeros(1, dtype=torch.bool), 8)
    assert errors and errors[0][0] == 0
    for bad in ([[0, data.numel() + 1]], [[10, 5]], [[-1, 4]]):
        with pytest.raises(RuntimeError, match="record 0 spans bytes"):
            decode_crops((data, torch.tensor(bad, dtype=torch.int64)), full, torch.zeros(1, dtype=torch.bool), 8)
    with pytest.raises(RuntimeError, match=r"offsets as contiguous int64 of shape \[2\] or \[1, 2\]"):
        torch.ops.gpu_ops.decode_jpeg_crops(data, torch.zeros((1, 3), dtype=torch.int64), full,
                                            torch.zeros(1, dtype=torch.bool),
                                            torch.empty((1, 3, 8, 8), dtype=torch.uint8),
                                            torch.zeros((1, 64), dtype=torch.uint8), False, 0, True, True,
                                            False, 1)


@pytest.mark.torchvision
def test_boxes_follow_torchvision_get_params():
    """seed=None draws from torch's global generator exactly like torchvision."""
    from torchvision import transforms as T

    sizes = [(375, 500), (1080, 1920), (50, 900), (900, 50), (7, 7)]
    torch.manual_seed(123)
    ours = RandomResizedCrop(224, flip_p=0.0).params(sizes, range(len(sizes)))[0]
    torch.manual_seed(123)
    theirs = [T.RandomResizedCrop.get_params(torch.empty(3, h, w), [0.08, 1.0], [3 / 4, 4 / 3])
              for h, w in sizes]
    assert ours.tolist() == [list(map(float, t)) for t in theirs]


def test_seeded_boxes_replay_per_sample_and_epoch():
    rrc = RandomResizedCrop(64, seed=9)
    a = rrc.params([(300, 400)] * 4, [0, 1, 2, 3])
    b = rrc.params([(300, 400)] * 2, [3, 1])
    assert torch.equal(a[0][3], b[0][0]) and torch.equal(a[0][1], b[0][1])
    assert torch.equal(a[1][[3, 1]], b[1])
    rrc.set_epoch(1)
    c = rrc.params([(300, 400)] * 4, [0, 1, 2, 3])
    assert not torch.equal(a[0], c[0])
    # the distribution: crop areas cover the scale range
    many = RandomResizedCrop(64, seed=1).params([(1000, 1000)] * 400, range(400))[0]
    frac = (many[:, 2] * many[:, 3] / 1e6).numpy()
    assert frac.min() < 0.15 and frac.max() > 0.9 and 0.35 < frac.mean() < 0.7


def test_center_crop_box_matches_torchvision_sizes():
    box, (rh, rw) = center_crop_box(375, 500, 256, (224, 224))
    assert (rh, rw) == (256, 341)
    assert box[2] == pytest.approx(224 * 375 / 256) and box[3] == pytest.approx(224 * 500 / 341)
    with pytest.raises(UsageError):
        center_crop_box(375, 500, 100, (224, 224))


# ---------------------------------------------------------------------------------------------
# CropDataset
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def class_store(tmp_path_factory):
    images, _ = make_dataset(tmp_path_factory.mktemp("cd"), 18, kind="classes", seed=2)
    out = tmp_path_factory.mktemp("cds") / "s.lmdb"
    packer.build(images, None, out, workers=1)
    return out


def _reference_batch(ds, indices):
    """Full decode + torch crop/resize of what CropDataset decodes, for the same boxes."""
    reader = ds.reader
    recs = reader.get_many(indices)
    boxes, flips = ds.crop.params([(r.height, r.width) for r in recs], indices)
    return [reference_crop(_full(bytes(r.data)), boxes[b], bool(flips[b]), ds.crop.size)
            for b, r in enumerate(recs)], [r.label for r in recs]


def test_crop_dataset_batch_equals_reference(class_store):
    ds = CropDataset(class_store, RandomResizedCrop(48, seed=5, dct_scale=1))
    batch = ds.__getitems__([0, 4, 17, 4])
    assert isinstance(batch, DecodedBatch) and len(batch) == 4
    images, labels = collate_decoded(batch)
    assert images.shape == (4, 3, 48, 48) and labels.dtype == torch.int64
    refs, ref_labels = _reference_batch(ds, [0, 4, 17, 4])
    for b in range(4):
        _check_close(images[b], refs[b])
    assert labels.tolist() == ref_labels
    # default_collate still works on the batch (it is a list of (image, label) samples)
    from torch.utils.data import default_collate

    x, y = default_collate(batch)
    assert torch.equal(x, images) and torch.equal(y, labels)
    img, label = ds[4]
    assert torch.equal(img, images[1]) and label == labels[1]


def test_crop_dataset_validation_and_hwc(class_store):
    ds = CropDataset(class_store, ResizeCenterCrop(40, 32), layout="HWC")
    images, labels = ds.load_batch([1, 2, 3])
    assert images.shape == (3, 32, 32, 3)
    again, _ = ds.load_batch([1, 2, 3])
    assert torch.equal(images, again)


def _loader_batches(ds, workers, ctx):
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=collate_decoded,
                                         multiprocessing_context=ctx if workers else None)
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_crop_dataset_in_dataloader_workers(class_store, ctx):
    ds = CropDataset(class_store, RandomResizedCrop(32, seed=2))
    main = _loader_batches(ds, 0, None)
    workers = _loader_batches(ds, 2, ctx)
    assert len(main) == len(workers) == 4
    for (x0, y0), (x1, y1) in zip(main, workers):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)


def test_crop_dataset_damaged_record_names_key(tmp_path):
    images, _ = make_dataset(tmp_path / "src", 6, kind="classes", seed=4)
    store = tmp_path / "s.lmdb"
    packer.build(images, None, store, workers=1)
    import lmdb

    env = lmdb.open(str(store), max_dbs=8, subdir=True)
    db = env.open_db(b"data")
    with env.begin(write=True, db=db) as txn:
        key = (2).to_bytes(8, "big")
        data = bytes(txn.get(key))
        txn.put(key, data[: len(data) // 2])
    env.close()
    ds = CropDataset(store, RandomResizedCrop(16, seed=0))
    with pytest.raises(RecordError, match="checksum"):
        ds.load_batch([0, 1, 2])
    # without the checksum check the truncated JPEG itself is caught by the strict decode
    unchecked = CropDataset(store, RandomResizedCrop(16, seed=0), check=False)
    key = unchecked.reader.get(2).key
    with pytest.raises(RecordError, match="Premature end|does not decode") as info:
        unchecked.load_batch([0, 1, 2])
    assert key in str(info.value)
    skipping = CropDataset(store, RandomResizedCrop(16, seed=0), on_error="skip")
    images_, labels = skipping.load_batch([0, 1, 2, 3])
    assert images_.shape[0] == 3 and skipping.skipped == 1


def test_crop_dataset_reads_known_records_in_place_and_still_checks_them(tmp_path, record_path):
    """After a record's first read its bytes are decoded straight from the map of data.mdb (no
    copy): the same batches as the first (copied) read; bytes damaged in the file after that are
    still caught by the checksum, naming the key, and on_error="skip" keeps the other records."""
    images, _ = make_dataset(tmp_path / "src", 8, kind="classes", seed=6)
    store = tmp_path / "s.lmdb"
    packer.build(images, None, store, workers=1)
    idx = [5, 0, 7, 5, 2]
    ds = CropDataset(store, RandomResizedCrop(24, seed=3), on_error="skip")
    facts = ds._facts()
    assert facts.read_in_place(idx, True, ds.location) is None    # nothing known yet: copied read
    first_images, first_labels = ds.load_batch(idx)
    data, spans = facts.read_in_place(idx, True, ds.location)     # known now: spans in the map
    assert spans.shape == (5, 2) and data.numel() == (store / "data.mdb").stat().st_size
    prepared = ds.prepare_batch(idx)
    assert prepared.packed[1].shape == (5, 2)                     # this batch decodes in place
    again_images, again_labels = collate_decoded(ds.decode_batch(prepared))
    assert torch.equal(again_images, first_images) and torch.equal(again_labels, first_labels)
    # damage record 7's bytes in the file, in place (the map sees the page cache)
    jpeg = bytes(data[spans[2, 0]:spans[2, 1]].numpy())
    at = int(spans[2, 0]) + len(jpeg) // 2
    with open(store / "data.mdb", "r+b") as f:
        f.seek(at)
        f.write(bytes([jpeg[len(jpeg) // 2] ^ 0x5A]))
    key = ds.reader.get(7).key
    strict = CropDataset(store, RandomResizedCrop(24, seed=3))
    strict._facts_obj, strict._facts_pid = facts, ds._facts_pid   # the same kept facts: in place
    with pytest.raises(RecordError, match="checksum mismatch") as info:
        strict.load_batch(idx)
    assert key in str(info.value)
    assert record_path[1][-1] == (record_path[0] == "native")     # checked in C++ or in Python
    kept_images, kept_labels = ds.load_batch(idx)                 # skip: the damaged one is left out
    assert ds.skipped == 1 and kept_images.shape[0] == 4
    assert torch.equal(kept_images, first_images[[0, 1, 3, 4]])
    assert kept_labels.tolist() == first_labels[[0, 1, 3, 4]].tolist()


def test_crop_dataset_exif_records_take_the_exact_path(tmp_path):
    from tests.corpus import with_exif

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    img = photo_of_size(60, 90, 11)
    (src / "rot.jpg").write_bytes(with_exif(cv_jpeg(img), 6))
    (src / "plain.jpg").write_bytes(cv_jpeg(img))
    store = tmp_path / "s.lmdb"
    packer.build(tmp_path / "src", None, store, workers=1, exif="record")
    ds = CropDataset(store, RandomResizedCrop((20, 30), seed=1, flip_p=0.0))
    idx = ds.index_of("a/rot.jpg")
    images, _ = ds.load_batch([idx, ds.index_of("a/plain.jpg")])
    rotated = torch.from_numpy(np.ascontiguousarray(np.rot90(turbo_decode(cv_jpeg(img)), -1))).permute(2, 0, 1)
    box, _ = ds.crop.params([(90, 60)], [idx])
    _check_close(images[0], reference_crop(rotated, box[0], False, (20, 30)))


def test_crop_dataset_refuses_box_stores(tmp_path):
    images, labels = make_dataset(tmp_path / "src", 4, kind="boxes", seed=1)
    store = tmp_path / "b.lmdb"
    packer.build(images, labels, store, workers=1)
    with pytest.raises(UsageError, match="boxes"):
        CropDataset(store, RandomResizedCrop(16))
    with pytest.raises(UsageError, match="crop must be"):
        CropDataset(store, 224)


def test_pinned_output_when_cuda_is_present(class_store):
    import os

    if not torch.cuda.is_available():
        if os.environ.get("PACKER_REQUIRE_CUDA", "") == "1":
            pytest.fail("PACKER_REQUIRE_CUDA=1 but torch.cuda.is_available() is False")
        pytest.skip("pinned memory needs CUDA")
    ds = CropDataset(class_store, RandomResizedCrop(32, seed=0), pin_memory=True)
    images, _ = ds.load_batch([0, 1])
    assert images.is_pinned()


@pytest.mark.timeout(60)
def test_decode_releases_the_gil():
    """Python threads run while a batch decodes (the dispatcher drops the GIL around the op)."""
    import threading
    import time

    jpeg = cv_jpeg(photo_of_size(512, 512, 12))
    boxes = torch.tensor([[0, 0, 512, 512]] * 24, dtype=torch.float64)
    span = {}

    def work():
        t = time.perf_counter()
        decode_crops([jpeg] * 24, boxes, torch.zeros(24, dtype=torch.bool), 500, dct_scale=1)
        span["op"] = (t, time.perf_counter())

    th = threading.Thread(target=work)
    stamps = []
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
        sum(range(200))
    th.join()
    a, b = span["op"]
    assert sum(a < s < b for s in stamps) > 50


def _bench_photos():

    root = REPO / ".bench" / "photos"
    return sorted(p for p in root.rglob("*.jpg"))[:4] if root.is_dir() else []


@pytest.mark.timeout(120)
@pytest.mark.skipif(not _bench_photos(), reason="no real photographs (run scripts/get_bench_images.sh)")
def test_real_photographs_match_reference():
    """Real photographs (Debian wallpapers, scikit-image samples) against the full-decode reference."""
    for path in _bench_photos():
        jpeg = path.read_bytes()
        try:
            full = _full(jpeg)
        except ValueError:
            continue  # e.g. a CMYK photo: the build converts those, the kernel never sees them
        H, W = full.shape[-2:]
        boxes, flips = RandomResizedCrop(224, seed=1).params([(H, W)] * 3, [0, 1, 2])
        out, errors = decode_crops([jpeg] * 3, boxes, flips, 224, dct_scale=1)
        assert errors == []
        for b in range(3):
            _check_close(out[b], reference_crop(full, boxes[b], bool(flips[b]), 224))
        auto, _ = decode_crops([jpeg] * 3, boxes, flips, 224)
        for b in range(3):
            d = (auto[b].int() - out[b].int()).abs().float().mean().item()
            assert d < 3.0, (path.name, b, d)
