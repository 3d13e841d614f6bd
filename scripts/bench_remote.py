#!/usr/bin/env python3
"""Streaming a dataset from an S3 server: packer against MosaicML MDS, LitData and WebDataset.

    python scripts/bench_remote.py --n 10000 --out .bench/remote.md [--peer-python .venv-peers/bin/python]

One set of ~500x375 JPEGs (generated, or ``--images DIR`` of real photos in class folders) is
written in each tool's own format (packer: a manifest over LMDB shards; MDS: ``MDSWriter``;
LitData: ``litdata.optimize``; WebDataset: ``ShardWriter`` tars), each uploaded to one bucket of
an S3-compatible server on loopback (``scripts/s3_server.sh``: moto; or ``--endpoint URL``). The
server is reached through a counting proxy, so requests and bytes per epoch are measured.

Each tool then reads two epochs from the bucket, in a process of its own, through a PyTorch
DataLoader (``--workers`` workers, batches of ``--batch``) with the same decode: libjpeg-turbo
full decode, resized to 224x224, uint8 batches. packer reads through ``readers.StoreDataset``
and ``readers.DistributedSampler(shuffle=False)`` (the peers' order; it hands the shard order to
the cache) with its node-local cache (``--cache-fraction`` of the dataset, 1.0 = unlimited); MDS through
``StreamingDataset(remote=..., local=...)`` (its cache limit set to the same bytes), LitData's
``StreamingDataset`` and WebDataset's ``pipe:aws s3 cp``. The baseline: the same packer store read
from local disk. Each row is the median of ``--repeats`` runs (a fresh cache each run).

On a machine of many cores, ``--server-cpus 12-15 --reader-cpus 0-11`` keeps the S3 server off the
readers' cores (on two cores they share them: the server's and proxy's CPU comes out of the
decode's). The readers get the caller's PYTHONPATH after the repo (packages installed with
``pip --target`` reach them).

MDS and LitData import torchvision; where the interpreter running this script has none, give
``--peer-python`` an interpreter that has them (scripts/install.sh documents one). A peer that
cannot run is reported as such, never left out silently.
"""
from __future__ import annotations

import argparse
import concurrent.futures
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DECODE = """
import numpy as np, cv2
from turbojpeg import TurboJPEG
_tj = None
def decode(data):
    global _tj
    if _tj is None:
        _tj = TurboJPEG()
    img = _tj.decode(bytes(data))            # BGR, full size
    return np.ascontiguousarray(cv2.resize(img, (224, 224), interpolation=cv2.INTER_LINEAR))
"""

# Each reader prints one JSON line per epoch: {"epoch": e, "images": n, "seconds": s}.
READERS = {
    "packer": """
        from readers import DistributedSampler, StoreDataset
        import torch
        def resize(t):                        # the same resize as the peers' decode()
            return torch.from_numpy(cv2.resize(t.numpy(), (224, 224), interpolation=cv2.INTER_LINEAR))
        opts = {"cache_dir": cache, "cache_limit": limit or None} if "://" in url else {}
        ds = StoreDataset(url, layout="HWC", transform=resize, **opts)   # libjpeg-turbo, checksums checked
        class D(torch.utils.data.Dataset):
            def __len__(self): return len(ds)
            def __getitem__(self, i): return ds[i][0]
        data = D()
        # the same order as the peers' (no shuffle), through the sampler packer's docs prescribe
        # for a store in a bucket: it hands each epoch's shard order to the cache (read-ahead and
        # eviction by next use); on a local store it plans nothing
        sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=False)
    """,
    "packer-local": None,
    "packer-half": None,
    "mds": """
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        import torch
        clean_stale_shared_memory()     # an earlier run's shared memory would hand over its index
        os.environ["S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"]
        sd = StreamingDataset(remote=url, local=cache, shuffle=False, batch_size=batch,
                              cache_limit=limit or None)
        class D(torch.utils.data.IterableDataset):
            def __iter__(self):
                for s in sd:
                    yield torch.from_numpy(decode(s["jpg"]))
        data = D()
    """,
    "litdata": """
        import litdata, torch
        try:     # its obstore client refuses plain http (the loopback server) unless told
            from litdata.streaming import downloader as _dl
            _dl._OBSTORE_CLIENT_OPTIONS = {**_dl._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
        except (ImportError, AttributeError):
            pass
        sd = litdata.StreamingDataset(url, cache_dir=cache, max_cache_size=limit or "100GB")
        class D(torch.utils.data.IterableDataset):
            def __iter__(self):
                for s in sd:
                    yield torch.from_numpy(decode(s["jpg"]))
        data = D()
    """,
    "webdataset": """
        import webdataset as wds, torch
        shards = json.loads(os.environ["BENCH_SHARDS"])
        urls = [f"pipe:aws s3 cp --quiet {u} -" for u in shards]
        class D(torch.utils.data.IterableDataset):
            def __iter__(self):
                # empty_check off: with fewer shards than workers some workers get none (the
                # images counted each epoch are checked against the dataset's length)
                ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node,
                                    workersplitter=wds.split_by_worker, empty_check=False)
                for s in ds:
                    yield torch.from_numpy(decode(s["jpg"]))
        data = D()
    """,
}

