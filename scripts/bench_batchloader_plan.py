#!/usr/bin/env python
"""readers.BatchLoader: img/s for each threads_per_batch at several thread budgets.

For each total thread count T (``torch.set_num_threads(T)``) the loader runs with T, ceil(T/2),
4, 2 and 1 threads per batch (as many batches at once as :meth:`BatchLoader.plan` gives: enough
for T threads, plus one), one warm-up epoch each, then ``--repeats`` epochs interleaved across
the variants; the median is printed with the plan and CPU ms per image (this process).
CropDataset(FullDecode(dct="fast"), layout="HWC"), batch 32; the store must hold JPEG records of
one size (a bench_read.py set built with ``packer build``).

Usage::

    python scripts/bench_batchloader_plan.py .bench/stores/500x375_n512.lmdb --records 8192 --threads 14,8,4
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from readers import BatchLoader, CropDataset, FullDecode  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--records", type=int, default=None, help="records per epoch (default: the store's)")
    ap.add_argument("--threads", default="14,8,4", help="thread budgets T to try")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args(argv)
    ds = CropDataset(args.store, FullDecode(dct="fast"), layout="HWC")

    def epoch(total, per_batch):
        torch.set_num_threads(total)
        sampler = torch.utils.data.RandomSampler(ds, num_samples=args.records or len(ds),
                                                 generator=torch.Generator().manual_seed(0))
        loader = BatchLoader(ds, batch_size=args.batch_size, sampler=sampler, threads_per_batch=per_batch)
        t, c, n = time.perf_counter(), time.process_time(), 0
        for _, labels in loader:
            n += len(labels)
        return n / (time.perf_counter() - t), 1e3 * (time.process_time() - c) / n, loader.plan()

    for total in (int(x) for x in args.threads.split(",")):
        variants = sorted({total, -(-total // 2), 4, 2, 1} & set(range(1, total + 1)), reverse=True)
        runs = collections.defaultdict(list)
        for per_batch in variants:
            epoch(total, per_batch)
        for _ in range(args.repeats):
            for per_batch in variants:
                runs[per_batch].append(epoch(total, per_batch))
        for per_batch, rs in runs.items():
            print(f"T={total:2d} per_batch={per_batch:2d} plan={rs[0][2]}  "
                  f"{statistics.median(r[0] for r in rs):7.0f} img/s  "
                  f"cpu {statistics.median(r[1] for r in rs):.3f} ms/img  "
                  f"epochs {[round(r[0]) for r in rs]}", flush=True)


if __name__ == "__main__":
    main()
