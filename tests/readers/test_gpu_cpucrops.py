"""``GPULoader(..., decoder="cpu-crops")`` (readers/gpu/cpucrops.py): the train pipeline's crops
decoded at its output size on the CPU, only flip + normalize left to the pipeline. Runs on the CPU
here; ``gpu_check.sh`` runs the same on the GPU (the ``cuda`` test)."""
from __future__ import annotations

import pytest
import torch

import packer
from packer.core.errors import RecordError
from packer.sample import make_dataset
from packer.stores import open_store
from readers.gpu import CpuCropDecoder, GPULoader, TrainPipeline, ValPipeline, get_decoder
from tests.corpus import class_store
from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return class_store(tmp_path_factory.mktemp("cpucrops"), 24, seed=5)


def batches(store, pipeline, decoder, device="cpu", **kw):
    with GPULoader(store, pipeline, batch_size=8, device=device, decoder=decoder, threads=2, seed=3, shuffle=True,
                   **kw) as L:
        return L.decoder, [(b.indices, b.labels.cpu(), b.images.cpu()) for b in L]


class Spy(CpuCropDecoder):
    """Records the sizes of what the decoder hands the pipeline."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.handed = []

    def collect(self, *a, **kw):
        out = super().collect(*a, **kw)
        self.handed.append(out.sizes.clone())
        return out


@pytest.mark.timeout(120)
def test_crops_decoded_on_the_cpu_match_the_full_decode_for_the_same_seed(store):
    """Same samples, labels, boxes and flips as libjpeg-turbo's full decode + the pipeline's
    resampling; the crops came out of the decoder at the output size (the pipeline then only flips
    and normalizes); pixels within a few levels (the crop is resampled from the decoded window)."""
    spy = Spy(2, "meta")  # a decoder object made for another device follows the loader's
    dec, got = batches(store, TrainPipeline(64), spy)
    assert spy.device == torch.device("cpu")
    assert dec is spy and spy.supports_roi and spy.size == (64, 64)
    assert spy.handed and all((s == torch.tensor([64, 64])).all() for s in spy.handed)
    _, want = batches(store, TrainPipeline(64), "turbojpeg")
    assert [g[0] for g in got] == [w[0] for w in want]
    for (_, yg, xg), (_, yw, xw) in zip(got, want):
        assert torch.equal(yg, yw) and xg.shape == xw.shape == (8, 3, 64, 64)
        d = (xg - xw).abs()  # normalized units: one grey level is 1/57 = 0.0175
        assert d.mean() < 0.02 and d.max() < 0.6, (float(d.mean()), float(d.max()))
    flips = [w[2] for w in want]
    assert not all(torch.equal(x, x.flip(-1)) for x in flips)  # flips were drawn (and matched above)


@pytest.mark.timeout(120)
def test_other_pipelines_get_whole_images_as_turbojpeg(store):
    dec, got = batches(store, ValPipeline(72, 64), "cpu-crops")
    assert dec.name == "cpu-crops" and not dec.supports_roi
    _, want = batches(store, ValPipeline(72, 64), "turbojpeg")
    for (ig, yg, xg), (iw, yw, xw) in zip(got, want):
        assert ig == iw and torch.equal(yg, yw) and torch.equal(xg, xw)


@pytest.mark.timeout(60)
def test_decode_takes_crop_regions_and_whole_images_in_one_batch(store):
    """The list path (images with an EXIF rotation to apply are decoded whole): a region gives its
    crop at the output size, None the whole image."""
    with open_store(store) as r:
        recs = r.get_many([0, 1, 2])
    dec = get_decoder("cpu-crops", "cpu", 2)
    dec.bind_pipeline(TrainPipeline((40, 48)))
    imgs = dec.decode([bytes(x.data) for x in recs], "cpu", [x.key for x in recs],
                      regions=[(0, 0, 30, 30), None, (5, 7, 20, 25)])
    whole = get_decoder("turbojpeg", "cpu", 2).decode([bytes(recs[1].data)], "cpu")[0]
    assert [tuple(t.shape) for t in imgs] == [(40, 48, 3), tuple(whole.shape), (40, 48, 3)]
    assert torch.equal(imgs[1], whole)


@pytest.mark.timeout(120)
def test_a_record_that_does_not_decode_is_named_or_skipped(tmp_path):
    """Bytes damaged after the build (read with check=False, so they reach the decoder): a
    RecordError naming the record, or with on_error="skip" the batch without it."""
    images, _ = make_dataset(tmp_path / "ds", 12, kind="classes", seed=6)
    loc = str(tmp_path / "bad.h5")
    assert packer.build(images, None, loc, "hdf5", workers=1).ok
    import h5py

    with open_store(loc) as r:
        key5 = r.get(5).key
    with h5py.File(loc, "r+") as f:  # an end-of-image marker in the middle of the scan
        start, end = int(f["jpeg_offsets"][5]), int(f["jpeg_offsets"][6])
        mid = (start + end) // 2
        f["jpeg_bytes"][mid:mid + 2] = [0xFF, 0xD9]
    with GPULoader(loc, TrainPipeline(32), batch_size=4, device="cpu", threads=2, decoder="cpu-crops",
                   check=False) as L:
        with pytest.raises(RecordError, match="JPEG does not decode") as ei:
            list(L)
        assert key5 in str(ei.value)
    with GPULoader(loc, TrainPipeline(32), batch_size=4, device="cpu", threads=2, decoder="cpu-crops",
                   check=False, on_error="skip") as L:
        got = [(b.indices, b.images.shape) for b in L]
    assert sorted(i for idx, _ in got for i in idx) == [i for i in range(12) if i != 5] and L.skipped == 1
    assert [s for _, s in got] == [(4, 3, 32, 32), (3, 3, 32, 32), (4, 3, 32, 32)]


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_cpu_crops_on_the_gpu_equal_the_cpu_loader(store, require_cuda):  # noqa: F811
    """On a CUDA device: the pinned batch, one copy and the pipeline on the GPU give the CPU
    loader's batches (the crops are the same bytes; the GPU kernels' flip + normalize match the
    CPU kernels')."""
    _, cpu = batches(store, TrainPipeline(64, dtype=torch.float32), "cpu-crops")
    _, gpu = batches(store, TrainPipeline(64, dtype=torch.float32), "cpu-crops", device="cuda")
    for (ic, yc, xc), (ig, yg, xg) in zip(cpu, gpu):
        assert ic == ig and torch.equal(yc, yg)
        assert (xc - xg).abs().max() < 1e-4


