"""The HDF5 store's file layout: attribute and dataset names, chunking and size constants, and
how the file is opened (``h5py`` imported lazily, file locking switched per use).

Writer, reader and store class all name the same datasets through these constants; the layout
itself is described in the :mod:`packer.stores.hdf5` package docstring.
"""
from __future__ import annotations

import os

from packer.core.deps import optional_import

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
META_ATTR = "packer_metadata"
LAYOUT_ATTR = "packer_layout"
OPTIONS_ATTR = "packer_writer_options"
STATE_DSET = "_resume_state"
CLEAN_ATTR = "_closed_cleanly"      # on a partial file: closed by the writer, not killed

DEFAULT_CHUNK_BYTES = 128 << 10     # jpeg_bytes chunk: a few records; small random-read overhead
DEFAULT_CACHE_BYTES = 16 << 20      # reader chunk cache per dataset (rdcc_nbytes)
ROWS_PER_CHUNK = 1024               # per-record datasets (keys, checksums, offsets, ...)
CHECKSUM_LEN = 32                   # BLAKE2b-128 hex
READ_DATASETS = ("jpeg_bytes", "jpeg_offsets", "pixels", "keys", "checksums", "record_meta",
                 "record_meta_offsets", "class_ids", "boxes", "box_offsets")
#: (data, offsets) pairs: record i is data[offsets[i]:offsets[i+1]]
BLOB_PAIRS = (("jpeg_bytes", "jpeg_offsets"), ("record_meta", "record_meta_offsets"), ("boxes", "box_offsets"))
#: datasets with one entry per record
ROW_DATASETS = ("keys", "checksums", "class_ids", "pixels")
#: Room kept free beyond a batch's own bytes: B-tree nodes, heaps, the resume state and the
#: clean-close mark. HDF5 must never meet a full disk (see HDF5Writer._writing).
WRITE_MARGIN = 4 << 20
#: How much any HDF5 compression filter can shrink data (deflate's limit is about 1032:1): a
#: dataset declaring more bytes than this times the file's size cannot be stored in the file.
MAX_COMPRESSION = 1100


def import_h5py():
    """The ``h5py`` module; DependencyError saying what to install when it is missing."""
    return optional_import("h5py", "the HDF5 store", package="h5py")


def open_h5(path: str, mode: str, locking, **kw):
    """``h5py.File`` with a file-locking mode, on HDF5 builds too old to take one as well.

    Readers pass ``locking=False`` (read-only opens need no lock, and locks fail on NFS,
    h5py#1082); writers pass ``"best-effort"`` (lock where the file system can).
    """
    h5py = import_h5py()
    try:
        return h5py.File(path, mode, locking=locking, **kw)
    except (TypeError, ValueError) as exc:
        if "lock" not in str(exc):
            raise
        # HDF5 < 1.10.7 / 1.12.1: only the environment variable switches locking off, and
        # only when the user has not chosen a setting.
        if locking is False:
            os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
        return h5py.File(path, mode, **kw)
