"""WebDataset tar shards as a build source and an export target.

**In** (``packer build SRC --from webdataset``): SRC is one ``.tar`` shard, a folder of shards
(its ``*.tar`` / ``*.tar.gz`` / ``*.tgz`` files, sorted by name) or a brace pattern
(``data-{000000..000099}.tar``, expanded with ``braceexpand``, the library webdataset itself
uses); the same in a bucket (``s3://b/shards/``, ``s3://b/shards/data-{000000..000099}.tar``, one
object: listed once, each shard streamed once through :func:`packer.core.remote.open_input`, image
members read by the build as ``("range", url, offset, size, etag)``, pinned). Samples are grouped
exactly as ``webdataset`` groups them (``tar_file_iterator`` /
``base_plus_ext`` / ``group_by_keys``): a member's key is its name up to the first dot of its
base name (folders included), its field the rest, lower-cased; consecutive members with the
same key are one sample; members that are not regular files, have no dot in their base name or
are ``__meta__`` entries are skipped.

* image: the first of the fields ``jpg``, ``jpeg``, ``png``, ``webp`` the sample has (or the
  field ``ScanOptions.image_column`` names); the record key is the image member's name
  (``"000123.jpg"``, ``"train/000123.jpg"``);
* label, first found: a ``.json`` holding a packer label-model dict (``{"format":..,
  "objects": [...]}``, schema ``"objects"``) or boxes (``{"boxes": [[c, cx, cy, w, h], ...]}``
  or a bare list of such rows, normalized, schema ``"boxes"``); a ``.cls`` holding a class id or
  a class name; a ``.json`` ``{"class": id-or-name}`` (or ``label`` / ``class_id``); a ``.txt``
  holding an integer (any other ``.txt`` is a caption, not a label). ``ScanOptions.label_column``
  names the one field to read instead;
* class names: the dataset's class-name file when there is one (``classes.json``, a JSON list,
  else ``classes.txt``, one name per line) in the folder of the shards; otherwise the sorted
  names the ``.cls`` files hold;
* ``packer.json`` (a field packer's export writes): ``{"key": record key}`` where the sample key
  cannot carry it, ``{"metadata": {...}}`` the record's metadata, ``{"unlabeled": true}`` a
  sample with no label on purpose (kept without ``allow_unlabeled``).
* a key that could leave a folder (``..``, an absolute path, a backslash, a NUL byte, too long:
  :func:`packer.core.paths.safe_relative`), from a member name or ``packer.json``, is never a
  record key: as the TFRecord, MDS and HF scans do, every sample is then keyed
  ``<shard stem>/<sample number>.<image field>`` and a warning names the keys refused.

The scan reads the tar headers with the standard library's ``tarfile`` in streaming mode and
keeps, per sample, only ``("range", shard, offset, size)`` of its image member: image bytes are
never read (label members, a few bytes each, are). A gzip shard (``.tar.gz``, ``.tgz``, or any
shard starting with the gzip magic) has no byte ranges: it is read in one pass, as webdataset
reads it, and its image members' bytes become ``("bytes", data)`` locators (each at most
``MAX_GZIP_MEMBER``, 256 MiB), held until the build takes them; damage there (a cut or corrupt
stream) ends that shard, the samples before it kept. Damage is reported per shard and member in
``Scan.problems`` and the scan goes on with the next shard: a member the tar ends inside, a
corrupt or cut header, a shard that ends without its end-of-archive blocks or has data after
them, a non-tar file, a duplicate field, a sample without an image or (unless
``allow_unlabeled``) without a label. Samples before the damage are kept; the sample the damage
falls in is not.

**Out** (``packer export STORE OUT --to webdataset --shard-size N``): ``OUT/<prefix>-000000.tar``,
... written by ``webdataset.ShardWriter`` (``maxcount=N``, no size cap; PAX headers where a name
needs them), one sample per record, fields in webdataset's own conventions:

* ``jpg``: the stored JPEG bytes as they are (a stored PNG/WebP keeps its own type and
  extension; decoded-pixel stores are written as lossless PNG);
* ``cls``: the class id as decimal text (class stores; an unlabeled record has none);
* ``json``: ``{"boxes": [[c, cx, cy, w, h], ...]}`` for box stores (floats written with every
  bit, so they read back as the same float32), the label-model dict for ``"objects"`` stores;
* ``packer.json``: the record key when the sample key plus the image extension does not spell
  it (``a.b.jpg``, ``x.JPEG``, keys with ``..``), the record metadata when there is any, and
  ``"unlabeled": true`` for a record with no label (a ``--no-labels`` store, a class record
  ``-1``), so that the export builds back without ``--allow-unlabeled``;
* ``OUT/classes.txt``: the store's class names, one per line, line *i* = class id *i*; plus
  ``OUT/classes.json`` (a JSON list) when a name would not survive a line file (a line break,
  blank or padded name). This is the side file convention the scan reads back.

The sample key is the record key without its image extension (``part0/img_00000``). Shards are
written in ``OUT/.<prefix>.partial`` and moved into OUT when all are complete: a failed export
leaves no shard behind.

The format is one package, a module per concern: :mod:`~packer.interchange.webdataset.tar`
(which shards, tar members grouped into samples), :mod:`~packer.interchange.webdataset.reader`
(fields -> keys, labels, class names) and :mod:`~packer.interchange.webdataset.writer` (the export).

Example:
    >>> from packer.interchange import ScanOptions, ExportOptions            # doctest: +SKIP
    >>> scan = FORMAT.scan("shards/data-{000000..000009}.tar", ScanOptions())   # doctest: +SKIP
    >>> with open_store("train.lmdb") as reader:                             # doctest: +SKIP
    ...     FORMAT.export(reader, "wds_out", ExportOptions(shard_size=1000)).shards
"""
from __future__ import annotations

from packer.interchange.base import CLASS_FILES, InterchangeFormat
from packer.interchange.webdataset.reader import MAX_SCAN_WORKERS, PARALLEL_MIN_BYTES, TEXT_FIELDS, scan
from packer.interchange.webdataset.tar import IMAGE_FIELDS, base_plus_ext, detect
from packer.interchange.webdataset.writer import export

#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat("webdataset", detect, scan, export)

__all__ = ["FORMAT", "detect", "scan", "export", "base_plus_ext", "IMAGE_FIELDS", "CLASS_FILES", "TEXT_FIELDS",
           "PARALLEL_MIN_BYTES", "MAX_SCAN_WORKERS"]
