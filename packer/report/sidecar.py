"""Where a store's last verify result and its build report live, so a report can show them.

``packer verify`` saves its result next to the store as ``<store>.verify.json`` (for a
server URL: in the working directory, like the build report ``<store>.report.json``). The
file is small: the status, when it ran, and the problems (capped). Neither its name nor its
text ever holds a connection string's password (:func:`packer.core.uri.redact`).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Optional

from packer.core.records import loads_bounded
from packer.core.uri import redact

log = logging.getLogger(__name__)

#: Problems kept in the sidecar; a store with more lists the first ones and the total.
MAX_SAVED_PROBLEMS = 10_000


def _next_to(location: str, suffix: str) -> Path:
    from packer.jobs.reports import default_report_path

    path = default_report_path(str(location))  # <store>.report.json, cwd for server URLs
    return path.with_name(redact(path.name[: -len(".report.json")]) + suffix)


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
    """Write ``report`` (a :class:`packer.jobs.reports.VerifyReport`) with the current UTC time, atomically.

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
    d["location"] = redact(d["location"])
    write_atomic(path, redact(json.dumps(d, indent=1, sort_keys=True)))
    return path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path`` and rename it over ``path``.

    A reader never sees a half-written file, and two writers at once each publish a whole
    file (the last rename wins) instead of interleaving in one temporary file. The file gets
    the mode any plain write would give it: that of the file it replaces, else 0666 less the
    umask (``mkstemp`` alone makes it 0600, private whatever the umask says).
    """
    mode = _plain_write_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _plain_write_mode(path: Path) -> int:
    """Permission bits ``open(path, "w")`` would leave: the existing file's, else 0666 & ~umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc), else set and
    restored at once (the only portable way)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError) as exc:   # no /proc (macOS): the portable way below
        log.debug("umask not read from /proc/self/status (%s)", exc)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
