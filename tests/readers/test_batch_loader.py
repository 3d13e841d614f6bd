"""readers.BatchLoader: a CropDataset's batches read and decoded ahead on threads, in one process."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import packer
from packer.core.errors import RecordError, UsageError
from packer.sample import make_dataset
from readers import BatchLoader, CropDataset, DistributedSampler, FullDecode, RandomResizedCrop, StoreDataset
from readers.crops import op_available
from tests.corpus import cut_lmdb_record, same_size_lmdb

pytestmark = pytest.mark.skipif(not op_available(), reason="gpu_ops._C with decode_jpeg_crops not built")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return same_size_lmdb(tmp_path_factory, "bl", 23, (61, 83), seed=5)


def _reference(ds, index_lists):
    """What one load_batch per index list gives (no loader, no threads)."""
    return [tuple(t.clone() for t in ds.load_batch(ix)) for ix in index_lists]


def _run(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_batches_equal_load_batch_in_sampler_order(store, prefetch):
    ds = CropDataset(store, RandomResizedCrop(32, seed=7))
    loader = BatchLoader(ds, batch_size=5, shuffle=True, seed=3, prefetch=prefetch)
    loader.set_epoch(2)
    order = [list(b) for b in loader._batches()]
    assert sorted(i for b in order for i in b) == list(range(23))  # every record once
    got = _run(loader)
    assert len(got) == len(loader) == 5 and [x.shape[0] for x, _ in got] == [5, 5, 5, 5, 3]
    ref = CropDataset(store, RandomResizedCrop(32, seed=7))
    ref.set_epoch(2)  # the seeded crop's boxes are per (seed, epoch, index)
    want = _reference(ref, order)
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


@pytest.mark.timeout(120)
def test_epochs_reshuffle_replayably_and_threads_do_not_change_pixels(store):
    def epoch_batches(epoch, threads):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            loader = BatchLoader(CropDataset(store, FullDecode(), layout="HWC"), batch_size=4, shuffle=True, seed=1)
            loader.set_epoch(epoch)
            return _run(loader)
        finally:
            torch.set_num_threads(old)

    e0, e0_again, e0_two_threads, e1 = (epoch_batches(0, 1), epoch_batches(0, 1), epoch_batches(0, 2),
                                        epoch_batches(1, 1))
    flat = [torch.cat([y for _, y in e]) for e in (e0, e0_again, e0_two_threads, e1)]
    assert torch.equal(flat[0], flat[1]) and torch.equal(flat[0], flat[2])
    assert all(torch.equal(a[0], b[0]) for a, b in zip(e0, e0_two_threads))
    x0 = torch.cat([x for x, _ in e0])
    x1 = torch.cat([x for x, _ in e1])
    assert not torch.equal(x0, x1)  # another epoch, another order
    assert sorted(map(tuple, x0.flatten(1).tolist())) == sorted(map(tuple, x1.flatten(1).tolist()))


@pytest.mark.timeout(120)
def test_held_batches_are_never_overwritten(store):
    """Prefetch decodes into pooled buffers while the caller holds earlier batches: each batch kept
    must still equal its reference at the end (a reused buffer would have been overwritten)."""
    ds = CropDataset(store, FullDecode(), layout="HWC")
    loader = BatchLoader(ds, batch_size=3, prefetch=3)
    kept = [(x, y) for x, y in loader]  # no clone: the batches themselves
    want = _reference(CropDataset(store, FullDecode(), layout="HWC"), [list(b) for b in loader._batches()])
    for (x, y), (wx, wy) in zip(kept, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    # dropped batches do come back for reuse
    del kept, x, y
    for _ in range(3):
        for x, _ in loader:
            del x
    assert ds.output_pool.reused > 0


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("prefetch, per_batch, overlap", [(1, None, 1), (2, None, 2), (None, None, 3), (4, None, 3),
                                                          (4, 2, 2)])
def test_several_batches_decode_at_once_and_still_come_in_order(store, two_threads, prefetch, per_batch, overlap):
    """2 threads, 1 per batch: three batches decode at once (two to use the threads, one to fill
    the gaps), never more than prefetch allows; 2 per batch: two. Batches still come in order."""
    ds = CropDataset(store, FullDecode(), layout="HWC")
    active, peak, seen_threads, lock = [0], [0], set(), threading.Lock()
    decode = ds.decode_batch

    def slow_decode(prepared, threads=None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            seen_threads.add(threads)
        try:
            threading.Event().wait(0.05)  # long enough for the next batches' reads to finish
            return decode(prepared, threads)
        finally:
            with lock:
                active[0] -= 1

    ds.decode_batch = slow_decode
    loader = BatchLoader(ds, batch_size=3, shuffle=True, seed=4, prefetch=prefetch, threads_per_batch=per_batch)
    got = _run(loader)
    assert peak[0] == overlap and seen_threads == {per_batch or 1}
    want = _reference(CropDataset(store, FullDecode(), layout="HWC"), [list(b) for b in loader._batches()])
    assert len(got) == len(want) == 8
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


@pytest.mark.parametrize("total, per_batch, want", [
    (1, None, (1, 2, 5)), (2, None, (1, 3, 6)), (8, None, (1, 9, 12)), (14, None, (2, 8, 11)),
    (64, None, (8, 9, 12)), (14, 14, (14, 2, 5)), (14, 20, (14, 2, 5)), (4, 3, (3, 3, 6))])
def test_plan_keeps_near_the_thread_budget(store, total, per_batch, want):
    old = torch.get_num_threads()
    torch.set_num_threads(total)
    try:
        loader = BatchLoader(CropDataset(store, FullDecode(), layout="HWC"), threads_per_batch=per_batch)
        assert loader.plan() == want
        t, at_once, _ = want
        assert t * (at_once - 1) >= total  # every thread has a batch, plus one batch to fill gaps
        assert f"{at_once} batches at once on {t} each" in repr(loader)
        assert BatchLoader(loader.dataset, threads_per_batch=per_batch, prefetch=2).plan()[1:] == (min(at_once, 2), 2)
    finally:
        torch.set_num_threads(old)


@pytest.mark.timeout(120)
def test_decode_threads_do_not_change_pixels_and_bad_counts_are_refused(store):
    from readers.crops import decode_crops

    ds = CropDataset(store, RandomResizedCrop(40, seed=1))
    prepared = ds.prepare_batch(list(range(9)))
    one = ds.decode_batch(prepared, 1).images.clone()
    for threads in (2, 5, 64, np.int64(3)):  # more threads than images is fine: capped at the batch
        assert torch.equal(ds.decode_batch(prepared, threads).images, one)
    assert BatchLoader(ds, batch_size=np.int64(4), threads_per_batch=np.int32(2)).plan()[0] in (1, 2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="threads"):
            decode_crops(prepared.packed, prepared.boxes, prepared.flips, (40, 40), threads=bad)
        with pytest.raises(UsageError, match="threads_per_batch"):
            BatchLoader(ds, threads_per_batch=bad)


@pytest.mark.timeout(120)
def test_resume_mid_epoch_gives_the_rest_of_the_same_epoch(store):
    def make():
        return BatchLoader(CropDataset(store, RandomResizedCrop(24, seed=2)), batch_size=4, shuffle=True, seed=9)

    full = make()
    full.set_epoch(3)
    whole = _run(full)
    first = make()
    first.set_epoch(3)
    it = iter(first)
    head = [tuple(t.clone() for t in next(it)) for _ in range(2)]
    state = first.state_dict()
    del it
    assert state == {"epoch": 3, "batches": 2}
    resumed = make()
    resumed.load_state_dict(state)
    rest = _run(resumed)
    assert len(head) + len(rest) == len(whole)
    for (x, y), (wx, wy) in zip(head + rest, whole):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    assert resumed.state_dict() == {"epoch": 3, "batches": len(whole)}


@pytest.mark.timeout(120)
def test_distributed_sampler_ranks_cover_every_record_once(store):
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(StoreDataset(store), num_replicas=3, rank=rank, shuffle=True, seed=4,
                                     drop_last=True)
        loader = BatchLoader(CropDataset(store, FullDecode(), layout="HWC", return_key=True), batch_size=4,
                             sampler=sampler)
        loader.set_epoch(1)
        assert sampler.epoch == 1
        seen += [k for _, _, keys in loader for k in keys]
    assert len(seen) == len(set(seen)) == 21  # 23 records, 3 ranks, remainder dropped


@pytest.mark.timeout(120)
def test_damaged_record_raises_at_its_batch_and_threads_stop(tmp_path):
    images, _ = make_dataset(tmp_path / "src", 12, kind="classes", sizes=((40, 56),), seed=6)
    store = tmp_path / "s.lmdb"
    packer.build(images, None, store, workers=1)
    cut_lmdb_record(store, 9, keep=100)
    before = threading.active_count()
    loader = BatchLoader(CropDataset(store, FullDecode(), layout="HWC"), batch_size=4, prefetch=2)
    got = []
    with pytest.raises(RecordError, match="checksum") as info:
        for x, _ in loader:
            got.append(x.shape[0])
    assert got == [4, 4]  # batches before the damaged one arrive; the one holding record 9 raises
    assert CropDataset(store, FullDecode()).reader.get(9).key in str(info.value)
    assert threading.active_count() == before  # the read and decode threads are gone
    skipping = CropDataset(store, FullDecode(), layout="HWC", on_error="skip")
    assert sum(x.shape[0] for x, _ in BatchLoader(skipping, batch_size=4)) == 11 and skipping.skipped == 1


@pytest.mark.timeout(60)
def test_breaking_out_stops_the_threads(store):
    # the threads this loader starts, not a count: one left by an earlier test may end meanwhile
    before = set(threading.enumerate())
    loader = BatchLoader(CropDataset(store, FullDecode(), layout="HWC"), batch_size=2, prefetch=4)
    for i, _ in enumerate(loader):
        if i == 1:
            assert [t for t in threading.enumerate() if t not in before]   # its reader and decoders run
            break
    assert [t.name for t in threading.enumerate() if t not in before] == []


@pytest.mark.timeout(60)
def test_a_stalled_decode_raises_naming_where_the_threads_are_instead_of_hanging(store):
    """A decode that never returns does not hang the training loop: after ``timeout`` seconds
    without a batch the iteration raises, naming the loader's threads and the call each is in,
    without waiting for the stuck one."""
    release = threading.Event()

    class Stuck(CropDataset):
        def decode_batch(self, prepared, threads=None):
            release.wait(30)
            return super().decode_batch(prepared, threads)

    other = iter(BatchLoader(CropDataset(store, FullDecode(), layout="HWC"), batch_size=4))
    next(other)  # another loader in the same process, its threads alive
    other_threads = {t.name for t in threading.enumerate() if t.name.startswith("packer-")}
    assert other_threads
    loader = BatchLoader(Stuck(store, FullDecode(), layout="HWC"), batch_size=4, timeout=1.5)
    t0 = time.perf_counter()
    try:
        with pytest.raises(RuntimeError, match=r"BatchLoader: no batch came within timeout=1.5 s") as info:
            next(iter(loader))
        assert time.perf_counter() - t0 < 10
    finally:
        release.set()
        other.close()
    msg = str(info.value)
    assert "packer-decode" in msg and " in decode_batch (" in msg, msg
    assert not any(name in msg for name in other_threads), (other_threads, msg)  # only the stalled loader's
    with pytest.raises(UsageError, match="timeout must be None or >= 0"):
        BatchLoader(CropDataset(store, FullDecode()), timeout=-2)
    assert BatchLoader(CropDataset(store, FullDecode()), timeout=0).timeout is None


def test_refuses_what_it_cannot_do(store):
    with pytest.raises(UsageError, match="CropDataset"):
        BatchLoader(StoreDataset(store), batch_size=2)
    ds = CropDataset(store, FullDecode())
    with pytest.raises(UsageError, match="not both"):
        BatchLoader(ds, shuffle=True, sampler=torch.utils.data.SequentialSampler(ds))
    with pytest.raises(UsageError, match=">= 1"):
        BatchLoader(ds, batch_size=4, prefetch=0)
    assert "BatchLoader(batch_size=1" in repr(BatchLoader(ds))
