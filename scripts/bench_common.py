"""CPU-time accounting and CPU lists shared by the benchmark scripts (bench_pipeline.py,
bench_vs_dali.py, bench_train_gpu.py, gpu_check.sh's remote stage).

Imported as a sibling module: those scripts are run as ``python3 scripts/bench_x.py``, so
``scripts/`` is ``sys.path[0]``.
"""
from __future__ import annotations

import os
import resource
import time


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
    import torch  # here, not at the top: the CPU-list helpers are used where torch is not wanted

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


def cpu_list(text: str) -> set:
    """The CPUs a Linux CPU list names (``"0-15,32-47"``, as sysfs and ``taskset -c`` write them)."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_ranges(cpus) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` (the form :func:`cpu_list` reads)."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def split_cpus(cpus) -> tuple:
    """``(readers, server, n_readers)``: the last quarter of ``cpus`` (at least one) for an S3
    server, the rest for the readers, as CPU lists (``"-"`` for none)."""
    cpus = sorted(cpus)
    k = max(1, len(cpus) // 4)
    return cpu_ranges(cpus[:-k]) or "-", cpu_ranges(cpus[-k:]), len(cpus) - k
