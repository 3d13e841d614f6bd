"""Where a store's last verify result and its build report live, so a report can show them.

``packer verify`` saves its result next to the store as ``<store>.verify.json`` (for a
server URL: in the working directory, like the build report ``<store>.report.json``). The
file is small: the status, when it ran, and the problems (capped).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

from ..records import loads_bounded

log = logging.getLogger(__name__)

#: Problems kept in the sidecar; a store with more lists the first ones and the total.
MAX_SAVED_PROBLEMS = 10_000


def _next_to(location: str, suffix: str) -> Path:
    from ..api import default_report_path

    path = default_report_path(str(location))  # <store>.report.json, cwd for server URLs
    return path.with_name(path.name[: -len(".report.json")] + suffix)


def verify_sidecar_path(location: str) -> Path:
    """``<store>.verify.json`` (in the working directory for a ``mongodb://`` URL)."""
    return _next_to(location, ".verify.json")


def build_report_path(location: str) -> Path:
    """The build report's default path, ``<store>.report.json``."""
    return _next_to(location, ".report.json")


def verify_to_dict(report) -> dict:
    """A VerifyReport (or a dict from one) as JSON-able dict with ``ok`` and ``problems`` dicts."""
    if isinstance(report, dict):
        return dict(report)
    d = report.to_dict()
    d["problems"] = [{"key": p.key, "index": p.index, "reason": p.reason} for p in report.problems]
    return d


def save_verify(report, path: Optional[Path] = None) -> Path:
    """Write ``report`` (a :class:`packer.api.VerifyReport`) with the current UTC time, atomically.

    Returns:
        The path written.

    Raises:
        OSError: the file cannot be written (callers that treat the sidecar as optional log it).
    """
    d = verify_to_dict(report)
    problems = d.get("problems", [])
    d["problems_total"] = len(problems)
    d["problems"] = problems[:MAX_SAVED_PROBLEMS]
    d["when"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    path = Path(path) if path else verify_sidecar_path(d["location"])
    write_atomic(path, json.dumps(d, indent=1, sort_keys=True))
    return path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path`` and rename it over ``path``.

    A reader never sees a half-written file, and two writers at once each publish a whole
    file (the last rename wins) instead of interleaving in one temporary file.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_json(path: Path) -> Optional[dict]:
    """The JSON object at ``path``, or None when it is missing or unreadable (logged)."""
    try:
        with open(path, "rb") as fh:
            d = loads_bounded(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot read (%s); the report leaves it out", path, exc)
        return None
    return d if isinstance(d, dict) else None
