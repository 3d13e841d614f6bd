"""Routing by what the store knows (JPEG coding + subsampling parsed at build), backend selection,
ROI plans, and (``cuda``-marked, on a GPU with nvImageCodec) the nvImageCodec decoder itself.

The CUDA tests skip without nvImageCodec unless PACKER_REQUIRE_NVIMGCODEC=1 (then they fail)."""
from __future__ import annotations

import logging
import os

import pytest
import torch

import packer
from packer.core.errors import DependencyError, RecordError
from packer.core.integrity import chroma_subsampling, parse_jpeg_structure
from packer.core.records import Record
from packer.sample import make_dataset
from packer.stores import open_store
from readers.gpu import GPULoader, NvJpegDecoder, TrainPipeline, TurboJpegDecoder, get_decoder, read_raw
from readers.gpu import nvimgcodec as nvi_mod
from readers.gpu.nvimgcodec import route, sniff_jpeg
from readers.gpu.roi import oriented_sizes, roi_plan
from tests.gpu_ops_helpers import require_cuda  # noqa: F401 (fixture)
from tests.jpeg_kinds import KINDS, jpeg, photo


@pytest.fixture(scope="module")
def kinds_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    for n, (name, (make, _, _)) in enumerate(KINDS.items()):
        p = d / "img" / f"c{n % 2}" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(make(n))
    loc = str(d / "kinds.lmdb")
    assert packer.build(d / "img", None, loc, "lmdb", workers=1).ok
    return loc


# -- what the build records ------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(KINDS))
def test_sof_parse_gives_coding_and_subsampling(name):
    make, coding, sub = KINDS[name]
    data = make(0)
    info = parse_jpeg_structure(data)
    assert (info.sof, info.subsampling) == (coding, sub)
    assert sniff_jpeg(data) == (coding, sub)
    assert sniff_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8)) == (coding, sub)


def test_chroma_subsampling_names():
    assert chroma_subsampling(((2, 2), (1, 1), (1, 1))) == "420"
    assert chroma_subsampling(((1, 2), (1, 1), (1, 1))) == "440"
    assert chroma_subsampling(((4, 1), (1, 1), (1, 1))) == "411"
    assert chroma_subsampling(((1, 1),)) == "gray"
    assert chroma_subsampling(((1, 1), (1, 1), (1, 1), (1, 1))) == "other"  # CMYK
    assert chroma_subsampling(((2, 2), (1, 1), (2, 1))) == "other"  # chroma planes differ
    assert chroma_subsampling(((3, 1), (2, 1), (2, 1))) == "other"


@pytest.mark.timeout(120)
def test_build_stores_coding_and_subsampling_under_the_record_checksum(kinds_store):
    with open_store(kinds_store) as r:
        recs = [r.get(i) for i in range(r.metadata.count)]
        raw = read_raw(r, list(range(r.metadata.count)))
    by_name = {rec.key.split("/")[-1]: rec for rec in recs}
    for name, (_, coding, sub) in KINDS.items():
        assert (by_name[name].coding, by_name[name].subsampling) == (coding, sub), name
        assert by_name[name].meta_ok()
    assert raw.jpeg == [(rec.coding, rec.subsampling) for rec in recs]
    rec = by_name["prog420.jpg"]
    rec.coding = "baseline"  # a flipped field is caught by the record checksum
    assert not rec.meta_ok()


@pytest.mark.timeout(120)
def test_old_stores_without_the_fields_still_read_and_route(tmp_path, monkeypatch):
    images, _ = make_dataset(tmp_path / "ds", 6, kind="classes", seed=1)
    loc = str(tmp_path / "old.lmdb")
    with monkeypatch.context() as m:  # write records as stores did before the fields existed
        m.setattr(Record, "OPTIONAL_META_FIELDS", ())
        assert packer.build(images, None, loc, "lmdb", workers=1).ok
    with open_store(loc) as r:
        rec = r.get(0)
        assert (rec.coding, rec.subsampling) == ("", "") and rec.meta_ok()
        assert "coding" not in rec.meta_dict()
        raw = read_raw(r, list(range(r.metadata.count)))  # checked read passes
    assert raw.jpeg == [("", "")] * len(raw)
    # the routing falls back to the bytes' frame header
    want = []
    for d in raw.datas():
        info = parse_jpeg_structure(bytes(d))
        want.append(route(info.sof, info.subsampling))
    assert [route(*sniff_jpeg(d)) for d in raw.datas()] == want and "hw" in want


