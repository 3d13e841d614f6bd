"""MosaicML MDS (``streaming``) datasets as a build source and an export target.

**In** (``packer build SRC --from mds``): SRC is a folder holding ``index.json`` (version 2, the
index ``streaming.MDSWriter`` writes), the ``index.json`` file itself, or a folder of split
folders that each hold one (``train/``, ``val/``: ``--split`` picks one; a single one is taken).
The index and the shards are read here, without ``streaming`` (importing it pulls in torch and
transformers): a shard is ``uint32 n``, ``n + 1`` ``uint32`` absolute sample offsets, the
writer's JSON config, then the samples; a sample is one ``uint32`` size per variable-size column
followed by the column payloads, columns in ``column_names`` order (what
``streaming/base/format/mds/{writer,reader}.py`` write and read).

* image column: ``ScanOptions.image_column``, else the one column encoded ``jpeg``, ``png`` or
  ``pil``, else the first of the names ``image img jpg jpeg png webp x`` encoded ``bytes``.
  ``jpeg``/``png``/``bytes`` payloads are the image file's bytes: an uncompressed shard gives
  ``("range", shard, offset, size)`` locators and the scan never reads them (16 bytes each are
  read to tell the type for a made-up key). ``pil`` (``streaming``'s raw-pixel encoding: width,
  height, mode, pixels) is decoded and re-encoded as lossless PNG here (as ``streaming``'s own
  decoder does it, ``Image.frombytes``), so those samples carry their bytes (``("bytes", png)``);
* label column: ``ScanOptions.label_column``, else the first of ``label labels y class cls target
  category`` encoded as an integer (``int``, ``int8`` ... ``uint64``, ``str_int``: a class id, ``-1``
  = unlabeled), ``str`` (a class name) or ``json`` (a class id or name, ``{"boxes": [[c, cx, cy,
  w, h], ...]}`` normalized YOLO rows, a bare list of such rows, a packer label-model dict
  ``{"objects": [...]}``, ``{"class": ...}``, or ``null`` = unlabeled); else ``streaming``'s own
  COCO layout (``bbox_sizes``: ``ndarray`` of normalized ``[left, top, right, bottom]``,
  ``bbox_labels``: ``ndarray`` of ids), which becomes YOLO rows ``c cx cy w h`` (computed in
  float64). No label column at all: label schema ``"none"``, no problem;
* keys: the ``key`` column (``str``, what :func:`export` writes) when every sample has a usable,
  unique one; otherwise ``<global sample index, 8+ digits>.<ext>`` for every sample (the index
  ``StreamingDataset`` gives the sample; ``ext`` from the image's magic bytes or encoding, ``png``
  for ``pil``), numbered by ``index.json``'s counts so a missing shard does not renumber the rest;
* ``metadata`` column (``json`` object): the record's metadata;
* class names: ``classes.json`` (a JSON list) or ``classes.txt`` (one name a line) beside
  ``index.json``. MDS has no dataset-level slot for them: ``StreamingDataset`` ignores unknown keys
  in ``index.json``, but ``MDSWriter`` and ``streaming.base.util.merge_index`` rewrite the index
  and drop them, so a side file (the WebDataset export's convention too) is the one that survives.

Compressed shards (``zip_data``: ``zstd``, ``gz``, ``bz2``, ``br``, ``snappy``) are decompressed one
at a time (the codec library ``streaming`` uses; gzip/bz2/brotli bounded by the index's raw size)
and their samples carry their image bytes (``("bytes", data)``); where the decompressed
``raw_data`` file lies beside it (``StreamingDataset``'s local cache), that file is read instead.

Damage is listed in ``Scan.problems`` by shard (``shard.00003.mds``) or shard and sample
(``shard.00003.mds:sample 17``) and the scan goes on: a shard listed in the index but missing; a
shard whose size or hash (the first of ``raw_data.hashes`` / ``zip_data.hashes`` this Python can
compute, e.g. ``xxh64`` or ``sha1``; ``streaming``'s algorithms) does not match ``index.json``
(one problem for the shard, whose samples are all left out: which bytes changed is unknown); a
compressed shard that does not decompress; a bad header or offset table; an uncompressed shard
cut short (its samples that lie whole before the cut are kept, unhashed; each sample past the
cut is one problem, naming shard and sample); a sample whose column sizes do
not add up, whose label does not parse or (unless ``allow_unlabeled``) that has no label; an
unsafe shard name (absolute or with ``..``).

**Out** (``packer export STORE OUT --to mds --shard-size N``): written by ``streaming.MDSWriter``
(``hashes=["sha1", "xxh64"]``, no compression: JPEG bytes do not shrink, and uncompressed shards
import by byte range), read back by ``streaming.StreamingDataset(local=OUT)``. Columns:

* ``image``: ``jpeg``, the stored bytes as they are (``StreamingDataset`` gives a PIL image; the
  bytes are the stored file); a store of decoded pixels gives lossless ``png``;
* ``label``: ``int`` class id for class stores (``-1`` = unlabeled), ``json``
  ``{"boxes": [[c, cx, cy, w, h], ...]}`` for box stores (every float32 bit kept: JSON floats
  are written as the shortest text that reads back as the same float32), the label-model dict
  for ``objects`` stores; no column for unlabeled stores;
* ``key``: ``str``, the record key; ``metadata``: ``json``, the record's metadata (``{}``);
* ``classes.json`` beside ``index.json``: the store's class names (when it has any).

One shard per ``shard_size`` samples, exactly (the writer is flushed every ``shard_size``
samples): ``MDSWriter``'s own ``size_limit`` counts bytes (64 MiB by default, which is what
``streaming`` recommends; pick ``--shard-size`` accordingly); it is kept only as the format's
hard cap, 4 GiB - 1 (sample offsets are ``uint32``), and a shard that would pass it is split
there. MDS names shards ``shard.NNNNN.mds``, so ``ExportOptions.prefix`` is not used. Files are
written in ``OUT/.mds.partial`` and moved into OUT when all are written, ``index.json`` last.

Example:
    >>> from packer.interchange import get_format, ScanOptions, ExportOptions   # doctest: +SKIP
    >>> scan = get_format("mds").scan("mds_train/", ScanOptions())             # doctest: +SKIP
    >>> with open_store("train.lmdb") as reader:                               # doctest: +SKIP
    ...     get_format("mds").export(reader, "mds_out", ExportOptions(shard_size=1000)).shards
"""
from __future__ import annotations