RUN = """
import json, os, sys, time
{decode}
url, cache, limit, batch, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
{body}
import torch
if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(data, batch_size=batch, num_workers=workers,
                                         sampler=globals().get("sampler"),
                                         persistent_workers=workers > 0)
    for epoch in range(2):
        t0, n = time.perf_counter(), 0
        for b in loader:
            assert b.dtype == torch.uint8 and b.shape[1:] == (224, 224, 3)
            n += b.shape[0]
        print(json.dumps({{"epoch": epoch, "images": n, "seconds": time.perf_counter() - t0}}), flush=True)
"""


def _make_some(folder: Path, ids: range, classes: int, seed: int) -> list:
    import cv2
    import numpy as np

    items = []
    for i in ids:
        rng = np.random.default_rng([seed, i])       # image i is the same whichever process makes it
        h, w = int(rng.integers(330, 420)), int(rng.integers(450, 520))
        base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = cv2.resize(base, (w, h), interpolation=cv2.INTER_CUBIC)
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        c = i % classes
        p = folder / f"c{c:02d}" / f"{i:06d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(p), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        items.append((p, c))
    return items


def make_images(folder: Path, n: int, classes: int = 10, seed: int = 0) -> list:
    """``n`` ~500x375 JPEGs (smooth colour fields with noise, quality 90) in class folders, made
    on every usable CPU (10,000 took 120 s on one core of the H200's host)."""
    from concurrent.futures import ProcessPoolExecutor

    procs = min(len(os.sched_getaffinity(0)), n // 500 or 1)
    step = max(1, -(-n // procs))      # n = 0: no part, no image
    with ProcessPoolExecutor(procs) as pool:
        parts = pool.map(_make_some, [folder] * procs, [range(k, min(n, k + step)) for k in range(0, n, step)],
                         [classes] * procs, [seed] * procs)
        return [item for part in parts for item in part]


def write_peers(items, work: Path, python: str, shard_bytes: int, wanted) -> dict:
    """Each wanted peer's own writer, in a process of its own: {name: local folder or error}."""
    listing = work / "items.json"
    listing.write_text(json.dumps([[str(p), c] for p, c in items]))
    code = {
        "mds": f"""
            from streaming import MDSWriter
            with MDSWriter(out=out, columns={{"jpg": "bytes", "cls": "int"}},
                           size_limit={shard_bytes}) as w:
                for p, c in items:
                    w.write({{"jpg": open(p, "rb").read(), "cls": c}})
        """,
        "litdata": f"""
            import litdata
            def one(item):
                p, c = item
                return {{"jpg": open(p, "rb").read(), "cls": c}}
            if __name__ == "__main__":
                litdata.optimize(fn=one, inputs=items, output_dir=out, chunk_bytes={shard_bytes}, num_workers=2)
        """,
        "webdataset": f"""
            import webdataset as wds
            os.makedirs(out, exist_ok=True)
            with wds.ShardWriter(out + "/data-%06d.tar", maxsize={shard_bytes}) as w:
                for i, (p, c) in enumerate(items):
                    w.write({{"__key__": f"{{i:08d}}", "jpg": open(p, "rb").read(), "cls": c}})
        """,
    }
    out = {}
    for name, body in code.items():
        if name not in wanted:
            continue
        dest = work / name
        head = f"import json, os, sys\nitems = json.load(open({str(listing)!r}))\nout = {str(dest)!r}\n"
        script = work / f"write_{name}.py"       # a file, not -c: spawned workers import its functions
        script.write_text(head + textwrap.dedent(body))
        r = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=3600)
        out[name] = dest if r.returncode == 0 else f"writer failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    return out


def upload_files(files, local: Path, url: str) -> list:
    """Upload ``files`` (under ``local``) to ``url`` at their paths relative to ``local``, 8 at a
    time; their URLs, in the order given."""
    from packer.core import remote
    urls = [remote.join(url, Path(f).relative_to(local).as_posix()) for f in files]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda f, u: remote.upload(str(f), u), files, urls))
    return urls


