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
at a time (the codec library ``streaming`` uses), never past the index's raw size plus one byte
and their samples carry their image bytes (``("bytes", data)``); where the decompressed
``raw_data`` file lies beside it (``StreamingDataset``'s local cache), that file is read instead.

Damage is listed in ``Scan.problems`` by shard (``shard.00003.mds``) or shard and sample
(``shard.00003.mds:sample 17``) and the scan goes on: a shard listed in the index but missing; a
shard whose size or hash (the first of ``raw_data.hashes`` / ``zip_data.hashes`` this Python can
compute, e.g. ``xxh64`` or ``sha1``; ``streaming``'s algorithms) does not match ``index.json``
(one problem for the shard, whose samples are all left out: which bytes changed is unknown); a
compressed shard that does not decompress or whose zstd/snappy headers declare another raw size
than the index (refused before anything is inflated); an uncompressed shard smaller than the
index says (one problem for the shard, declared vs found size: its hash cannot be checked, which
is damage, whether the shard was cut short or the index overstates it; its samples that lie whole
before the cut are read and kept under ``--on-corrupt skip``, each sample past the cut is one more
problem, naming shard and sample); a bad header or offset table; a sample whose column sizes do
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

The format is one package, a module per concern (as ``streaming/base/format/mds/`` splits it):
:mod:`~packer.interchange.mds.index` (finding the dataset, ``index.json``),
:mod:`~packer.interchange.mds.columns` (which column holds what, decoding payloads),
:mod:`~packer.interchange.mds.shards` (shard files, hashes, decompression),
:mod:`~packer.interchange.mds.reader` (the scan) and :mod:`~packer.interchange.mds.writer` (the export).

Example:
    >>> from packer.interchange import get_format, ScanOptions, ExportOptions   # doctest: +SKIP
    >>> scan = get_format("mds").scan("mds_train/", ScanOptions())             # doctest: +SKIP
    >>> with open_store("train.lmdb") as reader:                               # doctest: +SKIP
    ...     get_format("mds").export(reader, "mds_out", ExportOptions(shard_size=1000)).shards
"""
from __future__ import annotations

from packer.interchange.base import CLASS_FILES, InterchangeFormat
from packer.interchange.mds.columns import COCO_COLUMNS, IMAGE_ENCODINGS, IMAGE_NAMES, LABEL_NAMES
from packer.interchange.mds.index import INDEX, KEY_COLUMN, METADATA_COLUMN, NAME, detect
from packer.interchange.mds.reader import scan
from packer.interchange.mds.writer import EXPORT_HASHES, SIZE_CAP, export

#: The format object :mod:`packer.interchange` registers.
FORMAT = InterchangeFormat(NAME, detect, scan, export)

__all__ = ["FORMAT", "detect", "scan", "export", "CLASS_FILES", "EXPORT_HASHES", "COCO_COLUMNS", "IMAGE_ENCODINGS",
           "IMAGE_NAMES", "INDEX", "KEY_COLUMN", "LABEL_NAMES", "METADATA_COLUMN", "NAME", "SIZE_CAP"]
