"""DataLoader workers reuse their shared-memory batch buffers only once the main process let go."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's reducers with ForkingPickler
from torch.utils.data import DataLoader

from readers import CropDataset, FullDecode, collate_decoded, shared_batches
from readers.crops import op_available
from readers.shared_batches import SharedBatchRing, _ToMain
from tests.corpus import same_size_lmdb

needs_op = pytest.mark.skipif(not op_available(), reason="gpu_ops._C with decode_jpeg_crops not built")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return same_size_lmdb(tmp_path_factory, "sb", 23, (61, 83), seed=8)


@pytest.fixture
def fresh_stats():
    """received_stats() counted from this test on (it is per process, and tests share one)."""
    shared_batches._received.update(batches=0, max_uses=0)


def _send(obj):
    """What a worker's queue does: pickle with torch's reducers, unpickle on the other side."""
    return ForkingPickler.loads(ForkingPickler.dumps(obj))


@pytest.mark.timeout(60)
def test_ring_reuses_a_slot_only_after_the_receiver_let_go():
    ring = SharedBatchRing(keep=2)
    t = ring.take((4, 5))
    t.fill_(7)
    slot = ring.slot_of(t)
    assert slot is not None and ring.slot_of(t[1:]) is None  # only the whole batch travels as a slot
    got = _send(_ToMain(slot, tuple(t.shape)))
    assert torch.equal(got, torch.full((4, 5), 7, dtype=torch.uint8))
    del t
    u = ring.take((4, 5))  # the receiver still holds the first batch: a second slot
    assert ring.allocated == 2 and ring.reused == 0
    view = got[2]  # a view keeps the batch held after the batch tensor itself is gone
    del got
    gc.collect()
    u.fill_(1)
    del u  # died here without being sent: that slot may have left by a route we cannot see
    w = ring.take((2, 3))
    assert ring.dropped == 1 and ring.reused == 0 and ring.allocated == 3
    assert torch.equal(view, torch.full((5,), 7, dtype=torch.uint8))
    del view, w
    gc.collect()
    ring.take((4, 5))  # the first slot is free now: reused
    assert ring.reused == 1


@pytest.mark.timeout(60)
def test_a_forked_child_dropping_its_copy_does_not_free_the_parents_batch():
    ring = SharedBatchRing(keep=2)
    t = ring.take((8,))
    slot = ring.slot_of(t)
    got = _send(_ToMain(slot, (8,)))
    del t
    pid = os.fork()
    if pid == 0:  # the child's copy of the batch dies here; the parent still holds its own
        del got
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert int(slot.header[0]) == 1  # still in use
    ring.take((8,))
    assert ring.reused == 0 and ring.allocated == 2
    del got
    gc.collect()
    assert int(slot.header[0]) == 0  # the parent let go


@pytest.mark.timeout(60)
def test_full_ring_falls_back_to_fresh_shared_memory():
    ring = SharedBatchRing(keep=1)
    a = ring.take((3,))
    b = ring.take((3,))  # the one slot is held: fresh memory, not a slot
    assert ring.slot_of(a) is not None and ring.slot_of(b) is None and b.is_shared()


def _loader(store, ctx, collate=collate_decoded, workers=2, batch_size=3):
    ds = CropDataset(store, FullDecode(), layout="HWC")
    return DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collate, prefetch_factor=2,
                      persistent_workers=True, multiprocessing_context=ctx)


def _reference(store, n_batches, batch_size=3):
    ds = CropDataset(store, FullDecode(), layout="HWC")
    return [ds.load_batch(list(range(batch_size * b, min(23, batch_size * (b + 1))))) for b in range(n_batches)]


@needs_op
@pytest.mark.timeout(240)
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_worker_batches_are_right_and_their_buffers_come_back(store, ctx, fresh_stats):
    want = _reference(store, 8)
    loader = _loader(store, ctx)
    for _ in range(3):
        got = 0
        for (x, y), (wx, wy) in zip(loader, want):
            assert torch.equal(x, wx) and torch.equal(y, wy)
            got += 1
        assert got == 8
    after = shared_batches.received_stats()
    assert after["batches"] == 24
    assert after["max_uses"] > 1  # slots were handed out again


@needs_op
@pytest.mark.timeout(240)
def test_batches_held_by_the_main_process_are_never_overwritten(store):
    """Every batch of two epochs kept (no copies), and one view of a batch whose tensor is gone:
    all still equal their references at the end, so no held buffer was decoded into again."""
    want = _reference(store, 8)
    loader = _loader(store, "fork")
    kept = [b for _ in range(2) for b in loader]
    views = []
    for _ in range(2):
        for x, _ in loader:
            views.append(x[-1])  # the batch tensor dies, its last image is still held
    for i, (x, y) in enumerate(kept):
        assert torch.equal(x, want[i % 8][0]) and torch.equal(y, want[i % 8][1])
    for i, v in enumerate(views):
        assert torch.equal(v, want[i % 8][0][-1])


def _images_as_they_are(batch):
    return batch.images, batch.labels  # bypasses to_main: torch shares the buffer itself


@needs_op
@pytest.mark.timeout(240)
def test_a_collate_that_bypasses_the_ring_is_still_right(store):
    want = _reference(store, 8)
    loader = _loader(store, "fork", collate=_images_as_they_are)
    kept = [b for _ in range(3) for b in loader]
    for i, (x, y) in enumerate(kept):
        assert torch.equal(x, want[i % 8][0]) and torch.equal(y, want[i % 8][1])


@needs_op
@pytest.mark.timeout(120)
def test_a_killed_worker_raises_and_the_batches_held_stay_right(store):
    """kill -9 of a worker mid-epoch: the loader raises (no hang), and the batches the main
    process holds (mapped from that worker's buffers) keep their pixels."""
    want = _reference(store, 12, batch_size=2)
    loader = _loader(store, "fork", batch_size=2)
    it = iter(loader)
    try:
        held = [next(it) for _ in range(3)]
        os.kill(it._workers[0].pid, signal.SIGKILL)
        # Two ways torch's DataLoader reports it, both a raise: its death check ("DataLoader
        # worker (pid N) is killed by signal"), or, when the dead worker had a batch queued
        # already, the fd hand-off of that batch's tensors (the labels' too, so any Dataset) to a
        # process that is gone: a ConnectionError out of multiprocessing's resource_sharer.
        with pytest.raises((RuntimeError, ConnectionError)) as raised:
            for _ in it:
                pass
        assert isinstance(raised.value, ConnectionError) or "worker" in str(raised.value).lower()
    finally:
        # Now, not whenever the garbage collector breaks the cycle through `raised`'s traceback:
        # until then torch's SIGCHLD handler still watches this iterator's workers, and the
        # next one to exit raised "DataLoader worker ... killed" inside a later test (seen once
        # as a pytest INTERNALERROR in the full suite). Its worker pids go first: a worker that
        # exits while _shutdown_workers runs sent a SIGCHLD whose handler, finding the killed
        # worker still registered, raised inside this block (seen once in the full suite).
        from torch.utils.data._utils import signal_handling

        if it._worker_pids_set:
            signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
        it._shutdown_workers()
    # A child exiting now (SIGCHLD) must not reach a handler that still knows the killed worker.
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
    time.sleep(0.1)
    for (x, y), (wx, wy) in zip(held, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


@needs_op
@pytest.mark.timeout(240)
def test_pin_memory_copies_out_and_frees_the_buffers(store, fresh_stats):
    """pin_memory=True (the usual GPU training set-up): the pin thread copies each batch into
    pinned memory and drops ours, which frees the slot; the pinned batches are right."""
    from tests.gpu_ops_helpers import cuda_available_or_skip

    cuda_available_or_skip()
    want = _reference(store, 8)
    ds = CropDataset(store, FullDecode(), layout="HWC")
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate_decoded, pin_memory=True,
                        persistent_workers=True, multiprocessing_context="fork")
    kept = [b for _ in range(3) for b in loader]
    for i, (x, y) in enumerate(kept):
        assert x.is_pinned() and torch.equal(x, want[i % 8][0]) and torch.equal(y, want[i % 8][1])
    after = shared_batches.received_stats()
    assert after["batches"] == 24 and after["max_uses"] > 1
