"""packer: pack image folders into checked LMDB / HDF5 / MongoDB stores.

Public API::

    from packer import build, verify, info, repair, convert, export, open_store, available_formats

    report = build("data/images", "data/labels", "train.lmdb", format="lmdb")
    assert verify("train.lmdb", deep=True).ok
    with open_store("train.lmdb") as store:
        record = store.get(0)          # packer.records.Record: key, JPEG bytes, label, ...
"""
__version__ = "0.1.0"

from .api import BuildReport, InfoReport, Problem, VerifyReport, build, info, verify  # noqa: E402
from .errors import (DependencyError, ImageError, LockedError, PackerError, RecordError,  # noqa: E402
                     SourceError, StoreError, UsageError, WorkerError)
from .records import Record, StoreMetadata  # noqa: E402
from .stores import available_formats, get_store, open_store  # noqa: E402
# The functions shadow their modules' names on the package (packer.repair is the function);
# ``from packer.repair import RepairReport`` still reaches the module.
from .convert import ConvertReport, convert  # noqa: E402
from .export import ExportReport, export  # noqa: E402
from .repair import RepairReport, repair  # noqa: E402

__all__ = ["build", "verify", "info", "repair", "convert", "export", "open_store", "available_formats",
           "get_store", "BuildReport", "VerifyReport", "InfoReport", "RepairReport", "ConvertReport",
           "ExportReport", "Problem", "Record", "StoreMetadata",
           "PackerError", "UsageError", "SourceError", "ImageError", "StoreError", "RecordError",
           "DependencyError", "LockedError", "WorkerError", "__version__"]
