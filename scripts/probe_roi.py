"""Probe of nvImageCodec's region-of-interest JPEG decode (run on a GPU): for each backend and
decoder option set, does a batch of crop windows decode (or come back empty, or warn, or crash),
how long it takes against decoding the whole images, and whether the window equals the same
window cut from a whole decode with the same options.

    python3 scripts/probe_roi.py [--out DIR]     # one subprocess per configuration (a crash is a row)
    python3 scripts/probe_roi.py --ceilings      # whole-image decode ceilings of each engine
    python3 scripts/probe_roi.py --combined      # both engines at once: one decoder, or two on threads

Synthetic photo-like JPEGs (4:2:0, quality 90) at 1920x1080 and 500x375; windows drawn as
RandomResizedCrop draws them (area 8-100 %, ratio 3/4-4/3), seeded. Prints one table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BACKENDS = ("HW_GPU_ONLY", "HYBRID_CPU_GPU", "GPU_ONLY")
OPTIONS = ("", ":fancy_upsampling=0")
SIZES = {"1080p": (1080, 1920), "500px": (375, 500)}
BATCH = 64


def _jpegs(h: int, w: int, n: int, seed: int) -> list:
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([np.sin(xx / rng.uniform(20, 200)) * 90 + 128, np.cos(yy / rng.uniform(20, 200)) * 90 + 128,
                         (xx + yy) / (h + w) * 255], axis=-1)
        img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90,
                                             cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420])
        out.append(buf.tobytes())
    return out


def _windows(h: int, w: int, n: int, seed: int) -> list:
    import math

    import numpy as np

    rng = np.random.default_rng(seed + 1)
    out = []
    for _ in range(n):
        for _ in range(10):
            area = h * w * rng.uniform(0.08, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                break
        else:
            ch, cw = min(h, w), min(h, w)
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        out.append((top, left, ch, cw))
    return out


def run_one(size: str, backend: str, options: str) -> dict:
    """One configuration, in this process."""
    import torch
    from nvidia import nvimgcodec as n

    h, w = SIZES[size]
    datas = _jpegs(h, w, 8, 0) * (BATCH // 8)
    wins = _windows(h, w, BATCH, 0)
    params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                            sample_format=n.SampleFormat.I_RGB)
    dec = n.Decoder(backends=[n.Backend(getattr(n.BackendKind, backend))], options=options)
    stream = torch.cuda.current_stream()

    def whole():
        return dec.decode([n.CodeStream(d) for d in datas], params=params, cuda_stream=stream.cuda_stream)

    def roi():
        parents = [n.CodeStream(d) for d in datas]
        subs = [cs.get_sub_code_stream(region=n.Region(t, l, t + hh, l + ww))
                for cs, (t, l, hh, ww) in zip(parents, wins)]
        return dec.decode(subs, params=params, cuda_stream=stream.cuda_stream)

    res = {"size": size, "backend": backend, "options": options or "(default)"}
    full = whole()
    torch.cuda.synchronize()
    res["whole_none"] = sum(x is None for x in full)
    got = roi()
    torch.cuda.synchronize()
    res["roi_none"] = sum(x is None for x in got)
    diffs = []
    for f, g, (t, l, hh, ww) in zip(full, got, wins):
        if f is None or g is None:
            continue
        a = torch.from_dlpack(f)[t:t + hh, l:l + ww].int()
        b = torch.from_dlpack(g).int()
        diffs.append(int((a - b).abs().max()) if a.shape == b.shape else 999)
    res["roi_vs_whole_maxdiff"] = max(diffs) if diffs else None
    for name, fn in (("whole_ms", whole), ("roi_ms", roi)):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        res[name] = round((time.perf_counter() - t0) / 5 * 1000, 2)
    return res


def ceilings(batch: int = 256, reps: int = 5) -> list:
    """Whole-image decode rate of each engine alone: the hardware JPEG engine, and nvJPEG's
    hybrid CPU (Huffman) + CUDA decode at 4, 8, 12, 16 CPU threads; images/s and CPU cores used
    (process CPU time / wall time)."""
    import torch
    from nvidia import nvimgcodec as n

    params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                            sample_format=n.SampleFormat.I_RGB)
    stream = torch.cuda.current_stream()
    rows = []
    configs = [("HW_GPU_ONLY", 4)] + [("HYBRID_CPU_GPU", t) for t in (4, 8, 12, 16)]
    for size, (h, w) in SIZES.items():
        datas = (_jpegs(h, w, 16, 1) * (batch // 16 + 1))[:batch]
        for backend, threads in configs:
            dec = n.Decoder(backends=[n.Backend(getattr(n.BackendKind, backend))], max_num_cpu_threads=threads)
            streams = [n.CodeStream(d) for d in datas]
            dec.decode(streams, params=params, cuda_stream=stream.cuda_stream)
            torch.cuda.synchronize()
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(reps):
                out = dec.decode(streams, params=params, cuda_stream=stream.cuda_stream)
            torch.cuda.synchronize()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            rows.append({"size": size, "engine": backend, "threads": threads, "batch": batch,
                         "none": sum(x is None for x in out), "img_per_s": round(batch * reps / wall),
                         "cpu_cores": round(cpu / wall, 2)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def combined(batch: int = 256, reps: int = 5, threads: int = 12) -> list:
    """Both engines at once, two ways: one Decoder with both backends (the hardware engine's
    ``load_hint`` = its share), and two Decoders (hardware alone, hybrid alone) each given its
    share of the batch on its own Python thread (nvImageCodec releases the GIL while it decodes)."""
    import concurrent.futures as cf

    import torch
    from nvidia import nvimgcodec as n

    params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                            sample_format=n.SampleFormat.I_RGB)
    B, K = n.Backend, n.BackendKind
    rows = []
    for size, (h, w) in SIZES.items():
        datas = (_jpegs(h, w, 16, 1) * (batch // 16 + 1))[:batch]
        streams = [n.CodeStream(d) for d in datas]
        hw = n.Decoder(backends=[B(K.HW_GPU_ONLY)], max_num_cpu_threads=threads)
        hy = n.Decoder(backends=[B(K.HYBRID_CPU_GPU)], max_num_cpu_threads=threads)
        s_hw, s_hy = torch.cuda.Stream(), torch.cuda.Stream()
        pool = cf.ThreadPoolExecutor(2)
        for share in (0.5, 0.65, 0.72, 0.8):
            one = n.Decoder(backends=[B(K.HW_GPU_ONLY, load_hint=share), B(K.HYBRID_CPU_GPU)],
                            max_num_cpu_threads=threads)
            cut = int(batch * share)

            def two():
                f1 = pool.submit(hw.decode, streams[:cut], params=params, cuda_stream=s_hw.cuda_stream)
                f2 = pool.submit(hy.decode, streams[cut:], params=params, cuda_stream=s_hy.cuda_stream)
                return f1.result() + f2.result()

            for name, fn in (("one_decoder", lambda: one.decode(streams, params=params)), ("two_decoders", two)):
                fn()
                torch.cuda.synchronize()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(reps):
                    out = fn()
                torch.cuda.synchronize()
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                rows.append({"size": size, "way": name, "hw_share": share, "threads": threads,
                             "none": sum(x is None for x in out), "img_per_s": round(batch * reps / wall),
                             "cpu_cores": round(cpu / wall, 2)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=3, metavar=("SIZE", "BACKEND", "OPTIONS"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="folder for the JSON rows and the stderr of each run")
    ap.add_argument("--ceilings", action="store_true", help="whole-image decode ceilings of each engine")
    ap.add_argument("--combined", action="store_true", help="both engines at once: one decoder or two")
    args = ap.parse_args()
    if args.ceilings:
        ceilings()
        return 0
    if args.combined:
        combined()
        return 0
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], "" if args.one[2] == "-" else args.one[2])))
        return 0
    rows = []
    for size in SIZES:
        for backend in BACKENDS:
            for options in OPTIONS:
                cmd = [sys.executable, __file__, "--one", size, backend, options or "-"]
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
                    out, err, rc = r.stdout, r.stderr, r.returncode
                except subprocess.TimeoutExpired:
                    out, err, rc = "", "timeout", -1
                row = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {
                    "size": size, "backend": backend, "options": options or "(default)", "rc": rc,
                    "error": (err.strip().splitlines() or ["?"])[-1][:160]}
                row["warning_lines"] = sum(1 for line in err.splitlines() if "warn" in line.lower()
                                           or "fancy" in line.lower())
                row["first_warning"] = next((line[:160] for line in err.splitlines() if "fancy" in line.lower()
                                             or "warn" in line.lower()), "")
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, f"{size}-{backend}-{options.strip(':') or 'default'}.err"),
                              "w") as fh:
                        fh.write(err[-20000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
