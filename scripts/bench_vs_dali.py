"""packer's GPU train pipeline against NVIDIA DALI on the same images, in one run (run on a GPU).

    python3 scripts/bench_vs_dali.py --sets .bench/sets --out OUT [--threads 4,12] [--batch 256]

DALI is NOT a dependency of packer: only this script imports it, and its rows are skipped (with
the reason) where it is absent. Install it with ``pip install nvidia-dali-cuda130`` (DALI 2.4 was
measured; it needs ``nvidia-nvimgcodec-cu13``).

For each set of scripts/make_bench_sets.py (``hd``: 1920x1080 q90; ``small``: ~500 px, real
photographs) and each thread count T, with batch 256 and the same images (batches drawn with
replacement, the same number of images per row: 48 batches at 1080p, 40 at ~500 px, each timed after
3 warm-up batches, packer's rows as DALI's; until session 24 the 1080p rows timed 16 batches, packer's
decode after one warm-up batch, in which the engine's balancer had not settled):

* ``dali_train``: ``fn.external_source`` (the JPEG bytes, in memory) -> ``fn.decoders.image_random_crop
  (device="mixed", hw_decoder_load=0.65)`` -> ``fn.resize`` 224x224 -> ``fn.crop_mirror_normalize``
  (float, CHW, random mirror), ``num_threads=T``;
* ``dali_decode``: ``fn.decoders.image(device="mixed", hw_decoder_load=0.65)`` alone (full decode);
* ``packer_train_native``: packer LMDB store -> ``GPULoader`` with packer's native engine (balanced
  hardware share); ``packer_train_native_rec1`` / ``_rec0``: the same with the record checks
  forced into C++ / into the Python loop (``PACKER_NATIVE_RECORDS``); ``packer_train_native_cpuhuff``:
  the same with nvJPEG's CPU Huffman stage for every image (by default images over 1 Mpx, 1080p
  among them, take the GPU's; only for sets that hold such images); ``packer_train_native_share=S``
  (``--train-shares``): the same at a fixed hardware share; ``packer_train_native_roi``: the same
  decoding only the crop windows (ROI);
  ``native_decode=S``: the engine alone on the bytes in memory (full decode, hardware share S),
  two batches in flight (``submit`` the next, then ``collect`` this one), as the loader keeps them
  and as DALI's pipeline does (``prefetch_queue_depth=2``); until session 15 one at a time;
* ``packer_train_nvjpeg``: packer LMDB store -> ``GPULoader(threads=T)`` (checked reads, torchvision's
  batched nvJPEG decode straight into one ragged batch, ``TrainPipeline(224)``, prefetch), after one
  warm-up epoch; ``packer_train_nvjpeg_nocheck``: the same without record checksums (DALI reads
  unchecked bytes from memory); ``packer_train_nvjpeg_workers``: reading in 2 DataLoader worker
  processes (no reader Python in the decoding process); ``packer_train_roi``: nvImageCodec with
  ROI decode (the crop boxes drawn from the stored sizes, only the windows decoded);
  ``packer_train_split``: the same loader with the split decoder (a
  share of each batch to the hardware JPEG engine through nvImageCodec, the rest to nvJPEG, at once);
* ``sweep_split=H:C``: packer's split decoder alone on the bytes in memory (full decode into one
  ragged batch) at each T, sending a share H of each batch to the hardware engine and C to
  libjpeg-turbo on T CPU threads, the rest to nvJPEG, all at once: packer's decode figure next to
  ``dali_decode`` (the best pair per T is used for ``packer_train_split``); ``engine_decode``: the
  hardware engine alone (nvImageCodec);
* ``tv_decode``: torchvision's batched nvJPEG ``decode_jpeg``.

Rows run one after another in one process; between rows Python's garbage is collected and the GPU
synchronized (a DALI pipeline's threads otherwise outlive it and slow the next row down).
``--no-dali`` runs packer's rows only.

Images/s and CPU cores used (process CPU time / wall time). Writes OUT/bench_vs_dali.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import Timer  # noqa: E402  (sibling module: scripts/ is on sys.path when run as a script)

from packer.stores import open_store  # noqa: E402
from readers.gpu import GPULoader, TrainPipeline, queues, read_raw  # noqa: E402
from readers.gpu.engine import GPU_HUFFMAN_PIXELS  # noqa: E402
from readers.raw import NATIVE_RECORDS_ENV  # noqa: E402

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
DALI_HW_LOAD = 0.65



def load_set(store: str):
    """Bytes (CPU tensors) and stored JPEG facts of every record."""
    with open_store(store, "lmdb") as r:
        raw = read_raw(r, list(range(r.metadata.count)), check=False)
    return [d.clone() for d in raw.datas()], raw.jpeg, raw.sizes


def batches_of(n_items: int, total: int, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_items, (total,), generator=g).tolist()
    return [idx[s : s + batch] for s in range(0, total, batch)]


# -- DALI ------------------------------------------------------------------------------------------
def dali_rows(datas, plan, batch, threads, train: bool):
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    arrays = [d.numpy().copy() for d in datas]
    feed = [[arrays[i] for i in b] for b in plan]

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0, prefetch_queue_depth=2, seed=0)
    def pipe():
        jpegs = fn.external_source(source=feed, cycle="quiet", dtype=types.UINT8)
        if not train:
            return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=DALI_HW_LOAD)
        images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                               hw_decoder_load=DALI_HW_LOAD, random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD,
                                        mirror=fn.random.coin_flip())

    p = pipe()
    p.build()
    for _ in range(3):  # warm-up: allocations, decoder handles
        p.run()
    n = 0
    with Timer() as t:
        for _ in range(len(feed)):
            (out,) = p.run()
            n += len(out)
        if train:
            np.asarray(out.as_cpu()[0])  # the last batch really exists
    del p
    return n, t


def _settle():
    """Between rows: DALI's pipeline threads and buffers released before the next row starts."""
    import gc
    import time

    gc.collect()
    torch.cuda.synchronize()
    time.sleep(1.0)


