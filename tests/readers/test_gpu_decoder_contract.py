"""The decoder contract (readers/gpu/decoders.py) and the decode dispatch (readers/gpu/roi.py).

A decoder subclasses ``Decoder``: ``name`` and ``decode`` are required, everything else has a "not
supported" default, and the capability flags the dispatch reads come from the methods a decoder
implements. The dispatch reads those flags and nothing else of the decoder (no probing with
getattr). Runs on the CPU.
"""
from __future__ import annotations

import re

import pytest
import torch

import gpu_ops
import packer
from packer.core.integrity import turbo_decode
from readers.gpu import GPULoader, TrainPipeline, TurboJpegDecoder, available_decoders
from readers.gpu import decoders as decoders_mod
from readers.gpu.decoders import CAPABILITIES, Decoder, adopt, as_array
from readers.gpu.roi import decode_batch, submit_batch
from readers.raw import read_raw
from tests import REPO
from tests.corpus import class_store

pytestmark = pytest.mark.timeout(120)



@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return class_store(tmp_path_factory.mktemp("contract"), 7, seed=8)


def _raw(store, indices):
    with packer.open_store(store) as r:
        return read_raw(r, list(indices))


class Toy(Decoder):
    """Only what the contract requires: a name and ``decode`` (libjpeg-turbo, one image at a time)."""

    name = "toy"

    def __init__(self):
        self.calls = []

    def decode(self, datas, device, keys=None):
        self.calls.append(len(datas))
        return [torch.from_numpy(turbo_decode(as_array(d), pixel_format="rgb", strict=True)).to(device)
                for d in datas]


def _batches(store, decoder, pipeline):
    with GPULoader(store, pipeline, batch_size=3, device="cpu", decoder=decoder, seed=5, shuffle=True,
                   threads=1) as loader:
        return [(b.images, b.labels, b.keys) for b in loader]


def test_the_contract_defaults_say_not_supported():
    toy = Toy()
    assert (toy.supports_roi, toy.decodes_ragged, toy.decodes_parts, toy.submits, toy.takes_jpeg) == (False,) * 5
    for call in (lambda: toy.decode_ragged([], "cpu"), lambda: toy.decode_parts([], []),
                 lambda: toy.submit_parts([], []), lambda: toy.collect(None), lambda: toy.routes([])):
        with pytest.raises(NotImplementedError, match="decoder 'toy' does not support"):
            call()
    assert toy.bind_pipeline(TrainPipeline(8), "cpu") is None and toy.close() is None
    assert isinstance(Toy.from_settings(torch.device("cpu"), 2), Toy)
    with pytest.raises(NotImplementedError, match="must implement decode"):
        type("NoDecode", (Decoder,), {"name": "x"})().decode([], "cpu")


def test_every_registered_decoder_declares_the_contract_and_its_flags_match_its_methods():
    names = [n for n in available_decoders() if n != "auto"]
    assert {"turbojpeg", "cpu-crops", "nvjpeg", "nvimgcodec", "split", "engine"} <= set(names)
    for name in names:
        cls = decoders_mod._decoder_class(name)
        assert issubclass(cls, Decoder), name
        for flag, methods in CAPABILITIES.items():
            own = all(getattr(cls, m) is not getattr(Decoder, m) for m in methods)
            assert getattr(cls, flag) == own, (name, flag)
    assert TurboJpegDecoder.decodes_ragged and not TurboJpegDecoder.submits
    assert decoders_mod._decoder_class("engine").submits and decoders_mod._decoder_class("nvjpeg").takes_jpeg


