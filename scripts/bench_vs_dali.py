"""packer's GPU train pipeline against NVIDIA DALI on the same images, in one run (run on a GPU).

    python3 scripts/bench_vs_dali.py --sets .bench/sets --out OUT [--threads 4,12] [--batch 256]

DALI is NOT a dependency of packer: only this script imports it, and its rows are skipped (with
the reason) where it is absent. Install it with ``pip install nvidia-dali-cuda130`` (DALI 2.4 was
measured; it needs ``nvidia-nvimgcodec-cu13``).

For each set of scripts/make_bench_sets.py (``hd``: 1920x1080 q90; ``small``: ~500 px, real
photographs) and each thread count T, with batch 256 and the same images (batches drawn with
replacement, the same number of images per row):

* ``dali_train``: ``fn.external_source`` (the JPEG bytes, in memory) -> ``fn.decoders.image_random_crop
  (device="mixed", hw_decoder_load=0.65)`` -> ``fn.resize`` 224x224 -> ``fn.crop_mirror_normalize``
  (float, CHW, random mirror), ``num_threads=T``;
* ``dali_decode``: ``fn.decoders.image(device="mixed", hw_decoder_load=0.65)`` alone (full decode);
* ``packer_train``: packer LMDB store -> ``GPULoader(threads=T)`` (checked reads, routed nvImageCodec
  decode, ``TrainPipeline(224)``, prefetch); ``packer_train_nocheck``: the same without record
  checksums (DALI reads unchecked bytes from memory); ``packer_train_workers``: reads in T worker
  processes; ``packer_train_nvjpeg``: the same loader with torchvision's nvJPEG;
* ``packer_decode``: :class:`readers.gpu.nvimgcodec.NvImageCodecDecoder` alone on the bytes in
  memory (full decode); with ``--roi`` also ``packer_decode_roi``, decoding only the train crops;
* ``tv_decode``: torchvision's batched nvJPEG ``decode_jpeg``.

Before those rows, ``hw_load`` (the share of each batch sent to the hardware JPEG engine) is swept
on the decoder alone at the largest T; the best value is used for the packer rows and reported.

Images/s and CPU cores used (process CPU time / wall time). Writes OUT/bench_vs_dali.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import Timer  # noqa: E402  (sibling module: scripts/ is on sys.path when run as a script)
from packer.stores import open_store  # noqa: E402
from readers.gpu import GPULoader, TrainPipeline, read_raw  # noqa: E402

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


# -- packer ----------------------------------------------------------------------------------------
def _load(hw_load):
    """``0.65`` -> (0.65, "fixed"); ``"a0.65"`` -> (0.65, "adaptive")."""
    s = str(hw_load)
    return (float(s[1:]), "adaptive") if s.startswith("a") else (float(s), "fixed")


def packer_decode(datas, jpeg, sizes, plan, threads, hw_load, roi: bool):
    from readers.gpu.nvimgcodec import NvImageCodecDecoder

    load, policy = _load(hw_load)
    dec = NvImageCodecDecoder(hw_load=load, load_policy=policy, threads=threads, fallback_threads=threads)
    pipe = TrainPipeline(224)
    regions = None
    work = []
    for b in plan:
        regions = None
        if roi:
            p = pipe.sample(sizes[b], torch.Generator().manual_seed(len(work)))
            regions = [tuple(r) for r in p.boxes.tolist()]
        work.append(([datas[i] for i in b], [jpeg[i] for i in b] if jpeg else None, regions))
    dec.decode(work[0][0][:16], "cuda", jpeg=work[0][1][:16] if work[0][1] else None)  # warm-up
    n = 0
    with Timer() as t:
        for ds, js, rg in work:
            n += len(dec.decode(ds, "cuda", jpeg=js, regions=rg))
    out = {"routed": dict(dec.routed), "fallbacks": dec.fallbacks}
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


def packer_train(store, plan, batch, threads, hw_load, check=True, decoder=None, roi=True, workers=0):
    from readers.gpu.nvimgcodec import NvImageCodecDecoder

    load, policy = _load(hw_load)
    dec = decoder or NvImageCodecDecoder(hw_load=load, load_policy=policy, threads=threads,
                                         fallback_threads=max(1, threads // 2), roi=roi)
    flat = [i for b in plan for i in b]

    class Fixed(torch.utils.data.Sampler):
        def __iter__(self):
            return iter([flat[s : s + batch] for s in range(0, len(flat), batch)])

        def __len__(self):
            return len(plan)

    with GPULoader(store, TrainPipeline(224), batch_sampler=Fixed(), device="cuda", decoder=dec,
                   threads=threads, prefetch=3, check=check, workers=workers) as loader:
        for i, b in enumerate(loader):  # warm-up
            if i == 1:
                break
        n = 0
        with Timer() as t:
            for b in loader:
                n += b.images.shape[0]
        extra = {"decoder": loader.decoder.name, "stage_host_s": {k: round(v, 3) for k, v in loader.stats.items()}}
        if hasattr(dec, "routed"):
            extra["routed"] = dict(dec.routed)
    return n, t, extra


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=Path, default=Path(".bench/sets"))
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--threads", default="4,12")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--roi", action="store_true", help="also the decoder alone on the train crops (ROI)")
    ap.add_argument("--sweep", default="0,0.65,0.9,1.0,a0.65",
                    help="hw_load values tried on the decoder (aX: adaptive policy starting at X)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]
    import torchvision

    try:
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
           "dali": dali_version, "nvimgcodec": nvi_version, "batch": a.batch}
    print(json.dumps(env), flush=True)
    rows = []
    best_load = {}

    def report(final=False):
        _report(a, env, rows, best_load, dali_why, threads, final)

    def record(set_name, row, T, what, fn):
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            r = {"set": set_name, "row": row, "threads": T, "what": what, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(r), flush=True)
            rows.append(r)
            report()
            return None
        n, t = res[0], res[1]
        r = {"set": set_name, "row": row, "threads": T, "what": what, "images": n, "wall_s": round(t.wall, 3),
             "img_s": round(n / t.wall, 1), "cpu_cores": round(t.cpu / t.wall, 2)}
        if len(res) > 2:
            r.update(res[2])
        print(json.dumps(r), flush=True)
        rows.append(r)
        report()
        return r

    for name, total in (("hd", 256 * 16), ("small", 256 * 40)):
        store = str(a.sets / f"{name}.lmdb")
        if not os.path.exists(store):
            print(f"missing {store}; skipped")
            continue
        datas, jpeg, sizes = load_set(store)
        plan = batches_of(len(datas), total, a.batch)
        tmax = max(threads)
        sweep = []
        if nvi_version is not None:
            for load in a.sweep.split(","):
                r = record(name, f"sweep_hw_load={load}", tmax, "nvImageCodec decoder alone, full decode",
                           lambda: packer_decode(datas, jpeg, sizes, plan, tmax, load, roi=False))
                if r and "img_s" in r:
                    sweep.append((r["img_s"], load))
        best_load[name] = max(sweep)[1] if sweep else None
        hw = best_load[name] if best_load[name] is not None else "0.75"
        for T in threads:
            if dali_version:
                record(name, "dali_train", T, "DALI image_random_crop(mixed, hw_decoder_load=0.65) + resize + cmn",
                       lambda: dali_rows(datas, plan, a.batch, T, train=True))
                record(name, "dali_decode", T, "DALI decoders.image(mixed, hw_decoder_load=0.65) alone",
                       lambda: dali_rows(datas, plan, a.batch, T, train=False))
            if nvi_version is not None:
                record(name, "packer_train", T, f"store -> GPULoader (nvImageCodec hw_load={hw}) + TrainPipeline",
                       lambda: packer_train(store, plan, a.batch, T, hw, roi=False))
                record(name, "packer_train_nocheck", T, "same, check=False (no record checksums)",
                       lambda: packer_train(store, plan, a.batch, T, hw, check=False, roi=False))
                record(name, "packer_train_workers", T, f"same as packer_train, reads in {T} worker processes",
                       lambda: packer_train(store, plan, a.batch, T, hw, workers=T, roi=False))
                record(name, "packer_decode", T, f"nvImageCodec decoder alone (hw_load={hw}), full decode",
                       lambda: packer_decode(datas, jpeg, sizes, plan, T, hw, roi=False))
                if a.roi:
                    record(name, "packer_decode_roi", T, f"nvImageCodec decoder alone (hw_load={hw}), train crops (ROI)",
                           lambda: packer_decode(datas, jpeg, sizes, plan, T, hw, roi=True))
            record(name, "packer_train_nvjpeg", T, "store -> GPULoader (torchvision nvJPEG) + TrainPipeline",
                   lambda: packer_train(store, plan, a.batch, T, 0, decoder="nvjpeg"))
        record(name, "tv_decode", 0, "torchvision decode_jpeg(list, cuda) alone", lambda: tv_decode(datas, plan))

    report(final=True)
    return 0


def _report(a, env, rows, best_load, dali_why, threads, final):
    """Writes OUT/bench_vs_dali.md and .json (after every row, so a run cut short keeps its rows)."""
    lines = [f"GPU {env['gpu']}, torch {env['torch']}, torchvision {env['torchvision']}, CUDA {env['cuda']}, "
             f"Python {env['python']}, {env['cpus']} CPUs, DALI {env['dali'] or 'absent'}, nvImageCodec "
             f"{env['nvimgcodec'] or 'absent'}, batch {a.batch}; best hw_load per set: {best_load}", ""]
    if dali_why:
        lines += [dali_why, ""]
    lines += ["| set | threads | row | what | img/s | CPU cores used |", "|---|---:|---|---|---:|---:|"]
    for r in rows:
        val = f"{r['img_s']:,.0f} | {r['cpu_cores']}" if "img_s" in r else f"failed: {r['error'][:90]} |"
        lines.append(f"| {r['set']} | {r['threads']} | {r['row']} | {r['what']} | {val} |")
    lines.append("")
    for name in ("hd", "small"):
        for T in threads:
            d = next((r for r in rows if (r["set"], r["row"], r["threads"]) == (name, "dali_train", T) and "img_s" in r), None)
            p = next((r for r in rows if (r["set"], r["row"], r["threads"]) == (name, "packer_train", T) and "img_s" in r), None)
            if d and p:
                lines.append(f"{name}, {T} threads: packer_train / dali_train = {p['img_s'] / d['img_s']:.0%}")
    (a.out / "bench_vs_dali.md").write_text("\n".join(lines) + "\n")
    (a.out / "bench_vs_dali.json").write_text(json.dumps({"env": env, "rows": rows, "best_hw_load": best_load}, indent=1))
    if final:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
