"""Makes the two image sets of scripts/bench_pipeline.py from real photographs, and their stores.

    python3 scripts/get_bench_images.sh .bench/photos          # the photographs (Debian + PyPI)
    python3 scripts/make_bench_sets.py .bench/photos .bench/sets

Writes DEST/hd/ (1920x1080 JPEGs) and DEST/small/ (~500 px JPEGs, mixed aspect ratios), each in 10
class folders, cut from the photographs at seeded random windows (Lanczos-resampled, quality 90,
4:2:0), and packs each into an LMDB store DEST/<set>.lmdb. The stores hold the files byte for byte,
so the benchmark can re-create the folders from them on a machine that only gets the stores.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from PIL import Image

SMALL_SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (480, 480), (500, 400), (440, 500)]


def photos(src: Path):
    out = []
    for p in sorted(src.rglob("*")):
        if p.suffix.lower() in (".jpg", ".jpeg", ".png"):
            im = Image.open(p).convert("RGB")
            if min(im.size) >= 300:
                out.append(im)
    return out


def cut(im: Image.Image, w: int, h: int, rng: random.Random) -> Image.Image:
    """A random window of im with aspect w:h covering 50-100% of the largest such window."""
    W, H = im.size
    scale = min(W / w, H / h) * rng.uniform(0.5, 1.0)
    cw, ch = int(w * scale), int(h * scale)
    x, y = rng.randint(0, W - cw), rng.randint(0, H - ch)
    out = im.crop((x, y, x + cw, y + ch)).resize((w, h), Image.LANCZOS)
    return out.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--hd", type=int, default=80, help="number of 1920x1080 images")
    ap.add_argument("--small", type=int, default=480, help="number of ~500 px images")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--no-store", action="store_true")
    a = ap.parse_args(argv)
    ims = photos(a.photos)
    if not ims:
        print(f"no photographs under {a.photos}", file=sys.stderr)
        return 1
    rng = random.Random(0)
    for name, n, sizes in (("hd", a.hd, [(1920, 1080)]), ("small", a.small, SMALL_SIZES)):
        folder = a.dest / name
        for i in range(n):
            w, h = sizes[i % len(sizes)]
            d = folder / f"c{i % 10}"
            d.mkdir(parents=True, exist_ok=True)
            cut(ims[i % len(ims)], w, h, rng).save(d / f"{name}_{i:04d}.jpg", quality=a.quality, subsampling=2)
        if not a.no_store:
            import packer

            rep = packer.build(folder, None, str(a.dest / f"{name}.lmdb"), "lmdb", workers=2, overwrite=True)
            print(f"{name}: {rep.records} records -> {a.dest / (name + '.lmdb')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
