"""CUDA's hardware work queues, set for the GPU loader before CUDA starts.

A process reaches the GPU through a fixed number of hardware work queues, one per "connection"
(``CUDA_DEVICE_MAX_CONNECTIONS``, default 8, at most 32; read once, when the CUDA context is made).
Streams beyond that number share a queue, and work on a shared queue runs in the order it was
queued, whatever stream it belongs to. The GPU loader's native engine runs a stream per decode
thread and per hardware-decoder lane beside the training stream (15 or more): with 8 queues, its
per-image decode kernels waited behind training kernels that had nothing to do with them, and its
batches took twice as long beside a training loop as alone.

So importing :mod:`readers.gpu` sets ``CUDA_DEVICE_MAX_CONNECTIONS=32`` when the variable is unset
and torch has not started CUDA yet. A value already in the environment is kept (Megatron-LM, for
one, sets 1 on purpose). ResNet-18 fed by the engine on an H100, ~500 px photos, 12 threads:
0.83x of synthetic input with 8 queues, 0.90x with 32 (docs/benchmarks/train_gpu.md, session 14).
"""
from __future__ import annotations

import os
import warnings

import torch

__all__ = ["ENV", "WANTED", "claim", "status", "warn_if_late"]

ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
WANTED = "32"

_state: dict = {}


def claim() -> dict:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS`` to :data:`WANTED` if it is unset and CUDA has not
    started in this process; returns :func:`status`. Idempotent (the first call decides)."""
    if not _state:
        if ENV in os.environ:
            _state.update(value=os.environ[ENV], source="environment")
        elif torch.cuda.is_initialized():
            _state.update(value=None, source="too late: CUDA started before readers.gpu was imported")
        else:
            os.environ[ENV] = WANTED
            _state.update(value=WANTED, source="readers.gpu")
    return status()


def status() -> dict:
    """``value``: ``CUDA_DEVICE_MAX_CONNECTIONS`` as this process's CUDA context got it (None: unset,
    CUDA's default of 8); ``source``: who set it (``"readers.gpu"``, ``"environment"``, or why it
    was left alone)."""
    return {k: _state[k] for k in ("value", "source") if k in _state}


def warn_if_late(device: torch.device) -> bool:
    """Warn (once per process) when ``device`` is a CUDA device and CUDA started before
    :func:`claim` could set the queues; True when it warned."""
    if device.type != "cuda" or _state.get("value") is not None or _state.get("warned"):
        return False
    _state["warned"] = True
    warnings.warn(f"CUDA started before readers.gpu was imported, so the GPU loader's decode streams share CUDA's "
                  f"default 8 hardware queues with the training stream and wait behind its kernels (ResNet-18 on "
                  f"an H100: 0.83x of synthetic input against 0.90x). Import readers.gpu before the first CUDA "
                  f"call, or set {ENV}={WANTED} in the environment.", RuntimeWarning, stacklevel=3)
    return True


claim()  # on import: readers.gpu imports this module before anything else (see its __init__)