import bz2
import hashlib
import io
import json
import logging
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from ..diskspace import disk_full, is_disk_full, require_room
from ..errors import DependencyError, RecordError, SourceError, UsageError
from ..export import safe_relative
from ..labels.limits import MAX_PER_IMAGE_BYTES
from ..outputs import check_output
from ..records import UNLABELED_CLASS, loads_bounded
from ..sources import parse_label_json
from .base import ExportOptions, ExportResult, Scan, ScanOptions, InterchangeFormat

log = logging.getLogger(__name__)

NAME = "mds"
INDEX = "index.json"
#: Class-name side files, in the order they are looked for (export writes the first).
CLASS_FILES = ("classes.json", "classes.txt")
IMAGE_ENCODINGS = ("jpeg", "png", "pil")
IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp", "x")
LABEL_NAMES = ("label", "labels", "y", "class", "cls", "target", "category")
KEY_COLUMN, METADATA_COLUMN = "key", "metadata"
COCO_COLUMNS = ("bbox_sizes", "bbox_labels")
EXPORT_HASHES = ("sha1", "xxh64")
#: Largest shard MDS can address (uint32 offsets); MDSWriter refuses a size_limit >= 2**32.
SIZE_CAP = (1 << 32) - 1
_INT_ENCODINGS = {"int": "<i8", "int8": "i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
                  "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8"}
_LABEL_ENCODINGS = (*_INT_ENCODINGS, "str_int", "str", "json")
#: streaming's NDArray dtype codes (encodings.NDArray._int2value_dtype).
_ND_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
              34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
#: Hashes tried first (fast); any other hashlib/xxhash name streaming allows works too.
_HASH_ORDER = ("xxh3_64", "xxh3_128", "xxh128", "xxh64", "xxh32", "md5", "sha1")
#: Bytes per pixel of the PIL modes streaming's ``pil`` encoding may hold ("1" packs 8 a byte).
_PIL_BYTES = {"L": 1, "P": 1, "LA": 2, "PA": 2, "La": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
              "RGBA": 4, "RGBa": 4, "RGBX": 4, "CMYK": 4, "I": 4, "F": 4, "I;16": 2, "I;16L": 2,
              "I;16B": 2, "I;16N": 2}
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"BM", "bmp"),
          (b"II*\x00", "tif"), (b"MM\x00*", "tif"))
_INSTALL = "pip install 'packer-vision[interchange]' (or: pip install mosaicml-streaming)"


# ---------------------------------------------------------------------------------------------
# Finding the dataset and reading index.json


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


