"""What the jobs return: every report dataclass, on one base, and the build report's file.

Every report is a :class:`Report`: a dataclass whose every string (its location, its source,
its outputs, shard locations, notes, the problems and actions it lists, in lists and nested
dicts alike) is redacted (:func:`packer.core.uri.redact_values`) when it is made, again in
:meth:`Report.to_dict` and in ``repr()``/``str()`` (a field set later is masked there too): a
report is shown, logged, printed as ``--json`` and saved, so it never holds a password.

Example:
    >>> rep = MergeReport("mongodb://carol:S3cret@db1/data/all", "mongo", 2, 10, True, 0.5)
    >>> rep.location
    'mongodb://carol:***@db1/data/all'
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Optional

from packer.core.diskspace import full_disk_as_error
from packer.core.errors import DiskFullError
from packer.core.uri import redact, redact_values


class Report:
    """The base of every report: no password in anything it shows or returns.

    Subclasses are dataclasses declared ``@dataclass(repr=False)`` (the ``repr`` here masks
    fields set after construction as well). ``to_dict`` adds ``"ok"`` when :attr:`dict_ok`.
    """

    #: whether :meth:`to_dict` carries ``"ok"``
    dict_ok: ClassVar[bool] = True

    def __post_init__(self):
        for f in fields(self):
            setattr(self, f.name, redact_values(getattr(self, f.name)))

    @property
    def ok(self) -> bool:
        return True

    def to_dict(self) -> dict:
        """The report as plain JSON-ready data, every string in it redacted."""
        d = redact_values(asdict(self))
        if self.dict_ok:
            d["ok"] = self.ok
        return d

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={redact_values(getattr(self, f.name))!r}" for f in fields(self) if f.repr)
        return redact(f"{type(self).__name__}({shown})")


@dataclass(repr=False)
class BuildReport(Report):
    """What a build did.

    ``published`` is False when damaged inputs were found under ``on_corrupt="fail"`` or
    ``"stop"``: the good records stay in the staging area, and a rerun (for instance with
    ``on_corrupt="skip"``) resumes from there. ``rejected`` also lists the inputs that could not
    be read or stored at all (a folder that cannot be listed, a name that is not UTF-8; their
    ``kind`` says which, see :func:`packer.sources.folders.scan_images`); ``ignored_reasons`` says why
    each ``ignored`` file was left out.
    """

    location: str
    format: str
    published: bool
    records: int
    inputs: int
    rejected: list
    converted: list
    notes: list
    ignored: list
    resumed_from: int
    report_path: str
    label_schema: str
    ignored_reasons: dict = field(default_factory=dict)

    dict_ok: ClassVar[bool] = False

    @property
    def ok(self) -> bool:
        return self.published and not self.rejected


@dataclass
class Problem:
    """One thing wrong with a store. ``key``/``index`` are None for store-level problems."""

    reason: str
    key: Optional[str] = None
    index: Optional[int] = None

    def __post_init__(self):
        self.reason = redact(self.reason)

    def __str__(self) -> str:
        if self.key is None:
            return self.reason
        return f"key {self.key!r} (index {self.index}): {self.reason}"


@dataclass(repr=False)
class VerifyReport(Report):
    """What verify found: ``problems`` lists every :class:`Problem` (empty when the store is good)."""

    location: str
    format: str
    count: int
    checked: int
    deep: bool
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(repr=False)
class InfoReport(Report):
    """``encoding`` is what records hold: ``"jpeg"`` or ``"raw"`` pixels of ``raw_shape``; the
    statistics in ``metadata["stats"]`` describe the records the store holds (a repair counts
    them again), except ``inputs``/``rejected``/``ignored``, which describe the build."""

    location: str
    format: str
    count: int
    size_bytes: int
    metadata: dict
    encoding: str = "jpeg"
    raw_shape: Optional[list] = None
    #: Per-channel pixel mean/std (0..1) of a seeded sample, for Normalize; see
    #: :func:`packer.stores.sampling.pixel_stats`. None when not computed.
    pixels: Optional[dict] = None

    dict_ok: ClassVar[bool] = False


@dataclass(repr=False)
class ConvertReport(Report):
    """What convert did. ``resumed_from``: records a killed earlier run had already staged."""

    source: str
    source_format: str
    location: str
    format: str
    records: int
    quarantined: int
    resumed_from: int
    index_checksum: str

    @property
    def ok(self) -> bool:
        return True


@dataclass(repr=False)
class ExportReport(Report):
    """What export wrote. ``labels`` is the LABELS argument for ``packer build`` (None when the
    class folders carry the labels); ``refused`` lists keys not written (unsafe paths)."""

    location: str
    out: str
    images: str
    labels: Optional[str]
    label_form: str
    records: int
    identical: int
    reencoded: list = field(default_factory=list)
    modified: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    labels_skipped: list = field(default_factory=list)
    #: what the label files could not reproduce exactly (also logged as warnings)
    label_notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused


@dataclass(repr=False)
class DatasetExportReport(Report):
    """What :func:`export_dataset` wrote."""

    location: str
    out: str
    to: str
    records: int = 0
    shards: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return True


@dataclass(repr=False)
class MergeReport(Report):
    """What a merge did: ``copied`` False for a manifest, True for a physical copy."""

    location: str
    format: str
    shards: int
    records: int
    copied: bool
    seconds: float
    resumed_from: int = 0

    @property
    def ok(self) -> bool:
        return True


@dataclass(repr=False)
class RepairReport(Report):
    """What repair found and did (or, with ``dry_run``, would do).

    Attributes:
        actions: one dict per action: ``action`` (see :data:`ACTIONS`), ``key``, ``index`` (position
            before the repair, None when unknown), ``damage`` (what verify found), ``detail``.
        store_problems: store-level damage found (metadata, file size, index databases).
        unrepaired: the actions that could not be carried out (``lost`` records), listed again.
        records: live records after the repair (before it, for a dry run).
        backup: where the old store was moved (kept until the user removes it), or None.
        verified: ``verify --deep`` passes on the repaired store (None for a dry run / no-op).
    """

    location: str
    format: str
    dry_run: bool
    nothing_to_repair: bool
    actions: list = field(default_factory=list)
    store_problems: list = field(default_factory=list)
    unrepaired: list = field(default_factory=list)
    records: int = 0
    quarantined: int = 0
    backup: Optional[str] = None
    verified: Optional[bool] = None
    report_path: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.unrepaired and self.verified is not False

    def save(self, report_path=None) -> Path:
        """Write this report as JSON, atomically (temporary file + rename), and set ``report_path``.

        Every run writes its report; a dry run's plan goes next to it, never over a real one.

        Args:
            report_path: where to write; default: next to the store, ``*.repair.json``
                (``*.repair-plan.json`` for a dry run).

        Returns:
            The path written.

        Example:
            >>> report.save()   # doctest: +SKIP
            PosixPath('train.lmdb.repair.json')
        """
        suffix = ".repair-plan.json" if self.dry_run else ".repair.json"
        path = Path(report_path) if report_path else Path(
            str(default_report_path(self.location)).replace(".report.json", suffix))
        self.report_path = str(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        os.replace(tmp, path)
        return path


def default_report_path(location: str) -> Path:
    """Where a build's report goes: next to the output (cwd for a server URL)."""
    if "://" in location:
        return Path.cwd() / (location.rstrip("/").rsplit("/", 1)[-1].split("?")[0] + ".report.json")
    return Path(str(location).rstrip("/") + ".report.json")


def write_build_report(path: Path, report: BuildReport, extra: dict) -> None:
    """Write ``report`` with ``extra`` fields as JSON at ``path``, atomically (a full disk says so)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with full_disk_as_error(path, what="the build report",
                                note=f"{report.location} was {'published' if report.published else 'not published'}"):
            tmp.write_text(json.dumps({**report.to_dict(), **extra}, indent=1, sort_keys=True))
    except DiskFullError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


__all__ = ["Report", "BuildReport", "Problem", "VerifyReport", "InfoReport", "ConvertReport", "ExportReport",
           "DatasetExportReport", "MergeReport", "RepairReport", "default_report_path", "write_build_report"]
