"""MDS input: finding the dataset (a folder with ``index.json``, or split folders) and reading
``index.json`` (version 2, what ``streaming.MDSWriter`` writes) into checked shard entries."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from packer.core import remote
from packer.core.errors import SourceError, UsageError
from packer.core.paths import safe_relative
from packer.core.records import loads_bounded
from packer.core.uri import redact
from packer.interchange.base import ScanOptions

NAME = "mds"
INDEX = "index.json"
KEY_COLUMN, METADATA_COLUMN = "key", "metadata"
INSTALL = "pip install 'packer-vision[mds]' (or: pip install mosaicml-streaming)"


def _index_head_is_mds(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return b'"shards"' in head and (b'"format": "mds"' in head or b'"format":"mds"' in head)


def _split_dirs(folder: str, limit: int = 64) -> list:
    """Sub-folders of ``folder`` holding an MDS ``index.json`` (the first ``limit`` looked at)."""
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []
    return [n for n in names[:limit] if _index_head_is_mds(os.path.join(folder, n, INDEX))]


def detect(path) -> bool:
    """True for an MDS ``index.json``, a folder holding one, or a folder of split folders that do."""
    try:
        text = os.fspath(path)
    except TypeError:
        return False
    if os.path.isfile(text):
        return os.path.basename(text) == INDEX and _index_head_is_mds(text)
    if not os.path.isdir(text):
        return False
    if os.path.isfile(os.path.join(text, INDEX)):
        return _index_head_is_mds(os.path.join(text, INDEX))
    return bool(_split_dirs(text, limit=16))


def _url_folder(path: str, options: ScanOptions) -> str:
    """:func:`dataset_folder` in a bucket: the prefix with ``index.json`` (``--split`` names a
    sub-prefix); split folders are not looked for (a listing per folder): ``--split`` names one."""
    folder = remote.parent(path) if path.endswith("/" + INDEX) else path.rstrip("/") + "/"
    if options.split:
        folder = remote.join(folder, options.split) + "/"
    if not remote.exists(remote.join(folder, INDEX), options.storage_options):
        raise UsageError(f"{redact(folder)}: no {INDEX} under this prefix (an MDS dataset in a bucket is the "
                         f"prefix holding {INDEX}; --split NAME reads NAME/{INDEX} under it)")
    return folder


def dataset_folder(path: str, options: ScanOptions) -> str:
    """The folder whose ``index.json`` is read (a prefix ending in ``/`` in a bucket).

    Raises:
        UsageError: nothing MDS at ``path``, an unknown ``--split``, or several splits and none chosen.
    """
    if remote.is_url(path):
        return _url_folder(path, options)
    if os.path.isfile(path) and os.path.basename(path) == INDEX:
        folder = os.path.dirname(os.path.abspath(path))
        if options.split:
            raise UsageError(f"{path}: --split {options.split!r} names a folder; give the dataset folder")
        return folder
    if not os.path.isdir(path):
        raise UsageError(f"{path}: no such MDS dataset folder (a folder with {INDEX})")
    splits = _split_dirs(path)
    if options.split:
        if options.split in splits:
            return os.path.join(path, options.split)
        raise UsageError(f"{path}: no split {options.split!r} (an MDS folder with {INDEX}); "
                         f"splits here: {', '.join(splits) or 'none'}")
    if os.path.isfile(os.path.join(path, INDEX)):
        return path
    if len(splits) == 1:
        return os.path.join(path, splits[0])
    if splits:
        raise UsageError(f"{path}: several MDS splits ({', '.join(splits)}); choose one with --split")
    raise UsageError(f"{path}: no {INDEX} here (not an MDS dataset)")


@dataclass
class Shard:
    """One ``index.json`` shard entry, checked."""

    first: int                  # global index of its first sample
    samples: int
    names: list
    encodings: list
    sizes: list                 # fixed byte size per column, None where variable
    compression: Optional[str]
    raw: dict                   # {"basename", "bytes", "hashes"}
    zip: Optional[dict]

    @property
    def shown(self) -> str:
        return (self.zip or self.raw)["basename"]


def _file_info(value, what: str) -> dict:
    if not isinstance(value, dict) or not isinstance(value.get("basename"), str):
        raise ValueError(f"{what}: expected {{basename, bytes, hashes}}")
    size, hashes = value.get("bytes"), value.get("hashes") or {}
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or not isinstance(hashes, dict):
        raise ValueError(f"{what}: 'bytes' must be a size, 'hashes' an object")
    why = safe_relative(value["basename"])
    if why:
        raise ValueError(f"{what}: basename {value['basename']!r} is no file of this folder ({why})")
    return {"basename": value["basename"], "bytes": size, "hashes": hashes}


def _shard_entry(obj, first: int) -> Shard:
    """Raises ValueError saying what is wrong with the entry."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if obj.get("format") != "mds":
        raise ValueError(f"format {obj.get('format')!r}: only 'mds' shards are read (not json/csv/tsv)")
    names, encodings, sizes = obj.get("column_names"), obj.get("column_encodings"), obj.get("column_sizes")
    if not (isinstance(names, list) and isinstance(encodings, list) and isinstance(sizes, list)
            and len(names) == len(encodings) == len(sizes) and names
            and all(isinstance(v, str) for v in names + encodings)
            and all(s is None or (isinstance(s, int) and not isinstance(s, bool) and s >= 0) for s in sizes)):
        raise ValueError("column_names / column_encodings / column_sizes are not lists of one length")
    samples = obj.get("samples")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"'samples' is {samples!r}, not a count")
    compression = obj.get("compression") or None
    raw = _file_info(obj.get("raw_data"), "raw_data")
    zip_info = _file_info(obj["zip_data"], "zip_data") if obj.get("zip_data") else None
    if zip_info and not compression:
        raise ValueError("zip_data without a compression")
    return Shard(first, samples, names, encodings, sizes, compression, raw, zip_info)


def index_path(folder: str) -> str:
    """``folder``'s ``index.json`` (a path, or a URL for a prefix in a bucket)."""
    return remote.join(folder, INDEX) if remote.is_url(folder) else os.path.join(folder, INDEX)


def read_index(folder: str, problems: list, storage_options: Optional[dict] = None) -> list:
    """The shards of ``folder/index.json``; bad entries go into ``problems``.

    Raises:
        SourceError: the index is unreadable, not JSON, or not a version 2 index.
    """
    path = index_path(folder)
    try:
        with remote.open_input(path, storage_options) as fh:
            obj = loads_bounded(fh.read().decode("utf-8"))
    except (OSError, ValueError, remote.RemoteError) as exc:   # UnicodeDecodeError, JSON errors: ValueErrors
        if isinstance(exc, remote.RemoteError) and exc.transient:
            raise
        raise SourceError(f"{redact(path)}: cannot read the MDS index: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("version") != 2 or not isinstance(obj.get("shards"), list):
        found = obj.get("version") if isinstance(obj, dict) else type(obj).__name__
        raise SourceError(f"{path}: not an MDS index of version 2 (version {found!r}; expected "
                          f"{{'version': 2, 'shards': [...]}})")
    shards, first = [], 0
    for i, entry in enumerate(obj["shards"]):
        try:
            shard = _shard_entry(entry, first)
        except ValueError as exc:
            problems.append({"path": f"{INDEX}:shards[{i}]", "reason": f"{exc}; shard skipped"})
            count = entry.get("samples") if isinstance(entry, dict) else None
            first += count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
            continue
        shards.append(shard)
        first += shard.samples
    return shards
