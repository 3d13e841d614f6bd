"""Batch buffers that DataLoader workers reuse across batches, safely.

A DataLoader worker's batch reaches the main process through shared memory. Made fresh for every
batch, that memory costs the worker a page fault and a zeroed page per 4 KiB it writes, and the
main process a new mapping; at full decode of 500x375 photos that is about 0.5 ms of CPU per image
on top of a 0.65 ms decode (measured on 2 cores: 1,460 img/s fresh against 2,390 with buffers
reused). FFCV reuses its buffers after a fixed number of batches and leaves it to the user not to
hold one longer; a worker here reuses a buffer only once the main process has said it let go.

How: a worker keeps up to ``keep`` *slots*, each one torch shared-memory storage holding a small
header and one batch. :func:`to_main` wraps a batch that lies in a slot (``collate_decoded`` calls
it in workers) so that it is sent as the slot (torch's own fd passing) and rebuilt in the main
process by :func:`_rebuild_in_main` as a tensor that is a view of that memory; when the last
tensor, view or array of that batch dies, a finalizer writes "free" into the slot's header. The
worker takes a slot again only when the header says free and nothing in the worker holds it.

Every other route is safe by default: a slot's header says "in use" from the moment the worker
takes it, so a batch that left by another route (a user collate returning the tensor as it is,
shared by torch without our finalizer) is never marked free; the worker drops such a slot from its
ring instead of reusing it, as it drops a slot whose batch died in the worker (a skipped record's
batch is copied out). Where no slot is free, the batch gets fresh shared memory, as before.
"""
from __future__ import annotations

import math
import os
import threading
import weakref
from typing import Optional

import numpy as np
import torch

__all__ = ["SharedBatchRing", "worker_ring", "to_main", "received_stats"]

HEADER = 64           # bytes before the batch in each slot (keeps the batch 64-byte aligned)
_STATE, _USES = 0, 1  # header as uint64 words: [state, times taken]
_FREE, _IN_USE = 0, 1


def storage_holders(t: torch.Tensor) -> int:
    """How many tensors (and storage objects) hold ``t``'s storage, as the C++ refcount sees it."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _shared_bytes(nbytes: int) -> torch.Tensor:
    """A flat uint8 tensor on fresh torch shared memory of ``nbytes`` (at least 1) bytes."""
    storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))


class _Slot:
    """One reusable shared-memory batch buffer of a worker."""

    __slots__ = ("full", "header", "capacity", "base", "handed_out", "ptr")

    def __init__(self, numel: int):
        self.full = _shared_bytes(HEADER + max(numel, 1))
        self.header = self.full[:HEADER].numpy().view(np.uint64)
        self.capacity = self.full.numel() - HEADER
        self.ptr = self.full.untyped_storage().data_ptr()
        self.base = storage_holders(self.full)  # the holders when only this slot holds it
        self.handed_out = False


class SharedBatchRing:
    """A worker's reusable shared-memory batch buffers (see the module docstring).

    Args:
        keep: at most this many slots (a worker has ``prefetch_factor`` batches in flight and the
            main process holds a few); batches beyond them get fresh shared memory.
    """

    def __init__(self, keep: int = 4):
        self.keep = int(keep)
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self.reused = self.allocated = self.dropped = 0

    def take(self, shape: tuple) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``shape`` in shared memory: a free slot, or new."""
        numel = math.prod(int(n) for n in shape)
        with self._lock:
            chosen: Optional[_Slot] = None
            for slot in list(self._slots):
                if storage_holders(slot.full) > slot.base:
                    continue  # the worker still holds it (its batch is being made or sent)
                if int(slot.header[_STATE]) == _FREE:
                    if chosen is None and slot.capacity >= numel:
                        chosen = slot
                elif not slot.handed_out:
                    # In use, yet never sent through to_main: its batch died here, or left by a
                    # route that never says "free". Never reuse it; let it go.
                    self._slots.remove(slot)
                    self.dropped += 1
            if chosen is None:
                if len(self._slots) >= self.keep:
                    return _shared_bytes(numel)[:numel].view(tuple(shape))
                chosen = _Slot(numel)
                self._slots.append(chosen)
                self.allocated += 1
            else:
                self.reused += 1
            chosen.header[_USES] += np.uint64(1)
            chosen.header[_STATE] = _IN_USE
            chosen.handed_out = False
            return chosen.full[HEADER : HEADER + numel].view(tuple(shape))

    def slot_of(self, t: torch.Tensor) -> Optional[_Slot]:
        """The slot ``t`` is the whole batch of (contiguous, at the slot's start), else None."""
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
            return None
        ptr = t.untyped_storage().data_ptr()
        for slot in self._slots:
            if slot.ptr == ptr and t.storage_offset() == HEADER:
                return slot
        return None


_ring: Optional[SharedBatchRing] = None
_ring_pid: Optional[int] = None


def worker_ring() -> SharedBatchRing:
    """This process's ring (made on first use; a forked child starts its own)."""
    global _ring, _ring_pid
    if _ring is None or _ring_pid != os.getpid():
        _ring, _ring_pid = SharedBatchRing(), os.getpid()
    return _ring


class _ToMain:
    """A batch in a slot, as it travels to the main process (pickled by the worker's queue)."""

    __slots__ = ("slot", "shape")

    def __init__(self, slot: _Slot, shape: tuple):
        self.slot, self.shape = slot, shape

    def __reduce__(self):
        # Pickled in the worker, before the worker lets go of the batch: from here on the slot is
        # the main process's until its finalizer writes "free".
        self.slot.handed_out = True
        return (_rebuild_in_main, (self.slot.full, self.shape))


def to_main(images: torch.Tensor):
    """In a DataLoader worker: ``images`` wrapped to travel as its slot when it is a ring batch
    (the main process gets a plain tensor that frees the slot when it dies); else ``images``."""
    if _ring is None or _ring_pid != os.getpid():
        return images
    slot = _ring.slot_of(images)
    return images if slot is None else _ToMain(slot, tuple(images.shape))


_received = {"batches": 0, "max_uses": 0}


def received_stats() -> dict:
    """In the main process: ring batches received, and the most times one slot was used."""
    return dict(_received)


def _release(header: np.ndarray, pid: int) -> None:
    # Only the process that received the batch frees it: a forked child (another loader's worker)
    # inherits the batch and this finalizer, and its copy dying says nothing about the parent's.
    if os.getpid() == pid:
        header[_STATE] = _FREE


def _rebuild_in_main(full: torch.Tensor, shape: tuple) -> torch.Tensor:
    numel = math.prod(int(n) for n in shape)
    header = full[:HEADER].numpy().view(np.uint64)  # keeps the slot mapped until the release
    data = full[HEADER : HEADER + numel].numpy().reshape(shape)
    _received["batches"] += 1
    _received["max_uses"] = max(_received["max_uses"], int(header[_USES]))
    # `data` lives exactly as long as the tensor below, its views and arrays (the tensor's storage
    # holds it): its finalizer is the moment nothing in this process reads the batch any more.
    weakref.finalize(data, _release, header, os.getpid()).atexit = False  # not at exit: nothing reuses it then
    return torch.from_numpy(data)
