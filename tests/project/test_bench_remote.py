"""scripts/bench_remote.py against the S3 test server: the readers it starts see the caller's
PYTHONPATH (on the GPU machine, packages installed with ``pip --target`` reach the readers only
that way; session 20's run there failed at ``import turbojpeg`` in every reader), the readers run
on the CPUs given, and its images are the same whichever process makes them."""
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import REPO, s3_support

sys.path.insert(0, str(REPO / "scripts"))
bench = pytest.importorskip("bench_remote")


def _digests(items):
    return [(p.name, c, hashlib.sha256(p.read_bytes()).hexdigest()) for p, c in items]


def test_images_are_the_same_made_in_one_process_or_many(tmp_path):
    many = bench.make_images(tmp_path / "many", 1000)
    one = bench._make_some(tmp_path / "one", range(1000), 10, 0)
    assert len(many) == 1000 and _digests(many) == _digests(one)
    assert many[7][0].name == "000007.jpg" and many[7][1] == 7


@pytest.mark.timeout(600)
def test_readers_get_the_callers_pythonpath_and_cpus(tmp_path):
    endpoint = s3_support.endpoint()
    extra = tmp_path / "extra"           # a folder only the caller's PYTHONPATH names
    extra.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    (extra / "sitecustomize.py").write_text(   # imported at start-up by every Python that sees it
        "import os, sys\n"
        f"open(os.path.join({str(marks)!r}, str(os.getpid())), 'w').write(\n"
        "    ' '.join(sys.argv) + '|' + ','.join(map(str, sorted(os.sched_getaffinity(0)))))\n")
    cpu = str(min(os.sched_getaffinity(0)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(extra), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "remote.md"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_remote.py"), "--n", "64", "--tools", "packer",
                        "--repeats", "1", "--workers", "1", "--batch", "16", "--shard-mb", "1",
                        "--endpoint", endpoint, "--reader-cpus", cpu, "--work", str(tmp_path / "work"),
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stderr[-3000:]
    text = out.read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| packer")}
    assert set(rows) == {"packer-local", "packer"}, text
    for name, line in rows.items():
        cells = [c.strip() for c in line.split("|")[2:-1]]
        assert cells[0] and cells[1] and "failed" not in line, (name, line)   # both epochs measured
    assert f"readers on CPUs {cpu}" in text and "(partial" not in text
    assert re.search(r"^packer-local run 1: epoch 1 [0-9,]+ img/s, epoch 2 [0-9,]+ img/s$", r.stdout, re.M), r.stdout
    readers = [m.read_text() for m in marks.iterdir() if "read_packer" in m.read_text()]
    assert readers, "no reader saw the caller's PYTHONPATH"
    assert all(m.split("|")[1] == cpu for m in readers), readers


@pytest.mark.timeout(600)
def test_a_run_killed_at_a_cap_keeps_the_rows_it_finished(tmp_path):
    """gpu_check.sh gives the benchmark a time cap; the table is rewritten after each reader, so a
    run killed (SIGKILL, whole process group) after its first reader still leaves that row."""
    endpoint = s3_support.endpoint()
    out = tmp_path / "remote.md"
    p = subprocess.Popen([sys.executable, str(REPO / "scripts" / "bench_remote.py"), "--n", "64", "--tools",
                          "packer", "--repeats", "1", "--workers", "1", "--batch", "16", "--shard-mb", "1",
                          "--endpoint", endpoint, "--work", str(tmp_path / "work"), "--out", str(out)],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and p.poll() is None:
            if out.exists() and "(partial: 1 of 2 readers done)" in out.read_text():
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"no partial table (exit {p.poll()})")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| packer-local"))
    assert row.split("|")[2].strip() and "failed" not in row, text
    assert not out.with_name(out.name + ".tmp").exists()