# -- packer ----------------------------------------------------------------------------------------
def _decoder(kind: str, threads: int, share=(0.5, 0.0)):
    """A packer decoder: ``native`` (packer's C++ engine, hardware share ``share[0]``, -1 balanced),
    ``split`` (engine + libjpeg-turbo threads + nvJPEG at once, shares ``share`` = (engine, CPU)),
    ``engine`` (nvImageCodec, hardware engine alone) or ``nvjpeg``."""
    from readers.gpu import NvJpegDecoder

    if kind == "split":
        from readers.gpu.split import SplitDecoder

        return SplitDecoder(hw_share=share[0], cpu_share=share[1], threads=threads,
                            fallback_threads=max(1, threads // 2))
    if kind in ("native", "native_roi", "native_cpuhuff"):
        from readers.gpu.engine import EngineDecoder

        # native_cpuhuff: nvJPEG's CPU Huffman stage on the threads for every image (none on the GPU).
        return EngineDecoder("cuda", threads=threads, hardware_share=share[0] if share[0] >= 0 else -1.0,
                             roi=kind == "native_roi",
                             gpu_huffman_pixels=1 << 62 if kind == "native_cpuhuff" else GPU_HUFFMAN_PIXELS)
    if kind in ("engine", "roi"):
        from readers.gpu.nvimgcodec import NvImageCodecDecoder

        return NvImageCodecDecoder(hw_load=1.0, threads=threads, fallback_threads=max(1, threads // 2),
                                   roi=kind == "roi")
    return NvJpegDecoder(fallback_threads=max(1, threads // 2))


def two_in_flight(dec, batches) -> int:
    """Every batch through the engine's ``submit``/``collect`` with two in flight (the next submitted
    before this one is collected), as the loader keeps them; returns the images decoded."""
    n, pending = 0, None
    for ds in batches:
        nxt = dec.submit(ds)
        if pending is not None:
            dec.collect(pending)
        pending = nxt
        n += len(ds)
    if pending is not None:
        dec.collect(pending)
    return n


def packer_decode(datas, jpeg, plan, dec):
    """The decoder alone on bytes in memory (full decode), into one ragged batch where it can."""
    work = [([datas[i] for i in b], [jpeg[i] for i in b] if jpeg else None) for b in plan]
    # The decoder contract's flags (readers.gpu.decoders.Decoder): every decoder has the methods,
    # the flags say which it implements.
    ragged, routes = dec.decodes_ragged, dec.takes_jpeg

    def run(ds, js):
        kw = {"jpeg": js} if routes else {}
        return dec.decode_ragged(ds, "cuda", **kw) if ragged else dec.decode(ds, "cuda", **kw)

    for ds, js in work[:3]:  # warm-up, as DALI's pipeline gets: nvJPEG's buffers, the balancer's start
        run(ds, js)
    n = 0
    with Timer() as t:
        if callable(getattr(dec, "submit", None)):  # the engine: two batches in flight, as the loader
            n = two_in_flight(dec, [ds for ds, _ in work])  # keeps them (DALI's pipeline prefetches two)
        else:
            for ds, js in work:
                run(ds, js)
                n += len(ds)
    out = {"routed": dict(getattr(dec, "routed", {})), "fallbacks": getattr(dec, "fallbacks", 0)}
    if hasattr(dec, "hardware_share"):
        out["hardware_share"] = round(dec.hardware_share, 3)
        out["engine_stats"] = dict(dec.stats)
    dec.close()
    return n, t, out


def tv_decode(datas, plan):
    import torchvision.io as tvio

    work = [[datas[i] for i in b] for b in plan]
    tvio.decode_jpeg(work[0][:8], device="cuda")
    n = 0
    with Timer() as t:
        for bt in work:
            n += len(tvio.decode_jpeg(bt, device="cuda", mode=tvio.ImageReadMode.RGB))
    return n, t


def _row_wanted(row: str, pattern: str) -> bool:
    """``--rows`` matching: ``native_decode`` takes ``native_decode=-1``, not ``native_decode_x``;
    ``packer_train*`` takes every row starting with ``packer_train``."""
    if pattern.endswith("*"):
        return row.startswith(pattern[:-1])
    return row.split("=", 1)[0] == pattern


class _Fixed(torch.utils.data.Sampler):
    """The benchmark's batches, in order (the same images for every row)."""

    def __init__(self, plan):
        self.plan = plan

    def __iter__(self):
        return iter(self.plan)

    def __len__(self):
        return len(self.plan)


def packer_train(store, plan, threads, dec, check=True, workers=0):
    with GPULoader(store, TrainPipeline(224), batch_sampler=_Fixed(plan), device="cuda", decoder=dec,
                   threads=threads, prefetch=3, check=check, workers=workers) as loader:
        for i, b in enumerate(loader):  # warm-up epoch: kept record facts, allocator, decoder handles
            pass
        loader.stats.update(read_s=0.0, decode_s=0.0, pipeline_s=0.0, wait_s=0.0, batches=0)
        n = 0
        with Timer() as t:
            for b in loader:
                n += b.images.shape[0]
        extra = {"decoder": loader.decoder.name, "stage_host_s": {k: round(v, 3) for k, v in loader.stats.items()}}
        if hasattr(loader.decoder, "routed"):
            extra["routed"] = dict(loader.decoder.routed)
        if hasattr(loader.decoder, "hardware_share"):
            extra["hardware_share"] = round(loader.decoder.hardware_share, 3)
        if hasattr(loader.decoder, "hardware_failures"):  # the native engine
            extra["engine_stats"] = dict(loader.decoder.stats)
            extra["hardware_failures"] = loader.decoder.hardware_failures
        for name in ("fallbacks", "roi_retries"):
            if hasattr(loader.decoder, name):
                extra[name] = getattr(loader.decoder, name)
    return n, t, extra


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=Path, default=Path(".bench/sets"))
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--threads", default="4,12")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--only", default="hd,small", help="image sets to run")
    ap.add_argument("--sweep", default="0:0,0.25:0,0:0.15,0:0.3,0:0.45",
                    help="hw_share:cpu_share pairs of the split decoder tried on the decoder alone at each "
                         "thread count (0:0 = nvJPEG alone)")
    ap.add_argument("--no-dali", action="store_true", help="packer rows only")
    ap.add_argument("--rows", default="", help="comma-separated row names to run (a name takes its '=S' variants; "
                    "'name*' any row starting with name); default all")
    ap.add_argument("--native-shares", default="-1",
                    help="hardware shares of the native engine's decode rows (-1 = balanced)")
    ap.add_argument("--repeat", type=int, default=1, help="run every row this many times (spread)")
    ap.add_argument("--train-shares", default="",
                    help="fixed hardware shares of extra engine training rows (packer_train_native_share=S), "
                         "beside the balanced one")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]
    import torchvision

    try:
        if a.no_dali:
            raise ImportError("--no-dali")
        import nvidia.dali as dali

        dali_version, dali_why = dali.__version__, ""
    except ImportError as exc:
        dali_version, dali_why = None, f"DALI not installed ({exc}): pip install nvidia-dali-cuda130"
        print(dali_why)
    try:
        from nvidia import nvimgcodec

        nvi_version = getattr(nvimgcodec, "__version__", "?")
    except ImportError:
        nvi_version = None
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "torchvision": torchvision.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "cpus": os.cpu_count(),
           "dali": dali_version, "nvimgcodec": nvi_version, "batch": a.batch,
           "cuda_queues": queues.status().get("value")}  # CUDA_DEVICE_MAX_CONNECTIONS (None: CUDA's 8)
    print(json.dumps(env), flush=True)
    rows = []
    best_share = {}

    def report(final=False):
        _report(a, env, rows, best_share, dali_why, threads, final)

    def record(set_name, row, T, what, fn):
        if a.rows and not any(_row_wanted(row, p) for p in a.rows.split(",")):
            return None
        for _ in range(a.repeat - 1):
            _record_once(set_name, row, T, what, fn)
        return _record_once(set_name, row, T, what, fn)

    def _record_once(set_name, row, T, what, fn):
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            r = {"set": set_name, "row": row, "threads": T, "what": what, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(r), flush=True)
            rows.append(r)
            report()
            return None
        _settle()
        n, t = res[0], res[1]
        r = {"set": set_name, "row": row, "threads": T, "what": what, "images": n, "wall_s": round(t.wall, 3),
             "img_s": round(n / t.wall, 1), "cpu_cores": round(t.cpu / t.wall, 2)}
        if len(res) > 2:
            r.update(res[2])
        print(json.dumps(r), flush=True)
        rows.append(r)
        report()
        return r

    for name, total in (("hd", 256 * 48), ("small", 256 * 40)):
        store = str(a.sets / f"{name}.lmdb")
        if name not in a.only.split(","):
            continue
        if not os.path.exists(store):
            print(f"missing {store}; skipped")
            continue
        datas, jpeg, sizes = load_set(store)
        gpu_huffman_images = bool((sizes.prod(dim=1) > GPU_HUFFMAN_PIXELS).any())
        plan = batches_of(len(datas), total, a.batch)
        best = {}
        for T in threads:
            sweep = []
            if nvi_version is not None:
                for pair in a.sweep.split(","):
                    sh = tuple(float(x) for x in pair.split(":"))
                    r = record(name, f"sweep_split={pair}", T, "split decoder alone (engine:CPU shares, rest nvJPEG)",
                               lambda: packer_decode(datas, jpeg, plan, _decoder("split", T, sh)))
                    if r and "img_s" in r:
                        sweep.append((r["img_s"], sh))
            best[T] = max(sweep)[1] if sweep else None
            for sh in (float(x) for x in a.native_shares.split(",")):
                record(name, f"native_decode={sh:g}", T, "packer's native engine alone, full decode (hardware "
                       f"share {sh:g}; -1 balanced)",
                       lambda: packer_decode(datas, jpeg, plan, _decoder("native", T, (sh, 0))))
        if nvi_version is not None:
            record(name, "engine_decode", max(threads), "nvImageCodec hardware engine alone, full decode",
                   lambda: packer_decode(datas, jpeg, plan, _decoder("engine", max(threads))))
        best_share[name] = {T: best[T] for T in threads}
        for T in threads:
            if dali_version:
                record(name, "dali_train", T, "DALI image_random_crop(mixed, hw_decoder_load=0.65) + resize + cmn",
                       lambda: dali_rows(datas, plan, a.batch, T, train=True))
                record(name, "dali_decode", T, "DALI decoders.image(mixed, hw_decoder_load=0.65) alone",
                       lambda: dali_rows(datas, plan, a.batch, T, train=False))
            record(name, "packer_train_native", T, "store -> GPULoader (packer's native engine) + TrainPipeline",
                   lambda: packer_train(store, plan, T, _decoder("native", T, (-1, 0))))
            for sh in (float(x) for x in a.train_shares.split(",") if x):
                record(name, f"packer_train_native_share={sh:g}", T, f"same as packer_train_native, hardware share "
                       f"fixed at {sh:g}", lambda: packer_train(store, plan, T, _decoder("native", T, (sh, 0))))
            if gpu_huffman_images:  # elsewhere the row would be packer_train_native again
                record(name, "packer_train_native_cpuhuff", T, "same as packer_train_native, the threads' Huffman "
                       "stage on the CPU for every image (the GPU's for images over 1 Mpx by default)",
                       lambda: packer_train(store, plan, T, _decoder("native_cpuhuff", T, (-1, 0))))
            for mode, how in (("1", "C++ for every batch"), ("0", "the Python loop")):
                record(name, f"packer_train_native_rec{mode}", T, "same as packer_train_native, record checks in "
                       f"{how} (PACKER_NATIVE_RECORDS={mode}; unset: C++)",
                       lambda: _with_records_env(mode, store, plan, T))
            record(name, "packer_train_native_roi", T, "store -> GPULoader (packer's native engine, ROI: only the "
                   "crop windows decoded) + TrainPipeline",
                   lambda: packer_train(store, plan, T, _decoder("native_roi", T, (-1, 0))))
            record(name, "packer_train_nvjpeg", T, "store -> GPULoader (torchvision nvJPEG) + TrainPipeline",
                   lambda: packer_train(store, plan, T, _decoder("nvjpeg", T)))
            record(name, "packer_train_nvjpeg_nocheck", T, "same, check=False (no record checksums)",
                   lambda: packer_train(store, plan, T, _decoder("nvjpeg", T), check=False))
            record(name, "packer_train_nvjpeg_workers", T, "same as packer_train_nvjpeg, reads in 2 worker processes",
                   lambda: packer_train(store, plan, T, _decoder("nvjpeg", T), workers=2))
            if nvi_version is not None:
                record(name, "packer_train_roi", T, "store -> GPULoader (nvImageCodec engine, ROI: only the crop "
                       "windows decoded) + TrainPipeline", lambda: packer_train(store, plan, T, _decoder("roi", T)))
            share = best[T]
            if share and any(share):  # (0, 0): the split decoder is nvJPEG alone, the rows above
                record(name, "packer_train_split", T, f"store -> GPULoader (split decoder, engine:CPU shares "
                       f"{share[0]}:{share[1]}) + TrainPipeline",
                       lambda: packer_train(store, plan, T, _decoder("split", T, share)))
        record(name, "tv_decode", 0, "torchvision decode_jpeg(list, cuda) alone", lambda: tv_decode(datas, plan))

    report(final=True)
    return 0


def _with_records_env(mode: str, store, plan, threads):
    """The engine's training row with ``PACKER_NATIVE_RECORDS=mode`` (restored after)."""
    with mock.patch.dict(os.environ, {NATIVE_RECORDS_ENV: mode}):
        return packer_train(store, plan, threads, _decoder("native", threads, (-1, 0)))


def _median(vals):
    vals = sorted(vals)
    n = len(vals)
    return (vals[n // 2] + vals[(n - 1) // 2]) / 2 if n else None


def _cell(x):
    return f"{x[1]:,.0f} ({x[2]:,.0f}-{x[3]:,.0f})" if x else "-"


def _ratio(p, d):
    return f"{p[1] / d[1]:.2f}x" if p and d else "-"


def _ratios(rows, threads):
    """Per set and thread count: the median (and min-max over repeats) of packer's best training
    row against ``dali_train``; of packer's default decode (the balanced engine, ``native_decode=-1``,
    else the best decode row) against ``dali_decode``; and the decode's ceiling where both engines
    were measured alone in the run: the hardware JPEG engine alone (``native_decode=1``) plus the
    threads alone (``native_decode=0``), medians added, with the default's share of it."""
    out = ["", "| set | threads | packer train row | img/s median (min-max) | dali_train median (min-max) | ratio | "
           "packer decode row | img/s median (min-max) | dali_decode median (min-max) | ratio | "
           "ceiling: hardware alone + threads alone | decode / ceiling |",
           "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]

    def stats(name, T, row_pred):
        by_row = {}
        for r in rows:
            if (r["set"], r["threads"]) == (name, T) and "img_s" in r and row_pred(r["row"]):
                by_row.setdefault(r["row"], []).append(r["img_s"])
        if not by_row:
            return None
        row, vals = max(by_row.items(), key=lambda kv: _median(kv[1]))
        return row, _median(vals), min(vals), max(vals)

    for name in ("hd", "small"):
        for T in threads:
            pt = stats(name, T, lambda r: r.startswith("packer_train"))
            dt = stats(name, T, lambda r: r == "dali_train")
            pd = stats(name, T, lambda r: r == "native_decode=-1") or stats(
                name, T, lambda r: r.startswith("native_decode") or r.startswith("sweep_split"))
            dd = stats(name, T, lambda r: r == "dali_decode")
            hw = stats(name, T, lambda r: r == "native_decode=1")
            th = stats(name, T, lambda r: r == "native_decode=0")
            if not (pt or pd):
                continue
            ceiling = (hw[1] + th[1]) if hw and th else None
            ceil_cell = f"{ceiling:,.0f} ({hw[1]:,.0f} + {th[1]:,.0f})" if ceiling else "-"
            share = f"{pd[1] / ceiling:.2f}" if ceiling and pd else "-"
            out.append(f"| {name} | {T} | {pt[0] if pt else '-'} | {_cell(pt)} | {_cell(dt)} | {_ratio(pt, dt)} | "
                       f"{pd[0] if pd else '-'} | {_cell(pd)} | {_cell(dd)} | {_ratio(pd, dd)} | {ceil_cell} | "
                       f"{share} |")
    return out


def _report(a, env, rows, best_load, dali_why, threads, final):
    """Writes OUT/bench_vs_dali.md and .json (after every row, so a run cut short keeps its rows)."""
    lines = [f"GPU {env['gpu']}, torch {env['torch']}, torchvision {env['torchvision']}, CUDA {env['cuda']}, "
             f"Python {env['python']}, {env['cpus']} CPUs, DALI {env['dali'] or 'absent'}, nvImageCodec "
             f"{env['nvimgcodec'] or 'absent'}, batch {a.batch}, CUDA hardware queues "
             f"{env.get('cuda_queues') or '8 (default)'}; "
             f"best engine:CPU shares per set and threads: {best_load}", ""]
    if dali_why:
        lines += [dali_why, ""]
    lines += ["| set | threads | row | what | img/s | CPU cores used |", "|---|---:|---|---|---:|---:|"]
    for r in rows:
        val = f"{r['img_s']:,.0f} | {r['cpu_cores']}" if "img_s" in r else f"failed: {r['error'][:90]} |"
        lines.append(f"| {r['set']} | {r['threads']} | {r['row']} | {r['what']} | {val} |")
    lines.append("")
    lines += _ratios(rows, threads)
    (a.out / "bench_vs_dali.md").write_text("\n".join(lines) + "\n")
    shares = {k: {str(t): v for t, v in d.items()} for k, d in best_load.items()}
    (a.out / "bench_vs_dali.json").write_text(json.dumps({"env": env, "rows": rows, "best_shares": shares}, indent=1))
    if final:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
