"""The native engine (gpu_ops/csrc/engine/engine.cpp, gpu_ops/engine.py, readers/gpu/engine.py).

CPU part (runs everywhere): where nvJPEG is looked for, why the engine is unavailable here, that its
source is kept out of gpu_ops' own build key. ``cuda`` part (scripts/gpu_check.sh): pixels against
nvJPEG's reference decode (torchvision) and libjpeg-turbo on every JPEG kind, each engine share, the
GPU-Huffman path for large images, the libjpeg-turbo fallback (CMYK), damaged bytes naming the
record, the loader's batches against the CPU decoder's for the same seed, two threads on one engine.
"""
from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
import torch

from gpu_ops import build
from gpu_ops import engine as native
from packer.core.errors import DependencyError, RecordError
from packer.stores import open_store
from readers.gpu import GPULoader, TrainPipeline, TurboJpegDecoder, gpu_info, read_raw
from readers.gpu.decoders import DecodeError, get_decoder
from readers.gpu.engine import EngineDecoder
from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)
from tests.jpeg_kinds import KINDS, cmyk_jpeg, jpeg, kinds_store_at, photo


# -- CPU: building and why not ------------------------------------------------------------------
def _fake_nvjpeg(root, lib="libnvjpeg.so.13"):
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nvjpeg.h").write_text("/* header */")
    (root / "lib" / lib).write_bytes(b"\x7fELF")


def test_find_nvjpeg_in_a_toolkit_and_not_without_the_library(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_PATH", raising=False)
    home = tmp_path / "cuda"
    _fake_nvjpeg(home)
    (home / "lib64").mkdir()
    shutil.move(str(home / "lib" / "libnvjpeg.so.13"), str(home / "lib64" / "libnvjpeg.so.13"))
    found = native.find_nvjpeg(str(home))
    assert found == native.NvJpeg(str(home / "include"), str(home / "lib64"), "libnvjpeg.so.13")
    (home / "lib64" / "libnvjpeg.so.13").unlink()  # a header without its library is no nvJPEG
    monkeypatch.setenv("CUDA_HOME", str(home))
    found = native.find_nvjpeg(str(home))
    assert found is None or str(home) not in found.include


def test_engine_source_is_not_part_of_the_gpu_ops_build_key(tmp_path):
    csrc = tmp_path / "csrc"
    shutil.copytree(build.CSRC, csrc)
    before = build.sources_digest(str(csrc))
    (csrc / "engine" / "engine.cpp").write_text("// changed\n")
    assert build.sources_digest(str(csrc)) == before  # the kernels are not rebuilt for it
    (csrc / "checks.h").write_text("// changed\n")
    assert build.sources_digest(str(csrc)) != before


def test_host_buffers_take_tensors_as_they_are_and_pack_bytes_once():
    """CPU uint8 tensors (any shape, non-contiguous too) are handed over as they are (a contiguous
    view where they are contiguous), one buffer each; bytes go back to back into one host buffer
    (pinned where CUDA is); anything but CPU uint8 is refused, naming the image."""
    rng = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=rng) for n in (5, 0, 7)]
    images.append(torch.arange(12, dtype=torch.uint8).reshape(3, 4)[:, :2])  # not contiguous
    bufs, rows = EngineDecoder._host_buffers(images)
    assert len(bufs) == 4 and rows.dtype == torch.int64
    assert rows.tolist() == [[0, 0, 5], [1, 0, 0], [2, 0, 7], [3, 0, 6]]
    assert [b.data_ptr() for b in bufs[:3]] == [t.data_ptr() for t in images[:3]]  # no copy
    for img, (b, off, n) in zip(images, rows.tolist()):
        assert torch.equal(bufs[b][off:off + n], img.reshape(-1))
    bufs, rows = EngineDecoder._host_buffers([b"abc", b"", b"de"])
    assert len(bufs) == 1 and rows.tolist() == [[0, 0, 3], [0, 3, 0], [0, 3, 2]]
    assert bufs[0][:5].tolist() == [97, 98, 99, 100, 101] and bufs[0].is_pinned() == torch.cuda.is_available()
    assert EngineDecoder._host_buffers([])[1].shape == (0, 3)
    with pytest.raises(TypeError, match="image 1 must be bytes or a CPU uint8 tensor"):
        EngineDecoder._host_buffers([images[0], torch.zeros(3)])


