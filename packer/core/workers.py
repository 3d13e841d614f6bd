"""Run the build's per-input checks on a pool that never hangs.

:func:`ordered_map` maps a picklable function over tasks with the standard library's
:mod:`concurrent.futures` executors, yielding results in task order with a bounded number of
tasks in flight (bounded memory). What it runs on is decided by :func:`choose_executor`:

* ``"process"``: a :class:`~concurrent.futures.ProcessPoolExecutor` over *spawn* workers (no
  fork: the parent may hold threads, LMDB/HDF5 handles or a MongoClient). A worker that dies
  (SIGKILL, the OOM killer, a crash) breaks the pool; the caller gets a :class:`WorkerError`
  within seconds naming the worker, its exit status and the likely cause. A parent that dies
  (SIGKILL, the OOM killer) takes its workers with it within a second or so (see
  :class:`_WorkerStart`), and the next run removes the result spool it left behind.
* ``"thread"``: a :class:`~concurrent.futures.ThreadPoolExecutor`. The checks spend their time in
  libjpeg-turbo and OpenCV, which release the GIL, so threads still use several cores.
* ``"inline"``: in this thread, one task at a time (one worker).

Spawn workers start by importing the parent's ``__main__`` module. That only works when the
main module is a readable file whose code calling the build sits under
``if __name__ == "__main__":``. Where it is not (a script without the guard, ``python -`` reading
stdin), every worker would re-run the script or fail to start: the automatic choice then takes
threads and logs why. ``python -c``, the interactive prompt and notebooks have no main file to
import and keep processes. Asking for ``"process"`` where it cannot work raises
:class:`~packer.core.errors.UsageError` with the fix, as PyTorch's DataLoader does.

Example:
    >>> from packer.core.workers import ordered_map
    >>> list(ordered_map(abs, [-1, -2, 3], workers=2, executor="thread"))
    [1, 2, 3]
"""
from __future__ import annotations

import ast
import collections
import concurrent.futures as cf
import ctypes
import logging
import multiprocessing as mp
import os
import pickle
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import tokenize
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable, Iterator, Optional

from packer.core.errors import UsageError, WorkerError

log = logging.getLogger(__name__)

EXECUTORS = ("auto", "process", "thread", "inline")

#: What Python's multiprocessing and PyTorch's DataLoader tell users who forgot the guard.
GUARD_HINT = (
    "the main module is re-run in every spawn worker process, so the code that starts the build "
    "must sit under the idiom\n\n    if __name__ == \"__main__\":\n        packer.build(...)\n\n"
    "(the same fix Python's multiprocessing and PyTorch's DataLoader ask for with the spawn start "
    "method), or pass executor=\"thread\"")


def in_spawn_bootstrap() -> bool:
    """True while this process is a spawn worker still importing the parent's main module."""
    return bool(getattr(mp.current_process(), "_inheriting", False))


def refuse_in_bootstrap(what: str = "packer.build()") -> None:
    """Raise UsageError when called from a spawn worker that is re-running an unguarded script.

    Without this, the worker would start a whole build of its own (taking locks, starting pools)
    while it is only meant to import the main module.
    """
    if in_spawn_bootstrap():
        raise UsageError(f"{what} was called while a worker process was starting: {GUARD_HINT}")


