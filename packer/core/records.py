"""The record schema shared by every store, and its safe (pickle-free) serialization.

A record is one image: its JPEG bytes plus everything needed to check and use them.
Stores keep ``data`` as raw bytes and the rest as JSON (``Record.meta_to_json``), so
opening a store never executes code.

Labels are structured, never text:

* ``"class"``  -> ``int`` class id (``-1`` for an unlabeled image when allowed)
* ``"boxes"``  -> ``float32`` array of shape ``(N, 5)``: ``class cx cy w h`` (YOLO rows)
* ``"objects"`` -> a JSON-able ``dict``: the label model of :mod:`packer.labels.model`
  (boxes in one canonical form, polygons, masks, flags; built from COCO, VOC, YOLO-seg, masks)
* ``"none"``   -> ``None`` (a store built with no labels at all)

Per-sample metadata (extra CSV columns, COCO ids, ...) lives in ``Record.metadata``, a
JSON-able dict covered by the record checksum like the label.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import reprlib
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Union

import numpy as np
import xxhash

FORMAT_VERSION = 1

LABEL_SCHEMAS = ("class", "boxes", "objects", "none")
UNLABELED_CLASS = -1

Label = Union[int, np.ndarray, dict, None]


#: Checksum of stored bytes, original files, record fields and the index in stores built now:
#: XXH3-128 (tens of GB/s per core; BLAKE2b-128 took about 2/3 of a record read).
CHECKSUM_ALGORITHM = "xxh3-128"
#: What stores built before ``checksum_algorithm`` was recorded in their metadata used.
LEGACY_CHECKSUM_ALGORITHM = "blake2b-128"
CHECKSUM_ALGORITHMS = ("xxh3-128", LEGACY_CHECKSUM_ALGORITHM)


def checksum(data, algorithm: Optional[str] = None) -> str:
    """Hex checksum of ``data`` (bytes-like): XXH3-128 by default, or ``"blake2b-128"``.

    Both give 32 hex digits, so a checksum string alone does not say its algorithm: the store
    metadata does (:attr:`StoreMetadata.checksum_algorithm`).

    Raises:
        ValueError: unknown ``algorithm``.

    Example:
        >>> len(checksum(b"abc")), len(checksum(b"abc", "blake2b-128"))
        (32, 32)
    """
    algorithm = algorithm or CHECKSUM_ALGORITHM
    if algorithm == "xxh3-128":
        return xxhash.xxh3_128_hexdigest(data)
    if algorithm == LEGACY_CHECKSUM_ALGORITHM:
        return hashlib.blake2b(data, digest_size=16).hexdigest()
    raise ValueError(f"unknown checksum algorithm {algorithm!r} (known: {', '.join(CHECKSUM_ALGORITHMS)})")


def xxh3_file(path: str) -> str:
    """Hex xxh3_128 of the file at ``path``: what a manifest's ``"files"`` entries carry (written
    by :mod:`packer.jobs.publish`, checked by :mod:`packer.stores.cache` on arrival)."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(4 * 2**20), b""):
            h.update(block)
    return h.hexdigest()


def checksum_matches(data, expected: str, algorithm: Optional[str] = None) -> bool:
    """True when ``data`` has checksum ``expected`` under ``algorithm``; with ``None`` (the
    algorithm is not known here), under either algorithm, the fast one tried first."""
    if algorithm is not None:
        return checksum(data, algorithm) == expected
    return any(checksum(data, a) == expected for a in ("xxh3-128", LEGACY_CHECKSUM_ALGORITHM))


#: Deepest JSON nesting read from a store (MongoDB's own limit for documents): record fields,
#: labels and store metadata written by packer stay far below it, and Python's parser (and the
#: code that walks what it returns) would hit the recursion limit on deeper input.
MAX_JSON_DEPTH = 100

