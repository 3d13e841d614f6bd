"""Hugging Face ``datasets`` as a build source and an export target (``--from hf`` / ``--to hf``).

**In** (read with pyarrow alone: the ``datasets`` library is not needed to import):

* a folder written by ``Dataset.save_to_disk`` (``state.json`` + ``data-NNNNN-of-NNNNN.arrow``),
  or by ``DatasetDict.save_to_disk`` (``dataset_dict.json`` + one such folder per split);
* parquet: one file, a folder of ``*.parquet``, a glob or brace pattern, or the hub layout
  ``data/{split}-00000-of-0000N.parquet``;
* any of these in a bucket (``s3://b/ds/``, ``s3://b/ds/data/train-*.parquet``...): a prefix
  listed once, every file read through :mod:`packer.core.remote` pinned to the ETag listed
  (:mod:`~packer.interchange.hf.bucket`), with the checks, keys, labels and messages of a local
  dataset; ``ScanOptions.storage_options`` are fsspec's.

With several splits, ``ScanOptions.split`` picks one (default ``"train"``; an unknown split is a
UsageError listing those there are). The image column is the only ``Image`` feature of the schema
(``ScanOptions.image_column`` otherwise); its ``{bytes, path}`` struct gives the bytes exactly as
stored and the key: the ``path`` field when every row has one and they are unique, else
``<split>/<row>.<ext>`` (row: the index in the split, ext from the magic bytes). Labels:

* ``ClassLabel`` (the column ``label``/``labels``, the only ClassLabel, or
  ``ScanOptions.label_column``): class ids, the feature's names as the class names; a string
  column gives its sorted distinct values as the class names;
* ``objects: {bbox, category}`` (the common detection layout, COCO ``[x, y, w, h]`` pixel boxes):
  ``"boxes"`` YOLO rows ``class cx cy w h`` normalized by the image size from its header;
* ``packer_label`` (what :func:`export` writes beside them): packer's own label JSON, exact.

A row with an image but no label (null, or ClassLabel's ``-1``) is a problem unless
``allow_unlabeled``. A row group (parquet) or record batch (arrow) that cannot be read is one
problem naming the file and the rows lost; the other row groups are kept.

**Memory**: the scan reads ``BATCH_ROWS`` rows at a time and keeps no image bytes. Arrow files
(``save_to_disk``, uncompressed) give ``("range", file, offset, size)`` locators: the bytes lie
as they are in the file. Parquet pages are compressed, so :attr:`Scan.locators` is then a
:class:`LazyLocators` sequence that reads a sample's bytes when the build asks for it, through one
streaming cursor (the build asks in order): at most one batch of one row group in memory.

**Out**: ``<out>/data/train-00000-of-0000N.parquet`` shards of ``shard_size`` rows (the hub
layout ``datasets.load_dataset("parquet")`` and the dataset viewer read) with the features
``image: Image()``, ``label: ClassLabel(names)`` (class stores) or ``objects: Sequence({bbox,
category})`` (box stores, COCO pixel boxes), and ``packer_label`` (packer's label JSON, exact
where pixel boxes in float32 are not) and ``packer_metadata`` (the records' metadata) columns.

The format is one package, a module per concern: :mod:`~packer.interchange.hf.layout` (which
files, which split), :mod:`~packer.interchange.hf.bucket` (the same in a bucket, and objects
opened pinned), :mod:`~packer.interchange.hf.columns` (which column holds what; labels),
:mod:`~packer.interchange.hf.reader` (the scan), :mod:`~packer.interchange.hf.lazy` (lazy
locators), :mod:`~packer.interchange.hf.writer` (the export), over
:mod:`~packer.interchange.hf.arrow` (pyarrow helpers).

Example:
    >>> from packer.interchange import ScanOptions, get_format
    >>> scan = get_format("hf").scan("cppe5/", ScanOptions(split="train"))   # doctest: +SKIP
    >>> scan.label_schema, scan.class_names[:2]                            # doctest: +SKIP
    ('boxes', ['Coverall', 'Face_Shield'])
"""
from __future__ import annotations

from packer.interchange.base import InterchangeFormat
from packer.interchange.hf.lazy import LazyLocators
from packer.interchange.hf.reader import detect, scan
from packer.interchange.hf.writer import export

#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat("hf", detect, scan, export)

__all__ = ["FORMAT", "LazyLocators", "detect", "scan", "export"]