def test_route():
    assert route("baseline", "420") == "hw"
    assert route("baseline", "gray") == "cpu"  # see nvimgcodec._GPU_SUBSAMPLING
    assert route("progressive", "422") == "cuda"
    assert route("extended", "444") == "cuda"
    assert route("arithmetic", "420") == "cpu"
    assert route("lossless", "420") == "cpu"
    assert route("baseline", "other") == "cpu"
    assert route("", "") == ""


def test_sniff_on_garbage_says_unknown():
    assert sniff_jpeg(b"not a jpeg at all") == ("", "")
    assert sniff_jpeg(b"\xff\xd8\xff\xe0\x00\x10JFIF") == ("", "")  # truncated before any SOF


# -- backend selection -----------------------------------------------------------------------------
def test_auto_backend_on_cpu_is_libjpeg_turbo(caplog):
    with caplog.at_level(logging.INFO, logger="readers.gpu.decoders"):
        dec = get_decoder("auto", "cpu")
    assert isinstance(dec, TurboJpegDecoder) and dec.name == "turbojpeg"
    assert "decoder: turbojpeg" in caplog.text


@pytest.mark.torchvision
def test_auto_backend_order(monkeypatch, caplog):
    from gpu_ops import engine as native

    with caplog.at_level(logging.INFO, logger="readers.gpu.decoders"):
        dec = get_decoder("auto", "cuda")
    if native.status()["available"]:  # the native engine first (tests/readers/test_gpu_engine.py)
        assert dec.name == "engine" and "decoder: engine" in caplog.text
        monkeypatch.setattr(native, "load", lambda: None)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="readers.gpu.decoders"):
            dec = get_decoder("auto", "cuda")
    assert isinstance(dec, NvJpegDecoder) and dec.name == "nvjpeg"  # torchvision imports here
    assert "decoder: nvjpeg" in caplog.text and "native engine unavailable" in caplog.text
    monkeypatch.setitem(__import__("sys").modules, "torchvision.io", None)  # without torchvision:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="readers.gpu.decoders"):
        dec = get_decoder("auto", "cuda")
    assert "torchvision nvJPEG unavailable" in caplog.text
    assert dec.name == ("nvimgcodec" if nvi_mod.available() else "turbojpeg")

    def missing():
        raise DependencyError("nvImageCodec is not installed")

    monkeypatch.setattr(nvi_mod, "_module", missing)  # and without nvImageCodec either
    with caplog.at_level(logging.INFO, logger="readers.gpu.decoders"):
        assert get_decoder("auto", "cuda").name == "turbojpeg"
    assert "GPU decode unavailable" in caplog.text


def test_explicit_nvimgcodec_without_it_says_what_to_install(monkeypatch):
    if nvi_mod.available():
        pytest.skip("nvImageCodec and a GPU are here")
    with pytest.raises(DependencyError, match="nvimgcodec|CUDA"):
        get_decoder("nvimgcodec", "cuda")


@pytest.mark.timeout(120)
def test_loader_says_which_decoder(kinds_store):
    with GPULoader(kinds_store, None, batch_size=2, device="cpu") as loader:
        assert loader.decoder.name == "turbojpeg"
        assert sum(len(b.images) for b in loader) == len(KINDS)


# -- ROI plans -------------------------------------------------------------------------------------
class _RoiCapable(TurboJpegDecoder):
    """libjpeg-turbo marked as ROI-capable, so the plan logic runs on the CPU; decoding the window
    is done by cropping the full decode (what nvImageCodec's ROI decode returns)."""

    supports_roi = True


@pytest.mark.timeout(120)
def test_roi_plan_gives_the_same_batch_as_full_decode(kinds_store):
    with open_store(kinds_store) as r:
        raw = read_raw(r, list(range(r.metadata.count)))
    raw.orientations[1] = 6  # one image still to rotate: decoded whole, box drawn on the rotated size
    pipe = TrainPipeline(64, scale=(0.3, 1.0), antialias=False)
    plan = roi_plan(pipe, _RoiCapable(1), raw, seed=11)
    assert plan is not None and plan.regions[1] is None
    assert all(r is not None for i, r in enumerate(plan.regions) if i != 1)
    full = [torch.from_numpy(a) for a in TurboJpegDecoder(1).decode_host(raw.datas())]
    full[1] = full[1].transpose(0, 1).flip(1).contiguous()  # orientation 6, as the loader applies it
    assert torch.equal(oriented_sizes(raw.sizes, raw.orientations)[1], torch.tensor(full[1].shape[:2]))
    crops = [im if box is None else im[box[0]:box[0] + box[2], box[1]:box[1] + box[3]].contiguous()
             for im, box in zip(full, plan.regions)]
    a = pipe(crops, generator=plan.generator, params=plan.params)
    b = pipe(full, generator=torch.Generator().manual_seed(11))
    assert a.shape == b.shape
    # Same boxes and flips; only the outermost output pixels may differ (the filter clamps at the
    # window's edge instead of reading the pixels beyond it).
    inner = (a - b)[:, :, 2:-2, 2:-2].abs()
    assert float(inner.max()) < 1e-3, float(inner.max())
    assert float((a - b).abs().mean()) < 0.05


