"""HDF5 store: one ``.h5`` file, chunked and Fletcher32-checksummed, readable by standard tools.

Layout (``h5ls -r store.h5`` shows it; every dataset has a ``description`` attribute)::

    /                 attrs: packer_layout ("jpeg" or "pixels"), packer_metadata (StoreMetadata
                      JSON, written last: its presence marks a complete store)
    /jpeg_bytes       uint8  (total_bytes,)   every record's JPEG bytes, back to back      [jpeg]
    /jpeg_offsets     int64  (N+1,)           record i is jpeg_bytes[off[i]:off[i+1]]      [jpeg]
    /pixels           uint8  (N, H, W, 3)     decoded RGB, one image per chunk           [pixels]
    /keys             utf-8 strings (N,)      image path relative to the IMAGES folder
    /checksums        ascii  (N,)             BLAKE2b-128 hex of the stored bytes / pixels
    /class_ids        int64  (N,)             class labels ("class" stores)
    /boxes            float32 (M, 5)          YOLO rows class cx cy w h, all records     ("boxes")
    /box_offsets      int64  (N+1,)           record i owns boxes[off[i]:off[i+1]]       ("boxes")
    /record_meta      uint8  (bytes,)         Record fields but data and label, JSON per record
    /record_meta_offsets int64 (N+1,)         record i = record_meta[off[i]:off[i+1]]

The JPEG bytes live in one chunked 1-D dataset plus offsets rather than a variable-length
dataset: h5py's vlen reads are slow and HDF5 >= 1.12.1 refuses filters (Fletcher32 included)
on vlen data. Fletcher32 on ``jpeg_bytes`` / ``pixels`` / ``record_meta`` makes a damaged chunk
fail to read; the reader turns that into :class:`~packer.core.errors.RecordError` naming the key.
``record_meta`` repeats key and checksum so that ``get`` reads only numeric datasets (string
datasets cost ~10x more per read in h5py); ``keys`` and ``checksums`` are there for people and
tools (``h5dump -d keys``), ``index_of`` and the index checksum.

Pixel mode (writer option ``pixels=HxW``) stores decoded, resized RGB instead of JPEG bytes:
no decode at read time, at the cost of size (``compression=lzf|gzip[:level]`` helps).

Writes go to ``<out>.partial`` (resume state in ``/_resume_state`` while building) and the
file is renamed onto ``<out>`` at publish. Readers open the file lazily in the process that
uses them (re-opening after a fork), read-only and without HDF5 file locking (NFS-safe).

Example:
    >>> from packer.stores import open_store                     # doctest: +SKIP
    >>> with open_store("train.h5") as store:
    ...     rec = store.get(0); print(rec.key, rec.label, store.encoding)

The package holds one module per concern: ``layout`` (names, constants, opening the file),
``options`` (writer/reader options), ``pixels`` (pixel mode conversion), ``writer``, ``reader``
and ``salvage`` (reading around damage); this module holds the store class, registered here.
"""
from __future__ import annotations

import logging
import os
import re

from packer.core.diskspace import disk_full, is_disk_full
from packer.core.errors import StoreError, UsageError
from packer.stores import register_store
from packer.stores.base import Store, remove_path
from packer.stores.hdf5.layout import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_CHUNK_BYTES,
    HDF5_SIGNATURE,
    LAYOUT_ATTR,
    META_ATTR,
    open_h5,
)
from packer.stores.hdf5.options import parse_bytes, parse_compression, parse_pixels
from packer.stores.hdf5.pixels import decode_resize, to_pixel_record
from packer.stores.hdf5.reader import HDF5Reader
from packer.stores.hdf5.salvage import cut_heap
from packer.stores.hdf5.writer import HDF5Writer

log = logging.getLogger(__name__)


