"""The GPU loader's per-batch fast paths: kept record facts (bytes-only reads after the first),
one-call ragged packing (gpu_ops.pack_ragged), the cheap batch seed, the decoder's ragged output,
and (``cuda``-marked, with nvImageCodec) the split decoder (hardware engine + nvJPEG at once).

Each fast path is checked against the slow path it replaces, and against damage that appears
after the first read."""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gpu_ops.ragged as ragged_mod
import packer
from gpu_ops import RaggedBatch
from packer.core.errors import RecordError
from packer.core.records import checksum
from packer.sample import make_dataset
from packer.stores import open_store
from readers.gpu import GPULoader, TrainPipeline, TurboJpegDecoder, batch_seed, read_raw
from readers.gpu.split import spread
from readers.raw import RawReader, RecordFacts, _digest_fn
from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("fast")
    images, _ = make_dataset(d / "ds", 24, kind="classes", seed=5)
    out = {}
    for fmt, name in (("lmdb", "s.lmdb"), ("hdf5", "s.h5")):
        out[fmt] = str(d / name)
        assert packer.build(images, None, out[fmt], fmt, workers=1).ok
    return out


def _same(a, b):
    assert a.keys == b.keys and a.labels == b.labels and a.indices == b.indices
    assert a.orientations == b.orientations and a.jpeg == b.jpeg
    assert torch.equal(a.sizes, b.sizes)
    assert [bytes(x.numpy()) for x in a.datas()] == [bytes(x.numpy()) for x in b.datas()]


# -- kept record facts -----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_facts_fast_path_equals_full_read(stores, record_path):
    idx = [5, 0, 23, 5, 11, 7]
    with open_store(stores["lmdb"]) as r:
        facts = RecordFacts(r.metadata.count, r.metadata.checksum_algorithm)
        assert facts.usable and not facts.all_known(idx)
        first = read_raw(r, idx, facts=facts, pin=False)     # full read: keeps the facts
        assert facts.all_known(idx) and not facts.all_known([1])
        assert facts.in_file(idx) and not facts.in_file([1])  # and where the bytes lie in data.mdb
        fast = read_raw(r, idx, facts=facts, pin=False)      # bytes only, from the file's map
        assert record_path[1] == [record_path[0] == "native"]  # checked and copied in C++ or Python
        assert len(read_raw(r, [], facts=facts, pin=False)) == 0
        facts.offset[:] = -1                                 # offsets unknown: one LMDB get each
        via_store = read_raw(r, idx, facts=facts, pin=False)
        plain = read_raw(r, idx, pin=False)
    _same(first, plain)
    _same(fast, plain)
    _same(via_store, plain)