@pytest.mark.timeout(60)
def test_without_a_gpu_the_engine_says_why_and_auto_steps_down(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here (the cuda tests cover it)")
    st = native.status()
    assert st["available"] is False and st["reason"], st
    assert "CPU-only" in st["reason"] or "no CUDA device" in st["reason"] or "nvJPEG" in st["reason"]
    with pytest.raises(DependencyError, match="CUDA device"):
        EngineDecoder("cpu")
    info = gpu_info("cpu")
    assert info["engine"] == st and "engine" in info["decoders"] and info["auto"] == "turbojpeg"


def test_build_forbidden_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "cached_library", lambda: None)
    monkeypatch.setattr(native, "_why_not_buildable", lambda torch_mod: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(native.BUILD_ENV, "0")
    assert native.load() is None
    assert f"{native.BUILD_ENV}=0" in native.status()["reason"]


def _decoder_without_engine() -> EngineDecoder:
    dec = object.__new__(EngineDecoder)  # the Python half alone: no GPU, no engine
    dec._fallback, dec._fallback_threads, dec.fallbacks = None, 1, 0
    dec.device = torch.device("cpu")
    return dec


def test_images_nvjpeg_gave_up_on_are_decoded_by_libjpeg_turbo_in_their_slots(caplog):
    from gpu_ops import RaggedBatch
    from readers.gpu import engine as eng

    datas = [jpeg(photo(1, 16, 24)), jpeg(photo(2, 8, 8))]
    bufs = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    rows = torch.tensor([[0, 0, len(datas[0])], [1, 0, len(datas[1])]])
    turbo = TurboJpegDecoder(1).decode(datas, "cpu")
    good = turbo[0].flatten()
    # The engine decoded image 0 and gave up on image 1 after sizing it (status 3): the slot is filled.
    batch = RaggedBatch(data=torch.cat([good, torch.zeros(8 * 8 * 3, dtype=torch.uint8)]),
                        index=torch.tensor([[0, 16, 24], [good.numel(), 8, 8]]),
                        sizes=torch.tensor([[16, 24], [8, 8]]), channels=3, layout="HWC")
    dec = _decoder_without_engine()
    status = torch.tensor([eng.STATUS_OK, eng.STATUS_DECODE_FAILED], dtype=torch.int32)
    out = dec._repair(batch, [1], status, ["", "decode: nvJPEG bad JPEG"], bufs, rows, ["a", "b.jpg"])
    assert out is batch and dec.fallbacks == 1 and "b.jpg" in caplog.text
    assert [torch.equal(v, t) for v, t in zip(out.unbind(), turbo)] == [True, True]
    # An image whose header nvJPEG could not size (status 1) has no slot: the batch is repacked.
    batch = RaggedBatch(data=good.clone(), index=torch.tensor([[0, 16, 24], [good.numel(), 0, 0]]),
                        sizes=torch.tensor([[16, 24], [0, 0]]), channels=3, layout="HWC")
    status = torch.tensor([eng.STATUS_OK, eng.STATUS_BAD_HEADER], dtype=torch.int32)
    out = dec._repair(batch, [1], status, ["", "header does not parse"], bufs, rows, None)
    assert out.sizes.tolist() == [[16, 24], [8, 8]]
    assert [torch.equal(v, t) for v, t in zip(out.unbind(), turbo)] == [True, True]
    # Damaged for libjpeg-turbo too: DecodeError at the image's place in the whole batch, with both reasons.
    bufs[1] = bufs[1][:40].clone()
    rows[1, 2] = 40
    with pytest.raises(DecodeError) as ei:
        dec._repair(batch, [1], status, ["", "header does not parse"], bufs, rows, ["a", "b.jpg"])
    assert ei.value.position == 1 and ei.value.key == "b.jpg" and "nvJPEG: header does not parse" in str(ei.value)


class _EngineRefusingHardware:
    """The C++ engine's result() for a batch of one decoded image, after ``failures`` hardware
    batches failed as a whole (a stand-in: no GPU here)."""

    def __init__(self):
        self.hardware_failures = 0
        self.hardware_error = ""

    def result(self, ticket):
        data = torch.zeros(2 * 2 * 3, dtype=torch.uint8)
        index, sizes = torch.tensor([[0, 2, 2]]), torch.tensor([[2, 2]])
        return data, index, sizes, torch.zeros(1, dtype=torch.int32), [""], 0


def test_a_refused_hardware_batch_is_counted_and_said_once(caplog):
    from readers.gpu.engine import Pending

    dec = _decoder_without_engine()
    dec._engine, dec.stats, dec._hw_failures_seen = _EngineRefusingHardware(), {"hardware": 0, "threads": 0}, 0
    pending = Pending(0, [], torch.tensor([[0, 0, 1]]), None)
    dec.collect(pending)
    assert "refused" not in caplog.text and dec.hardware_failures == 0
    dec._engine.hardware_failures, dec._engine.hardware_error = 1, "nvjpegDecodeBatched (hardware backend, 6 images)"
    for _ in range(3):
        dec._engine.hardware_failures += 1
        dec.collect(pending)
    assert caplog.text.count("refused a batch") == 1 and "nvjpegDecodeBatched (hardware" in caplog.text
    assert dec.hardware_failures == 4 and dec.stats == {"hardware": 0, "threads": 4}


# -- CUDA ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_ready():
    if not torch.cuda.is_available():
        return None
    return native.status()


@pytest.fixture
def require_engine(require_cuda, engine_ready):
    if not engine_ready["available"]:
        pytest.fail(f"the native engine did not load on a CUDA machine: {engine_ready['reason']}")


KINDS_LIST = [(coding, sub) for _, coding, sub in KINDS.values()]


def _batch():
    """Every kind of KINDS, odd sizes, and one image above the GPU-Huffman threshold."""
    datas = [make(i) for i, (make, _, _) in enumerate(KINDS.values())]
    datas += [jpeg(photo(11, 97, 131)), jpeg(photo(12, 33, 17), subsampling=1), jpeg(photo(13, 1100, 1000))]
    return datas


def _diff(a: torch.Tensor, b: torch.Tensor):
    d = (a.cpu().float() - b.cpu().float()).abs()
    return float(d.mean()), float(d.quantile(0.99)), float(d.max())


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("share", [0.0, 1.0, -1.0], ids=["threads", "hardware", "balanced"])
def test_pixels_match_nvjpeg_reference_and_libjpeg_turbo(require_engine, share):
    import torchvision.io as tvio

    datas = _batch()
    gray = [i for i, (_, _, sub) in enumerate(KINDS.values()) if sub == "gray"]
    dec = EngineDecoder("cuda", threads=3, hardware_share=share)
    out = dec.decode(datas, "cuda", [f"k{i}" for i in range(len(datas))])
    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    ref = [t.permute(1, 2, 0) for t in tvio.decode_jpeg(tensors, mode=tvio.ImageReadMode.RGB, device="cuda")]
    turbo = TurboJpegDecoder(1).decode(datas, "cpu")
    for i, (a, r, t) in enumerate(zip(out, ref, turbo)):
        assert a.is_cuda and a.dtype == torch.uint8 and a.shape == r.shape == t.shape, (i, a.shape, r.shape)
        # Against libjpeg-turbo: nvJPEG upsamples 4:2:0 chroma without libjpeg's "fancy" filter,
        # so up to ~2 levels on average there (0 on 4:4:4), never more than a few at the 99th percentile.
        mean, p99, _ = _diff(a, t)
        assert mean < 2.5 and p99 <= 12, (i, share, mean, p99)
        if i in gray:
            continue  # torchvision's GPU decode of grayscale to RGB is wrong on nvJPEG 13 (see engine.cpp)
        mean, p99, mx = _diff(a, r)  # nvJPEG's reference decode: the same library, other IDCT paths
        assert mean < 0.1 and mx <= 4, (i, share, mean, mx)
        if share == 1.0 and dec.hardware and i < len(KINDS) and KINDS_LIST[i][0] == "baseline":
            assert mx == 0, (i, "the hardware engine's decode is torchvision's, bit for bit")
    if share == 1.0 and dec.hardware:  # every baseline colour image went to the hardware engine
        assert dec.stats["hardware"] >= 3, dec.stats
    if share == 0.0:
        assert dec.stats["hardware"] == 0
    assert dec.fallbacks == 0


@pytest.mark.cuda
@pytest.mark.timeout(180)
@pytest.mark.parametrize("share", [0.0, 1.0], ids=["threads", "hardware"])
def test_an_output_still_read_on_the_callers_stream_is_not_handed_to_the_next_batch(require_engine, share):
    """A batch the caller dropped while a read of it was still queued on the caller's stream keeps
    its memory until that read has run: the next batches (same sizes: the allocator's first pick of
    that memory) are written only after the caller's stream has passed the point where their output
    was allocated. (An engine whose writers did not wait for that point would write them under the
    read.)"""
    a = [jpeg(photo(300 + i, 96, 128)) for i in range(16)]
    b = [jpeg(photo(400 + i, 96, 128)) for i in range(16)]
    dec = EngineDecoder("cuda", threads=2, hardware_share=share)
    want = dec.decode_ragged(a).data.clone()
    torch.cuda.synchronize()
    for _ in range(3):
        batch = dec.decode_ragged(a)
        torch.cuda._sleep(300_000_000)  # ~0.15 s of the caller's stream before the read below
        got = batch.data.clone()
        del batch
        others = [dec.decode_ragged(b) for _ in range(4)]
        torch.cuda.synchronize()
        assert torch.equal(got, want), "a batch's memory was written by a later batch under a queued read"
        assert not torch.equal(others[-1].data, want)  # the later batches differ, so the check can fail


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_two_hardware_lanes_decode_what_one_does(require_engine, monkeypatch):
    """The hardware share of small images split over two lanes (two nvJPEG states and threads at
    once) decodes every image into its own slot, the same pixels as one lane (the engine's notes
    stay empty: nvJPEG took the pre-allocation)."""
    small = [jpeg(photo(100 + i, 40 + 7 * (i % 9), 50 + 5 * (i % 7))) for i in range(48)]
    outs = {}
    for lanes in ("1", "2"):
        monkeypatch.setenv("PACKER_ENGINE_HW_LANES", lanes)
        dec = EngineDecoder("cuda", threads=2, hardware_share=1.0)
        if not dec.hardware:
            pytest.skip("no hardware JPEG engine on this GPU")
        assert dec._engine.hardware_lanes == int(lanes) and dec._engine.hardware_notes == ""
        outs[lanes] = [t.clone() for t in dec.decode(small, "cuda", [f"k{i}" for i in range(len(small))])]
        assert dec.stats["hardware"] == len(small), dec.stats
    turbo = TurboJpegDecoder(1).decode(small, "cpu")
    for i, (one, two, t) in enumerate(zip(outs["1"], outs["2"], turbo)):
        assert torch.equal(one, two), i
        assert one.shape == t.shape and _diff(one, t)[0] < 2.5, i


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_the_balanced_share_of_small_images_starts_at_the_hardware_alone(require_engine, monkeypatch):
    """Images under ~1 Mpx: the balanced share's hill climb begins at the hardware engine alone
    after the first batch (which ran at the start share 0.8) and holds there while the windows
    only differ by noise; 1080p images keep the equal-times rule, which moves at most 0.05 a batch."""
    monkeypatch.delenv("PACKER_ENGINE_BALANCE", raising=False)
    small = [jpeg(photo(300 + i, 64, 48)) for i in range(32)]
    dec = EngineDecoder("cuda", threads=2, hardware_share=-1.0)
    if not dec.hardware:
        pytest.skip("no hardware JPEG engine on this GPU")
    assert dec.hardware_share == pytest.approx(0.8)
    keys = [f"k{i}" for i in range(len(small))]
    dec.decode(small, "cuda", keys)
    assert dec.hardware_share == 1.0
    for _ in range(4):                    # a whole window of four batches at the bound: held there
        dec.decode(small, "cuda", keys)
    assert dec.hardware_share == 1.0 and dec.stats["hardware"] > 0, dec.stats
    large = [jpeg(photo(400 + i, 1920, 1080)) for i in range(2)]
    big = EngineDecoder("cuda", threads=2, hardware_share=-1.0)
    big.decode(large, "cuda", ["a", "b"])
    assert abs(big.hardware_share - 0.8) <= 0.05 + 1e-9


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_the_next_batch_output_allocated_during_the_hardware_call_decodes_the_same(require_engine, monkeypatch):
    """While a batch's hardware call runs, the next queued batch's output is allocated
    (PACKER_ENGINE_PREPARE_NEXT=0 turns that off); its plan still waits for its turn. With three
    batches in flight the outputs are the same bytes as without it, for a fixed share and for the
    balanced one (whose first batches' plans must not depend on how the calls overlap: a loader run
    twice hands over the same pixels), and they match libjpeg-turbo."""
    batches = [[jpeg(photo(700 + 10 * b + i, 320 + 16 * (i % 3), 240)) for i in range(24)] for b in range(4)]
    for share in (0.5, -1.0):
        outs = {}
        for prepare in ("1", "0"):
            monkeypatch.setenv("PACKER_ENGINE_PREPARE_NEXT", prepare)
            dec = EngineDecoder("cuda", threads=3, hardware_share=share)
            if not dec.hardware:
                pytest.skip("no hardware JPEG engine on this GPU")
            pending = [dec.submit(b) for b in batches[:3]]  # three in flight: the next is queued in time
            got = [dec.collect(pending[0])]
            pending.append(dec.submit(batches[3]))
            got += [dec.collect(p) for p in pending[1:]]
            outs[prepare] = [[t.clone() for t in g.unbind()] for g in got]
            ahead = dec._engine.outputs_allocated_ahead
            assert (ahead > 0) == (prepare == "1"), (share, prepare, ahead)
            assert dec.stats["hardware"] > 0, dec.stats
            if share > 0:
                assert dec.stats["threads"] > 0, dec.stats
            dec.close()
        for b, (on, off) in enumerate(zip(outs["1"], outs["0"])):
            assert len(on) == len(off) == len(batches[b])
            for i, (x, y) in enumerate(zip(on, off)):
                assert torch.equal(x, y), (share, b, i)
    turbo = TurboJpegDecoder(1).decode(batches[2], "cpu")
    for i, (g, t) in enumerate(zip(outs["1"][2], turbo)):
        assert g.shape == t.shape and _diff(g, t)[0] < 2.5, i


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_threads_beside_the_hardware_leave_cores_for_the_lanes(require_engine, monkeypatch):
    """While the hardware lanes run, the pool decodes on at most (usable CPUs - lanes - 2) threads
    (the lanes', the engine's own and the caller's threads need cores); a batch split between the
    two still decodes every image; PACKER_ENGINE_THREADS_BESIDE_HARDWARE fixes the number."""
    import os

    cpus = len(os.sched_getaffinity(0))
    many = cpus + 2
    dec = EngineDecoder("cuda", threads=many, hardware_share=0.5)
    e = dec._engine
    assert e.threads == many
    assert [e.threads_beside_hardware(n) for n in (1, 2)] == [max(1, cpus - 3), max(1, cpus - 4)]
    assert EngineDecoder("cuda", threads=1, hardware_share=0.5)._engine.threads_beside_hardware(2) == 1
    images = [jpeg(photo(200 + i, 60 + 4 * (i % 5), 80 + 3 * (i % 4))) for i in range(64)]
    got = dec.decode(images, "cuda", [f"k{i}" for i in range(len(images))])
    turbo = TurboJpegDecoder(1).decode(images, "cpu")
    for i, (g, t) in enumerate(zip(got, turbo)):
        assert g.shape == t.shape and _diff(g, t)[0] < 2.5, i
    if dec.hardware:
        assert dec.stats["hardware"] > 0 and dec.stats["threads"] > 0, dec.stats
    for value, want in (("0", many), ("3", 3)):
        monkeypatch.setenv("PACKER_ENGINE_THREADS_BESIDE_HARDWARE", value)
        assert EngineDecoder("cuda", threads=many, hardware_share=0.5)._engine.threads_beside_hardware(2) == want


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_cmyk_is_decoded_by_the_engine(require_engine):
    from packer.core.integrity import opencv_decode

    datas = [jpeg(photo(1)), cmyk_jpeg(), jpeg(photo(2))]
    dec = EngineDecoder("cuda", threads=2)
    out = dec.decode(datas, "cuda", ["a.jpg", "cmyk.jpg", "b.jpg"])
    assert dec.fallbacks == 0
    ref = torch.from_numpy(opencv_decode(datas[1]))
    assert out[1].shape == ref.shape and _diff(out[1], ref)[0] < 2.0


@pytest.mark.cuda
@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_bytes_raise_decode_error_with_position_and_key(require_engine, damage):
    good = jpeg(photo(3))
    bad = {"truncated": good[:300], "garbage": b"\xff\xd8\xff" + bytes(range(256)) * 4, "empty": b""}[damage]
    dec = EngineDecoder("cuda", threads=2)
    with pytest.raises(DecodeError) as ei:
        dec.decode([good, good, bad], "cuda", ["a", "b", "bad.jpg"])
    assert ei.value.position == 2 and ei.value.key == "bad.jpg", repr(ei.value)
    # The engine is still usable after the error.
    assert len(dec.decode([good], "cuda")) == 1


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return kinds_store_at(tmp_path_factory.mktemp("engine"))


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_loader_batches_match_the_cpu_decoder_for_the_same_seed(store, require_engine):
    outs = {}
    for dec in ("engine", "turbojpeg"):
        with GPULoader(store, TrainPipeline(64, scale=(0.3, 1.0), antialias=False), batch_size=6, device="cuda",
                       decoder=dec, seed=3, threads=3) as loader:
            assert loader.decoder.name == dec
            outs[dec] = [(b.images, b.labels, b.keys) for b in loader]
    assert len(outs["engine"]) == len(outs["turbojpeg"]) > 1
    for (a, la, ka), (b, lb, kb) in zip(outs["engine"], outs["turbojpeg"]):
        assert ka == kb and torch.equal(la, lb)
        d = (a - b)[:, :, 2:-2, 2:-2].abs()
        assert float(d.mean()) < 0.05, float(d.mean())  # decoder differences only (normalised units)


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_loader_damaged_record_names_its_key(store, require_engine):
    with GPULoader(store, TrainPipeline(32), batch_size=4, device="cuda", decoder="engine") as loader:
        real = loader.reader.read
        cut = []

        def damaged(idx):
            raw = real(idx)
            b, o, n = raw.parts[1]
            raw.parts[1] = (b, o, 300)  # the second record cut short after the checksum check
            cut.append(raw.keys[1])
            return raw

        loader.reader.read = damaged
        with pytest.raises(RecordError) as ei:
            list(loader)
    assert ei.value.key == cut[0] and cut[0] in str(ei.value), (ei.value, cut)


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_pinned_parts_equal_bytes_and_two_threads_share_one_engine(store, require_engine):
    with open_store(store) as r:
        raw = read_raw(r, list(range(r.metadata.count)))
    dec = EngineDecoder("cuda", threads=4, hardware_share=1.0)  # fixed share: the same path every call
    from_parts = dec.decode_parts(raw.buffers, raw.parts, raw.keys).unbind()
    from_bytes = dec.decode([bytes(d.numpy()) for d in raw.datas()], "cuda")
    torch.cuda.synchronize()
    for a, b in zip(from_parts, from_bytes):
        assert torch.equal(a, b)
    results, errors = {}, []

    def run(name):
        try:
            for _ in range(5):
                out = dec.decode([bytes(d.numpy()) for d in raw.datas()], "cuda")
            torch.cuda.synchronize()
            results[name] = out
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and set(results) == {"x", "y"}
    for a, b, c in zip(results["x"], results["y"], from_bytes):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_gpu_info_and_auto_pick_the_engine(require_engine):
    info = gpu_info("cuda")
    assert info["engine"]["available"] and info["auto"] == "engine", info
    dec = get_decoder("auto", "cuda", 4)
    assert isinstance(dec, EngineDecoder) and dec.threads == 4
    if dec.hardware:
        assert 0.0 < dec.hardware_share <= 1.0
    else:
        assert dec.hardware_reason
    assert np.isfinite(dec.hardware_share)


@pytest.mark.cuda
@pytest.mark.timeout(240)
@pytest.mark.parametrize("share", [1.0, 0.5], ids=["hardware", "half"])  # fixed: the same route every call
def test_submitted_batches_collect_in_any_order_and_equal_one_call(store, require_engine, share):
    # Queued batches: with a hardware share the engine reads the next batch's headers while the
    # hardware call of the one before runs; what comes out is the same as one batch at a time.
    with open_store(store) as r:
        raws = [read_raw(r, list(range(i, r.metadata.count, 3))) for i in range(3)]
    dec = EngineDecoder("cuda", threads=3, hardware_share=share)
    one = [[v.clone() for v in dec.decode_parts(x.buffers, x.parts).unbind()] for x in raws]
    pend = [dec.submit_parts(x.buffers, x.parts, x.keys) for x in raws]
    pend.append(dec.submit(raws[1].datas()))  # bytes, not the reader's buffers
    got = {i: dec.collect(pend[i]).unbind() for i in (2, 0, 3, 1)}
    torch.cuda.synchronize()
    for i in range(3):
        assert all(torch.equal(a, b) for a, b in zip(got[i], one[i]))
    assert all(torch.equal(a, b) for a, b in zip(got[3], one[1]))
    with pytest.raises(RuntimeError, match="ticket"):
        dec.collect(pend[0])  # collected already


def _edit_reads(loader, edit) -> list:
    """Every batch the loader reads goes through ``edit(raw, n)`` (n: its place, from 1) after the
    reader's checks; returns the keys of each batch read, in order."""
    real, keys = loader.reader.read, []

    def edited(idx):
        raw = real(idx)
        keys.append(list(raw.keys))
        edit(raw, len(keys))
        return raw

    loader.reader.read = edited
    return keys


def _cut_second_batch(raw, n) -> None:
    """The second batch's third record cut short (after the checksum check)."""
    if n == 2:
        b, o, _ = raw.parts[2]
        raw.parts[2] = (b, o, 300)


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_loader_skips_a_damaged_record_in_the_submitted_path(store, require_engine, caplog):
    with open_store(store) as r:
        n = r.metadata.count
    with GPULoader(store, TrainPipeline(32), batch_size=4, device="cuda", decoder="engine", on_error="skip",
                   prefetch=2) as loader:
        calls = _edit_reads(loader, _cut_second_batch)
        total = sum(b.images.shape[0] for b in loader)
    assert loader.skipped == 1 and total == n - 1 and calls[1][2] in caplog.text


# -- torchvision's nvJPEG: grayscale around the hardware engine (CPU, with stand-in GPU calls) -----
class _FakeTv:
    """torchvision.io's decode_jpeg on the CPU: the [3, H, W] layout the GPU call returns; raises
    on a grayscale image (where the real one returns wrong pixels) so a routing mistake shows."""

    class ImageReadMode:
        RGB = "rgb"

    @staticmethod
    def decode_jpeg(tensors, mode=None, device=None):
        from readers.gpu.decoders import sniff_jpeg

        out = []
        for t in tensors:
            if sniff_jpeg(t)[1] == "gray":
                raise AssertionError("a grayscale JPEG reached the hardware engine")
            out.append(TurboJpegDecoder(1).decode([t], "cpu")[0].permute(2, 0, 1))
        return out


def _nvjpeg_on_cpu():
    from readers.gpu.nvjpeg import NvJpegDecoder

    dec = NvJpegDecoder()
    dec._tvio = _FakeTv
    cpu = TurboJpegDecoder(1)
    dec._fallback = type("Cpu", (), {"decode": lambda self, d, device, keys=None: cpu.decode(d, "cpu", keys),
                                     "close": lambda self: None})()
    return dec


@pytest.mark.torchvision
@pytest.mark.parametrize("facts", [False, True], ids=["sniffed", "store-facts"])
def test_nvjpeg_sends_grayscale_to_libjpeg_turbo_in_batch_order(facts):
    datas = [jpeg(photo(1)), jpeg(photo(2), gray=True), jpeg(photo(3), subsampling=0), jpeg(photo(4), gray=True)]
    hints = [("baseline", "420"), ("baseline", "gray"), ("baseline", "444"), ("baseline", "gray")] if facts else None
    dec = _nvjpeg_on_cpu()
    assert dec.routes(datas, hints) == ["gpu", "cpu", "gpu", "cpu"]
    ref = TurboJpegDecoder(1).decode(datas, "cpu")
    out = dec.decode(datas, "cuda", [f"k{i}" for i in range(4)], jpeg=hints)
    assert dec.routed_cpu == 2 and all(torch.equal(a, b) for a, b in zip(out, ref))
    chw = dec.decode_chw(datas, "cuda", jpeg=hints)
    assert all(torch.equal(a.permute(1, 2, 0), b) for a, b in zip(chw, ref))


@pytest.mark.torchvision
def test_nvjpeg_damaged_image_among_grayscale_names_its_place_in_the_batch():
    datas = [jpeg(photo(2), gray=True), jpeg(photo(1)), jpeg(photo(5), gray=True)[:200]]
    dec = _nvjpeg_on_cpu()
    with pytest.raises(DecodeError) as ei:
        dec.decode(datas, "cuda", ["g.jpg", "c.jpg", "cut.jpg"])
    assert ei.value.position == 2 and ei.value.key == "cut.jpg"


@pytest.mark.torchvision
def test_nvjpeg_ragged_batch_with_grayscale_equals_libjpeg_turbo():
    datas = [jpeg(photo(1)), jpeg(photo(2), gray=True), jpeg(photo(3), subsampling=0)]
    dec = _nvjpeg_on_cpu()
    rb = dec.decode_ragged(datas, "cuda")
    ref = TurboJpegDecoder(1).decode(datas, "cpu")
    assert dec.routed_cpu == 1 and rb.sizes.tolist() == [list(t.shape[:2]) for t in ref]
    for (off, h, w), t in zip(rb.index.tolist(), ref):
        assert torch.equal(rb.data[off:off + h * w * 3].view(h, w, 3), t)


_STALLED_BATCH = """
import time, torch
from readers.gpu.engine import EngineDecoder
from tests.jpeg_kinds import jpeg, photo
data = [jpeg(photo(i, 64, 80)) for i in range(4)]
dec = EngineDecoder("cuda", threads=2, hardware_share=0.0)
t0 = time.monotonic()
try:
    dec.decode(data)
    print("NO ERROR")
except RuntimeError as exc:
    print("ERROR", round(time.monotonic() - t0, 1), exc)
try:
    dec.decode(data)
    print("SECOND BATCH DECODED")
except RuntimeError as exc:
    print("REFUSED", exc)
"""


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_a_stalled_batch_raises_naming_where_it_stopped(require_engine):
    """The watchdog: a batch whose threads stall (PACKER_ENGINE_TEST_STALL_S) is an error naming the
    stage and each thread's call within PACKER_ENGINE_TIMEOUT_S, the engine refuses more batches,
    and the process exits (the stuck engine is kept, never freed under its threads)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PACKER_ENGINE_TIMEOUT_S="3", PACKER_ENGINE_TEST_STALL_S="8")
    p = subprocess.run([sys.executable, "-c", _STALLED_BATCH], env=env, capture_output=True, text=True, timeout=100)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    line = next(x for x in p.stdout.splitlines() if x.startswith(("ERROR", "NO ERROR")))
    assert line.startswith("ERROR"), out
    took = float(line.split()[1])
    assert 2.5 <= took < 8, out  # the watchdog fired, not the end of the stall
    assert "did not finish within 3 s" in line and "the threads' nvJPEG decode" in line, line
    assert "in nvjpegDecodeJpegHost" in line, line
    assert "hardware threads: idle" in line or "hardware threads: none" in line, line  # none: share 0
    assert "REFUSED" in p.stdout and "stopped after a batch that did not finish" in p.stdout, out


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_nvjpeg_decoder_decodes_grayscale_right_on_the_gpu(require_cuda):
    """torchvision's batched GPU decode (the fallback of "auto") sends grayscale JPEGs through the
    hardware engine, whose RGB of them is wrong; NvJpegDecoder routes them to libjpeg-turbo. Every
    kind of KINDS, list and ragged paths, against libjpeg-turbo."""
    from readers.gpu import NvJpegDecoder

    datas = _batch()
    keys = [f"k{i}" for i in range(len(datas))]
    turbo = TurboJpegDecoder(1).decode(datas, "cpu")
    dec = NvJpegDecoder()
    listed = dec.decode(datas, "cuda", keys)
    ragged = dec.decode_ragged(datas, "cuda", keys).unbind()
    for name, out in (("list", listed), ("ragged", ragged)):
        assert len(out) == len(turbo)
        for i, (a, t) in enumerate(zip(out, turbo)):
            assert a.is_cuda and a.shape == t.shape, (name, i, a.shape, t.shape)
            mean, p99, _ = _diff(a, t)
            assert mean < 2.5 and p99 <= 12, (name, i, mean, p99)


# -- ROI: only the crop windows decoded ------------------------------------------------------------
def test_windows_are_clipped_as_the_engine_clips_them():
    from readers.gpu.engine import _regions_tensor, _window

    img = np.arange(10 * 12 * 3, dtype=np.uint8).reshape(10, 12, 3)
    assert _window(img, (2, 3, 4, 5)).shape == (4, 5, 3) and np.array_equal(_window(img, (2, 3, 4, 5)),
                                                                          img[2:6, 3:8])
    assert _window(img, (8, 9, 6, 6)).shape == (2, 3, 3)   # reaches outside: clipped
    assert _window(img, (-2, -1, 4, 4)).shape == (2, 3, 3)  # starts before the image: clipped
    assert _window(img, (20, 0, 3, 3)) is img               # nothing of it inside: the whole image
    assert _window(img, (0, 0, 0, 5)) is img                # no window
    assert _regions_tensor(None, 2) is None and _regions_tensor([None, None], 2) is None
    assert _regions_tensor([(1, 2, 3, 4), None], 2).tolist() == [[1, 2, 3, 4], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="3 regions for 2 images"):
        _regions_tensor([(0, 0, 1, 1)] * 3, 2)


def test_fallback_decode_is_cut_to_its_window():
    from gpu_ops import RaggedBatch
    from readers.gpu import engine as eng

    datas = [jpeg(photo(1, 16, 24)), jpeg(photo(2, 20, 30))]
    bufs = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    rows = torch.tensor([[0, 0, len(datas[0])], [1, 0, len(datas[1])]])
    turbo = TurboJpegDecoder(1).decode(datas, "cpu")
    regions = torch.tensor([[0, 0, 0, 0], [5, 7, 9, 11]])
    good = turbo[0].flatten()
    batch = RaggedBatch(data=torch.cat([good, torch.zeros(9 * 11 * 3, dtype=torch.uint8)]),
                        index=torch.tensor([[0, 16, 24], [good.numel(), 9, 11]]),
                        sizes=torch.tensor([[16, 24], [9, 11]]), channels=3, layout="HWC")
    status = torch.tensor([eng.STATUS_OK, eng.STATUS_DECODE_FAILED], dtype=torch.int32)
    out = _decoder_without_engine()._repair(batch, [1], status, ["", "decode: nvJPEG bad JPEG"], bufs, rows,
                                            ["a", "b"], regions)
    assert out is batch and torch.equal(out.unbind()[1], turbo[1][5:14, 7:18])


class _WindowEngine(TurboJpegDecoder):
    """The engine's Python contract on the CPU (a stand-in: no GPU here): submit_parts/collect with
    ``regions``, windows clipped as engine.cpp clips them, one ragged batch out."""

    name = "engine"
    supports_roi = True

    def __init__(self):
        super().__init__(1)
        self.submitted = []

    def submit_parts(self, buffers, parts, keys=None, regions=None):
        from readers.gpu.engine import _regions_tensor

        datas = [buffers[int(b)][int(o):int(o) + int(n)] for b, o, n in torch.as_tensor(parts).tolist()]
        self.submitted.append(regions)
        return datas, keys, _regions_tensor(regions, len(datas))

    def collect(self, pending):
        from gpu_ops import RaggedBatch
        from readers.gpu.engine import _window

        datas, keys, win = pending
        host = self.decode_host(datas, keys)
        if win is not None:
            host = [_window(a, r) for a, r in zip(host, win.tolist())]
        return RaggedBatch.from_list([torch.from_numpy(np.ascontiguousarray(a)) for a in host])

    def decode_parts(self, buffers, parts, keys=None, regions=None):
        return self.collect(self.submit_parts(buffers, parts, keys, regions))

    def decode_ragged(self, datas, device=None, keys=None, regions=None):
        bufs = [torch.frombuffer(bytearray(bytes(d.numpy()) if isinstance(d, torch.Tensor) else d), dtype=torch.uint8)
                for d in datas]
        return self.decode_parts(bufs, [(i, 0, b.numel()) for i, b in enumerate(bufs)], keys, regions)


@pytest.mark.timeout(120)
def test_loader_hands_the_engine_its_windows_and_crops_what_was_decoded(store):
    from readers.gpu.loader import batch_seed
    from readers.gpu.roi import roi_plan

    pipe = TrainPipeline(48, scale=(0.2, 1.0), antialias=False)
    dec = _WindowEngine()
    with GPULoader(store, pipe, batch_size=5, device="cpu", decoder=dec, seed=4) as loader:
        got = [(b.images, b.indices) for b in loader]
        seed, epoch = loader.seed, loader.epoch
    assert got and len(dec.submitted) == len(got) and all(r is not None and all(r) for r in dec.submitted)
    with open_store(store) as r:
        for images, indices in got:  # the reference: whole decode, windows cut, the plan's boxes
            raw = read_raw(r, list(indices))
            plan = roi_plan(pipe, dec, raw, batch_seed(seed, epoch - 1 if epoch else epoch, raw.indices))
            full = TurboJpegDecoder(1).decode(raw.datas(), "cpu")
            crops = [f[t:t + h, l:l + w] for f, (t, l, h, w) in zip(full, plan.regions)]
            want = pipe(crops, generator=plan.generator, params=plan.params)
            assert torch.equal(images, want)


@pytest.mark.timeout(120)
def test_a_stored_size_larger_than_the_image_gives_a_clipped_window_not_a_crash(store):
    dec = _WindowEngine()
    with GPULoader(store, TrainPipeline(32, scale=(0.9, 1.0)), batch_size=4, device="cpu", decoder=dec,
                   seed=1) as loader:
        _edit_reads(loader, lambda raw, n: setattr(raw, "sizes", raw.sizes * 2))  # hand-edited: sizes doubled
        out = [b.images for b in loader]
    assert out and all(x.shape[1:] == (3, 32, 32) and bool(torch.isfinite(x).all()) for x in out)


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("share", [0.0, 1.0, -1.0], ids=["threads", "hardware", "balanced"])
def test_engine_decodes_only_the_windows(require_engine, share):
    datas = _batch()
    n = len(datas)
    whole = EngineDecoder("cuda", threads=3, hardware_share=share).decode(datas, "cuda")
    shapes = [tuple(t.shape[:2]) for t in whole]
    g = torch.Generator().manual_seed(5)
    regions = []
    for i, (h, w) in enumerate(shapes):
        if i == n - 2:
            regions.append((h - 3, w - 4, 50, 60))  # reaches outside: clipped to 3 x 4
        elif i == n - 3:
            regions.append(None)  # this one whole
        else:
            rh, rw = max(1, int(h * (0.3 + 0.6 * torch.rand(1, generator=g)))), max(1, int(w * 0.5))
            t = int(torch.randint(0, h - rh + 1, (1,), generator=g))
            l = int(torch.randint(0, w - rw + 1, (1,), generator=g))
            regions.append((t, l, rh, rw))
    dec = EngineDecoder("cuda", threads=3, hardware_share=share, roi=True)
    out = dec.decode(datas, "cuda", [f"k{i}" for i in range(n)], regions=regions)
    turbo = TurboJpegDecoder(1).decode(datas, "cpu")
    for i, (a, full, t, r) in enumerate(zip(out, whole, turbo, regions)):
        if r is None:
            want, ref = full, t
        else:
            top, left, h, w = r
            want, ref = full[top:top + h, left:left + w], t[top:top + h, left:left + w]
        assert tuple(a.shape) == tuple(want.shape), (i, a.shape, want.shape)
        mean, p99, mx = _diff(a, want)  # the window of the engine's own whole decode
        assert mean < 0.5 and p99 <= 4, (i, share, mean, p99, mx)
        assert _diff(a, ref)[0] < 2.5, (i, share)
    assert dec.fallbacks == 0
    print(f"share {share}: {dec.stats}, hardware {dec.hardware}, failures {dec.hardware_failures}")
    if share == 1.0 and dec.hardware:  # windows on the hardware engine (nvjpegDecodeBatchedEx)
        assert dec.stats["hardware"] >= 3 and dec.hardware_failures == 0, (dec.stats, dec.hardware_error)


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_loader_with_engine_windows_matches_full_decode(store, require_engine):
    outs = {}
    for name, dec in (("roi", EngineDecoder("cuda", threads=3, roi=True)), ("turbojpeg", "turbojpeg")):
        with GPULoader(store, TrainPipeline(64, scale=(0.3, 1.0), antialias=False), batch_size=6, device="cuda",
                       decoder=dec, seed=3, threads=3) as loader:
            outs[name] = [b.images for b in loader]
    assert len(outs["roi"]) == len(outs["turbojpeg"]) > 1
    for a, b in zip(outs["roi"], outs["turbojpeg"]):
        d = (a - b)[:, :, 2:-2, 2:-2].abs()
        assert float(d.mean()) < 0.05, float(d.mean())  # decoder differences only (normalised units)


@pytest.mark.timeout(120)
def test_a_damaged_record_among_windows_is_skipped_and_the_rest_keep_their_crops(store, caplog):
    with open_store(store) as r:
        n = r.metadata.count
    dec = _WindowEngine()
    with GPULoader(store, TrainPipeline(24), batch_size=4, device="cpu", decoder=dec, on_error="skip",
                   seed=2) as loader:
        calls = _edit_reads(loader, _cut_second_batch)
        out = [b.images for b in loader]
    assert loader.skipped == 1 and sum(x.shape[0] for x in out) == n - 1 and calls[1][2] in caplog.text
    assert all(x.shape[1:] == (3, 24, 24) and bool(torch.isfinite(x).all()) for x in out)
    # Every batch was handed its windows, and the one decoded again without the damaged record
    # got windows for its three remaining records.
    sizes = [len(r) for r in dec.submitted if r is not None]
    assert sorted(sizes) == sorted([min(4, n - s) for s in range(0, n, 4)] + [3]), sizes
