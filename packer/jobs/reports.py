"""What the jobs return: one dataclass per report, and the build report's file.

Every report redacts the location it names (a report is shown and shared: no password in it).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from packer.core.diskspace import full_disk_as_error
from packer.core.errors import DiskFullError
from packer.core.uri import redact


@dataclass
class BuildReport:
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

    def __post_init__(self):
        self.location = redact(self.location)  # a report is shown and shared: no password in it

    @property
    def ok(self) -> bool:
        return self.published and not self.rejected

    def to_dict(self) -> dict:
        return asdict(self)


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


@dataclass
class VerifyReport:
    location: str
    format: str
    count: int
    checked: int
    deep: bool
    problems: list = field(default_factory=list)

    def __post_init__(self):
        self.location = redact(self.location)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


@dataclass
class InfoReport:
    """``encoding`` is what records hold: ``"jpeg"`` or ``"raw"`` pixels of ``raw_shape``; the
    statistics in ``metadata["stats"]`` describe the images as checked at build time."""

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

    def __post_init__(self):
        self.location = redact(self.location)

    def to_dict(self) -> dict:
        return asdict(self)


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


__all__ = ["BuildReport", "Problem", "VerifyReport", "InfoReport", "default_report_path", "write_build_report"]