def _dataset_folder(path: str, options: ScanOptions) -> str:
    """The folder whose ``index.json`` is read.

    Raises:
        UsageError: nothing MDS at ``path``, an unknown ``--split``, or several splits and none chosen.
    """
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
class _Shard:
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


def _shard_entry(obj, first: int) -> _Shard:
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
    return _Shard(first, samples, names, encodings, sizes, compression, raw, zip_info)


def _read_index(folder: str, problems: list) -> list:
    """The shards of ``folder/index.json``; bad entries go into ``problems``.

    Raises:
        SourceError: the index is unreadable, not JSON, or not a version 2 index.
    """
    path = os.path.join(folder, INDEX)
    try:
        with open(path, "rb") as fh:
            obj = loads_bounded(fh.read().decode("utf-8"))
    except (OSError, ValueError) as exc:   # UnicodeDecodeError and JSON errors are ValueErrors
        raise SourceError(f"{path}: cannot read the MDS index: {exc}") from exc
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


def _read_class_file(folder: str) -> tuple:
    """``(names or None, file name, problem or None)`` of the class-name side file."""
    for name in CLASS_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            if os.path.getsize(path) > MAX_PER_IMAGE_BYTES:
                raise ValueError(f"more than {MAX_PER_IMAGE_BYTES} bytes")
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8-sig")
            if name.endswith(".json"):
                names = loads_bounded(text)
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError("expected a JSON list of class names")
            else:
                names = [ln.strip() for ln in text.splitlines() if ln.strip()]
        except (OSError, ValueError) as exc:
            return None, name, {"path": name, "reason": f"unreadable class-name file: {exc}"}
        return names, name, None
    return None, "", None


# ---------------------------------------------------------------------------------------------
# Columns


@dataclass(frozen=True)
class _Layout:
    """Which columns of a shard hold what (column positions)."""

    image: int
    label: Optional[int] = None
    coco: Optional[tuple] = None
    key: Optional[int] = None
    metadata: Optional[int] = None


def _image_column(names: list, encodings: list, options: ScanOptions) -> int:
    if options.image_column:
        if options.image_column not in names:
            raise UsageError(f"--image-column {options.image_column!r}: no such column (columns: {', '.join(names)})")
        i = names.index(options.image_column)
        if encodings[i] not in (*IMAGE_ENCODINGS, "bytes"):
            raise UsageError(f"--image-column {options.image_column!r} is encoded {encodings[i]!r}; "
                             f"images are read from {', '.join(IMAGE_ENCODINGS)} or bytes columns")
        return i
    found = [i for i, e in enumerate(encodings) if e in IMAGE_ENCODINGS]
    if len(found) > 1:
        named = [i for n in IMAGE_NAMES for i in found if names[i] == n]
        if not named:
            raise UsageError(f"several image columns ({', '.join(names[i] for i in found)}); "
                             f"choose one with --image-column")
        found = named[:1]
    if not found:
        found = [names.index(n) for n in IMAGE_NAMES if n in names and encodings[names.index(n)] == "bytes"][:1]
    if not found:
        shown = ", ".join(f"{n} ({e})" for n, e in zip(names, encodings))
        raise UsageError(f"no image column (encoded {', '.join(IMAGE_ENCODINGS)}, or bytes named "
                         f"{'/'.join(IMAGE_NAMES)}) among: {shown}; name one with --image-column")
    return found[0]


def _label_column(names: list, encodings: list, options: ScanOptions) -> tuple:
    """(label column or None, COCO column pair or None)."""
    if options.label_column:
        if options.label_column not in names:
            raise UsageError(f"--label-column {options.label_column!r}: no such column (columns: {', '.join(names)})")
        i = names.index(options.label_column)
        if encodings[i].split(":")[0] not in _LABEL_ENCODINGS:
            raise UsageError(f"--label-column {options.label_column!r} is encoded {encodings[i]!r}; labels are "
                             f"read from integer, str, str_int or json columns")
        return i, None
    for name in LABEL_NAMES:
        if name in names and encodings[names.index(name)] in _LABEL_ENCODINGS:
            return names.index(name), None
    if all(c in names for c in COCO_COLUMNS) and all(
            encodings[names.index(c)].split(":")[0] == "ndarray" for c in COCO_COLUMNS):
        return None, tuple(names.index(c) for c in COCO_COLUMNS)
    return None, None


def _layout(shard: _Shard, options: ScanOptions) -> _Layout:
    names, enc = shard.names, shard.encodings
    image = _image_column(names, enc, options)
    label, coco = _label_column(names, enc, options)
    key = names.index(KEY_COLUMN) if KEY_COLUMN in names and enc[names.index(KEY_COLUMN)] == "str" else None
    meta = (names.index(METADATA_COLUMN) if METADATA_COLUMN in names and enc[names.index(METADATA_COLUMN)] == "json"
            else None)
    return _Layout(image, label, coco, key, meta)


