"""Store -> normalized GPU batch, against the usual baseline, on real photographs (run on a GPU).

    python3 scripts/bench_pipeline.py --sets .bench/sets --out OUT [--threads 12] [--batch 256]

For each set (``hd``: 1920x1080, ``small``: ~500 px; see scripts/make_bench_sets.py), one run:

(a) image files + PIL + torchvision transforms (RandomResizedCrop, flip, ToTensor, Normalize) in a
    DataLoader with ``threads`` workers, batches copied to the GPU (what users write);
(b) packer store + StoreDataset (libjpeg-turbo full decode on the CPU) in a DataLoader with the same
    workers + the gpu_ops train pipeline on the GPU (ragged, one launch per batch);
(c) packer store -> GPULoader: parallel raw reads (``threads``), nvJPEG batched decode,
    TrainPipeline, prefetch on a side stream;
(d) bare ``torchvision.io.decode_jpeg(list, device="cuda")`` of the same bytes, already in memory
    (the upper bound of (c));
plus the val and detection pipelines through GPULoader. ``--decoder`` names GPULoader's decoder for
the loader rows (default ``nvjpeg``); ``--device cpu`` runs only the loader rows, on the CPU (with
``--decoder turbojpeg``: what GPULoader does on a machine without a GPU). Images/s and CPU cores used (process +
worker CPU time / wall time). Batches are drawn with replacement from the set (the sets are small
so they can be carried to a GPU machine); every row sees the same number of images.
Writes OUT/bench_pipeline.md and .json.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import Timer  # noqa: E402  (sibling module: scripts/ is on sys.path when run as a script)

import gpu_ops  # noqa: E402
from packer.stores import open_store  # noqa: E402
from readers import StoreDataset, collate_list  # noqa: E402
from readers.gpu import DetectionPipeline, GPULoader, TrainPipeline, ValPipeline, read_raw  # noqa: E402


def extract_files(store: str, dest: Path) -> list:
    """The store's files back on disk (the bytes are stored unchanged), for row (a)."""
    files = []
    with open_store(store, "lmdb") as r:
        for i in range(r.metadata.count):
            rec = r.get(i)
            p = dest / rec.key
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.exists():
                p.write_bytes(bytes(rec.data))
            files.append((str(p), int(rec.label)))
    return files


class FileDataset(torch.utils.data.Dataset):
    def __init__(self, files, transform):
        self.files, self.transform = files, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.files[i]
        with Image.open(path) as im:
            return self.transform(im.convert("RGB")), label


def sampler(n: int, total: int, seed: int = 0):
    return torch.utils.data.RandomSampler(range(n), replacement=True, num_samples=total,
                                          generator=torch.Generator().manual_seed(seed))


def row_a(files, total, batch, workers):
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dl = torch.utils.data.DataLoader(FileDataset(files, tf), batch_size=batch, sampler=sampler(len(files), total),
                                     num_workers=workers, pin_memory=True, prefetch_factor=2)
    n = 0
    with Timer() as t:
        for x, y in dl:
            x = x.cuda(non_blocking=True)
            n += x.shape[0]
    return n, t


def row_b(store, total, batch, workers):
    ds = StoreDataset(store, layout="HWC")
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler(len(ds), total), num_workers=workers,
                                     collate_fn=collate_list, pin_memory=True, prefetch_factor=2)
    pipe = TrainPipeline(224)
    gen = torch.Generator().manual_seed(0)
    n = 0
    with Timer() as t:
        for samples in dl:
            imgs = [s[0] for s in samples]
            rb = gpu_ops.RaggedBatch.from_list(imgs)  # one pinned buffer on the host ...
            rb = gpu_ops.RaggedBatch(rb.data.pin_memory().cuda(non_blocking=True),  # ... one H2D copy
                                     rb.index.cuda(non_blocking=True), rb.sizes, rb.channels, rb.layout)
            x = pipe(rb, generator=gen)
            n += x.shape[0]
    return n, t


STATS = {}


def loader_row(store, pipeline, total, batch, threads, decoder="nvjpeg", check=True, key=None, workers=0,
               device="cuda"):
    with GPULoader(store, pipeline, batch_sampler=torch.utils.data.BatchSampler(
            sampler(len(open_raw_count(store)), total), batch, False), device=device, decoder=decoder,
            threads=threads, prefetch=3, check=check, workers=workers) as loader:
        for i, b in enumerate(loader):  # warm-up epoch part: allocator, nvJPEG handles
            if i == 1:
                break
        n = 0
        with Timer() as t:
            for b in loader:
                out = b.images.images if hasattr(b.images, "images") else b.images
                n += out.shape[0]
        STATS[key] = {k: round(v, 3) for k, v in loader.stats.items()}
    return n, t


def open_raw_count(store):
    with open_store(store, "lmdb") as r:
        return range(r.metadata.count)