def _is_main_guard(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _guarded_lines(source: str) -> list[tuple[int, int]]:
    """Line ranges of the bodies of top-level ``if __name__ == "__main__":`` blocks."""
    ranges = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and _is_main_guard(node.test) and node.body:
            ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return ranges


def main_module_problem() -> Optional[str]:
    """Why spawn workers cannot import ``__main__`` safely right now, or None when they can.

    Looks at what :mod:`multiprocessing.spawn` will do in a worker: nothing when the main module
    has no file (``-c``, REPL, notebook); run that file otherwise. Running it is unsafe when the
    file cannot be read back (stdin) or when the statement of the main module that is executing
    now (the one that led to this call) is not inside an ``if __name__ == "__main__":`` block.
    """
    main = sys.modules.get("__main__")
    if main is None:
        return None
    path = getattr(main, "__file__", None)
    if path is None:
        return None  # -c, interactive, notebook kernels: workers do not import a main file
    if not os.path.isfile(path):
        return f"the main module comes from {path!r}, which worker processes cannot read back"
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            break
        frame = frame.f_back
    if frame is None:
        return None  # the main module is not executing top-level code (e.g. a later callback)
    try:
        with tokenize.open(path) as fh:  # honours a coding cookie, like the interpreter
            ranges = _guarded_lines(fh.read())
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None  # cannot tell: processes, and a failed start falls back (see ordered_map)
    line = frame.f_lineno
    if any(lo <= line <= hi for lo, hi in ranges):
        return None
    return (f"{path}, line {line}, starts the build outside an 'if __name__ == \"__main__\":' block, "
            f"so each spawn worker would re-run the script (put it under that guard to use processes)")


def choose_executor(executor: str, workers: int) -> tuple[str, str]:
    """(kind, reason) for ``executor`` in :data:`EXECUTORS` and ``workers`` >= 1.

    Raises:
        UsageError: unknown ``executor``, or ``"process"`` where workers cannot start.
    """
    if executor not in EXECUTORS:
        raise UsageError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if executor == "inline" or workers <= 1:
        return "inline", "one worker" if executor != "inline" else "asked for"
    if executor == "thread":
        return "thread", "asked for"
    problem = main_module_problem()
    if problem is None:
        return "process", "spawn workers can import the main module"
    if executor == "process":
        raise UsageError(f"cannot start worker processes: {problem}; {GUARD_HINT}")
    return "thread", problem


def _describe_dead(procs: dict) -> str:
    """'pid 123 killed by SIGKILL' for each worker that is gone, from the Process objects.

    Workers the executor itself terminated (SIGTERM) after another one died are left out when
    the one that died first is known.
    """
    dead = []
    codes = {pid: p.exitcode for pid, p in procs.items() if p.exitcode is not None}
    if any(c != -signal.SIGTERM for c in codes.values()):
        codes = {pid: c for pid, c in codes.items() if c != -signal.SIGTERM}
    for pid, code in sorted(codes.items()):
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            dead.append(f"pid {pid} killed by {name}")
        elif code:
            dead.append(f"pid {pid} exited with status {code}")
    return ", ".join(dead)


def _signalled(procs: dict) -> bool:
    """True when a worker was killed by a signal other than the executor's own SIGTERM."""
    return any((p.exitcode or 0) < 0 and p.exitcode != -signal.SIGTERM for p in procs.values())


def ordered_map(fn: Callable, tasks: Iterable, *, workers: int, window: Optional[int] = None,
                executor: str = "auto", initializer: Optional[Callable] = None,
                describe: Optional[Callable] = None) -> Iterator:
    """Yield ``fn(task)`` for each task, in task order, at most ``window`` tasks in flight.

    Args:
        fn: a module-level (picklable) function.
        tasks: picklable arguments, one per call.
        workers: pool size; 1 runs inline.
        window: tasks in flight (default ``workers * 16``).
        executor: ``"auto"``, ``"process"``, ``"thread"`` or ``"inline"`` (see module doc).
        initializer: run once in each worker process (not for threads).
        describe: ``describe(task) -> str`` names a task in the error when a worker dies (the
            tasks then in flight are listed: one of them may have crashed it).

    Raises:
        WorkerError: a worker process died (killed, out of memory, crashed); names the pid and
            signal. Results yielded before it are complete and in order.
        UsageError: ``executor="process"`` where worker processes cannot start.

    Example:
        >>> list(ordered_map(str, range(3), workers=1))
        ['0', '1', '2']
    """
    kind, why = choose_executor(executor, workers)
    window = max(1, int(window or workers * 16))
    if kind == "inline":
        log.debug("checking inputs in this process (%s)", why)
        for t in tasks:
            yield fn(t)
        return
    if kind == "thread":
        if executor == "auto":
            log.warning("checking inputs with %d threads instead of worker processes: %s", workers, why)
        yield from _run(cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packer-check"),
                        fn, iter(tasks), window, None)
        return
    log.debug("checking inputs with %d spawn worker processes", workers)
    it = iter(tasks)
    procs: dict = {}
    remove_stale_spools()
    spool = tempfile.mkdtemp(prefix=f"{_spool_prefix()}{os.getpid()}-")
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                  initializer=_WorkerStart(os.getpid(), initializer))
    yielded = 0
    runner = _run(pool, _Spooled(fn, spool), it, window, procs)
    try:
        for result in runner:
            yielded += 1
            yield _Spooled.load(result)
    except BrokenProcessPool as exc:
        dead = _describe_dead(procs)
        if yielded == 0 and not _signalled(procs) and executor == "auto":
            # No worker got going and none was killed: they failed while importing the main
            # module (a case main_module_problem could not see). Fall back instead of failing.
            log.warning("worker processes could not start (%s); checking inputs with %d threads "
                        "instead. If a script starts the build: %s", dead or exc, workers, GUARD_HINT)
            yield from _run(cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packer-check"),
                            fn, _restart(it, exc), window, None)
            return
        cause = (" (SIGKILL usually means the kernel's out-of-memory killer or a job scheduler "
                 "stopped it)" if "SIGKILL" in dead else "")
        in_flight = ""
        unfinished = getattr(exc, "packer_unfinished", [])[:workers]
        if describe is not None and unfinished:
            in_flight = (f"; being checked then (one may have caused it): "
                         f"{', '.join(describe(t) for t in unfinished)}")
        raise WorkerError(f"a worker process died during the build: {dead or 'exit status unknown'}"
                          f"{cause}; after {yielded} checked input(s){in_flight}") from exc
    finally:
        runner.close()  # shuts the pool down now (closing this generator closes it too)
        shutil.rmtree(spool, ignore_errors=True)


#: How often a worker checks that its parent is still there (where PR_SET_PDEATHSIG is not).
PARENT_POLL_S = 0.25
_PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