def _ndarray(encoding: str, raw: bytes) -> np.ndarray:
    """Decode streaming's ``ndarray[:dtype[:shape]]`` encoding (encodings.NDArray)."""
    args = encoding.split(":")[1:]
    dtype = args[0] if args and args[0] else None
    shape = tuple(int(v) for v in args[1].split(",")) if len(args) > 1 else None
    i = 0
    if dtype is None:
        if not raw or raw[0] not in _ND_DTYPES:
            raise ValueError("ndarray: unknown dtype code")
        dtype, i = _ND_DTYPES[raw[0]], 1
    if shape is None:
        if len(raw) <= i:
            raise ValueError("ndarray: no shape")
        ndim, code = raw[i] >> 2, raw[i] & 3
        width = 1 << code
        dims = np.frombuffer(raw[i + 1:i + 1 + ndim * width], f"<u{width}")
        if len(dims) != ndim:
            raise ValueError("ndarray: shape cut short")
        shape, i = tuple(int(d) for d in dims), i + 1 + ndim * width
    item = np.dtype(dtype).newbyteorder("<")
    if (len(raw) - i) != int(np.prod(shape)) * item.itemsize:
        raise ValueError(f"ndarray: {len(raw) - i} bytes for a {dtype} array of shape {shape}")
    return np.frombuffer(raw[i:], item).reshape(shape)


def _label_of_json(value, where: str):
    """(kind, label) of a JSON label value, or None for ``null`` (unlabeled)."""
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("objects"), list) and "boxes" not in value:
        return "objects", value
    if isinstance(value, list) or (isinstance(value, dict) and "boxes" in value):
        return "boxes", parse_label_json(value, where)
    return "class", parse_label_json(value, where)


def _label_value(encoding: str, raw: bytes, where: str):
    """(kind, label) of a label column's payload, or None when unlabeled. Raises ValueError."""
    base = encoding.split(":")[0]
    if base in _INT_ENCODINGS or base == "str_int":
        if base == "str_int":
            value = int(raw.decode("ascii").strip())
        else:
            value = int(np.frombuffer(raw, _INT_ENCODINGS[base])[0])
        if value == UNLABELED_CLASS:
            return None
        return "class", parse_label_json(value, where)
    text = raw.decode("utf-8")
    if base == "str":
        return ("class", parse_label_json(text, where)) if text.strip() else None
    return _label_of_json(loads_bounded(text), where)


def _coco_boxes(sizes: np.ndarray, ids: np.ndarray, where: str) -> np.ndarray:
    """streaming's COCO columns (normalized l, t, r, b + ids) -> YOLO rows ``c cx cy w h``."""
    box = np.asarray(sizes, np.float64).reshape(-1, 4)
    ids = np.asarray(ids).reshape(-1)
    if len(ids) != len(box):
        raise ValueError(f"{where}: {len(box)} boxes but {len(ids)} box labels")
    rows = [[int(c), (l + r) / 2, (t + b) / 2, r - l, b - t] for c, (l, t, r, b) in zip(ids.tolist(), box.tolist())]
    return parse_label_json(rows, where)


def _png_of_pil(raw: bytes) -> bytes:
    """streaming's ``pil`` payload (uint32 width, height, mode length; mode; pixels) as PNG bytes."""
    from PIL import Image

    if len(raw) < 12:
        raise ValueError("pil: header cut short")
    width, height, msize = (int(v) for v in np.frombuffer(raw[:12], "<u4"))
    try:
        mode = raw[12:12 + msize].decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("pil: the mode is not text") from None
    if mode == "1":
        want = (width + 7) // 8 * height
    elif mode in _PIL_BYTES:
        want = width * height * _PIL_BYTES[mode]
    else:
        raise ValueError(f"pil: unknown image mode {mode!r}")
    have = len(raw) - 12 - msize
    if have != want or not width or not height:
        raise ValueError(f"pil: a {mode} {width}x{height} image needs {want} pixel bytes, the sample holds {have}")
    img = Image.frombytes(mode, (width, height), raw[12 + msize:])
    if mode in ("RGBX", "CMYK", "YCbCr", "LAB", "HSV"):
        img = img.convert("RGB")   # PNG has no such mode
    buf = io.BytesIO()
    try:
        img.save(buf, format="PNG", compress_level=1)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"pil: a {mode} image cannot be written as PNG ({exc})") from exc
    return buf.getvalue()