#: A JSON string, or an unterminated one running to the end: it always matches where it starts,
#: so stripping strings takes linear time (no retry from each quote of an unterminated string).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects in the JSON text ``raw``, counted outside strings
    in linear time (an upper bound for text that is not valid JSON).

    Example:
        >>> json_depth(b'{"a": [[1], "]]]"]}')
        3
    """
    brackets = np.frombuffer(_JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET), np.uint8)
    opens = (brackets == ord("[")) | (brackets == ord("{"))
    return int(np.cumsum(opens.view(np.int8) * np.int8(2) - np.int8(1), dtype=np.int32).max(initial=0))


def loads_bounded(raw, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for JSON read from a store: text nested deeper than ``max_depth`` is refused
    up front (bounded time and stack, never a RecursionError).

    Raises:
        ValueError: not valid JSON, or nested too deep; callers name the store and the field.
    """
    if isinstance(raw, str):
        raw = raw.encode()
    elif isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw)
    else:   # e.g. a number where a store keeps JSON text (bytes(n) would allocate n bytes)
        raise ValueError(f"expected JSON text, got {type(raw).__name__}")
    if raw.count(b"[") + raw.count(b"{") > max_depth:   # only then can it be too deep
        depth = json_depth(raw)
        if depth > max_depth:
            raise ValueError(f"JSON nested {depth} levels deep (at most {max_depth} allowed)")
    try:
        text = raw.decode("utf-8")   # packer writes UTF-8; json.loads(bytes) would guess UTF-16/32
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 JSON text (byte {exc.start} is {raw[exc.start:exc.start + 1]!r})") from None
    try:
        return json.loads(text)
    except RecursionError:   # not reached after the check above; never let one escape
        raise ValueError(f"JSON nested too deep (at most {max_depth} levels allowed)") from None


def label_to_json(label: Label) -> Any:
    """Label -> JSON-able value (boxes become a list of 5-float rows; label-model dicts stay)."""
    if isinstance(label, dict):
        return label
    if label is None or isinstance(label, (int, np.integer)):
        return None if label is None else int(label)
    arr = np.asarray(label, dtype=np.float32).reshape(-1, 5)
    return [[float(v) for v in row] for row in arr]


def label_from_json(value: Any, schema: str) -> Label:
    """Inverse of :func:`label_to_json` for a store whose label schema is ``schema``."""
    if schema == "boxes":
        if value is None:
            return None
        return np.asarray(value, dtype=np.float32).reshape(-1, 5)
    if schema == "objects":
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"an 'objects' label must be a JSON object, got {type(value).__name__}")
        return value
    if schema == "class":
        return UNLABELED_CLASS if value is None else int(value)
    return None