@register_store
class HDF5Store(Store):
    """One HDF5 file (``.h5``): JPEG bytes (default) or decoded pixels, Fletcher32-checked."""

    name = "hdf5"
    description = "single HDF5 file: JPEG bytes in a chunked dataset, or pre-decoded pixels (pixels=HxW)"
    writer_options = {
        "pixels": "HxW: store decoded RGB resized to H x W instead of JPEG bytes (no decode at read time)",
        "compression": "pixel mode only: none (default), lzf, gzip or gzip:LEVEL",
        "chunk_bytes": f"chunk size of the JPEG byte dataset (default {DEFAULT_CHUNK_BYTES >> 10}K)",
    }
    reader_options = {
        "cache_bytes": f"HDF5 chunk cache per dataset (default {DEFAULT_CACHE_BYTES >> 20}M)",
    }
    suffixes = (".h5", ".hdf5")
    can_hold_pixels = True

    @classmethod
    def claims(cls, location: str) -> bool:
        try:
            with open(location, "rb") as fh:
                return fh.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
        except OSError:   # missing, a directory, unreadable
            return False

    @classmethod
    def exists(cls, location: str) -> bool:
        # Any file there would be replaced at publish: build refuses early unless overwrite.
        return os.path.lexists(location)

    @classmethod
    def is_store(cls, location: str, **connection) -> bool:
        """An HDF5 file whose root carries packer's ``packer_layout`` attribute (written when
        the file is created, so staging files and stores whose metadata was lost count). A file
        HDF5 cannot open (cut short, killed mid-write) counts when the attribute's name is in
        its first 64 KiB, where the root group's header is; another program's HDF5 does not."""
        if not cls.claims(location):
            return False
        try:
            with open_h5(str(location), "r", False) as f:
                return LAYOUT_ATTR in f.attrs
        except OSError as exc:
            log.debug("%s: HDF5 refuses it (%s); looking for packer's attribute", location, exc)
        try:
            with open(location, "rb") as fh:
                return LAYOUT_ATTR.encode() in fh.read(1 << 16)
        except OSError:
            return False

    @classmethod
    def create_writer(cls, location: str, **options) -> "HDF5Writer":
        commit_bytes = options.pop("commit_bytes", None)
        cls.check_options(options, "writer")
        kw = {} if commit_bytes is None else {"commit_bytes": int(commit_bytes)}
        pixels = parse_pixels(options.get("pixels"))
        compression = parse_compression(options.get("compression"))
        if compression[0] and pixels is None:
            raise UsageError("hdf5: option compression applies to pixel mode only (JPEG bytes do not "
                             "compress); add pixels=HxW or drop compression")
        chunk_bytes = parse_bytes(options.get("chunk_bytes", DEFAULT_CHUNK_BYTES), "chunk_bytes")
        return HDF5Writer(str(location), pixels=pixels, compression=compression,
                          chunk_bytes=chunk_bytes, **kw)

    @classmethod
    def open_reader(cls, location: str, **options) -> "HDF5Reader":
        cls.check_options(options, "reader")
        cache = parse_bytes(options.get("cache_bytes", DEFAULT_CACHE_BYTES), "cache_bytes")
        return HDF5Reader(str(location), cache_bytes=cache)

    @classmethod
    def open_salvage(cls, location: str, **options) -> "HDF5Reader":
        """A reader that survives missing metadata and a file cut short.

        HDF5 refuses a file shorter than its superblock's end-of-file address; salvage reads a
        copy padded with zeros (sparse) to that size. The chunk B-trees are written near the
        end of the file, so a file cut short usually keeps no readable record: those are rebuilt
        from ``--source`` by repair.
        """
        cls.check_options(options, "reader")
        location = str(location)
        try:
            return HDF5Reader(location, salvage=True)
        except StoreError as exc:
            m = re.search(r"stored_eof = (\d+)", str(exc))
            if not m:
                raise
            need, cut = int(m.group(1)), str(exc)
        import tempfile
        tmp = tempfile.mkdtemp(prefix=".salvage-", dir=os.path.dirname(os.path.abspath(location)))
        copy = os.path.join(tmp, "store.h5")
        try:
            import shutil
            shutil.copyfile(location, copy)
            os.truncate(copy, need)
            reader = HDF5Reader(location, file_path=copy, salvage=True, lost_heap=cut_heap(location))
        except OSError as exc:
            remove_path(tmp)
            if is_disk_full(exc):
                raise disk_full(copy, cause=exc, needed=os.path.getsize(location),
                                what="a padded copy of the store to read it") from exc
            raise StoreError(f"{location}: cannot make a padded copy to read the store: {exc}") from exc
        except BaseException:
            remove_path(tmp)
            raise
        reader.salvage_problems.insert(0, cut)
        return reader


__all__ = ["HDF5Store", "HDF5Writer", "HDF5Reader", "parse_pixels", "parse_compression", "parse_bytes",
           "decode_resize", "to_pixel_record", "HDF5_SIGNATURE", "META_ATTR", "LAYOUT_ATTR",
           "DEFAULT_CHUNK_BYTES", "DEFAULT_CACHE_BYTES"]