@pytest.mark.timeout(60)
def test_records_read_into_several_buffers_decode_as_from_one(store):
    """The loader reads a large batch in parallel parts, one buffer each: the crops are the same as
    from one buffer holding every record."""
    with open_store(store) as r:
        datas = [torch.frombuffer(bytearray(bytes(x.data)), dtype=torch.uint8) for x in r.get_many([0, 1, 2, 3])]
    n = [int(d.numel()) for d in datas]
    dec = get_decoder("cpu-crops", "cpu", 2)
    dec.bind_pipeline(TrainPipeline(32))
    regions = [(0, 0, 30, 40), (3, 4, 50, 20), (10, 10, 25, 25), (1, 2, 40, 40)]
    one = dec.decode_parts([torch.cat(datas)], [(0, sum(n[:i]), n[i]) for i in range(4)], None, regions)
    two = dec.decode_parts([torch.cat(datas[:3]), datas[3]],
                           [(0, 0, n[0]), (0, n[0], n[1]), (0, n[0] + n[1], n[2]), (1, 0, n[3])], None, regions)
    assert torch.equal(one.data, two.data) and torch.equal(one.sizes, two.sizes)
    assert tuple(one.sizes.unique(dim=0).flatten().tolist()) == (32, 32)
    listed = dec.decode(datas, "cpu", None, regions=regions)  # the list path, tensors as the loader gives them
    assert torch.equal(torch.stack(listed).flatten(), one.data)


@pytest.mark.timeout(60)
def test_the_same_crops_on_any_number_of_threads_and_two_batches_in_flight(store):
    """A batch is cut into tasks for the decode threads: the crops do not depend on how many
    threads there are, and a second batch submitted before the first is collected (the same
    records and boxes in reverse order) comes out as the first one reversed."""
    with open_store(store) as r:
        datas = [torch.frombuffer(bytearray(bytes(x.data)), dtype=torch.uint8) for x in r.get_many(range(12))]

    def parts(ds):
        n = [int(d.numel()) for d in ds]
        return [torch.cat(ds)], [(0, sum(n[:i]), n[i]) for i in range(len(ds))]

    g = torch.Generator().manual_seed(1)
    regions = [(float(torch.randint(0, 8, (1,), generator=g)), float(torch.randint(0, 8, (1,), generator=g)),
                20.0 + i, 30.0 - i) for i in range(12)]
    decoded = []
    for threads in (1, 3, 7):
        dec = get_decoder("cpu-crops", "cpu", threads)
        dec.bind_pipeline(TrainPipeline(24))
        first = dec.submit_parts(*parts(datas), None, regions)
        second = dec.submit_parts(*parts(datas[::-1]), None, regions[::-1])
        a, b = dec.collect(first), dec.collect(second)
        dec.close()
        a, b = a.data.view(12, 24, 24, 3), b.data.view(12, 24, 24, 3)
        assert torch.equal(b, a.flip(0)) and len(a.flatten(1).unique(dim=0)) == 12
        decoded.append(a)
    assert all(torch.equal(a, decoded[0]) for a in decoded[1:])


@pytest.mark.timeout(60)
def test_a_rectangular_output_size_gives_rectangular_crops(store):
    dec = get_decoder("cpu-crops", "cpu", 2)
    dec.bind_pipeline(TrainPipeline((24, 40)))
    assert dec.size == TrainPipeline((24, 40)).output_size == (24, 40)
    with open_store(store) as r:
        data = torch.frombuffer(bytearray(bytes(r.get_many([0])[0].data)), dtype=torch.uint8)
    out = dec.decode_parts([data], [(0, 0, int(data.numel()))], None, [(0.0, 0.0, 30.0, 30.0)])
    assert out.sizes.tolist() == [[24, 40]] and out.data.numel() == 24 * 40 * 3


