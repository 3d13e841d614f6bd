#!/usr/bin/env python
"""CPU training-input benchmark: images/s and CPU ms/image of the usual training transform
(RandomResizedCrop(224) + horizontal flip -> uint8 tensors) and of full-size decode, for
torchvision ImageFolder+PIL, packer (StoreDataset full decode; CropDataset crop-aware batch
decode), FFCV, WebDataset, MosaicML Streaming (MDS) and LitData, in one run, on the same photos,
with the same cores (``--workers`` DataLoader workers, or the tool's own loader with that many
threads) and batch size.

Corpus: ``scripts/bench_read.py``'s sets (real photographs from scripts/get_bench_images.sh,
cropped/resized to 1920x1080 and 500x375, JPEG q90 4:2:0). Every tool stores the same JPEG bytes
(FFCV's writer re-encodes by default; here it is handed the original files' bytes).

Each row runs in a process of its own in each round, as users run a tool: a fresh interpreter
builds the loader, runs one warm-up epoch (page cache, worker start), then ``--timed-epochs``
timed epochs (default 2), and exits. ``--repeats`` rounds, the rows interleaved round-robin
(the order rotates each round, so no row always follows the same one) so background load
spreads over all rows; the median round is reported, and each row's img/s over FFCV's in the
same round. Why processes: in one shared
process the tools' thread pools, allocators and worker processes outlive their row and disturb
the next (FFCV swung 134-209 img/s between rounds that way). CPU ms/image = CPU seconds of the
loader's processes (main + workers, from /proc) per image, so threads and workers count alike.

Rows (``--rows``; a row whose tool is not installed is reported as skipped, with the reason):

    folder-pil      torchvision ImageFolder, PIL decode; rrc: T.RandomResizedCrop + flip on PIL
    packer          StoreDataset (LMDB), full decode; rrc: torchvision v2 RRC + flip on the tensor
    packer-hwc      StoreDataset(layout="HWC"), full decode only: the same output layout as FFCV's
    packer-crop     CropDataset (LMDB) + RandomResizedCrop: crop-aware batch decode in C++
                    (full: ResizeCenterCrop is not "full", so this row runs only for rrc)
    packer-crop-t   the same without DataLoader workers: one process, --workers decode threads
    packer-full-batch  CropDataset(FullDecode(), layout="HWC"): full decode of a whole batch in one
                    compiled call (rows written straight into the batch tensor), full only
    packer-full-batch-t  the same without DataLoader workers: --workers decode threads
    packer-full-batch-fast, packer-full-batch-t-fast  the same with FullDecode(dct="fast"): libjpeg's
                    IFAST IDCT, as FFCV decodes (TJFLAG_FASTDCT); pixels within a few levels of exact
    packer-crop-bl, packer-full-bl, packer-full-bl-fast  packer-crop-t / packer-full-batch-t(-fast)
                    through readers.BatchLoader instead of a worker-less DataLoader: reads of the
                    next batch on a thread beside the decode (--workers decode threads + 1 reader)
    ffcv            FFCV .beton (jpg), FFCV Loader (its threads); Simple/RandomResizedCrop decoder
    wds             WebDataset tar shards, PIL decode
    mds             MosaicML Streaming MDS (jpeg column -> PIL)
    litdata         LitData optimize() + StreamingDataset (PIL image column)

Usage::

    python scripts/bench_train_cpu.py --sets 1080p,500x375 --out .bench/bench_train_cpu.md
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_read", REPO / "scripts" / "bench_read.py")
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)

ROWS = ("folder-pil", "packer", "packer-hwc", "packer-crop", "packer-crop-t", "packer-full-batch",
        "packer-full-batch-t", "packer-full-batch-fast", "packer-full-batch-t-fast", "packer-crop-bl", "packer-full-bl",
        "packer-full-bl-fast", "ffcv", "wds", "mds", "litdata")
# one process, torch.set_num_threads(--workers)
THREADED = ("packer-crop-t", "packer-full-batch-t", "packer-full-batch-t-fast", "packer-crop-bl", "packer-full-bl",
            "packer-full-bl-fast")
CROP = 224


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# transforms shared by the PIL-based rows
# ---------------------------------------------------------------------------------------------
def pil_transform(mode):
    from torchvision import transforms as T

    if mode == "rrc":
        return T.Compose([T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.PILToTensor()


def collate_labels(batch):
    from torch.utils.data import default_collate

    return default_collate([(b[0], int(b[1])) for b in batch])


# ---------------------------------------------------------------------------------------------
# rows: each returns an iterable factory "epoch() -> iterator of (images, labels)" and pids()
# ---------------------------------------------------------------------------------------------
class TorchRow:
    def __init__(self, ds, args, collate=collate_labels, workers=None):
        w = args.workers if workers is None else workers
        self.loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=w, collate_fn=collate,
                                 generator=torch.Generator().manual_seed(0), persistent_workers=w > 0,
                                 multiprocessing_context="fork" if w > 0 else None)
        self.n = len(ds)

    def __iter__(self):
        return iter(self.loader)

    def pids(self):
        it = getattr(self.loader, "_iterator", None)
        return [os.getpid()] + [p.pid for p in getattr(it, "_workers", []) or []]

    def close(self):
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


class IterRow(TorchRow):
    """Iterable-style datasets (WebDataset, MDS, LitData): the DataLoader batches."""

    def __init__(self, ds, n, args, collate=collate_labels):
        w = args.workers
        self.loader = DataLoader(ds, batch_size=args.batch_size, num_workers=w, collate_fn=collate,
                                 persistent_workers=w > 0, multiprocessing_context="fork" if w > 0 else None)
        self.n = n


def row_folder_pil(set_dir, work, mode, args):
    from torchvision.datasets import ImageFolder

    return TorchRow(ImageFolder(str(set_dir), transform=pil_transform(mode)), args)


def _lmdb(set_dir, work):
    import packer

    loc = work / "stores" / f"{set_dir.name}.lmdb"
    if not loc.exists():
        loc.parent.mkdir(parents=True, exist_ok=True)
        packer.build(set_dir, None, loc, workers=os.cpu_count())
    return loc


def row_packer(set_dir, work, mode, args):
    from readers import StoreDataset

    tf = None
    if mode == "rrc":
        from torchvision.transforms import v2

        tf = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()])
    return TorchRow(StoreDataset(_lmdb(set_dir, work), transform=tf), args)


def row_packer_hwc(set_dir, work, mode, args):
    from readers import StoreDataset

    if mode == "rrc":
        raise SkipRow("full decode only (HWC output, as FFCV's)")
    return TorchRow(StoreDataset(_lmdb(set_dir, work), layout="HWC"), args)


def row_packer_crop(set_dir, work, mode, args, threads=False):
    from readers import CropDataset, RandomResizedCrop, collate_decoded

    if mode != "rrc":
        raise SkipRow("crop-aware path: rrc only (full decode is the 'packer' row)")
    ds = CropDataset(_lmdb(set_dir, work), RandomResizedCrop(CROP))
    if threads:
        torch.set_num_threads(args.workers)
        return TorchRow(ds, args, collate=collate_decoded, workers=0)
    return TorchRow(ds, args, collate=collate_decoded)


def row_packer_full_batch(set_dir, work, mode, args, threads=False, dct="exact"):
    from readers import CropDataset, FullDecode, collate_decoded

    if mode != "full":
        raise SkipRow("full decode only (the crop rows are packer-crop*)")
    ds = CropDataset(_lmdb(set_dir, work), FullDecode(dct=dct), layout="HWC")
    if threads:
        torch.set_num_threads(args.workers)
        return TorchRow(ds, args, collate=collate_decoded, workers=0)
    return TorchRow(ds, args, collate=collate_decoded)


class BatchLoaderRow(TorchRow):
    """packer's own one-process loader (readers.BatchLoader): same shuffle seed every row."""

    def __init__(self, ds, args):
        from readers import BatchLoader

        self.loader = BatchLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0)
        self.n = len(ds)
        self.epoch = 0

    def __iter__(self):
        self.epoch += 1
        self.loader.set_epoch(self.epoch)
        return iter(self.loader)

    def pids(self):
        return [os.getpid()]

    def close(self):
        pass