def upload_folder(local: Path, url: str) -> list:
    return upload_files(sorted(p for p in local.rglob("*") if p.is_file()), local, url)


def pinned(cpus) -> list:
    """``taskset -c CPUS`` in front of a command where CPUS is given (the S3 server and the readers
    on cores of their own), else nothing."""
    return ["taskset", "-c", cpus] if cpus else []


def run_reader(name, python, url, cache, limit, args, env) -> list:
    script = Path(cache).parent / f"read_{name}.py"
    script.write_text(RUN.format(decode=DECODE, body=textwrap.dedent(READERS[name] or READERS["packer"])))
    r = subprocess.run([*pinned(args.reader_cpus), python, str(script), url, cache, str(limit), str(args.batch),
                        str(args.workers)], capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(" | ".join((r.stderr or r.stdout).strip().splitlines()[-12:]))
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def _cpu_seconds(server_pid) -> tuple:
    """CPU seconds so far of (the readers run and reaped: this process's children; the S3
    server, when this script started it; this process: the counting proxy's thread)."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = 0.0
    if server_pid:
        try:
            with open(f"/proc/{server_pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            server = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return kids.ru_utime + kids.ru_stime, server, time.process_time()


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--images", type=Path, help="class folders of JPEGs instead of generated ones")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--cache-fraction", type=float, default=1.0)
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="delay the proxy adds before answering each request (S3's first-byte latency "
                         "is typically 10-100 ms; loopback has none)")
    ap.add_argument("--endpoint", help="an S3-compatible server (default: start scripts/s3_server.sh)")
    ap.add_argument("--server-cpus", help="run the S3 server started here on these CPUs (taskset -c list, "
                                          "e.g. 12-15): on a machine of many cores, apart from the readers")
    ap.add_argument("--reader-cpus", help="run each reader (and its DataLoader workers) on these CPUs (e.g. 0-11)")
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--tools", default="packer,packer-half,mds,litdata,webdataset",
                    help="packer-half: packer from the bucket with a cache of half the dataset")
    ap.add_argument("--work", type=Path, help="work folder (default: a temp folder, removed)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import boto3

    from packer import build
    from tests.s3_support import FaultProxy

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_remote_"))
    work.mkdir(parents=True, exist_ok=True)
    server_dir = work / "s3server"
    endpoint = args.endpoint or subprocess.check_output(
        [*pinned(args.server_cpus), "bash", str(REPO / "scripts/s3_server.sh"), "--dir", str(server_dir), "start"],
        text=True).strip()
    proxy = FaultProxy(endpoint)
    server_pid = None if args.endpoint else int((server_dir / "server.pid").read_text())
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy.url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
               AWS_DEFAULT_REGION="us-east-1", AWS_ALLOW_HTTP="true",  # obstore (LitData): plain http on loopback
               # the repo first, then what the caller's PYTHONPATH holds (packages installed with --target)
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    os.environ.update({k: env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_DEFAULT_REGION")})
    bucket = f"bench-remote-{os.urandom(4).hex()}"   # a bucket of its own: --endpoint may serve earlier runs
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="b",
                 aws_secret_access_key="b").create_bucket(Bucket=bucket)
    rows, notes = [], []
    try:
        t0 = time.perf_counter()
        if args.images:
            items = [(p, i) for i, d in enumerate(sorted(x for x in args.images.iterdir() if x.is_dir()))
                     for p in sorted(d.glob("*.jpg"))][: args.n]
            img_dir = args.images
        else:
            img_dir = work / "images"
            items = make_images(img_dir, args.n)
        total_bytes = sum(p.stat().st_size for p, _ in items)
        notes.append(f"{len(items)} JPEGs, {total_bytes / 2**20:.0f} MiB, made in {time.perf_counter() - t0:.0f} s")

        tools = args.tools.split(",")
        urls = {}
        if "packer" in tools:
            local_store = str(work / "local.packer-manifest.json")
            t0 = time.perf_counter()
            build(str(img_dir), None, local_store, format="manifest")
            local_build = time.perf_counter() - t0
            t0 = time.perf_counter()
            packer_url = f"s3://{bucket}/packer/train.packer-manifest.json"
            build(str(img_dir), None, packer_url, format="manifest", report_path=str(work / "remote.report.json"),
                  store_options={"shard_bytes": f"{args.shard_mb}M"})   # the peers' shard size
            remote_build = time.perf_counter() - t0
            notes.append(f"packer build to local disk {len(items) / local_build:.0f} img/s, "
                         f"to the bucket (build + upload) {len(items) / remote_build:.0f} img/s")
            urls = {"packer": packer_url, "packer-local": local_store, "packer-half": packer_url}
            # the build from the bucket: the same JPEGs as objects, listed and read by the build
            upload_files([p for p, _ in items], img_dir, f"s3://{bucket}/images/")
        peer_tools = [t for t in tools if not t.startswith("packer")]
        peers = write_peers(items, work, args.peer_python, args.shard_mb * 2**20, peer_tools) if peer_tools else {}
        for name, dest in peers.items():
            if isinstance(dest, Path):
                up = upload_folder(dest, f"s3://{bucket}/{name}/")
                urls[name] = f"s3://{bucket}/{name}" if name != "webdataset" else json.dumps(up)
            else:
                notes.append(f"{name}: {dest}")
        proxy.delay(args.latency_ms / 1000)     # uploads above ran without it
        if "packer" in tools:   # the build from the bucket (list + one GET per object), with the latency
            t0 = time.perf_counter()
            build(f"s3://{bucket}/images/", None, str(work / "from_bucket.packer-manifest.json"), format="manifest",
                  report_path=str(work / "from_bucket.report.json"))
            from_bucket = time.perf_counter() - t0
            notes.append(f"packer build from the bucket (list + GET each object) to local disk "
                         f"{len(items) / from_bucket:.0f} img/s ({local_build / from_bucket:.2f}x from local disk)")
        store_bytes = total_bytes
        limit = 0 if args.cache_fraction >= 1 else int(store_bytes * args.cache_fraction)
        if "packer-half" in tools:
            notes.append(f"packer-half: cache_limit {store_bytes / 2 / 2**20:,.0f} MiB (half the JPEG bytes)")
        readers = (["packer-local"] if "packer" in tools else []) + tools
        for name in readers:
            # the table so far, rewritten after each reader: a run stopped at a time cap keeps its rows
            _save(report(rows, notes + [f"(partial: {len(rows)} of {len(readers)} readers done)"], args), args)
            if name not in urls:
                rows.append((name, None, None, None, None, None, "not run"))
                continue
            runs, reqs, cpus = [], [], []
            python = sys.executable if name.startswith("packer") else args.peer_python
            for rep in range(args.repeats):
                cache = work / f"cache-{name}-{rep}"    # a fresh folder each run (MDS keys shared memory by it)
                shutil.rmtree(cache, ignore_errors=True)
                e = dict(env)
                url = urls[name]
                if name == "webdataset":
                    e["BENCH_SHARDS"], url = url, "-"
                before = dict(proxy.counts), proxy.bytes_out
                lim = int(store_bytes / 2) if name == "packer-half" else limit
                cpu0 = _cpu_seconds(server_pid)
                try:
                    epochs = run_reader(name, python, url, str(cache), lim, args, e)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    notes.append(f"{name}: failed: {exc}")
                    break
                cpu1 = _cpu_seconds(server_pid)
                counts = [x["images"] for x in epochs]
                if len(epochs) != 2 or min(counts) < len(items):     # a reader that lost images
                    notes.append(f"{name}: failed: {len(epochs)} epochs read, images {counts}"
                                 f" where the dataset has {len(items)}")
                    break
                if max(counts) > len(items) and rep == 0:           # padding (MDS evens out partitions)
                    notes.append(f"{name}: images per epoch {counts} (the dataset has {len(items)})")
                print(f"{name} run {rep + 1}: " + ", ".join(
                    f"epoch {k + 1} {x['images'] / x['seconds']:,.0f} img/s" for k, x in enumerate(epochs)), flush=True)
                cpus.append(tuple(b - a for a, b in zip(cpu0, cpu1)))
                reqs.append((sum(proxy.counts.values()) - sum(before[0].values()), proxy.bytes_out - before[1]))
                runs.append((epochs, dir_bytes(cache)))
                shutil.rmtree(cache, ignore_errors=True)
            if not runs:
                rows.append((name, None, None, None, None, None, "failed"))
                continue
            e1 = statistics.median(r[0][0]["images"] / r[0][0]["seconds"] for r in runs)
            e2 = statistics.median(r[0][1]["images"] / r[0][1]["seconds"] for r in runs)
            cache_max = max(r[1] for r in runs)
            rq = statistics.median(q[0] for q in reqs) if reqs else 0
            gb = statistics.median(q[1] for q in reqs) / 2**20 if reqs else 0
            cpu = tuple(statistics.median(c[k] for c in cpus) for k in range(3))
            rows.append((name, e1, e2, cache_max, (rq, gb), cpu, ""))
    finally:
        proxy.close()
        if not args.endpoint:
            subprocess.run(["bash", str(REPO / "scripts/s3_server.sh"), "--dir", str(server_dir), "stop"])
    text = report(rows, notes, args)
    print(text)
    _save(text, args)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _save(text: str, args) -> None:
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, args.out)


def report(rows, notes, args) -> str:
    best = max((r[1] for r in rows if r[1] and not r[0].startswith("packer")), default=None)
    pk = {r[0]: r for r in rows}
    lines = [f"# bench_remote: {platform.node()} ({os.cpu_count()} CPUs), {platform.python_version()}",
             f"workers {args.workers}, batch {args.batch}, repeats {args.repeats} (median), "
             f"cache fraction {args.cache_fraction}, latency {args.latency_ms:g} ms per request"
             + (f", S3 server on CPUs {args.server_cpus}" if args.server_cpus else "")
             + (f", readers on CPUs {args.reader_cpus}" if args.reader_cpus else ""), "",
             "| reader | epoch 1 img/s | epoch 2 img/s | cache MiB at the end | requests (2 epochs) | MiB served "
             "| CPU s: reader / S3 server / proxy | |",
             "|---|---|---|---|---|---|---|---|"]
    for name, e1, e2, cache, rq, cpu, why in rows:
        if e1 is None:
            lines.append(f"| {name} | | | | | | | {why} |")
            continue
        lines.append(f"| {name} | {e1:,.0f} | {e2:,.0f} | {cache / 2**20:,.0f} | {rq[0]:,} | {rq[1]:,.0f} "
                     f"| {cpu[0]:.1f} / {cpu[1]:.1f} / {cpu[2]:.1f} | |")
    lines.append("")
    if best and pk.get("packer") and pk["packer"][1]:
        lines.append(f"packer epoch 1 / best peer epoch 1: **{pk['packer'][1] / best:.2f}x**")
    if pk.get("packer") and pk["packer"][2] and pk.get("packer-local") and pk["packer-local"][2]:
        ratio = pk["packer"][2] / pk["packer-local"][2]
        lines.append(f"packer epoch 2 (cache) / packer from local disk: **{ratio:.2f}x**")
    if pk.get("packer") and pk["packer"][2] and pk.get("packer-half") and pk["packer-half"][2]:
        half = pk["packer-half"]
        lines.append(f"packer epoch 2 with a cache of half the dataset / unlimited: "
                     f"**{half[2] / pk['packer'][2]:.2f}x** (cache at the end {half[3] / 2**20:,.0f} MiB)")
    lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
