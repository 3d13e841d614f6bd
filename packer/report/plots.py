"""The report's plots: matplotlib (Agg, no display) rendered to PNG data URIs.

Each ``plot_*`` function takes :class:`~packer.report.data.ReportData` and returns a
:class:`Plot`, or None when the store has nothing to show for it (no boxes, no classes...).
Figures are made with ``matplotlib.figure.Figure`` directly, never ``pyplot``, so no global
state is touched and no GUI backend is ever loaded.
"""
from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Optional

import numpy as np

from packer.core.deps import optional_import
from packer.report.images import class_name

_DPI = 80
_SIZE = (5.2, 3.4)  # inches -> 416x272 px PNGs, a few tens of KB each
_MAX_BARS = 40


@dataclass
class Plot:
    """One rendered plot: an id (``data-plot`` in the HTML), a title, a caption, a data URI,
    and for some the numbers drawn."""

    id: str
    title: str
    caption: str
    uri: str
    #: The numbers drawn, as (label, value) rows: listed under the plot (readable without the
    #: picture, by a screen reader or a script). None when the plot has no such table.
    data: Optional[list] = None
    #: What the values count (the table's column heading).
    unit: str = ""


def _figure():
    FigureCanvasAgg = optional_import("matplotlib.backends.backend_agg", "the HTML report", "report").FigureCanvasAgg
    Figure = optional_import("matplotlib.figure", "the HTML report", "report").Figure
    # Fixed margins: matplotlib's constrained layout costs ~0.5 s per figure.
    fig = Figure(figsize=_SIZE, dpi=_DPI)
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.16, top=0.96)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _hist_bins(values, log: bool = False, bins: int = 30):
    v = np.asarray(values, np.float64)
    if log:
        v = v[v > 0]
        lo, hi = v.min(), v.max()
        if hi <= lo:
            hi = lo * 1.01 + 1
        return np.geomspace(lo, hi, bins + 1)
    lo, hi = v.min(), v.max()
    return np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)


def _sample_note(d) -> str:
    return f"seeded sample of {len(d.sample.indices)} of {d.count} records (seed {d.sample_seed})"


def plot_image_sizes(d) -> Optional[Plot]:
    """Width x height of every record (from the build's counts; marker area ~ count)."""
    sizes = (d.metadata.get("stats") or {}).get("sizes") or {}
    pts = [(int(k.split("x")[0]), int(k.split("x")[1]), n) for k, n in sizes.items() if "x" in k]
    source = "all records (build statistics)"
    if not pts and d.sample.width:
        pairs, counts = np.unique(np.stack([d.sample.width, d.sample.height], 1), axis=0, return_counts=True)
        pts = [(int(w), int(h), int(n)) for (w, h), n in zip(pairs, counts)]
        source = _sample_note(d)
    if not pts:
        return None
    w, h, n = (np.array(v) for v in zip(*pts))
    fig = _figure()
    ax = fig.add_subplot()
    ax.scatter(w, h, s=12 + 300 * np.sqrt(n / n.max()), alpha=0.5, edgecolors="k", linewidths=0.5)
    ax.set_xlabel("width (px)")
    ax.set_ylabel("height (px)")
    other = sizes.get("other", 0)
    caption = f"{len(pts)} distinct sizes; {source}"
    if other:
        caption += f"; {other} records of rarer sizes not shown"
    return Plot("image-sizes", "Image width x height", caption, _png(fig))


def plot_file_sizes(d) -> Optional[Plot]:
    """Stored bytes (and original file bytes) per record, from the sample."""
    if not d.sample.stored_bytes:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    stored = np.asarray(d.sample.stored_bytes) / 1024
    source = np.asarray(d.sample.source_bytes) / 1024
    bins = _hist_bins(np.concatenate([stored, source]), log=True)
    label = "stored pixels" if d.encoding == "raw" else "stored JPEG"
    ax.hist(stored, bins=bins, alpha=0.6, label=label)
    ax.hist(source, bins=bins, histtype="step", linewidth=1.5, color="k", label="original file")
    ax.set_xscale("log")
    from matplotlib.ticker import LogLocator, ScalarFormatter
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter("")
    ax.set_xlabel("KiB per record")
    ax.set_ylabel("records")
    ax.legend()
    return Plot("file-sizes", "File sizes", _sample_note(d), _png(fig))


def _bars(ax, labels, counts, horizontal_if: int = 8):
    if len(labels) > horizontal_if:
        longest = max((len(str(x)) for x in labels), default=1)
        ax.figure.subplots_adjust(left=min(0.5, 0.06 + 0.0125 * longest))
        ax.barh(range(len(labels)), counts)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
    else:
        ax.bar(range(len(labels)), counts)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        longest = max((len(str(x)) for x in labels), default=1)
        ax.figure.subplots_adjust(bottom=min(0.5, 0.12 + 0.012 * longest))


def class_counts(d) -> Optional[tuple]:
    """What the class plot shows: ``({class id: count}, caption, unit)``, or None.

    Records per class (all records, from the build statistics) for a class store; boxes per
    class in the sample for a box or objects store. Every named class is there, with 0 when
    it has no record or box: a class missing from the plot would read as a class that is not
    in the store.
    """
    names = d.metadata.get("class_names") or []
    stats = d.metadata.get("stats") or {}
    schema = d.metadata.get("label_schema")
    if schema == "class" and stats.get("classes"):
        counts = {int(k): v for k, v in stats["classes"].items()}
        caption, unit, none = "all records (build statistics)", "records", "without records"
    elif d.sample.box_classes or (schema in ("boxes", "objects") and names):
        ids, n = np.unique(np.asarray(d.sample.box_classes, np.int64), return_counts=True)
        counts = dict(zip(ids.tolist(), n.tolist()))
        caption, unit, none = "boxes in the " + _sample_note(d), "boxes", "without boxes"
    else:
        return None
    empty = [i for i in range(len(names)) if i not in counts]
    counts.update((i, 0) for i in empty)
    if empty:
        caption += f"; {len(empty)} class{'es' if len(empty) != 1 else ''} {none}"
    return counts, caption, unit


