"""Render :class:`~packer.report.data.ReportData` and its plots as one self-contained HTML page.

Self-contained means: inline CSS, images as ``data:`` URIs, no script and nothing fetched,
so the file can be mailed, archived with the store, or opened offline in any browser.
Every value from the store (keys, class names, reasons) is HTML-escaped.

Stable hooks for tests and scripts: ``figure.plot[data-plot=ID]`` (with ``table.plot-data``
holding the numbers of the plots that have a table), ``figure.thumb``,
``tr.damaged[data-key=KEY]``, ``#verify-status[data-status=ok|bad|unknown]``.
"""
from __future__ import annotations

import json
from html import escape
from string import Template

from packer.core.diskspace import human_bytes
from packer.report.data import MAX_LISTED, ReportData, Thumb, repair_rows
from packer.version import __version__

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px;word-break:break-all}
header p{margin:4px 0 0;color:#b8c0cc;font-size:12px}main{padding:8px 24px 40px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:16px;margin:0 0 10px}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #eceef2;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f0f2f5}table.kv th{width:200px;background:none;color:#555;font-weight:600}
code,pre{font:12px ui-monospace,Menlo,Consolas,monospace;word-break:break-all;white-space:pre-wrap;margin:0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px;color:#fff}
.ok{background:#2e7d32}.bad{background:#c62828}.unknown{background:#757575}
.plots,.thumbs{display:grid;gap:12px;grid-template-columns:repeat(auto-fill,minmax(420px,1fr))}
.thumbs{grid-template-columns:repeat(auto-fill,minmax(172px,1fr))}
figure{margin:0;background:#fafbfc;border:1px solid #eceef2;border-radius:4px;padding:6px}
figure img{display:block;max-width:100%;margin:0 auto}\
figcaption{font-size:12px;color:#444;margin-top:4px;word-break:break-all}
figure.plot figcaption b{display:block;color:#1d2330;font-size:13px}
.key{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px;color:#333}
.note{color:#b26a00;font-size:11px}.nothumb{width:120px;height:60px;display:flex;align-items:center;
justify-content:center;background:#eee;color:#777;font-size:11px;text-align:center}
td.thumbcell img{max-width:160px}.muted{color:#777}
"""

_PAGE = Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>packer report: $title</title>
<style>$css</style></head>
<body><header><h1>packer report: $title</h1><p>$subtitle</p></header>
<main>
$sections
</main></body></html>
""")


def _kv(rows) -> str:
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{v}</td></tr>" for k, v in rows if v not in (None, ""))
    return f'<table class="kv">{body}</table>'


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2>\n{body}\n</section>'


def _verify_cell(v) -> tuple[str, str]:
    if not v:
        return "unknown", ('<span id="verify-status" data-status="unknown" class="badge unknown">never verified'
                           '</span> <span class="muted">(run <code>packer verify STORE</code>; it saves '
                           'its result for the report)</span>')
    n = int(v.get("problems_total", len(v.get("problems") or [])))
    status = "ok" if v.get("ok", n == 0) and n == 0 else "bad"
    label = "OK" if status == "ok" else f"{n} problem{'s' if n != 1 else ''}"
    when = v.get("when") or "just now"
    depth = "deep (decoded)" if v.get("deep") else "checksums"
    return status, (f'<span id="verify-status" data-status="{status}" class="badge {status}">{escape(label)}'
                    f'</span> {escape(depth)}, {int(v.get("checked", 0))} of {int(v.get("count", 0))} records '
                    f'checked, at {escape(str(when))}')


def _summary(d: ReportData) -> str:
    m, s = d.metadata, (d.metadata.get("stats") or {})
    n = max(1, d.count)
    rows = [("location", f"<code>{escape(str(d.location))}</code>"),
            ("format", escape(f"{d.format} (format version {m.get('format_version', '?')})") if d.format else None),
            ("records", f"{d.count:,}" if d.format else None),
            ("size", f"{human_bytes(d.size_bytes)} on disk; images {human_bytes(s.get('bytes', 0))} "
                     f"(originals {human_bytes(s.get('source_bytes', 0))})" if d.format else None)]
    if d.encoding == "raw":
        rows.append(("stored as", escape(f"decoded pixels {'x'.join(map(str, d.raw_shape or []))} uint8")))
    if "width_min" in s:
        rows.append(("image sizes", escape(
            f"width {s['width_min']}..{s['width_max']} (mean {s['width_sum'] / n:.0f}), "
            f"height {s['height_min']}..{s['height_max']} (mean {s['height_sum'] / n:.0f}); "
            f"{len(s.get('sizes', {}))} distinct")))
        formats = sorted(s.get("source_formats", {}).items())
        rows.append(("source formats", escape(", ".join(f"{k}: {v}" for k, v in formats))))
    if m:
        names = m.get("class_names") or []
        rows.append(("label schema", escape(str(m.get("label_schema")))))
        if names:
            shown = ", ".join(names[:100]) + (f" ... (+{len(names) - 100} more)" if len(names) > 100 else "")
            rows.append((f"class names ({len(names)})", escape(shown)))
        if m.get("label_schema") == "boxes":
            rows.append(("boxes", escape(f"{s.get('boxes', 0):,} in all, at most {s.get('boxes_max_per_image', 0)} "
                                         f"per image, {s.get('images_without_boxes', 0)} images without boxes")))
        rows.append(("build", escape(f"inputs {s.get('inputs', '?')}, rejected {s.get('rejected', '?')}, "
                                     f"ignored {s.get('ignored', '?')}; packer {m.get('packer_version', '?')} "
                                     f"at {m.get('created', '?')}")))
        options = json.dumps(m.get("build_options", {}), indent=1, sort_keys=True)
        rows.append(("build options", f"<pre>{escape(options)}</pre>"))
        rows.append(("checksums", escape(f"{d.checksum_algorithm} per record (bytes and fields); index checksum "
                                         f"{m.get('index_checksum', '?')}")))
    rows.append(("verify", _verify_cell(d.verify)[1]))
    if d.pixels and d.pixels.get("mean"):
        p = d.pixels
        rows.append(("Normalize", f"<code>mean={p['mean']}, std={p['std']}</code> "
                                  f'<span class="muted">({p["records"]} sampled records, seed {p["seed"]})</span>'))
    if d.store_error:
        rows.append(("store", f'<span class="badge bad">not readable</span> {escape(d.store_error)}'))
    return _section("summary", "Summary", _kv(rows))


def _img(t: Thumb) -> str:
    if t.uri:
        return f'<img class="thumb" src="{t.uri}" alt="{escape(t.key)}">'
    return f'<div class="nothumb">{escape(t.note or "no image")}</div>'


def _thumbs(d: ReportData) -> str:
    if not d.thumbs:
        return ""
    cells = []
    for t in d.thumbs:
        note = f'<br><span class="note">{escape(t.note)}</span>' if t.note else ""
        cells.append(f'<figure class="thumb" data-key="{escape(t.key)}">{_img(t)}<figcaption>'
                     f'<span class="key">{escape(t.key)}</span><br>{escape(t.caption)}{note}</figcaption></figure>')
    return _section("samples", f"Random samples ({len(d.thumbs)}, seed {d.sample_seed})",
                    f'<div class="thumbs">{"".join(cells)}</div>')


def _plot_data(p) -> str:
    """The numbers of a plot as a folded table (``table.plot-data``), or "" when it has none."""
    if not p.data:
        return ""
    rows = "".join(f"<tr><td>{escape(str(label))}</td><td>{escape(str(value))}</td></tr>" for label, value in p.data)
    return (f'<details><summary>numbers</summary><table class="plot-data"><tr><th>name</th>'
            f'<th>{escape(p.unit or "value")}</th></tr>{rows}</table></details>')


def _plots(plots) -> str:
    if not plots:
        return ""
    figs = "".join(f'<figure class="plot" data-plot="{escape(p.id)}"><img src="{p.uri}" alt="{escape(p.title)}">'
                   f'<figcaption><b>{escape(p.title)}</b>{escape(p.caption)}{_plot_data(p)}</figcaption></figure>'
                   for p in plots)
    return _section("plots", "Plots", f'<div class="plots">{figs}</div>')


def _table(rows, columns, row_class: str = "", key_field: str = "", thumbs: bool = False) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns) + ("<th>image</th>" if thumbs else "")
    body = []
    for r in rows[:MAX_LISTED]:
        attrs = ""
        if row_class:
            attrs = f' class="{row_class}"'
            if key_field and r.get(key_field) is not None:
                attrs += f' data-key="{escape(str(r[key_field]))}"'
        cells = "".join(f"<td>{escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in columns)
        if thumbs:
            t = r.get("thumb")
            note = f'<div class="note">{escape(t.note)}</div>' if t is not None and t.note and t.uri else ""
            cell = "" if t is None else _img(t) + note
            cells += f'<td class="thumbcell">{cell}</td>'
        body.append(f"<tr{attrs}>{cells}</tr>")
    more = ""
    if len(rows) > MAX_LISTED:
        more = f'<p class="muted">... and {len(rows) - MAX_LISTED:,} more (the JSON report lists all).</p>'
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _damaged(d: ReportData) -> str:
    if not d.damaged:
        if not d.format:
            return ""
        body = "<p>No damaged records known" + (
            " (the last verify found none).</p>" if d.verify else
            " in the sample; run <code>packer verify</code> to check every record.</p>")
        return _section("damaged", "Damaged records", body)
    body = (f"<p>{len(d.damaged):,} damaged, quarantined or salvaged record(s): key, reason, and what is left "
            f"of the image where it still decodes.</p>"
            + _table(d.damaged, ["key", "index", "source", "reason"], "damaged", "key", thumbs=True))
    return _section("damaged", f"Damaged records ({len(d.damaged):,})", body)


def _build(d: ReportData) -> str:
    b = d.build
    if not b:
        return ""
    published = ('<span id="published" data-published="yes" class="badge ok">yes</span>' if b.get("published") else
                 '<span id="published" data-published="no" class="badge bad">no</span> the checked records stay in '
                 'the staging area; a rerun resumes from there (see the rejected inputs below)')
    parts = [_kv([("published", published),
                  ("inputs", f"{b.get('inputs', 0):,}"), ("records", f"{b.get('records', 0):,}"),
                  ("resumed from input", b.get("resumed_from") or None),
                  ("report", f"<code>{escape(str(b.get('report_path', '')))}</code>")])]
    for name, cols, title in (("rejected", ["path", "reason"], "Rejected inputs"),
                              ("converted", ["path", "converted"], "Converted inputs"),
                              ("notes", ["path", "note"], "Notes")):
        rows = list(b.get(name) or [])
        if rows:
            parts.append(f"<h3>{title} ({len(rows):,})</h3>" + _table(rows, cols, f"build-{name}", "path"))
    why = b.get("ignored_reasons") or {}
    ignored = [{"path": p, "reason": why.get(p, "")} for p in (b.get("ignored") or [])]
    if ignored:
        parts.append(f"<h3>Ignored files ({len(ignored):,})</h3><p class=\"muted\">not images "
                     f"(hidden, text, links that lead nowhere, ...)</p>"
                     + _table(ignored, ["path", "reason"] if why else ["path"], "build-ignored", "path"))
    return _section("build", "Build", "\n".join(parts))


def _repair(d: ReportData) -> str:
    r = d.repair
    if not r:
        return ""
    scalars = [(k, escape(str(v))) for k, v in sorted(r.items()) if not isinstance(v, (list, dict))]
    rows = repair_rows(r)
    body = _kv(scalars)
    if rows:
        body += (f"<p>{len(rows):,} record(s) touched; images in the Damaged records section.</p>"
                 + _table(rows, ["key", "index", "source", "reason"], "repair", "key"))
    return _section("repair", "Repair", body)


def render(d: ReportData, plots) -> str:
    """The complete HTML page (a str) for ``d`` with rendered ``plots``."""
    subtitle = f"generated {d.generated} by packer {__version__}"
    if d.timings:
        subtitle += f" in {sum(d.timings.values()):.1f} s"
    sections = [_summary(d), _build(d), _repair(d), _damaged(d), _plots(plots), _thumbs(d)]
    return _PAGE.substitute(title=escape(str(d.title)), subtitle=escape(subtitle), css=_CSS,
                            sections="\n".join(s for s in sections if s))
