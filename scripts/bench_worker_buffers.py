#!/usr/bin/env python
"""DataLoader workers with reused batch buffers vs a fresh shared-memory segment per batch.

Same CropDataset(FullDecode(dct=...), layout="HWC"), same DataLoader settings, epochs
interleaved round-robin across rows (so background load spreads over all rows), median reported:

    ring        collate_fn=collate_decoded: each worker reuses its buffers once the main process
                drops a batch (readers.shared_batches)
    fresh       a collate returning the batch tensor as it is: torch shares it, the worker never
                learns when it is free, so every batch gets a fresh shared-memory segment (the
                behaviour before readers.shared_batches)
    batchloader readers.BatchLoader in one process, --workers decode threads (for reference)

CPU ms/img counts the main process and the workers (/proc). The store must hold JPEG records of
one size (a bench_read.py set built with ``packer build``).

Usage::

    python scripts/bench_worker_buffers.py .bench/stores/500x375_n2048.lmdb --workers 2
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from readers import BatchLoader, CropDataset, FullDecode, collate_decoded  # noqa: E402

# bench_read.py's /proc CPU accounting (a script beside this one, not a package)
_spec = importlib.util.spec_from_file_location("bench_read", Path(__file__).resolve().parent / "bench_read.py")
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)


def images_as_they_are(batch):
    """The 'fresh' row's collate (module level: spawn workers import it)."""
    return batch.images, batch.labels


class Row:
    def __init__(self, name, loader, workers):
        self.name, self.loader, self.workers, self.runs = name, loader, workers, []

    def pids(self):
        it = getattr(self.loader, "_iterator", None)
        return [os.getpid()] + [p.pid for p in getattr(it, "_workers", []) or []]

    def epoch(self, threads: int) -> dict:
        torch.set_num_threads(threads if self.workers == 0 else 1)
        pids = self.pids()
        c0 = {p: br._proc_cpu(p) for p in pids}
        t = time.perf_counter()
        n = 0
        for images, labels in self.loader:
            n += len(labels)
        dt = time.perf_counter() - t
        pids = self.pids()  # persistent workers: the same after the first epoch
        cpu = sum(br._proc_cpu(p) - c0.get(p, 0.0) for p in pids)
        torch.set_num_threads(1)
        return {"img_s": n / dt, "cpu_ms": 1e3 * cpu / n, "n": n}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers / BatchLoader threads")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dct", default="fast", choices=["exact", "fast"])
    ap.add_argument("--context", default="fork", choices=["fork", "spawn", "forkserver"])
    ap.add_argument("--records", type=int, default=None,
                    help="records per epoch (default: the store's; more cycles through it again)")
    args = ap.parse_args(argv)

    def sampler(ds):
        gen = torch.Generator().manual_seed(0)
        return torch.utils.data.RandomSampler(ds, num_samples=args.records or len(ds), generator=gen)

    def dataset():
        return CropDataset(args.store, FullDecode(dct=args.dct), layout="HWC")

    def dataloader(collate):
        ds = dataset()
        return DataLoader(ds, batch_size=args.batch_size, sampler=sampler(ds), num_workers=args.workers,
                          collate_fn=collate, persistent_workers=True, multiprocessing_context=args.context)

    ds = dataset()
    rows = [Row("ring", dataloader(collate_decoded), args.workers),
            Row("fresh", dataloader(images_as_they_are), args.workers),
            Row("batchloader", BatchLoader(ds, batch_size=args.batch_size, sampler=sampler(ds)), 0)]
    for row in rows:
        row.epoch(args.workers)  # warm-up: page cache, worker start
    for _ in range(args.repeats):
        for row in rows:
            row.runs.append(row.epoch(args.workers))
    print(f"store {args.store}, {args.workers} workers/threads, batch {args.batch_size}, dct={args.dct}, "
          f"{args.context}, median of {args.repeats} interleaved epochs, {os.cpu_count()} CPUs")
    base = None
    for row in rows:
        img_s = statistics.median(r["img_s"] for r in row.runs)
        cpu = statistics.median(r["cpu_ms"] for r in row.runs)
        base = base or img_s
        print(f"{row.name:12s} {img_s:8.0f} img/s  {cpu:6.3f} CPU ms/img  ({img_s / base:.2f}x ring)  "
              f"epochs: {[round(r['img_s']) for r in row.runs]}")


if __name__ == "__main__":
    main()
