"""readers.DistributedSampler: exact-once across ranks, remainder policies, block shuffle, resume."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from packer.core.errors import UsageError
from readers import DistributedSampler


def _epoch(n, world, epoch=0, **kw):
    shares = []
    for r in range(world):
        s = DistributedSampler(n, num_replicas=world, rank=r, **kw)
        s.set_epoch(epoch)
        shares.append(list(s))
        assert len(shares[-1]) == len(s)
    return shares


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 7, 50, 101])
@pytest.mark.parametrize("blocks", [None, 4, "bounds"])
def test_uneven_is_exactly_once(world, n, blocks):
    kw = ({"block_size": 4} if blocks == 4
          else {"boundaries": [0, n // 3, n // 2]} if blocks == "bounds" and n >= 6 else {})
    shares = _epoch(n, world, remainder="uneven", seed=3, **kw)
    flat = [i for s in shares for i in s]
    assert sorted(flat) == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [5, 13, 64])
def test_pad_and_drop(world, n):
    pad = _epoch(n, world, seed=1)
    flat = [i for s in pad for i in s]
    assert set(flat) == set(range(n)) and len(flat) == -(-n // world) * world
    assert all(len(s) == len(pad[0]) for s in pad)
    counts = Counter(flat)
    assert sum(c - 1 for c in counts.values()) == len(flat) - n   # only the padding repeats
    drop = _epoch(n, world, seed=1, drop_last=True)
    flat = [i for s in drop for i in s]
    assert len(flat) == len(set(flat)) == n // world * world


@pytest.mark.parametrize("world", [1, 2, 3])
def test_same_order_as_torch_distributed_sampler(world):
    ds = list(range(23))
    for r in range(world):
        ours = DistributedSampler(ds, num_replicas=world, rank=r, seed=7)
        theirs = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=r, seed=7)
        for e in (0, 3):
            ours.set_epoch(e)
            theirs.set_epoch(e)
            assert list(ours) == list(theirs)


def test_deterministic_under_seed_and_epoch():
    a = _epoch(40, 3, epoch=2, seed=5)
    assert a == _epoch(40, 3, epoch=2, seed=5)
    assert a != _epoch(40, 3, epoch=3, seed=5)
    assert a != _epoch(40, 3, epoch=2, seed=6)
    assert _epoch(10, 2, shuffle=False) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_block_shuffle_keeps_reads_local():
    n, k = 1000, 50
    s = DistributedSampler(n, num_replicas=2, rank=0, seed=0, block_size=k, remainder="uneven")
    order = list(s)
    blocks = [i // k for i in order]
    # each block is read in one run (no interleaving of blocks), blocks themselves shuffled
    runs = [b for j, b in enumerate(blocks) if j == 0 or b != blocks[j - 1]]
    assert len(runs) == len(set(runs)) <= n // k // 2 + 1
    assert runs != sorted(runs)
    assert [i % k for i in order[:k]] != list(range(k))   # shuffled inside a block
    with pytest.raises(UsageError):
        DistributedSampler(n, num_replicas=2, rank=0, boundaries=[5, 10])


@pytest.mark.parametrize("remainder", ["pad", "uneven"])
@pytest.mark.parametrize("block", [None, 8])
def test_resume_mid_epoch_gives_the_same_remaining_order(remainder, block):
    s = DistributedSampler(97, num_replicas=3, rank=1, seed=11, remainder=remainder, block_size=block)
    s.set_epoch(4)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(13)]
    state = s.state_dict()
    assert state["yielded"] == 13 and state["epoch"] == 4
    fresh = DistributedSampler(97, num_replicas=3, rank=1, seed=11, remainder=remainder, block_size=block)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    assert list(fresh) == full          # the following epoch pass starts from the beginning
    with pytest.raises(UsageError, match="seed"):
        DistributedSampler(97, num_replicas=3, rank=1, seed=12).load_state_dict(state)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_torchdata_stateful_dataloader(workers):
    sd = pytest.importorskip("torchdata.stateful_dataloader")
    data = list(range(41))
    kw = {"num_workers": workers, "multiprocessing_context": "spawn" if workers else None}
    s = DistributedSampler(data, num_replicas=2, rank=0, seed=2)
    loader = sd.StatefulDataLoader(data, batch_size=4, sampler=s, **kw)
    full = [b.tolist() for b in loader]
    loader = sd.StatefulDataLoader(data, batch_size=4, sampler=s, **kw)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    s2 = DistributedSampler(data, num_replicas=2, rank=0, seed=2)
    loader2 = sd.StatefulDataLoader(data, batch_size=4, sampler=s2, **kw)
    loader2.load_state_dict(state)
    assert head + [b.tolist() for b in loader2] == full


@pytest.mark.timeout(120)
def test_shard_local_over_a_merged_manifest_of_three_shards(tmp_path):
    """World size 2 over a real 3-shard manifest: every record exactly once per epoch, and each
    rank reads its shards in whole runs (at most one shard split between the two ranks)."""
    import packer
    from packer.jobs.merge import merge
    from packer.sample import make_dataset
    from readers import StoreDataset

    images, labels = make_dataset(tmp_path / "d", 21, kind="boxes", sizes=((32, 40),), seed=3)
    shards = [str(tmp_path / f"s{j}.lmdb") for j in range(3)]
    for j, loc in enumerate(shards):
        assert packer.build(images, labels, loc, "lmdb", workers=1, shard=(j, 3)).ok
    man = str(tmp_path / "all.packer-manifest.json")
    merge(shards, man)
    ds = StoreDataset(man)
    b = ds.shard_boundaries
    assert len(b) == 4 and b[-1] == len(ds) == 21

    def shard_of(i):
        return next(j for j in range(3) if b[j] <= i < b[j + 1])

    for epoch in range(3):
        per_rank = []
        for rank in range(2):
            s = DistributedSampler(ds, num_replicas=2, rank=rank, seed=5, remainder="uneven", shard_local=True)
            s.set_epoch(epoch)
            per_rank.append(list(s))
        assert sorted(per_rank[0] + per_rank[1]) == list(range(21))          # exactly once
        for order in per_rank:
            runs = [shard_of(i) for j, i in enumerate(order) if j == 0 or shard_of(i) != shard_of(order[j - 1])]
            assert len(runs) == len(set(runs)) <= 2                             # one run per shard
        shared = {shard_of(i) for i in per_rank[0]} & {shard_of(i) for i in per_rank[1]}
        assert len(shared) <= 1                                                # the others whole on one rank
    # The reader's own boundaries, a plain store's single shard, and misuse.
    with __import__("packer.stores", fromlist=["x"]).open_store(man) as r:
        assert DistributedSampler(r, num_replicas=2, rank=0, shard_local=True).boundaries == b
    one = StoreDataset(shards[0])
    assert DistributedSampler(one, num_replicas=2, rank=1, shard_local=True).boundaries == [0, len(one)]
    with pytest.raises(UsageError, match="shard_boundaries"):
        DistributedSampler(21, num_replicas=2, rank=0, shard_local=True)
    with pytest.raises(UsageError, match="not both"):
        DistributedSampler(ds, num_replicas=2, rank=0, shard_local=True, boundaries=[0, 7])
    # Empty shards (repeated offsets) are accepted as a store reports them.
    assert DistributedSampler(10, num_replicas=2, rank=0, boundaries=[0, 4, 4, 10]).boundaries == [0, 4, 10]


# ---------------------------------------------------------------------------------------------
# Shard-aware shuffle (shard_window): quality measured as MDS documents its shuffles
# ---------------------------------------------------------------------------------------------
def _quality(order, size=50):
    """(fraction of neighbouring samples from the same shard, Spearman correlation between a
    sample's position and its index, distinct shards in a sliding window of 100 samples)."""
    import numpy as np

    o = np.asarray(order)
    shard = o // size
    same = float((shard[1:] == shard[:-1]).mean())
    ranks = np.argsort(np.argsort(o))
    rho = float(np.corrcoef(ranks, np.arange(len(o)))[0, 1])
    spread = max(len(set(shard[i:i + 100].tolist())) for i in range(0, len(o) - 100, 50))
    return same, rho, spread


def test_shard_window_shuffle_quality_between_no_shuffle_and_a_full_shuffle():
    n, size, k = 1000, 50, 4
    bounds = list(range(0, n + 1, size))          # 20 shards of 50
    none = _quality(list(range(n)))
    full = _quality(torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist())
    block = _quality(list(DistributedSampler(n, 1, 0, seed=0, boundaries=bounds)))
    s = DistributedSampler(n, 1, 0, seed=0, boundaries=bounds, shard_window=k)
    win = _quality(list(s))
    # no shuffle: every neighbour from the same shard, position = index
    assert none[0] > 0.97 and none[1] > 0.999
    # a full shuffle: neighbours share a shard 1/20 of the time, no correlation
    assert full[0] < 0.08 and abs(full[1]) < 0.1
    # shard shuffle without a window (block shuffle): neighbours still from one shard
    assert block[0] > 0.97 and abs(block[1]) < 0.6
    # the window: ~1/k neighbours from one shard, order uncorrelated, only k shards at a time
    assert abs(win[0] - 1 / k) < 0.06 and abs(win[1]) < 0.6
    assert win[2] <= 2 * k and full[2] > 2 * k


def test_shard_window_is_exact_deterministic_and_hands_the_plan_over():
    n, bounds = 1003, [0, 100, 100, 350, 600, 601, 1003]      # an empty shard, odd sizes
    for world in (1, 3):
        for epoch in (0, 1):
            got = []
            for r in range(world):
                s = DistributedSampler(n, world, r, seed=7, boundaries=bounds, shard_window=2,
                                       remainder="uneven")
                s.set_epoch(epoch)
                part = list(s)
                assert part == list(s)                       # deterministic
                got += part
            assert sorted(got) == list(range(n))             # every index exactly once
    a = DistributedSampler(n, 1, 0, seed=7, boundaries=bounds, shard_window=2)
    b = DistributedSampler(n, 1, 0, seed=7, boundaries=bounds, shard_window=2)
    b.set_epoch(1)
    assert list(a) != list(b)

    class Planned:
        shard_boundaries = bounds

        def __init__(self):
            self.plans = []

        def __len__(self):
            return n

        def plan_shards(self, order, epoch=0):
            self.plans.append((epoch, list(order)))

    ds = Planned()
    s = DistributedSampler(ds, 1, 0, seed=7, shard_local=True, shard_window=2)
    s.set_epoch(4)
    idx = list(s)
    epoch, plan = ds.plans[-1]
    shards = [next(j for j in range(len(bounds) - 1) if bounds[j] <= i < bounds[j + 1]) for i in idx]
    runs = [x for j, x in enumerate(shards) if j == 0 or shards[j - 1] != x]
    assert epoch == 4 and plan[:len(runs)] == runs and plan[len(runs):] == s.shard_order(5)
    assert 1 not in plan                                     # the empty shard is never read
    with pytest.raises(UsageError, match="shard_window"):
        DistributedSampler(n, 1, 0, shard_window=2)
