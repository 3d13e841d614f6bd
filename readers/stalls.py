"""Waiting for a batch within a bound: the loaders' ``timeout`` (:class:`readers.loader.BatchLoader`,
:class:`readers.gpu.loader.GPULoader`), and where their threads are when it runs out.

A decoder or a storage that stops answering would otherwise leave the training loop waiting for
ever with nothing said. After ``timeout`` seconds without a batch the loader raises
``RuntimeError`` with :func:`where` its threads are, e.g.::

    GPULoader: no batch came within timeout=1800 s; where the loader's threads are: packer-gpu-read:
    wait (threading.py:331) under _put (readers/gpu/loader.py:280); packer-gpu-decode: collect
    (readers/gpu/engine.py:188) under _collect (readers/gpu/loader.py:447); ...

Only the loader's own waits count, never the training step between two batches.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
from typing import Iterable, Optional

from packer.core.errors import UsageError

__all__ = ["DEFAULT_TIMEOUT_S", "check_timeout", "stalled", "where"]

#: The loaders' default ``timeout``: above any wait packer itself bounds (a bucket read gives up
#: within ~3 min: packer.core.remote; a native decoder batch within PACKER_ENGINE_TIMEOUT_S, 120 s)
#: and above a first batch that waits for a manifest's shard to download whole (several GB on a
#: slow link: packer.stores.cache).
DEFAULT_TIMEOUT_S = 1800.0


def check_timeout(timeout) -> Optional[float]:
    """A loader's ``timeout`` argument as seconds, or None to wait for ever (None or 0).

    Raises:
        UsageError: a negative or non-numeric timeout.
    """
    if timeout is None:
        return None
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise UsageError(f"timeout must be None or >= 0 seconds, got {timeout!r}") from None
    if not t >= 0:
        raise UsageError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
    return t or None


def stalled(who: str, timeout: float, threads: Iterable[threading.Thread], own_file: Optional[str] = None
            ) -> RuntimeError:
    """The error a loader raises after ``timeout`` seconds without a batch: where its threads are."""
    return RuntimeError(f"{who}: no batch came within timeout={timeout:g} s (a larger timeout= if a stage may "
                        f"take that long); where the loader's threads are: {where(threads, own_file)}")


def where(threads: Iterable[threading.Thread], own_file: Optional[str] = None) -> str:
    """Where each thread is: its innermost Python frame (a call into C, the native decoder's
    ``result`` say, shows as the line that made it); the innermost one outside the standard library
    where that one is in it (a lock's ``wait``); and the innermost frame in ``own_file`` (the
    loader's own loop) it is under."""
    stdlib = sysconfig.get_paths()["stdlib"]
    frames = sys._current_frames()
    out = []
    for t in threads:
        f = frames.get(t.ident) if t.is_alive() else None
        if f is None:
            out.append(f"{t.name}: {'stopped' if not t.is_alive() else 'no frame'}")
            continue
        chain = []
        while f is not None:
            chain.append(f)
            f = f.f_back
        shown = [chain[0]]
        if chain[0].f_code.co_filename.startswith(stdlib):
            user = next((g for g in chain if not g.f_code.co_filename.startswith(stdlib)), None)
            if user is not None and user.f_code.co_filename != own_file:
                shown.append(user)
        here = " in ".join(_frame(g) for g in shown)
        ours = next((g for g in chain if g.f_code.co_filename == own_file), None) if own_file else None
        if ours is not None and ours not in shown:
            here += f" under {_frame(ours)}"
        out.append(f"{t.name}: {here}")
    return "; ".join(out)


def _frame(f) -> str:
    return f"{f.f_code.co_name} ({_short(f.f_code.co_filename)}:{f.f_lineno})"


def _short(path: str) -> str:
    """A source path from the package's root (readers/gpu/loader.py), else its last two parts."""
    parts = path.replace(os.sep, "/").split("/")
    for root in ("readers", "packer", "gpu_ops"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root):])
    return "/".join(parts[-2:])