def _image_ext(head: bytes, encoding: str) -> str:
    for magic, ext in _MAGIC:
        if head.startswith(magic):
            return ext
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return {"jpeg": "jpg", "png": "png"}.get(encoding, "bin")


# ---------------------------------------------------------------------------------------------
# Shards: files, hashes, decompression


def _hasher(algo: str):
    if algo.startswith("shake_"):
        return None
    if hasattr(hashlib, algo):
        return getattr(hashlib, algo)()
    try:
        import xxhash
    except ImportError:
        return None
    return getattr(xxhash, algo)() if algo in xxhash.algorithms_available else None


def _hash_mismatch(path: str, hashes: dict, data: Optional[bytes] = None) -> Optional[str]:
    """Why the file's hash differs from the index's, or None (equal, or no hash computable here)."""
    order = [a for a in _HASH_ORDER if a in hashes] + sorted(a for a in hashes if a not in _HASH_ORDER)
    for algo in order:
        h = _hasher(algo)
        if h is None:
            continue
        if data is not None:
            h.update(data)
        else:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        got, want = h.hexdigest(), str(hashes[algo]).lower()
        return None if got == want else f"its {algo} {got} does not match index.json's {want}"
    if hashes:
        log.warning("%s: none of the hashes %s can be computed here; not checked", path, sorted(hashes))
    return None


def _decompress(compression: str, data: bytes, size: int) -> bytes:
    """``data`` decompressed with streaming's codec ``compression`` (``zstd:7`` -> zstd), at most
    ``size + 1`` bytes where the codec can stop early.

    Raises:
        ValueError: the data does not decompress; DependencyError: the codec library is missing.
    """
    family = compression.split(":")[0]
    errors = (OSError, EOFError, MemoryError, zlib.error)
    try:
        if family == "gz":
            out = zlib.decompressobj(wbits=31).decompress(data, size + 1)
        elif family == "bz2":
            out = bz2.BZ2Decompressor().decompress(data, size + 1)
        elif family == "zstd":
            zstd = _codec("zstd", "zstd")
            errors += (zstd.Error,)
            out = zstd.decompress(data)
        elif family == "br":
            brotli = _codec("brotli", "Brotli")
            errors += (brotli.error,)
            out = brotli.Decompressor().process(data, output_buffer_limit=size + 1)
        elif family == "snappy":
            snappy = _codec("snappy", "python-snappy")
            errors += (snappy.UncompressError,)
            out = snappy.decompress(data)
        else:
            raise ValueError(f"unknown compression {compression!r}")
    except errors as exc:
        raise ValueError(f"does not decompress as {family}: {exc}") from exc
    return bytes(out)


def _codec(module: str, package: str):
    try:
        return __import__(module)
    except ImportError as exc:
        raise DependencyError(f"reading {module}-compressed MDS shards needs the {package} package: "
                              f"{_INSTALL}") from exc


class _FileShard:
    """An uncompressed shard file: reads by offset; images become byte ranges."""

    def __init__(self, path: str, size: int):
        self.path, self.size = path, size
        self.fh = open(path, "rb", buffering=1 << 16)

    def read(self, offset: int, size: int) -> bytes:
        self.fh.seek(offset)
        data = self.fh.read(size)
        if len(data) != size:
            raise ValueError(f"cut short: {size} bytes expected at offset {offset}, {len(data)} found")
        return data

    def locator(self, offset: int, size: int) -> tuple:
        return ("range", self.path, offset, size)

    def close(self) -> None:
        self.fh.close()


class _MemoryShard:
    """A decompressed shard in memory: images carry their bytes."""

    def __init__(self, data: bytes):
        self.view, self.size = memoryview(data), len(data)

    def read(self, offset: int, size: int) -> bytes:
        if offset + size > self.size:
            raise ValueError(f"cut short: {size} bytes expected at offset {offset}, {self.size - offset} found")
        return bytes(self.view[offset:offset + size])

    def locator(self, offset: int, size: int) -> tuple:
        return ("bytes", self.read(offset, size))

    def close(self) -> None:
        self.view.release()


@dataclass
class _ShardFile:
    """Which file of a shard is read, and how."""

    path: str
    display: str
    compressed: bool
    expected: int        # bytes index.json gives that file
    hashes: dict


