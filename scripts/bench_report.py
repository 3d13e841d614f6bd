"""Time ``packer report`` on a large synthetic store, next to a full checksum verify of it.

The store (LMDB, YOLO boxes, tiny JPEGs) is written through the store writer directly, not
through ``packer build`` (which would spend its time checking images), so a 200k-record store
takes about a minute to make. The report samples; verify reads every record: the two side by
side show what sampling saves, and that the report's cost does not grow with the store.

    PYTHONPATH=. python3 scripts/bench_report.py --count 200000 --dir /tmp/bench_report
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import time
from pathlib import Path

import numpy as np


def make_store(location: str, count: int, seed: int = 0) -> None:
    from packer import __version__
    from packer.core.records import IndexHasher, Record, StoreMetadata, checksum
    from packer.jobs.steps import add_stats
    from packer.sample import encode_jpeg, synthetic_image
    from packer.stores import get_store
    from packer.stores.base import ResumeState

    rng = np.random.default_rng(seed)
    sizes = [(48, 64), (60, 80), (96, 128), (120, 160), (75, 100)]
    pool = []
    for i in range(64):  # distinct JPEGs reused round-robin: the store is big, making it is cheap
        h, w = sizes[i % len(sizes)]
        data = encode_jpeg(synthetic_image(rng, h, w), quality=85)
        pool.append((data, w, h, checksum(data)))
    names = [f"class_{c:02d}" for c in range(20)]
    state = ResumeState(fingerprint="bench")
    with get_store("lmdb").create_writer(location, commit_bytes=64 << 20) as writer:
        state = writer.open("bench", resume=False)
        for i in range(count):
            data, w, h, s = pool[i % len(pool)]
            n = int(rng.integers(0, 5))
            wh = rng.uniform(0.05, 0.5, (n, 2))
            c = rng.uniform(wh / 2, 1 - wh / 2)
            label = np.concatenate([rng.integers(0, len(names), (n, 1)), c, wh], 1).astype(np.float32)
            rec = Record(index=i, key=f"part{i % 100:02d}/img_{i:07d}.jpg", data=data, label=label, width=w,
                         height=h, channels=3, source_format="jpeg", converted="", orientation=1, checksum=s,
                         source_checksum=s, source_size=len(data))
            writer.add(rec)
            add_stats(state.stats, rec, "boxes")
            state.next_index = state.next_input = i + 1
            writer.checkpoint(state)
        writer.flush()
        hasher = IndexHasher()
        for idx, key, rec_sum in writer.iter_index():
            hasher.update(idx, key, rec_sum)
        meta = StoreMetadata(format="lmdb", count=count, label_schema="boxes", class_names=names,
                             build_options={"bench": True}, index_checksum=hasher.hexdigest(),
                             packer_version=__version__,
                             created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             stats=dict(state.stats, inputs=count, rejected=0, ignored=0))
        writer.publish(meta, overwrite=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--dir", default="/tmp/bench_report")
    ap.add_argument("--keep", action="store_true", help="reuse an existing store of that size")
    ap.add_argument("--no-verify", action="store_true", help="skip the verify baseline")
    args = ap.parse_args()

    import packer
    from packer.report import write_html

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    loc = str(root / f"bench_{args.count}.lmdb")
    if not (args.keep and os.path.exists(loc)):
        shutil.rmtree(loc, ignore_errors=True)
        t = time.perf_counter()
        make_store(loc, args.count)
        print(f"made {args.count} records in {time.perf_counter() - t:.1f} s "
              f"({sum(f.stat().st_size for f in Path(loc).iterdir()) / 2**20:.0f} MiB)")
    t = time.perf_counter()
    import matplotlib  # noqa: F401  (timed on its own: a one-off per process)
    print(f"import matplotlib: {time.perf_counter() - t:.2f} s")
    for run in (1, 2):
        t = time.perf_counter()
        out = write_html(root / "report.html", loc)
        print(f"report run {run}: {time.perf_counter() - t:.2f} s, {out.stat().st_size / 2**20:.2f} MiB")
    t = time.perf_counter()
    packer.info(loc)
    print(f"info (with pixel stats of 256 records): {time.perf_counter() - t:.2f} s")
    if not args.no_verify:
        t = time.perf_counter()
        rep = packer.verify(loc)
        print(f"baseline: verify (every checksum, no decode): {time.perf_counter() - t:.2f} s, ok={rep.ok}")


if __name__ == "__main__":
    main()