def plot_classes(d) -> Optional[Plot]:
    """Records per class (all records, from metadata) or boxes per class (sample) for boxes;
    see :func:`class_counts`."""
    found = class_counts(d)
    if found is None:
        return None
    counts, caption, ylabel = found
    names = d.metadata.get("class_names") or []
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(items) > _MAX_BARS:
        rest = sum(v for _, v in items[_MAX_BARS:])
        caption += f"; {len(items) - _MAX_BARS} smaller classes ({rest}) not shown"
        items = items[:_MAX_BARS]
    fig = _figure()
    ax = fig.add_subplot()
    _bars(ax, [class_name(k, names) for k, _ in items], [v for _, v in items])
    ax.set_ylabel(ylabel) if len(items) <= 8 else ax.set_xlabel(ylabel)
    table = [(class_name(k, names), v) for k, v in sorted(counts.items())]
    return Plot("classes", f"Class distribution ({len(counts)} classes)", caption, _png(fig), table, ylabel)


def plot_boxes_per_image(d) -> Optional[Plot]:
    if not d.sample.boxes_per_image:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    v = np.asarray(d.sample.boxes_per_image)
    ax.hist(v, bins=np.arange(v.max() + 2) - 0.5, rwidth=0.85)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("boxes per image")
    ax.set_ylabel("images")
    return Plot("boxes-per-image", "Boxes per image", _sample_note(d), _png(fig))


def plot_box_sizes(d) -> Optional[Plot]:
    if not d.sample.box_w:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    ax.scatter(d.sample.box_w, d.sample.box_h, s=6, alpha=0.4)
    ax.set_xlabel("box width (px)")
    ax.set_ylabel("box height (px)")
    return Plot("box-sizes", "Box sizes", f"{len(d.sample.box_w)} boxes; " + _sample_note(d), _png(fig))


def plot_box_aspect(d) -> Optional[Plot]:
    w = np.asarray(d.sample.box_w, np.float64)
    h = np.asarray(d.sample.box_h, np.float64)
    ok = (w > 0) & (h > 0)
    if not ok.any():
        return None
    ratio = np.log2(w[ok] / h[ok])
    fig = _figure()
    ax = fig.add_subplot()
    ax.hist(ratio, bins=30)
    ticks = [t for t in range(-4, 5) if ratio.min() - 1 <= t <= ratio.max() + 1]
    ax.set_xticks(ticks, [f"{2.0 ** t:g}" for t in ticks])
    ax.set_xlabel("aspect ratio w/h (log scale)")
    ax.set_ylabel("boxes")
    return Plot("box-aspect", "Box aspect ratios", _sample_note(d), _png(fig))


def plot_conversions(d) -> Optional[Plot]:
    """What the build changed or noticed, over all records (build statistics)."""
    stats = d.metadata.get("stats") or {}
    if not stats:
        return None
    items = [(f"source: {k}", v) for k, v in sorted((stats.get("source_formats") or {}).items())]
    items += [(f"{k} channel(s)", v) for k, v in sorted((stats.get("channels") or {}).items())]
    for key, label in (("converted", "converted"), ("with_notes", "with notes"),
                       ("orientation_recorded", "EXIF orientation recorded"), ("unlabeled", "unlabeled"),
                       ("images_without_boxes", "without boxes"), ("rejected", "rejected inputs"),
                       ("ignored", "ignored files")):
        items.append((label, int(stats.get(key, 0))))
    fig = _figure()
    ax = fig.add_subplot()
    _bars(ax, [k for k, _ in items], [v for _, v in items], horizontal_if=0)
    ax.set_xlabel("records / files")
    return Plot("conversions", "Formats, conversions and notes", "all records (build statistics)", _png(fig))


def plot_pixels(d) -> Optional[Plot]:
    p = d.pixels or {}
    if not p.get("mean"):
        return None
    fig = _figure()
    ax = fig.add_subplot()
    colours = ["tab:red", "tab:green", "tab:blue"]
    ax.bar(range(3), p["mean"], yerr=p["std"], capsize=6, color=colours, alpha=0.7)
    ax.set_xticks(range(3), ["R", "G", "B"])
    ax.set_ylim(0, max(1.0, max(m + s for m, s in zip(p["mean"], p["std"]))))
    ax.set_ylabel("pixel value (0..1): mean, error bar = std")
    mean = ", ".join(f"{v:.3f}" for v in p["mean"])
    std = ", ".join(f"{v:.3f}" for v in p["std"])
    caption = (f"Normalize(mean=[{mean}], std=[{std}]) from {p['records']} records (seed {p['seed']}), "
               f"decoded at reduced scale (shorter side >= {p['min_side']} px)")
    return Plot("pixels", "Per-channel pixel mean and std", caption, _png(fig))


PLOTS = (plot_image_sizes, plot_file_sizes, plot_classes, plot_boxes_per_image, plot_box_sizes,
         plot_box_aspect, plot_conversions, plot_pixels)


def render_plots(d) -> list:
    """Every plot that has data, in report order.

    Raises:
        DependencyError: matplotlib is not installed.
    """
    out = []
    for fn in PLOTS:
        p = fn(d)
        if p is not None:
            out.append(p)
    return out
