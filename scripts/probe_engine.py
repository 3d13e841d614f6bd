"""Diagnostics of the native engine on a GPU: per-image agreement with torchvision's nvJPEG and
libjpeg-turbo for each hardware share, repeatability, and the loader against the CPU decoder.

    python3 scripts/probe_engine.py [--store S.lmdb]
    python3 scripts/probe_engine.py --timings S.lmdb --threads 8,12 --shares=-1,1 \
        --configs 'one:PACKER_ENGINE_HW_LANES=1;two:PACKER_ENGINE_HW_LANES=2' --loader-seconds 6

Prints one JSON line per check (run by hand or from scripts/gpu_check.sh; not a benchmark)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import Timer  # noqa: E402  (sibling module: scripts/ is on sys.path when run as a script)

from packer.stores import open_store  # noqa: E402
from readers.gpu import GPULoader, TrainPipeline, TurboJpegDecoder, read_raw  # noqa: E402
from readers.gpu.engine import EngineDecoder  # noqa: E402


def _d(a, b):
    d = (a.cpu().float() - b.cpu().float()).abs()
    return round(float(d.mean()), 3), float(d.max())


def _configs(spec: str):
    """``name:K=V,K=V;name2:...`` -> [(name, {K: V})]; an empty spec is one config of no settings.
    Upper-case keys are environment settings, lower-case ones ``EngineDecoder`` arguments."""
    out = []
    for item in filter(None, (x.strip() for x in (spec or "").split(";"))):
        name, _, kvs = item.partition(":")
        out.append((name, dict(kv.split("=", 1) for kv in kvs.split(",") if kv)))
    return out or [("default", {})]


def _loader_rate(store: str, threads: int, share: float, seconds: float, batch: int = 256):
    """img/s, CPU cores and the final share of ``GPULoader`` + ``TrainPipeline(224)`` fed by the
    engine over ``store`` for about ``seconds`` (after one warm-up pass of 12 batches)."""
    with open_store(store) as r:
        n = r.metadata.count
    g = torch.Generator().manual_seed(0)
    plan = [torch.randint(0, n, (batch,), generator=g).tolist() for _ in range(12)]
    dec = EngineDecoder("cuda", threads=threads, hardware_share=share)
    with GPULoader(store, TrainPipeline(224), batch_sampler=plan, device="cuda", decoder=dec, threads=threads,
                   prefetch=3) as loader:
        for _ in loader:
            pass
        imgs = 0
        with Timer() as t:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for b in loader:
                    imgs += b.images.shape[0]
    return round(imgs / t.wall), round(t.cpu / t.wall, 2), round(dec.hardware_share, 3)


def timings(store: str, threads, shares, batch: int = 256, batches: int = 30, configs: str = "",
            loader_seconds: float = 0.0, loader_shares=(-1.0,)) -> None:
    """Per-call host timings of the engine (header pass, threads' part, hardware call, whole call)
    on pre-read pinned batches of ``store``: where a batch's time goes. ``configs``: engine settings
    from the environment (``PACKER_ENGINE_*``, read when an engine is made) compared in this one
    process; ``loader_seconds`` > 0 adds the loader's train rate for the shares in ``loader_shares``."""
    with open_store(store) as r:
        n = r.metadata.count
        g = torch.Generator().manual_seed(0)
        raws = [read_raw(r, torch.randint(0, n, (batch,), generator=g).tolist()) for _ in range(batches)]
    for T in threads:
        for name, env in _configs(configs):
            kw = {k: int(v) for k, v in env.items() if k.islower()}  # EngineDecoder's own arguments
            env = {k: v for k, v in env.items() if not k.islower()}
            with mock.patch.dict(os.environ, env):  # the engine reads them when it is made
                for share in shares:
                    dec = EngineDecoder("cuda", threads=T, hardware_share=share, **kw)
                    for raw in raws[:3]:
                        dec.decode_parts(raw.buffers, raw.parts)
                    acc = [0.0] * 4
                    with Timer() as t:
                        t0 = time.perf_counter()
                        for raw in raws:
                            dec.decode_parts(raw.buffers, raw.parts)
                            acc = [x + y for x, y in zip(acc, dec._engine.last_timings)]
                        host = time.perf_counter() - t0
                    row = {"store": Path(store).name, "threads": T, "config": name, "share": share,
                           "img_s": round(batch * batches / t.wall), "host_only_img_s": round(batch * batches / host),
                           "cores": round(t.cpu / t.wall, 2),
                           "final_share": round(dec.hardware_share, 3), "lanes": dec._engine.hardware_lanes,
                           "notes": dec._engine.hardware_notes,
                           "engines_cores": list(dec._engine.hardware_decoder_info),
                           "ms_per_call": {k: round(v / batches, 2) for k, v in
                                           zip(("header", "threads_part", "hw_call", "call"), acc)}}
                    del dec
                    if loader_seconds > 0 and share in loader_shares:
                        row["loader_img_s"], row["loader_cores"], row["loader_final_share"] = _loader_rate(
                            store, T, share, loader_seconds, batch)
                    print(json.dumps(row), flush=True)


def main(argv=None) -> int:
    import torchvision.io as tvio

    from tests.jpeg_kinds import cmyk_jpeg, kinds_store_at

    ap = argparse.ArgumentParser()
    ap.add_argument("--store")
    ap.add_argument("--timings", help="a store: per-call timings only")
    ap.add_argument("--threads", default="4,12")
    ap.add_argument("--shares", default="1,0.7,0")
    ap.add_argument("--configs", default="", help="with --timings: engine settings to compare, "
                    "'name:PACKER_ENGINE_X=V,...;name2:...'")
    ap.add_argument("--loader-seconds", type=float, default=0.0,
                    help="with --timings: also time GPULoader + TrainPipeline(224) this long per row")
    ap.add_argument("--loader-shares", default="-1", help="the shares of those loader rows")
    a = ap.parse_args(argv)
    if a.timings:
        timings(a.timings, [int(t) for t in a.threads.split(",")], [float(s) for s in a.shares.split(",")],
                configs=a.configs, loader_seconds=a.loader_seconds,
                loader_shares=[float(s) for s in a.loader_shares.split(",")])
        return 0
    tmp = Path(tempfile.mkdtemp())
    store = a.store or kinds_store_at(tmp)
    with open_store(store) as r:
        raw = read_raw(r, list(range(r.metadata.count)))
    datas = [bytes(d.numpy()) for d in raw.datas()]
    tv = [t.permute(1, 2, 0) for t in tvio.decode_jpeg([torch.frombuffer(bytearray(d), dtype=torch.uint8)
                                                        for d in datas], device="cuda")]
    turbo = TurboJpegDecoder(1).decode(datas, "cpu")
    for share in (0.0, 1.0, -1.0):
        dec = EngineDecoder("cuda", threads=3, hardware_share=share)
        runs = []
        for _ in range(3):
            rb = dec.decode_parts(raw.buffers, raw.parts, raw.keys)
            runs.append([v.clone() for v in rb.unbind()])
        torch.cuda.synchronize()
        same = all(torch.equal(x, y) for run in runs[1:] for x, y in zip(run, runs[0]))
        per = [{"key": k, "vs_tv": _d(e, t), "vs_turbo": _d(e, c)} for k, e, t, c in zip(raw.keys, runs[0], tv, turbo)]
        print(json.dumps({"share": share, "repeatable": same, "stats": dec.stats, "hw": dec.hardware,
                          "final_share": dec.hardware_share, "images": per}), flush=True)
    for dec in ("engine", "nvjpeg", "turbojpeg"):
        with GPULoader(store, None, batch_size=6, device="cuda", decoder=dec, seed=3, threads=3) as loader:
            imgs = [img for b in loader for img in b.images]
        torch.cuda.synchronize()
        print(json.dumps({"loader_pipeline_none": dec, "vs_turbo": [_d(x, y) for x, y in zip(imgs, turbo)]}),
              flush=True)
    from packer.core.integrity import opencv_decode

    dec = EngineDecoder("cuda", threads=2)
    c = cmyk_jpeg()
    img = dec.decode([c], "cuda", ["cmyk.jpg"])[0]
    ref = torch.from_numpy(opencv_decode(c))
    print(json.dumps({"cmyk": _d(img, ref), "fallbacks": dec.fallbacks, "shape": list(img.shape)}), flush=True)
    outs = {}
    for dec in ("engine", "nvjpeg", "turbojpeg"):
        with GPULoader(store, TrainPipeline(64, scale=(0.3, 1.0), antialias=False), batch_size=6, device="cuda",
                       decoder=dec, seed=3, threads=3) as loader:
            outs[dec] = [b.images for b in loader]
    for dec in ("engine", "nvjpeg"):
        print(json.dumps({"train_vs_turbo": dec, "batch_mean_diff": [
            round(float((x - y)[:, :, 2:-2, 2:-2].abs().mean()), 4) for x, y in zip(outs[dec], outs["turbojpeg"])]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
