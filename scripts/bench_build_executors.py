"""Build throughput per executor: inline (one process), threads, spawn processes.

The thread fallback (unguarded scripts, stdin) is only worth having if the checks really run in
parallel: libjpeg-turbo (through ctypes) and OpenCV release the GIL. This measures it on
generated JPEGs, all three side by side in one run, same data, fresh output each time::

    python scripts/bench_build_executors.py --n 300 --size 1024x768 --workers 4

Prints one line per executor: seconds, images/s, megapixels/s, speed-up over inline.
Run it guarded (it is), or the process column would itself fall back to threads.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def make_images(root: Path, n: int, h: int, w: int) -> None:
    import numpy as np

    from packer.sample import encode_jpeg, synthetic_image

    rng = np.random.default_rng(0)
    distinct = [encode_jpeg(synthetic_image(rng, h, w), quality=90) for _ in range(min(n, 16))]
    for i in range(n):
        p = root / f"c{i % 4}" / f"{i:06d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(distinct[i % len(distinct)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--size", default="1024x768", help="WxH of the generated JPEGs")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="best of N runs per executor")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.lower().split("x"))

    import packer

    tmp = Path(tempfile.mkdtemp(prefix="bench_exec_"))
    try:
        make_images(tmp / "images", args.n, h, w)
        rows = []
        for executor, workers in (("inline", 1), ("thread", args.workers), ("process", args.workers)):
            best = None
            for r in range(args.repeat):
                out = tmp / f"{executor}{r}.lmdb"
                t = time.perf_counter()
                rep = packer.build(tmp / "images", None, out, workers=workers, executor=executor)
                dt = time.perf_counter() - t
                assert rep.published and rep.records == args.n
                best = dt if best is None else min(best, dt)
                shutil.rmtree(out)
            rows.append((executor, workers, best))
        base = rows[0][2]
        print(f"{args.n} JPEGs {w}x{h}, best of {args.repeat}:")
        for executor, workers, dt in rows:
            print(f"  {executor:8s} workers={workers:<3d} {dt:7.2f} s  {args.n / dt:8.1f} img/s  "
                  f"{args.n * w * h / dt / 1e6:8.1f} MP/s  x{base / dt:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
