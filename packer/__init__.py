"""packer: pack image folders into checked LMDB / HDF5 / MongoDB stores.

The public API is what this module exports (``__all__``); everything else may move between
releases. The CLI (``packer ...``) is a thin layer over these functions::

    from packer import build, verify, info, repair, convert, export, open_store

    report = build("data/images", "data/labels", "train.lmdb", format="lmdb")
    assert verify("train.lmdb", deep=True).ok
    with open_store("train.lmdb") as store:
        record = store.get(0)          # packer.Record: key, JPEG bytes, label, checksums...

Jobs: :func:`build`, :func:`verify`, :func:`info`, :func:`repair`, :func:`convert`,
:func:`export`, :func:`export_dataset`, :func:`merge`, :func:`append`, each returning a report
dataclass. Stores: :func:`open_store`, :func:`get_store`, :func:`available_formats`. Errors: every
exception packer raises is a :class:`PackerError`. docs/architecture.md shows where each part lives.
"""
from packer.core.errors import (
                                DependencyError,
                                DiskFullError,
                                ImageError,
                                LockedError,
                                PackerError,
                                RecordError,
                                SourceError,
                                StoreError,
                                UsageError,
                                WorkerError,
                                WriteError,
)
from packer.core.records import Record, StoreMetadata
from packer.jobs.append import append
from packer.jobs.build import build
from packer.jobs.convert import convert
from packer.jobs.export import export, export_dataset
from packer.jobs.merge import merge
from packer.jobs.options import BuildOptions
from packer.jobs.repair import repair
from packer.jobs.reports import (
                                BuildReport,
                                ConvertReport,
                                DatasetExportReport,
                                ExportReport,
                                InfoReport,
                                MergeReport,
                                Problem,
                                RepairReport,
                                VerifyReport,
)
from packer.jobs.verify import info, verify
from packer.stores import available_formats, get_store, open_store
from packer.version import __version__

__all__ = [
    # jobs
    "build", "verify", "info", "repair", "convert", "export", "export_dataset", "merge", "append",
    "BuildOptions",
    # reports
    "BuildReport", "VerifyReport", "InfoReport", "Problem", "RepairReport", "ConvertReport", "ExportReport",
    "DatasetExportReport", "MergeReport",
    # stores and records
    "open_store", "get_store", "available_formats", "Record", "StoreMetadata",
    # errors
    "PackerError", "UsageError", "SourceError", "ImageError", "StoreError", "RecordError", "DependencyError",
    "LockedError", "WorkerError", "DiskFullError", "WriteError",
    "__version__",
]
