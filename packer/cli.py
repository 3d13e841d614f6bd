"""``packer`` command line: parse -> call the public API (:mod:`packer`) -> render the report -> exit code.

Exit codes: 0 success, 1 failure or damage found, 2 usage mistakes.
"""
from __future__ import annotations

import functools
import json
import logging
import sys

import click

import packer
from packer.core.diskspace import disk_full, human_bytes, is_disk_full
from packer.core.errors import PackerError, SourceError, UsageError
from packer.core.integrity import DEFAULT_MAX_PIXELS
from packer.core.uri import redact
from packer.core.writes import os_error_message
from packer.interchange import available_formats as available_datasets
from packer.jobs.options import ON_CORRUPT
from packer.labels import label_format_choices
from packer.labels.export import label_writers
from packer.stores import available_formats, get_store, is_server_location

_SHOWN_PROBLEMS = 50


def _fail(message: str, code: int, problems=(), as_json: bool = False):
    message, problems = redact(message), [redact(p) for p in problems]
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message, "problems": list(problems)}, indent=1))
    else:
        click.echo(f"error: {message}", err=True)
        for p in list(problems)[:_SHOWN_PROBLEMS]:
            click.echo(f"  {p}", err=True)
        if len(problems) > _SHOWN_PROBLEMS:
            click.echo(f"  ... and {len(problems) - _SHOWN_PROBLEMS} more", err=True)
    sys.exit(code)


#: The parameters that name a command's output (the place an OSError is most likely about).
_OUTPUT_ARGS = ("dst", "out", "html_path", "store")


def _handle_errors(fn):
    """Turn PackerErrors into a message and exit code 2 (usage) or 1 (everything else); any
    OSError still left into one line and exit code 1, never a traceback."""
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
        except OSError as exc:   # one the library did not say in its words: one line all the same
            where = next((kwargs[k] for k in _OUTPUT_ARGS if kwargs.get(k)), None)
            if is_disk_full(exc):
                _fail(str(disk_full(str(exc.filename or where or "."), cause=exc)), 1, as_json=as_json)
            _fail(os_error_message(exc, where), 1, as_json=as_json)
        except KeyboardInterrupt as exc:
            _fail(_interrupted(exc), 130, as_json=as_json)
    return wrapper


def _interrupted(exc: KeyboardInterrupt) -> str:
    """What Ctrl-C leaves: the staging area a rerun resumes from (the library's Stage says where),
    or nothing to resume from."""
    kept = getattr(exc, "packer_kept", False)
    if kept:
        return f"interrupted; the work committed so far is kept in {redact(kept)} (rerun the same command to resume)"
    return "interrupted before anything was committed; nothing is kept to resume from"


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


def _not_damaged_input(record: logging.LogRecord) -> bool:
    # The build report lists damaged inputs ("damaged: ..."); the library's log line for each
    # would print every one twice.
    return not getattr(record, "packer_damaged_input", False)


def _redact_record(record: logging.LogRecord) -> bool:
    # packer logs locations masked already; this covers any other line that quotes a connection
    # string (a library's, a traceback's).
    try:
        record.msg, record.args = redact(record.getMessage()), ()
    except (TypeError, ValueError, KeyError):  # a malformed log call: logging reports it itself
        return True
    if record.exc_info and not record.exc_text:
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    return True


