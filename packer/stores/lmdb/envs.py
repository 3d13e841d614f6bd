"""Read-only LMDB environments shared within a process: one handle per data file,
reference-counted and thread-safe, dropped (never closed under the parent) after a fork; and
where the data file is mapped in memory, for readers that keep file offsets of records.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from packer.stores.lmdb.layout import DBS, MAX_DBS, import_lmdb

# py-lmdb allows one open handle per environment file per process, but users open one store
# from several Datasets (train/val views, a verify next to a loader). Readers therefore share
# one read-only environment per data file, reference-counted. A forked child inherits the
# parent's table; it closes those handles (read-only and lock-free, so the parent is not
# disturbed) before opening its own.
SHARED_ENVS: dict = {}
_SHARED_PID = os.getpid()
# Readers opened from several threads at once (readers.gpu.RawReader) must not both open the
# environment (py-lmdb: "already open in this process") nor lose a reference count.
_SHARED_LOCK = threading.RLock()


def forget_inherited_envs() -> None:
    """In a forked child, close the environments inherited from the parent and empty the table."""
    global _SHARED_PID
    if _SHARED_PID == os.getpid():
        return
    for env, _, _ in SHARED_ENVS.values():
        env.close()
    SHARED_ENVS.clear()
    _SHARED_PID = os.getpid()


def acquire_env(location: str):
    """(env, dbs, file id) for a read-only environment, shared within this process."""
    with _SHARED_LOCK:
        return _acquire_env_locked(location)


def _acquire_env_locked(location: str):
    lmdb = import_lmdb()
    forget_inherited_envs()
    for _ in range(_OPEN_ATTEMPTS):
        fid = _file_id(location)
        entry = SHARED_ENVS.get(fid)
        if entry is not None:
            break
        env = open_readonly(location, readahead=False, meminit=False)
        if _file_id(location) != fid:
            # A publish renamed another store onto the path while it opened: the env may map
            # either file, and the table is keyed by file. Open again.
            env.close()
            continue
        try:
            dbs = {name.decode(): env.open_db(name, create=False) for name in DBS}
        except lmdb.Error:
            env.close()
            raise
        entry = SHARED_ENVS[fid] = [env, dbs, 0]
        break
    else:
        raise OSError(f"the store was replaced {_OPEN_ATTEMPTS} times while being opened")
    entry[2] += 1
    return entry[0], entry[1], fid


_OPEN_ATTEMPTS = 5


def open_readonly(location, **options):
    """A read-only, lock-free environment of the store folder ``location``, opened by its data
    file (``subdir=False``). py-lmdb refuses a second environment whose files share an inode
    with one already open, and counts ``lock.mdb`` among an environment's files although a
    lock-free one never opens it: once a store folder is deleted while one of its readers is
    open, the freed ``lock.mdb`` inode goes to the next file made (a shard downloaded into a
    cache) and that store would not open ("already open in this process"). Opened by the data
    file alone, an environment's only identity is a file it keeps open."""
    return import_lmdb().open(str(Path(location) / "data.mdb"), readonly=True, lock=False,
                              max_dbs=MAX_DBS, subdir=False, **options)


def _file_id(location: str) -> tuple:
    st = os.stat(Path(location) / "data.mdb")
    return st.st_dev, st.st_ino


def release_env(fid) -> None:
    """Give back one reference to the environment of file ``fid``; the last one closes it."""
    if _SHARED_PID != os.getpid():
        return  # inherited through fork: forget_inherited_envs deals with it
    with _SHARED_LOCK:
        entry = SHARED_ENVS.get(fid)
        if entry is not None:
            entry[2] -= 1
            if entry[2] <= 0:
                del SHARED_ENVS[fid]
                entry[0].close()


def map_start(addr: int, inode: int):
    """The address at which the file with ``inode`` is mapped, from the ``/proc/self/maps``
    region holding ``addr`` (minus that region's file offset); None where there is no such file."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi and int(parts[4]) == inode:
                    return lo - int(parts[2], 16)
    except (OSError, ValueError):
        return None
    return None
