"""readers.gpu: raw reads, decoders, train / val / detection pipelines, GPULoader (prefetch, samplers,
errors, shutdown). Every pipeline runs here on the CPU kernels and the reference; the ``cuda``-marked
tests run the same on the GPU (nvJPEG, side streams) and compare with the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import gpu_ops
import packer
from packer.core.errors import RecordError, UsageError
from packer.sample import make_dataset
from packer.stores import open_store
from readers.decode import decode_jpeg
from readers.gpu import (
    DecodeError,
    DetectionPipeline,
    GPULoader,
    NvJpegDecoder,
    RawReader,
    TrainPipeline,
    TurboJpegDecoder,
    ValPipeline,
    batch_seed,
    boxes_to_original,
    read_raw,
)
from tests import REPO, corpus
from tests.gpu_ops_helpers import assert_close, require_cuda, use_reference  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def class_store(tmp_path_factory):
    return corpus.class_store(tmp_path_factory.mktemp("gpu_cls"), 30, seed=3, name="cls.lmdb")


@pytest.fixture(scope="module")
def box_store(boxes_dataset, tmp_path_factory):
    images, labels = boxes_dataset
    loc = str(tmp_path_factory.mktemp("gpu_box") / "boxes.h5")
    assert packer.build(images, labels, loc, "hdf5", workers=1).ok
    return loc


def decoded(store, n=6):
    with open_store(store) as r:
        recs = r.get_many(list(range(n)))
    return [torch.from_numpy(decode_jpeg(bytes(rec.data))) for rec in recs], recs


def gpu_threads():
    return [t for t in threading.enumerate() if t.name.startswith("packer-gpu")]


# -- raw reads and decoders ----------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_raw_reads_equal_records(class_store):
    with open_store(class_store) as r:
        raw = read_raw(r, [4, 0, 7])
        recs = [r.get(i) for i in (4, 0, 7)]
    assert [bytes(d.numpy()) for d in raw.datas()] == [bytes(x.data) for x in recs]
    assert raw.sizes.tolist() == [[x.height, x.width] for x in recs]
    assert raw.keys == [x.key for x in recs] and raw.indices == [4, 0, 7] and raw.labels == [x.label for x in recs]
    many = list(range(30)) * 7  # 210 reads: enough for 3 parallel parts of >= 64 records
    with RawReader(class_store, threads=3) as rr:
        par = rr.read(many)
        one = RawReader(class_store, threads=1).read(many)
    assert [bytes(d.numpy()) for d in par.datas()] == [bytes(d.numpy()) for d in one.datas()]
    assert len(par.buffers) == 3 and par.keys == one.keys


@pytest.mark.timeout(60)
def test_turbojpeg_decoder_matches_readers_decode(class_store):
    with open_store(class_store) as r:
        raw = read_raw(r, [0, 1, 2, 3])
    imgs = TurboJpegDecoder(threads=2).decode(raw.datas(), "cpu", raw.keys)
    for img, d in zip(imgs, raw.datas()):
        assert torch.equal(img, torch.from_numpy(decode_jpeg(bytes(d.numpy()))))
    bad = raw.datas()[1][:300].clone()
    with pytest.raises(DecodeError) as ei:
        TurboJpegDecoder(threads=2).decode([raw.datas()[0], bad], "cpu", ["a.jpg", "b.jpg"])
    assert ei.value.position == 1 and ei.value.key == "b.jpg"


@pytest.mark.timeout(60)
def test_turbojpeg_ragged_decode_packs_what_decode_gives(class_store):
    """``decode_ragged``: one HWC RaggedBatch holding the images ``decode`` gives, in order; no
    images, an empty batch; a damaged image, DecodeError with its position and key."""
    with open_store(class_store) as r:
        raw = read_raw(r, [0, 3, 1, 2])
    dec = TurboJpegDecoder(threads=2)
    rb = dec.decode_ragged(raw.datas(), "cpu", raw.keys)
    want = dec.decode(raw.datas(), "cpu", raw.keys)
    assert isinstance(rb, gpu_ops.RaggedBatch) and rb.layout == "HWC" and rb.channels == 3 and len(rb) == 4
    assert rb.sizes.tolist() == [list(t.shape[:2]) for t in want]
    assert all(torch.equal(a, b) for a, b in zip(rb.unbind(), want))
    rb.check("test")  # the index stays inside the buffer
    assert len(dec.decode_ragged([], "cpu")) == 0
    bad = raw.datas()[2][:300].clone()
    with pytest.raises(DecodeError) as ei:
        dec.decode_ragged([raw.datas()[0], raw.datas()[1], bad], "cpu", ["a.jpg", "b.jpg", "c.jpg"])
    assert ei.value.position == 2 and ei.value.key == "c.jpg"


class _ListOnlyTurbo(TurboJpegDecoder):
    """libjpeg-turbo without ``decode_ragged``: the loader's list path (the pipeline packs the
    images itself)."""

    decode_ragged = None


@pytest.mark.timeout(120)
def test_loader_with_turbojpeg_takes_the_ragged_path_and_gives_the_list_paths_batches(class_store):
    outs = {}
    for name, dec in (("ragged", TurboJpegDecoder(2)), ("list", _ListOnlyTurbo(2))):
        with GPULoader(class_store, TrainPipeline(40, scale=(0.3, 1.0)), batch_size=5, device="cpu",
                       decoder=dec, seed=7, shuffle=True) as loader:
            seen = []
            real = loader._decode
            loader._decode = lambda raw, *a: seen.append(real(raw, *a)) or seen[-1]
            outs[name] = [(b.images, b.labels, b.keys) for b in loader]
        assert seen and all(isinstance(x, gpu_ops.RaggedBatch) == (name == "ragged") for x in seen), name
    assert len(outs["ragged"]) == len(outs["list"]) > 1
    for (a, la, ka), (b, lb, kb) in zip(outs["ragged"], outs["list"]):
        assert ka == kb and torch.equal(la, lb) and torch.equal(a, b)


# -- pipelines on the CPU ------------------------------------------------------------------------
def test_train_pipeline_seeded_and_matches_reference(class_store):
    imgs, _ = decoded(class_store)
    pipe = TrainPipeline(32, color_jitter=(0.4, 0.4, 0.4, 0.1))
    a = pipe(imgs, generator=torch.Generator().manual_seed(5))
    b = pipe(imgs, generator=torch.Generator().manual_seed(5))
    c = pipe(imgs, generator=torch.Generator().manual_seed(6))
    assert a.shape == (6, 3, 32, 32) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    with use_reference():
        ref = pipe(imgs, generator=torch.Generator().manual_seed(5))
    assert_close(a, ref, 1e-4, 1e-4, "train pipeline: kernels vs reference")
    half = TrainPipeline(32, dtype=torch.bfloat16, channels_last=True)(imgs, generator=torch.Generator().manual_seed(1))
    assert half.dtype == torch.bfloat16 and half.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.torchvision
def test_train_pipeline_equals_manual_rrc(class_store):
    """What the pipeline does, spelled out with torchvision's functional ops on each image."""
    from torchvision.transforms.v2 import functional as F
    imgs, _ = decoded(class_store, 4)
    pipe = TrainPipeline(24)
    out = pipe(imgs, generator=torch.Generator().manual_seed(2))
    p = gpu_ops.RandomResizedCrop(24).sample(torch.tensor([im.shape[:2] for im in imgs]),
                                             torch.Generator().manual_seed(2))
    for i, im in enumerate(imgs):
        t, l, h, w = p.boxes[i].tolist()
        x = F.resized_crop(im.permute(2, 0, 1).float()[None], t, l, h, w, [24, 24], antialias=True)[0]
        if p.flip[i]:
            x = x.flip(-1)
        x = (x - torch.tensor(pipe.mean).view(3, 1, 1)) / torch.tensor(pipe.std).view(3, 1, 1)
        assert_close(out[i], x, 2e-3, 2e-3, f"image {i}")


