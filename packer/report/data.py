"""Collect the facts an HTML report shows: store metadata, a seeded sample, thumbnails, problems.

Costs stay bounded whatever the store size: statistics over all records come from the
store's metadata (counted at build time); per-record facts (file sizes, boxes) come from a
seeded sample of at most ``sample`` records read in batches; only ``thumbs`` + ``pixel_sample``
records are decoded, at reduced scale. Nothing here imports matplotlib.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from packer.core.errors import RecordError, StoreError
from packer.core.records import CHECKSUM_ALGORITHM
from packer.core.uri import redact
from packer.report.images import draw_labels, enlarge, fit, jpeg_data_uri, label_shapes
from packer.report.sidecar import build_report_path, load_json, verify_sidecar_path, verify_to_dict
from packer.stores.sampling import decode_small, pixel_stats, read_sample, sample_indices

log = logging.getLogger(__name__)

THUMB_SIDE = 160          # longest side of a thumbnail, pixels
MAX_LISTED = 5_000        # rows per problem table; the rest is counted (the JSON reports hold all)
MAX_PROBLEM_THUMBS = 120  # damaged records shown with a thumbnail


@dataclass
class Thumb:
    """One picture in the report: a JPEG data URI (or None when it does not decode) and text."""

    key: str
    index: Optional[int]
    caption: str
    uri: Optional[str]
    note: str = ""


@dataclass
class Sample:
    """Per-record facts from the seeded sample (arrays of equal length, one entry per record)."""

    indices: list = field(default_factory=list)
    stored_bytes: list = field(default_factory=list)
    source_bytes: list = field(default_factory=list)
    width: list = field(default_factory=list)
    height: list = field(default_factory=list)
    boxes_per_image: list = field(default_factory=list)
    box_w: list = field(default_factory=list)      # pixels, all boxes of the sample
    box_h: list = field(default_factory=list)
    box_classes: list = field(default_factory=list)
    classes: list = field(default_factory=list)    # class id per record ("class" stores)


@dataclass
class ReportData:
    """Everything :mod:`packer.report.html` renders; JSON-able apart from the arrays."""

    title: str
    generated: str
    location: Optional[str] = None
    format: Optional[str] = None
    store_error: Optional[str] = None
    count: int = 0
    size_bytes: int = 0
    encoding: str = "jpeg"
    raw_shape: Optional[list] = None
    metadata: dict = field(default_factory=dict)
    checksum_algorithm: str = CHECKSUM_ALGORITHM
    sample: Sample = field(default_factory=Sample)
    sample_seed: int = 0
    pixels: Optional[dict] = None
    thumbs: list = field(default_factory=list)
    damaged: list = field(default_factory=list)       # dicts: key, index, reason, source, thumb
    verify: Optional[dict] = None
    build: Optional[dict] = None
    repair: Optional[dict] = None
    timings: dict = field(default_factory=dict)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _as_dict(report) -> Optional[dict]:
    if report is None:
        return None
    if isinstance(report, dict):
        return dict(report)
    if hasattr(report, "to_dict"):
        return report.to_dict()
    if dataclasses.is_dataclass(report):
        return dataclasses.asdict(report)
    raise TypeError(f"expected a report object or dict, got {type(report).__name__}")


def collect(store=None, *, format: Optional[str] = None, verify_report=None, build_report=None,
            repair_report=None, sample: int = 2000, thumbs: int = 24, pixel_sample: int = 256,
            seed: int = 0, reader_options: Optional[dict] = None) -> ReportData:
    """Gather the report's facts. See :func:`packer.report.write_html` for the arguments.

    The last saved verify result (``<store>.verify.json``) and the build report
    (``<store>.report.json``) are picked up when not given.

    Raises:
        StoreError / UsageError: the store cannot be opened and there is nothing else to show.
    """
    import time

    from packer.stores import detect_format, open_store

    t0 = time.perf_counter()
    build_d = _as_dict(build_report)
    verify_d = verify_to_dict(verify_report) if verify_report is not None else None
    repair_d = _as_dict(repair_report)
    location = str(store) if store is not None else (build_d or {}).get("location")
    shown = redact(location) if location else location   # reports are shared: no password in them
    data = ReportData(title=shown or "packer report", generated=_now(), location=shown,
                      sample_seed=seed, build=build_d, repair=repair_d)
    if store is not None:
        if verify_d is None:
            verify_d = load_json(verify_sidecar_path(location))
            if verify_d is not None and verify_d.get("location") != shown:
                verify_d = None
        if build_d is None:
            saved = load_json(build_report_path(location))
            if saved is not None and saved.get("location") == shown:
                data.build = saved
    data.verify = verify_d
    if store is None:
        return data
    reader_options = dict(reader_options or {})
    try:
        fmt = format or detect_format(location)
        reader = open_store(location, fmt, **reader_options)
    except StoreError as exc:
        if build_d is None and verify_d is None and repair_d is None:
            raise
        data.store_error = str(exc)  # e.g. a build that did not publish: show its report
        return data
    with reader:
        data.format = fmt
        _fill_store_facts(data, reader)
        t1 = time.perf_counter()
        _fill_sample(data, reader, sample, thumbs, pixel_sample, seed)
        t2 = time.perf_counter()
        _fill_problems(data, reader)
        data.timings = {"open_s": round(t1 - t0, 3), "sample_s": round(t2 - t1, 3),
                        "problems_s": round(time.perf_counter() - t2, 3)}
    return data


def _fill_store_facts(data: ReportData, reader) -> None:
    meta = reader.metadata
    data.metadata = dataclasses.asdict(meta)
    data.count = meta.count
    data.size_bytes = reader.size_bytes()
    data.encoding = reader.encoding
    data.raw_shape = list(reader.raw_shape) if reader.raw_shape else None


def _damaged_from_sample(data: ReportData):
    seen = set()

    def add(index, key, reason):
        if index in seen:
            return
        seen.add(index)
        data.damaged.append({"key": key, "index": index, "reason": reason, "source": "sample"})
    return add


def _fill_sample(data: ReportData, reader, sample: int, thumbs: int, pixel_sample: int, seed: int) -> None:
    meta = reader.metadata
    names = meta.class_names
    order = sample_indices(meta.count, max(sample, thumbs, pixel_sample), seed)
    thumb_set = {int(i) for i in order[:thumbs]}
    pixel_set = {int(i) for i in order[:pixel_sample]}
    stat_set = {int(i) for i in order[:sample]}
    s = data.sample
    thumbs_by_index, pixel_recs = {}, []
    for rec in read_sample(reader, order, on_damaged=_damaged_from_sample(data)):
        i = int(rec.index)
        if not rec.data_ok():
            data.damaged.append({"key": rec.key, "index": i, "source": "sample",
                                 "reason": "checksum mismatch: the stored bytes changed since the build"})
            continue
        shapes = label_shapes(rec.label, meta.label_schema, rec.width, rec.height, names)
        if i in stat_set:
            s.indices.append(i)
            s.stored_bytes.append(len(rec.data))
            s.source_bytes.append(int(rec.source_size))
            s.width.append(int(rec.width))
            s.height.append(int(rec.height))
            if meta.label_schema == "class" and isinstance(rec.label, (int, np.integer)):
                s.classes.append(int(rec.label))
            elif meta.label_schema != "class" and rec.label is not None:
                b = shapes.boxes
                s.boxes_per_image.append(len(b))
                s.box_w.extend((b[:, 2] - b[:, 0]).tolist())
                s.box_h.extend((b[:, 3] - b[:, 1]).tolist())
                s.box_classes.extend(int(c) for c in shapes.box_classes)
        if i in pixel_set:
            pixel_recs.append(rec)
        if i in thumb_set:
            thumbs_by_index[i] = _thumb(rec, shapes, reader, names)
    data.pixels = pixel_stats(reader, records=pixel_recs, seed=seed) if pixel_recs else None
    data.thumbs = [thumbs_by_index[int(i)] for i in order[:thumbs] if int(i) in thumbs_by_index]


def _thumb(rec, shapes, reader, names, strict: bool = True, note: str = "") -> Thumb:
    try:
        img = decode_small(rec, min_side=THUMB_SIDE // 2, encoding=reader.encoding,
                           raw_shape=reader.raw_shape, strict=strict)
    except ValueError as exc:
        return Thumb(rec.key, int(rec.index), shapes.caption, None, f"does not decode: {exc}")
    # Labels are in pixels of the image as training sees it (EXIF orientation applied); the
    # decode is smaller (DCT scale, raw pixel size), so scale x and y to the thumbnail.
    w, h = (rec.height, rec.width) if rec.orientation in (5, 6, 7, 8) else (rec.width, rec.height)
    if rec.orientation != 1:
        shapes = label_shapes(rec.label, reader.metadata.label_schema, w, h, names)
    small = enlarge(fit(img, THUMB_SIDE)[0], THUMB_SIDE)   # big ones shrunk, tiny ones made visible
    scale = (small.shape[1] / max(1, w), small.shape[0] / max(1, h))
    small = draw_labels(small, shapes.boxes, shapes.box_classes, names, shapes.masks, scale=scale)
    return Thumb(rec.key, int(rec.index), shapes.caption, jpeg_data_uri(small), note)


def _problem_rows(report: Optional[dict], source: str) -> list:
    rows = []
    for p in (report or {}).get("problems", []):
        if isinstance(p, dict):
            rows.append({"key": p.get("key"), "index": p.get("index"), "reason": p.get("reason", ""),
                         "source": source})
        else:
            rows.append({"key": None, "index": None, "reason": str(p), "source": source})
    return rows


def repair_rows(repair: Optional[dict]) -> list:
    """Per-record rows of a repair report, whatever its exact shape.

    Every list of dicts in the report whose items name a ``key`` (or ``path``) becomes rows
    tagged with the list's name (``quarantined``, ``salvaged``, ...), so the table follows the
    repair report as it grows.
    """
    rows = []
    for name, value in sorted((repair or {}).items()):
        if not isinstance(value, list):
            continue
        for item in value:
            if isinstance(item, dict) and ("key" in item or "path" in item):
                reason = item.get("reason") or item.get("action") or item.get("note") or ""
                rows.append({"key": item.get("key", item.get("path")), "index": item.get("index"),
                             "reason": str(reason), "source": f"repair: {name}"})
    return rows


def _fill_problems(data: ReportData, reader) -> None:
    """Every damaged record known (verify, repair, the sample), with a thumbnail where it decodes."""
    rows = _problem_rows(data.verify, "verify") + repair_rows(data.repair)
    known = {(r["key"], r["index"]) for r in rows}
    known_keys = {r["key"] for r in rows if r["key"]}
    for r in data.damaged:  # found while sampling: keep unless verify already lists it
        if r["key"] not in known_keys and (r["key"], r["index"]) not in known:
            rows.append(r)
    names = reader.metadata.class_names
    shown = 0
    for r in rows:
        r["thumb"] = None
        if shown >= MAX_PROBLEM_THUMBS or (r["key"] is None and r["index"] is None):
            continue
        index = r["index"]
        if index is None:
            try:
                index = reader.index_of(r["key"])
            except KeyError:
                r["thumb"] = Thumb(r["key"], None, "", None, "not in this store")
                continue
        try:
            rec = reader.get(int(index))
        except (RecordError, StoreError, IndexError) as exc:
            r["thumb"] = Thumb(r["key"] or f"#{index}", int(index), "", None,
                               f"does not read: {getattr(exc, 'reason', exc)}")
            continue
        if r["key"] is not None and rec.key != r["key"]:
            continue
        shapes = label_shapes(rec.label, reader.metadata.label_schema, rec.width, rec.height, names)
        t = _thumb(rec, shapes, reader, names, strict=True)
        if t.uri is None:  # show what is left of a damaged JPEG, flagged as such
            lenient = _thumb(rec, shapes, reader, names, strict=False)
            if lenient.uri is not None:
                t = dataclasses.replace(lenient, note=t.note + " (shown as decoded anyway)")
        r["thumb"] = t
        shown += 1
    data.damaged = rows
