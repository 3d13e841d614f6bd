"""``packer`` command line: parse -> call packer.api -> render the report -> exit code.

Exit codes: 0 success, 1 failure or damage found, 2 usage mistakes.
"""
from __future__ import annotations

import functools
import json
import logging
import sys

import click

from . import api
from .errors import PackerError, SourceError, UsageError
from .stores import available_formats, get_store

_SHOWN_PROBLEMS = 50


def _fail(message: str, code: int, problems=(), as_json: bool = False):
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message, "problems": list(problems)}, indent=1))
    else:
        click.echo(f"error: {message}", err=True)
        for p in list(problems)[:_SHOWN_PROBLEMS]:
            click.echo(f"  {p}", err=True)
        if len(problems) > _SHOWN_PROBLEMS:
            click.echo(f"  ... and {len(problems) - _SHOWN_PROBLEMS} more", err=True)
    sys.exit(code)


def _handle_errors(fn):
    """Turn PackerErrors into a message and exit code 2 (usage) or 1 (everything else)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            _fail(str(exc), 2, as_json=as_json)
        except SourceError as exc:
            _fail(str(exc), 1, exc.problems, as_json=as_json)
        except PackerError as exc:
            _fail(str(exc), 1, as_json=as_json)
    return wrapper


def _parse_store_options(pairs, uri) -> dict:
    opts = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"-O expects NAME=VALUE, got {pair!r}")
        opts[name.strip()] = value
    if uri:
        opts["uri"] = uri
    return opts


def _setup_logging(quiet: bool, verbose: bool) -> None:
    level = logging.ERROR if quiet else (logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s", stream=sys.stderr)


_json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON report on stdout.")
_uri_option = click.option("--uri", default=None, metavar="URI",
                           help="Connection string for server stores (else MONGODB_URI).")
_html_option = click.option("--html", "html_path", default=None, metavar="FILE",
                            help="Also write a self-contained HTML report: plots, sample thumbnails "
                                 "with labels, damaged records (needs matplotlib: packer[report]).")


def _write_html(html_path, store, quiet: bool = False, **kwargs) -> None:
    """Write the HTML report (packer.report) and say where it went, on stderr."""
    from .errors import PackerError
    from .report import write_html

    try:
        path = write_html(html_path, store, **kwargs)
    except OSError as exc:
        raise PackerError(f"{html_path}: cannot write the HTML report: {exc}") from exc
    if not quiet:
        click.echo(f"html report: {path}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="packer")
def cli():
    """Pack image folders into checked LMDB / HDF5 / MongoDB stores, and check them."""


@cli.command()
@click.argument("images", type=click.Path(file_okay=False))
@click.argument("labels", required=False, type=click.Path())
@click.option("-o", "--out", required=True, help="Store to create: a path, or mongodb://host/db/collection.")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default="lmdb", show_default=True,
              help="Store format.")
@click.option("--quality", type=click.IntRange(1, 100), default=95, show_default=True,
              help="JPEG quality for images that must be re-encoded (PNG, CMYK, EXIF-rotated...).")
@click.option("-j", "--workers", type=click.IntRange(1, None), default=None,
              help="Checking/encoding processes [default: all cores].")
@click.option("--on-corrupt", type=click.Choice(api.ON_CORRUPT), default="fail", show_default=True,
              help="fail: list every damaged input and publish nothing; skip: publish without them; "
                   "stop: halt at the first.")
@click.option("--exif", type=click.Choice(["apply", "record"]), default="apply", show_default=True,
              help="Apply EXIF orientation to the pixels, or record it for the readers.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue an interrupted build of the same inputs, or start over.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store at --out.")
@click.option("--allow-unlabeled", is_flag=True, help="Keep images without a label (class -1 / no boxes).")
@click.option("--no-labels", is_flag=True, help="Store images only.")
@click.option("--commit-mb", type=click.IntRange(1, None), default=64, show_default=True,
              help="Write batch size in MiB.")
@click.option("-O", "--store-opt", "store_opts", multiple=True, metavar="NAME=VALUE",
              help="Backend option, e.g. -O pixels=224x224 for HDF5 (see 'packer formats').")
@_uri_option
@click.option("--report", "report_path", default=None, help="Report file [default: next to --out].")
@_html_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, errors only.")
@click.option("-v", "--verbose", is_flag=True, help="Log more.")
@_handle_errors
def build(images, labels, out, fmt, quality, workers, on_corrupt, exif, resume, overwrite,
          allow_unlabeled, no_labels, commit_mb, store_opts, uri, report_path, html_path, as_json, quiet,
          verbose):
    """Pack IMAGES (and LABELS) into a checked store.

    LABELS is a folder of per-image .txt (YOLO rows) / .json files, or one .csv / .json
    mapping file; without it, each first-level folder of IMAGES is a class.
    """
    _setup_logging(quiet or as_json, verbose)
    if labels and no_labels:
        raise UsageError("LABELS and --no-labels contradict each other")
    report = api.build(images, labels, out, fmt, quality=quality, exif=exif, workers=workers,
                       on_corrupt=on_corrupt, resume=resume, overwrite=overwrite,
                       allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                       commit_bytes=commit_mb << 20, store_options=_parse_store_options(store_opts, uri),
                       report_path=report_path, progress=not (quiet or as_json))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        _render_build(report, quiet)
    if html_path:
        _write_html(html_path, out if report.published else None, quiet or as_json, format=fmt,
                    build_report=report, **({"uri": uri} if uri else {}))
    sys.exit(0 if report.ok else 1)


def _render_build(r: api.BuildReport, quiet: bool) -> None:
    for rej in r.rejected[:_SHOWN_PROBLEMS]:
        click.echo(f"damaged: {rej['path']}: {rej['reason']}", err=True)
    if len(r.rejected) > _SHOWN_PROBLEMS:
        click.echo(f"damaged: ... and {len(r.rejected) - _SHOWN_PROBLEMS} more (see the report)", err=True)
    if r.published:
        msg = f"{r.location}: {r.records} records ({r.format}, labels: {r.label_schema})"
        if r.rejected:
            msg += f"; {len(r.rejected)} damaged input(s) left out"
    elif r.rejected:
        msg = (f"{r.location}: NOT published: {len(r.rejected)} damaged input(s) of {r.inputs}. "
               f"Rerun with --on-corrupt skip to publish without them (the {r.records} checked records "
               f"are kept and resumed), or fix or remove them and rerun with --no-resume")
    else:
        msg = f"{r.location}: NOT published"
    extra = []
    if r.resumed_from:
        extra.append(f"resumed at input {r.resumed_from}")
    if r.converted:
        extra.append(f"{len(r.converted)} converted to baseline JPEG")
    if r.notes:
        extra.append(f"{len(r.notes)} note(s)")
    if r.ignored:
        extra.append(f"{len(r.ignored)} non-image file(s) ignored")
    if extra:
        msg += " [" + ", ".join(extra) + "]"
    if not quiet or not r.ok:
        click.echo(msg, err=not r.ok)
        click.echo(f"report: {r.report_path}", err=not r.ok)


@cli.command()
@click.argument("store")
@click.option("--deep", is_flag=True, help="Also decode every image.")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None,
              help="Store format [default: detected].")
@_uri_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="Print only problems.")
@_html_option
@_handle_errors
def verify(store, deep, fmt, uri, as_json, quiet, html_path):
    """Recompute every checksum and check metadata and index; --deep also decodes.

    Lists every bad record with its key and reason; exit code 1 when anything is bad.
    """
    _setup_logging(quiet or as_json, False)
    opts = {"uri": uri} if uri else {}
    rep = api.verify(store, deep=deep, format=fmt, progress=not (quiet or as_json), **opts)
    _save_verify(rep)
    if as_json:
        d = rep.to_dict()
        d["problems"] = [{"key": p.key, "index": p.index, "reason": p.reason} for p in rep.problems]
        click.echo(json.dumps(d, indent=1))
    else:
        for p in rep.problems:
            click.echo(f"BAD {p}")
        if rep.ok:
            if not quiet:
                click.echo(f"{store}: OK ({rep.checked} records{', decoded' if deep else ''})")
        else:
            click.echo(f"{store}: {len(rep.problems)} problem(s) in {rep.count} records", err=True)
    if html_path:
        _write_html(html_path, store, quiet or as_json, format=fmt, verify_report=rep, **opts)
    sys.exit(0 if rep.ok else 1)


def _save_verify(rep) -> None:
    """Keep the result next to the store (<store>.verify.json) for ``packer report``; optional."""
    from .report.sidecar import save_verify

    try:
        save_verify(rep)
    except OSError as exc:
        logging.getLogger(__name__).warning("cannot save the verify result next to the store: %s", exc)


@cli.command()
@click.argument("store")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None)
@_uri_option
@click.option("--pixel-sample", type=click.IntRange(0, None), default=256, show_default=True,
              help="Records decoded (reduced scale, seeded) for the per-channel pixel mean/std; 0: none.")
@_html_option
@_json_option
@_handle_errors
def info(store, fmt, uri, pixel_sample, html_path, as_json):
    """Count, size on disk, image sizes, labels and build options of a store."""
    _setup_logging(as_json, False)
    opts = {"uri": uri} if uri else {}
    rep = api.info(store, format=fmt, pixel_sample=pixel_sample, **opts)
    if html_path:
        _write_html(html_path, store, as_json, format=fmt, pixel_sample=pixel_sample, **opts)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
        return
    m, s = rep.metadata, rep.metadata.get("stats", {})
    n = max(1, m["count"])
    lines = [
        f"store:        {rep.location} ({rep.format}, format version {m['format_version']})",
        f"records:      {m['count']}   size: {_human(rep.size_bytes)}"
        f"   image bytes: {_human(s.get('bytes', 0))} (originals {_human(s.get('source_bytes', 0))})",
    ]
    if rep.encoding == "raw":
        lines.append(f"stored:       decoded pixels {'x'.join(map(str, rep.raw_shape))} uint8 per record "
                     f"(sizes below are of the checked JPEGs)")
    if "width_min" in s:
        lines.append(f"width:        min {s['width_min']}  mean {s['width_sum'] / n:.0f}  max {s['width_max']}")
        lines.append(f"height:       min {s['height_min']}  mean {s['height_sum'] / n:.0f}  max {s['height_max']}")
        top = sorted(s.get("sizes", {}).items(), key=lambda kv: -kv[1])[:5]
        lines.append("common sizes: " + ", ".join(f"{k} ({v})" for k, v in top))
        lines.append("channels:     " + ", ".join(f"{k}: {v}" for k, v in sorted(s.get("channels", {}).items())))
        lines.append("sources:      " + ", ".join(f"{k}: {v}" for k, v in sorted(s.get("source_formats", {}).items()))
                     + f"; converted {s.get('converted', 0)}, with notes {s.get('with_notes', 0)}")
    lines.append(f"labels:       {m['label_schema']}" + _label_summary(m, s))
    lines.append(f"build:        inputs {s.get('inputs', '?')}, rejected {s.get('rejected', '?')}, "
                 f"ignored {s.get('ignored', '?')}; packer {m.get('packer_version', '?')} at {m.get('created', '?')}")
    lines.append("options:      " + json.dumps(m["build_options"], sort_keys=True))
    if rep.pixels and rep.pixels.get("mean"):
        lines.append(f"normalize:    mean={rep.pixels['mean']} std={rep.pixels['std']} "
                     f"(RGB 0..1, {rep.pixels['records']} sampled records, seed {rep.pixels['seed']})")
    click.echo("\n".join(lines))


def _label_summary(m: dict, s: dict) -> str:
    if m["label_schema"] == "class":
        classes = s.get("classes", {})
        names = m.get("class_names") or []
        parts = []
        for cid, count in sorted(classes.items(), key=lambda kv: int(kv[0]))[:10]:
            name = names[int(cid)] if 0 <= int(cid) < len(names) else cid
            parts.append(f"{name}: {count}")
        more = f" (+{len(classes) - 10} more)" if len(classes) > 10 else ""
        return f", {len(classes)} classes: " + ", ".join(parts) + more
    if m["label_schema"] == "boxes":
        return (f", {s.get('boxes', 0)} boxes, max {s.get('boxes_max_per_image', 0)} per image, "
                f"{s.get('images_without_boxes', 0)} images without boxes")
    return ""


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


@cli.command()
@click.argument("store")
@click.option("-o", "--out", "html_path", required=True, metavar="FILE", help="HTML file to write.")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None,
              help="Store format [default: detected].")
@_uri_option
@click.option("--sample", type=click.IntRange(0, None), default=2000, show_default=True,
              help="Records read (seeded) for per-record plots: file sizes, boxes.")
@click.option("--thumbs", type=click.IntRange(0, None), default=24, show_default=True,
              help="Random sample thumbnails shown, with their labels drawn.")
@click.option("--pixel-sample", type=click.IntRange(0, None), default=256, show_default=True,
              help="Records decoded at reduced scale for the per-channel mean/std.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every sample.")
@click.option("--verify", "run_verify", is_flag=True,
              help="Verify every checksum first (else the last saved 'packer verify' result is shown).")
@click.option("--deep", is_flag=True, help="With --verify: also decode every image.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no messages.")
@_handle_errors
def report(store, html_path, fmt, uri, sample, thumbs, pixel_sample, seed, run_verify, deep, quiet):
    """Write a self-contained HTML report of STORE (opens offline in any browser).

    Summary, plots (sizes, classes, boxes, pixel mean/std), random sample thumbnails with
    their labels drawn, every damaged record known, and the build's rejected inputs. It
    samples (seeded): a million-record store takes seconds, not a full read.
    """
    _setup_logging(quiet, False)
    opts = {"uri": uri} if uri else {}
    rep = None
    if run_verify or deep:
        rep = api.verify(store, deep=deep, format=fmt, progress=not quiet, **opts)
        _save_verify(rep)
    _write_html(html_path, store, quiet, format=fmt, verify_report=rep, sample=sample, thumbs=thumbs,
                pixel_sample=pixel_sample, seed=seed, **opts)
    sys.exit(0 if rep is None or rep.ok else 1)


@cli.command()
@_json_option
def formats(as_json):
    """List store formats and their backend options."""
    if as_json:
        click.echo(json.dumps({name: {"description": get_store(name).description,
                                      "writer_options": get_store(name).writer_options,
                                      "reader_options": get_store(name).reader_options}
                               for name in available_formats()}, indent=1))
        return
    for name in available_formats():
        cls = get_store(name)
        click.echo(f"{name}: {cls.description}")
        for opt, help_text in sorted(cls.writer_options.items()):
            click.echo(f"    -O {opt}=...   {help_text}")
        for opt, help_text in sorted(cls.reader_options.items()):
            click.echo(f"    (reader) {opt}   {help_text}")


def main():  # console-script entry point
    cli(prog_name="packer")


if __name__ == "__main__":
    main()
