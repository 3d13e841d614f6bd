"""JPEGs of each coding and subsampling the GPU decoders route (baseline / progressive; 4:2:0,
4:2:2, 4:4:4, gray), made with Pillow from smooth photo-like images, and a store of them: what the
nvImageCodec routing tests and the native engine tests (and scripts/probe_engine.py) share."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

import packer


def photo(seed: int, h: int = 120, w: int = 160) -> np.ndarray:
    """A smooth RGB image with some texture (JPEG-friendly, like a photo)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (9 + seed) + c) * np.cos(y / 13) for c in range(3)], axis=2)
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)


def jpeg(img: np.ndarray, *, subsampling: int = 2, progressive: bool = False, gray: bool = False) -> bytes:
    """PIL JPEG; subsampling 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0."""
    im = Image.fromarray(img).convert("L") if gray else Image.fromarray(img)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return buf.getvalue()


KINDS = {  # file name -> (bytes maker, expected coding, expected subsampling)
    "base420.jpg": (lambda i: jpeg(photo(i)), "baseline", "420"),
    "base422.jpg": (lambda i: jpeg(photo(i), subsampling=1), "baseline", "422"),
    "base444.jpg": (lambda i: jpeg(photo(i), subsampling=0), "baseline", "444"),
    "prog420.jpg": (lambda i: jpeg(photo(i), progressive=True), "progressive", "420"),
    "gray.jpg": (lambda i: jpeg(photo(i), gray=True), "baseline", "gray"),
}


def cmyk_jpeg() -> bytes:
    """A CMYK JPEG (Pillow): no GPU decoder takes it, the engine hands it to libjpeg-turbo."""
    buf = io.BytesIO()
    Image.fromarray(photo(7, 64, 80)).convert("CMYK").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def kinds_store_at(d) -> str:
    """An LMDB store in ``d`` of three images of every JPEG kind of KINDS (test_gpu_engine.py;
    scripts/probe_engine.py uses it too)."""
    for n, (name, (make, _, _)) in enumerate(KINDS.items()):
        for k in range(3):
            p = d / "img" / f"c{n % 2}" / f"{k}_{name}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(make(n + 10 * k))
    loc = str(d / "s.lmdb")
    assert packer.build(d / "img", None, loc, "lmdb", workers=1).ok
    return loc
