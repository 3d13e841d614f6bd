"""The build never hangs: unguarded scripts, stdin, -c, a worker killed mid-build.

Every case runs in a real subprocess bounded by a timeout: a hang fails the test.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import packer
from packer.core.errors import UsageError
from packer.core.workers import _guarded_lines, choose_executor, ordered_map
from packer.sample import make_dataset
from packer.stores import open_store
from tests import REPO, corpus


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


SCRIPT = """\
import logging, sys
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
import packer
r = packer.build({images!r}, None, {out!r}, workers=2{extra})
print("RESULT", r.published, r.records)
"""


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    images, _ = make_dataset(tmp_path_factory.mktemp("w"), 12, kind="classes", seed=3)
    return images


def _check_store(out, n):
    assert packer.verify(out).ok
    with open_store(out) as s:
        assert len(s) == n


@pytest.mark.timeout(180)
def test_unguarded_script_file_builds_with_threads(small_dataset, tmp_path):
    out = tmp_path / "o.lmdb"
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT.format(images=str(small_dataset), out=str(out), extra=""))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT True 12" in r.stdout
    assert "threads instead of worker processes" in r.stderr
    assert "line 4" in r.stderr and "__main__" in r.stderr
    assert "Traceback" not in r.stderr  # no worker was ever started to fail
    _check_store(out, 12)


@pytest.mark.timeout(180)
def test_guarded_script_uses_worker_processes(small_dataset, tmp_path):
    out = tmp_path / "o.lmdb"
    body = SCRIPT.format(images=str(small_dataset), out=str(out), extra="").splitlines()
    script = tmp_path / "guarded.py"
    script.write_text("\n".join(body[:3] + ['if __name__ == "__main__":'] + ["    " + ln for ln in body[3:]]))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT True 12" in r.stdout
    assert "spawn worker processes" in r.stderr and "threads" not in r.stderr
    _check_store(out, 12)


@pytest.mark.timeout(180)
def test_build_from_stdin(small_dataset, tmp_path):
    out = tmp_path / "o.lmdb"
    src = SCRIPT.format(images=str(small_dataset), out=str(out), extra="")
    r = subprocess.run([sys.executable, "-"], input=src, capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT True 12" in r.stdout
    assert "<stdin>" in r.stderr and "threads instead" in r.stderr
    _check_store(out, 12)


@pytest.mark.timeout(180)
def test_build_from_dash_c_uses_processes(small_dataset, tmp_path):
    out = tmp_path / "o.lmdb"
    src = SCRIPT.format(images=str(small_dataset), out=str(out), extra="")
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT True 12" in r.stdout
    assert "spawn worker processes" in r.stderr
    _check_store(out, 12)


@pytest.mark.timeout(180)
def test_workers_that_fail_to_start_fall_back_to_threads(small_dataset, tmp_path):
    """A main module packer cannot inspect (compiled .pyc): the pool is tried, its workers fail
    while re-running the script, and the build falls back to threads instead of respawning."""
    import py_compile

    out = tmp_path / "o.lmdb"
    src = tmp_path / "unguarded_src.py"
    src.write_text(SCRIPT.format(images=str(small_dataset), out=str(out), extra=""))
    pyc = tmp_path / "unguarded.pyc"
    py_compile.compile(str(src), cfile=str(pyc), doraise=True)
    r = subprocess.run([sys.executable, str(pyc)], capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT True 12" in r.stdout
    assert "worker processes could not start" in r.stderr
    assert "if __name__ == \"__main__\":" in r.stderr
    _check_store(out, 12)


@pytest.mark.timeout(180)
def test_process_executor_refused_without_guard_with_the_fix(small_dataset, tmp_path):
    out = tmp_path / "o.lmdb"
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT.format(images=str(small_dataset), out=str(out), extra=", executor='process'"))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 1
    assert "UsageError" in r.stderr and 'if __name__ == "__main__":' in r.stderr
    assert "DataLoader" in r.stderr
    assert not out.exists()


def test_guard_detection_reads_the_ast():
    src = textwrap.dedent("""\
        import x
        x.run()
        if __name__ == "__main__":
            x.build()
            x.more()
        if "__main__" == __name__:
            y = 1
        if __name__ == "other":
            z = 2
        """)
    assert _guarded_lines(src) == [(4, 5), (7, 7)]


def test_choose_executor_rules():
    assert choose_executor("auto", 1)[0] == "inline"
    assert choose_executor("thread", 4)[0] == "thread"
    assert choose_executor("inline", 4)[0] == "inline"
    with pytest.raises(UsageError):
        choose_executor("bogus", 2)


def test_ordered_map_keeps_order_with_a_bounded_window():
    in_flight, peak = [0], [0]

    def gen():
        for i in range(50):
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            yield i

    out = []
    for v in ordered_map(abs, gen(), workers=3, window=5, executor="thread"):
        in_flight[0] -= 1
        out.append(v)
    assert out == list(range(50))
    assert peak[0] <= 5


def _slow_inputs(images: Path, n: int, seed: int) -> Path:
    """``n`` copies of a 1400x1400 JPEG in two class folders: ~10 ms each to check, so a build
    with 2 workers lasts seconds (time to kill or interrupt it)."""
    big = corpus.jpeg_of_shape(1400, 1400, seed=seed)
    for i in range(n):
        p = images / f"c{i % 2}" / f"img_{i:04d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(big)
    return images


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, cmdline) of the live child processes of ``pid``, from /proc."""
    kids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            kids.append((int(d.name), cmd))
    return kids


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find worker pids")
def test_sigkilled_worker_fails_fast_and_rerun_resumes_to_the_same_store(tmp_path):
    images = _slow_inputs(tmp_path / "images", 240, seed=4)
    ref, out = tmp_path / "ref.lmdb", tmp_path / "out.lmdb"
    cmd = [sys.executable, "-m", "packer", "build", str(images), "-o", str(out), "-j", "2", "-q",
           "--commit-mb", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        workers = []
        while time.monotonic() < deadline and proc.poll() is None:
            workers = [pid for pid, cmdline in _children(proc.pid) if "spawn_main" in cmdline]
            data = tmp_path / "out.lmdb.partial" / "data.mdb"
            # Kill once a few batches are committed (each ~1 MiB), so there is work to keep.
            if len(workers) == 2 and data.exists() and data.stat().st_size > (3 << 20):
                break
            time.sleep(0.02)
        assert proc.poll() is None and workers, "the build ended before a worker could be killed"
        # Stopping the parent also leaves the workers blocked writing results to it, so the kill
        # lands mid-write: with results sent through the pipe this hung the executor for good
        # (2 of 5 runs here) until results went through spool files (packer.core.workers._Spooled).
        os.kill(proc.pid, signal.SIGSTOP)   # and the build cannot finish first, however fast
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode()
    assert proc.returncode == 1, err[-3000:]
    assert took < 20, f"the build took {took:.1f}s to notice the dead worker"
    assert f"pid {workers[0]} killed by SIGKILL" in err and "out-of-memory" in err, err[-3000:]
    assert "being checked then (one may have caused it): c" in err   # keys like c0/img_0042.jpg
    assert "Traceback" not in err
    assert not out.exists() and (tmp_path / "out.lmdb.partial").exists()

    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=240,
                       env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    rep = json.loads(r.stdout)
    assert rep["resumed_from"] > 0 and rep["records"] == 240

    packer.build(images, None, ref, workers=1)
    with open_store(ref) as a, open_store(out) as b:
        assert a.metadata.index_checksum == b.metadata.index_checksum
        assert [r.checksum for r in a.get_many(range(240))] == [r.checksum for r in b.get_many(range(240))]
    assert packer.verify(out).ok


def test_thread_checks_are_strict_and_leave_warning_filters_alone(tmp_path):
    """Threads must reject truncated JPEGs exactly as processes do, without leaving a global
    "error" warnings filter behind (warnings.catch_warnings is not thread-safe)."""
    import warnings

    root = tmp_path / "in"
    files = {f"good/{i}.jpg": corpus.good_jpeg(i, 40 + i, 60) for i in range(12)}
    for name, (data, _) in corpus.damaged_set().items():
        files[f"bad/{name}"] = data
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    before = list(warnings.filters)
    a = packer.build(root, None, tmp_path / "t.lmdb", workers=3, executor="thread", on_corrupt="skip")
    assert warnings.filters == before
    b = packer.build(root, None, tmp_path / "i.lmdb", workers=1, on_corrupt="skip")
    assert a.rejected == b.rejected and len(a.rejected) == len(corpus.damaged_set())
    with open_store(tmp_path / "t.lmdb") as x, open_store(tmp_path / "i.lmdb") as y:
        assert x.metadata.index_checksum == y.metadata.index_checksum


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_build_promptly_and_keeps_the_work(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does): no hang on idle
    workers at exit, a one-line message, exit 130, and the rerun resumes."""
    images = _slow_inputs(tmp_path / "images", 240, seed=5)
    out = tmp_path / "out.lmdb"
    cmd = [sys.executable, "-m", "packer", "build", str(images), "-o", str(out), "-j", "2", "-q",
           "--commit-mb", "1"]
    # A suite started in the background of a shell inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt handler: give the build the terminal's default, as a user's shell does.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        data = tmp_path / "out.lmdb.partial" / "data.mdb"
        assert _wait(lambda: proc.poll() is not None or (data.exists() and data.stat().st_size > (3 << 20)))
        assert proc.poll() is None, "the build ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        t = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert took < 20
    assert f"the work committed so far is kept in {out}.partial".encode() in err, err.decode()[-2000:]
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=240, env=_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    assert json.loads(r.stdout)["resumed_from"] > 0


def _wait(pred, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _session_processes(sid: int) -> list[str]:
    """'pid state cmdline' of the processes of session ``sid`` that are not zombies."""
    alive = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            alive.append(f"{d.name} {state} {cmd[:120]}")
    return alive


def _drain(stream, sink: list) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        sink.append(chunk)


@pytest.mark.timeout(400)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads sessions from /proc")
def test_sigkilled_build_takes_its_workers_along_and_callers_see_eof(tmp_path):
    """kill -9 of the build (not of its group: what the OOM killer does) at random moments:
    3 s later no process of its session is alive and a caller reading its pipes got EOF.
    Before: the spawn workers and the resource tracker lived on (ppid 1) holding the pipes."""
    import random
    import threading

    images = _slow_inputs(tmp_path / "images", 400, seed=6)
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    env = dict(_env(), TMPDIR=str(spool_dir))
    rng = random.Random(22)
    killed = 0
    for trial in range(6):
        out = tmp_path / f"out{trial}.lmdb"   # a fresh build each time: it lasts a few seconds
        cmd = [sys.executable, "-m", "packer", "build", str(images), "-o", str(out), "-j", "2", "-q",
               "--commit-mb", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=tmp_path, start_new_session=True)
        sinks: tuple[list, list] = ([], [])
        readers = [threading.Thread(target=_drain, args=(s, k), daemon=True)
                   for s, k in zip((proc.stdout, proc.stderr), sinks)]
        for t in readers:
            t.start()
        try:
            # Kill at a random moment once a worker exists (starting, idle or mid-check).
            assert _wait(lambda: proc.poll() is not None
                         or any("spawn_main" in c for _, c in _children(proc.pid)), timeout=60)
            time.sleep(rng.uniform(0.0, 1.2))
            if proc.poll() is not None:
                break   # the build finished: nothing left to kill
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
            proc.wait(timeout=10)
            gone = _wait(lambda: not _session_processes(proc.pid) and not any(t.is_alive() for t in readers),
                         timeout=3.0)
            left = _session_processes(proc.pid)
            assert gone, (f"trial {trial}: 3 s after kill -9 of the build, still alive: {left}; "
                          f"pipes at EOF: {[not t.is_alive() for t in readers]}")
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # what is left of the group, if the test failed
            except ProcessLookupError:
                pass
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    assert killed >= 4, "the build finished before it could be killed often enough"
    # Each run removed the spool of the killed one before it: only the last one's is left.
    assert len(list(spool_dir.glob("packer-spool-*"))) == 1

    # The next run removes it, resumes and finishes the store.
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(spool_dir.glob("packer-spool-*"))
    with open_store(out) as s:
        assert len(s) == 400
    assert packer.verify(out).ok


def test_stale_spools_of_dead_builds_are_removed_and_live_ones_kept(tmp_path):
    from packer.core import workers

    prefix = workers._spool_prefix()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{prefix}{dead.pid}-abc"
    live = tmp_path / f"{prefix}{os.getppid()}-def"
    other_host = tmp_path / f"packer-spool-elsewhere.example-{dead.pid}-ghi"
    not_a_spool = tmp_path / "unrelated-999999"
    for d in (stale, live, other_host, not_a_spool):
        d.mkdir()
        (d / "x.pickle").write_bytes(b"x")
    assert workers.remove_stale_spools(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other_host.exists() and not_a_spool.exists()
