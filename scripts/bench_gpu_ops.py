#!/usr/bin/env python3
"""Benchmarks gpu_ops on a CUDA GPU against what users write today, side by side in one run.

For each op: our kernel; the eager PyTorch chain (permute().float().sub().div(); affine_grid +
grid_sample; F.interpolate; ...); torch.compile of that chain; torchvision.transforms.v2 where it has
the op. Times are medians of ``triton.testing.do_bench`` (CUDA events, L2 flushed before each run,
warm-up first); inputs are far larger than L2. Effective bandwidth = (bytes the op must read once +
bytes it must write once) / time, shown next to the device-to-device copy bandwidth measured in the
same run (bytes read + written).

Usage: python3 scripts/bench_gpu_ops.py [--out DIR] [--quick]
Writes DIR/bench.md (markdown table) and DIR/bench.json, and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpu_ops  # noqa: E402

try:
    import triton.testing as tt
except ImportError:  # pragma: no cover - triton ships with CUDA torch
    tt = None

try:
    import torchvision.transforms.v2 as T2
    import torchvision.transforms.v2.functional as TF2
except ImportError:  # pragma: no cover
    T2 = TF2 = None

MEAN = [123.675, 116.28, 103.53]
STD = [58.395, 57.12, 57.375]
ROWS = []
ARGS = None


def bench(fn, rep_ms=200):
    """Median milliseconds of fn() over repetitions, after warm-up."""
    fn()
    torch.cuda.synchronize()
    if tt is not None:
        return float(tt.do_bench(fn, warmup=50, rep=rep_ms, return_mode="median"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def record(op, shape, impl, fn, nbytes, images, note="", rep_ms=200):
    try:
        ms = bench(fn, rep_ms)
        row = dict(op=op, shape=shape, impl=impl, ms=ms, gbps=nbytes / ms / 1e6, img_s=images / ms * 1e3, note=note)
    except Exception as exc:  # a failing baseline is reported, not fatal
        traceback.print_exc()
        row = dict(op=op, shape=shape, impl=impl, ms=float("nan"), gbps=float("nan"), img_s=float("nan"),
                   note=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    ROWS.append(row)
    print(f"{op:32s} {impl:46s} {row['ms']:9.3f} ms {row['gbps']:8.0f} GB/s "
          f"{row['img_s']:10.0f} img/s {row['note']}", flush=True)
    return row


def compiled(fn):
    return torch.compile(fn, dynamic=False)


# ------------------------------------------------------------------------------------------------
def copy_bandwidth():
    n = 1 << 30
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * n / ms / 1e6


def bench_cmn():
    B, H, W = (64, 224, 224) if ARGS.quick else (256, 224, 224)
    shape = f"{B}x{H}x{W}x3 u8 -> f32 NCHW"
    x = torch.randint(0, 256, (B, H, W, 3), dtype=torch.uint8, device="cuda")
    m = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    s = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    nbytes = x.numel() * (1 + 4)
    flip = torch.rand(B, device="cuda") < 0.5

    def eager():
        return x.permute(0, 3, 1, 2).float().sub(m).div(s)

    ours = lambda: gpu_ops.crop_mirror_normalize(x, MEAN, STD)  # noqa: E731
    got, want = ours(), eager()
    err = (got - want).abs().max().item()
    record("crop_mirror_normalize", shape, "gpu_ops (no flip)", ours, nbytes, B, f"max|diff| vs eager {err:.1e}")
    record("crop_mirror_normalize", shape, "gpu_ops (per-sample flip)",
           lambda: gpu_ops.crop_mirror_normalize(x, MEAN, STD, flip=flip), nbytes, B)
    record("crop_mirror_normalize", shape, "eager permute().float().sub().div()", eager, nbytes, B)
    record("crop_mirror_normalize", shape, "torch.compile(eager chain)", compiled(eager), nbytes, B)
    if TF2 is not None:
        def tv2():
            return TF2.normalize(TF2.to_dtype(x.permute(0, 3, 1, 2), torch.float32, scale=False), MEAN, STD)
        record("crop_mirror_normalize", shape, "torchvision v2 to_dtype+normalize", tv2, nbytes, B)
    shape16 = f"{B}x{H}x{W}x3 u8 -> f16 NCHW"
    nb16 = x.numel() * (1 + 2)
    record("crop_mirror_normalize", shape16, "gpu_ops (per-sample flip, fp16 out)",
           lambda: gpu_ops.crop_mirror_normalize(x, MEAN, STD, flip=flip, dtype=torch.float16), nb16, B)
    eager16 = lambda: x.permute(0, 3, 1, 2).half().sub(m.half()).div(s.half())  # noqa: E731
    record("crop_mirror_normalize", shape16, "eager permute().half().sub().div()", eager16, nb16, B)
    record("crop_mirror_normalize", shape16, "torch.compile(eager chain)", compiled(eager16), nb16, B)
    # Random 224 crop out of 256x256 + per-sample flip (the validation/training crop case).
    x2 = torch.randint(0, 256, (B, 256, 256, 3), dtype=torch.uint8, device="cuda")
    crop = torch.randint(0, 33, (B, 2), device="cuda")
    shape2 = f"{B}x256x256x3 u8 -> crop 224 f32"
    nb2 = B * 224 * 224 * 3 * (1 + 4)
    record("crop_mirror_normalize", shape2, "gpu_ops (per-sample crop+flip)",
           lambda: gpu_ops.crop_mirror_normalize(x2, MEAN, STD, size=224, crop=crop, flip=flip), nb2, B)
    crop_l, flip_l = crop.tolist(), flip.tolist()

    def eager_loop():
        ys = [x2[b, t:t + 224, l:l + 224] for b, (t, l) in enumerate(crop_l)]
        y = torch.stack([v.flip(1) if f else v for v, f in zip(ys, flip_l)])
        return y.permute(0, 3, 1, 2).float().sub(m).div(s)

    record("crop_mirror_normalize", shape2, "eager per-sample slice/flip + chain", eager_loop, nb2, B, rep_ms=400)


def pixel_to_theta(M, H, W, oh, ow):
    """dst->src pixel-centre matrices -> affine_grid thetas (align_corners=False)."""
    B = M.shape[0]
    def N(h, w):
        return torch.tensor([[2.0 / w, 0, 1.0 / w - 1], [0, 2.0 / h, 1.0 / h - 1], [0, 0, 1]], dtype=torch.float64)
    M3 = torch.cat([M.cpu().double(), torch.tensor([[[0, 0, 1.0]]], dtype=torch.float64).expand(B, 1, 3)], 1)
    theta = N(H, W) @ M3 @ torch.linalg.inv(N(oh, ow))
    return theta[:, :2].float()


def bench_warp():
    B, H, W = (16, 512, 512) if ARGS.quick else (64, 512, 512)
    shape = f"{B}x3x{H}x{W} u8"
    x = torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device="cuda")
    g = torch.Generator().manual_seed(0)
    ang = (torch.rand(B, generator=g, dtype=torch.float64) - 0.5) * 2 * math.pi / 6
    sc = 0.8 + 0.4 * torch.rand(B, generator=g, dtype=torch.float64)
    c = torch.tensor([(W - 1) / 2, (H - 1) / 2], dtype=torch.float64)
    R = torch.stack([torch.stack([sc * torch.cos(ang), -sc * torch.sin(ang)], -1),
                     torch.stack([sc * torch.sin(ang), sc * torch.cos(ang)], -1)], 1)
    t = c - (R @ c)
    M = torch.cat([R, t[:, :, None]], 2).cuda()
    theta = pixel_to_theta(M, H, W, H, W).cuda()
    nbytes = 2 * x.numel()

    def eager():
        grid = F.affine_grid(theta, [B, 3, H, W], align_corners=False)
        y = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return y.round().clamp(0, 255).to(torch.uint8)

    ours = lambda: gpu_ops.warp_affine(x, M, (H, W))  # noqa: E731
    d = (ours().int() - eager().int()).abs().float()
    note = f"vs grid_sample: mean|diff| {d.mean().item():.2f}"
    record("warp_affine", shape, "gpu_ops bilinear", ours, nbytes, B, note)
    record("warp_affine", shape, "gpu_ops nearest",
           lambda: gpu_ops.warp_affine(x, M, (H, W), interpolation="nearest"), nbytes, B)
    record("warp_affine", shape, "eager affine_grid+grid_sample (float)", eager, nbytes, B)
    record("warp_affine", shape, "torch.compile(affine_grid+grid_sample)", compiled(eager), nbytes, B)
    if TF2 is not None:
        record("warp_affine", shape, "torchvision v2 affine (ONE matrix/batch)",
               lambda: TF2.affine(x, angle=20.0, translate=[5.0, 5.0], scale=1.1, shear=[0.0, 0.0],
                                  interpolation=T2.InterpolationMode.BILINEAR), nbytes, B, "not per-sample")


def bench_resize():
    B, H, W = (16, 512, 512) if ARGS.quick else (64, 512, 512)
    for dtype in (torch.float32, torch.uint8):
        es = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 1
        x = (torch.rand(B, 3, H, W, device="cuda") if dtype == torch.float32
             else torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device="cuda"))
        for aa in (False, True):
            shape = f"{B}x3x{H}x{W} {str(dtype)[6:]} -> 224{' aa' if aa else ''}"
            nbytes = x.numel() * es + B * 3 * 224 * 224 * es
            record("resize", shape, "gpu_ops bilinear", lambda: gpu_ops.resize(x, 224, antialias=aa), nbytes, B)
            eager = lambda: F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False, antialias=aa)  # noqa: E731
            record("resize", shape, "eager F.interpolate", eager, nbytes, B)
            record("resize", shape, "torch.compile(F.interpolate)", compiled(eager), nbytes, B)
            if TF2 is not None:
                record("resize", shape, "torchvision v2 resize",
                       lambda: TF2.resize(x, [224, 224], antialias=aa), nbytes, B)
        if dtype == torch.float32:
            shape = f"{B}x3x{H}x{W} f32 -> 256 area"
            nbytes = x.numel() * es + B * 3 * 256 * 256 * es
            record("resize", shape, "gpu_ops area", lambda: gpu_ops.resize(x, 256, mode="area"), nbytes, B)
            record("resize", shape, "eager F.interpolate(area)",
                   lambda: F.interpolate(x, size=(256, 256), mode="area"), nbytes, B)


def bench_rcmn():
    B, H, W = (64, 375, 500) if ARGS.quick else (256, 375, 500)
    x = torch.randint(0, 256, (B, H, W, 3), dtype=torch.uint8, device="cuda")
    p = gpu_ops.RandomResizedCrop(224).generate_parameters(B, H, W, generator=torch.Generator().manual_seed(0),
                                                           device="cuda")
    boxes, flip = p.boxes, p.flip
    box_px = int((boxes[:, 2] * boxes[:, 3]).sum())
    shape = f"{B}x{H}x{W}x3 u8 -> 224 f32"
    nbytes = box_px * 3 + B * 3 * 224 * 224 * 4
    m = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    s = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    for aa in (False, True):
        record("resized_crop_mirror_normalize", shape, f"gpu_ops (antialias={aa})",
               lambda: gpu_ops.resized_crop_mirror_normalize(x, boxes, 224, MEAN, STD, flip=flip, antialias=aa),
               nbytes, B)
    record("resized_crop_mirror_normalize", shape.replace("f32", "f16"), "gpu_ops (antialias=False, fp16 out)",
           lambda: gpu_ops.resized_crop_mirror_normalize(x, boxes, 224, MEAN, STD, flip=flip, dtype=torch.float16),
           box_px * 3 + B * 3 * 224 * 224 * 2, B)
    # The call GPULoader's TrainPipeline makes: the decoded batch as one ragged buffer, bf16 out.
    rb = gpu_ops.RaggedBatch.from_list(list(x.unbind(0)))
    record("resized_crop_mirror_normalize", shape.replace("f32", "bf16"), "gpu_ops ragged (antialias=True, bf16 out)",
           lambda: gpu_ops.resized_crop_mirror_normalize(rb, boxes, 224, MEAN, STD, flip=flip, dtype=torch.bfloat16,
                                                         antialias=True),
           box_px * 3 + B * 3 * 224 * 224 * 2, B)
    # Batched eager equivalent (no antialias): boxes + flips as affine_grid thetas, grid_sample, normalize.
    bx = boxes.double().cpu()
    t_, l_, h_, w_ = bx.unbind(1)
    sgn = torch.where(flip.cpu(), -1.0, 1.0).double()
    theta = torch.zeros(B, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = sgn * w_ / W
    theta[:, 0, 2] = (2 * l_ + w_) / W - 1
    theta[:, 1, 1] = h_ / H
    theta[:, 1, 2] = (2 * t_ + h_) / H - 1
    theta = theta.float().cuda()

    def eager():
        grid = F.affine_grid(theta, [B, 3, 224, 224], align_corners=False)
        y = F.grid_sample(x.permute(0, 3, 1, 2).float(), grid, mode="bilinear", padding_mode="border",
                          align_corners=False)
        return y.sub(m).div(s)

    d = (gpu_ops.resized_crop_mirror_normalize(x, boxes, 224, MEAN, STD, flip=flip) - eager()).abs()
    record("resized_crop_mirror_normalize", shape, "eager affine_grid+grid_sample+normalize", eager, nbytes, B,
           f"mean|diff| vs ours {d.mean().item():.3f}")
    record("resized_crop_mirror_normalize", shape, "torch.compile(same chain)", compiled(eager), nbytes, B)
    if TF2 is not None:
        bl = boxes.tolist()
        fl = flip.tolist()

        def tv2_loop():
            outs = []
            for b in range(B):
                img = x[b].permute(2, 0, 1)
                t, l, h, w = bl[b]
                r = TF2.resized_crop(img, t, l, h, w, [224, 224], antialias=True)
                outs.append(TF2.horizontal_flip(r) if fl[b] else r)
            return TF2.normalize(torch.stack(outs).float(), MEAN, STD)

        record("resized_crop_mirror_normalize", shape, "torchvision v2 per-sample loop (aa)", tv2_loop, nbytes, B,
               "per-sample resized_crop, uint8", rep_ms=600)
        rrc = T2.RandomResizedCrop(224, antialias=True)
        record("resized_crop_mirror_normalize", shape, "torchvision v2 RandomResizedCrop on batch",
               lambda: TF2.normalize(TF2.horizontal_flip(rrc(x.permute(0, 3, 1, 2))).float(), MEAN, STD), nbytes, B,
               "ONE box/flip per batch")


def bench_color():
    B, H, W = (64, 224, 224) if ARGS.quick else (256, 224, 224)
    from gpu_ops import _reference as R

    for dtype in (torch.float32, torch.uint8):
        x = (torch.rand(B, 3, H, W, device="cuda") if dtype == torch.float32
             else torch.randint(0, 256, (B, 3, H, W), dtype=torch.uint8, device="cuda"))
        es = 4 if dtype == torch.float32 else 1
        p = gpu_ops.RandomColorJitter(0.4, 0.4, 0.4, 0.1).generate_parameters(
            B, generator=torch.Generator().manual_seed(0), device="cuda")
        shape = f"{B}x3x{H}x{W} {str(dtype)[6:]}"
        nbytes = 2 * x.numel() * es
        args = (p.brightness, p.contrast, p.saturation, p.hue)
        record("adjust_color (b+c+s+h)", shape, "gpu_ops (per-sample)",
               lambda: gpu_ops.adjust_color(x, brightness=p.brightness, contrast=p.contrast, saturation=p.saturation,
                                            hue=p.hue), nbytes, B)
        record("adjust_color (b+c+s+h)", shape, "eager per-sample torch chain",
               lambda: R.adjust_color(x, *args), nbytes, B)
        record("adjust_color (b+c+s+h)", shape, "torch.compile(per-sample chain)",
               compiled(lambda: R.adjust_color(x, *args)), nbytes, B)
        if TF2 is not None:
            def tv2():
                y = TF2.adjust_brightness(x, 1.2)
                y = TF2.adjust_contrast(y, 0.8)
                y = TF2.adjust_saturation(y, 1.3)
                return TF2.adjust_hue(y, 0.05)
            record("adjust_color (b+c+s+h)", shape, "torchvision v2 adjust_* (ONE factor set/batch)", tv2, nbytes, B,
                   "not per-sample")


def write_table(copy_gbps, out_dir):
    dev = torch.cuda.get_device_name()
    lines = [
        f"Device: {dev}; torch {torch.__version__}; measured device copy {copy_gbps:.0f} GB/s (read+write). "
        "Median of triton do_bench (L2 flushed). Effective GB/s = minimal bytes read + written / time.",
        "",
        "| op | input | implementation | ms | eff. GB/s | % copy BW | img/s | note |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in ROWS:
        pct = 100 * r["gbps"] / copy_gbps if r["gbps"] == r["gbps"] else float("nan")
        lines.append(f"| {r['op']} | {r['shape']} | {r['impl']} | {r['ms']:.3f} | {r['gbps']:.0f} | {pct:.0f}% "
                     f"| {r['img_s']:.0f} | {r['note']} |")
    text = "\n".join(lines) + "\n"
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "bench.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out_dir, "bench.json"), "w") as f:
            json.dump(dict(device=dev, torch=torch.__version__, copy_gbps=copy_gbps, rows=ROWS), f, indent=1)
    print(text)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--quick", action="store_true", help="smaller batches (smoke test)")
    ap.add_argument("--only", default="", help="comma list of cmn,warp,resize,rcmn,color")
    ARGS = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu_ops.py needs a CUDA GPU")
    print(f"gpu_ops extension loaded: {gpu_ops.EXTENSION_LOADED}; build {torch.ops.gpu_ops._build_info()}", flush=True)
    copy_gbps = copy_bandwidth()
    print(f"device copy: {copy_gbps:.0f} GB/s", flush=True)
    sections = dict(cmn=bench_cmn, warp=bench_warp, resize=bench_resize, rcmn=bench_rcmn, color=bench_color)
    only = [s for s in ARGS.only.split(",") if s] or list(sections)
    for name in only:
        t0 = time.time()
        try:
            sections[name]()
        except Exception:
            traceback.print_exc()
        print(f"[{name} took {time.time() - t0:.0f}s]", flush=True)
        write_table(copy_gbps, ARGS.out)  # after every section, so a timeout keeps what ran


if __name__ == "__main__":
    main()
