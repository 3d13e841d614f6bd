"""The contract every interchange format (WebDataset, Hugging Face datasets, MDS, TFRecord) keeps.

A format is one module in :mod:`packer.interchange` with a module-level ``FORMAT`` object that
has:

* ``name``: what ``--from`` / ``--to`` call it (``"webdataset"``, ``"hf"``, ``"mds"``, ``"tfrecord"``);
* ``detect(path) -> bool``: True when ``path`` (a file, a folder or a brace pattern) is data of
  this format; cheap (reads at most a few KiB), never raises for a path of another format;
* ``scan(path, options: ScanOptions) -> Scan``: lists every sample, its label and where its image
  bytes are (a :data:`Locator`), without reading the image bytes where the format lets them be
  read later by offset (tar members, uncompressed MDS shards); damaged parts (a truncated tar
  member, a bad CRC, a corrupt parquet page, a shard whose hash does not match the index, a
  sample with an image but no label) go into ``Scan.problems`` naming shard and member/row, and
  scanning goes on with the rest;
* ``export(reader, out, options: ExportOptions) -> ExportResult``: writes every record of an open
  store reader (:func:`packer.stores.open_store`) as this format, in shards of
  ``options.shard_size`` samples, with the labels in the format's own convention and the index
  the peer library expects; the image bytes exactly as stored.

Round trips are exact: what ``export`` writes, ``scan`` of the same format gives back with equal
keys, image bytes, labels and class names (formats whose own box convention loses float bits carry
packer's label JSON beside it, in a field named ``packer_label``/``packer.json``).

The build reads image bytes in its worker processes through :func:`read_locator`, so a scan keeps
the whole dataset's bytes out of the main process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

#: Where one sample's image bytes are:
#: ``("range", shard_path, offset, size)``: ``size`` bytes at ``offset`` of a plain file;
#: ``("bytes", data)``: the bytes themselves (formats with no byte range: parquet, gzip TFRecord),
#: handed to the worker with its task (the build keeps a bounded window of tasks in flight).
Locator = tuple


@dataclass(frozen=True)
class InterchangeFormat:
    """A format module's ``FORMAT``: its name and its three functions (see the module docstring).

    Example:
        >>> FORMAT = InterchangeFormat("webdataset", detect, scan, export)   # doctest: +SKIP
    """

    name: str
    detect: Callable
    scan: Callable
    export: Callable


@dataclass
class ScanOptions:
    """What the user said about the input (``packer build --from ... --split ...``)."""

    split: Optional[str] = None          # HF: which split (train/validation/...)
    image_column: Optional[str] = None   # HF/MDS: the image column when not obvious
    label_column: Optional[str] = None   # HF/MDS: the label column when not obvious
    allow_unlabeled: bool = False        # a sample with no label: label None instead of a problem


@dataclass
class Scan:
    """What a scan found, in sample order (shards in sorted order, samples in shard order).

    Attributes:
        root: the input as given (for messages and the report).
        keys: one unique key per sample (the record key; for WebDataset the sample key plus the
            image extension, e.g. ``"000123.jpg"``; ``"<shard>/..."`` where keys repeat across shards).
        locators: one :data:`Locator` per key.
        displays: one printable name per key, ``"data-000000.tar:000123.jpg"``, for messages.
        labels: one label per key: an ``int`` class id, a float32 ``(N, 5)`` array of YOLO rows
            ``class cx cy w h`` (normalized), a label-model dict (:mod:`packer.labels.model`), or
            None (unlabeled).
        label_schema: ``"class"``, ``"boxes"``, ``"objects"`` or ``"none"``.
        class_names: class names by id (``[]`` when the source has none).
        label_source: a short description (``"webdataset .cls"``), for the store's build options.
        metadata: per-sample metadata dicts (``{}`` each when none).
        problems: ``{"path": display, "reason": text}`` for each damaged or unusable sample/shard.
        fingerprint: ``(name, size, mtime_ns)`` per shard file, for resuming a killed build.
    """

    root: str
    keys: list = field(default_factory=list)
    locators: list = field(default_factory=list)
    displays: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    label_schema: str = "none"
    class_names: list = field(default_factory=list)
    label_source: str = ""
    metadata: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    fingerprint: list = field(default_factory=list)


@dataclass
class ExportOptions:
    shard_size: int = 10_000             # samples per shard
    prefix: str = "data"                 # shard file name prefix


@dataclass
class ExportResult:
    out: str
    records: int = 0
    shards: list = field(default_factory=list)   # the files written
    notes: list = field(default_factory=list)


def read_locator(loc: Union[Locator, str, os.PathLike]) -> bytes:
    """The image bytes a locator names (a plain path reads the whole file).

    Raises:
        OSError: the shard cannot be read, or holds fewer bytes than the range says (a
            truncated shard), with the shard's path in the message.
    """
    if isinstance(loc, tuple):
        kind = loc[0]
        if kind == "bytes":
            return loc[1]
        if kind == "range":
            _, path, offset, size = loc
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(size)
            if len(data) != size:
                raise OSError(f"{path}: cut short: {size} bytes expected at offset {offset}, {len(data)} found")
            return data
        raise ValueError(f"unknown locator kind {kind!r}")
    with open(loc, "rb") as fh:
        return fh.read()