def row_batch_loader(set_dir, work, mode, args, crop):
    from readers import CropDataset, FullDecode, RandomResizedCrop

    if (mode == "rrc") != (crop == "rrc"):
        raise SkipRow(f"{'rrc' if crop == 'rrc' else 'full decode'} only")
    spec = RandomResizedCrop(CROP) if crop == "rrc" else FullDecode(dct=crop)
    ds = CropDataset(_lmdb(set_dir, work), spec, layout="CHW" if crop == "rrc" else "HWC")
    torch.set_num_threads(args.workers)
    return BatchLoaderRow(ds, args)


class SkipRow(Exception):
    pass


def _need(mod, hint):
    try:
        return __import__(mod)
    except ImportError as exc:
        raise SkipRow(f"{mod} not installed ({hint}): {exc}") from exc


def _samples(set_dir):
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(set_dir)).samples


class _PILSource(torch.utils.data.Dataset):
    """(RGB pixels carrying the file's JPEG bytes, label) by index, for FFCV's writer (module
    level: its workers pickle it). See :func:`_ffcv_keeps_jpeg_bytes`."""

    def __init__(self, root):
        self.s = _samples(Path(root))

    def __len__(self):
        return len(self.s)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        path = self.s[i][0]
        pixels = np.asarray(Image.open(path).convert("RGB")).view(_JpegPixels)
        pixels.jpeg_bytes = Path(path).read_bytes()
        return pixels, self.s[i][1]