@pytest.mark.torchvision
def test_val_pipeline_close_to_resize_centercrop(class_store):
    from torchvision.transforms.v2 import functional as F
    imgs, _ = decoded(class_store, 4)
    pipe = ValPipeline(40, 32)
    out = pipe(imgs)
    assert out.shape == (4, 3, 32, 32)
    for i, im in enumerate(imgs):
        x = F.center_crop(F.resize(im.permute(2, 0, 1).float()[None], 40, antialias=True), [32, 32])[0]
        x = (x - torch.tensor(pipe.mean).view(3, 1, 1)) / torch.tensor(pipe.std).view(3, 1, 1)
        # One resampling of a window rounded to whole source pixels vs resize-then-crop: close,
        # not equal (sub-pixel shift).
        assert (out[i] - x).abs().mean() < 0.15, f"image {i}: mean abs diff {(out[i] - x).abs().mean()}"


def test_detection_pipeline_metas_boxes_padding(box_store):
    with open_store(box_store) as r:
        recs = r.get_many(list(range(5)))
    imgs = [torch.from_numpy(decode_jpeg(bytes(x.data))) for x in recs]
    pipe = DetectionPipeline((1333, 800), pad_value=-3.0)
    out = pipe(imgs, labels=[x.label for x in recs], keys=[x.key for x in recs], indices=list(range(5)))
    B, C, Hp, Wp = out.images.shape
    assert Hp % 32 == 0 and Wp % 32 == 0
    for i, (im, m) in enumerate(zip(imgs, out.metas)):
        h, w = im.shape[:2]
        f = min(1333 / max(h, w), 800 / min(h, w))
        assert m["ori_shape"] == (h, w)
        assert m["img_shape"] == (int(h * f + 0.5), int(w * f + 0.5))
        assert m["pad_shape"] == (Hp, Wp) and m["key"] == recs[i].key and m["index"] == i
        nh, nw = m["img_shape"]
        assert m["scale_factor"] == (nw / w, nh / h)
        alone = gpu_ops.resized_crop_mirror_normalize(im, [0, 0, h, w], (nh, nw), pipe.mean, pipe.std)
        assert_close(out.images[i, :, :nh, :nw], alone, 1e-5, 1e-5, f"image {i}")
        assert bool((out.images[i, :, nh:, :] == -3).all()) and bool((out.images[i, :, :, nw:] == -3).all())
        rows = recs[i].label
        back = boxes_to_original(out.bboxes[i], m)
        if len(rows):
            x1 = (rows[:, 1] - rows[:, 3] / 2) * w
            np.testing.assert_allclose(back[:, 0].numpy(), x1, rtol=1e-4, atol=1e-3)
            assert torch.equal(out.labels[i], torch.as_tensor(rows[:, 0]).long())


