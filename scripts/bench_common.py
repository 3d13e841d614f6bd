"""CPU-time accounting shared by the GPU benchmark scripts (bench_pipeline.py, bench_vs_dali.py).

Imported as a sibling module: those scripts are run as ``python3 scripts/bench_x.py``, so
``scripts/`` is ``sys.path[0]``.
"""
from __future__ import annotations

import os
import resource
import time

import torch


def _live_children_cpu() -> float:
    """CPU seconds of this process's living children (persistent DataLoader workers), from /proc."""
    total, me, tick = 0.0, os.getpid(), os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def cpu_seconds() -> float:
    """This process (all its threads) + its children, finished and living (CPU seconds)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + _live_children_cpu()


def _sync() -> None:
    """Waits for the GPU, where there is one."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Timer:
    """Wall and CPU seconds of a ``with`` block, the GPU synchronized at both ends.

    Example::

        with Timer() as t:
            run()
        print(t.wall, t.cpu / t.wall)  # seconds, CPU cores used
    """

    def __enter__(self):
        _sync()
        self.t, self.c = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        _sync()
        self.wall = time.perf_counter() - self.t
        self.cpu = cpu_seconds() - self.c
