"""scripts/bench_engine.py without a GPU: where a row's time went, read from the engine's trace
(the hardware lane's calls and gaps, the threads' parts and gaps, within the timed run only), and
the table's ceiling (the hardware engine alone plus the threads alone, untraced rows)."""
import sys

import pytest

from tests import REPO

sys.path.insert(0, str(REPO / "scripts"))
bench = pytest.importorskip("bench_engine")

TRACE = """\
packer engine: 90.000 threads: 80 images
packer engine: 100.000 timed run starts
packer engine: 101.000 threads: 80 images
packer engine: 101.500 hardware lane: initialized for 176 images
packer engine: 130.000 threads done
packer engine: 131.000 hardware batch done (lane 0)
packer engine: 132.500 hardware lane: initialized for 170 images
packer engine: 133.000 threads: 80 images
packer engine: 160.000 threads done
packer engine: 162.000 hardware batch done (lane 0)
packer engine: 170.000 timed run ends
packer engine: 171.000 threads: 80 images
some other line on stderr
"""


def test_the_trace_says_where_a_rows_time_went():
    s = bench.trace_summary(TRACE.splitlines())
    assert s["batches"] == 2
    assert s["hw_call_ms"] == pytest.approx(29.5) and s["threads_ms"] == pytest.approx(28.0)
    assert s["hw_gap_ms"] == pytest.approx(1.5) and s["threads_gap_ms"] == pytest.approx(3.0)
    assert s["hw_duty"] == pytest.approx(59 / 70, abs=1e-3) and s["threads_duty"] == pytest.approx(56 / 70, abs=1e-3)


def test_a_trace_without_the_timed_runs_marks_says_nothing():
    assert bench.trace_summary([line for line in TRACE.splitlines() if "timed run" not in line]) == {}


def test_the_table_prints_the_ceiling_from_untraced_rows():
    a = type("A", (), {"store": "hd.lmdb", "batch": 256, "batches": 80})()
    env = {"gpu": "H200", "torch": "2", "python": "3.12", "cpus": 16}
    rows = [{"variant": "as shipped", "share": -1.0, "threads": 12, "trace": False, "img_s": 8000.0,
             "cpu_cores": 11.0, "share_end": 0.75, "where": {"pool.idle": 0.13, "lane.hw_decode": 0.95}},
            {"variant": "as shipped", "share": 0.0, "threads": 12, "trace": False, "img_s": 2600.0,
             "cpu_cores": 11.7, "share_end": 0.0},
            {"variant": "as shipped", "share": 1.0, "threads": 12, "trace": False, "img_s": 6200.0,
             "cpu_cores": 1.2, "share_end": 1.0},
            {"variant": "as shipped", "share": 1.0, "threads": 12, "trace": True, "img_s": 1.0,  # traced: not used
             "cpu_cores": 1.2, "share_end": 1.0},
            {"variant": "as shipped", "share": -1.0, "threads": 16, "trace": True, "error": "rc=1: boom"}]
    md = bench._report(a, env, rows)
    balanced = [ln for ln in md.splitlines() if ln.startswith("| as shipped | 12 | -1 |")][0]
    assert "8,800 (6,200 + 2,600)" in balanced and balanced.rstrip(" |").endswith("0.91")
    assert "| as shipped | 16 | -1 | yes | error: rc=1: boom |" in md
    assert "lane.hw_decode 0.95, pool.idle 0.13" in md


def test_rows_run_pass_by_pass_and_the_table_keeps_each_variants_rows_together(tmp_path, monkeypatch):
    """Every variant gets a row in each pass (a machine that drifts during the run moves them alike);
    the table lists them by variant, threads and share, the traced pass (balanced rows only) last."""
    import torch

    calls = []

    def row(a, variant, share, T, trace):
        calls.append((variant, T, share, trace))
        return {"variant": variant, "share": share, "threads": T, "trace": trace, "img_s": 1000.0 + len(calls),
                "cpu_cores": 1.0, "share_end": 0.7, "jpg_util": None, "where": {}}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a GPU")
    monkeypatch.setattr(bench, "_run_row", row)
    assert bench.main(["--store", "x.lmdb", "--threads", "12", "--shares=-1,1", "--variants", "as shipped;A=1",
                       "--repeat", "2", "--trace", "--out", str(tmp_path)]) == 0
    v = [c[0] for c in calls]
    assert v == ["as shipped", "as shipped", "A=1", "A=1"] * 2 + ["as shipped", "A=1"]
    assert [c[3] for c in calls] == [False] * 8 + [True] * 2 and all(c[2] == -1 for c in calls[8:])
    table = [ln for ln in (tmp_path / "bench_engine.md").read_text().splitlines() if ln.startswith("| as shipped")
             or ln.startswith("| A=1")]
    assert [ln.split(" | ")[0][2:] for ln in table] == ["as shipped"] * 5 + ["A=1"] * 5
    assert [ln.split(" | ")[2] for ln in table[:5]] == ["-1", "-1", "-1", "1", "1"]
