"""See the dataset: one self-contained HTML page per store, build, verify or repair.

``write_html`` is the entry point the CLI's ``packer report`` and ``--html FILE`` options use::

    from packer import verify
    from packer.report import write_html
    write_html("train.html", "train.lmdb", verify_report=verify("train.lmdb"))

Layout: :mod:`.data` collects facts (metadata, a seeded sample, thumbnails, problems),
:mod:`.plots` draws them with matplotlib, :mod:`.html` renders the page, :mod:`.images`
decodes and draws labels, :mod:`.sampling` picks and reads the sample (also used by
``packer info`` for the pixel mean/std), :mod:`.sidecar` keeps the last verify result.
matplotlib is the optional extra ``packer-vision[report]``; only :mod:`.plots` imports it.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from packer.core.writes import writes_to
from packer.report.data import ReportData, collect
from packer.report.sidecar import save_verify, verify_sidecar_path, write_atomic
from packer.stores.outputs import check_output
from packer.stores.sampling import pixel_stats, sample_indices

log = logging.getLogger(__name__)


@writes_to("path", what="the HTML report")
def write_html(path, store=None, *, format: Optional[str] = None, verify_report=None, build_report=None,
               repair_report=None, sample: int = 2000, thumbs: int = 24, pixel_sample: int = 256,
               seed: int = 0, **reader_options) -> Path:
    """Write one self-contained HTML report (no network needed to view it) and return its path.

    Args:
        path: the ``.html`` file to write (atomically: a temporary file, then renamed).
        store: store location (path or ``mongodb://`` URL), or None for a report of an
            unpublished build (then ``build_report`` is required).
        format: store format (detected when None).
        verify_report: a :class:`packer.jobs.reports.VerifyReport` (or its dict) to show; when None, the
            last saved result ``<store>.verify.json`` is shown if there is one.
        build_report: a :class:`packer.jobs.reports.BuildReport` (or its dict): rejected, converted and
            ignored inputs; when None, ``<store>.report.json`` is used if present.
        repair_report: a repair report (object with ``to_dict()`` or dict). Its lists of
            ``{"key"/"path", "reason"/"action", ...}`` items are listed, with thumbnails.
        sample: records read for per-record plots (sizes, boxes); at most this many.
        thumbs: random sample thumbnails shown.
        pixel_sample: records decoded (at reduced scale) for the per-channel mean/std.
        seed: seed of every sample (same seed, same records).
        **reader_options: passed to the store reader (e.g. ``uri=...`` for MongoDB).

    Returns:
        The path written.

    Raises:
        DependencyError: matplotlib is missing (``pip install 'packer-vision[report]'``).
        StoreError / UsageError: the store cannot be opened and no report was given.
        UsageError: ``path`` holds something other than an earlier packer report (a file of
            yours, a folder), or is, contains or lies inside the store.
        OSError: the file cannot be written.

    Example:
        >>> write_html("train.html", "train.lmdb", thumbs=48)   # doctest: +SKIP
        PosixPath('train.html')
    """
    from packer.report import html, plots

    if store is None and build_report is None and repair_report is None:
        raise TypeError("write_html needs a store or a build/repair report")
    # New, empty, or a report packer wrote before; never the store itself or a file inside it.
    check_output(path, inputs=[("store", store)], kind="report")
    t0 = time.perf_counter()
    data = collect(store, format=format, verify_report=verify_report, build_report=build_report,
                   repair_report=repair_report, sample=sample, thumbs=thumbs, pixel_sample=pixel_sample,
                   seed=seed, reader_options=reader_options)
    t1 = time.perf_counter()
    rendered = plots.render_plots(data)
    data.timings["plots_s"] = round(time.perf_counter() - t1, 3)
    page = html.render(data, rendered)
    path = Path(path)
    write_atomic(path, page)
    log.info("%s: report of %s written in %.1f s (%d KiB)", path, store, time.perf_counter() - t0,
             len(page) >> 10)
    return path


__all__ = ["write_html", "collect", "ReportData", "pixel_stats", "sample_indices", "save_verify",
           "verify_sidecar_path"]
