#!/usr/bin/env python
"""How long repair, convert and export take, next to the build that made the store.

One generated dataset (``packer.sample.make_dataset``), one LMDB build (the baseline: it reads,
checks and decodes every image), then on the same store: ``verify --deep``, ``convert`` to HDF5
(no decode, bytes copied and re-checksummed), ``repair`` of a healthy store (a no-op: one deep
check), ``repair`` after flipping bytes in 1% of the records (deep check + full rewrite), and
``export`` back to a folder. Single process (``workers=1`` for the build), wall-clock seconds,
records/s. Numbers depend on the machine and on what else runs on it: compare rows of one run.

Usage::

    python scripts/bench_repair.py --images 400 --size 375x500
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer import build, convert, export, repair, verify  # noqa: E402
from packer.sample import make_dataset  # noqa: E402


def _flip(loc: str, every: int) -> int:
    import lmdb
    env = lmdb.open(loc, max_dbs=8, map_size=2 * (Path(loc) / "data.mdb").stat().st_size + (64 << 20))
    db = env.open_db(b"data")
    n = 0
    with env.begin(write=True) as t:
        for k, v in list(t.cursor(db)):
            if struct.unpack(">Q", k)[0] % every == 0:
                b = bytearray(v)
                mid = len(b) // 2
                b[mid:mid + 8] = bytes(x ^ 0x5A for x in b[mid:mid + 8])
                t.put(k, bytes(b), db=db)
                n += 1
    env.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--size", default="375x500", help="HxW of the generated JPEGs")
    args = ap.parse_args()
    h, w = (int(v) for v in args.size.split("x"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images, labels = make_dataset(tmp / "ds", args.images, kind="boxes", sizes=((h, w),), seed=0)
        loc = str(tmp / "s.lmdb")

        def timed(name, fn):
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            rows.append({"step": name, "seconds": round(dt, 3), "records_per_s": round(args.images / dt, 1)})
            return out

        timed("build lmdb (baseline: read + check + decode)", lambda: build(images, labels, loc, "lmdb", workers=1))
        timed("verify --deep", lambda: verify(loc, deep=True))
        timed("convert lmdb -> hdf5", lambda: convert(loc, str(tmp / "s.h5"), "hdf5"))
        timed("repair, healthy store (no-op)", lambda: repair(loc))
        flipped = _flip(loc, 100)
        rep = timed(f"repair, {flipped} damaged records (quarantine + rewrite)", lambda: repair(loc))
        assert rep.ok and rep.quarantined == flipped
        timed("export hdf5 -> folder", lambda: export(str(tmp / "s.h5"), tmp / "out"))
    print(json.dumps({"images": args.images, "size": args.size, "rows": rows}, indent=1))
    width = max(len(r["step"]) for r in rows)
    for r in rows:
        print(f"{r['step']:<{width}}  {r['seconds']:8.2f} s  {r['records_per_s']:9.1f} rec/s")


if __name__ == "__main__":
    main()
