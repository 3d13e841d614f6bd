"""How fast libjpeg-turbo itself decodes a set of JPEGs on this machine: the ceiling of every CPU
loader built on it (packer's, FFCV's, the DataLoader + PIL kind), beside packer's batch op.

    python3 scripts/bench_jpeg_ceiling.py [--images DIR] [--size 500x375] [--threads 1,2] [--rounds 40]

Rows, each over the same distinct images (one decode per image per round, full size, RGB, exact
IDCT unless ``--fast-dct``), img/s and ms per image (wall):

* ``turbojpeg-loop``: libjpeg-turbo's TurboJPEG API called straight (ctypes: one call per image,
  the GIL released), one decompressor per thread reused for every image, into one output buffer
  per thread reused for every image: nothing but the decode. The threads split the images.
* ``packer-op``: ``gpu_ops.decode_jpeg_crops`` with full-size boxes into one ``[B, H, W, 3]``
  batch (what ``FullDecode`` runs), on the same number of threads.
* ``simplejpeg`` (where it imports; it bundles libjpeg-turbo 3.x): one thread, a new array per
  image, to see whether a newer libjpeg-turbo moves the ceiling.

The images: ``--images`` (default ``.bench/sets/small``, scripts/make_bench_sets.py), those of
``--size``. Writes nothing; prints a table.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import sys
import threading
import time
from pathlib import Path

TJPF_RGB = 0
TJFLAG_FASTDCT = 2048


def _turbojpeg():
    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    lib = ctypes.CDLL(name)
    lib.tjInitDecompress.restype = ctypes.c_void_p
    lib.tjDecompressHeader3.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong] + [
        ctypes.POINTER(ctypes.c_int)] * 4
    lib.tjDecompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    return lib


def turbojpeg_loop(datas, size, threads: int, rounds: int, fast: bool) -> float:
    """Seconds per image (wall) of the bare TurboJPEG loop on ``threads`` threads (every image
    ``size`` = (width, height): the output buffer holds one such image)."""
    lib = _turbojpeg()
    flags = TJFLAG_FASTDCT if fast else 0
    width, height = size
    errors = []

    def work(part):
        h = lib.tjInitDecompress()
        w, hh, ss, cs = (ctypes.c_int() for _ in range(4))
        buf = ctypes.create_string_buffer(width * height * 3)
        try:
            for _ in range(rounds):
                for d in part:
                    lib.tjDecompressHeader3(h, d, len(d), w, hh, ss, cs)
                    if (w.value, hh.value) != (width, height):
                        errors.append(f"an image of {w.value}x{hh.value}, not {width}x{height}")
                        return
                    if lib.tjDecompress2(h, d, len(d), buf, width, 0, height, TJPF_RGB, flags):
                        errors.append("tjDecompress2 failed")
                        return
        finally:
            lib.tjDestroy(h)

    parts = [datas[i::threads] for i in range(threads)]
    work(datas[:2])                                   # warm-up (library, pages)
    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return took / (rounds * len(datas))


def packer_op(datas, size, threads: int, rounds: int, fast: bool) -> float:
    import numpy as np
    import torch

    from gpu_ops.ops import decode_jpeg_crops

    w, h = size
    data = torch.frombuffer(bytearray(b"".join(datas)), dtype=torch.uint8)
    offsets = torch.tensor(np.cumsum([0] + [len(d) for d in datas]), dtype=torch.int64)
    boxes = torch.tensor([[0, 0, h, w]] * len(datas), dtype=torch.float32)
    flip = torch.zeros(len(datas), dtype=torch.bool)
    out = torch.empty(len(datas), h, w, 3, dtype=torch.uint8)
    errors = torch.zeros(len(datas), 64, dtype=torch.uint8)

    def call():
        decode_jpeg_crops(data, offsets, boxes, flip, out, errors, True, dct_scale=8, fast_dct=fast,
                          threads=threads)

    call()
    t0 = time.perf_counter()
    for _ in range(rounds):
        call()
    took = time.perf_counter() - t0
    if errors.any():
        raise RuntimeError("decode_jpeg_crops reported errors")
    return took / (rounds * len(datas))


def simplejpeg_row(datas, rounds: int, fast: bool):
    try:
        import simplejpeg
    except ImportError:
        return None
    for d in datas:
        simplejpeg.decode_jpeg(d, "RGB", fastdct=fast)
    t0 = time.perf_counter()
    for _ in range(rounds):
        for d in datas:
            simplejpeg.decode_jpeg(d, "RGB", fastdct=fast)
    return (time.perf_counter() - t0) / (rounds * len(datas)), simplejpeg.__version__


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=Path, default=Path(".bench/sets/small"))
    ap.add_argument("--size", default="500x375", help="WxH of the images used")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--fast-dct", action="store_true")
    a = ap.parse_args(argv)
    from PIL import Image

    size = tuple(int(x) for x in a.size.split("x"))
    files = [p for p in sorted(a.images.rglob("*.jp*g")) if Image.open(p).size == size]
    if not files:
        print(f"no {a.size} JPEGs under {a.images} (scripts/make_bench_sets.py makes them)", file=sys.stderr)
        return 2
    datas = [p.read_bytes() for p in files]
    print(f"{len(datas)} images of {a.size} from {a.images}, {a.rounds} rounds, "
          f"{'fast' if a.fast_dct else 'exact'} IDCT")
    print("| row | threads | ms/img (wall) | img/s |\n|---|---:|---:|---:|")
    for T in (int(t) for t in a.threads.split(",")):
        for row, fn in (("turbojpeg-loop", lambda: turbojpeg_loop(datas, size, T, a.rounds, a.fast_dct)),
                        ("packer-op", lambda: packer_op(datas, size, T, a.rounds, a.fast_dct))):
            s = fn()
            print(f"| {row} | {T} | {s * 1e3:.3f} | {1 / s:,.0f} |", flush=True)
    sj = simplejpeg_row(datas, a.rounds, a.fast_dct)
    if sj:
        print(f"| simplejpeg {sj[1]} (libjpeg-turbo 3.x) | 1 | {sj[0] * 1e3:.3f} | {1 / sj[0]:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
