"""packer's native engine alone, full decode of one bench set: where a batch's time goes (run on a GPU).

    python3 scripts/bench_engine.py --store .bench/sets/hd.lmdb --threads 12,16 --out OUT \
        [--shares=-1,0,1] [--variants "as shipped;PACKER_ENGINE_POOL_NICE=0"] [--batches 120] [--repeat 1]

Each (variant, hardware share, threads) row runs in a process of its own (a variant is a set of
``NAME=VALUE`` settings put in that process's environment, ``as shipped`` none), pass by pass:
every variant's rows in each pass, so a machine that drifts during the run moves them alike. On the bytes in
memory with two batches in flight (``submit`` the next, then ``collect`` this one), as the loader
and ``bench_vs_dali.py``'s ``native_decode`` rows do. Per row:

* images/s and CPU cores used (process CPU time / wall time);
* the hardware share the balancer ended at;
* the hardware JPEG engine's use while the row ran (``jpg`` of ``nvidia-smi dmon``, mean of its
  1 s samples, where the driver reports it);
* where the pool's threads and the hardware lanes' threads are (``where_counts``, sampled
  every ~1 ms): share of their time in each nvJPEG call or wait;
* from the engine's own trace (``PACKER_ENGINE_TRACE=1``, its stderr timestamped per stage):
  the share of the row's time the hardware lane's call was running (``hw duty``) and the threads
  were decoding (``threads duty``), and per batch the median milliseconds of the hardware call,
  the threads' part, the hardware lane's idle time between its calls (``hw gap``) and the
  threads' idle time between their parts (``threads gap``). The trace costs a little itself:
  rows with ``--trace`` are for where the time goes, the images/s of rows without it for speed.

The ceiling issue 48 names, the hardware engine alone (share 1) plus the threads alone (share 0),
is printed beside each balanced row where both were run. Writes OUT/bench_engine.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHIPPED = "as shipped"


def _child(a) -> int:
    """One row, in this process: prints its JSON line last."""
    import torch
    from bench_common import Timer
    from bench_vs_dali import batches_of, load_set, two_in_flight

    from readers.gpu.engine import EngineDecoder

    datas, _, _ = load_set(a.store)
    plan = batches_of(len(datas), a.batches * a.batch, a.batch, seed=1)
    work = [[datas[i] for i in b] for b in plan]
    dec = EngineDecoder("cuda", threads=a.child_threads, hardware_share=a.child_share)
    for ds in work[:4]:  # warm-up: nvJPEG's buffers grown, the balancer past its start
        dec.decode_ragged(ds)
    torch.cuda.synchronize()
    dmon = _dmon_start()
    sampler = _Sampler(dec._engine)
    print("packer engine: %.3f timed run starts" % _trace_now(), file=sys.stderr, flush=True)
    with Timer() as t, sampler:
        n = two_in_flight(dec, work)
    print("packer engine: %.3f timed run ends" % _trace_now(), file=sys.stderr, flush=True)
    row = {"img_s": round(n / t.wall, 1), "cpu_cores": round(t.cpu / t.wall, 2), "images": n,
           "share_end": round(dec.hardware_share, 3), "hardware": dec.hardware,
           "by_hardware": dec.stats["hardware"], "by_threads": dec.stats["threads"],
           "jpg_util": _dmon_stop(dmon), "where": sampler.shares(dec.threads)}
    dec.close()
    print(json.dumps(row), flush=True)
    return 0


#: The engine's Where (gpu_ops/csrc/engine/common.h), in its order.
WHERE = ("idle", "header", "wait_pinned", "parse", "decode_host", "transfer", "decode_device", "wait_output",
         "hw_init", "hw_decode")


class _Sampler:
    """Every ~1 ms during a ``with`` block: how many of the engine's pool threads and hardware
    lanes' threads are in each Where (``where_counts``)."""

    def __init__(self, engine, period_s: float = 0.001):
        import threading

        self.engine, self.period = engine, period_s
        self.sums = [0] * (2 * len(WHERE))
        self.n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.period):
            c = self.engine.where_counts()
            if len(c) != len(self.sums):
                return  # another engine build: its Where does not match WHERE
            self.sums = [a + b for a, b in zip(self.sums, c)]
            self.n += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def shares(self, threads: int) -> dict:
        """Per Where: the pool's thread-time share (``pool.X``) and the busiest lane's time share
        (``lane.X``, the lanes' counts summed)."""
        if not self.n:
            return {}
        k = len(WHERE)
        out = {f"pool.{w}": round(self.sums[i] / (self.n * threads), 3) for i, w in enumerate(WHERE) if self.sums[i]}
        out.update({f"lane.{w}": round(self.sums[k + i] / self.n, 3) for i, w in enumerate(WHERE)
                    if self.sums[k + i] and w != "idle"})
        return out