# -- GPULoader on the CPU ------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_loader_epoch_covers_every_sample_once(class_store):
    with GPULoader(class_store, TrainPipeline(16), batch_size=8, device="cpu", threads=2, seed=3) as L:
        seen = [i for b in L for i in b.indices]
        labels = [int(v) for b in L for v in b.labels]
    assert sorted(seen) == list(range(30)) and len(labels) == 30
    assert not gpu_threads()


@pytest.mark.timeout(120)
def test_loader_replays_under_seed_and_accepts_any_sampler(class_store):
    def run(seed, epoch=0, **kw):
        with GPULoader(class_store, TrainPipeline(16), device="cpu", threads=2, seed=seed, **kw) as L:
            L.set_epoch(epoch)
            return [(b.indices, b.images) for b in L]

    a, b = run(1, batch_size=7, shuffle=True), run(1, batch_size=7, shuffle=True)
    assert [x[0] for x in a] == [x[0] for x in b] and all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
    c = run(1, epoch=1, batch_size=7, shuffle=True)
    assert [x[0] for x in a] != [x[0] for x in c]
    # A BatchSampler from elsewhere (a DDP sampler's batches): its batches, in its order.
    custom = [[3, 1, 2], [29, 0], [5]]
    got = run(0, batch_sampler=custom)
    assert [x[0] for x in got] == custom
    # The same batch gives the same parameters wherever it comes in the epoch (resume).
    again = run(0, batch_sampler=[[5], [29, 0]])
    assert torch.equal(again[1][1], got[1][1]) and batch_seed(0, 0, [29, 0]) != batch_seed(0, 1, [29, 0])
    dist = torch.utils.data.distributed.DistributedSampler(range(30), num_replicas=2, rank=1, shuffle=True, seed=4)
    ranks = run(0, sampler=dist, batch_size=4)
    assert sorted(i for x in ranks for i in x[0]) == sorted(list(dist))


