#!/usr/bin/env python
"""gpu_ops' CPU kernels: milliseconds per batch at 1 thread and at N threads, beside the same
operation in plain torch (the ``gpu_ops._reference`` formulas / torchvision's functional ops on CPU).

The kernels split rows over ``torch.get_num_threads()`` threads (``gpu_ops/csrc/cpu/parallel.h``);
this shows what that buys on this machine and where the pure-torch path stands.

Usage::

    python scripts/bench_cpu_kernels.py --threads 2 --batch 64
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpu_ops  # noqa: E402


def _time(fn, repeats: int) -> float:
    fn()  # warm-up (allocator, first-touch)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def cases(batch: int):
    """(name, gpu_ops call, torch baseline call) on 480x640 RGB uint8 NHWC images."""
    from torchvision.transforms.v2 import functional as TF

    g = torch.Generator().manual_seed(0)
    nhwc = torch.randint(0, 256, (batch, 480, 640, 3), dtype=torch.uint8, generator=g)
    nchw = nhwc.permute(0, 3, 1, 2).contiguous()
    mean, std = [123.7, 116.3, 103.5], [58.4, 57.1, 57.4]
    crop = torch.stack([torch.randint(0, 256, (batch,), generator=g), torch.randint(0, 416, (batch,), generator=g)], 1)
    flip = torch.rand(batch, generator=g) < 0.5
    boxes = torch.tensor([[40, 60, 300, 400]] * batch)
    theta = torch.tensor([[0.9, 0.1, 10.0], [-0.1, 0.9, 5.0]]).expand(batch, 2, 3).contiguous()
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)

    def torch_cmn():
        out = torch.empty(batch, 3, 224, 224)
        for b in range(batch):
            t, l = int(crop[b, 0]), int(crop[b, 1])
            x = nchw[b, :, t : t + 224, l : l + 224].float()
            out[b] = (x.flip(-1) if flip[b] else x).sub(m[0]).div(s[0])
        return out

    def torch_rcmn():
        x = nchw[:, :, 40:340, 60:460].float()
        x = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False,
                                            antialias=True)
        return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x).sub(m).div(s)

    return [
        ("crop_mirror_normalize 224", lambda: gpu_ops.crop_mirror_normalize(
            nhwc, mean=mean, std=std, size=(224, 224), crop=crop, flip=flip), torch_cmn),
        ("resized_crop_mirror_normalize 300x400->224, antialias", lambda: gpu_ops.resized_crop_mirror_normalize(
            nhwc, boxes, (224, 224), mean, std, flip=flip, antialias=True), torch_rcmn),
        ("resize 480x640->224x224 bilinear", lambda: gpu_ops.resize(nchw, (224, 224)),
         lambda: torch.nn.functional.interpolate(nchw.float(), size=(224, 224), mode="bilinear",
                                                 align_corners=False).round().to(torch.uint8)),
        ("warp_affine 480x640 bilinear", lambda: gpu_ops.warp_affine(nchw, theta, (480, 640)),
         lambda: TF.affine(nchw, angle=6.0, translate=[10, 5], scale=0.9, shear=[0.0, 0.0])),
        ("adjust_color (b, c, s, h)", lambda: gpu_ops.adjust_color(nchw, brightness=1.1, contrast=0.9,
                                                                   saturation=1.2, hue=0.05),
         lambda: TF.adjust_hue(TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(
             nchw, 1.1), 0.9), 1.2), 0.05)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    rows = []
    for name, ours, base in cases(args.batch):
        r = {"op": name}
        for n in (1, args.threads):
            torch.set_num_threads(n)
            r[f"ours{n}"] = _time(ours, args.repeats)
            r[f"torch{n}"] = _time(base, args.repeats)
        rows.append(r)
        print(f"{name}: {r}", file=sys.stderr)
    n = args.threads
    print(f"CPU kernels, batch {args.batch} of 480x640 RGB uint8, {os.cpu_count()} CPUs, torch {torch.__version__}; "
          f"ms per batch, median of {args.repeats}\n")
    print(f"| op | gpu_ops 1 thread | gpu_ops {n} threads | speed-up | torch 1 thread | torch {n} threads | "
          f"gpu_ops / torch at {n} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['op']} | {r['ours1']:.1f} | {r[f'ours{n}']:.1f} | {r['ours1'] / r[f'ours{n}']:.2f}x | "
              f"{r['torch1']:.1f} | {r[f'torch{n}']:.1f} | {r[f'torch{n}'] / r[f'ours{n}']:.2f}x faster |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
