"""``GPULoader(..., decoder="mixed")`` (readers/gpu/mixed.py): a share of each batch cropped on the
CPU, the rest decoded whole by the GPU decoder. On the CPU here with libjpeg-turbo as the "GPU"
half (same protocol, every test runs without a GPU); ``gpu_check.sh`` runs the engine version (the
``cuda`` test)."""
from __future__ import annotations

import pytest
import torch

import packer
from packer.core.errors import RecordError, UsageError
from packer.sample import make_dataset
from readers.gpu import GPULoader, MixedDecoder, TrainPipeline, ValPipeline, get_decoder
from readers.gpu.mixed import takes
from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed")
    images, _ = make_dataset(d / "ds", 21, kind="classes", seed=8)
    loc = str(d / "s.lmdb")
    assert packer.build(images, None, loc, "lmdb", workers=1).ok
    return loc


def batches(store, pipeline, decoder, device="cpu", **kw):
    with GPULoader(store, pipeline, batch_size=8, device=device, decoder=decoder, threads=2, seed=4, shuffle=True,
                   **kw) as L:
        return [(b.indices, b.labels.cpu(), b.images.cpu()) for b in L]


def mixed(share, device="cpu", gpu="turbojpeg"):
    return MixedDecoder(device, threads=2, cpu_share=share, gpu=gpu)


def test_the_share_is_spread_evenly_over_a_batch():
    assert [takes(i, 1 / 3) for i in range(6)] == [False, False, True, False, False, True]
    for share in (0.0, 0.25, 0.3, 0.5, 1.0):
        for n in (1, 7, 256):
            assert sum(mixed(share).window_positions(n)) == int(n * share)


def test_a_share_outside_0_to_1_is_refused():
    for bad in (-0.1, 1.5):
        with pytest.raises(UsageError, match="cpu_share"):
            mixed(bad)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("share", [1 / 3, 0.5])
def test_each_image_equals_the_decoder_that_took_it(store, share):
    """Same samples, labels, boxes and flips for every decoder; an image cropped on the CPU is the
    cpu-crops loader's image bit for bit, one decoded whole the whole-decode loader's."""
    got = batches(store, TrainPipeline(48), mixed(share))
    crops = batches(store, TrainPipeline(48), "cpu-crops")
    whole = batches(store, TrainPipeline(48), "turbojpeg")
    assert [g[0] for g in got] == [c[0] for c in crops] == [w[0] for w in whole]
    seen = {True: 0, False: 0}
    for (_, yg, xg), (_, yc, xc), (_, yw, xw) in zip(got, crops, whole):
        assert torch.equal(yg, yc) and torch.equal(yg, yw) and xg.shape == (len(yg), 3, 48, 48)
        for i in range(len(yg)):
            on_cpu = takes(i, share)
            assert torch.equal(xg[i], xc[i] if on_cpu else xw[i]), (i, on_cpu)
            seen[on_cpu] += 1
    assert seen[True] and seen[False]
    assert not torch.equal(crops[0][2], whole[0][2])  # the two decoders' images do differ


@pytest.mark.timeout(180)
def test_share_0_is_the_gpu_decoder_and_1_the_cpu_crops(store):
    assert all(torch.equal(a[2], b[2]) for a, b in zip(batches(store, TrainPipeline(40), mixed(0.0)),
                                                        batches(store, TrainPipeline(40), "turbojpeg")))
    assert all(torch.equal(a[2], b[2]) for a, b in zip(batches(store, TrainPipeline(40), mixed(1.0)),
                                                        batches(store, TrainPipeline(40), "cpu-crops")))


@pytest.mark.timeout(120)
def test_other_pipelines_get_whole_images_from_the_gpu_decoder(store):
    dec = mixed(0.5)
    got = batches(store, ValPipeline(56, 48), dec)
    assert not dec.supports_roi
    want = batches(store, ValPipeline(56, 48), "turbojpeg")
    assert all(g[0] == w[0] and torch.equal(g[2], w[2]) for g, w in zip(got, want))