def _trace_now() -> float:
    """The engine trace's clock (steady, ms): CLOCK_MONOTONIC as std::chrono::steady_clock on Linux."""
    return time.clock_gettime(time.CLOCK_MONOTONIC) * 1000.0


def _dmon_start():
    try:
        return subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-i", str(_gpu_index())],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _gpu_index() -> int:
    import torch

    return torch.cuda.current_device()


def _dmon_stop(p):
    """Mean of dmon's ``jpg`` column over the samples taken, or None where it has none."""
    if p is None:
        return None
    p.terminate()
    out, _ = p.communicate(timeout=10)
    cols, vals = None, []
    for line in out.splitlines():
        if line.startswith("#"):
            if "gpu" in line and cols is None:
                cols = line.lstrip("#").split()
            continue
        f = line.split()
        if cols and "jpg" in cols and len(f) == len(cols):
            try:
                vals.append(float(f[cols.index("jpg")]))
            except ValueError:
                pass
    return round(statistics.mean(vals), 1) if vals else None


_TRACE = re.compile(r"^packer engine: ([0-9.]+) (.*)$")


def trace_summary(lines) -> dict:
    """Where a row's time went, from the engine's trace lines (see the module doc)."""
    ev = []
    for line in lines:
        m = _TRACE.match(line.strip())
        if m:
            ev.append((float(m.group(1)), m.group(2)))
    start = next((t for t, s in ev if s == "timed run starts"), None)
    end = next((t for t, s in ev if s == "timed run ends"), None)
    if start is None or end is None or end <= start:
        return {}
    ev = [(t, s) for t, s in ev if start <= t <= end]
    hw_calls, hw_gaps, th_parts, th_gaps = [], [], [], []
    hw_open = th_open = None
    hw_last = th_last = None
    for t, s in ev:
        if s.startswith("hardware lane: initialized") and hw_open is None:  # (a steal's call goes on)
            hw_open = t
            if hw_last is not None:
                hw_gaps.append(t - hw_last)
        elif s.startswith("hardware batch done") and hw_open is not None:
            hw_calls.append(t - hw_open)
            hw_last, hw_open = t, None
        elif s.startswith("threads: "):
            th_open = t
            if th_last is not None:
                th_gaps.append(t - th_last)
        elif s == "threads done" and th_open is not None:
            th_parts.append(t - th_open)
            th_last, th_open = t, None
    span = end - start

    def med(v):
        return round(statistics.median(v), 2) if v else None

    return {"hw_duty": round(sum(hw_calls) / span, 3), "threads_duty": round(sum(th_parts) / span, 3),
            "hw_call_ms": med(hw_calls), "threads_ms": med(th_parts), "hw_gap_ms": med(hw_gaps),
            "threads_gap_ms": med(th_gaps), "batches": len(th_parts) or len(hw_calls)}


def _run_row(a, variant: str, share: float, T: int, trace: bool) -> dict:
    env = dict(os.environ)
    for word in ([] if variant == SHIPPED else variant.split()):
        k, _, v = word.partition("=")
        env[k] = v
    if trace:
        env["PACKER_ENGINE_TRACE"] = "1"
    cmd = [sys.executable, __file__, "--child", "--store", str(a.store), "--batches", str(a.batches),
           "--batch", str(a.batch), "--child-threads", str(T), "--child-share", str(share)]
    row = {"variant": variant, "share": share, "threads": T, "trace": trace}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.row_timeout)
    except subprocess.TimeoutExpired:
        row["error"] = f"did not finish in {a.row_timeout} s"
        return row
    last = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else []
    try:
        row.update(json.loads(last[0]))
    except (IndexError, json.JSONDecodeError):
        row["error"] = f"rc={p.returncode}: {p.stderr.strip()[-600:]}"
        return row
    if trace:
        row.update(trace_summary(p.stderr.splitlines()))
    return row