class _Recording(TurboJpegDecoder):
    """libjpeg-turbo that records what the loader passes (the real decode still runs); like the
    nvImageCodec decoder it stands in for, no ``decode_ragged``."""

    seen: list = []
    decode_ragged = None

    def routes(self, datas, jpeg=None):
        return ["cpu"] * len(datas)

    def decode(self, datas, device, keys=None, **kwargs):
        self.seen.append(kwargs)
        out = super().decode(datas, device, keys)
        regions = kwargs.get("regions")
        return out if regions is None else [t[r[0]:r[0] + r[2], r[1]:r[1] + r[3]].contiguous() for t, r in
                                            zip(out, regions)]


@pytest.mark.timeout(120)
def test_loader_hands_store_facts_and_regions_to_the_decoder(kinds_store):
    dec = _Recording(1)
    with GPULoader(kinds_store, TrainPipeline(32), batch_size=5, device="cpu", decoder=dec) as loader:
        assert [tuple(b.images.shape) for b in loader] == [(5, 3, 32, 32)]
    assert dec.seen[-1]["jpeg"] == [(KINDS[k.split("/")[-1]][1], KINDS[k.split("/")[-1]][2]) for k in
                                    sorted(f"c{n % 2}/{name}" for n, name in enumerate(KINDS))]
    assert "regions" not in dec.seen[-1]  # no ROI unless the decoder offers it
    dec.supports_roi = True
    with GPULoader(kinds_store, TrainPipeline(32), batch_size=5, device="cpu", decoder=dec) as loader:
        list(loader)
    assert len(dec.seen[-1]["regions"]) == 5


def test_roi_plan_only_for_train_pipeline_and_roi_decoders(kinds_store):
    with open_store(kinds_store) as r:
        raw = read_raw(r, [0, 1])
    assert roi_plan(TrainPipeline(32), TurboJpegDecoder(1), raw, 0) is None
    assert roi_plan(TrainPipeline(32), _RoiCapable(1), raw, 0) is not None
    assert roi_plan(None, _RoiCapable(1), raw, 0) is None


# -- the nvImageCodec decoder (GPU) ----------------------------------------------------------------
@pytest.fixture
def require_nvimgcodec(require_cuda):
    if not nvi_mod.available():
        if os.environ.get("PACKER_REQUIRE_NVIMGCODEC") == "1":
            pytest.fail("PACKER_REQUIRE_NVIMGCODEC=1 but nvImageCodec does not import")
        pytest.skip("needs nvImageCodec (pip install 'packer-vision[nvimgcodec]')")


def _close_to_turbo(out, datas):
    ref = TurboJpegDecoder(1).decode(datas, "cpu")
    for a, b in zip(out, ref):
        assert a.is_cuda and a.dtype == torch.uint8 and a.shape == b.shape, (a.shape, b.shape)
        d = (a.cpu().float() - b.float()).abs()
        assert float(d.mean()) < 1.5 and float(d.quantile(0.99)) <= 12, (float(d.mean()), float(d.max()))


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_nvimgcodec_equals_libjpeg_turbo_and_routes_by_store(kinds_store, require_nvimgcodec):
    with open_store(kinds_store) as r:
        raw = read_raw(r, list(range(r.metadata.count)))
    dec = get_decoder("nvimgcodec", "cuda")
    assert dec.name == "nvimgcodec"
    out = dec.decode(raw.datas(), "cuda", raw.keys, jpeg=raw.jpeg)
    _close_to_turbo(out, raw.datas())
    n_prog = sum(1 for c, _ in raw.jpeg if c == "progressive")
    n_gray = sum(1 for _, s in raw.jpeg if s == "gray")
    assert dec.routed["cuda"] == n_prog and dec.routed["hw"] == len(raw) - n_prog - n_gray
    assert dec.routed["cpu"] == n_gray
    assert dec.fallbacks == 0
    for hw_load in (0.0, 0.65, 1.0):  # hybrid alone / split / the hardware engine alone
        _close_to_turbo(nvi_mod.NvImageCodecDecoder(hw_load=hw_load).decode(raw.datas(), "cuda"), raw.datas())


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_nvimgcodec_roi_decodes_the_window(kinds_store, require_nvimgcodec):
    with open_store(kinds_store) as r:
        raw = read_raw(r, list(range(r.metadata.count)))
    boxes = [(8, 16, 50, 70), (0, 0, 120, 160), (33, 41, 17, 23), (64, 80, 56, 80), (1, 2, 3, 4)]
    dec = nvi_mod.NvImageCodecDecoder(roi=True)
    out = dec.decode(raw.datas(), "cuda", raw.keys, regions=boxes, jpeg=raw.jpeg)
    # Every window is decoded by nvImageCodec (as a window, or whole and cut), none by the CPU fallback.
    assert dec.fallbacks == 0, (dec.fallbacks, dec.roi_retries, dict(dec.routed))
    full = TurboJpegDecoder(1).decode(raw.datas(), "cpu")
    for img, f, (t, l, h, w) in zip(out, full, boxes):
        assert tuple(img.shape) == (h, w, 3)
        d = (img.cpu().float() - f[t:t + h, l:l + w].float()).abs()
        assert float(d.mean()) < 2.5, float(d.mean())