@pytest.mark.timeout(60)
def test_facts_fast_path_still_checks_bytes_damaged_after_first_read(stores, tmp_path, record_path):
    import shutil

    loc = str(tmp_path / "copy.lmdb")
    shutil.copytree(stores["lmdb"], loc)
    rr = RawReader(loc, threads=1)
    raw = rr.read([3])                       # facts kept, bytes checked
    data = bytes(raw.datas()[0].numpy())
    f = Path(loc) / "data.mdb"
    blob = bytearray(f.read_bytes())
    at = blob.find(data)
    assert at > 0
    blob[at + len(data) // 2] ^= 0x5A        # a bit flip inside the JPEG's entropy-coded data
    f.write_bytes(bytes(blob))
    rr.close()                               # a fresh handle maps the damaged file
    assert rr.facts().all_known([3])         # the kept facts survive: this read takes the fast path
    with pytest.raises(RecordError) as ei:
        rr.read([3])
    assert ei.value.key == raw.keys[0] and "checksum mismatch" in str(ei.value)
    assert record_path[1][-1:] == [record_path[0] == "native"]
    unchecked = RawReader(loc, threads=1, check=False)
    assert len(unchecked.read([3])) == 1     # check=False reads it as stored


@pytest.mark.timeout(60)
def test_the_handle_opened_for_the_metadata_serves_the_first_reads(stores, monkeypatch):
    """RawReader opens the store once for its metadata and the creating thread's reads (a
    bucket's manifest is fetched once, not twice); close() closes the handles this process
    opened and leaves those a forked child inherited from its parent alone."""
    import readers.raw as raw_mod

    opened, real = [], raw_mod.open_store
    monkeypatch.setattr(raw_mod, "open_store", lambda *a, **k: opened.append(a) or real(*a, **k))
    rr = RawReader(stores["lmdb"], threads=1)
    assert len(rr.read([0, 1])) == 2 and len(rr.read([2])) == 1 and len(opened) == 1

    class Inherited:
        closed = False

        def close(self):
            self.closed = True
    inherited = Inherited()
    rr._handles.append((os.getpid() + 1, inherited))       # as a forked child sees its parent's
    mine, closed = rr._handles[0][1], []
    real_close = mine.close
    mine.close = lambda: closed.append(mine) or real_close()
    rr.close()
    assert not inherited.closed and closed == [mine]
    assert len(rr.read([3])) == 1 and len(opened) == 2      # a read after close() opens afresh
    rr.close()


@pytest.mark.timeout(60)
def test_facts_off_other_stores_and_algorithms(stores):
    idx = list(range(0, 24, 3))
    ref = RawReader(stores["lmdb"], threads=1, cache_facts=False)
    assert ref.facts() is None
    a = ref.read(idx)
    for loc in stores.values():              # HDF5 has no bytes-only read: the full read each time
        rr = RawReader(loc, threads=2)
        for _ in range(2):
            b = rr.read(idx)
            assert b.keys == a.keys and b.labels == a.labels and torch.equal(b.sizes, a.sizes)
        rr.close()
    ref.close()
    for data in (b"\xff\xd8 some bytes", bytes(range(256)) * 1000):  # one piece, several 64 KiB pieces
        for algo in ("xxh3-128", "blake2b-128"):
            assert _digest_fn(algo)(data).hex() == checksum(data, algo)
            assert _digest_fn(algo)(np.frombuffer(data, np.uint8)).hex() == checksum(data, algo)
    assert not RecordFacts(3, None).usable   # algorithm unknown: no fast path, full reads


@pytest.mark.timeout(120)
def test_facts_in_worker_processes_read_the_same(stores):
    ds_kwargs = dict(batch_size=6, device="cpu", decoder="turbojpeg", seed=1, shuffle=True)
    outs = []
    for workers in (0, 2):
        with GPULoader(stores["lmdb"], TrainPipeline(16), workers=workers, **ds_kwargs) as L:
            epochs = []
            for epoch in range(2):               # epoch 1 reads through the kept facts
                L.set_epoch(epoch)
                epochs.append([(b.keys, b.images) for b in L])
            outs.append(epochs)
    for e0, e1 in zip(outs[0], outs[1]):
        for (k0, x0), (k1, x1) in zip(e0, e1):
            assert k0 == k1 and torch.equal(x0, x1)


# -- one-call ragged packing -----------------------------------------------------------------------
def _images(seed=0, n=7):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        h, w = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        t = torch.randint(0, 255, (3, h, w), generator=g, dtype=torch.uint8)
        out.append(t.permute(1, 2, 0) if i % 3 else t.permute(1, 2, 0).contiguous())  # mixed storage
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 7])
def test_pack_ragged_op_equals_python_packing(monkeypatch, n):
    imgs = _images(n, n)
    fast = RaggedBatch.from_list(imgs)
    chw = RaggedBatch.from_chw([t.permute(2, 0, 1) for t in imgs])
    mixed = RaggedBatch.from_chw([t if i % 2 else t.permute(2, 0, 1) for i, t in enumerate(imgs)],
                                 chw=[i % 2 == 0 for i in range(n)])
    assert ragged_mod._pack_op() is not None, "the compiled extension has no pack_ragged"
    monkeypatch.setattr(ragged_mod, "_PACK_OP", False)
    slow = RaggedBatch.from_list(imgs)
    for rb in (fast, chw, mixed):
        assert rb.layout == slow.layout and rb.channels == slow.channels
        assert torch.equal(rb.data, slow.data) and torch.equal(rb.index, slow.index)
        assert torch.equal(rb.sizes, slow.sizes) and rb.sizes.is_contiguous()
        for i in range(n):
            assert torch.equal(rb.unbind()[i], imgs[i])