@pytest.mark.timeout(120)
def test_loader_damaged_record_names_key_or_is_skipped(tmp_path):
    images, _ = make_dataset(tmp_path / "ds", 12, kind="classes", seed=4)
    loc = str(tmp_path / "bad.h5")
    assert packer.build(images, None, loc, "hdf5", workers=1).ok
    import h5py

    with open_store(loc) as r:
        key5 = r.get(5).key
    with h5py.File(loc, "r+") as f:
        off = int(f["jpeg_offsets"][5]) + 300
        f["jpeg_bytes"][off] = f["jpeg_bytes"][off] ^ 0x40
    with GPULoader(loc, TrainPipeline(16), batch_size=4, device="cpu", threads=2) as L:
        with pytest.raises(RecordError, match="checksum mismatch") as ei:
            list(L)
        assert key5 in str(ei.value)
    with GPULoader(loc, TrainPipeline(16), batch_size=4, device="cpu", threads=2, on_error="skip") as L:
        seen = [i for b in L for i in b.indices]
    assert sorted(seen) == [i for i in range(12) if i != 5] and L.skipped == 1
    assert not gpu_threads()


@pytest.mark.timeout(120)
def test_loader_decode_error_reaches_consumer_with_key(class_store):
    with open_store(class_store) as r:
        key7 = r.get(7).key

    class Failing(TurboJpegDecoder):
        def decode_host(self, datas, keys=None):  # under decode and decode_ragged alike
            if key7 in keys:
                raise DecodeError(keys.index(key7), key7, "simulated")
            return super().decode_host(datas, keys)

    with GPULoader(class_store, TrainPipeline(16), batch_size=10, device="cpu", threads=2,
                   decoder=Failing(2)) as L:
        with pytest.raises(RecordError, match="JPEG does not decode: simulated") as ei:
            list(L)
        assert key7 in str(ei.value)
    assert not gpu_threads()


@pytest.mark.timeout(60)
def test_loader_pipeline_error_and_early_stop_leave_no_thread(class_store):
    def boom(images, generator=None, labels=None):
        raise ValueError("pipeline broke")

    with GPULoader(class_store, boom, batch_size=4, device="cpu", threads=2) as L:
        with pytest.raises(ValueError, match="pipeline broke"):
            next(iter(L))
    assert not gpu_threads()
    L = GPULoader(class_store, TrainPipeline(16), batch_size=2, device="cpu", threads=2, prefetch=1)
    it = iter(L)
    next(it)
    assert gpu_threads()  # prefetching, blocked on the bounded queue
    del it
    L.close()
    assert not gpu_threads()


