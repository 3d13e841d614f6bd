"""Which files of a Hugging Face dataset to read (``save_to_disk`` folders, parquet files, folders
and patterns in the hub layout), and as which split."""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from packer.core.errors import SourceError, UsageError
from packer.core.records import loads_bounded
from packer.interchange.tfrecord.files import expand_braces, is_pattern

#: ``train-00000-of-00003.parquet`` / ``data-00000-of-00001.arrow``: the split before the number.
_SHARD_NAME = re.compile(r"^(?P<split>.+?)-\d+-of-\d+\.(?:parquet|arrow)$")
_SPLIT_NAMES = {"train", "test", "validation", "valid", "val", "dev"}
#: The group of parquet files whose names give no split (``part-0.parquet``).
_OTHER = "(files with no split in the name)"


def read_head(path: str, n: int = 8) -> bytes:
    """The first ``n`` bytes of ``path``."""
    with open(path, "rb") as fh:
        return fh.read(n)


def _is_parquet(path: str) -> bool:
    return path.endswith(".parquet") or read_head(path, 4) == b"PAR1"


def _is_arrow(path: str) -> bool:
    if not path.endswith(".arrow"):
        return False
    head = read_head(path, 6)
    return head[:4] == b"\xff\xff\xff\xff" or head == b"ARROW1"


def _parquet_in(folder: str) -> list:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".parquet"))
    return [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]


def detect_local(path) -> bool:
    """True for a local ``save_to_disk`` folder, a parquet file, folder or pattern (hub layout)."""
    text = os.fspath(path)
    try:
        if os.path.isdir(text):
            names = set(os.listdir(text))
            if "dataset_dict.json" in names or {"state.json", "dataset_info.json"} <= names:
                return True
            data = os.path.join(text, "data")
            return bool(_parquet_in(text)) or (os.path.isdir(data) and bool(_parquet_in(data)))
        if os.path.isfile(text):
            return _is_parquet(text) or _is_arrow(text)
        if is_pattern(text):
            found = _glob(text)
            return bool(found) and all(os.path.isfile(p) and _is_parquet(p) for p in found[:4])
    except OSError:
        return False
    return False


def split_of(name: str) -> Optional[str]:
    m = _SHARD_NAME.match(name)
    if m:
        return m.group("split")
    stem = name.rsplit(".", 1)[0]
    return stem if stem in _SPLIT_NAMES else None


def _choose(splits, wanted: Optional[str], where: str) -> str:
    """The split to read: ``wanted``, the only one, or ``train``."""
    splits = sorted(splits, key=str)
    if wanted is not None:
        if wanted not in splits:
            raise UsageError(f"{where}: no split {wanted!r}; splits: {', '.join(map(str, splits))}")
        return wanted
    if len(splits) == 1:
        return splits[0]
    if "train" in splits:
        return "train"
    raise UsageError(f"{where}: several splits ({', '.join(map(str, splits))}) and no 'train': "
                     f"name one with --split")


#: The most bytes of a ``state.json``/``dataset_dict.json`` read.
MAX_JSON = 1 << 24


def _load_json(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JSON)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc}", [f"{path}: {exc}"]) from exc
    return parse_json(raw, path)


def _glob(pattern: str) -> list:
    """The files a glob or brace pattern matches, sorted, each once."""
    found = set()
    for pat in expand_braces(pattern):
        found.update(p for p in glob.glob(pat) if os.path.isfile(p))
    return sorted(found)


def parse_json(raw: bytes, where: str) -> dict:
    """A ``state.json``/``dataset_dict.json`` read as ``raw``; SourceError naming ``where`` else."""
    try:
        value = loads_bounded(raw)
    except ValueError as exc:
        raise SourceError(f"{where}: cannot read: {exc}", [f"{where}: {exc}"]) from exc
    if not isinstance(value, dict):
        raise SourceError(f"{where}: expected a JSON object", [f"{where}: not a JSON object"])
    return value