def _pick_file(folder: str, shard: _Shard, shown) -> Optional[_ShardFile]:
    """The raw file where it lies there (StreamingDataset's cache), else the compressed one."""
    raw = os.path.join(folder, shard.raw["basename"])
    if os.path.isfile(raw) and (not shard.zip or os.path.getsize(raw) == shard.raw["bytes"]):
        return _ShardFile(raw, shown(raw), False, shard.raw["bytes"], shard.raw["hashes"])
    if shard.zip:
        path = os.path.join(folder, shard.zip["basename"])
        if os.path.isfile(path):
            return _ShardFile(path, shown(path), True, shard.zip["bytes"], shard.zip["hashes"])
    return None


# ---------------------------------------------------------------------------------------------
# Scan


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

    def __init__(self, src, shard: _Shard, layout: _Layout, display: str, problems: list):
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
            data = _png_of_pil(self.src.read(offset, size))
            locator, ext = ("bytes", data), "png"
        else:
            locator = self.src.locator(offset, size)
            head = locator[1][:16] if locator[0] == "bytes" else self.src.read(offset, min(16, size))
            ext = _image_ext(head, enc[lay.image])
        found = None
        if lay.label is not None:
            found = _label_value(enc[lay.label], self.column(spans, lay.label), where)
        elif lay.coco is not None:
            a, b = lay.coco
            found = "boxes", _coco_boxes(_ndarray(enc[a], self.column(spans, a)),
                                         _ndarray(enc[b], self.column(spans, b)), where)
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


def _scan_shard(folder: str, shard: _Shard, layout: _Layout, shown, result: Scan) -> list:
    """The entries of one shard; whole-shard damage is one problem naming the shard."""
    lost = f"its {shard.samples} sample(s) are left out"
    picked = _pick_file(folder, shard, shown)
    if picked is None:
        result.problems.append({"path": shown(os.path.join(folder, shard.shown)),
                                "reason": f"listed in index.json but missing; {lost}", "kind": "unreadable"})
        return []
    try:
        st = os.stat(picked.path)
        result.fingerprint.append((os.path.abspath(picked.path), st.st_size, st.st_mtime_ns))
        cut = not picked.compressed and st.st_size < picked.expected
        if st.st_size != picked.expected and not cut:
            raise ValueError(f"{st.st_size} bytes, index.json says {picked.expected}; {lost}")
        if picked.compressed:
            with open(picked.path, "rb") as fh:
                data = fh.read()
            bad = _hash_mismatch(picked.path, picked.hashes, data)
            if bad:
                raise ValueError(f"{bad}; {lost}")
            raw = _decompress(shard.compression, data, shard.raw["bytes"])
            del data
            if len(raw) != shard.raw["bytes"]:
                raise ValueError(f"decompresses to {len(raw)} bytes, index.json says {shard.raw['bytes']}; {lost}")
            src = _MemoryShard(raw)
        else:
            bad = None if cut else _hash_mismatch(picked.path, picked.hashes)
            if bad:
                raise ValueError(f"{bad}; {lost}")
            if cut:   # its samples that lie whole before the cut are kept (unhashed), the rest listed
                log.warning("%s: cut short (%d of %d bytes); its hash cannot be checked", picked.display,
                            st.st_size, picked.expected)
            src = _FileShard(os.path.abspath(picked.path), st.st_size)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
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
    text = os.fspath(path)
    folder = _dataset_folder(text, options)
    base = text if os.path.isdir(text) else folder
    result = Scan(root=text)

    def shown(p: str) -> str:
        rel = os.path.relpath(p, base)
        return Path(rel).as_posix() if not rel.startswith("..") else p

    shards = _read_index(folder, result.problems)
    idx = os.path.join(folder, INDEX)
    st = os.stat(idx)
    result.fingerprint.append((os.path.abspath(idx), st.st_size, st.st_mtime_ns))
    layouts: dict = {}
    entries = []
    for shard in shards:
        sig = (tuple(shard.names), tuple(shard.encodings))
        if sig not in layouts:
            try:
                layouts[sig] = _layout(shard, options)
            except UsageError as exc:
                if not layouts:   # the first shard's columns: the user must say which to read
                    raise
                result.problems.append({"path": shown(os.path.join(folder, shard.shown)),
                                        "reason": f"its columns differ from the other shards': {exc}"})
                continue
        entries.extend(_scan_shard(folder, shard, layouts[sig], shown, result))
    names, names_file, bad = _read_class_file(folder)
    if bad:
        result.problems.append(bad)
    labeled = any(lay.label is not None or lay.coco is not None for lay in layouts.values())
    entries = _finish_labels(result, entries, names, names_file, labeled, options)
    _assign_keys(entries, sum(s.samples for s in shards))
    result.keys = [e.key for e in entries]
    result.locators = [e.locator for e in entries]
    result.displays = [e.display for e in entries]
    result.labels = [e.label for e in entries]
    result.metadata = [e.metadata for e in entries]
    sources = sorted({_label_source(s, layouts[(tuple(s.names), tuple(s.encodings))]) for s in shards
                      if (tuple(s.names), tuple(s.encodings)) in layouts} - {None})
    result.label_source = "mds " + (", ".join(sources) or "unlabeled") + (f" + {names_file}" if names_file else "")
    if names_file:
        st = os.stat(os.path.join(folder, names_file))
        result.fingerprint.append((os.path.abspath(os.path.join(folder, names_file)), st.st_size, st.st_mtime_ns))
    return result


