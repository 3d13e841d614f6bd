"""Record keys as file paths: which keys may become a path under an output folder, and writing
them there without following a planted symbolic link or replacing a file.

``packer export`` writes ``OUT/images/<key>``; the interchange formats use the same rule for
shard names, sample keys and ``path`` fields they read, so a key that could escape its folder
(``..``, an absolute path, a drive letter) is refused everywhere alike.

Example:
    >>> safe_relative("train/cat/0001.jpg") is None
    True
    >>> safe_relative("../etc/passwd")
    "path with '..' or '.' components"
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Optional

from packer.core.errors import UsageError

__all__ = ["MAX_KEY_BYTES", "MAX_PART_BYTES", "safe_relative", "target_path", "write_new"]

#: Most UTF-8 bytes a key may have (LMDB refuses keys over 511 bytes) and one of its components
#: (a file name: NAME_MAX is 255 on the usual file systems).
MAX_KEY_BYTES = 500
MAX_PART_BYTES = 255


def safe_relative(key: str) -> Optional[str]:
    """Why ``key`` cannot be a path under an output folder, or None when it can.

    Args:
        key: a record key (POSIX separators).

    Returns:
        None for a relative path of plain components; else the reason (empty key or NUL byte,
        absolute path, ``..``/``.``/empty components, longer than :data:`MAX_KEY_BYTES` or a
        component longer than :data:`MAX_PART_BYTES`).
    """
    if not key or "\0" in key:
        return "empty key or NUL byte"
    if key.startswith("/") or "\\" in key or (len(key) > 1 and key[1] == ":"):
        return "absolute path"
    parts = key.split("/")   # not PurePosixPath: it folds "a//b" and "a/./b" into "a/b"
    if any(p in ("..", ".", "") for p in parts):
        return "path with '..' or '.' components"
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_KEY_BYTES:
        return f"{size} bytes long, more than {MAX_KEY_BYTES}"
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES for p in parts):
        return f"a component longer than {MAX_PART_BYTES} bytes"
    return None


def target_path(root: Path, rel: str) -> Path:
    """``root/rel``, creating the folders on the way, after checking that no existing component
    on the way is a symbolic link and that the result stays inside ``root``.

    Args:
        root: the output folder (exists).
        rel: a key that :func:`safe_relative` accepts.

    Raises:
        UsageError: a component on the way is a symbolic link, or the path resolves outside ``root``.
    """
    path = root
    for part in PurePosixPath(rel).parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise UsageError(f"{path} is a symbolic link")
        path.mkdir(exist_ok=True)
    path = path / PurePosixPath(rel).name
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path.parent)]) != real_root:
        raise UsageError(f"{path} resolves outside {root}")
    return path


def write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path``.

    Raises:
        FileExistsError: something (a file, a planted link) is already at ``path``.
    """
    # O_EXCL | O_NOFOLLOW: never follow a link planted at the name, never overwrite.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