@pytest.mark.timeout(60)
def test_loader_exit_without_close_does_not_hang(class_store):
    """Interpreter exit with a half-consumed loader (threads blocked on a full queue): exits, and
    without "Exception ignored in <generator ...>" from a shutdown racing the module teardown."""
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from readers.gpu import GPULoader, TrainPipeline
        L = GPULoader({class_store!r}, TrainPipeline(16), batch_size=2, device="cpu", threads=2, prefetch=1)
        it = iter(L)
        print(next(it).images.shape)
    """)
    for last in ("", "L.close()"):  # closed or not, the suspended loop is closed at exit quietly
        p = subprocess.run([sys.executable, "-c", script + last], capture_output=True, text=True, timeout=45)
        assert p.returncode == 0, p.stderr
        assert "torch.Size([2, 3, 16, 16])" in p.stdout
        assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.timeout(60)
def test_raw_reader_pickles_for_spawn(class_store):
    import pickle

    rr = RawReader(class_store, threads=2)
    rr.read([0, 1])
    clone = pickle.loads(pickle.dumps(rr))
    assert [bytes(d.numpy()) for d in clone.read([1]).datas()] == [bytes(d.numpy()) for d in rr.read([1]).datas()]
    rr.close()
    clone.close()


# -- the GPU path --------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_gpu_loader_matches_cpu_loader(class_store, require_cuda):
    """nvJPEG decode + CUDA kernels + prefetch stream == libjpeg-turbo + CPU kernels, same seed."""
    outs = {}
    for dev, dec in (("cpu", "turbojpeg"), ("cuda", "nvjpeg")):
        with GPULoader(class_store, TrainPipeline(24), batch_size=8, device=dev, decoder=dec, threads=2,
                       seed=9, shuffle=True) as L:
            outs[dev] = [(b.indices, b.images.cpu()) for b in L]
    assert [x[0] for x in outs["cpu"]] == [x[0] for x in outs["cuda"]]
    for (_, a), (_, b) in zip(outs["cpu"], outs["cuda"]):
        # nvJPEG's IDCT and colour conversion differ from libjpeg-turbo's by a few grey levels.
        assert (a - b).abs().mean() < 0.05 and (a - b).abs().max() < 0.6


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_gpu_pipelines_match_cpu(class_store, box_store, require_cuda):
    imgs, _ = decoded(class_store)
    for pipe in (TrainPipeline(32, color_jitter=(0.4, 0.4, 0.4, 0.1)), ValPipeline(40, 32)):
        cpu = pipe(imgs, generator=torch.Generator().manual_seed(1))
        gpu = pipe([im.cuda() for im in imgs], generator=torch.Generator().manual_seed(1))
        assert_close(gpu, cpu.cuda(), 1e-3, 1e-3, type(pipe).__name__)
    bimgs, recs = decoded(box_store, 5)
    det = DetectionPipeline((96, 64))
    a = det(bimgs, labels=[r.label for r in recs])
    b = det([im.cuda() for im in bimgs], labels=[r.label for r in recs])
    assert_close(b.images, a.images.cuda(), 1e-4, 1e-4, "detection")
    assert a.metas == b.metas


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_nvjpeg_fallback_decodes_rejected_image_on_cpu(class_store, require_cuda, caplog):
    with open_store(class_store) as r:
        raw = read_raw(r, [0, 1, 2, 3])
    dec = NvJpegDecoder()
    victim = raw.datas()[2]
    real = dec._gpu

    def picky(datas, device):
        if any(d.data_ptr() == victim.data_ptr() for d in datas):
            raise RuntimeError("nvjpeg: simulated unsupported JPEG")
        return real(datas, device)

    dec._gpu = picky
    out = dec.decode(raw.datas(), "cuda", raw.keys)
    assert dec.fallbacks == 1 and raw.keys[2] in caplog.text
    cpu = TurboJpegDecoder(1).decode(raw.datas(), "cpu")
    assert torch.equal(out[2].cpu(), cpu[2])
    for a, b in zip(out, cpu):
        assert a.shape == b.shape and (a.cpu().float() - b.float()).abs().mean() < 2.0
    bad = raw.datas()[1][:200].clone()
    with pytest.raises(DecodeError) as ei:
        NvJpegDecoder().decode([raw.datas()[0], bad], "cuda", ["ok.jpg", "cut.jpg"])
    assert ei.value.key == "cut.jpg"


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_gpu_loader_feeds_compiled_model(class_store, require_cuda):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).cuda()
    cmodel = torch.compile(model)
    with GPULoader(class_store, TrainPipeline(32), batch_size=8, device="cuda", threads=2, prefetch=2) as L:
        for x, y in L:
            out = cmodel(x)
            assert out.shape == (x.shape[0], 4) and torch.isfinite(out).all()
    assert not gpu_threads()


@pytest.mark.timeout(60)
def test_lmdb_readers_open_from_many_threads(class_store):
    """RawReader opens one handle per thread: 16 threads opening the same LMDB store at once must
    neither open the environment twice nor lose a reference count."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    from packer.stores.lmdb import envs as lmdb_envs

    st = os.stat(os.path.join(class_store, "data.mdb"))
    fid = (st.st_dev, st.st_ino)

    def refs():
        entry = lmdb_envs.SHARED_ENVS.get(fid)
        return entry[2] if entry is not None else 0

    # Readers that earlier tests left unreferenced (in reference cycles) release their handle
    # when the garbage collector gets to them: now, not in the middle of the count below.
    gc.collect()

    before = refs()
    for _ in range(5):
        barrier = threading.Barrier(16)

        def one(_):
            barrier.wait()
            r = open_store(class_store)
            try:
                return bytes(r.get(0).data)[:4]
            finally:
                r.close()

        with ThreadPoolExecutor(16) as ex:
            assert len(set(ex.map(one, range(16)))) == 1
        assert refs() == before