def _label_source(shard: _Shard, layout: _Layout) -> Optional[str]:
    if layout.label is not None:
        return f"{shard.names[layout.label]} ({shard.encodings[layout.label]})"
    return "bbox_sizes + bbox_labels (ndarray)" if layout.coco is not None else None


def _finish_labels(result: Scan, entries: list, names: Optional[list], names_file: str, labeled: bool,
                   options: ScanOptions) -> list:
    """Label schema, class ids and names; unlabeled and odd samples into problems. The kept entries."""
    counts: dict = {}
    for e in entries:
        if e.kind:
            counts[e.kind] = counts.get(e.kind, 0) + 1
    schema = max(sorted(counts), key=counts.get) if counts else ("class" if labeled else "none")
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
        kept, names = _class_ids(kept, names, names_file, result.problems)
    result.label_schema = schema
    result.class_names = list(names or [])
    return kept


def _class_ids(entries: list, names: Optional[list], names_file: str, problems: list) -> tuple:
    """Class labels (ids or names) -> ids; ``(entries kept, class names)``."""
    if names is None:
        named = sorted({e.label for e in entries if isinstance(e.label, str)})
        if named and any(isinstance(e.label, int) and e.label != UNLABELED_CLASS for e in entries):
            for e in entries:
                if isinstance(e.label, int) and e.label != UNLABELED_CLASS:
                    problems.append({"path": e.display, "reason": f"class id {e.label}, but other samples give "
                                     f"class names and there is no {' or '.join(CLASS_FILES)} to tie them"})
            entries = [e for e in entries if not (isinstance(e.label, int) and e.label != UNLABELED_CLASS)]
        names = named
    ids = {n: i for i, n in enumerate(names)}
    kept = []
    for e in entries:
        if isinstance(e.label, str):
            if e.label not in ids:
                problems.append({"path": e.display, "reason": f"class name {e.label!r} is not in {names_file}"})
                continue
            e.label = ids[e.label]
        elif names_file and e.label >= len(names):
            problems.append({"path": e.display, "reason": f"class id {e.label}, but {names_file} names "
                                                          f"{len(names)} classes"})
            continue
        kept.append(e)
    return kept, list(names)


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


# ---------------------------------------------------------------------------------------------
# Export


def _streaming():
    try:
        import streaming
    except ImportError as exc:
        raise DependencyError(f"writing MDS needs mosaicml-streaming: {_INSTALL}") from exc
    return streaming


def _records(reader) -> Iterator:
    """Every live record, in index order (256 at a time, as :func:`packer.export.export` reads)."""
    count = reader.metadata.count
    for start in range(0, count, 256):
        yield from reader.get_many(range(start, min(start + 256, count)))


def _png_of_pixels(rec, reader) -> bytes:
    """Decoded pixels (a raw store) as lossless PNG, as :func:`packer.export.export` writes them."""
    import cv2
    arr = np.frombuffer(bytes(rec.data), np.uint8).reshape(reader.raw_shape)
    if arr.ndim == 3 and arr.shape[2] == 3:
        arr = cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".png", arr)
    if not ok:
        raise RecordError(reader.location, rec.key, "PNG encode failed", rec.index)
    return buf.tobytes()


def _columns(schema: str, raw: bool) -> dict:
    columns = {"image": "png" if raw else "jpeg", KEY_COLUMN: "str", METADATA_COLUMN: "json"}
    if schema == "class":
        columns["label"] = "int"
    elif schema in ("boxes", "objects"):
        columns["label"] = "json"
    return columns


def _label_field(label, schema: str):
    if schema == "class":
        return UNLABELED_CLASS if label is None else int(label)
    if schema == "objects" or label is None:
        return label
    # float(float32): json writes the shortest text that reads back as the same float32
    return {"boxes": [[float(v) for v in row] for row in np.asarray(label, np.float32).reshape(-1, 5)]}