def test_a_toy_decoder_with_only_the_required_parts_feeds_the_loader(store):
    toy = Toy()
    got = _batches(store, toy, TrainPipeline(24, scale=(0.3, 1.0)))
    want = _batches(store, TurboJpegDecoder(1), TrainPipeline(24, scale=(0.3, 1.0)))  # the ragged path
    assert toy.calls and len(got) == len(want) == 3
    for (a, la, ka), (b, lb, kb) in zip(got, want):
        assert ka == kb and torch.equal(la, lb) and a.shape[1:] == (3, 24, 24) and torch.equal(a, b)
    # pipeline=None: the decoded images themselves, through the dispatch's list path
    raw = _raw(store, [0, 1, 2])
    imgs = decode_batch(Toy(), None, raw, seed=0, device="cpu")
    assert isinstance(imgs, list) and raw.roi is None
    for img, d in zip(imgs, raw.datas()):
        assert torch.equal(img, torch.from_numpy(turbo_decode(d.numpy(), pixel_format="rgb")))
    assert submit_batch(Toy(), TrainPipeline(24), raw, seed=0) is None  # it does not submit: decoded now


class _FlagsOff(TurboJpegDecoder):
    """libjpeg-turbo with ``decode_ragged`` and ``routes`` present but declared off."""

    name = "flags-off"
    decodes_ragged = False
    takes_jpeg = False

    def routes(self, datas, jpeg=None):
        raise AssertionError("the dispatch must not route a decoder whose takes_jpeg is False")

    def decode(self, datas, device, keys=None, **kwargs):
        assert not kwargs, kwargs  # neither jpeg= nor regions=
        return super().decode(datas, device, keys)


def test_the_dispatch_reads_the_declared_flags_not_the_methods(store):
    raw = _raw(store, [3, 4])
    dec = _FlagsOff(1)
    assert callable(dec.decode_ragged) and not dec.decodes_ragged
    out = decode_batch(dec, TrainPipeline(16), raw, seed=1, device="cpu")
    assert isinstance(out, list) and len(out) == 2  # the list path, though decode_ragged is there
    on = decode_batch(TurboJpegDecoder(1), TrainPipeline(16), _raw(store, [3, 4]), seed=1, device="cpu")
    assert isinstance(on, gpu_ops.RaggedBatch)
    assert all(torch.equal(a, b) for a, b in zip(out, on.unbind()))
    withdrawn = type("Withdrawn", (TurboJpegDecoder,), {"decode_ragged": None})
    assert not withdrawn.decodes_ragged  # a method set to None withdraws the capability


class _DuckTyped:
    """A decoder object from before the contract: no base class, methods looked up by adopt()."""

    name = "duck"
    supports_roi = False

    def __init__(self):
        self.turbo = TurboJpegDecoder(1)
        self.ragged_calls = 0
        self.closed = False

    def decode(self, datas, device, keys=None):
        return self.turbo.decode(datas, device, keys)

    def decode_ragged(self, datas, device, keys=None):
        self.ragged_calls += 1
        return self.turbo.decode_ragged(datas, device, keys)

    def close(self):
        self.closed = True


def test_a_duck_typed_decoder_object_still_works_through_the_contract(store):
    duck = _DuckTyped()
    wrapped = adopt(duck)
    assert wrapped.decodes_ragged and not (wrapped.submits or wrapped.decodes_parts or wrapped.takes_jpeg)
    assert adopt(wrapped) is wrapped and adopt(Toy()).name == "toy" and wrapped.name == "duck"
    got = _batches(store, duck, TrainPipeline(20))
    want = _batches(store, TurboJpegDecoder(1), TrainPipeline(20))
    assert duck.ragged_calls == len(got) == 3 and duck.closed
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, want))


_CAPABILITY_NAMES = ("decode_parts", "submit_parts", "collect", "decode_ragged", "routes", "supports_roi",
                     "bind_pipeline", "close", "decodes_ragged", "decodes_parts", "submits", "takes_jpeg")


@pytest.mark.parametrize("module", ["readers/gpu/loader.py", "readers/gpu/roi.py", "readers/gpu/__init__.py"])
def test_no_module_of_the_decode_path_probes_a_decoder(module):
    source = (REPO / module).read_text()
    probe = re.compile(r"(getattr|hasattr)\([^()]*[\"'](%s)[\"']" % "|".join(_CAPABILITY_NAMES))
    assert not probe.findall(source), f"{module} probes a decoder: {probe.findall(source)}"
    assert not re.search(r"(getattr|hasattr)\((self\.)?_?decoder\b", source), module
