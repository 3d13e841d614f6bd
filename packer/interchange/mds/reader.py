"""MDS scan: every sample of a dataset, its key, locator, label and metadata, damage listed."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from packer.core import remote
from packer.core.errors import UsageError
from packer.core.paths import safe_relative
from packer.core.records import UNLABELED_CLASS, loads_bounded
from packer.core.uri import redact
from packer.interchange.base import Scan, ScanOptions, class_ids, majority_kind, read_class_file
from packer.interchange.mds.columns import (
    Layout,
    coco_boxes,
    decode_ndarray,
    image_ext,
    label_value,
    layout_of,
    png_of_pil,
)
from packer.interchange.mds.index import METADATA_COLUMN, Shard, dataset_folder, index_path, read_index
from packer.interchange.mds.shards import FileShard, MemoryShard, decompress, hash_mismatch, pick_file
from packer.labels.limits import MAX_PER_IMAGE_BYTES

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    index: int               # global sample index
    key: Optional[str]       # from the key column
    ext: str
    locator: tuple
    display: str
    kind: Optional[str]
    label: object
    metadata: dict


class _ShardScan:
    """The samples of one shard file, parsed from its header and offsets."""

    def __init__(self, src, shard: Shard, layout: Layout, display: str, problems: list):
        self.src, self.shard, self.layout, self.display, self.problems = src, shard, layout, display, problems

    def offsets(self) -> np.ndarray:
        """The n + 1 sample offsets. Raises ValueError for a bad header."""
        n = int(np.frombuffer(self.src.read(0, 4), "<u4")[0])
        if n != self.shard.samples:
            raise ValueError(f"the shard says it holds {n} samples, index.json says {self.shard.samples}")
        offsets = np.frombuffer(self.src.read(4, 4 * (n + 1)), "<u4").astype(np.int64)
        if n and (offsets[0] < 4 * (n + 2) or np.any(np.diff(offsets) < 0)):
            raise ValueError("its sample offsets are out of order or point into its header")
        return offsets

    def spans(self, begin: int, end: int) -> list:
        """(offset, size) of each column of the sample at [begin, end)."""
        sizes = self.shard.sizes
        nvar = sum(1 for s in sizes if s is None)
        if end - begin < 4 * nvar:
            raise ValueError(f"{end - begin} bytes, less than its {nvar} column sizes")
        var = iter(np.frombuffer(self.src.read(begin, 4 * nvar), "<u4").tolist())
        pos, out = begin + 4 * nvar, []
        for size in sizes:
            size = next(var) if size is None else size
            out.append((pos, size))
            pos += size
        if pos != end:
            raise ValueError(f"its columns take {pos - begin} bytes, its offsets give it {end - begin}")
        return out

    def column(self, spans: list, i: int, limit: int = MAX_PER_IMAGE_BYTES) -> bytes:
        offset, size = spans[i]
        if size > limit:
            raise ValueError(f"column {self.shard.names[i]!r} holds {size} bytes, more than {limit}")
        return self.src.read(offset, size)

    def entry(self, j: int, begin: int, end: int) -> _Entry:
        """The sample ``j``. Raises ValueError / UnicodeDecodeError naming what is wrong."""
        lay, enc, where = self.layout, self.shard.encodings, f"{self.display}:sample {j}"
        spans = self.spans(begin, end)
        offset, size = spans[lay.image]
        if size == 0:
            raise ValueError(f"column {self.shard.names[lay.image]!r}: no image bytes")
        if enc[lay.image] == "pil":
            data = png_of_pil(self.src.read(offset, size))
            locator, ext = ("bytes", data), "png"
        else:
            locator = self.src.locator(offset, size)
            head = locator[1][:16] if locator[0] == "bytes" else self.src.read(offset, min(16, size))
            ext = image_ext(head, enc[lay.image])
        found = None
        if lay.label is not None:
            found = label_value(enc[lay.label], self.column(spans, lay.label), where)
        elif lay.coco is not None:
            a, b = lay.coco
            found = "boxes", coco_boxes(decode_ndarray(enc[a], self.column(spans, a)),
                                        decode_ndarray(enc[b], self.column(spans, b)), where)
        key = self.column(spans, lay.key).decode("utf-8") if lay.key is not None else None
        meta = {}
        if lay.metadata is not None:
            meta = loads_bounded(self.column(spans, lay.metadata).decode("utf-8"))
            if not isinstance(meta, dict):
                raise ValueError(f"column {METADATA_COLUMN!r}: expected a JSON object")
        kind, label = found if found else (None, None)
        return _Entry(self.shard.first + j, key, ext, locator, where, kind, label, meta)

    def entries(self, avail: int) -> list:
        """Every sample that reads; the others go into problems. ``avail``: bytes in the file."""
        offsets = self.offsets()
        out = []
        for j in range(self.shard.samples):
            begin, end = int(offsets[j]), int(offsets[j + 1])
            where = f"{self.display}:sample {j}"
            if end > avail:
                why = (f"cut short: the shard holds {avail} of its {self.shard.raw['bytes']} bytes, "
                       f"this sample ends at byte {end}; sample skipped")
                self.problems.append({"path": where, "reason": why})
                continue
            try:
                out.append(self.entry(j, begin, end))
            except (ValueError, UnicodeDecodeError) as exc:
                self.problems.append({"path": where, "reason": f"{exc}; sample skipped"})
        return out


def _join(folder: str, name: str) -> str:
    return remote.join(folder, name) if remote.is_url(folder) else os.path.join(folder, name)


def _scan_shard(folder: str, shard: Shard, layout: Layout, shown, result: Scan, objects=None, opts=None) -> list:
    """The entries of one shard; whole-shard damage is one problem naming the shard. ``objects``:
    the listing of a prefix in a bucket (URL -> ObjectInfo), whose shards are read pinned to it."""
    lost = f"its {shard.samples} sample(s) are left out"
    picked = pick_file(folder, shard, shown, objects)
    if picked is None:
        result.problems.append({"path": shown(_join(folder, shard.shown)),
                                "reason": f"listed in index.json but missing; {lost}", "kind": "unreadable"})
        return []
    try:
        return _read_shard(picked, shard, layout, result, lost, objects, opts)
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        result.problems.append({"path": picked.display, "reason": f"cannot read: {exc}; {lost}"})
        return []


def _read_shard(picked, shard: Shard, layout: Layout, result: Scan, lost: str, objects, opts) -> list:
    info = objects[picked.path] if objects is not None else None
    try:
        if info is not None:   # in a bucket: (URL, size, ETag) as listed, the ETag pinned for every read
            size = info.size
            result.fingerprint.append((picked.path, info.size, info.version))
        else:
            st = os.stat(picked.path)
            size = st.st_size
            result.fingerprint.append((os.path.abspath(picked.path), st.st_size, st.st_mtime_ns))
        cut = not picked.compressed and size < picked.expected
        if size != picked.expected and not cut:
            raise ValueError(f"{size} bytes, index.json says {picked.expected}; {lost}")
        if picked.compressed:   # read whole: its size is the index's, checked above (bounded)
            with remote.open_input(picked.path, opts, info=info) as fh:
                data = fh.read()
            bad = hash_mismatch(picked.path, picked.hashes, data)
            if bad:
                raise ValueError(f"{bad}; {lost}")
            try:
                raw = decompress(shard.compression, data, shard.raw["bytes"])
            except ValueError as exc:
                raise ValueError(f"{exc}; {lost}") from exc
            del data
            if len(raw) != shard.raw["bytes"]:
                found = f"more than {shard.raw['bytes']}" if len(raw) > shard.raw["bytes"] else len(raw)
                raise ValueError(f"decompresses to {found} bytes, index.json says {shard.raw['bytes']}; {lost}")
            src = MemoryShard(raw)
        else:
            bad = None if cut else hash_mismatch(picked.path, picked.hashes, storage_options=opts, info=info)
            if bad:
                raise ValueError(f"{bad}; {lost}")
            if cut:   # damage: its samples that lie whole before the cut are read, the rest listed
                unchecked = "; its hash cannot be checked" if picked.hashes else ""
                result.problems.append({"path": picked.display, "reason": (
                    f"{size} bytes, index.json says {picked.expected}: cut short, or the index "
                    f"overstates it{unchecked}")})
            src = FileShard(picked.path if info is not None else os.path.abspath(picked.path), size, opts, info)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        result.problems.append({"path": picked.display, "reason": reason})
        return []
    try:
        return _ShardScan(src, shard, layout, picked.display, result.problems).entries(src.size)
    except (OSError, ValueError) as exc:
        result.problems.append({"path": picked.display, "reason": f"bad shard header: {exc}; {lost}"})
        return []
    finally:
        src.close()


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List the samples of an MDS dataset (see the module docstring).

    Args:
        path: a folder with ``index.json``, that file, or a folder of split folders.
        options: ``split``, ``image_column``, ``label_column``, ``allow_unlabeled``.

    Returns:
        Scan, samples in index order; damaged shards and samples in ``problems``.

    Raises:
        UsageError: no MDS dataset at ``path``, an unknown split or column, no image column.
        SourceError: ``index.json`` is unreadable or not an MDS index.
        DependencyError: a compressed shard and no library for its codec.
    """
    options = options or ScanOptions()
    text, opts = os.fspath(path), options.storage_options
    folder = dataset_folder(text, options)
    url = remote.is_url(folder)
    base = (text.rstrip("/") + "/" if folder.startswith(text.rstrip("/") + "/") else folder) if url else \
        text if os.path.isdir(text) else folder
    result = Scan(root=text)

    def shown(p: str) -> str:
        if url:
            return p[len(base):] if p.startswith(base) else redact(p)
        rel = os.path.relpath(p, base)
        return Path(rel).as_posix() if not rel.startswith("..") else p

    shards = read_index(folder, result.problems, opts)
    # a prefix in a bucket is listed once: its shards' sizes and ETags (the ETags pinned for every read)
    objects = {o.url: o for o in remote.list_objects(folder, opts)} if url else None
    idx = index_path(folder)
    st = objects[idx] if url else remote.input_info(idx)
    result.fingerprint.append((idx if url else os.path.abspath(idx), st.size,
                               st.version if url else int(st.version)))
    layouts: dict = {}
    entries = []
    for shard in shards:
        sig = (tuple(shard.names), tuple(shard.encodings))
        if sig not in layouts:
            try:
                layouts[sig] = layout_of(shard, options)
            except UsageError as exc:
                if not layouts:   # the first shard's columns: the user must say which to read
                    raise
                result.problems.append({"path": shown(_join(folder, shard.shown)),
                                        "reason": f"its columns differ from the other shards': {exc}"})
                continue
        entries.extend(_scan_shard(folder, shard, layouts[sig], shown, result, objects, opts))
    names, names_file, bad = read_class_file(folder, unicode_lines=True, storage_options=opts, listed=objects)
    if bad:
        result.problems.append(bad)
    labeled = any(lay.label is not None or lay.coco is not None for lay in layouts.values())
    entries = _finish_labels(result, entries, names, names_file, labeled, options)
    _assign_keys(entries, sum(s.samples for s in shards))
    result.set_samples(entries)
    sources = sorted({_label_source(s, layouts[(tuple(s.names), tuple(s.encodings))]) for s in shards
                      if (tuple(s.names), tuple(s.encodings)) in layouts} - {None})
    result.label_source = "mds " + (", ".join(sources) or "unlabeled") + (f" + {names_file}" if names_file else "")
    if names_file:
        st = remote.input_info(_join(folder, names_file), opts)
        result.fingerprint.append((st.url if url else os.path.abspath(st.url), st.size,
                                   st.version if url else int(st.version)))
    return result


