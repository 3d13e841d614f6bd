"""Probe of nvImageCodec's decode backends on one bench set (run on a GPU): which backends can be
created, how fast each decodes a batch of 256, how much CPU it takes, whether ROI and gray work.

    python3 scripts/probe_nvimgcodec.py [SET]      # SET: hd (default) or small, from .bench/sets

The numbers behind readers/gpu/nvimgcodec.py's choices (docs/benchmarks/vs_dali.md, call 2).
"""
import io
import os
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nvidia import nvimgcodec as n  # noqa: E402

from packer.stores import open_store  # noqa: E402
from readers.gpu import read_raw  # noqa: E402

B, K = n.Backend, n.BackendKind
P = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB, sample_format=n.SampleFormat.I_RGB)
CONFIGS = {
    "default": None, "hw_only": [B(K.HW_GPU_ONLY)], "gpu_only": [B(K.GPU_ONLY)], "hybrid": [B(K.HYBRID_CPU_GPU)],
    "hw.65+gpu": [B(K.HW_GPU_ONLY, load_hint=0.65), B(K.GPU_ONLY)],
    "hw.65+gpu+cpu": [B(K.HW_GPU_ONLY, load_hint=0.65), B(K.GPU_ONLY), B(K.CPU_ONLY)],
    "hw1+gpu+cpu": [B(K.HW_GPU_ONLY, load_hint=1.0), B(K.GPU_ONLY), B(K.CPU_ONLY)],
    "hw.65adapt+gpu": [B(K.HW_GPU_ONLY, load_hint=0.65, load_hint_policy=n.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME),
                       B(K.GPU_ONLY)],
    "hw.65+hybrid": [B(K.HW_GPU_ONLY, load_hint=0.65), B(K.HYBRID_CPU_GPU)],
}

for name in sys.argv[1:] or ["hd"]:
    with open_store(f".bench/sets/{name}.lmdb") as r:
        raw = read_raw(r, list(range(r.metadata.count)), check=False)
    batch = ([d.clone().numpy() for d in raw.datas()] * 4)[:256]
    for cname, be in CONFIGS.items():
        try:
            dec = (n.Decoder(max_num_cpu_threads=12, backends=be) if be is not None
                   else n.Decoder(max_num_cpu_threads=12))
            for mode in ("np", "bytes"):
                make = (lambda a: n.CodeStream(a)) if mode == "np" else (lambda a: n.CodeStream(a.tobytes()))
                dec.decode([make(a) for a in batch[:32]], params=P)
                torch.cuda.synchronize()
                t, c = time.perf_counter(), time.process_time()
                for _ in range(4):
                    out = dec.decode([make(a) for a in batch], params=P)
                torch.cuda.synchronize()
                w = time.perf_counter() - t
                print(f"{name} {cname:16s} {mode:5s} {4 * 256 / w:8.0f} img/s cpu {(time.process_time() - c) / w:5.1f} "
                      f"none={sum(o is None for o in out)}", flush=True)
        except RuntimeError as e:
            print(name, cname, "ERR", type(e).__name__, e, flush=True)
    dec = n.Decoder(max_num_cpu_threads=12, backends=[B(K.HW_GPU_ONLY)])
    out = dec.decode([n.CodeStream(a).get_sub_code_stream(region=n.Region(10, 10, 200, 200)) for a in batch[:64]],
                     params=P)
    print(name, "hw_only ROI none=", sum(o is None for o in out), out[0].shape if out[0] is not None else None)

buf = io.BytesIO()
Image.fromarray((np.arange(64 * 48) % 251).astype(np.uint8).reshape(48, 64)).save(buf, "JPEG")
for cname, be in (("hw", [B(K.HW_GPU_ONLY)]), ("hybrid", [B(K.HYBRID_CPU_GPU)]), ("cpu", [B(K.CPU_ONLY)])):
    try:
        img = n.Decoder(backends=be).decode(n.CodeStream(buf.getvalue()), params=P)
    except RuntimeError as e:
        print("gray", cname, "ERR", e)
        continue
    if img is None:
        print("gray", cname, None)
        continue
    t = torch.from_dlpack(img)
    print("gray", cname, tuple(t.shape), t.stride(), t[0, :4].tolist(), t[-1, -4:].tolist())