@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_nvimgcodec_cpu_route_fallback_and_corrupt_record(kinds_store, require_nvimgcodec, caplog):
    with open_store(kinds_store) as r:
        raw = read_raw(r, list(range(r.metadata.count)))
    dec = nvi_mod.NvImageCodecDecoder()
    # A record the store says the GPU decoders do not take (e.g. arithmetic-coded, CMYK-like
    # sampling) is decoded by libjpeg-turbo, routed before decoding.
    hints = list(raw.jpeg)
    hints[0], hints[3] = ("arithmetic", "420"), ("baseline", "other")
    out = dec.decode(raw.datas(), "cuda", raw.keys, jpeg=hints)
    n_gray = sum(1 for i, (_, s) in enumerate(raw.jpeg) if s == "gray" and i not in (0, 3))
    assert dec.routed["cpu"] == 2 + n_gray and dec.fallbacks == 0
    _close_to_turbo(out, raw.datas())
    # Corrupt bytes: nvImageCodec refuses them, libjpeg-turbo too -> DecodeError with the key.
    bad = raw.datas()[2][:300].clone()
    with pytest.raises(Exception) as ei:
        dec.decode([raw.datas()[0], bad], "cuda", ["ok.jpg", "cut.jpg"])
    assert getattr(ei.value, "key", None) == "cut.jpg", repr(ei.value)


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_loader_with_nvimgcodec_roi_matches_full_decode(kinds_store, require_nvimgcodec):
    outs = {}
    for dec in (nvi_mod.NvImageCodecDecoder(roi=True), "turbojpeg"):
        with GPULoader(kinds_store, TrainPipeline(64, scale=(0.3, 1.0), antialias=False), batch_size=5,
                       device="cuda", decoder=dec, seed=3) as loader:
            name = getattr(dec, "name", dec)
            assert loader.decoder.name == name
            outs[name] = [b.images for b in loader]
    for a, b in zip(outs["nvimgcodec"], outs["turbojpeg"]):
        d = (a - b)[:, :, 2:-2, 2:-2].abs()
        assert float(d.mean()) < 0.05, float(d.mean())  # decoder differences only (normalised units)

    with GPULoader(kinds_store, TrainPipeline(64), batch_size=5, device="cuda", decoder="nvimgcodec") as loader:
        raw = loader.reader.read([0])
    assert raw.jpeg[0][0] in ("baseline", "progressive")


@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_loader_corrupt_record_names_its_key(tmp_path, require_nvimgcodec):
    # A record whose bytes pass the checksum but do not decode (stored damaged with check off):
    # the loader raises RecordError naming the key.
    d = tmp_path / "img" / "c0"
    d.mkdir(parents=True)
    for i in range(3):
        (d / f"{i}.jpg").write_bytes(jpeg(photo(i)))
    loc = str(tmp_path / "s.lmdb")
    assert packer.build(tmp_path / "img", None, loc, "lmdb", workers=1).ok
    with GPULoader(loc, TrainPipeline(32), batch_size=3, device="cuda", decoder="nvimgcodec") as loader:
        real = loader.reader.read

        def damaged(idx):
            raw = real(idx)
            b, o, n = raw.parts[1]
            raw.parts[1] = (b, o, 300)  # the second record cut short after the checksum check
            return raw

        loader.reader.read = damaged
        with pytest.raises(RecordError) as ei:
            list(loader)
    assert ei.value.key.endswith("1.jpg")