@pytest.mark.timeout(180)
def test_loader_worker_processes_read_the_same(class_store, tmp_path):
    """workers=N reads in DataLoader worker processes: same batches, same errors (type and key)."""
    def run(**kw):
        with GPULoader(class_store, TrainPipeline(16), batch_size=7, device="cpu", threads=2, seed=2, shuffle=True,
                       **kw) as L:
            out = [(b.indices, b.images, b.labels) for b in L]
            out2 = [b.indices for b in L]  # a second epoch through the persistent workers
        return out, out2

    (a, a2), (b, b2) = run(), run(workers=2)
    assert [x[0] for x in a] == [x[0] for x in b] and a2 == b2
    assert all(torch.equal(x[1], y[1]) and torch.equal(x[2], y[2]) for x, y in zip(a, b))
    images, _ = make_dataset(tmp_path / "ds", 10, kind="classes", seed=5)
    loc = str(tmp_path / "bad.h5")
    assert packer.build(images, None, loc, "hdf5", workers=1).ok
    import h5py

    with open_store(loc) as r:
        key3 = r.get(3).key
    with h5py.File(loc, "r+") as f:
        off = int(f["jpeg_offsets"][3]) + 300
        f["jpeg_bytes"][off] = f["jpeg_bytes"][off] ^ 0x40
    with GPULoader(loc, TrainPipeline(16), batch_size=4, device="cpu", workers=2) as L:
        with pytest.raises(RecordError, match="checksum mismatch") as ei:
            list(L)
        assert ei.value.key == key3
    with GPULoader(loc, TrainPipeline(16), batch_size=4, device="cpu", workers=2, on_error="skip") as L:
        assert sorted(i for b in L for i in b.indices) == [i for i in range(10) if i != 3] and L.skipped == 1
    assert not gpu_threads()


def _bucket_copy(store: str, tmp_path) -> str:
    """``store`` published as a manifest to fsspec's in-memory filesystem (a bucket without a
    server: the GPU machine has none), as ``-o s3://...`` lays it out."""
    from packer.jobs.merge import merge
    from packer.jobs.publish import publish_manifest

    local = str(tmp_path / "train.packer-manifest.json")
    merge([store], local)
    url = f"memory://gpu-{os.getpid()}-{tmp_path.name}/train.packer-manifest.json"
    publish_manifest(local, url)
    return url


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.timeout(180)
def test_gpu_loader_reads_a_store_in_a_bucket_as_the_local_one(class_store, tmp_path, dev, request):
    """GPULoader over a manifest in a bucket (shards through the node-local cache) hands over the
    same batches as over the local store, with the device's default decoder."""
    if dev == "cuda":
        request.getfixturevalue("require_cuda")
    url = _bucket_copy(class_store, tmp_path)
    kw = {"device": dev, "threads": 2, "seed": 5, "shuffle": True, "batch_size": 8}
    if dev == "cpu":
        kw["decoder"] = "turbojpeg"
    outs = []
    for loc, extra in ((class_store, {}), (url, {"cache_dir": str(tmp_path / "cache")})):
        with GPULoader(loc, TrainPipeline(24), **kw, **extra) as L:
            outs.append([(b.indices, b.images.cpu()) for b in L])
    assert [x[0] for x in outs[0]] == [x[0] for x in outs[1]] and outs[0]
    assert all(a.equal(b) for (_, a), (_, b) in zip(outs[0], outs[1]))
    assert any((tmp_path / "cache").rglob(".complete"))        # the shards came through the cache


@pytest.mark.timeout(60)
def test_a_stalled_decoder_raises_naming_where_the_threads_are_instead_of_hanging(class_store):
    """A decoder that never returns (a stuck driver call, a storage that stopped answering) does
    not hang the training loop: after ``timeout`` seconds without a batch the consumer raises,
    naming each of the loader's threads and the call it is in, and the loader closes."""
    release = threading.Event()

    class Stuck(TurboJpegDecoder):
        def decode_host(self, datas, keys=None):
            release.wait(30)
            return super().decode_host(datas, keys)

    try:
        with GPULoader(class_store, TrainPipeline(16), batch_size=4, device="cpu", threads=2, decoder=Stuck(2),
                       timeout=1.5) as L:
            t0 = time.perf_counter()
            with pytest.raises(RuntimeError, match=r"no batch came within timeout=1.5 s") as ei:
                next(iter(L))
            assert time.perf_counter() - t0 < 10
    finally:
        release.set()
    msg = str(ei.value)
    assert "packer-gpu-decode: wait (" in msg and " in decode_host (" in msg, msg
    assert "under _decode (readers/gpu/loader.py:" in msg, msg
    assert "packer-gpu-read: " in msg and "packer-gpu-pipeline: " in msg, msg
    deadline = time.monotonic() + 10
    while gpu_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not gpu_threads()


def test_timeout_must_be_none_or_not_negative(class_store):
    with pytest.raises(UsageError, match="timeout must be None or >= 0"):
        GPULoader(class_store, TrainPipeline(16), device="cpu", timeout=-1)
    assert GPULoader(class_store, TrainPipeline(16), device="cpu", timeout=0).timeout is None
    assert GPULoader(class_store, TrainPipeline(16), device="cpu").timeout == 1800.0