def labels_equal(a: Label, b: Label) -> bool:
    """Exact label equality, arrays included."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return a == b


@dataclass
class Record:
    """One image as every store keeps it.

    Attributes:
        index: position in the store, 0..N-1, in the deterministic input order.
        key: the image's path relative to the IMAGES folder (POSIX separators).
        data: the stored JPEG bytes (a ``memoryview`` when a store reads without copying).
        label: see the module docstring.
        width, height, channels: of the stored JPEG (channels 1 or 3).
        source_format: what the input file was by its magic bytes (``jpeg``, ``png``, ...).
        converted: why the bytes were re-encoded (``""`` when they are the original JPEG), e.g.
            ``"png->jpeg"``, ``"cmyk->rgb"``, ``"exif-orientation 6 applied"``.
        orientation: EXIF orientation still to apply at read time (1 = none). Only != 1 when the
            build recorded orientation instead of applying it.
        checksum: :func:`checksum` of ``data``.
        source_checksum: :func:`checksum` of the original input file.
        source_size: bytes of the original input file.
        notes: non-fatal observations (e.g. ``"trimmed 112 trailing bytes after EOI"``).
        metadata: per-sample JSON-able extra fields (extra CSV columns, COCO image ids, ...);
            ``{}`` when there are none (and then left out of the checksummed fields, so stores
            built before this field existed still verify).
        coding: the stored JPEG's frame type from its SOF marker (``"baseline"``,
            ``"extended"``, ``"progressive"``, ...); ``""`` when the store predates the field.
        subsampling: its chroma subsampling from the SOF component table (``"444"``, ``"422"``,
            ``"420"``, ``"440"``, ``"411"``, ``"gray"``, or ``"other"``); ``""`` when unknown.
            Readers route each record to a decoder that takes it (the GPU's hardware JPEG engine
            takes baseline only) before decoding; both fields are covered by the record checksum
            when set, and left out of it when empty, so stores written before them still verify.
        meta_checksum: as read from a store, the checksum of every other field but ``data``
            (label included) taken when the record was written; ``""`` for a record made in
            memory. Stores save :meth:`meta_digest` through :meth:`meta_dict`, so labels and
            sizes are covered by a checksum just as the bytes are.
    """

    index: int
    key: str
    data: Any
    label: Label
    width: int
    height: int
    channels: int
    source_format: str
    converted: str
    orientation: int
    checksum: str
    source_checksum: str
    source_size: int
    notes: list = field(default_factory=list)
    meta_checksum: str = ""
    metadata: dict = field(default_factory=dict)
    coding: str = ""
    subsampling: str = ""
    #: Algorithm of ``checksum`` / ``meta_checksum`` when the reader knows it (from the store
    #: metadata); ``None`` accepts either known algorithm. Not stored with the record.
    checksum_algorithm: Optional[str] = field(default=None, compare=False, repr=False)

    META_FIELDS = ("index", "key", "label", "width", "height", "channels", "source_format",
                   "converted", "orientation", "checksum", "source_checksum", "source_size", "notes",
                   "meta_checksum")
    #: Fields newer stores write and older ones lack (read as ``""``).
    OPTIONAL_META_FIELDS = ("coding", "subsampling")

    def __repr__(self) -> str:
        """Key, size, byte count and a short checksum: never the bytes (a photo is kilobytes of
        escapes), and a label cut short when long.

        Example:
            >>> Record(3, "cat/a.jpg", bytes(9), 0, 64, 48, 3, "jpeg", "", 1, "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            ...        "", 9)
            Record(index=3, key='cat/a.jpg', 64x48x3, 9 bytes, checksum=0f1e2d3c..., label=0)
        """
        data = self.data
        size = "no data" if data is None else f"{memoryview(data).nbytes} bytes"
        short = f"{self.checksum[:8]}..." if len(self.checksum or "") > 8 else repr(self.checksum)
        label = reprlib.repr(self.label)
        extra = f", converted={self.converted!r}" if self.converted else ""
        return (f"Record(index={self.index}, key={self.key!r}, {self.width}x{self.height}x{self.channels}, "
                f"{size}, checksum={short}, label={label}{extra})")

    def meta_dict(self) -> dict:
        """Everything but ``data``, JSON-able; ``meta_checksum`` is this record's :meth:`meta_digest`."""
        d = self._fields_dict()
        d["meta_checksum"] = _fields_digest(d, self.checksum_algorithm)
        return d

    def meta_digest(self, algorithm: Optional[str] = None) -> str:
        """Checksum of every field but ``data`` and ``meta_checksum``."""
        return _fields_digest(self._fields_dict(), algorithm or self.checksum_algorithm)

    def meta_ok(self) -> bool:
        """True when the fields read from a store still match the checksum written with them."""
        fields = json.dumps(self._fields_dict(), separators=(",", ":"), sort_keys=True).encode()
        return checksum_matches(fields, self.meta_checksum, self.checksum_algorithm)

    def _fields_dict(self) -> dict:
        d = {
            "index": int(self.index), "key": self.key, "label": label_to_json(self.label),
            "width": int(self.width), "height": int(self.height), "channels": int(self.channels),
            "source_format": self.source_format, "converted": self.converted,
            "orientation": int(self.orientation), "checksum": self.checksum,
            "source_checksum": self.source_checksum, "source_size": int(self.source_size),
            "notes": list(self.notes),
            **({"metadata": self.metadata} if self.metadata else {}),
        }
        for name in self.OPTIONAL_META_FIELDS:  # absent when empty: old records keep their digest
            if getattr(self, name):
                d[name] = getattr(self, name)
        return d

    def meta_to_json(self) -> bytes:
        return json.dumps(self.meta_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_meta(cls, meta: dict, data, label_schema: str) -> "Record":
        """Build a record from :meth:`meta_dict` output; raises KeyError/ValueError on bad meta."""
        missing = [f for f in cls.META_FIELDS if f not in meta]
        if missing:
            raise ValueError(f"record metadata lacks fields {missing}")
        kwargs = {f: meta[f] for f in cls.META_FIELDS}
        kwargs.update({f: str(meta[f]) for f in cls.OPTIONAL_META_FIELDS if f in meta})
        kwargs["label"] = label_from_json(meta["label"], label_schema)
        extra = meta.get("metadata") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"record metadata field 'metadata' must be an object, got {type(extra).__name__}")
        return cls(data=data, metadata=extra, **kwargs)

    def data_ok(self) -> bool:
        """True when ``data`` still matches its checksum."""
        return checksum_matches(self.data, self.checksum, self.checksum_algorithm)


def _fields_digest(fields: dict, algorithm: Optional[str] = None) -> str:
    return checksum(json.dumps(fields, separators=(",", ":"), sort_keys=True).encode(), algorithm)


@dataclass
class StoreMetadata:
    """Store-level metadata, written last: its presence marks a complete store.

    ``index_checksum`` is :func:`index_checksum` over every record's (index, key, checksum).

    ``quarantine`` lists records that :func:`packer.jobs.repair` took out of the live index, one dict
    each (``key``, ``index`` = its position before it left, ``reason``, ``checksum`` and ``size``
    of the kept bytes, ``record`` = its fields as far as they were readable); the bytes sit in
    the backend's quarantine area, entry ``n`` for ``quarantine[n]``. ``history`` lists what
    repair/convert did to the store since the build (one dict per run).
    ``checksum_algorithm`` names the algorithm of every checksum in the store; metadata written
    before the field existed reads back as ``"blake2b-128"``.
    ``build_id`` is a random id written at every publish (build, append, merge, convert, repair:
    each makes a new version of the store), so a reader can tell that the store it opened was
    replaced; ``""`` in stores published before the field existed (see
    :func:`packer.stores.base.store_identity`).
    """

    format: str
    count: int
    label_schema: str
    class_names: list
    build_options: dict
    index_checksum: str
    format_version: int = FORMAT_VERSION
    packer_version: str = ""
    created: str = ""
    stats: dict = field(default_factory=dict)
    quarantine: list = field(default_factory=list)
    history: list = field(default_factory=list)
    #: What the label parser knew beyond class names, for writing labels back in their source
    #: form: ``{"format": "coco", "categories": [...], "info": ...}`` (see packer.labels).
    label_info: dict = field(default_factory=dict)
    checksum_algorithm: str = field(default_factory=lambda: CHECKSUM_ALGORITHM)
    build_id: str = ""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: dict) -> "StoreMetadata":
        """Metadata as read from a store, every field checked (see :func:`check_metadata_fields`).

        Raises:
            ValueError: a field is missing or of the wrong type; the message names the field.
        """
        if not isinstance(d, dict):
            raise ValueError(f"store metadata must be a JSON object, got {type(d).__name__}")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known.setdefault("checksum_algorithm", LEGACY_CHECKSUM_ALGORITHM)
        check_metadata_fields(known)
        return cls(**known)

    @classmethod
    def from_json(cls, raw) -> "StoreMetadata":
        """:meth:`from_dict` of JSON text (nesting bounded, see :func:`loads_bounded`)."""
        return cls.from_dict(loads_bounded(raw))


