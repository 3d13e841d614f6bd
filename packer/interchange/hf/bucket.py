"""Hugging Face datasets in a bucket: which objects to read (one listing per prefix), and each
opened as a read-only file pinned to the version the listing gave.

The URL forms are the local ones: a prefix holding a ``save_to_disk`` folder (``state.json`` +
arrow files, or ``dataset_dict.json`` + one such folder per split), parquet files right under it
or in its ``data/`` folder (the hub layout), one parquet or arrow object, or a glob/brace pattern
(``s3://b/ds/data/train-{00000..00002}-of-00003.parquet``, ``s3://b/ds/data/*.parquet``).

A prefix is listed once (:func:`packer.core.remote.list_objects`, streamed; only the objects a
layout can use are kept: ``.parquet``, ``.arrow`` and ``.json`` names at most one folder down),
the JSON files are read whole in one GET each, and every later read of a data file (the scan's,
then the lazy reads of the build) asks for the ETag listed: a file replaced meanwhile is an error
naming it, never rows of two versions.

A row whose ``Image`` holds only a path (no bytes) is a problem in a bucket dataset: the path
names a file of the machine that wrote it, and a build never reads this machine's files for a
dataset in a bucket.
"""
from __future__ import annotations

import fnmatch
from collections import OrderedDict
from typing import Optional

from packer.core import remote
from packer.core.errors import SourceError
from packer.core.uri import redact
from packer.interchange.hf.layout import (
    MAX_JSON,
    Layout,
    chosen_split,
    files_layout,
    parse_json,
    split_of,
    state_files,
    state_split,
)
from packer.interchange.tfrecord.files import expand_braces, is_pattern

#: Read-ahead windows one opened object keeps (:class:`WindowedFile`).
WINDOWS = 4
_KEEP = (".parquet", ".arrow", ".json")


class WindowedFile(remote.RemoteFile):
    """A :class:`~packer.core.remote.RemoteFile` keeping :data:`WINDOWS` read-ahead windows,
    least recently used dropped first, instead of one buffer.

    pyarrow reads a row group's column chunks in turns (the image bytes a page buffer at a time,
    the label column in between): with one buffer every turn would fetch the image column's
    window again. Each window is one ranged GET of ``max(chunk, wanted)`` bytes pinned to the
    object's version, so streaming a file costs about ``ceil(size / chunk)`` GETs, and at most
    ``WINDOWS * chunk`` bytes are held.
    """

    def __init__(self, info: remote.ObjectInfo, storage_options: Optional[dict] = None, chunk: int = 0,
                 windows: int = WINDOWS):
        super().__init__(info, storage_options, chunk)
        self._windows: OrderedDict = OrderedDict()   # start -> bytes, the most recent last
        self._keep = max(1, windows)

    def _window(self, pos: int, want: int) -> tuple:
        for start, buf in self._windows.items():
            if start <= pos < start + len(buf):
                self._windows.move_to_end(start)
                return start, buf
        buf = self._fetch(pos, want)
        if not buf:
            raise remote.RemoteError(self.name, f"no bytes at offset {pos} of {self.size}", transient=True)
        self._windows[pos] = buf
        while len(self._windows) > self._keep:
            self._windows.popitem(last=False)
        return pos, buf

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError(f"{redact(self.name)}: read from a closed object")
        left = self.size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        parts, pos, want = [], self._pos, n
        while want > 0:
            start, buf = self._window(pos, want)
            part = buf[pos - start:pos - start + want]
            parts.append(part)
            pos += len(part)
            want -= len(part)
        self._pos = pos
        return b"".join(parts)

    def close(self) -> None:
        self._windows.clear()
        super().close()


def open_object(info: remote.ObjectInfo, storage_options: Optional[dict] = None) -> WindowedFile:
    """The object ``info`` names, opened pinned to ``info.version`` (no request until read)."""
    return WindowedFile(info, storage_options)


def _read_json(info: remote.ObjectInfo, storage_options) -> dict:
    raw = remote.read(info.url, 0, min(info.size, MAX_JSON), version=info.version, storage_options=storage_options)
    return parse_json(raw, redact(info.url))


