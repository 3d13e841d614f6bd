"""Two ranks of a real ``torch.distributed`` process group (gloo, loopback, two processes), each
reading a 3-shard manifest through ``StoreDataset`` + ``DataLoader`` workers with
``DistributedSampler`` taking its world size and rank from the group (issue 50's per-rank split,
where no two-GPU machine is lent): every record exactly once per epoch across the ranks, each rank
in its shard runs, and a rank resumed mid-epoch from its sampler's ``state_dict`` reads the same
remaining order."""
from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest

from tests.s3_support import free_port

N_RECORDS = 27
EPOCHS = 2


def _rank_main(rank: int, world: int, port: int, manifest: str, out: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from readers import DistributedSampler, StoreDataset

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        ds = StoreDataset(manifest, return_key=True)
        sampler = DistributedSampler(ds, seed=7, remainder="uneven", shard_local=True)   # from the group
        loader = DataLoader(ds, batch_size=2, sampler=sampler, num_workers=1, collate_fn=list,
                            multiprocessing_context="spawn")
        mine = {}
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            mine[epoch] = [k for batch in loader for _, _, k in batch]
        # Resume epoch 1 after 3 samples, in a fresh sampler, as a restarted rank would.
        sampler.set_epoch(1)
        it = iter(sampler)
        head = [next(it) for _ in range(3)]
        state = sampler.state_dict()
        fresh = DistributedSampler(ds, seed=7, remainder="uneven", shard_local=True)
        fresh.load_state_dict(state)
        resumed = [ds.reader.get(i).key for i in head + list(fresh)]
        gathered = [None] * world
        dist.all_gather_object(gathered, {"rank": dist.get_rank(), "world": dist.get_world_size(),
                                          "epochs": mine, "resumed": resumed,
                                          "boundaries": list(ds.shard_boundaries),
                                          "order1": sampler.rank_indices(1)})
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_two_gloo_ranks_split_a_manifest_exactly(tmp_path):
    import packer
    from packer.jobs.merge import merge
    from packer.sample import make_dataset
    from packer.stores import open_store

    images, labels = make_dataset(tmp_path / "d", N_RECORDS, kind="boxes", sizes=((32, 40),), seed=4)
    shards = [str(tmp_path / f"s{j}.lmdb") for j in range(3)]
    for j, loc in enumerate(shards):
        assert packer.build(images, labels, loc, "lmdb", workers=1, shard=(j, 3)).ok
    manifest = str(tmp_path / "all.packer-manifest.json")
    merge(shards, manifest)
    with open_store(manifest) as r:
        all_keys = sorted(r.get(i).key for i in range(len(r)))
    assert len(all_keys) == N_RECORDS

    out = str(tmp_path / "gathered.json")
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(rank, 2, port, manifest, out)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank did not finish within 180 s"
    assert [p.exitcode for p in procs] == [0, 0]

    with open(out) as f:
        ranks = json.load(f)
    assert [(g["rank"], g["world"]) for g in ranks] == [(0, 2), (1, 2)]
    b = ranks[0]["boundaries"]
    for epoch in map(str, range(EPOCHS)):
        per_rank = [g["epochs"][epoch] for g in ranks]
        assert sorted(per_rank[0] + per_rank[1]) == all_keys          # every record once, no pad
    assert ranks[0]["epochs"]["0"] != ranks[0]["epochs"]["1"]          # a new order each epoch
    for g in ranks:
        assert g["resumed"] == g["epochs"]["1"]                       # resume: the same order

    def shard_of(i):
        return next(j for j in range(3) if b[j] <= i < b[j + 1])

    for g in ranks:                                                    # each rank in shard runs
        order = g["order1"]
        runs = [shard_of(i) for j, i in enumerate(order) if j == 0 or shard_of(i) != shard_of(order[j - 1])]
        assert len(runs) == len(set(runs))
