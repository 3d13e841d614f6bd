"""LMDB store: encoded JPEG bytes per record, in an LMDB environment (a folder).

Layout (named sub-databases of one environment, keys are 8-byte big-endian indices unless
stated)::

    data      index -> JPEG bytes
    records   index -> record metadata (JSON, see packer.core.records.Record.meta_dict)
    keys      utf-8 relative path -> index (8-byte big-endian)
    meta      b"metadata" -> StoreMetadata JSON (written last: marks a complete store)
              b"progress" -> ResumeState JSON (while building)

Writes go to ``<out>.partial/`` and the folder is renamed onto ``<out>`` on success. The map
grows by doubling whenever a batch does not fit, so ``MapFullError`` never reaches the user.
Readers open the environment read-only without locking, lazily in their own process.

The package holds one module per concern: ``layout`` (names, sizes, the data file's meta pages),
``envs`` (read-only environments shared within a process), ``writer``, ``reader`` and
``salvage`` (reading a damaged ``data.mdb`` page by page); this module holds the store class,
registered here.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from packer.core.errors import StoreError, UsageError
from packer.stores import register_store
from packer.stores.base import Store
from packer.stores.lmdb.envs import acquire_env, release_env
from packer.stores.lmdb.layout import INITIAL_MAP, expected_data_size, import_lmdb, truncation_problem
from packer.stores.lmdb.reader import LMDBReader, record_from_parts
from packer.stores.lmdb.salvage import LMDBScanReader, has_packer_pages, holds_nothing, scan_leaf_nodes
from packer.stores.lmdb.writer import LMDBWriter

log = logging.getLogger(__name__)


@register_store
class LMDBStore(Store):
    """LMDB environment folder (``data.mdb`` + ``lock.mdb``)."""

    name = "lmdb"
    description = "LMDB environment folder: encoded JPEG bytes per record (fast random reads)"
    writer_options = {"map_size": "initial map size in bytes (default 256 MiB); it doubles whenever "
                                  "a batch does not fit, so this only tunes how often"}
    reader_options = {}
    suffixes = (".lmdb",)
    folder = True

    @classmethod
    def claims(cls, location: str) -> bool:
        p = Path(location)
        return p.is_dir() and (p / "data.mdb").is_file()

    @classmethod
    def exists(cls, location: str, **connection) -> bool:
        # Anything at the path is in the way of publishing there, store or not.
        return os.path.lexists(location)

    @classmethod
    def is_store(cls, location: str, **connection) -> bool:
        """An LMDB environment holding packer's named databases (data, records, keys, meta):
        published or staging. One cut short or damaged counts when a scan of its pages finds
        packer's metadata or a record's fields; another program's LMDB does not."""
        if not cls.claims(location):
            return False
        location = str(location)
        try:
            if truncation_problem(location) is None:
                _, _, fid = acquire_env(location)
                release_env(fid)
                return True
        except StoreError:           # no LMDB meta page: not an LMDB data file at all
            return False
        except import_lmdb().NotFoundError:
            # A sound environment without packer's databases: another program's, unless it holds
            # nothing at all (a build killed before its first commit: nothing to lose there).
            return holds_nothing(location)
        except (import_lmdb().Error, OSError) as exc:
            log.debug("%s: LMDB refuses it (%s); looking for packer's pages", location, exc)
        return has_packer_pages(Path(location) / "data.mdb")

    @classmethod
    def create_writer(cls, location: str, **options) -> "LMDBWriter":
        commit_bytes = options.pop("commit_bytes", None)
        cls.check_options(options, "writer")
        kw = {} if commit_bytes is None else {"commit_bytes": int(commit_bytes)}
        try:
            map_size = int(options.get("map_size", INITIAL_MAP))
        except ValueError:
            raise UsageError(f"lmdb: map_size must be a number of bytes, got {options['map_size']!r}") from None
        return LMDBWriter(str(location), map_size=map_size, **kw)

    @classmethod
    def open_reader(cls, location: str, **options) -> "LMDBReader":
        cls.check_options(options, "reader")
        return LMDBReader(str(location))

    @classmethod
    def record_from_parts(cls, location, label_schema, index, raw_meta, data):
        return record_from_parts(location, label_schema, index, raw_meta, data)

    @classmethod
    def open_salvage(cls, location: str, **options) -> "LMDBReader":
        """A reader that survives missing metadata and a ``data.mdb`` cut short.

        A short file is read through a copy padded with zeros (sparse) to the size LMDB's meta
        pages say, so pages that were lost read as zeros, which LMDB reports as corrupt
        (``lmdb.Error``, a RecordError per record) instead of SIGBUS.
        """
        cls.check_options(options, "reader")
        location = str(location)
        if not (Path(location) / "data.mdb").is_file():
            raise StoreError(f"{location}: no LMDB store here")
        cut = truncation_problem(location)
        if cut is None:
            try:
                return LMDBReader(location, salvage=True)
            except StoreError as exc:
                if not isinstance(exc.__cause__, import_lmdb().Error):
                    raise
                cut = f"{location}: LMDB B-tree damaged ({exc.__cause__}); records read by page scan"
        # The B-tree roots live at the end of the file (copy-on-write appends), so a file cut
        # short has lost them: read the surviving pages directly instead of through the tree.
        return LMDBScanReader(location, cut)


__all__ = ["LMDBStore", "LMDBWriter", "LMDBReader", "LMDBScanReader", "expected_data_size",
           "truncation_problem", "scan_leaf_nodes"]
