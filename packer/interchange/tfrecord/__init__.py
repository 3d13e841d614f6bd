"""TFRecord files of ``tf.train.Example`` (the TF Object Detection API keys) as a build source and
an export target, without TensorFlow.

**Input**: one file (``.tfrecord``, ``.tfrecords``, ``.tfrec``, ``.record``, TFDS/TF-slim shard
names such as ``train.tfrecord-00000-of-00016``; gzip detected by its magic bytes), a folder of
them (its files with such names, not recursive, sorted), or a glob/brace pattern
(``data-{00000..00009}.tfrecord``). Every record's framing is checked: ``uint64`` length,
masked CRC32C of the length, the data, masked CRC32C of the data (the ``crc32c`` package, or
``google-crc32c``). A record whose data CRC does not match is listed and skipped; a length whose
CRC does not match, or a file cut short, ends that file (its framing is lost): the problem says
so, and the other files are read on. Each record is parsed with ``tfrecord.example_pb2.Example``.

Features read:

* ``image/encoded`` (one bytes value): the image. In an uncompressed file its byte range is found by
  walking the record's protobuf wire format (Example -> features -> map entry -> Feature ->
  BytesList -> value) and checked against the parsed value, so the scan keeps
  ``("range", file, offset, size)`` locators and no image bytes; gzip files keep ``("bytes", data)``
  (a gzip record declaring more than ``MAX_GZIP_RECORD``, 256 MiB, is damage and is not read;
  a shorter one is read in chunks, so a length the stream does not hold allocates nothing).
* keys: ``image/filename`` when every record has one (a safe relative path) and no two are equal;
  otherwise ``<file stem>/<record no:06d>.<ext>`` for every record (``ext`` from ``image/format``,
  else the image's magic bytes). Records are numbered from 0 in each file.
* boxes: ``image/object/bbox/{xmin,ymin,xmax,ymax}`` (normalized corners) become YOLO rows
  ``class cx cy w h`` (float32, computed in float64); classes from ``image/object/class/label``
  (int64) or, where only ``image/object/class/text`` is given, from the names.
* classes: ``image/class/label`` (+ ``image/class/text``).
* ``packer/label``: packer's own label JSON (what :func:`packer.core.records.label_to_json` gives),
  written by :func:`export` where the float32 corners would not give the stored rows back bit for
  bit (and for label-model dicts and unlabeled records); when present it is the label, after a
  check that it agrees with the TF OD features beside it. ``packer/metadata``: the record's
  per-sample metadata JSON.

**Class ids are kept as given** (the TF OD API numbers classes from 1, 0 being background; many
classification sets number from 0): ``class_names[id]`` is the name of ``id``, from
``label_map.pbtxt`` beside the files (the TF OD API's ``StringIntLabelMap``; ``display_name``
where given, else ``name``) and from the records' ``.../class/text``. An id with no name (id 0 of a
1-based set) gets the placeholder ``__unused_<id>__``; a set with ids but no names at all keeps
``class_names == []``. A record whose class text contradicts the names seen before is listed and
skipped. :func:`export` writes ids as stored and a ``label_map.pbtxt`` of every named id
(placeholders left out), so a store built from a 1-based set exports as one; a 0-based store
exports 0-based ids (noted in :attr:`ExportResult.notes`: the TF OD API reserves id 0).

**Output**: ``<out>/<prefix>-00000-of-0000N.tfrecord`` written by ``tfrecord.TFRecordWriter``, one per
``shard_size`` records, each with its ``.tfindex`` (the ``offset length`` lines of
``tfrecord.tools.tfrecord2idx``, which ``tfrecord.torch.dataset.TFRecordDataset`` takes for
shuffling and worker sharding), and ``label_map.pbtxt`` when the store has class names.

The format is one package, a module per concern: :mod:`~packer.interchange.tfrecord.files`
(which files, libraries, record framing), :mod:`~packer.interchange.tfrecord.example` (one
Example: the wire walk, the features read), :mod:`~packer.interchange.tfrecord.labelmap` (class
names), :mod:`~packer.interchange.tfrecord.reader` (the scan) and
:mod:`~packer.interchange.tfrecord.writer` (the export).

Example:
    >>> from packer.interchange import get_format, ScanOptions   # doctest: +SKIP
    >>> scan = get_format("tfrecord").scan("pets/train.record-*", ScanOptions())   # doctest: +SKIP
    >>> scan.label_schema, scan.class_names[:2]   # doctest: +SKIP
    ('boxes', ['__unused_0__', 'Abyssinian'])
"""
from __future__ import annotations

from packer.interchange.base import InterchangeFormat
from packer.interchange.tfrecord.example import PACKER_LABEL, PACKER_METADATA, encoded_range
from packer.interchange.tfrecord.files import detect, expand_braces, iter_records, list_files
from packer.interchange.tfrecord.labelmap import LABEL_MAP, placeholder, read_label_map, write_label_map
from packer.interchange.tfrecord.reader import scan
from packer.interchange.tfrecord.writer import corners_of, export, iter_store

NAME = "tfrecord"

#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat(NAME, detect, scan, export)

__all__ = ["FORMAT", "scan", "export", "detect", "list_files", "expand_braces",
           "iter_records", "encoded_range", "read_label_map", "write_label_map", "corners_of",
           "iter_store", "placeholder", "PACKER_LABEL", "PACKER_METADATA", "LABEL_MAP", "NAME"]
