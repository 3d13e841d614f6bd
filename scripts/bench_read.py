#!/usr/bin/env python
"""Read-throughput benchmark: image files + PIL (the torchvision ImageFolder path) against packer
stores read by ``readers.StoreDataset``, all through one ``torch.utils.data.DataLoader`` setup.

Every row reads the same images with the same DataLoader settings (workers, batch size,
multiprocessing context, shuffle order, collate). Per row: one warm-up epoch (not timed; it
also warms the page cache, so every row reads from RAM), then the median of ``--repeats`` full
epochs. Reported: images/s, MB/s of decoded pixels produced, ratio vs the baseline, store size.

Corpus (``--prepare``, done automatically when missing): real photographs fetched by
``scripts/get_bench_images.sh`` are centre-cropped (with varied crop sizes, offsets and flips
to reach N images) and resized into two ImageFolder sets, ``1080p`` (1920x1080) and
``500x375``, JPEG quality 90, baseline 4:2:0, encoded by OpenCV (libjpeg-turbo).

Usage::

    bash scripts/get_bench_images.sh                     # photos -> .bench/photos
    python scripts/bench_read.py --out .bench/bench_read.md
    python scripts/bench_read.py --quick                 # smoke test (< 1 min)
    python scripts/bench_read.py --rows baseline,lmdb --profile lmdb   # where does time go?
    python scripts/bench_read.py --mongo-uri mongodb://127.0.0.1:27017 --rows baseline,mongo,mongo-1by1

Rows (``--rows``; default: every row whose store format is available, mongo rows only with
``--mongo-uri``):

    baseline      JPEG files on disk, PIL decode, ``np.asarray`` -> uint8 CHW tensor
    lmdb          packer LMDB store, StoreDataset (libjpeg-turbo, full size, checksum checked)
    lmdb-half     the same store with ``scale="1/2"``: produces 1/2-size images (NOT the same output)
    lmdb-nocheck  diagnostic: StoreDataset(check=False) (skips the per-record BLAKE2b check)
    hdf5          HDF5 store, JPEG bytes mode
    hdf5-px       HDF5 store, pixel mode (``pixels=HxW``): no decode at read time
    hdf5-px-lzf   HDF5 pixel mode with ``compression=lzf``
    mongo         MongoDB store, batched reads (``StoreDataset.__getitems__``: one query per batch)
    mongo-1by1    MongoDB store, one query per sample (``__getitems__`` hidden from the DataLoader)
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import datetime
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

# name -> (width, height, default N, quick N)
SETS = {
    "1080p": (1920, 1080, 256, 64),
    "500x375": (500, 375, 1024, 256),
}
N_CLASSES = 4
JPEG_QUALITY = 90
CORPUS_VERSION = 1          # bump when the way images are made changes

# row name -> (store format or None for the baseline, store options, StoreDataset kwargs, label, note)
ROWS = {
    "baseline": (None, {}, {}, "files + PIL (ImageFolder-style)", ""),
    "lmdb": ("lmdb", {}, {}, "packer LMDB, StoreDataset", ""),
    "lmdb-half": ("lmdb", {}, {"scale": "1/2"}, "packer LMDB, StoreDataset scale=1/2",
                  "1/2-size output: not comparable"),
    "lmdb-nocheck": ("lmdb", {}, {"check": False}, "packer LMDB, StoreDataset check=False",
                     "diagnostic: no checksum"),
    "hdf5": ("hdf5", {}, {}, "packer HDF5 (JPEG bytes), StoreDataset", ""),
    "hdf5-px": ("hdf5", {"pixels": "{h}x{w}"}, {}, "packer HDF5 pixels, StoreDataset", "no decode"),
    "hdf5-px-lzf": ("hdf5", {"pixels": "{h}x{w}", "compression": "lzf"}, {},
                    "packer HDF5 pixels+lzf, StoreDataset", "no decode"),
    "mongo": ("mongo", {}, {}, "packer MongoDB, batched (__getitems__)", ""),
    "mongo-1by1": ("mongo", {}, {"_per_sample": True}, "packer MongoDB, 1 query/sample", ""),
}


def log(msg: str) -> None:
    print(msg, flush=True)


# =========================================================================================
# Corpus
# =========================================================================================
def read_sources(photos: Path) -> list[dict]:
    manifest = photos / "SOURCES.tsv"
    if not manifest.is_file():
        sys.exit(f"bench_read: {manifest} not found (hint: bash scripts/get_bench_images.sh {photos})")
    with open(manifest, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    for r in rows:
        if not (photos / r["path"]).is_file():
            sys.exit(f"bench_read: {photos / r['path']} is missing (hint: rerun scripts/get_bench_images.sh)")
    return rows


def _crop_box(W: int, H: int, tw: int, th: int):
    """Largest box of aspect tw:th inside W x H."""
    ar = tw / th
    cw = min(W, int(H * ar))
    ch = int(round(cw / ar))
    return cw, min(ch, H)


def prepare_set(name: str, n: int, photos: Path, corpus: Path, force: bool = False) -> Path:
    """Make ``corpus/<name>_n<N>/c<k>/*.jpg`` (ImageFolder layout) from the photos; reuse if done."""
    import cv2

    tw, th = SETS[name][:2]
    out = corpus / f"{name}_n{n}"
    sources = read_sources(photos)
    spec = {"version": CORPUS_VERSION, "set": name, "n": n, "size": [tw, th], "quality": JPEG_QUALITY,
            "sources": [s["path"] for s in sources]}
    man = out / "MANIFEST.json"
    if man.is_file() and not force:
        old = json.loads(man.read_text())
        if {k: old.get(k) for k in spec} == spec:
            return out
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp = corpus / f".{name}_n{n}.tmp"
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    # Decode the sources; keep those big enough for this set without upscaling.
    imgs = []
    for s in sources:
        im = cv2.imread(str(photos / s["path"]), cv2.IMREAD_COLOR)
        if im is None:
            sys.exit(f"bench_read: OpenCV cannot read {photos / s['path']}")
        cw, ch = _crop_box(im.shape[1], im.shape[0], tw, th)
        if cw >= tw and ch >= th:
            imgs.append((s, im, cw, ch))
    if not imgs:
        sys.exit(f"bench_read: no source photo is at least {tw}x{th}")
    rng = np.random.default_rng(1234 + tw)
    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY, cv2.IMWRITE_JPEG_PROGRESSIVE, 0,
              cv2.IMWRITE_JPEG_OPTIMIZE, 0, cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
              cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]
    total = 0
    for i in range(n):
        s, im, cw, ch = imgs[i % len(imgs)]
        k = i // len(imgs)
        H, W = im.shape[:2]
        # variant 0: the full centre crop; others: a random sub-box (never below the target
        # size, never below half the full crop) at a random offset, every other one mirrored.
        f = 1.0 if k == 0 else rng.uniform(max(tw / cw, 0.5), 1.0)
        bw, bh = max(tw, int(cw * f)), max(th, int(ch * f))
        x0 = (W - bw) // 2 if k == 0 else int(rng.integers(0, W - bw + 1))
        y0 = (H - bh) // 2 if k == 0 else int(rng.integers(0, H - bh + 1))
        crop = im[y0:y0 + bh, x0:x0 + bw]
        if k % 2 == 1:
            crop = crop[:, ::-1]
        small = cv2.resize(np.ascontiguousarray(crop), (tw, th), interpolation=cv2.INTER_AREA)
        ok, buf = cv2.imencode(".jpg", small, params)
        if not ok:
            sys.exit("bench_read: OpenCV failed to encode a JPEG")
        d = tmp / f"c{i % N_CLASSES}"
        d.mkdir(parents=True, exist_ok=True)
        stem = Path(s["path"]).stem
        (d / f"{stem}_{k:03d}.jpg").write_bytes(buf.tobytes())
        total += len(buf)
    spec["distinct_sources"] = len(imgs)
    spec["sources_used"] = [s["path"] for s, *_ in imgs]
    spec["jpeg_bytes"] = total
    (tmp / "MANIFEST.json").write_text(json.dumps(spec, indent=1))
    tmp.rename(out)
    log(f"  prepared {out}: {n} images {tw}x{th} q{JPEG_QUALITY} 4:2:0 from {len(imgs)} distinct photos "
        f"({total / n / 1e3:.0f} kB/image)")
    return out


# =========================================================================================
# Datasets
# =========================================================================================
class FolderPIL(Dataset):
    """What torchvision's ImageFolder + default PIL loader + pil_to_tensor do, minimally."""

    def __init__(self, root):
        root = Path(root)
        classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(str(p), ci) for ci, c in enumerate(classes) for p in sorted((root / c).iterdir())
                        if p.suffix.lower() in (".jpg", ".jpeg")]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as fh:
            img = Image.open(fh).convert("RGB")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # np.asarray(PIL) is read-only; fine here
            t = torch.from_numpy(np.asarray(img)).permute(2, 0, 1)
        return t, label


class PerSample(Dataset):
    """Hides ``__getitems__`` so the DataLoader fetches one sample (one query) at a time."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i]


def _close(ds) -> None:
    inner = getattr(ds, "ds", ds)
    if hasattr(inner, "close"):
        inner.close()


def collate(batch):
    """The one collate every row uses: torch's default_collate (images stacked, straight into
    shared memory when run in a worker) when the images are the same size, else a list."""
    from torch.utils.data import default_collate

    if all(b[0].shape == batch[0][0].shape for b in batch):
        imgs, labels = default_collate([(b[0], int(b[1])) for b in batch])
        return imgs, labels
    return [b[0] for b in batch], torch.tensor([int(b[1]) for b in batch])


def _pixels(imgs) -> int:
    return imgs.numel() if isinstance(imgs, torch.Tensor) else sum(t.numel() for t in imgs)


# =========================================================================================
# Stores
# =========================================================================================
def _store_options(row: str, w: int, h: int) -> dict:
    return {k: v.format(w=w, h=h) for k, v in ROWS[row][1].items()}


def store_location(row: str, set_dir: Path, work: Path, mongo_uri: str | None) -> str:
    fmt = ROWS[row][0]
    w, h = SETS[set_dir.name.split("_n")[0]][:2]
    opts = _store_options(row, w, h)
    tag = "".join(f"-{k}{v}" for k, v in sorted(opts.items())).replace("/", "")
    if fmt == "mongo":
        return f"{mongo_uri.rstrip('/')}/benchdb/{set_dir.name.split('_n')[0]}"
    ext = {"lmdb": ".lmdb", "hdf5": ".h5"}.get(fmt, f".{fmt}")
    return str(work / "stores" / f"{set_dir.name}{tag}{ext}")


def ensure_store(row: str, set_dir: Path, work: Path, mongo_uri, rebuild: bool, build_workers: int):
    """Build the row's store from the set folder (not timed in the results) unless a matching one exists."""
    from packer import build, info
    from packer.stores import get_store

    fmt = ROWS[row][0]
    w, h = SETS[set_dir.name.split("_n")[0]][:2]
    opts = _store_options(row, w, h)
    loc = store_location(row, set_dir, work, mongo_uri)
    n = len(FolderPIL(set_dir))
    if get_store(fmt).exists(loc) and not rebuild:
        try:
            rep = info(loc, format=fmt)
            same = (rep.count == n and rep.metadata.get("build_options", {}).get("store_options", {}) == opts
                    and rep.metadata.get("build_options", {}).get("images") == str(set_dir.resolve()))
        except Exception as exc:  # noqa: BLE001 - any unreadable store is rebuilt
            log(f"  {loc}: unreadable ({exc}); rebuilding")
            same = False
        if same:
            return loc, None
    if "://" not in loc:
        Path(loc).parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    rep = build(str(set_dir), None, loc, format=fmt, workers=build_workers, overwrite=True, resume=False,
                store_options=opts or None, report_path=str(work / "stores" / f"{Path(loc).name}.report.json"))
    dt = time.perf_counter() - t
    if not rep.ok or rep.records != n:
        sys.exit(f"bench_read: building {loc} failed: published={rep.published} records={rep.records} "
                 f"rejected={rep.rejected[:3]}")
    log(f"  built {loc} ({fmt} {opts or ''}) in {dt:.1f}s")
    return loc, dt


def store_size(loc: str, fmt: str) -> int:
    from packer import info

    return int(info(loc, format=fmt).size_bytes)


def make_dataset(row: str, set_dir: Path, loc: str | None):
    if ROWS[row][0] is None:
        return FolderPIL(set_dir)
    from readers import StoreDataset

    kw = dict(ROWS[row][2])
    per_sample = kw.pop("_per_sample", False)
    ds = StoreDataset(loc, format=ROWS[row][0], **kw)
    return PerSample(ds) if per_sample else ds


# =========================================================================================
# Timing
# =========================================================================================
_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid) -> float:
    """utime + stime of one process, seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / _TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def _machine_busy() -> float:
    """CPU-seconds all cores spent busy since boot (/proc/stat), to see what others ran meanwhile."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / _TCK  # everything but idle and iowait


class RowTimer:
    """One DataLoader (persistent workers) for one row; each epoch() is one full pass."""

    def __init__(self, ds, args):
        self.ds, self.args = ds, args
        w = args.workers
        self.loader = DataLoader(
            ds, batch_size=args.batch_size, shuffle=not args.no_shuffle, num_workers=w, collate_fn=collate,
            generator=torch.Generator().manual_seed(0),  # the same sample order for every row
            multiprocessing_context=args.mp_context if w > 0 else None,
            persistent_workers=w > 0, pin_memory=False)
        self.runs = []
        self.warmup = None

    def _pids(self):
        it = getattr(self.loader, "_iterator", None)
        extra = [self.args.server_pid] if self.args.server_pid else []
        return [os.getpid()] + [p.pid for p in getattr(it, "_workers", []) or []] + extra

    def epoch(self) -> dict:
        pids = self._pids()
        c0 = {p: _proc_cpu(p) for p in pids}
        busy0 = _machine_busy()
        n = px = 0
        shape = None
        t = time.perf_counter()
        for imgs, labels in self.loader:
            n += len(labels)
            px += _pixels(imgs)
            shape = tuple(imgs.shape[1:]) if isinstance(imgs, torch.Tensor) else tuple(imgs[0].shape)
        dt = time.perf_counter() - t
        busy = _machine_busy() - busy0
        pids = self._pids()  # workers exist only after the first iter()
        ours = sum(_proc_cpu(p) - c0.get(p, 0.0) for p in pids)
        main_cpu = _proc_cpu(os.getpid()) - c0[os.getpid()]
        if n != len(self.ds):
            sys.exit(f"bench_read: an epoch produced {n} images, expected {len(self.ds)}")
        return {"s": dt, "n": n, "px": px, "shape": shape, "cpu": ours, "main_cpu": main_cpu,
                "bg": max(0.0, busy - ours) / dt}

    def warm(self):
        self.warmup = self.epoch()

    def timed(self):
        self.runs.append(self.epoch())

    def close(self):
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader = None
        _close(self.ds)

    def result(self) -> dict:
        runs = sorted(self.runs, key=lambda r: r["s"])
        med = runs[len(runs) // 2]
        n = med["n"]
        return {"epoch_s": med["s"], "epochs_s": [r["s"] for r in self.runs], "warmup_s": self.warmup["s"],
                "images": n, "img_s": n / med["s"], "mb_s": med["px"] / med["s"] / 1e6, "shape": med["shape"],
                "cpu_ms": 1e3 * statistics.median(r["cpu"] for r in self.runs) / n,
                "main_cpu_ms": 1e3 * statistics.median(r["main_cpu"] for r in self.runs) / n,
                "bg": statistics.median(r["bg"] for r in self.runs)}


def profile_row(ds, args, top: int = 28) -> str:
    """cProfile of one in-process pass of the worker loop (fetch a batch + collate), after a warm pass."""
    idx = list(range(len(ds)))
    bs = args.batch_size
    getitems = getattr(ds, "__getitems__", None)

    def one_pass():
        for s in range(0, len(idx), bs):
            b = idx[s:s + bs]
            samples = getitems(b) if getitems else [ds[i] for i in b]
            collate(samples)

    one_pass()
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    one_pass()
    pr.disable()
    dt = time.perf_counter() - t
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf).strip_dirs()
    st.sort_stats("tottime").print_stats(top)
    return f"in-process pass (profiled, 1 core): {len(idx) / dt:.1f} img/s\n" + buf.getvalue()


# =========================================================================================
# Machine description
# =========================================================================================
def _libturbojpeg() -> str:
    try:
        from packer.core.integrity import turbojpeg

        turbojpeg()
        import turbojpeg as tj
    except Exception as exc:  # noqa: BLE001 - informative only
        return f"unavailable ({exc})"
    path = None
    with open("/proc/self/maps") as fh:
        for line in fh:
            if "turbojpeg" in line:
                path = line.split()[-1]
                break
    ver = "?"
    if path:
        try:
            pkg = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True).stdout.split(":")[0]
            if pkg:
                v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
                ver = f"{pkg} {v.stdout.strip()}"
        except OSError:
            pass
    return f"PyTurboJPEG {getattr(tj, '__version__', '?')}, {os.path.basename(path or '?')} ({ver})"


def machine() -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import PIL
    from PIL import features

    try:
        import cv2
        cvj = next((l.strip() for l in cv2.getBuildInformation().splitlines() if l.strip().startswith("JPEG:")), "?")
        cvv = f"OpenCV {cv2.__version__} ({' '.join(cvj.split())})"
    except ImportError:
        cvv = "OpenCV not installed"
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    libs = []
    for mod in ("lmdb", "h5py", "pymongo"):
        try:
            m = __import__(mod)
            libs.append(f"{mod} {m.__version__}" + (f" (HDF5 {m.version.hdf5_version})" if mod == "h5py" else ""))
        except ImportError:
            pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
        "mem_gib": round(mem, 1), "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__,
        "pillow": f"Pillow {PIL.__version__} (libjpeg-turbo {features.version('libjpeg_turbo') or 'no'})",
        "turbojpeg": _libturbojpeg(), "opencv": cvv, "libs": ", ".join(libs),
        "kernel": platform.release(),
    }


def mongo_server(uri: str) -> str:
    import pymongo

    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as c:
        bi = c.admin.command("buildInfo")
        try:
            ss = c.admin.command("serverStatus")
        except pymongo.errors.OperationFailure:  # some servers refuse serverStatus
            ss = {}
    sec = ss.get("secantus") or {}
    if sec:  # SecantusDB reports MongoDB's version in buildInfo and its own here
        return f"SecantusDB {sec.get('version', '?')} (reports MongoDB {bi.get('version', '?')})"
    name = ss.get("process") or bi.get("serverName") or "mongod-compatible"
    return f"{name} {bi.get('version', '?')}"


# =========================================================================================
# Report
# =========================================================================================
def _mb(b) -> str:
    return "-" if b is None else f"{b / 1e6:.1f} MB"


def _redact(uri: str) -> str:
    """mongodb://user:pass@host -> mongodb://***@host (never print credentials)."""
    if "@" in uri and "://" in uri:
        scheme, rest = uri.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return uri


def render(results: list, meta: dict, args) -> str:
    m = meta["machine"]
    lines = [
        f"# packer read benchmark ({meta['date']})",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), {m['mem_gib']} GiB RAM, "
        f"Linux {m['kernel']}",
        f"- python {m['python']}, torch {m['torch']}, numpy {m['numpy']}; {m['pillow']}; {m['turbojpeg']}; "
        f"{m['opencv']}; {m['libs']}",
        f"- DataLoader: num_workers={args.workers}, batch_size={args.batch_size}, "
        f"multiprocessing_context={args.mp_context}, persistent_workers={args.workers > 0}, "
        f"shuffle={'off' if args.no_shuffle else 'on (same seed for every row)'}, "
        "collate=default_collate (stack; same for every row)",
        f"- timing: 1 warm-up epoch per row excluded (it also warms the page cache: every row reads "
        f"from RAM), then median of {args.repeats} full epochs"
        + (", rows interleaved round-robin within each repeat" if args.workers > 0 and not args.no_interleave
           else ", each row's epochs back to back"),
        "- CPU ms/img = CPU time (user+sys) of the main process and its DataLoader workers per image "
        "(less sensitive to other load than images/s); bg cores = CPU the rest of the machine used "
        "meanwhile (other jobs), averaged over the epoch: above ~0.1 (marked (!)) the images/s column is disturbed",
        "- MB/s = decoded uint8 pixels produced per second (10^6 bytes); 'vs files' = store size / JPEG files size",
    ]
    for c in meta["corpus"]:
        lines.append(f"- set {c['set']}: {c['n']} JPEGs {c['size'][0]}x{c['size'][1]} q{c['quality']} "
                     f"baseline 4:2:0 (OpenCV), made from {c['distinct_sources']} distinct photographs "
                     f"(crops/offsets/flips), {c['jpeg_bytes'] / c['n'] / 1e3:.0f} kB/image on average, "
                     f"{N_CLASSES} class folders")
    if meta.get("mongo"):
        lines.append(f"- MongoDB server: {meta['mongo']} at {_redact(args.mongo_uri)}; "
                     + ("'CPU ms/img' includes the server process's CPU (--server-pid)" if args.server_pid else
                        "'bg cores' includes the server's own CPU when it runs on this machine"))
    for note in meta.get("notes", []):
        lines.append(f"- note: {note}")
    lines += ["", "| set | row | output | images/s | MB/s pixels | vs baseline | CPU ms/img | CPU vs baseline "
                  "| bg cores | store size | vs files | epoch s (median) |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        shape = "x".join(str(d) for d in r["shape"])
        lines.append(
            f"| {r['set']} | {r['label']}{' (' + r['note'] + ')' if r['note'] else ''} | {shape} | "
            f"{r['img_s']:.1f} | {r['mb_s']:.0f} | {r['vs_base']} | {r['cpu_ms']:.1f} | {r['cpu_vs_base']} | "
            f"{r['bg']:.2f}{' (!)' if r['bg'] > 0.1 else ''} | {_mb(r['size'])} | {r['vs_files']} | "
            f"{r['epoch_s']:.3f} |")
    return "\n".join(lines) + "\n"


# =========================================================================================
# Main
# =========================================================================================
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true", help="only (re)make the corpus, then exit")
    ap.add_argument("--photos", type=Path, default=REPO / ".bench" / "photos",
                    help="folder filled by scripts/get_bench_images.sh")
    ap.add_argument("--work", type=Path, default=REPO / ".bench",
                    help="corpus/ and stores/ go here (default .bench)")
    ap.add_argument("--sets", default="1080p,500x375")
    ap.add_argument("--n", type=int, default=None, help="images per set (default 256 / 1024; --quick 64 / 256)")
    ap.add_argument("--rows", default=None, help=f"comma list from {', '.join(ROWS)}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mp-context", default="fork", choices=("fork", "spawn", "forkserver"))
    ap.add_argument("--no-shuffle", action="store_true", help="read in index order")
    ap.add_argument("--no-interleave", action="store_true",
                    help="time each row's repeats back to back instead of round-robin over the rows")
    ap.add_argument("--mongo-uri", default=None, help="mongodb://host:port; stores go to URI/benchdb/<set>")
    ap.add_argument("--server-pid", type=int, default=None,
                    help="a local MongoDB server's PID: its CPU is counted in 'CPU ms/img' (and not in bg)")
    ap.add_argument("--quick", action="store_true",
                    help="small N (64 / 256), 1 repeat, no hdf5-px-lzf row: a smoke test")
    ap.add_argument("--rebuild", action="store_true", help="rebuild stores even when a matching one exists")
    ap.add_argument("--build-workers", type=int, default=None, help="packer build workers (default all cores)")
    ap.add_argument("--profile", default=None, metavar="ROW",
                    help="also print a cProfile of ROW's worker loop (in-process) per set")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here too")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats = 1 if args.repeats == 3 else args.repeats

    from packer.stores import available_formats

    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    for s in sets:
        if s not in SETS:
            ap.error(f"unknown set {s!r}; choose from {', '.join(SETS)}")
    formats = available_formats()
    notes = []
    if args.rows:
        rows = [r.strip() for r in args.rows.split(",") if r.strip()]
        for r in rows:
            if r not in ROWS:
                ap.error(f"unknown row {r!r}; choose from {', '.join(ROWS)}")
    else:
        rows = [r for r in ROWS if r != "lmdb-nocheck"]
        if args.quick:  # the slowest row; same reader code path as hdf5-px
            rows.remove("hdf5-px-lzf")
            notes.append("--quick: row hdf5-px-lzf left out (ask for it with --rows)")
    if args.profile and args.profile in ROWS and args.profile not in rows:
        rows.append(args.profile)
    if "baseline" not in rows:
        rows.insert(0, "baseline")
    kept = []
    for r in rows:
        fmt = ROWS[r][0]
        if fmt is None:
            kept.append(r)
        elif fmt not in formats:
            log(f"note: skipping row {r}: store format {fmt!r} is not available "
                f"(packer.stores.available_formats() = {formats})")
            notes.append(f"row {r} skipped: format {fmt!r} not available")
        elif fmt == "mongo" and not args.mongo_uri:
            if args.rows:
                log(f"note: skipping row {r}: needs --mongo-uri")
        else:
            kept.append(r)
    rows = kept
    if args.profile and args.profile not in ROWS:
        ap.error(f"--profile: unknown row {args.profile!r}")

    corpus_dir = args.work / "corpus"
    build_workers = args.build_workers or os.cpu_count() or 1
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "corpus": [], "notes": notes}
    if args.mongo_uri and any(ROWS[r][0] == "mongo" for r in rows):
        meta["mongo"] = mongo_server(args.mongo_uri)
    log(f"bench_read: sets={sets} rows={rows} workers={args.workers} batch={args.batch_size} "
        f"repeats={args.repeats} context={args.mp_context}")

    set_dirs = {}
    for s in sets:
        n = args.n or (SETS[s][3] if args.quick else SETS[s][2])
        set_dirs[s] = prepare_set(s, n, args.photos, corpus_dir)
        meta["corpus"].append(json.loads((set_dirs[s] / "MANIFEST.json").read_text()))
    if args.prepare:
        for c in meta["corpus"]:
            log(f"  {c['set']}: {c['n']} images from {c['distinct_sources']} distinct photos "
                f"-> {corpus_dir / (c['set'] + '_n' + str(c['n']))}")
        return 0

    results = []
    t_all = time.perf_counter()
    interleave = args.workers > 0 and not args.no_interleave
    for s in sets:
        set_dir = set_dirs[s]
        files_bytes = sum(p.stat().st_size for p in set_dir.rglob("*.jpg"))
        entries = []
        for r in rows:  # build (or reuse) every store first: nothing below is timed while building
            fmt = ROWS[r][0]
            loc, size = None, files_bytes
            if fmt is not None:
                loc, _ = ensure_store(r, set_dir, args.work, args.mongo_uri, args.rebuild, build_workers)
                size = store_size(loc, fmt)
            entries.append((r, fmt, loc, size))
        timers = {}
        if interleave:
            # Round-robin the rows within each repeat so background load (other jobs on the
            # machine) spreads over all rows instead of landing on one.
            for r, fmt, loc, size in entries:
                timers[r] = RowTimer(make_dataset(r, set_dir, loc), args)
                timers[r].warm()
            for _ in range(args.repeats):
                for r, *_ in entries:
                    timers[r].timed()
            for t in timers.values():
                t.close()
        else:
            for r, fmt, loc, size in entries:
                t = timers[r] = RowTimer(make_dataset(r, set_dir, loc), args)
                t.warm()
                for _ in range(args.repeats):
                    t.timed()
                t.close()  # py-lmdb refuses a second open of the same env in one process
        base = None
        for r, fmt, loc, size in entries:
            res = timers[r].result()
            label = ROWS[r][3]
            if fmt == "mongo":
                label += f" [{meta['mongo']}]"
            res.update(set=s, row=r, label=label, note=ROWS[r][4], size=size,
                       vs_files=f"{size / files_bytes:.2f}x" if size else "-")
            if r == "baseline":
                base = res
            res["vs_base"] = f"{res['img_s'] / base['img_s']:.2f}x" if base else "-"
            res["cpu_vs_base"] = f"{base['cpu_ms'] / res['cpu_ms']:.2f}x" if base and res["cpu_ms"] else "-"
            results.append(res)
            log(f"  {s:8s} {r:12s} {res['img_s']:8.1f} img/s {res['mb_s']:7.0f} MB/s  "
                f"{res['cpu_ms']:6.1f} CPU-ms/img (main {res['main_cpu_ms']:.1f})  bg {res['bg']:.2f} cores  "
                f"epochs {', '.join(f'{x:.3f}' for x in res['epochs_s'])} s (warm-up {res['warmup_s']:.3f} s)"
                f"  size {_mb(size)}")
        if args.profile in timers:
            r, fmt, loc, size = next(e for e in entries if e[0] == args.profile)
            pds = make_dataset(r, set_dir, loc)
            log(f"\n--- cProfile {s} {r} ---\n" + profile_row(pds, args))
            _close(pds)
    log(f"bench_read: measured in {time.perf_counter() - t_all:.0f}s\n")
    report = render(results, meta, args)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        args.out.with_name(args.out.name + ".json").write_text(
            json.dumps({"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                       indent=1, default=str))
        log(f"bench_read: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
