#!/usr/bin/env python3
"""Follow one input through ``packer build`` (or one batch through ``GPULoader``) module by module.

    python scripts/module_walk.py build|gpu-batch [--show]

Records, with ``sys.setprofile``, every call in the calling thread from one project module
(``packer.*``, ``readers.*``, ``gpu_ops.*``) into another while the job runs (a step), and counts
the **re-entries**: steps into a module the walk had entered before and has since left entirely
(none of its functions still on the stack). Going down through the layers and back up costs
none; a flow that bounces between modules, or calls back into one it finished with, costs one
per bounce. The second figure leaves out utility calls (a re-entered module that returns
without calling another project module: a checksum, a redaction). ``--show`` prints the
walk. The figures compare one commit with another on this script; they are not absolutes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
ROOTS = ("packer", "readers", "gpu_ops")


def _project(frame):
    mod = frame.f_globals.get("__name__", "") if frame is not None else ""
    return mod if mod.split(".")[0] in ROOTS else None


def walk(fn) -> tuple:
    """Run ``fn``; the steps ``(module, caller module, re-entry)`` in order, the re-entries, and
    the re-entries into a module the flow passes through (it calls on into another)."""
    steps: list = []
    active: dict = {}
    seen: set = set()
    me = threading.get_ident()

    def prof(frame, event, arg):
        if threading.get_ident() != me or event not in ("call", "return"):
            return
        mod = _project(frame)
        if mod is None:
            return
        if event == "return":
            active[mod] = active.get(mod, 1) - 1
            return
        caller, f = None, frame.f_back
        while f is not None and caller is None:
            caller, f = _project(f), f.f_back
        if caller != mod:
            steps.append((mod, caller, mod in seen and not active.get(mod)))
            seen.add(mod)
        active[mod] = active.get(mod, 0) + 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    # a re-entry into a module that calls on into another (the flow passes through it), not a
    # utility call (a checksum, a redaction) that returns at once
    flow = sum(1 for k, (mod, _, again) in enumerate(steps)
               if again and k + 1 < len(steps) and steps[k + 1][1] == mod)
    return steps, sum(1 for s in steps if s[2]), flow


def job_build(tmp: str):
    import packer
    from packer.sample import make_dataset

    images, labels = make_dataset(os.path.join(tmp, "d"), 1, kind="classes", seed=1)
    packer.build(images, labels, os.path.join(tmp, "warm.lmdb"), workers=1)     # imports outside the walk
    return lambda: packer.build(images, labels, os.path.join(tmp, "out.lmdb"), workers=1)


def job_gpu_batch(tmp: str):
    import torch

    import packer
    from packer.sample import make_dataset
    from readers.gpu import GPULoader, TrainPipeline

    images, labels = make_dataset(os.path.join(tmp, "d"), 8, kind="classes", seed=1)
    store = os.path.join(tmp, "s.lmdb")
    packer.build(images, labels, store, workers=1)
    kw = {"device": "cuda"} if torch.cuda.is_available() else {"device": "cpu", "decoder": "turbojpeg"}

    def one():
        with GPULoader(store, TrainPipeline(32), batch_size=8, threads=0, **kw) as loader:
            next(iter(loader))
    one()
    return one


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", choices=["build", "gpu-batch"])
    ap.add_argument("--show", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fn = (job_build if args.job == "build" else job_gpu_batch)(tmp)
        steps, again, flow = walk(fn)
    if args.show:
        print("\n".join(f"{caller or '-'} -> {mod}{'   <- again' if a else ''}" for mod, caller, a in steps))
    modules = {s[0] for s in steps}
    print(f"{args.job}: {len(steps)} steps between modules, {len(modules)} modules, {again} re-entries, "
          f"{flow} of them into a module the flow passes through")
    return 0


if __name__ == "__main__":
    sys.exit(main())