try:
    import numpy as _np

    class _JpegPixels(_np.ndarray):
        """Decoded pixels that remember the JPEG file they came from."""
        jpeg_bytes = None
except ImportError:   # pragma: no cover - numpy comes with torch
    pass


def _ffcv_keeps_jpeg_bytes():
    """Make FFCV's writer store each file's own JPEG bytes instead of re-encoding its pixels
    (``RGBImageField(write_mode="jpg")`` always re-encodes with OpenCV), so FFCV decodes exactly
    the bytes every other row decodes. The writer's worker processes fork after this patch."""
    import ffcv.fields.rgb_image as rgb
    import numpy as np

    if getattr(rgb.encode_jpeg, "keeps_bytes", False):
        return
    reencode = rgb.encode_jpeg

    def encode_jpeg(image, *a, **k):
        data = getattr(image, "jpeg_bytes", None)
        return np.frombuffer(data, np.uint8) if data is not None else reencode(image, *a, **k)

    encode_jpeg.keeps_bytes = True
    rgb.encode_jpeg = encode_jpeg


def _tmp(path):
    return path.with_name(path.name + ".tmp")


class FFCVRow:
    def __init__(self, set_dir, work, mode, args):
        _need("ffcv", "pip install ffcv; needs libturbojpeg + OpenCV dev files")
        from ffcv.fields import IntField, RGBImageField
        from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import RandomHorizontalFlip, ToTensor
        from ffcv.writer import DatasetWriter
        path = work / "stores" / f"{set_dir.name}.same-bytes.beton"
        if not path.exists():
            _ffcv_keeps_jpeg_bytes()
            tmp = _tmp(path)
            DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                     "label": IntField()}, num_workers=os.cpu_count()).from_indexed_dataset(
                _PILSource(str(set_dir)))
            tmp.rename(path)
        if mode == "rrc":
            img = [RandomResizedCropRGBImageDecoder((CROP, CROP)), RandomHorizontalFlip(), ToTensor()]
        else:
            img = [SimpleRGBImageDecoder(), ToTensor()]
        self.loader = Loader(str(path), batch_size=args.batch_size, num_workers=args.workers,
                             order=OrderOption.RANDOM, drop_last=False, os_cache=True,
                             pipelines={"image": img, "label": [IntDecoder(), ToTensor()]})
        self.n = len(_samples(set_dir))

    def __iter__(self):
        return iter(self.loader)

    def pids(self):
        return [os.getpid()]

    def close(self):
        pass