@pytest.mark.timeout(60)
def test_pack_ragged_bad_lists_keep_precise_errors():
    good = torch.zeros(4, 5, 3, dtype=torch.uint8)
    cases = [
        ([good, torch.zeros(4, 5, 4, dtype=torch.uint8)], ValueError, "image 1 has 4 channels"),
        ([good, torch.zeros(4, 5, 3, dtype=torch.float32)], ValueError, "image 1 is torch.float32"),
        ([good, torch.zeros(0, 5, 3, dtype=torch.uint8)], ValueError, "image 1 is empty"),
        ([good, np.zeros((4, 5, 3), np.uint8)], TypeError, "image 1 is a ndarray"),
        ([good, torch.zeros(4, 5, dtype=torch.uint8)], ValueError, "image 1"),
    ]
    for imgs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            RaggedBatch.from_list(imgs)
    with pytest.raises(ValueError, match="2 chw flags for 1 images"):
        RaggedBatch.from_chw([good], chw=[True, False])


# -- batch seeds, the decoder's ragged output, the split -------------------------------------------
@pytest.mark.timeout(60)
def test_batch_seed_is_a_function_of_seed_epoch_and_indices():
    base = batch_seed(0, 0, [1, 2, 3])
    assert base == batch_seed(0, 0, [1, 2, 3]) == batch_seed(0, 0, np.array([1, 2, 3]))
    others = {batch_seed(1, 0, [1, 2, 3]), batch_seed(0, 1, [1, 2, 3]), batch_seed(0, 0, [3, 2, 1]),
              batch_seed(0, 0, [1, 2]), batch_seed(0, 0, [1, 2, 3, 0])}
    assert base not in others and len(others) == 5
    assert 0 <= base < 2 ** 63


class _ListOnly:
    """A pipeline that takes lists only (no accepts_ragged): the loader must keep handing lists."""

    def __init__(self, pipe):
        self.pipe = pipe

    def __call__(self, images, generator=None, labels=None):
        assert isinstance(images, list)
        return self.pipe(images, generator=generator, labels=labels)


@pytest.mark.torchvision
@pytest.mark.timeout(120)
def test_loader_ragged_decode_equals_list_decode(stores):
    from readers.gpu import NvJpegDecoder
    from readers.gpu.roi import takes_ragged

    outs = []
    for pipe in (TrainPipeline(20), _ListOnly(TrainPipeline(20))):  # ragged path, then the list path
        with GPULoader(stores["lmdb"], pipe, batch_size=5, device="cpu", decoder=NvJpegDecoder(), seed=4,
                       shuffle=True) as L:
            assert takes_ragged(L._decoder, pipe, L.reader.read([0])) == (pipe.__class__ is TrainPipeline)
            outs.append([(b.indices, b.images) for b in L])
    for (i0, x0), (i1, x1) in zip(*outs):
        assert i0 == i1 and torch.equal(x0, x1)


def test_spread_picks_an_even_share():
    assert spread(list(range(10)), 0.5) == [0, 2, 4, 6, 8]
    assert spread(list(range(10)), 0.3) == [0, 3, 6] and spread(list(range(7)), 0.5) == [0, 1, 3, 5]
    assert spread(list(range(5)), 1.0) == list(range(5)) and spread(list(range(5)), 0.0) == []


def _jpeg(seed: int, h: int, w: int, progressive=False) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (7 + seed) + c) * np.cos(y / 11) for c in range(3)], axis=2)
    img = np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90, progressive=progressive)
    return buf.getvalue()