@dataclass
class Layout:
    """The files of the chosen split and how to read them.

    In a bucket, ``objects`` holds each file's :class:`~packer.core.remote.ObjectInfo` as listed
    (its size and the version every read of it is pinned to), ``storage_options`` fsspec's."""

    files: list          # in reading order
    kind: str            # "parquet" | "arrow"
    split: str           # for keys of rows with no path
    root: str            # displays are relative to this (in a bucket: a prefix ending in "/")
    objects: dict = field(default_factory=dict)
    storage_options: Optional[dict] = None


def state_files(state: dict) -> list:
    """The arrow file names a ``state.json`` lists, in order (names with a ``/`` left out)."""
    names = [d.get("filename") for d in state.get("_data_files") or [] if isinstance(d, dict)]
    return [n for n in names if isinstance(n, str) and "/" not in n and n not in ("", "..")]


def state_split(state: dict, split: Optional[str]) -> str:
    """The split a ``save_to_disk`` folder's rows are keyed by: ``split``, else the saved one."""
    saved = state.get("_split") if isinstance(state.get("_split"), str) else None
    return split or saved or "train"


def _saved_dataset(folder: str, split: Optional[str]) -> Layout:
    """A ``Dataset.save_to_disk`` folder: the arrow files in ``state.json`` order."""
    state = _load_json(os.path.join(folder, "state.json"))
    files = [os.path.join(folder, n) for n in state_files(state)]
    if not files:
        files = sorted(glob.glob(os.path.join(glob.escape(folder), "*.arrow")))
    return Layout(files, "arrow", state_split(state, split), folder)


def chosen_split(splits: list, split: Optional[str], where: str, dict_file: str) -> str:
    """The split of a ``DatasetDict`` folder to read (a name that is no folder is refused)."""
    chosen = _choose(splits, split, where)
    if "/" in chosen or chosen in ("", ".", ".."):
        raise SourceError(f"{dict_file}: bad split name {chosen!r}", [f"{dict_file}: split {chosen!r}"])
    return chosen


def find_layout(text: str, split: Optional[str]) -> Layout:
    """Which files to read, and as which split.

    A URL is :func:`packer.interchange.hf.bucket.url_layout`'s.

    Raises:
        UsageError: an unknown split, or several and none chosen.
        SourceError: nothing readable there.
    """
    if os.path.isdir(text):
        dict_file = os.path.join(text, "dataset_dict.json")
        if os.path.isfile(dict_file):
            splits = [s for s in _load_json(dict_file).get("splits") or [] if isinstance(s, str)]
            chosen = chosen_split(splits, split, text, dict_file)
            layout = _saved_dataset(os.path.join(text, chosen), chosen)
            layout.root = text
            return layout
        if os.path.isfile(os.path.join(text, "state.json")):
            return _saved_dataset(text, split)
        files = _parquet_in(text) + (_parquet_in(os.path.join(text, "data"))
                                     if os.path.isdir(os.path.join(text, "data")) else [])
        root = text
    elif os.path.isfile(text):
        files, root = [text], os.path.dirname(text)
        if _is_arrow(text):
            return Layout(files, "arrow", split or split_of(os.path.basename(text)) or "train", root)
    else:
        files, root = _glob(text), os.path.dirname(text)
    return files_layout(files, split, root, text)


def files_layout(files: list, split: Optional[str], root: str, where: str) -> Layout:
    """Parquet files (or a pattern's arrow files) as a layout: grouped by the split their names
    give, one group chosen (see :func:`_choose`).

    Raises:
        SourceError: no file; UsageError: as :func:`_choose`.
    """
    if not files:
        raise SourceError(f"{where}: no parquet or arrow file found", [f"{where}: nothing to read"])
    if all(f.endswith(".arrow") for f in files):   # a pattern of arrow files
        return Layout(files, "arrow", split or "train", root)
    groups: dict = {}
    for f in files:
        groups.setdefault(split_of(f.replace(os.sep, "/").rpartition("/")[2]) or _OTHER, []).append(f)
    if len(groups) == 1 and split is None:
        (name, chosen), = groups.items()
        return Layout(chosen, "parquet", name if name != _OTHER else "train", root)
    name = _choose(list(groups), split, where)
    return Layout(groups[name], "parquet", name if name != _OTHER else "train", root)
