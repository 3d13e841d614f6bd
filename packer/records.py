"""The record schema shared by every store, and its safe (pickle-free) serialization.

A record is one image: its JPEG bytes plus everything needed to check and use them.
Stores keep ``data`` as raw bytes and the rest as JSON (``Record.meta_to_json``), so
opening a store never executes code.

Labels are structured, never text:

* ``"class"``  -> ``int`` class id (``-1`` for an unlabeled image when allowed)
* ``"boxes"``  -> ``float32`` array of shape ``(N, 5)``: ``class cx cy w h`` (YOLO rows)
* ``"none"``   -> ``None`` (a store built with no labels at all)
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Union

import numpy as np

FORMAT_VERSION = 1

LABEL_SCHEMAS = ("class", "boxes", "none")
UNLABELED_CLASS = -1

Label = Union[int, np.ndarray, None]


#: What :func:`checksum` computes (shown by ``packer report``).
CHECKSUM_ALGORITHM = "blake2b-128"


def checksum(data) -> str:
    """Checksum used for stored bytes, original files and the index: BLAKE2b-128, hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def label_to_json(label: Label) -> Any:
    """Label -> JSON-able value (boxes become a list of 5-float rows)."""
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

    META_FIELDS = ("index", "key", "label", "width", "height", "channels", "source_format",
                   "converted", "orientation", "checksum", "source_checksum", "source_size", "notes",
                   "meta_checksum")

    def meta_dict(self) -> dict:
        """Everything but ``data``, JSON-able; ``meta_checksum`` is this record's :meth:`meta_digest`."""
        d = self._fields_dict()
        d["meta_checksum"] = _fields_digest(d)
        return d

    def meta_digest(self) -> str:
        """Checksum of every field but ``data`` and ``meta_checksum``."""
        return _fields_digest(self._fields_dict())

    def meta_ok(self) -> bool:
        """True when the fields read from a store still match the checksum written with them."""
        return self.meta_checksum == self.meta_digest()

    def _fields_dict(self) -> dict:
        return {
            "index": int(self.index), "key": self.key, "label": label_to_json(self.label),
            "width": int(self.width), "height": int(self.height), "channels": int(self.channels),
            "source_format": self.source_format, "converted": self.converted,
            "orientation": int(self.orientation), "checksum": self.checksum,
            "source_checksum": self.source_checksum, "source_size": int(self.source_size),
            "notes": list(self.notes),
        }

    def meta_to_json(self) -> bytes:
        return json.dumps(self.meta_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_meta(cls, meta: dict, data, label_schema: str) -> "Record":
        """Build a record from :meth:`meta_dict` output; raises KeyError/ValueError on bad meta."""
        missing = [f for f in cls.META_FIELDS if f not in meta]
        if missing:
            raise ValueError(f"record metadata lacks fields {missing}")
        kwargs = {f: meta[f] for f in cls.META_FIELDS}
        kwargs["label"] = label_from_json(meta["label"], label_schema)
        return cls(data=data, **kwargs)

    def data_ok(self) -> bool:
        """True when ``data`` still matches its checksum."""
        return checksum(self.data) == self.checksum


def _fields_digest(fields: dict) -> str:
    return checksum(json.dumps(fields, separators=(",", ":"), sort_keys=True).encode())


@dataclass
class StoreMetadata:
    """Store-level metadata, written last: its presence marks a complete store.

    ``index_checksum`` is :func:`index_checksum` over every record's (index, key, checksum).
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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: dict) -> "StoreMetadata":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    @classmethod
    def from_json(cls, raw) -> "StoreMetadata":
        return cls.from_dict(json.loads(bytes(raw)))


def index_line(index: int, key: str, record_checksum: str) -> bytes:
    return f"{index}\t{key}\t{record_checksum}\n".encode()


class IndexHasher:
    """Incremental :func:`index_checksum`: feed (index, key, checksum) in index order."""

    def __init__(self):
        self._h = hashlib.blake2b(digest_size=16)

    def update(self, index: int, key: str, record_checksum: str) -> None:
        self._h.update(index_line(index, key, record_checksum))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def index_checksum(entries) -> str:
    """Checksum of the store index: ``entries`` yields (index, key, checksum) in index order."""
    h = IndexHasher()
    for index, key, record_checksum in entries:
        h.update(index, key, record_checksum)
    return h.hexdigest()
