#!/usr/bin/env python3
"""Import and export speed of packer's interchange formats, beside each peer library's own writer.

    python scripts/bench_interchange.py --n 2000 --out .bench/interchange.md
    python scripts/bench_interchange.py --images .bench/sets/small --out .bench/interchange.md

For each format X (webdataset, hf, mds, tfrecord), each step in a process of its own, on the same
JPEG files (class folders; generated ~500x375 images unless --images is given):

* ``folder build``: ``packer build IMAGES -o s.lmdb`` (the baseline: every image strictly decoded);
* ``peer writer``: the peer library writes X from the same files (webdataset.ShardWriter,
  datasets ``Dataset.from_dict(...).cast_column(Image()).save_to_disk``, streaming.MDSWriter,
  tfrecord.TFRecordWriter): what a user of that stack runs to make X, with no checks;
* ``peer conversion`` (MDS only): streaming.MDSWriter fed by webdataset.WebDataset, the issue's
  example of a native conversion between two stacks;
* ``packer import``: ``packer build X -o x.lmdb`` (the same checks as a folder build);
* ``packer export``: ``packer export s.lmdb OUT --to X``.

Prints images/s per step and the ratios the issue asks for (import vs folder build, import and
export vs the peer writer), with the machine. Each timing is the median of --repeats runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PEER_WRITERS = {
    "webdataset": """
        import webdataset as wds
        Path(out).mkdir(parents=True, exist_ok=True)
        with wds.ShardWriter(f"{out}/data-%06d.tar", maxcount=shard) as w:
            for i, (p, c) in enumerate(items):
                w.write({"__key__": f"{i:08d}", "jpg": open(p, "rb").read(), "cls": c})
    """,
    "hf": """
        import datasets
        ds = datasets.Dataset.from_dict({"image": [p for p, _ in items], "label": [c for _, c in items]})
        ds = ds.cast_column("image", datasets.Image()).cast_column("label", datasets.ClassLabel(names=names))
        ds.save_to_disk(out, max_shard_size="200MB")
    """,
    "mds": """
        from streaming import MDSWriter
        with MDSWriter(out=out, columns={"image": "bytes", "label": "int"},
                       size_limit=1 << 26) as w:
            for p, c in items:
                w.write({"image": open(p, "rb").read(), "label": c})
    """,
    "tfrecord": """
        import tfrecord
        Path(out).mkdir(parents=True, exist_ok=True)
        w = tfrecord.TFRecordWriter(f"{out}/data.tfrecord")
        for p, c in items:
            w.write({"image/encoded": (open(p, "rb").read(), "byte"), "image/class/label": (c, "int")})
        w.close()
    """,
}

PEER_CONVERSION_MDS = """
    import webdataset as wds
    from streaming import MDSWriter
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit=1 << 26) as w:
        for s in wds.WebDataset(sorted(str(p) for p in Path(src).glob("*.tar")), shardshuffle=False):
            w.write({"image": s["jpg"], "label": int(s["cls"])})
"""


def run(cmd, env=None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode not in (0,):
        raise SystemExit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-2000:]}")
    return dt


def peer(code: str, **values) -> list:
    """A command running ``code`` in a fresh interpreter with ``values`` bound (through a JSON file:
    the file list is too long for a command line)."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="bench-args-")
    with os.fdopen(fd, "w") as fh:
        json.dump(values, fh)
    prelude = (f"import json, sys\nfrom pathlib import Path\nglobals().update(json.load(open({path!r})))\n")
    return [sys.executable, "-c", prelude + textwrap.dedent(code)]


def packer(*args) -> list:
    return [sys.executable, "-m", "packer", *map(str, args)]


def items_of(images: Path):
    names = sorted(d.name for d in images.iterdir() if d.is_dir())
    items = [(str(p), names.index(d.name)) for d in sorted(images.iterdir()) if d.is_dir()
             for p in sorted(d.iterdir()) if p.suffix.lower() in (".jpg", ".jpeg")]
    return names, items


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, help="class folders of JPEGs (default: generated)")
    ap.add_argument("--n", type=int, default=2000, help="generated images (without --images)")
    ap.add_argument("--formats", default="webdataset,hf,mds,tfrecord")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-interchange-"))
    try:
        images = args.images
        if images is None:
            from packer.sample import make_dataset
            images, _ = make_dataset(work / "gen", args.n, kind="classes", sizes=((500, 375), (375, 500)), seed=0)
        names, items = items_of(Path(images))
        n = len(items)
        rows, lines = {}, []

        def timed(label, make_cmd, clean):
            times = []
            for _ in range(args.repeats):
                for c in clean:
                    shutil.rmtree(c, ignore_errors=True) if Path(c).is_dir() else Path(c).unlink(missing_ok=True)
                times.append(run(make_cmd()))
            rows[label] = n / statistics.median(times)
            print(f"{label:32s} {rows[label]:9.0f} img/s", flush=True)

        base = work / "folder.lmdb"
        timed("folder build", lambda: packer("build", images, "-o", base, "-q", "--no-resume"), [base])
        for fmt in args.formats.split(","):
            peer_out = work / f"peer-{fmt}"
            timed(f"{fmt}: peer writer", lambda: peer(PEER_WRITERS[fmt], out=str(peer_out), items=items,
                                                       names=names, shard=args.shard_size), [peer_out])
            if fmt == "mds" and (work / "peer-webdataset").is_dir():
                conv = work / "peer-wds2mds"
                timed("mds: peer conversion from wds", lambda: peer(PEER_CONVERSION_MDS, out=str(conv),
                                                                     src=str(work / "peer-webdataset")), [conv])
            imported = work / f"{fmt}.lmdb"
            timed(f"{fmt}: packer import", lambda: packer("build", peer_out, "-o", imported, "-q", "--no-resume"),
                  [imported])
            exported = work / f"export-{fmt}"
            timed(f"{fmt}: packer export", lambda: packer("export", base, exported, "--to", fmt,
                                                          "--shard-size", args.shard_size, "-q"), [exported])
            lines.append(f"| {fmt} | {rows[f'{fmt}: packer import']:.0f} | {rows['folder build']:.0f} | "
                         f"{rows[f'{fmt}: peer writer']:.0f} | {rows[f'{fmt}: packer export']:.0f} | "
                         f"{rows[f'{fmt}: packer import'] / rows['folder build']:.2f}x | "
                         f"{rows[f'{fmt}: packer import'] / rows[f'{fmt}: peer writer']:.2f}x | "
                         f"{rows[f'{fmt}: packer export'] / rows[f'{fmt}: peer writer']:.2f}x |")
        machine = f"{platform.node()}: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, " \
                  f"Python {platform.python_version()}"
        table = "\n".join([
            f"{n} JPEGs from {images if args.images else 'generated 500x375 images'}; {machine}; "
            f"median of {args.repeats} runs, images/s",
            "",
            "| format | packer import | folder build | peer writer | packer export | import / folder "
            "| import / peer writer | export / peer writer |",
            "|---|---:|---:|---:|---:|---:|---:|---:|", *lines])
        if "mds: peer conversion from wds" in rows:
            table += f"\n\nMDS written by streaming.MDSWriter fed by webdataset.WebDataset: " \
                     f"{rows['mds: peer conversion from wds']:.0f} img/s."
        print("\n" + table)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(table + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