#: What each StoreMetadata field read from a store must be (see :func:`check_metadata_fields`).
_METADATA_FIELDS = {
    "format": "str", "count": "count", "label_schema": "schema", "class_names": "strs",
    "build_options": "dict", "index_checksum": "str", "format_version": "int", "packer_version": "str",
    "created": "str", "stats": "stats", "quarantine": "quarantine", "history": "dicts",
    "label_info": "dict", "checksum_algorithm": "str", "build_id": "str",
}
_REQUIRED_FIELDS = ("format", "count", "label_schema", "class_names", "build_options", "index_checksum")
#: Build statistics (:func:`packer.jobs.steps.add_stats`) that ``info`` and the report compute with.
_STAT_NUMBERS = ("records", "bytes", "source_bytes", "width_min", "width_max", "width_sum", "height_min",
                 "height_max", "height_sum", "converted", "with_notes", "orientation_recorded", "unlabeled",
                 "boxes", "boxes_max_per_image", "images_without_boxes", "objects", "objects_max_per_image",
                 "images_without_objects", "masks")
_STAT_TABLES = ("sizes", "channels", "source_formats", "classes")   # name -> count
_QUARANTINE_ENTRY = {"key": str, "index": int, "reason": str, "size": int}


def is_int(v) -> bool:
    """An integer read from JSON, not a bool (``True`` is an int to Python)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _shown(value) -> str:
    text = repr(value)
    return f"{text[:60]}... ({type(value).__name__})" if len(text) > 60 else f"{text} ({type(value).__name__})"


def check_metadata_fields(d: dict) -> None:
    """Check the StoreMetadata fields in ``d`` (as read from a store) for type and range, so that
    nothing downstream (verify's loops, ``info``, readers) meets a string count or a list of
    numbers as class names. Counts against what a store holds are the backends' to check
    (:func:`packer.stores.base.load_metadata`).

    Raises:
        ValueError: naming the first bad field, e.g. ``field 'count' must be a non-negative
            integer, got '12' (str)``.
    """
    missing = [k for k in _REQUIRED_FIELDS if k not in d]
    if missing:
        raise ValueError(f"lacks field(s) {', '.join(repr(k) for k in missing)}")
    for name, kind in _METADATA_FIELDS.items():
        if name not in d:
            continue
        v = d[name]
        want = None
        if kind == "str" and not isinstance(v, str):
            want = "a string"
        elif kind == "int" and not is_int(v):
            want = "an integer"
        elif kind == "count" and not (is_int(v) and v >= 0):
            want = "a non-negative integer"
        elif kind == "schema" and v not in LABEL_SCHEMAS:
            want = f"one of {', '.join(LABEL_SCHEMAS)}"
        elif kind == "strs" and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            want = "a list of strings"
        elif kind in ("dict", "stats") and not isinstance(v, dict):
            want = "an object"
        elif kind in ("dicts", "quarantine") and not (isinstance(v, list) and all(isinstance(x, dict) for x in v)):
            want = "a list of objects"
        elif kind == "stats":
            want = _stats_problem(v)
        elif kind == "quarantine":
            want = next((f"a list of objects with {k!r} of type {t.__name__}" for e in v
                         for k, t in _QUARANTINE_ENTRY.items()
                         if not (is_int(e.get(k)) if t is int else isinstance(e.get(k), t))), None)
        if want:
            raise ValueError(f"field {name!r} must be {want}, got {_shown(v)}")


def _stats_problem(stats: dict) -> Optional[str]:
    for k in _STAT_NUMBERS:
        if k in stats and not (isinstance(stats[k], (int, float)) and not isinstance(stats[k], bool)):
            return f"an object whose {k!r} is a number"
    for k in _STAT_TABLES:
        table = stats.get(k, {})
        if not (isinstance(table, dict) and all(is_int(n) for n in table.values())):
            return f"an object whose {k!r} maps names to integer counts"
    if not all(c.lstrip("-").isdigit() for c in stats.get("classes", {})):
        return "an object whose 'classes' maps class ids to counts"
    return None


def sealed_with(rec: "Record", algorithm: str, raw=None) -> "Record":
    """``rec`` with its checksums under ``algorithm`` (the target store's), for records written
    into a store whose other records use it (a BLAKE2b store repaired, appended to, converted).

    Only call it on a record already checked under its own algorithm: the bytes' checksum is
    recomputed, not compared. ``raw`` (the original file) recomputes ``source_checksum`` too;
    without it ``source_checksum`` keeps its algorithm (compare it with :func:`checksum_matches`).

    Example:
        >>> r = sealed_with(rec, "blake2b-128")        # doctest: +SKIP
    """
    rec = dataclasses.replace(rec, checksum_algorithm=algorithm, checksum=checksum(rec.data, algorithm))
    if raw is not None:
        rec.source_checksum = checksum(raw, algorithm)
    rec.meta_checksum = rec.meta_digest(algorithm)
    return rec


def index_line(index: int, key: str, record_checksum: str) -> bytes:
    return f"{index}\t{key}\t{record_checksum}\n".encode()


class IndexHasher:
    """Incremental :func:`index_checksum`: feed (index, key, checksum) in index order.

    Args:
        algorithm: the store's :attr:`StoreMetadata.checksum_algorithm` (default: the current one).
    """

    def __init__(self, algorithm: Optional[str] = None):
        algorithm = algorithm or CHECKSUM_ALGORITHM
        if algorithm == "xxh3-128":
            self._h = xxhash.xxh3_128()
        elif algorithm == LEGACY_CHECKSUM_ALGORITHM:
            self._h = hashlib.blake2b(digest_size=16)
        else:
            raise ValueError(f"unknown checksum algorithm {algorithm!r} (known: {', '.join(CHECKSUM_ALGORITHMS)})")

    def update(self, index: int, key: str, record_checksum: str) -> None:
        self._h.update(index_line(index, key, record_checksum))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def index_checksum(entries, algorithm: Optional[str] = None) -> str:
    """Checksum of the store index: ``entries`` yields (index, key, checksum) in index order."""
    h = IndexHasher(algorithm)
    for index, key, record_checksum in entries:
        h.update(index, key, record_checksum)
    return h.hexdigest()
