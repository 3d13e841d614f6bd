"""gpu_ops' records op (``gpu_ops/csrc/cpu/records.cpp``): a batch of records checked against
their XXH3-128 digests and copied back to back into one buffer, in one C++ call with the GIL
released. Checked against the Python ``xxhash`` package (what packer stores) and numpy slicing;
bad arguments raise naming what is wrong; the call lets other Python threads run."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import xxhash

from readers import raw as raw_mod
from tests.gpu_ops_helpers import gather_op_or_skip


@pytest.fixture
def op():
    return gather_op_or_skip()


def _case(seed=0, count=37):
    """Random bytes and ``count`` records in them, apart, in shuffled order: two of them empty,
    one shorter than a hash stripe."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 150_000, count)
    lens[[0, count // 2]] = 0
    lens[count - 1] = 3
    gaps = rng.integers(0, 5_000, count)
    starts = np.cumsum(gaps + lens) - lens
    order = rng.permutation(count)
    data = rng.integers(0, 256, int(starts[-1] + lens[-1] + 100), dtype=np.uint8)
    spans = np.stack([starts, starts + lens], axis=1)[order].astype(np.int64)
    digests = np.stack([np.frombuffer(xxhash.xxh3_128_digest(data[a:b].tobytes()), np.uint8)
                        for a, b in spans.tolist()])
    return torch.from_numpy(data), torch.from_numpy(spans), torch.from_numpy(digests)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [1, 3, 0])
def test_copies_and_checks_like_python(op, threads):
    data, spans, digests = _case()
    want = np.concatenate([data.numpy()[a:b] for a, b in spans.tolist()])
    out = torch.full((want.size + 5,), 7, dtype=torch.uint8)
    bad = op(data, spans, digests, out, threads)
    assert bad.dtype == torch.bool and bad.shape == (37,) and not bad.any()
    assert np.array_equal(out.numpy()[: want.size], want) and (out.numpy()[want.size:] == 7).all()
    assert not op(data, spans, digests, None, threads).any()          # in place: the same verdict
    damaged = digests.clone()
    damaged[[2, 30], 15] ^= 1
    assert op(data, spans, damaged, None, threads).nonzero().flatten().tolist() == [2, 30]
    flipped = data.clone()
    a, b = spans[11].tolist()
    assert b > a
    flipped[(a + b) // 2] ^= 0x40                    # one bit of one record's bytes
    assert op(flipped, spans, digests, out, threads).nonzero().flatten().tolist() == [11]
    copied = torch.zeros(want.size, dtype=torch.uint8)
    assert not op(data, spans, None, copied, threads).any()            # copy only, no check
    assert np.array_equal(copied.numpy(), want)
    empty = op(data, torch.zeros((0, 2), dtype=torch.int64), torch.zeros((0, 16), dtype=torch.uint8), None, threads)
    assert empty.shape == (0,)
    nothing = torch.tensor([[4, 4], [9, 9]])             # empty records, into an empty out inside data
    empty_digest = torch.tensor(list(xxhash.xxh3_128_digest(b"")), dtype=torch.uint8).repeat(2, 1)
    assert op(data, nothing, empty_digest, data[6:6], threads).tolist() == [False, False]


@pytest.mark.timeout(60)
def test_bad_arguments_raise_naming_what_is_wrong(op):
    data, spans, digests = _case(count=4)
    n = data.numel()
    cases = [
        ((data, torch.tensor([[0, n + 1]]), None, None), rf"span 0 \(0, {n + 1}\) lies outside data of {n} bytes"),
        ((data, torch.tensor([[5, 4]]), None, None), "span 0 .* lies outside"),
        ((data, torch.tensor([[-1, 4]]), None, None), "span 0 .* lies outside"),
        ((data.float(), spans, None, None), "data must be a contiguous 1-D CPU uint8 tensor"),
        ((data.view(2, -1), spans, None, None), "data must be"),
        ((data, spans.int(), None, None), r"spans must be a CPU int64 tensor \[B, 2\]"),
        ((data, spans, digests[:3], None), r"digests must be a CPU uint8 tensor \[4, 16\]"),
        ((data, spans, digests, torch.zeros(3, dtype=torch.uint8)), "out holds 3 bytes, the records"),
        ((data, spans, digests, data), "out overlaps data"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            op(*args, 1)
    with pytest.raises(RuntimeError, match="threads >= 0"):
        op(data, spans, None, None, -1)


@pytest.mark.timeout(60)
def test_the_call_lets_other_python_threads_run(op):
    """The hash of ~200 MB runs with the GIL released: a Python thread counts on meanwhile."""
    big = torch.from_numpy(np.random.default_rng(1).integers(0, 256, 200 << 20, dtype=np.uint8))
    spans = torch.tensor([[0, big.numel()]] * 4, dtype=torch.int64)
    digests = torch.zeros((4, 16), dtype=torch.uint8)
    counted, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    before = counted[0]
    bad = op(big, spans, digests, None, 1)
    during = counted[0] - before
    stop.set()
    t.join()
    assert bad.all()                                  # zero digests never match
    assert during > 1000, during


@pytest.mark.timeout(60)
def test_the_op_takes_every_batch_unless_turned_off(monkeypatch, tmp_path):
    """PACKER_NATIVE_RECORDS unset or 1: the op, for a batch of any size (six small records here);
    0: the Python loop. Same bytes either way."""
    import packer
    from packer.sample import make_dataset
    from readers.raw import RawReader

    gather_op_or_skip()
    images, _ = make_dataset(tmp_path / "ds", 6, kind="classes", seed=2)
    assert packer.build(images, None, tmp_path / "s.lmdb", "lmdb", workers=1).ok
    rr = RawReader(tmp_path / "s.lmdb", threads=1)
    rr.facts()  # keeps the records' facts: the reads below take the known-records path
    want = rr.read(list(range(6)))
    calls = []
    real = raw_mod.RecordFacts.native_spans
    monkeypatch.setattr(raw_mod.RecordFacts, "native_spans",
                        lambda self, *a, **k: calls.append(real(self, *a, **k)) or calls[-1])
    for env, native in ((None, True), ("1", True), ("0", False), (" 0 ", False)):
        if env is None:
            monkeypatch.delenv(raw_mod.NATIVE_RECORDS_ENV, raising=False)
        else:
            monkeypatch.setenv(raw_mod.NATIVE_RECORDS_ENV, env)
        got = rr.read(list(range(6)))
        assert calls[-1] is native, env
        assert [bytes(d.numpy()) for d in got.datas()] == [bytes(d.numpy()) for d in want.datas()]
    rr.close()
