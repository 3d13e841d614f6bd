"""Generate small, deterministic sample datasets (used by scripts/make_sample.py and the tests).

Images are smooth colour fields with shapes and mild noise, so JPEG behaves as it does on
photographs (not flat colours, not pure noise). Nothing is downloaded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def synthetic_image(rng: np.random.Generator, height: int, width: int, gray: bool = False) -> np.ndarray:
    """An HxWx3 (or HxWx1) uint8 image: gradient + a few ellipses/rectangles + noise."""
    import cv2

    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([
        (xx / max(width - 1, 1)) * rng.uniform(80, 255),
        (yy / max(height - 1, 1)) * rng.uniform(80, 255),
        ((xx + yy) / max(width + height - 2, 1)) * rng.uniform(80, 255),
    ], axis=-1)
    img = base.astype(np.uint8).copy()
    for _ in range(int(rng.integers(2, 6))):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        cx, cy = int(rng.integers(0, width)), int(rng.integers(0, height))
        if rng.random() < 0.5:
            axes = (int(rng.integers(1, max(2, width // 3))), int(rng.integers(1, max(2, height // 3))))
            cv2.ellipse(img, (cx, cy), axes, float(rng.uniform(0, 180)), 0, 360, colour, -1)
        else:
            cv2.rectangle(img, (cx, cy), (cx + int(rng.integers(1, max(2, width // 2))),
                                          cy + int(rng.integers(1, max(2, height // 2)))), colour, -1)
    noise = rng.normal(0, 6, img.shape)
    img = np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    img = cv2.GaussianBlur(img, (3, 3), 0) if min(height, width) >= 3 else img
    if gray:
        return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)[:, :, None]
    return img


def encode_jpeg(img: np.ndarray, quality: int = 90, progressive: bool = False) -> bytes:
    """JPEG bytes of an RGB (or gray HxWx1) array, via OpenCV."""
    import cv2

    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    if progressive:
        params += [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    arr = img[:, :, 0] if img.shape[2] == 1 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", arr, params)
    if not ok:
        raise RuntimeError("OpenCV failed to encode a JPEG")
    return buf.tobytes()


def make_dataset(root, n: int = 24, *, kind: str = "boxes", sizes=((375, 500), (240, 320), (97, 131)),
                 classes=("cat", "dog", "bird"), seed: int = 0) -> tuple[Path, Path | None]:
    """Write a small dataset under ``root`` and return (IMAGES, LABELS or None).

    Args:
        kind: ``"boxes"`` (images/ + labels/ with YOLO .txt rows), ``"classes"`` (one folder per
            class, no LABELS) or ``"csv"`` (flat images/ + labels.csv with class names).
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    images = root / "images"
    labels = None
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        img = synthetic_image(rng, h, w, gray=(i % 11 == 5))
        cls = int(rng.integers(0, len(classes)))
        if kind == "classes":
            path = images / classes[cls] / f"img_{i:05d}.jpg"
        else:
            path = images / f"part{i % 2}" / f"img_{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_jpeg(img, quality=90, progressive=(i % 7 == 3)))
        if kind == "boxes":
            labels = root / "labels"
            lp = labels / path.relative_to(images).with_suffix(".txt")
            lp.parent.mkdir(parents=True, exist_ok=True)
            rows = []
            for _ in range(int(rng.integers(0, 4))):
                bw, bh = rng.uniform(0.05, 0.5, 2)
                cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
                rows.append(f"{int(rng.integers(0, len(classes)))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
            lp.write_text("\n".join(rows) + ("\n" if rows else ""))
        elif kind == "csv":
            labels = root / "labels.csv"
            with open(labels, "a") as fh:
                if i == 0:
                    fh.write("path,label\n")
                fh.write(f"{path.relative_to(images).as_posix()},{classes[cls]}\n")
    return images, labels