def row_wds(set_dir, work, mode, args):
    wds = _need("webdataset", "pip install webdataset")
    import tarfile

    shard_dir = work / "stores" / f"{set_dir.name}.wds"
    samples = _samples(set_dir)
    if not shard_dir.exists():
        tmp = _tmp(shard_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        per = max(1, len(samples) // 8)
        for s in range(0, len(samples), per):
            with tarfile.open(tmp / f"shard-{s // per:04d}.tar", "w") as tar:
                for i in range(s, min(len(samples), s + per)):
                    p, c = samples[i]
                    for name, data in ((f"{i:08d}.jpg", Path(p).read_bytes()), (f"{i:08d}.cls", str(c).encode())):
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        tmp.rename(shard_dir)
    urls = sorted(str(p) for p in shard_dir.glob("*.tar"))
    tf = pil_transform(mode)
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
          .shuffle(256).decode("pil").to_tuple("jpg", "cls").map_tuple(tf, int))
    return IterRow(ds, len(samples), args)


def row_mds(set_dir, work, mode, args):
    _need("streaming", "pip install mosaicml-streaming")
    from PIL import Image
    from streaming import MDSWriter, StreamingDataset

    out = work / "stores" / f"{set_dir.name}.mds"
    samples = _samples(set_dir)
    if not out.exists():
        tmp = _tmp(out)
        with MDSWriter(out=str(tmp), columns={"image": "jpeg", "label": "int"}, size_limit=1 << 26) as w:
            for p, c in samples:
                w.write({"image": Image.open(p), "label": c})
        tmp.rename(out)
    tf = pil_transform(mode)

    class DS(StreamingDataset):
        def __getitem__(self, i):
            x = super().__getitem__(i)
            return tf(x["image"]), x["label"]

    import streaming.base.util as su

    su.clean_stale_shared_memory()
    ds = DS(local=str(out), shuffle=True, shuffle_seed=0, batch_size=args.batch_size)
    return IterRow(ds, len(samples), args)


def row_litdata(set_dir, work, mode, args):
    litdata = _need("litdata", "pip install litdata")
    out = work / "stores" / f"{set_dir.name}.litdata"
    samples = _samples(set_dir)
    if not out.exists():
        tmp = _tmp(out)
        litdata.optimize(fn=_litdata_item, inputs=list(samples), output_dir=str(tmp), chunk_bytes="64MB",
                         num_workers=1)
        tmp.rename(out)
    tf = pil_transform(mode)
    from torchvision.transforms.functional import to_pil_image

    class DS(litdata.StreamingDataset):
        def __getitem__(self, i):
            x = super().__getitem__(i)
            img = x["image"]
            if isinstance(img, torch.Tensor):   # litdata decodes JPEG with torchvision when present
                img = to_pil_image(img)
            return tf(img), x["label"]

    ds = DS(str(out), shuffle=True, seed=0)
    return IterRow(ds, len(samples), args)


def _litdata_item(sample):
    from PIL import Image

    p, c = sample
    return {"image": Image.open(p), "label": c}


FACTORIES = {
    "folder-pil": row_folder_pil, "packer": row_packer, "packer-hwc": row_packer_hwc, "packer-crop": row_packer_crop,
    "packer-crop-t": lambda *a: row_packer_crop(*a, threads=True), "packer-full-batch": row_packer_full_batch,
    "packer-full-batch-t": lambda *a: row_packer_full_batch(*a, threads=True),
    "packer-full-batch-fast": lambda *a: row_packer_full_batch(*a, dct="fast"),
    "packer-full-batch-t-fast": lambda *a: row_packer_full_batch(*a, threads=True, dct="fast"),
    "packer-crop-bl": lambda *a: row_batch_loader(*a, crop="rrc"),
    "packer-full-bl": lambda *a: row_batch_loader(*a, crop="exact"),
    "packer-full-bl-fast": lambda *a: row_batch_loader(*a, crop="fast"),
    "ffcv": FFCVRow, "wds": row_wds,
    "mds": row_mds, "litdata": row_litdata,
}


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def run_epoch(row, step_s=0.0):
    """One epoch of ``row``; ``step_s``: the consumer sleeps that long per batch (a stand-in for
    a GPU training step, which leaves the CPU free: loaders that read ahead overlap with it)."""
    pids = row.pids()
    c0 = {p: br._proc_cpu(p) for p in pids}
    busy0 = br._machine_busy()
    n, shape = 0, None
    t = time.perf_counter()
    for batch in row:
        imgs, labels = batch[0], batch[1]
        n += len(labels)
        shape = tuple(imgs.shape[1:])
        if step_s:
            time.sleep(step_s)
    dt = time.perf_counter() - t
    busy = br._machine_busy() - busy0
    cpu = sum(br._proc_cpu(p) - c0.get(p, 0.0) for p in row.pids())
    return {"s": dt, "n": n, "shape": shape, "cpu": cpu, "bg": max(0.0, busy - cpu) / dt}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="1080p,500x375")
    ap.add_argument("--n", default="1080p=128,500x375=512", help="images per set")
    ap.add_argument("--modes", default="rrc,full")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timed-epochs", type=int, default=2,
                    help="epochs timed together in each row process, after its warm-up epoch")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="the consumer sleeps this long per batch (a GPU step's stand-in; 0: none)")
    ap.add_argument("--photos", type=Path, default=REPO / ".bench" / "photos")
    ap.add_argument("--work", type=Path, default=REPO / ".bench")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--row-timeout", type=float, default=900, help="seconds one row process may take")
    ap.add_argument("--child-row", help=argparse.SUPPRESS)
    ap.add_argument("--child-set-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.child_row:
        return child_main(args)
    sizes = dict(kv.split("=") for kv in args.n.split(","))
    meta = br.machine()
    log(json.dumps(meta, indent=1))
    results = []
    for set_name in args.sets.split(","):
        # Made once here, before any timing (the children find the corpus ready).
        set_dir = br.prepare_set(set_name, int(sizes[set_name]), args.photos, args.work / "corpus")
        for mode in args.modes.split(","):
            names = args.rows.split(",")
            runs = {name: [] for name in names}
            skipped = {}
            for rnd in range(args.repeats):
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in order:
                    if name in skipped:
                        continue
                    out = run_row_process(name, set_name, set_dir, mode, args)
                    if "skipped" in out:
                        skipped[name] = out["skipped"]
                        log(f"{set_name} {mode} {name}: skipped: {out['skipped']}")
                        continue
                    runs[name].append(out)
                    log(f"{set_name} {mode} {name} round {rnd + 1}: {out['n'] / out['s']:.0f} img/s")
            ffcv_runs = runs.get("ffcv") or []
            for name in names:
                if name in skipped:
                    results.append({"set": set_name, "mode": mode, "row": name, "skipped": skipped[name]})
                    continue
                res = summarize(runs[name])
                if name != "ffcv" and ffcv_runs and "ffcv" not in skipped:
                    res["vs_ffcv"] = paired_ratios(runs[name], ffcv_runs)
                results.append(dict(res, set=set_name, mode=mode, row=name))
                log(f"{set_name} {mode} {name}: {res['img_s']:.0f} img/s, {res['cpu_ms']:.2f} CPU ms/img, "
                    f"shape {res['shape']}, other load {res['bg']:.2f} cores"
                    + (f", vs ffcv per round {res['vs_ffcv']}" if "vs_ffcv" in res else ""))
    text = render(results, meta, args)
    log(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


def summarize(runs):
    """The median round of ``runs`` (the timed epochs of one row process each) as one result row."""
    by_time = sorted(runs, key=lambda r: r["s"])
    med = by_time[len(by_time) // 2]
    return {"img_s": med["n"] / med["s"],
            "cpu_ms": 1e3 * statistics.median(r["cpu"] / r["n"] for r in runs),
            "epochs_s": [round(r["s"], 2) for r in runs], "n": med["n"], "shape": med["shape"],
            "bg": statistics.median(r["bg"] for r in runs), "img_s_rounds": [round(r["n"] / r["s"]) for r in runs]}


def run_row_process(name, set_name, set_dir, mode, args):
    """Run ``name`` in a fresh interpreter (build the loader, warm-up epoch, timed epochs) and
    return its timed epochs as one dict, or ``{"skipped": why}``."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-row", name, "--child-set-dir", str(set_dir),
           "--modes", mode, "--workers", str(args.workers), "--batch-size", str(args.batch_size),
           "--step-ms", str(args.step_ms), "--work", str(args.work), "--timed-epochs", str(args.timed_epochs)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.row_timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"failed: no result within {args.row_timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            return json.loads(line[len(_RESULT):])
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    return {"skipped": f"failed: exit status {proc.returncode}: {proc.stderr.strip()[-200:]}"}


_RESULT = "BENCH-RESULT "


def child_main(args):
    """One row, one round, in this process: print its timed epochs as ``BENCH-RESULT {json}``."""
    name, set_dir, mode = args.child_row, Path(args.child_set_dir), args.modes
    try:
        row = FACTORIES[name](set_dir, args.work, mode, args)
        threads = args.workers if name in THREADED else 1
        torch.set_num_threads(threads)
        run_epoch(row, args.step_ms / 1e3)           # warm-up: page cache, workers, thread pools
        epochs = [run_epoch(row, args.step_ms / 1e3) for _ in range(max(1, args.timed_epochs))]
        for e in epochs:
            if e["n"] != row.n:
                raise RuntimeError(f"an epoch gave {e['n']} images, expected {row.n}")
        total_s = sum(e["s"] for e in epochs)
        out = {"s": total_s, "n": sum(e["n"] for e in epochs), "shape": epochs[0]["shape"],
               "cpu": sum(e["cpu"] for e in epochs), "bg": sum(e["bg"] * e["s"] for e in epochs) / total_s}
        row.close()
    except SkipRow as exc:
        out = {"skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a tool failing is a result to report
        traceback.print_exc()
        out = {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:200]}"}
    print(_RESULT + json.dumps(out), flush=True)
    sys.stderr.flush()
    os._exit(0)   # some loaders' threads do not let the interpreter exit promptly


def paired_ratios(runs, other_runs):
    """img/s of ``runs`` over ``other_runs`` round by round (the rows run interleaved, so round
    ``i`` of both saw the same background load): median, lowest, highest and the number of rounds
    this row was ahead. On a shared VM whose speed drifts by 10-20% within minutes this is the
    comparison to read; the medians of each row alone mix different moments."""
    ratios = sorted((a["n"] / a["s"]) / (b["n"] / b["s"]) for a, b in zip(runs, other_runs))
    return {"median": round(statistics.median(ratios), 3), "lo": round(ratios[0], 3),
            "hi": round(ratios[-1], 3), "ahead": sum(r > 1 for r in ratios), "rounds": len(ratios)}


def render(results, meta, args):
    lines = [f"Machine: {meta['cpu']}, {meta['usable_cores']} usable cores, {meta['mem_gib']} GiB; torch "
             f"{meta['torch']}; {meta['pillow']}; {meta['turbojpeg']}",
             f"Settings: {args.workers} workers (or threads), batch {args.batch_size}; each row in its own "
             f"process per round (warm-up epoch + {args.timed_epochs} timed), median of {args.repeats} rounds "
             f"interleaved across rows, crop {CROP}"
             + (f", consumer step {args.step_ms:g} ms per batch (sleep)" if args.step_ms else ""), "",
             "| set | transform | row | img/s | CPU ms/img | vs folder-pil "
             "| vs FFCV per round: median (range; rounds ahead) | output | other load (cores) |",
             "|---|---|---|---:|---:|---:|---|---|---:|"]
    base = {(r["set"], r["mode"]): r["img_s"] for r in results if r["row"] == "folder-pil" and "img_s" in r}
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['set']} | {r['mode']} | {r['row']} | - | - | - | - | {r['skipped']} | - |")
            continue
        b = base.get((r["set"], r["mode"]))
        ratio = f"{r['img_s'] / b:.2f}x" if b else "-"
        v = r.get("vs_ffcv")
        vs = f"{v['median']:.3f} ({v['lo']:.3f}-{v['hi']:.3f}; {v['ahead']}/{v['rounds']})" if v else "-"
        lines.append(f"| {r['set']} | {r['mode']} | {r['row']} | {r['img_s']:.0f} | {r['cpu_ms']:.2f} | {ratio} | "
                     f"{vs} | {'x'.join(map(str, r['shape'] or ()))} | {r['bg']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
