#!/usr/bin/env python
"""The loaders' read stage: known records checked against their XXH3-128 checksums and copied into
one batch buffer, by gpu_ops' C++ op (``gather_check_xxh3``, the GIL released) against the Python
loop it replaces (``PACKER_NATIVE_RECORDS=0``). Each row runs in a process of its own.

    python3 scripts/bench_records.py --sets .bench/sets --out .bench/bench_records.md

What a row does: ``RawReader(store, threads=T).read(batch)`` for seeded random batches of 256
records of the store (all records read once first, so the reads take the kept-facts path through
the map of ``data.mdb``; the page cache is warm), for ``--seconds``, alone (images/s, CPU cores
used), then again beside one more Python thread that never blocks (a counter: the worst case, a
thread that never releases the GIL; a training loop's torch calls do): images/s then, and "Python left", how
fast the counter counts meanwhile relative to counting alone (1.0 = the read stage left it all
of the GIL).
Not on a GPU machine the batch buffer is not pinned; the work is otherwise the GPU loader's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _count_for(seconds: float, stop: threading.Event, out: list) -> None:
    n, end = 0, time.perf_counter() + seconds
    while not stop.is_set() and time.perf_counter() < end:
        n += 1
    out.append(n)


def row(store: str, threads: int, seconds: float, batch: int) -> dict:
    import torch

    from readers.raw import RawReader, _gather_op

    native = _gather_op() is not None
    with RawReader(store, threads=threads) as rr:
        n = rr.metadata.count
        for s in range(0, n, batch):                 # every record once: facts and offsets kept
            rr.read(list(range(s, min(n, s + batch))))
        g = torch.Generator().manual_seed(0)
        plans = [torch.randint(0, n, (batch,), generator=g).tolist() for _ in range(64)]

        def loop():
            images, k = 0, 0
            t0, c0 = time.perf_counter(), _cpu()
            while time.perf_counter() - t0 < seconds:
                images += len(rr.read(plans[k % len(plans)]))
                k += 1
            return images, time.perf_counter() - t0, _cpu() - c0

        images, wall, cpu = loop()                    # alone
        alone: list = []
        _count_for(0.5, threading.Event(), alone)    # the counter's rate with nothing else running
        stop, during = threading.Event(), []
        counter = threading.Thread(target=_count_for, args=(seconds + 5, stop, during))
        counter.start()
        busy_images, busy_wall, _ = loop()           # beside a Python thread that never blocks
        stop.set()
        counter.join()
    counted = during[0] / busy_wall                   # the counter ran for about `busy_wall` seconds
    return {"store": Path(store).stem, "threads": threads, "native": native, "img_s": round(images / wall),
            "cores": round(cpu / wall, 2), "busy_img_s": round(busy_images / busy_wall),
            "python_left": round(counted / (alone[0] / 0.5), 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=Path, default=Path(".bench/sets"))
    ap.add_argument("--only", default="hd,small")
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None, help="markdown table (also printed)")
    ap.add_argument("--row", nargs=3, metavar=("STORE", "THREADS", "NATIVE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.row:
        print(json.dumps(row(a.row[0], int(a.row[1]), a.seconds, a.batch)))
        return 0
    rows = []
    for name in a.only.split(","):
        store = a.sets / f"{name}.lmdb"
        if not store.exists():
            raise SystemExit(f"{store}: no such store (make it: python3 scripts/make_bench_sets.py)")
        for t in [int(x) for x in a.threads.split(",")]:
            for native in ("1", "0"):
                env = dict(os.environ, PACKER_NATIVE_RECORDS=native)
                out = subprocess.run([sys.executable, __file__, "--row", str(store), str(t), native,
                                      "--seconds", str(a.seconds), "--batch", str(a.batch)],
                                     env=env, capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if native == "1" and not r["native"]:
                    raise SystemExit("gpu_ops._C lacks gather_check_xxh3: build it (python3 -m gpu_ops.build)")
                rows.append(r)
                print(json.dumps(r), flush=True)
    lines = [f"{os.cpu_count()} CPUs, batch {a.batch}, {a.seconds:g} s per row, each row its own process",
             "", "| set | read threads | way | img/s alone | cores | img/s beside a busy thread | Python left |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for c, p in zip(rows[0::2], rows[1::2]):
        for way, r in (("C++ op", c), ("Python loop", p)):
            lines.append(f"| {r['store']} | {r['threads']} | {way} | {r['img_s']:,} | {r['cores']} | "
                         f"{r['busy_img_s']:,} | {r['python_left']} |")
        lines.append(f"| {c['store']} | {c['threads']} | **C++ / Python** | **{c['img_s'] / p['img_s']:.2f}x** | | "
                     f"**{c['busy_img_s'] / p['busy_img_s']:.2f}x** | **{c['python_left'] / p['python_left']:.2f}x** |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