def _setup_logging(quiet: bool, verbose: bool) -> None:
    level = logging.ERROR if quiet else (logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        for check in (_not_damaged_input, _redact_record):
            if check not in handler.filters:
                handler.addFilter(check)


def _progress(quiet: bool, as_json: bool) -> bool:
    """Progress bars only on a terminal: redirected to a log, they are lines of \r noise."""
    return not (quiet or as_json) and sys.stderr.isatty()


_json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON report on stdout.")
_uri_option = click.option("--uri", default=None, metavar="URI",
                           help="Connection string for server stores (else MONGODB_URI).")
_html_option = click.option("--html", "html_path", default=None, metavar="FILE",
                            help="Also write a self-contained HTML report: plots, sample thumbnails "
                                 "with labels, damaged records (needs matplotlib: packer-vision[report]).")


def _write_html(html_path, store, quiet: bool = False, **kwargs) -> None:
    """Write the HTML report (packer.report) and say where it went, on stderr."""
    from packer.report import write_html

    path = write_html(html_path, store, **kwargs)   # an OSError leaves as a WriteError naming html_path
    if not quiet:
        click.echo(f"html report: {path}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="packer-vision", prog_name="packer")
def cli():
    """Pack image folders into checked LMDB / HDF5 / MongoDB stores, and check them."""


@cli.command()
@click.argument("images")
@click.argument("labels", required=False, type=click.Path())
@click.option("-o", "--out", required=True,
              help="Store to create: a path, mongodb://host/db/collection, or a bucket manifest "
                   "s3://bucket/NAME.packer-manifest.json (staged here, then uploaded).")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None,
              help="Store format [default: from --out: .h5/.hdf5 -> hdf5, .lmdb or no suffix -> lmdb, "
                   "mongodb:// -> mongo; another suffix needs --format].")
@click.option("--quality", type=click.IntRange(1, 100), default=95, show_default=True,
              help="JPEG quality for images that must be re-encoded (PNG, CMYK, EXIF-rotated...).")
@click.option("--max-size", type=click.IntRange(1, None), default=None, metavar="N",
              help="Store images downscaled to at most N px on the long side (area interpolation, "
                   "re-encoded at --quality).")
@click.option("-j", "--workers", type=click.IntRange(1, None), default=None,
              help="Checking/encoding processes [default: all cores].")
@click.option("--on-corrupt", type=click.Choice(ON_CORRUPT), default="fail", show_default=True,
              help="fail: list every damaged or unreadable input (a folder that cannot be read, a name "
                   "that is not UTF-8) and publish nothing; skip: publish without them; stop: halt at the first.")
@click.option("--exif", type=click.Choice(["apply", "record"]), default="apply", show_default=True,
              help="Apply EXIF orientation to the pixels, or record it for the readers.")
@click.option("--max-pixels", type=click.IntRange(0, None), default=DEFAULT_MAX_PIXELS, show_default=True,
              help="Refuse (as damaged) images whose header promises more pixels than this, before "
                   "decoding them (decompression bombs); 0 = no limit.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue an interrupted build of the same inputs, or start over.")
@click.option("--overwrite", is_flag=True, help="Replace a packer store at --out (never anything else).")
@click.option("--allow-unlabeled", is_flag=True, help="Keep images without a label (class -1 / no boxes).")
@click.option("--no-labels", is_flag=True, help="Store images only.")
@click.option("--labels-format", type=click.Choice(label_format_choices()), default="auto", show_default=True,
              help="What LABELS is (auto: detected from it). See README 'Labels'.")
@click.option("--clip-boxes", is_flag=True,
              help="Clip coordinates outside the image (noted per record) instead of failing.")
@click.option("--masks", "masks", default=None, type=click.Path(exists=True, file_okay=False),
              help="Folder of PNG masks matched by stem, added to the labels (e.g. VOC SegmentationClass).")
@click.option("--from", "source_format", type=click.Choice(["auto", "folder", *available_datasets()]),
              default="auto", show_default=True,
              help="What IMAGES is: a folder of images, or a WebDataset (tar shards, a folder of them or "
                   "a {000..099} pattern), Hugging Face dataset (save_to_disk folder or parquet), MDS "
                   "folder or TFRecord files; auto detects it.")
@click.option("--split", default=None, help="Hugging Face dataset: the split to pack [default: train].")
@click.option("--image-column", default=None, help="Hugging Face / MDS: the image column, where it is ambiguous.")
@click.option("--label-column", default=None, help="Hugging Face / MDS: the label column, where it is ambiguous.")
@click.option("--csv-columns", default=None, metavar="path=COL,label=COL",
              help="CSV columns to use, by header name or 0-based index; other columns become metadata.")
@click.option("--commit-mb", type=click.IntRange(1, None), default=64, show_default=True,
              help="Write batch size in MiB.")
@click.option("-O", "--store-opt", "store_opts", multiple=True, metavar="NAME=VALUE",
              help="Backend option, e.g. -O pixels=224x224 for HDF5 (see 'packer formats').")
@_uri_option
@click.option("--report", "report_path", default=None, help="Report file [default: next to --out].")
@click.option("--classes", default=None, metavar="FILE|STORE",
              help="Pin the class-name -> id map: names file (one per line), JSON list/dict, or a store.")
@click.option("--shard", default=None, metavar="I/N",
              help="Build only the I-th of N deterministic parts of the sorted inputs (I from 0).")
@click.option("--engine", type=click.Choice(["local", "dask"]), default="local", show_default=True,
              help="dask: build --shards N shard stores on a dask.distributed cluster, publish a manifest at --out.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="dask scheduler (tcp://host:8786) [default: start a LocalCluster here].")
@click.option("--shards", type=click.IntRange(1, None), default=None, help="Number of shards (--engine dask).")
@click.option("--dask-workers", type=click.IntRange(1, None), default=None,
              help="LocalCluster worker processes [default: min(shards, cores)].")
@click.option("--retries", type=click.IntRange(0, None), default=3, show_default=True,
              help="Attempts per shard after a failure or a dead worker (--engine dask).")
@click.option("--shard-dir", default=None, metavar="DIR|URL",
              help="Where shard stores go (--engine dask) [default: OUT.shards/]; mongodb://host/db/prefix "
                   "puts shard i in collection prefix-shard-0000i-of-0000N.")
@_html_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, errors only.")
@click.option("-v", "--verbose", is_flag=True, help="Log more.")
@_handle_errors
def build(images, labels, out, fmt, quality, max_size, workers, on_corrupt, exif, max_pixels, resume, overwrite,
          allow_unlabeled, no_labels, labels_format, clip_boxes, csv_columns, masks, commit_mb, store_opts, uri,
          report_path, classes, shard, engine, scheduler, shards, dask_workers, retries, shard_dir, html_path,
          as_json, quiet, verbose, source_format, split, image_column, label_column):
    """Pack IMAGES (and LABELS) into a checked store.

    LABELS is a folder of per-image .txt (YOLO rows) / .json files, a data.yaml, a COCO
    instances .json, a VOC Annotations/ folder, a folder of PNG masks, or one .csv / .json
    mapping file; without it, each first-level folder of IMAGES is a class. IMAGES may also be a
    WebDataset, Hugging Face, MDS or TFRecord dataset (--from), whose labels are inside it, or an
    image folder in a bucket (s3://bucket/images/, LABELS a prefix, an object or a local path).
    """
    _setup_logging(quiet or as_json, verbose)
    if labels and no_labels:
        raise UsageError("LABELS and --no-labels contradict each other")
    engine_opts = {}
    if engine == "dask":
        if not shards:
            raise UsageError("--engine dask needs --shards N")
        engine_opts = {"engine": "dask", "scheduler": scheduler, "shards": shards, "n_workers": dask_workers,
                       "retries": retries, "shard_dir": shard_dir}
        workers = workers or 1
    elif scheduler or shards or dask_workers or shard_dir:
        raise UsageError("--scheduler/--shards/--dask-workers/--shard-dir need --engine dask")
    if html_path:   # refused before the build, not after it
        from packer.stores.outputs import check_output
        check_output(html_path, inputs=[("images", images), ("labels", labels), ("store", out)], kind="report")
    report = packer.build(images, labels, out, fmt, quality=quality, exif=exif, workers=workers,
                       on_corrupt=on_corrupt, resume=resume, overwrite=overwrite,
                       allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                       commit_bytes=commit_mb << 20, store_options=_parse_store_options(store_opts, uri),
                       report_path=report_path, progress=_progress(quiet, as_json),
                       labels_format=labels_format, clip_boxes=clip_boxes, csv_columns=csv_columns,
                       masks=masks, classes=classes, shard=shard, max_size=max_size, max_pixels=max_pixels,
                       source_format=None if source_format == "auto" else source_format, split=split,
                       image_column=image_column, label_column=label_column, **engine_opts)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        _render_build(report, quiet)
    if html_path:
        _write_html(html_path, out if report.published else None, quiet or as_json, format=fmt,
                    build_report=report, **({"uri": uri} if uri else {}))
    sys.exit(0 if report.ok else 1)


def _render_build(r: packer.BuildReport, quiet: bool) -> None:
    for rej in r.rejected[:_SHOWN_PROBLEMS]:
        # "unsupported format X: install Y" is not damage, nor a folder that cannot be read
        # ("unreadable") or a name that is not UTF-8 ("refused"): say which it is
        what = rej.get("kind") or ("unreachable" if rej.get("unreachable") else
                                   "unsupported" if rej["reason"].startswith("unsupported format") else "damaged")
        click.echo(f"{what}: {rej['path']}: {rej['reason']}", err=True)
    if len(r.rejected) > _SHOWN_PROBLEMS:
        click.echo(f"damaged: ... and {len(r.rejected) - _SHOWN_PROBLEMS} more (see the report)", err=True)
    if r.published:
        msg = f"{r.location}: {r.records} records ({r.format}, labels: {r.label_schema})"
        unreachable = sum(1 for rej in r.rejected if rej.get("unreachable"))
        if len(r.rejected) > unreachable:
            msg += f"; {len(r.rejected) - unreachable} damaged or unsupported input(s) left out"
        if unreachable:   # --on-corrupt skip: whole inputs, maybe, that the storage did not answer for
            msg += (f"; {unreachable} input(s) left out that the storage did not answer for (read twice within "
                    f"the retry budget; they may be whole)")
    elif r.rejected:
        found = r.inputs + sum(1 for rej in r.rejected if rej.get("kind"))   # + those never checked
        msg = (f"{r.location}: NOT published: {len(r.rejected)} damaged, unreadable or unsupported input(s) "
               f"of {found}. "
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
    rep = packer.verify(store, deep=deep, format=fmt, progress=_progress(quiet, as_json), **opts)
    _save_verify(rep, store)
    if as_json:
        d = rep.to_dict()
        d["problems"] = [{"key": p.key, "index": p.index, "reason": p.reason} for p in rep.problems]
        click.echo(json.dumps(d, indent=1))
    else:
        for p in rep.problems:
            click.echo(f"BAD {p}")
        if rep.ok:
            if not quiet:
                click.echo(f"{rep.location}: OK ({rep.checked} records{', decoded' if deep else ''})")
        else:
            click.echo(f"{rep.location}: {len(rep.problems)} problem(s) in {rep.count} records", err=True)
    if html_path:
        _write_html(html_path, store, quiet or as_json, format=fmt, verify_report=rep, **opts)
    sys.exit(0 if rep.ok else 1)


def _save_verify(rep, store: str) -> None:
    """Keep the result next to the store (<store>.verify.json) for ``packer report``; optional."""
    from packer.report.sidecar import save_verify, verify_sidecar_path

    try:
        save_verify(rep, verify_sidecar_path(store))
    except OSError as exc:   # optional: verify's verdict stands, one line says why it is not kept
        logging.getLogger(__name__).warning("%s; the verify result is not kept for packer report",
                                            os_error_message(exc, str(verify_sidecar_path(store))))


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
    rep = packer.info(store, format=fmt, pixel_sample=pixel_sample, **opts)
    if html_path:
        _write_html(html_path, store, as_json, format=fmt, pixel_sample=pixel_sample, **opts)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
        return
    m, s = rep.metadata, rep.metadata.get("stats", {})
    n = max(1, m["count"])
    lines = [
        f"store:        {rep.location} ({rep.format}, format version {m['format_version']})",
        f"records:      {m['count']}   size: {human_bytes(rep.size_bytes)}"
        f"   image bytes: {human_bytes(s.get('bytes', 0))} (originals {human_bytes(s.get('source_bytes', 0))})",
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
    for h in m.get("history") or []:
        lines.append(f"history:      {h.get('action')} at {h.get('at')}: "
                     + json.dumps(h.get("summary") or {k: v for k, v in h.items() if k in ("from", "from_format")}))
    quarantine = m.get("quarantine") or []
    if quarantine:
        lines.append(f"quarantine:   {len(quarantine)} record(s) taken out by repair (restore: packer repair "
                     f"--restore KEY):")
        for q in quarantine[:_SHOWN_PROBLEMS]:
            lines.append(f"    {q['key']} (was index {q['index']}, {q['size']} bytes kept): {q['reason']}")
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
    if m["label_schema"] == "objects":
        names = m.get("class_names") or []
        fmt = (m.get("label_info") or {}).get("format", "?")
        shown = ", ".join(names[:10]) + (f" (+{len(names) - 10} more)" if len(names) > 10 else "")
        return (f" from {fmt}, {s.get('objects', 0)} objects, max {s.get('objects_max_per_image', 0)} per image, "
                f"{s.get('images_without_objects', 0)} images without objects, {s.get('masks', 0)} masks; "
                f"{len(names)} classes" + (f": {shown}" if names else ""))
    return ""


@cli.command()
@click.argument("store")
@click.option("--source", "use_source", is_flag=True,
              help="Rebuild bad records from the original files: --source IMAGES [LABELS]. Records whose "
                   "labels still verify keep them; LABELS must give the store's kind of labels (needed "
                   "unless its labels are its class folders or it has none), else exit 2, nothing changed.")
@click.argument("source_paths", nargs=-1, type=click.Path(), metavar="[--source IMAGES [LABELS]]")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None,
              help="Store format [default: detected].")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--restore", multiple=True, metavar="KEY", help="Put a quarantined record back (repeatable).")
@click.option("--report", "report_path", default=None, help="Report file [default: STORE.repair.json].")
@_uri_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, problems only.")
@_html_option
@_handle_errors
def repair(store, use_source, source_paths, fmt, dry_run, restore, report_path, uri, as_json, quiet, html_path):
    """Repair a damaged STORE: rebuild bad records from --source, salvage, or quarantine them.

    The old store is kept next to the repaired one (STORE.repair-backup-*); exit 0 when the
    store verifies afterwards (or nothing was wrong), 1 when something could not be repaired.
    """
    _setup_logging(quiet or as_json, False)
    if bool(source_paths) != use_source:
        raise UsageError("--source takes the IMAGES folder (and LABELS): packer repair STORE --source IMAGES [LABELS]")
    images, labels = _source_args(source_paths)
    opts = {"uri": uri} if uri else {}
    rep = _api_repair(store, images, labels, format=fmt, dry_run=dry_run, restore=restore,
                      report_path=report_path, progress=_progress(quiet, as_json), **opts)
    if html_path:  # the repaired store (or, for a dry run, the store as it is) with every action
        _write_html(html_path, store, quiet or as_json, format=fmt, repair_report=rep, **opts)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
        sys.exit(0 if rep.ok else 1)
    if rep.nothing_to_repair:
        if not quiet:
            click.echo(f"{redact(store)}: nothing to repair ({rep.records} records verify"
                       + (f", {rep.quarantined} in quarantine" if rep.quarantined else "") + ")")
        sys.exit(0)
    for p in rep.store_problems[:_SHOWN_PROBLEMS]:
        click.echo(f"DAMAGE {p}")
    for a in rep.actions:
        where = a["key"] if a["key"] is not None else "(store)"
        click.echo(f"{'WOULD ' if dry_run else ''}{a['action'].upper()} {where}: {a['damage']} -> {a['detail']}")
    if dry_run:
        click.echo(f"{redact(store)}: dry run: {len(rep.actions)} action(s) planned, nothing changed")
        sys.exit(0 if rep.ok else 1)
    click.echo(f"{redact(store)}: {rep.records} records, {rep.quarantined} in quarantine; old store kept at "
               f"{redact(rep.backup)}; "
               f"report: {rep.report_path}", err=not rep.ok)
    if rep.unrepaired:
        click.echo(f"{redact(store)}: {len(rep.unrepaired)} problem(s) could not be repaired (listed above as LOST)",
                   err=True)
    if rep.verified is False:
        click.echo(f"{redact(store)}: the repaired store does not verify (run packer verify --deep)", err=True)
    sys.exit(0 if rep.ok else 1)


def _source_args(paths):
    if len(paths) > 2:
        raise UsageError(f"--source takes IMAGES and optionally LABELS, got {len(paths)} paths")
    return (paths[0] if paths else None), (paths[1] if len(paths) > 1 else None)


def _api_repair(*args, **kwargs):
    from packer.jobs.repair import repair as run
    return run(*args, **kwargs)


@cli.command()
@click.argument("src")
@click.argument("dst")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None,
              help="Target format [default: from DST, as for build: .h5/.hdf5 -> hdf5, .lmdb or no suffix "
                   "-> lmdb, mongodb:// -> mongo].")
@click.option("--src-format", type=click.Choice(available_formats()), default=None,
              help="Source format [default: detected].")
@click.option("--overwrite", is_flag=True, help="Replace a packer store at DST (never anything else).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue an interrupted convert, or start over.")
@click.option("-O", "--store-opt", "store_opts", multiple=True, metavar="NAME=VALUE", help="Target backend option.")
@_uri_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@_handle_errors
def convert(src, dst, fmt, src_format, overwrite, resume, store_opts, uri, as_json, quiet):
    """Copy store SRC into a new store DST of another format, bytes as they are (no re-encoding)."""
    from packer.jobs.convert import convert as run
    _setup_logging(quiet or as_json, False)
    opts = _parse_store_options(store_opts, uri)
    src_opts = {"uri": uri} if uri and is_server_location(src) else {}
    rep = run(src, dst, fmt, src_format=src_format, overwrite=overwrite, resume=resume, store_options=opts,
              src_options=src_opts, progress=_progress(quiet, as_json))
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
    elif not quiet:
        extra = f", resumed at record {rep.resumed_from}" if rep.resumed_from else ""
        click.echo(f"{redact(dst)}: {rep.records} records ({rep.format}) from {redact(src)} ({rep.source_format}), "
                   f"{rep.quarantined} in quarantine{extra}")


@cli.command()
@click.argument("store")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None)
@click.option("--labels-form", default=None, help="Label files to write [default: the form the store was "
                                                  "built from]: " + ", ".join(sorted(label_writers())) + ".")
@click.option("--to", "to", type=click.Choice(["folder", *available_datasets()]), default="folder",
              show_default=True, help="Write a folder of images + label files, or a dataset of another stack.")
@click.option("--shard-size", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Samples per shard (--to webdataset|hf|mds|tfrecord).")
@_uri_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@_handle_errors
def export(store, out, fmt, labels_form, to, shard_size, uri, as_json, quiet):
    """Write STORE back to OUT/images plus label files (the form it was built from), or as a
    WebDataset, Hugging Face, MDS or TFRecord dataset (--to)."""
    from packer.jobs.export import export as run
    _setup_logging(quiet or as_json, False)
    opts = {"uri": uri} if uri else {}
    if to != "folder":
        if labels_form:
            raise UsageError("--labels-form is for --to folder; a dataset keeps its format's own labels")
        from packer.jobs.export import export_dataset
        drep = export_dataset(store, out, to, shard_size=shard_size, format=fmt, **opts)
        if as_json:
            click.echo(json.dumps(drep.to_dict(), indent=1))
        else:
            for note in drep.notes:
                click.echo(f"note: {note}", err=True)
            if not quiet:
                click.echo(f"{out}: {drep.records} samples in {len(drep.shards)} {to} shard file(s); "
                           f"rebuild with: packer build {out} -o STORE")
        sys.exit(0)
    rep = run(store, out, format=fmt, labels_form=labels_form, progress=_progress(quiet, as_json), **opts)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
        sys.exit(0 if rep.ok else 1)
    for r in rep.refused:
        click.echo(f"REFUSED {r['key']}: {r['reason']}", err=True)
    for r in rep.reencoded:
        click.echo(f"re-encoded: {r['key']} -> {r['file']} ({r['why']})")
    for r in rep.modified:
        click.echo(f"not byte-identical: {r['key']} ({r['why']})")
    if not quiet or not rep.ok:
        click.echo(f"{out}: {rep.records} images ({rep.identical} byte-identical to their originals), labels: "
                   f"{rep.label_form}; rebuild with: packer build {rep.images}"
                   + (f" {rep.labels}" if rep.labels else ""), err=not rep.ok)
    sys.exit(0 if rep.ok else 1)


@cli.command()
@click.argument("shards", nargs=-1, required=True)
@click.option("-o", "--out", required=True, help="Manifest to write (or, with --copy, the store to create).")
@click.option("--copy", is_flag=True, help="Physical merge: copy every record (unchanged, checked) into one store.")
@click.option("--format", "fmt", type=click.Choice(available_formats()), default=None,
              help="Format of the --copy store [default: from --out as for build, or the first shard's "
                   "when --out has no suffix].")
@click.option("--allow-partial", is_flag=True, help="Accept a subset of a sharded build's shards.")
@click.option("--overwrite", is_flag=True, help="Replace a packer store or manifest at --out (never anything else).")
@click.option("-O", "--store-opt", "store_opts", multiple=True, metavar="NAME=VALUE", help="Backend option (--copy).")
@_uri_option
@_json_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@_handle_errors
def merge(shards, out, copy, fmt, allow_partial, overwrite, store_opts, uri, as_json, quiet):
    """Merge SHARD stores into one dataset: a manifest (fast, O(shards)) or, with --copy, one store.

    Refuses shards whose label schema or class map disagree, and (for --shard builds) missing or
    doubled shards.
    """
    from packer.jobs.merge import merge as do_merge

    _setup_logging(quiet or as_json, False)
    rep = do_merge(shards, out, copy=copy, format=fmt, overwrite=overwrite, allow_partial=allow_partial,
                   store_options=_parse_store_options(store_opts, uri if copy else None),
                   reader_options={"uri": uri} if uri else {}, progress=_progress(quiet, as_json))
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
    elif not quiet:
        how = f"copied into one {rep.format} store" if rep.copied else "manifest"
        click.echo(f"{rep.location}: {rep.records} records from {rep.shards} store(s), {how} "
                   f"({rep.seconds:.2f} s)")


@cli.command()
@click.argument("store")
@click.argument("images", type=click.Path(file_okay=False))
@click.argument("labels", required=False, type=click.Path())
@click.option("--replace", is_flag=True, help="Replace records whose key is already in the store.")
@click.option("--quality", type=click.IntRange(1, 100), default=95, show_default=True)
@click.option("--exif", type=click.Choice(["apply", "record"]), default="apply", show_default=True)
@click.option("-j", "--workers", type=click.IntRange(1, None), default=1, show_default=True)
@click.option("--on-corrupt", type=click.Choice(ON_CORRUPT), default="fail", show_default=True)
@click.option("--resume/--no-resume", default=True, show_default=True)
@click.option("--allow-unlabeled", is_flag=True)
@click.option("--no-labels", is_flag=True)
@_uri_option
@_json_option
@click.option("-q", "--quiet", is_flag=True)
@_handle_errors
def append(store, images, labels, replace, quality, exif, workers, on_corrupt, resume, allow_unlabeled,
           no_labels, uri, as_json, quiet):
    """Add IMAGES (and LABELS) to a published STORE: checked like a build, resumable, published
    atomically as a new version (a copy-on-write of the store). Keys already present are refused
    unless --replace."""
    from packer.jobs.append import append as do_append

    _setup_logging(quiet or as_json, False)
    report = do_append(store, images, labels, replace=replace, quality=quality, exif=exif, workers=workers,
                       on_corrupt=on_corrupt, resume=resume, allow_unlabeled=allow_unlabeled,
                       no_labels=no_labels, reader_options={"uri": uri} if uri else {},
                       progress=_progress(quiet, as_json))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        _render_build(report, quiet)
    sys.exit(0 if report.ok else 1)


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
        rep = packer.verify(store, deep=deep, format=fmt, progress=_progress(quiet, False), **opts)
        _save_verify(rep, store)
    with _local_copy(store) as local:   # a bucket store: read from a checked local copy
        _write_html(html_path, local, quiet, format=fmt, verify_report=rep, sample=sample, thumbs=thumbs,
                    pixel_sample=pixel_sample, seed=seed, **opts)
    sys.exit(0 if rep is None or rep.ok else 1)


def _local_copy(store: str):
    """``store`` itself, or for a bucket store a checked temporary copy (packer.jobs.publish)."""
    import contextlib

    from packer.jobs.publish import fetched, is_bucket
    return fetched(store) if is_bucket(store) else contextlib.nullcontext(store)


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