class _WorkerStart:
    """Initializer of every spawn worker: its life ends with the parent's, it drops the
    parent's stdout/stderr, then it runs the caller's initializer.

    Why: a build killed with SIGKILL (the OOM killer, a scheduler) cannot shut its pool down.
    Its workers, blocked on the task queue whose both ends they hold, would live on for good,
    and because they (and multiprocessing's resource tracker, which exits once no process holds
    its pipe) keep the build's stdout/stderr open, a caller reading the build's output
    (``subprocess.run(capture_output=True)``, ``| tee log``) would never see EOF.

    * Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills the worker when the
      thread that started it ends. ordered_map's pool is only ever driven by the thread that
      iterates it, which outlives the pool (the pool is shut down before the iteration ends).
    * Everywhere: a daemon thread that exits the process once ``getppid()`` is no longer the
      parent (also covers a parent that died before the prctl call).
    * stdout and stderr point at ``/dev/null``: results and exceptions travel through the pool,
      and a worker that dies is reported by the parent with its pid and signal.
    """

    def __init__(self, parent_pid: int, initializer: Optional[Callable] = None):
        self.parent_pid = parent_pid
        self.initializer = initializer

    def __call__(self) -> None:
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            except (OSError, AttributeError):   # no libc symbol: the watch thread still works
                pass
        if os.getppid() != self.parent_pid:   # died before the prctl: nobody wants our results
            os._exit(1)
        threading.Thread(target=_exit_when_orphaned, args=(self.parent_pid,), daemon=True,
                         name="packer-parent-watch").start()
        _drop_inherited_output()
        if self.initializer is not None:
            self.initializer()


def _exit_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _drop_inherited_output() -> None:
    """Point fds 1 and 2 at /dev/null (the Python streams write through them)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)


def _spool_prefix() -> str:
    """``packer-spool-<host>-``: a spool's name carries its host and owner pid (see below)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:40] or "host"
    return f"packer-spool-{host}-"


def remove_stale_spools(tmpdir: Optional[str] = None) -> list[str]:
    """Remove result spools left in ``tmpdir`` by builds of this host that were killed.

    A spool ``packer-spool-<host>-<pid>-<random>`` is stale when it belongs to this user and
    host and no process ``<pid>`` is alive. Spools of live processes, of other users and of
    other hosts (a shared temp folder) are left alone. Returns the paths removed.
    """
    tmpdir = tmpdir or tempfile.gettempdir()
    pattern = re.compile(re.escape(_spool_prefix()) + r"(\d+)-")
    removed = []
    try:
        entries = list(os.scandir(tmpdir))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or (
                    _uid() is not None and entry.stat(follow_symlinks=False).st_uid != _uid()):
                continue
        except OSError:
            continue
        if _pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        log.debug("removed %s, the result spool of a build that was killed", entry.path)
        removed.append(entry.path)
    return removed


def _uid() -> Optional[int]:
    return os.getuid() if hasattr(os, "getuid") else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True   # someone else's process (or not a pid we can ask about): keep it
    return True


class _Spooled:
    """Runs ``fn`` in a worker and hands its result back through a file in ``spool``.

    Why: a worker killed (SIGKILL, OOM) in the middle of writing a large result into the
    executor's result pipe leaves half a message there; the executor's manager thread then
    waits forever for the rest and never reports the broken pool (seen here as a hang). A path
    is a message of a few dozen bytes, written atomically (below PIPE_BUF), so a kill can only
    ever leave a stray file, removed with the spool.
    """

    def __init__(self, fn: Callable, spool: str):
        self.fn = fn
        self.spool = spool

    def __call__(self, task):
        result = self.fn(task)
        try:
            fd, path = tempfile.mkstemp(dir=self.spool, suffix=".pickle")
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(result, fh, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError:   # spool unusable (disk full...): send it through the pipe after all
            return ("inline", result)
        return ("file", path)

    @staticmethod
    def load(handle):
        how, value = handle
        if how == "inline":
            return value
        with open(value, "rb") as fh:
            result = pickle.load(fh)
        os.unlink(value)
        return result


def _restart(it, exc):
    # The tasks in flight when the pool broke were consumed from ``it``: _run keeps them on the
    # exception so the fallback starts from the first unfinished one.
    yield from getattr(exc, "packer_unfinished", [])
    yield from it


def _run(pool, fn, it, window: int, procs: Optional[dict]) -> Iterator:
    """Bounded-window ordered map on ``pool``; shuts it down whatever happens."""
    pending: collections.deque = collections.deque()

    def submit(t) -> None:
        try:
            fut = pool.submit(fn, t)
        except BrokenProcessPool as exc:   # broke before this task got in
            exc.packer_unfinished = [p for p, _ in pending] + [t]
            raise
        pending.append((t, fut))
        if procs is not None:  # Process objects, to report exit codes if the pool breaks
            procs.update(getattr(pool, "_processes", None) or {})

    try:
        for t in it:
            submit(t)
            if len(pending) >= window:
                break
        while pending:
            task, fut = pending[0]
            try:
                result = fut.result()
            except BrokenProcessPool as exc:
                exc.packer_unfinished = [t for t, _ in pending]
                raise
            pending.popleft()
            yield result
            t = next(it, _END)
            if t is not _END:
                submit(t)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_END = object()