def row_d(store, total, batch):
    import torchvision.io as tvio

    with open_store(store, "lmdb") as r:
        raw = read_raw(r, list(range(r.metadata.count)), check=False)
    datas = [d.clone() for d in raw.datas()]
    idx = list(sampler(len(datas), total))
    batches = [[datas[i] for i in idx[s : s + batch]] for s in range(0, total, batch)]
    tvio.decode_jpeg(batches[0][:8], device="cuda")  # warm-up
    n = 0
    with Timer() as t:
        for bt in batches:
            out = tvio.decode_jpeg(bt, device="cuda", mode=tvio.ImageReadMode.RGB)
            n += len(out)
    return n, t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=Path, default=Path(".bench/sets"))
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--images", type=int, default=0, help="images per row (default: per set)")
    ap.add_argument("--only", default="a,b,c,c_t4,c_workers,c_nocheck,d,val,val_workers,det,det_workers")
    ap.add_argument("--decoder", default="nvjpeg", help="GPULoader's decoder in the loader rows")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the loader rows only, on the CPU")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    import torchvision

    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "none (--device cpu)"
    env = {"gpu": gpu, "torch": torch.__version__, "torchvision": torchvision.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "cpus": os.cpu_count(),
           "threads": a.threads, "batch": a.batch, "decoder": a.decoder}
    print(json.dumps(env))
    rows = []
    only = set(a.only.split(","))
    if a.device == "cpu":
        only -= {"a", "b", "d"}  # the GPU's own rows
    row = functools.partial(loader_row, decoder=a.decoder, device=a.device)
    for name, default_total in (("hd", 256 * 20), ("small", 256 * 40)):
        store = str(a.sets / f"{name}.lmdb")
        if not os.path.exists(store):
            print(f"missing {store}; skipped")
            continue
        total = a.images or default_total
        files = extract_files(store, a.out / "files" / name)
        runs = [
            ("d", "bare batched decode_jpeg (bytes in memory)", lambda: row_d(store, total, a.batch)),
            ("c", f"store -> GPULoader ({a.decoder}, TrainPipeline, prefetch)",
             lambda: row(store, TrainPipeline(224), total, a.batch, a.threads, key=(name, "c"))),
            ("c_t4", "same as (c), 4 reader threads",
             lambda: row(store, TrainPipeline(224), total, a.batch, 4, key=(name, "c_t4"))),
            ("c_workers", f"same as (c), reading in {a.threads} worker processes (workers=)",
             lambda: row(store, TrainPipeline(224), total, a.batch, a.threads, workers=a.threads,
                                key=(name, "c_workers"))),
            ("val_workers", f"ValPipeline, reading in {a.threads} worker processes",
             lambda: row(store, ValPipeline(256, 224), total, a.batch, a.threads, workers=a.threads,
                                key=(name, "val_workers"))),
            ("det_workers", f"DetectionPipeline, batch 32, reading in {a.threads} worker processes",
             lambda: row(store, DetectionPipeline((1333, 800)), min(total, 256 * 6), min(a.batch, 32),
                                a.threads, workers=a.threads, key=(name, "det_workers"))),
            ("c_nocheck", "same as (c), check=False (no record checksums)",
             lambda: row(store, TrainPipeline(224), total, a.batch, a.threads, check=False,
                                key=(name, "c_nocheck"))),
            ("val", "store -> GPULoader, ValPipeline(256, 224)",
             lambda: row(store, ValPipeline(256, 224), total, a.batch, a.threads, key=(name, "val"))),
            ("det", "store -> GPULoader, DetectionPipeline(1333, 800), batch 32",
             lambda: row(store, DetectionPipeline((1333, 800)), min(total, 256 * 6), min(a.batch, 32),
                                a.threads, key=(name, "det"))),
            ("b", "store + CPU decode (DataLoader) + gpu_ops train",
             lambda: row_b(store, min(total, 256 * 8), a.batch, a.threads)),
            ("a", "files + PIL + torchvision transforms (DataLoader)",
             lambda: row_a(files, min(total, 256 * 8), a.batch, a.threads)),
        ]
        for key, label, fn in runs:
            if key not in only:
                continue
            try:
                n, t = fn()
            except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
                print(f"{name} ({key}) failed: {type(exc).__name__}: {exc}")
                rows.append({"set": name, "row": key, "what": label, "error": f"{type(exc).__name__}: {exc}"})
                continue
            r = {"set": name, "row": key, "what": label, "images": n, "wall_s": round(t.wall, 3),
                 "img_s": round(n / t.wall, 1), "cpu_cores": round(t.cpu / t.wall, 2)}
            if (name, key) in STATS:
                r["stage_host_s"] = STATS[(name, key)]
            rows.append(r)
            print(json.dumps(r), flush=True)
    lines = [f"GPU {env['gpu']}, decoder {a.decoder}, torch {env['torch']}, torchvision {env['torchvision']}, "
             f"CUDA {env['cuda']}, "
             f"Python {env['python']}, {env['cpus']} CPUs, {a.threads} threads/workers, batch {a.batch}", "",
             "| set | row | what | img/s | CPU cores used |", "|---|---|---|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['set']} | {r['row']} | {r['what']} | failed: {r['error'][:80]} | |")
        else:
            lines.append(f"| {r['set']} | {r['row']} | {r['what']} | {r['img_s']:,.0f} | {r['cpu_cores']} |")
    for name in ("hd", "small"):
        d = next((r for r in rows if r["set"] == name and r["row"] == "d" and "img_s" in r), None)
        for ck in ("c", "c_workers"):
            c = next((r for r in rows if r["set"] == name and r["row"] == ck and "img_s" in r), None)
            if c and d:
                lines.append(f"\n{name}: ({ck}) / (d) = {c['img_s'] / d['img_s']:.0%} (target >= 90%)")
    (a.out / "bench_pipeline.md").write_text("\n".join(lines) + "\n")
    (a.out / "bench_pipeline.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