class Order(CpuCropDecoder):
    """Records the order of the loader's submit_parts / collect calls."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def submit_parts(self, *a, **kw):
        self.calls.append("submit")
        return super().submit_parts(*a, **kw)

    def collect(self, *a, **kw):
        self.calls.append("collect")
        return super().collect(*a, **kw)


@pytest.mark.timeout(60)
def test_the_loader_submits_the_next_batch_before_collecting_one(store):
    spy = Order(2, "cpu")
    _, got = batches(store, TrainPipeline(32), spy)
    assert len(got) == 3 and spy.calls.count("submit") == spy.calls.count("collect") == 3
    assert spy.calls[:3] == ["submit", "submit", "collect"], spy.calls


@pytest.mark.timeout(60)
def test_a_box_outside_the_jpeg_is_clipped_to_it_with_a_warning(store, caplog):
    """A box drawn from a stored size that is not the JPEG's (a store edited by hand): the part of
    the box inside the image is cropped, as the native engine clips its windows, and a warning
    names the record; a box inside the image decodes as asked."""
    with open_store(store) as r:
        data = bytes(r.get(0).data)
    dec = get_decoder("cpu-crops", "cpu", 1)
    dec.bind_pipeline(TrainPipeline(32))
    H, W = get_decoder("turbojpeg", "cpu", 1).decode([data], "cpu")[0].shape[:2]
    with caplog.at_level("WARNING", logger="readers.gpu.cpucrops"):
        far, wide, negative = dec.decode([data] * 3, "cpu", ["a", "b", "c"],
                                         regions=[(H + 50, W + 50, 10, 10), (0, 0, 3 * H, 3 * W), (-10, -20, 40, 60)])
    inside = dec.decode([data] * 3, "cpu", None, regions=[(H - 1, W - 1, 1, 1), (0, 0, H, W), (0, 0, 30, 40)])
    assert torch.equal(far, inside[0]) and torch.equal(wide, inside[1]) and torch.equal(negative, inside[2])
    assert len([m for m in caplog.messages if "is not inside" in m and "stored size" in m]) == 3
    assert any(m.startswith("cpu-crops: a:") for m in caplog.messages)


@pytest.mark.timeout(120)
def test_the_loader_goes_on_where_a_stored_size_is_wrong(store, caplog):
    """Sizes that disagree with the JPEGs reach the crop draw (sample 3 recorded 4x too large):
    the loader's epoch completes, every batch at the output size, the record named in a warning."""
    from readers.gpu import RawReader

    with open_store(store) as r:
        key3 = r.get(3).key

    class WrongSizes(RawReader):
        def read(self, indices):
            raw = super().read(indices)
            for pos, i in enumerate(raw.indices):
                if i == 3:
                    raw.sizes[pos] *= 4
            return raw

    with caplog.at_level("WARNING", logger="readers.gpu.cpucrops"):
        with GPULoader(WrongSizes(store, threads=1), TrainPipeline(32), batch_size=8, device="cpu",
                       decoder="cpu-crops", threads=2, seed=1) as L:
            shapes = [tuple(b.images.shape) for b in L]
    assert shapes == [(8, 3, 32, 32)] * 3
    assert any(key3 in m and "is not inside" in m for m in caplog.messages)


@pytest.mark.timeout(60)
def test_gray_and_progressive_jpegs_decode_to_rgb_crops():
    """A grayscale and a progressive JPEG: three-channel crops at the output size, close to the
    whole decode resized (the crop decode starts at a reduced DCT scale: a few levels apart on noise)."""
    import cv2
    import numpy as np

    g = (np.random.default_rng(0).random((120, 160)) * 255).astype(np.uint8)
    gray = cv2.imencode(".jpg", g)[1].tobytes()
    prog = cv2.imencode(".jpg", np.dstack([g, 255 - g, g]), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    dec = get_decoder("cpu-crops", "cpu", 1)
    dec.bind_pipeline(TrainPipeline(32))
    whole = get_decoder("turbojpeg", "cpu", 1)
    crops = []
    for data in (gray, prog):
        crop = dec.decode([data], "cpu", None, regions=[(0, 0, 120, 160)])[0]
        ref = torch.nn.functional.interpolate(whole.decode([data], "cpu")[0].permute(2, 0, 1)[None].float(),
                                              size=(32, 32), mode="bilinear", antialias=True)[0].permute(1, 2, 0)
        assert crop.shape == (32, 32, 3) and (crop.float() - ref).abs().mean() < 4
        crops.append(crop.float())
    assert torch.equal(crops[0][..., 0], crops[0][..., 1]) and torch.equal(crops[0][..., 0], crops[0][..., 2])
    assert (crops[1][..., 0] - crops[1][..., 1]).abs().mean() > 8  # colour, not grey (0 for a grey image)