def _report(a, env, rows) -> str:
    lines = [f"{env['gpu']}, torch {env['torch']}, Python {env['python']}, {env['cpus']} CPUs, "
             f"set {a.store}, batch {a.batch}, {a.batches} timed batches a row", "",
             "| variant | threads | share | trace | img/s | cores | share at end | jpg % | hw duty | threads duty "
             "| hw call ms | threads ms | hw gap ms | threads gap ms | ceiling (hw alone + threads alone) "
             "| of ceiling |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def alone(variant, T, share):
        v = [r["img_s"] for r in rows if r.get("img_s") and r["variant"] == variant and r["threads"] == T
             and r["share"] == share and not r["trace"]]
        return statistics.median(v) if v else None

    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['threads']} | {r['share']:g} | {'yes' if r['trace'] else ''} | error: "
                         f"{r['error'][:200]} |" + " |" * 11)
            continue
        ceil = frac = ""
        hw, th = alone(r["variant"], r["threads"], 1.0), alone(r["variant"], r["threads"], 0.0)
        if r["share"] < 0 and hw and th:
            ceil, frac = f"{hw + th:,.0f} ({hw:,.0f} + {th:,.0f})", f"{r['img_s'] / (hw + th):.2f}"

        def c(k):
            v = r.get(k)
            return "" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

        lines.append(f"| {r['variant']} | {r['threads']} | {r['share']:g} | {'yes' if r['trace'] else ''} | "
                     f"{r['img_s']:,.0f} | {r['cpu_cores']} | {r['share_end']} | {c('jpg_util')} | {c('hw_duty')} | "
                     f"{c('threads_duty')} | {c('hw_call_ms')} | {c('threads_ms')} | {c('hw_gap_ms')} | "
                     f"{c('threads_gap_ms')} | {ceil} | {frac} |")
    lines += ["", "Where the pool's threads spent the row (share of thread-time) and the hardware lanes' threads "
              "(share of the row's time, lanes summed), sampled every ~1 ms:", ""]
    for r in rows:
        if r.get("where"):
            lines.append(f"- {r['variant']}, {r['threads']} threads, share {r['share']:g}"
                         f"{', traced' if r['trace'] else ''}: "
                         + ", ".join(f"{k} {v:g}" for k, v in sorted(r["where"].items(), key=lambda kv: -kv[1])))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, default=Path(".bench/sets/hd.lmdb"))
    ap.add_argument("--threads", default="12,16")
    ap.add_argument("--shares", default="-1,0,1", help="hardware shares (-1: balanced)")
    ap.add_argument("--variants", default=SHIPPED, help="';'-separated sets of NAME=VALUE settings "
                    f"('{SHIPPED}': none)")
    ap.add_argument("--batches", type=int, default=120, help="timed batches a row")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=1, help="runs of every row (untraced)")
    ap.add_argument("--trace", action="store_true", help="also one traced run of every balanced row")
    ap.add_argument("--row-timeout", type=float, default=180.0)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-threads", type=int, default=12, help=argparse.SUPPRESS)
    ap.add_argument("--child-share", type=float, default=-1.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a)
    import torch

    if not torch.cuda.is_available():
        print("bench_engine: no CUDA device here", file=sys.stderr)
        return 2
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "cpus": os.cpu_count()}
    print(json.dumps(env), flush=True)
    rows = []
    a.out.mkdir(parents=True, exist_ok=True)
    variants = [v.strip() for v in a.variants.split(";") if v.strip()]
    threads = [int(x) for x in a.threads.split(",")]
    shares = [float(x) for x in a.shares.split(",")]
    # Pass by pass, every variant in each (not all of one variant's runs, then the next's): a
    # machine that drifts during the run moves every variant alike.
    passes = [False] * a.repeat + ([True] if a.trace else [])
    for trace in passes:
        for variant in variants:
            for T in threads:
                for share in shares:
                    if trace and share >= 0:
                        continue
                    r = _run_row(a, variant, share, T, trace)
                    print(json.dumps(r), flush=True)
                    rows.append(r)
                    (a.out / "bench_engine.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    keys = [(v, T, sh) for v in variants for T in threads for sh in shares]
    order = {k: i for i, k in enumerate(keys)}
    rows.sort(key=lambda r: (order[(r["variant"], r["threads"], r["share"])], r["trace"]))
    md = _report(a, env, rows)
    (a.out / "bench_engine.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
