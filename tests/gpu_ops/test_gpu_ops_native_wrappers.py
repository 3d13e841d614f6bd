"""The Python functions of gpu_ops' CPU-only native ops (``gpu_ops.ops.decode_jpeg_crops``,
``gpu_ops.ops.gather_check_xxh3``, ``gpu_ops.ops.has_kernel``): the same outputs as the raw
``torch.ops.gpu_ops`` op on the same inputs, the conversions the wrapper promises, a clear error
where the kernel is missing, and no raw ``torch.ops.gpu_ops`` call left in ``readers``."""
from __future__ import annotations

import re

import cv2
import numpy as np
import pytest
import torch
import xxhash

from gpu_ops import ops
from packer.sample import synthetic_image
from tests import REPO


def _needs(name):
    return pytest.mark.skipif(not ops.has_kernel(name), reason=f"gpu_ops._C without {name}")


def _jpeg(h, w, seed):
    img = synthetic_image(np.random.default_rng(seed), h, w)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


def _jpeg_batch():
    """Four JPEGs back to back (the third damaged), packed offsets, integral boxes, flips."""
    blobs = [_jpeg(64, 96, 1), _jpeg(80, 48, 2), b"\xff\xd8 not a jpeg", _jpeg(33, 71, 3)]
    data = torch.from_numpy(np.frombuffer(b"".join(blobs), np.uint8).copy())
    offsets = torch.tensor(np.cumsum([0] + [len(b) for b in blobs]), dtype=torch.int64)
    boxes = torch.tensor([[4, 8, 40, 60], [0, 0, 80, 48], [0, 0, 10, 10], [3, 5, 20, 30]], dtype=torch.float64)
    flips = torch.tensor([False, True, False, True])
    return data, offsets, boxes, flips


@pytest.mark.timeout(120)
@_needs("decode_jpeg_crops")
@pytest.mark.parametrize("channels_last", [False, True])
def test_decode_jpeg_crops_matches_the_raw_op(channels_last):
    data, offsets, boxes, flips = _jpeg_batch()
    shape = (4, 24, 32, 3) if channels_last else (4, 3, 24, 32)
    outs, errs = [], []
    for call in ("raw", "wrapper"):
        out = torch.zeros(shape, dtype=torch.uint8)
        errors = torch.zeros((4, 128), dtype=torch.uint8)
        args = (data, offsets, boxes, flips, out, errors, channels_last, 0, True, True, False, 1)
        if call == "raw":
            assert torch.ops.gpu_ops.decode_jpeg_crops(*args) is None
        else:
            assert ops.decode_jpeg_crops(*args) is None
        outs.append(out)
        errs.append(errors)
    assert torch.equal(outs[0], outs[1]) and torch.equal(errs[0], errs[1])
    assert outs[1][[0, 1, 3]].float().std() > 5  # real pixels were written
    assert errs[1][:, 0].nonzero().flatten().tolist() == [2]  # only the damaged one failed


@pytest.mark.timeout(120)
@_needs("decode_jpeg_crops")
def test_decode_jpeg_crops_converts_boxes_and_flips_the_raw_op_refuses():
    """float32 boxes and uint8 flips: the raw op takes only float64 and bool; the wrapper converts,
    with the same pixels as the raw op given the converted tensors."""
    data, offsets, boxes, flips = _jpeg_batch()
    out_raw, out = (torch.zeros((4, 3, 16, 16), dtype=torch.uint8) for _ in range(2))
    err_raw, err = (torch.zeros((4, 64), dtype=torch.uint8) for _ in range(2))
    with pytest.raises(RuntimeError):
        torch.ops.gpu_ops.decode_jpeg_crops(data, offsets, boxes.float(), flips.to(torch.uint8), out_raw,
                                            err_raw, False, 0, True, True, False, 1)
    torch.ops.gpu_ops.decode_jpeg_crops(data, offsets, boxes, flips, out_raw, err_raw, False, 0, True, True,
                                        False, 1)
    ops.decode_jpeg_crops(data, offsets, boxes.float(), flips.to(torch.uint8), out, err, False, threads=1)
    assert torch.equal(out, out_raw) and torch.equal(err, err_raw)


