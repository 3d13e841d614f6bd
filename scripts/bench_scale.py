"""Build throughput: one process (baseline) vs. the Dask engine on 1 and 2 LocalCluster workers.

Same generated inputs for every run, run side by side in one process; prints a table and
writes JSON. The Dask rows include cluster start-up and the manifest write; the start-up time
is also given on its own so per-image throughput can be compared without it.

    PYTHONPATH=$PWD python3 scripts/bench_scale.py --images 600 --shards 4 --out /tmp/bench_scale
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--out", default="/tmp/bench_scale")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    import packer
    from packer.sample import make_dataset

    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    images, _ = make_dataset(root / "data", args.images, kind="classes", seed=0)
    mpix = 0
    from packer.sources.folders import collect_sources
    src = collect_sources(images)
    for k in src.keys:
        mpix += (images / k).stat().st_size
    rows = []

    def timed(name, fn):
        best = None
        for r in range(args.repeat):
            t0 = time.perf_counter()
            fn(r)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        rows.append({"run": name, "seconds": round(best, 3), "img_per_s": round(args.images / best, 1)})
        print(f"{name:<34} {best:7.2f} s  {args.images / best:8.1f} img/s", flush=True)

    timed("single process, workers=1", lambda r: packer.build(images, None, root / f"single{r}.lmdb", workers=1,
                                                            overwrite=True))
    timed("single process, workers=2", lambda r: packer.build(images, None, root / f"single2_{r}.lmdb", workers=2,
                                                            overwrite=True))

    import distributed
    t0 = time.perf_counter()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None):
        pass
    startup = time.perf_counter() - t0
    rows.append({"run": "LocalCluster(1 worker) start+stop", "seconds": round(startup, 3)})
    print(f"{'LocalCluster(1) start+stop':<34} {startup:7.2f} s", flush=True)
    for n in (1, 2):
        timed(f"dask engine, {n} worker(s), {args.shards} shards",
              lambda r, n=n: packer.build(images, None, root / f"dask{n}_{r}.packer-manifest.json", "lmdb",
                                       engine="dask", shards=args.shards, n_workers=n, overwrite=True))
    t0 = time.perf_counter()
    from packer.jobs.merge import merge
    rep = merge([str(root / "dask2_0.packer-manifest.json")], root / "remerge.json", overwrite=True)
    rows.append({"run": f"logical merge of {rep.shards} shards", "seconds": round(time.perf_counter() - t0, 4)})
    result = {"images": args.images, "input_bytes": mpix, "cpu_count": os.cpu_count(), "rows": rows}
    (root / "bench_scale.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