@pytest.fixture
def require_nvimgcodec(require_cuda):
    from readers.gpu import nvimgcodec

    if not nvimgcodec.available():
        if os.environ.get("PACKER_REQUIRE_NVIMGCODEC") == "1":
            pytest.fail("PACKER_REQUIRE_NVIMGCODEC=1 but nvImageCodec does not import")
        pytest.skip("needs nvImageCodec (pip install 'packer-vision[nvimgcodec]')")


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_split_decoder_gives_each_decoders_own_pixels_at_every_share(require_nvimgcodec):
    """Each image comes from the decoder its share sent it to (engine, libjpeg-turbo, nvJPEG),
    exactly, and in its place in the batch."""
    from readers.gpu import NvJpegDecoder
    from readers.gpu.nvimgcodec import NvImageCodecDecoder
    from readers.gpu.split import SplitDecoder

    datas = [torch.frombuffer(bytearray(_jpeg(i, 40 + 8 * i, 64 + 4 * i, progressive=i % 5 == 4)), dtype=torch.uint8)
             for i in range(13)]
    baseline = [i for i in range(13) if i % 5 != 4]
    ref = TurboJpegDecoder(1).decode(datas, "cpu")
    by_nvjpeg = NvJpegDecoder().decode(datas, "cuda")
    by_engine = NvImageCodecDecoder(hw_load=1.0).decode([datas[i] for i in baseline], "cuda")
    for share, cpu_share in ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.0, 0.3), (0.25, 0.25)):
        dec = SplitDecoder(hw_share=share, cpu_share=cpu_share, threads=3)
        rb = dec.decode_ragged(datas, "cuda", keys=[f"k{i}" for i in range(13)])
        imgs = dec.decode(datas, "cuda")
        torch.cuda.synchronize()
        on_engine = spread(baseline, share)
        left = [i for i in range(13) if i not in on_engine]
        on_cpu = spread(left, cpu_share / (1 - share)) if cpu_share else []
        assert dec.routed["hw"] == 2 * len(on_engine) and dec.routed["cpu"] == 2 * len(on_cpu)
        assert dec.routed["nvjpeg"] == 2 * (13 - len(on_engine) - len(on_cpu))
        for i, r in enumerate(ref):
            want = (by_engine[baseline.index(i)] if i in on_engine else r.cuda() if i in on_cpu
                    else by_nvjpeg[i])
            for got in (rb.unbind()[i], imgs[i]):
                assert torch.equal(got, want), (share, i)  # the decoder it was sent to, exactly
            # and both decoders close to libjpeg-turbo (nvJPEG upsamples chroma without smoothing)
            d = (want.cpu().float() - r.float()).abs()
            assert want.shape == r.shape and float(d.mean()) < 4.0, (share, i, float(d.mean()))
        dec.close()


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_split_decoder_bad_image_is_named_and_loader_uses_it(require_nvimgcodec, stores):
    from readers.gpu.decoders import DecodeError
    from readers.gpu.split import SplitDecoder

    good = [torch.frombuffer(bytearray(_jpeg(i, 48, 64)), dtype=torch.uint8) for i in range(4)]
    bad = good[1][:200].clone()
    dec = SplitDecoder(hw_share=0.25, cpu_share=0.25)
    for pos in (0, 1, 2):  # the cut image on the engine's share, then the CPU's, then nvJPEG's
        batch = list(good)
        batch[pos] = bad
        with pytest.raises(DecodeError) as ei:
            dec.decode_ragged(batch, "cuda", keys=[f"k{i}" for i in range(4)])
        assert ei.value.position == pos and ei.value.key == f"k{pos}"
    dec.close()
    outs = {}
    for name in ("split", "nvjpeg"):
        with GPULoader(stores["lmdb"], TrainPipeline(24), batch_size=8, device="cuda", decoder=name, seed=2) as L:
            assert L.decoder.name == name
            outs[name] = [b.images.cpu() for b in L]
    for a, b in zip(outs["split"], outs["nvjpeg"]):
        assert (a - b).abs().mean() < 0.05
