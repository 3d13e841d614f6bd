"""scripts/gpu_check.sh's ddp stage on a machine without GPUs: nvidia-smi and torchrun stood in for
by shims on PATH, bench_train_gpu.py by a stand-in that writes one row per call (its --summarize
and --rows-to are the real ones). Checks which rows the stage runs (passes, variants, the bound
rows, one GPU then two) and what it leaves in $OUT."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests import REPO

STANDIN = f'''
import json, os, sys
sys.path.insert(0, {str(REPO / "scripts")!r})
args = sys.argv[1:]
if args[0] == "--summarize":
    import bench_train_gpu
    sys.exit(bench_train_gpu.main(args))
def opt(name, default=None):  # the last one given wins, as with argparse
    return args[len(args) - 1 - args[::-1].index(name) + 1] if name in args else default
gpus = int(os.environ.get("WORLD_SIZE", "1"))
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps({{"gpus": gpus, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "args": args,
                        "lanes": os.environ.get("PACKER_ENGINE_HW_LANES")}}) + "\\n")
row = {{"model": opt("--models"), "feed": opt("--feeds"), "gpus": gpus, "label": opt("--label"),
       "threads": int(opt("--threads", 12)), "bind": opt("--bind", "none"), "bucket_view": "--bucket-view" in args,
       "img_per_s": 1000.0 if gpus == 1 else 950.0, "gpu_busy": 0.99, "cpu_cores": 2.0}}
knobs = {{k: v for k, v in os.environ.items() if k.startswith("PACKER_ENGINE_")}}
if knobs:
    row["engine_env"] = knobs
out = opt("--out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "bench_train_gpu.json"), "w") as f:
    json.dump({{"env": {{}}, "rows": [row]}}, f)
'''


@pytest.mark.timeout(120)
def test_ddp_stage_runs_each_row_on_one_gpu_then_two_per_pass_and_variant(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_check.sh", root / "scripts" / "gpu_check.sh")
    (root / "scripts" / "bench_train_gpu.py").write_text(STANDIN)
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "nvidia-smi").write_text('#!/bin/sh\n[ "$1" = -L ] && printf "GPU 0: stand-in\\nGPU 1: stand-in\\n"\n'
                                      'exit 0\n')
    # torchrun --nproc-per-node 2 SCRIPT ARGS...: one process standing for both ranks
    (shims / "torchrun").write_text('#!/bin/sh\nshift 2\nWORLD_SIZE=2 exec python3 "$@"\n')
    for s in shims.iterdir():
        s.chmod(0o755)
    out, calls = tmp_path / "out", tmp_path / "calls.jsonl"
    env = dict(os.environ, PATH=f"{shims}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", OUT=str(out),
               PACKER_CARRY=str(tmp_path / "carry"), DDP_ROWS=str(tmp_path / "rows"), CALLS=str(calls),
               DDP_PASSES="1 2", DDP_MODELS="resnet18", DDP_FEEDS="synthetic packer",
               DDP_VARIANTS="|--threads 4 --bucket-view|PACKER_ENGINE_HW_LANES=1", DDP_BIND="gpu")
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "ddp"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    # 2 passes x 2 feeds x 3 variants x (one GPU, two GPUs), and the bound two-GPU rows of packer
    assert len(seen) == 2 * 2 * 3 * 2 + 2 * 3
    one = [c for c in seen if c["gpus"] == 1]
    assert len(one) == 12 and all(c["visible"] == "0" for c in one)
    bound = [c for c in seen if "--bind" in c["args"]]
    assert len(bound) == 6 and all(c["gpus"] == 2 and "packer" in c["args"] for c in bound)
    assert sum("--bucket-view" in c["args"] for c in seen) == 2 * 2 * 2 + 2
    # a NAME=VALUE word is the environment, not an option
    lanes = [c for c in seen if c["lanes"] == "1"]
    assert len(lanes) == 2 * 2 * 2 + 2 and not any("PACKER_ENGINE_HW_LANES=1" in c["args"] for c in seen)
    assert {c["args"][c["args"].index("--label") + 1] for c in seen} == {"pass1", "pass2"}
    table = (out / "ddp" / "ddp.md").read_text()
    rows = {tuple(c.strip() for c in ln.split("|")[1:5]): [c.strip() for c in ln.split("|")]
            for ln in table.splitlines() if ln.startswith("| resnet18")}
    view = rows[("resnet18", "packer", "2", "4 threads, bucket view")]  # against its own one-GPU rows
    assert view[5:8] == ["2", "950 / 950 / 950", "0.950 / 0.950 / 0.950"]
    assert rows[("resnet18", "packer", "2", "12 threads, bind gpu")][5:7] == ["2", "950 / 950 / 950"]
    assert rows[("resnet18", "synthetic", "2", "12 threads")][8] == "1.000"
    assert rows[("resnet18", "packer", "1", "12 threads")][5:7] == ["2", "1,000 / 1,000 / 1,000"]
    assert rows[("resnet18", "packer", "2", "12 threads, PACKER_ENGINE_HW_LANES=1")][7] == "0.950 / 0.950 / 0.950"
    assert "GPU placement seen" in table
    assert table in r.stdout  # the table goes to the console and the summary after each pass
    # $OUT holds two files (the device sends back only a few): the table and every row in one JSON
    assert sorted(f.name for f in (out / "ddp").iterdir()) == ["bench_train_gpu.json", "ddp.md"]
    assert len(json.loads((out / "ddp" / "bench_train_gpu.json").read_text())["rows"]) == len(seen)
    assert not list(out.rglob("*/one/*"))


@pytest.mark.timeout(60)
def test_a_call_carrying_one_piece_without_the_sums_keeps_it(tmp_path):
    """The remote kit travels one piece a call; the second call carries ``.rkit/piece.01`` (and
    the wheels) without ``SHA256SUMS``. The copy to $PACKER_CARRY used to need both at once, so
    that piece was dropped and the kit never became whole (session 22, on the H200)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_check.sh", root / "scripts" / "gpu_check.sh")
    carry = tmp_path / "carry"
    env = dict(os.environ, OUT=str(tmp_path / "out"), PACKER_CARRY=str(carry))
    for piece, sums in (("piece.00", True), ("piece.01", False)):
        shutil.rmtree(root / ".rkit", ignore_errors=True)
        (root / ".rkit").mkdir()
        (root / ".rkit" / piece).write_bytes(piece.encode())
        if sums:
            (root / ".rkit" / "SHA256SUMS").write_text("0" * 64 + "  rkit.tar\n")
        r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "carry"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=50)
        assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(carry / "rkit")) == ["SHA256SUMS", "piece.00", "piece.01"]
    assert "3 remote kit files" in r.stdout + r.stderr


#: Test files with GPU tests that gpu_check.sh's test stage does not run, and why.
RUN_ELSEWHERE = {
    "tests/packer/remote/test_remote_read.py": "its GPU test needs the S3 server of the remote kit; run on the device "
                                               "by hand after the kit's calls (docs/gpu.md)",
}


#: A test that needs CUDA: the fixture as a parameter, the mark, or the kernels' device list.
GPU_TEST = re.compile(r"@pytest\.mark\.cuda\b|\brequire_cuda\s*[,)]|\bcpu_and_cuda\(\)")


def test_every_file_with_gpu_tests_is_run_by_the_gpu_check():
    """A test file that needs CUDA and is missing from the stage's lists is never run: no CI
    machine has a GPU (tests/readers/test_gpu_feeds.py was missing once)."""
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    gpu_files = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
        if GPU_TEST.search(p.read_text()))
    assert "tests/readers/test_gpu_feeds.py" in gpu_files  # the scan finds them
    missing = [f for f in gpu_files if f not in script and f not in RUN_ELSEWHERE]
    assert not missing, f"GPU tests that gpu_check.sh never runs: {missing}"