def _sample(rec, reader, schema: str, counts: dict) -> dict:
    if not rec.data_ok():
        raise RecordError(reader.location, rec.key, "checksum mismatch (hint: packer repair first)", rec.index)
    data = bytes(rec.data)
    if reader.encoding == "raw":
        data = _png_of_pixels(rec, reader)
        counts["png"] = counts.get("png", 0) + 1
    elif not data.startswith(b"\xff\xd8\xff"):
        counts["odd"] = counts.get("odd", 0) + 1
    sample = {"image": data, KEY_COLUMN: rec.key, METADATA_COLUMN: dict(rec.metadata or {})}
    if schema in ("class", "boxes", "objects"):
        sample["label"] = _label_field(rec.label, schema)
    counts["records"] = counts.get("records", 0) + 1
    return sample


def export(reader, out, options: Optional[ExportOptions] = None) -> ExportResult:
    """Write every record of ``reader`` as an MDS dataset in ``out`` (see the module docstring).

    Args:
        reader: an open store reader (:func:`packer.stores.open_store`).
        out: a new or empty folder.
        options: ``shard_size``: samples per shard (``prefix`` is not used: MDS names its shards).

    Returns:
        ExportResult: the shard files written (in order), notes.

    Raises:
        UsageError: ``out`` is not a new or empty folder, or lies in the store; a shard size below 1.
        RecordError: a record fails its checksum (repair the store first).
        DependencyError: mosaicml-streaming is not installed.
        DiskFullError: the disk filled up (nothing is left in ``out``).
    """
    options = options or ExportOptions()
    shard_size = int(options.shard_size)
    if shard_size < 1:
        raise UsageError(f"--shard-size must be at least 1, got {options.shard_size}")
    streaming = _streaming()
    out = Path(out)
    check_output(out, inputs=[("store", reader.location)], kind="folder")
    out.mkdir(parents=True, exist_ok=True)
    room = dict(needed=reader.size_bytes(), what=f"the MDS export ({reader.metadata.count} records)")
    require_room(str(out), room["needed"], what=room["what"])
    schema = reader.metadata.label_schema
    staging = out / ".mds.partial"
    counts: dict = {}
    try:
        writer = streaming.MDSWriter(out=str(staging), columns=_columns(schema, reader.encoding == "raw"),
                                     hashes=list(EXPORT_HASHES), size_limit=SIZE_CAP)
        try:
            for n, rec in enumerate(_records(reader), 1):
                writer.write(_sample(rec, reader, schema, counts))
                if n % shard_size == 0:
                    # what MDSWriter.write does when size_limit is reached
                    writer.flush_shard()
                    writer._reset_cache()
        except BaseException:
            writer.cancel_future_jobs()
            raise
        writer.finish()
        shards = _publish(staging, out)
        side = _write_class_names(out, list(reader.metadata.class_names or []))
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full(str(out), cause=exc, **room) from exc
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(str(out), counts.get("records", 0), shards, _notes(counts, side, shard_size))


def _publish(staging: Path, out: Path) -> list:
    """Shards into ``out``, then ``index.json`` (the commit marker); the shard paths."""
    with open(staging / INDEX, "rb") as fh:
        index = json.load(fh)
    shards = []
    for entry in index["shards"]:
        name = (entry.get("zip_data") or entry["raw_data"])["basename"]
        os.replace(staging / name, out / name)
        shards.append(str(out / name))
    os.replace(staging / INDEX, out / INDEX)
    staging.rmdir()
    return shards


def _write_class_names(out: Path, names: list) -> list:
    if not names:
        return []
    path = out / CLASS_FILES[0]
    path.write_text(json.dumps(names, ensure_ascii=False), encoding="utf-8")
    return [path]


def _notes(counts: dict, side: list, shard_size: int) -> list:
    notes = [f"one shard per {shard_size} samples (MDS shards are usually sized in bytes: "
             f"streaming suggests about 64 MiB)"]
    if counts.get("png"):
        notes.append(f"{counts['png']} record(s) of decoded pixels written as lossless PNG (column 'image' is 'png')")
    if counts.get("odd"):
        notes.append(f"{counts['odd']} record(s) hold bytes that are not JPEG in the 'jpeg' column "
                     f"(StreamingDataset still opens them with PIL)")
    if side:
        notes.append(f"class names in {side[0].name} (MDS has no place for them in index.json)")
    return notes


#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat(NAME, detect, scan, export)

__all__ = ["FORMAT", "detect", "scan", "export", "CLASS_FILES", "EXPORT_HASHES"]