@pytest.mark.timeout(60)
def test_decode_gives_crops_and_whole_images_in_batch_order(store):
    from packer.stores import open_store

    with open_store(store) as r:
        recs = r.get_many([0, 1, 2, 3])
    dec = mixed(0.5)
    dec.bind_pipeline(TrainPipeline((30, 36)))
    datas, keys = [bytes(x.data) for x in recs], [x.key for x in recs]
    regions = [None, (0, 0, 20, 20), None, (3, 4, 25, 30)]
    imgs = dec.decode(datas, "cpu", keys, regions=regions)
    want_whole = get_decoder("turbojpeg", "cpu", 2).decode([datas[0], datas[2]], "cpu")
    crop = get_decoder("cpu-crops", "cpu", 2)
    crop.bind_pipeline(TrainPipeline((30, 36)))
    want_crops = crop.decode([datas[1], datas[3]], "cpu", regions=[regions[1], regions[3]])
    for got, want in zip(imgs, [want_whole[0], want_crops[0], want_whole[1], want_crops[1]]):
        assert torch.equal(got, want)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("bad", [6, 3])  # 6: decoded whole; 3: a CPU crop (every other for 0.5)
def test_a_record_that_does_not_decode_is_named_or_skipped(tmp_path, bad):
    """Bytes damaged after the build, in either half of the batch: a RecordError naming the
    record, or with on_error="skip" the batch without it."""
    import h5py

    from packer.stores import open_store

    images, _ = make_dataset(tmp_path / "ds", 12, kind="classes", seed=6)
    loc = str(tmp_path / "bad.h5")
    assert packer.build(images, None, loc, "hdf5", workers=1).ok
    with open_store(loc) as r:
        key = r.get(bad).key
    with h5py.File(loc, "r+") as f:  # an end-of-image marker in the middle of the scan
        start, end = int(f["jpeg_offsets"][bad]), int(f["jpeg_offsets"][bad + 1])
        mid = (start + end) // 2
        f["jpeg_bytes"][mid:mid + 2] = [0xFF, 0xD9]
    kw = dict(batch_size=4, device="cpu", threads=2, check=False)
    with GPULoader(loc, TrainPipeline(32), decoder=mixed(0.5), **kw) as L:
        with pytest.raises(RecordError, match="JPEG does not decode") as ei:
            list(L)
        assert key in str(ei.value)
    with GPULoader(loc, TrainPipeline(32), decoder=mixed(0.5), on_error="skip", **kw) as L:
        got = [(b.indices, b.images.shape) for b in L]
    assert sorted(i for idx, _ in got for i in idx) == [i for i in range(12) if i != bad] and L.skipped == 1
    assert [s for _, s in got] == [(4 - (bad // 4 == k), 3, 32, 32) for k in range(3)]


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_on_the_gpu_each_image_equals_the_engine_or_cpu_crops(store, require_cuda):  # noqa: F811
    """The engine beside the CPU crops, on a CUDA device: each crop equals the cpu-crops loader's
    for the same seed, each image decoded whole the engine loader's within a few levels (the
    engine's hardware and CUDA paths round differently, and which path an image takes depends on
    the batch it is in)."""
    pipe = TrainPipeline(48, dtype=torch.float32)
    dec = MixedDecoder("cuda", threads=2, cpu_share=0.5)
    assert dec.gpu.name == "engine"
    got = batches(store, pipe, dec, device="cuda")
    crops = batches(store, pipe, "cpu-crops", device="cuda")
    whole = batches(store, pipe, "engine", device="cuda")
    assert dec.gpu.stats["hardware"] + dec.gpu.stats["threads"] == 21 - sum(
        takes(i, 0.5) for b in got for i in range(len(b[0])))
    for (ig, yg, xg), (ic, _, xc), (iw, _, xw) in zip(got, crops, whole):
        assert ig == ic == iw
        for i in range(len(ig)):
            if takes(i, 0.5):
                assert torch.equal(xg[i], xc[i]), i
            else:  # normalized units: one grey level is 1/57 = 0.0175
                d = (xg[i] - xw[i]).abs()
                assert d.mean() < 0.02 and d.max() < 0.6, (i, float(d.mean()), float(d.max()))