def _listing(base: str, storage_options) -> dict:
    """The objects under the prefix ``base`` a layout can use: relative name -> ObjectInfo."""
    out = {}
    for info in remote.list_objects(base, storage_options):
        rel = info.url[len(base):]
        if rel.lower().endswith(_KEEP) and rel.count("/") <= 1:
            out[rel] = info
    return out


def _children(folder: str, storage_options) -> dict:
    """The objects right under the prefix ``folder``: URL -> ObjectInfo."""
    return {o.url: o for o in remote.list_objects(folder, storage_options) if "/" not in o.url[len(folder):]}


def _saved(base: str, sub: str, objects: dict, split: Optional[str], storage_options) -> Layout:
    """A ``save_to_disk`` folder at ``base + sub``: the arrow files in ``state.json`` order."""
    state_info = objects.get(sub + "state.json")
    if state_info is None:
        where = redact(base + sub + "state.json")
        raise SourceError(f"{where}: cannot read: no such object", [f"{where}: no such object"])
    state = _read_json(state_info, storage_options)
    files = [base + sub + n for n in state_files(state)]
    if not files:
        files = sorted(base + rel for rel in objects
                       if rel.startswith(sub) and rel.endswith(".arrow") and "/" not in rel[len(sub):])
    # a file state.json names but the bucket lacks is the scan's problem, named there
    found = {f: objects[f[len(base):]] for f in files if f[len(base):] in objects}
    return Layout(files, "arrow", state_split(state, split), base, found, storage_options)


def _prefix_layout(text: str, split: Optional[str], storage_options) -> Layout:
    base = text.rstrip("/") + "/"
    objects = _listing(base, storage_options)
    if "dataset_dict.json" in objects:
        dict_info = objects["dataset_dict.json"]
        splits = [s for s in _read_json(dict_info, storage_options).get("splits") or [] if isinstance(s, str)]
        chosen = chosen_split(splits, split, redact(text), redact(dict_info.url))
        return _saved(base, chosen + "/", objects, chosen, storage_options)
    if "state.json" in objects:
        return _saved(base, "", objects, split, storage_options)
    top = [rel for rel in objects if rel.endswith(".parquet") and "/" not in rel]
    data = [rel for rel in objects if rel.startswith("data/") and rel.endswith(".parquet")]
    files = [base + rel for rel in sorted(top) + sorted(data)]
    layout = files_layout(files, split, base, redact(text))
    layout.objects = {f: objects[f[len(base):]] for f in layout.files}
    layout.storage_options = storage_options
    return layout


def _pattern_layout(text: str, split: Optional[str], storage_options) -> Layout:
    patterns = expand_braces(text)
    listed: dict = {}
    for folder in dict.fromkeys(remote.parent(p) for p in patterns):   # one listing per folder
        listed.update(_children(folder, storage_options))
    files = sorted({u for p in patterns for u in listed if fnmatch.fnmatchcase(u, p)})
    files = [u for u in files if u.lower().endswith((".parquet", ".arrow"))]
    layout = files_layout(files, split, remote.parent(patterns[0]), redact(text))
    layout.objects = {f: listed[f] for f in layout.files}
    layout.storage_options = storage_options
    return layout


def url_layout(text: str, split: Optional[str], storage_options: Optional[dict] = None) -> Layout:
    """:func:`packer.interchange.hf.layout.find_layout` for a URL: a prefix (listed once), one
    parquet/arrow object (one HEAD), or a glob/brace pattern (one listing per folder it names).

    Raises:
        UsageError: an unknown split, or several and none chosen.
        SourceError: nothing readable there (a missing object named).
        RemoteError: the bucket cannot be reached within the retry budget.
    """
    if is_pattern(text):
        return _pattern_layout(text, split, storage_options)
    if not text.endswith("/") and text.lower().endswith((".parquet", ".arrow")):
        try:
            info = remote.stat(text, storage_options)
        except remote.RemoteError as exc:
            if exc.transient:
                raise
            raise SourceError(f"{redact(text)}: no parquet or arrow object there ({exc.reason})",
                              [f"{redact(text)}: {exc.reason}"]) from exc
        root = remote.parent(text)
        if text.lower().endswith(".arrow"):
            layout = Layout([text], "arrow", split or split_of(remote.basename(text)) or "train", root)
        else:
            layout = files_layout([text], split, root, redact(text))
        layout.objects, layout.storage_options = {text: info}, storage_options
        return layout
    return _prefix_layout(text, split, storage_options)