def _label_source(shard: Shard, layout: Layout) -> Optional[str]:
    if layout.label is not None:
        return f"{shard.names[layout.label]} ({shard.encodings[layout.label]})"
    return "bbox_sizes + bbox_labels (ndarray)" if layout.coco is not None else None


def _finish_labels(result: Scan, entries: list, names: Optional[list], names_file: str, labeled: bool,
                   options: ScanOptions) -> list:
    """Label schema, class ids and names; unlabeled and odd samples into problems. The kept entries."""
    schema = majority_kind(entries) or ("class" if labeled else "none")
    kept = []
    for e in entries:
        if e.kind is None and schema != "none":
            if not options.allow_unlabeled:
                result.problems.append({"path": e.display, "reason": "image without a label (-1 or null) while "
                                        "other samples have one (--allow-unlabeled keeps it)", "kind": "unlabeled"})
                continue
            e.label = UNLABELED_CLASS if schema == "class" else None
        elif e.kind is not None and e.kind != schema:
            result.problems.append({"path": e.display, "reason": f"a {e.kind} label, but the other samples have "
                                                                 f"{schema} labels; a store holds one kind"})
            continue
        kept.append(e)
    if schema == "class":
        kept, names = class_ids(kept, names, names_file, result.problems, untied="ids")
    result.label_schema = schema
    result.class_names = list(names or [])
    return kept


def _assign_keys(entries: list, total: int) -> None:
    """The key column's keys where every sample has a usable, unique one; else index-based keys."""
    keys = [e.key for e in entries]
    if all(k and safe_relative(k) is None for k in keys) and len(set(keys)) == len(keys):
        return
    if any(k is not None for k in keys):
        log.warning("MDS key column: missing, unsafe or repeated keys; samples are keyed by their index")
    width = max(8, len(str(max(total - 1, 0))))
    for e in entries:
        e.key = f"{e.index:0{width}d}.{e.ext}"
