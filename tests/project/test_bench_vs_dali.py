"""scripts/bench_vs_dali.py without a GPU: its decode rows drive a decoder through the decoder
contract's flags (a decoder's methods all exist; session 18's rows called ``decode_ragged(jpeg=)``
on the engine, which takes no JPEG facts, and every native_decode row failed on the GPU), and its
table adds the decode's ceiling (the hardware engine alone plus the threads alone)."""
import sys

import pytest

from tests import REPO

sys.path.insert(0, str(REPO / "scripts"))
bench = pytest.importorskip("bench_vs_dali")

from readers.gpu.decoders import Decoder  # noqa: E402


class _Ragged(Decoder):
    """Decodes ragged batches and takes no JPEG facts, like the native engine."""
    name = "fake-ragged"

    def __init__(self):
        self.calls, self.closed = [], False

    def decode(self, datas, device, keys=None):
        raise AssertionError("decode_ragged is the one to call")

    def decode_ragged(self, datas, device, keys=None):   # no jpeg=: a call passing it fails
        self.calls.append(len(datas))
        return datas

    def close(self):
        self.closed = True


class _Facts(Decoder):
    """Decodes lists and takes the store's JPEG facts."""
    name = "fake-facts"

    def __init__(self):
        self.jpeg = []

    def decode(self, datas, device, keys=None, jpeg=None):
        self.jpeg.append(jpeg)
        return datas

    def routes(self, datas, jpeg=None):
        return ["cpu"] * len(datas)


def test_decode_rows_call_what_the_decoder_implements():
    datas, jpeg = [b"a", b"b", b"c", b"d"], [("baseline", "420")] * 4
    plan = [[0, 1], [2, 3], [1, 2]]
    ragged = _Ragged()
    n, _, out = bench.packer_decode(datas, jpeg, plan, ragged)
    assert n == 6 and ragged.calls == [2, 2, 2] * 2 and ragged.closed    # 3 warm-up (as DALI's) + 3 timed
    facts = _Facts()
    n, _, _ = bench.packer_decode(datas, jpeg, plan, facts)
    assert n == 6 and facts.jpeg[3:] == [[("baseline", "420")] * 2] * 3


def test_the_table_prints_the_decode_ceiling():
    rows = [{"set": "hd", "threads": 16, "row": f"native_decode={s}", "img_s": v}
            for s, v in (("-1", 6000), ("-1", 6400), ("-1", 5800), ("0", 3400), ("1", 5600))]
    rows += [{"set": "hd", "threads": 16, "row": "dali_decode", "img_s": 7000},
             {"set": "hd", "threads": 16, "row": "native_decode=1", "img_s": 5800}]
    line = [x for x in bench._ratios(rows, [16]) if x.startswith("| hd")][0].split(" | ")
    assert line[6:] == ["native_decode=-1", "6,000 (5,800-6,400)", "7,000 (7,000-7,000)", "0.86x",
                        "9,100 (5,700 + 3,400)", "0.66 |"]


def test_the_engine_rows_keep_two_batches_in_flight():
    """submit the next batch, then collect this one (as the loader does); every batch collected."""
    class Submits:
        def __init__(self):
            self.log = []

        def submit(self, ds):
            self.log.append(("submit", len(ds)))
            return len(self.log)

        def collect(self, ticket):
            self.log.append(("collect", ticket))

    dec = Submits()
    assert bench.two_in_flight(dec, [[1, 2], [3], [4, 5, 6]]) == 6
    assert dec.log == [("submit", 2), ("submit", 1), ("collect", 1), ("submit", 3), ("collect", 2), ("collect", 4)]