def _records(seed=0, count=9):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 5_000, count)
    starts = np.cumsum(lens + 7) - lens
    data = rng.integers(0, 256, int(starts[-1] + lens[-1] + 3), dtype=np.uint8)
    spans = np.stack([starts, starts + lens], axis=1).astype(np.int64)
    digests = np.stack([np.frombuffer(xxhash.xxh3_128_digest(data[a:b].tobytes()), np.uint8)
                        for a, b in spans.tolist()])
    digests[4, 0] ^= 1  # one record does not match
    return torch.from_numpy(data), torch.from_numpy(spans), torch.from_numpy(digests), int(lens.sum())


@pytest.mark.timeout(60)
@_needs("gather_check_xxh3")
@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("with_digests", [False, True])
def test_gather_check_xxh3_matches_the_raw_op(with_out, with_digests):
    data, spans, digests, total = _records()
    results, outs = [], []
    for fn in (torch.ops.gpu_ops.gather_check_xxh3, ops.gather_check_xxh3):
        out = torch.full((total + 4,), 9, dtype=torch.uint8) if with_out else None
        results.append(fn(data, spans, digests if with_digests else None, out, 2))
        outs.append(out)
    assert torch.equal(results[0], results[1]) and results[1].dtype == torch.bool
    assert results[1].nonzero().flatten().tolist() == ([4] if with_digests else [])
    if with_out:
        assert torch.equal(outs[0], outs[1])
        want = np.concatenate([data.numpy()[a:b] for a, b in spans.tolist()])
        assert np.array_equal(outs[1].numpy()[:total], want)


@pytest.mark.timeout(60)
@_needs("gather_check_xxh3")
def test_gather_check_xxh3_defaults_and_errors_match_the_raw_op():
    data, spans, digests, _ = _records()
    assert torch.equal(ops.gather_check_xxh3(data, spans), torch.ops.gpu_ops.gather_check_xxh3(data, spans, None, None))
    bad_spans = spans.clone()
    bad_spans[0, 1] = data.numel() + 1
    for fn in (torch.ops.gpu_ops.gather_check_xxh3, ops.gather_check_xxh3):
        with pytest.raises(RuntimeError, match="span 0"):
            fn(data, bad_spans, digests, None, 0)


def test_has_kernel_and_a_missing_kernel(monkeypatch):
    assert ops.has_kernel("no_such_op_anywhere") is False
    monkeypatch.setattr(ops, "_NATIVE", {})
    monkeypatch.setattr(ops, "has_kernel", lambda name, device="CPU": False)
    with pytest.raises(RuntimeError, match="gpu_ops._C lacks gather_check_xxh3"):
        ops.gather_check_xxh3(torch.zeros(1, dtype=torch.uint8), torch.zeros((0, 2), dtype=torch.int64))
    with pytest.raises(RuntimeError, match="gpu_ops._C lacks decode_jpeg_crops"):
        ops.decode_jpeg_crops(*_jpeg_batch(), torch.zeros((4, 3, 8, 8), dtype=torch.uint8),
                              torch.zeros((4, 64), dtype=torch.uint8), False)


@_needs("gather_check_xxh3")
def test_readers_reach_the_record_op_through_the_wrapper():
    from readers.raw import _gather_op

    assert _gather_op() is ops.gather_check_xxh3


def test_readers_call_no_raw_native_op():
    """Every native op the readers use goes through its gpu_ops.ops function (documented, converted,
    a clear error where the kernel is missing), never ``torch.ops.gpu_ops.<op>`` directly."""
    raw = re.compile(r"torch\.ops\.gpu_ops\b")
    hits = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "readers").rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert hits == []
