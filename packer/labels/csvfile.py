"""CSV label files: ``path,label`` and everything people actually export.

* a UTF-8 BOM (Excel) is accepted; quoting follows the csv module (quoted commas work);
* the file is streamed, so any size reads in bounded memory: a row longer than
  :data:`~packer.labels.limits.MAX_LINE_CHARS`, a field over the csv module's field limit, or
  text that is not UTF-8 is an error naming ``file:line``;
* the first row is a header when it names the path or label column (``path``, ``filename``,
  ``file``, ``image``, ``label``, ``class``, ``category`` ...) or a column given with ``columns``;
* paths may be relative to IMAGES, ``./``-prefixed, Windows-separated, or absolute under IMAGES;
* ``columns`` (``--csv-columns path=filename,label=category``) picks the columns by header name
  or by 0-based index; by default the first path-like and the first label-like header, else
  columns 0 and 1;
* every other column is per-sample metadata (``Record.metadata``, header -> cell text; ``colN``
  without a header).

Example:
    >>> parsed = parse_csv("labels.csv", "images", keys, columns={"path": "filename"})  # doctest: +SKIP
"""
from __future__ import annotations

import csv
import itertools
import os
from pathlib import Path

from packer.core.errors import UsageError
from packer.labels.base import KeyMatcher, LabelForm, MappingWriter, ParsedLabels, RecordsWriter
from packer.labels.jsonfile import parse_class as parse_class_value
from packer.labels.limits import MAX_CSV_COLUMNS, MAX_LINE_CHARS, Problems, TooManyProblems, snippet, text_lines

PATH_NAMES = ("path", "filename", "file_name", "file", "image", "image_path", "img", "name", "image_id", "id")
LABEL_NAMES = ("label", "class", "category", "class_name", "class_id", "target", "y")


def parse_columns(spec: str | None) -> dict:
    """``"path=filename,label=category"`` -> ``{"path": "filename", "label": "category"}``.

    Raises:
        UsageError: an unknown role or a malformed pair.
    """
    if not spec:
        return {}
    out = {}
    for pair in spec.split(","):
        role, sep, col = pair.partition("=")
        role, col = role.strip(), col.strip()
        if not sep or role not in ("path", "label") or not col:
            raise UsageError(f"--csv-columns expects path=COLUMN,label=COLUMN, got {spec!r}")
        out[role] = col
    return out


def _pick(header, wanted, defaults, fallback):
    lowered = [h.strip().lower() for h in header] if header else []
    if wanted is not None:
        if header and wanted.strip().lower() in lowered:
            return lowered.index(wanted.strip().lower())
        if wanted.isdigit():
            return int(wanted)
        return None
    for name in defaults:
        if name in lowered:
            return lowered.index(name)
    return fallback


def parse_csv(path, root, keys, *, columns: dict | None = None, parse_class=None) -> ParsedLabels:
    """Parse a CSV of (path, class label) rows with optional extra columns.

    Args:
        path: the CSV file.
        root, keys: the IMAGES folder and its image keys.
        columns: ``{"path": name-or-index, "label": name-or-index}`` (see :func:`parse_columns`).
        parse_class: ``f(value, where)`` -> int or name (default:
            :func:`packer.labels.jsonfile.parse_class`).

    Returns:
        ParsedLabels with schema ``"class"``; ``label_info`` keeps header, BOM, line ending
        and delimiter so :func:`write_csv` can reproduce the file.
    """
    path = Path(path)
    columns = dict(columns or {})
    parse_class = parse_class or parse_class_value
    try:
        with open(path, "rb") as fh:
            head = fh.read(65536)
    except OSError as exc:
        return ParsedLabels({}, [f"{path}: cannot read: {exc.strerror or exc}"], "class", str(path))
    bom = head.startswith(b"\xef\xbb\xbf")
    newline = "\r\n" if b"\r\n" in head else "\n"
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    problems = Problems(path)
    rows = _rows(path, delimiter)
    try:
        parsed = _parse_rows(path, rows, root, keys, columns, parse_class, problems)
        parsed.label_info.update(bom=bom, newline=newline, delimiter=delimiter)
        return parsed
    except (TooManyProblems, ValueError) as exc:   # ValueError: unreadable, not UTF-8, a row too long
        # not read to the end: its images are not "unlabeled" too
        lines = list(problems) + ([str(exc)] if isinstance(exc, ValueError) else [])
        return ParsedLabels({}, lines, "class", str(path), unparsable=set(keys))
    finally:
        rows.close()


def _rows(path: Path, delimiter: str):
    """``(line, row)`` of the non-blank rows of a CSV file, streamed: each row at most
    MAX_LINE_CHARS characters (quoted fields may span lines), each field within the csv
    module's field limit, at most MAX_CSV_COLUMNS columns.

    Raises:
        ValueError: naming ``path`` and the line (not UTF-8, a row or field too long, bad CSV).
    """
    lines = text_lines(path)
    done, size = 0, 0   # lines read before this row; its characters

    def counted():
        nonlocal size
        for line in lines:
            size += len(line)
            if size > MAX_LINE_CHARS:
                raise ValueError(f"{path}:{done + 1}: a row longer than {MAX_LINE_CHARS} characters: "
                                 f"not a CSV label file?")
            yield line

    reader = csv.reader(counted(), delimiter=delimiter)
    try:
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                if "field larger than field limit" in str(exc):
                    raise ValueError(f"{path}:{done + 1}: a field longer than {csv.field_size_limit()} "
                                     f"characters (the CSV field limit): not a CSV label file?") from None
                raise ValueError(f"{path}:{done + 1}: not valid CSV: {exc}") from None
            line, done, size = done + 1, reader.line_num, 0
            if row and any(c.strip() for c in row):
                if len(row) > MAX_CSV_COLUMNS:
                    raise ValueError(f"{path}:{line}: {len(row)} columns; a CSV label file has at most "
                                     f"{MAX_CSV_COLUMNS}")
                yield line, row
    finally:
        lines.close()


def _parse_rows(path, rows, root, keys, columns, parse_class, problems) -> ParsedLabels:
    first = next(rows, None)
    if first is None:
        return ParsedLabels({}, [f"{path}: no rows"], "class", str(path))
    first_line, first_row = first
    head = [c.strip() for c in first_row]
    known = set(PATH_NAMES + LABEL_NAMES) | {c.strip().lower() for c in columns.values()}
    header = head if any(c.lower() in known for c in head) else None
    pcol = _pick(header, columns.get("path"), PATH_NAMES, 0)
    lcol = _pick(header, columns.get("label"), LABEL_NAMES, 1 if pcol != 1 else 0)
    width = len(header) if header else len(first_row)
    for role, col in (("path", pcol), ("label", lcol)):
        if (col is None or col >= width) and role in columns:
            raise UsageError(f"{path}: --csv-columns {role}={columns[role]!r}: no such column "
                             f"(header: {', '.join(head)})")
        if col >= width:
            return ParsedLabels({}, [f"{path}:{first_line}: {width} column(s); a CSV label file needs a path and "
                                     f"a label column"], "class", str(path), unparsable=set(keys))
    names = header or [f"col{i}" for i in range(width)]
    extra = [i for i in range(width) if i not in (pcol, lcol)]
    matcher = KeyMatcher(root, keys)
    mapping, metadata = {}, {}
    body = rows if header else itertools.chain([first], rows)
    for lineno, row in body:
        where = f"{path}:{lineno}"
        if len(row) != width:
            cols = f"'{names[pcol]},{names[lcol]}'" if width == 2 else "as the first row"
            problems.append(f"{where}: expected {width} columns {cols}, found {len(row)}")
            continue
        key, why = matcher.match(row[pcol])
        if key is None:
            hint = (" (if this row is a header, name the columns: --csv-columns path=COLUMN,label=COLUMN)"
                    if lineno == first_line and header is None else "")
            problems.append(f"{where}: label for {snippet(row[pcol])}, but {why}{hint}")
            continue
        if key in mapping:
            problems.append(f"{where}: {key} is labeled twice")
            continue
        try:
            mapping[key] = parse_class(row[lcol], where)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if extra:
            metadata[key] = {names[i]: row[i] for i in extra}
    info = {"format": "csv", "header": header, "path_column": pcol, "label_column": lcol}
    return ParsedLabels(mapping, list(problems), "class", str(path), [], info, metadata)


def write_csv(records, class_names, out_path, label_info=None) -> None:
    """Write ``path,label[,metadata...]`` rows (atomically), in the source's layout when known.

    Labels are written as class names when the store has them, else as ids; metadata columns
    come back in their header order. A CSV source with the same header, BOM and line ending
    comes back byte for byte when its paths were relative keys.
    """
    info = dict(label_info or {}) if (label_info or {}).get("format") == "csv" else {}
    records = list(records)
    header = info.get("header")
    pcol, lcol = info.get("path_column", 0), info.get("label_column", 1)
    if header is None:
        meta_names = []
        for r in records:
            for k in (r.metadata or {}):
                if k not in meta_names:
                    meta_names.append(k)
        if info:  # a header-less source: its extra columns were named col<N>
            meta_names.sort(key=lambda n: (len(n), n))
            width = 2 + len(meta_names)
            names = [None] * width
            names[pcol], names[lcol] = "path", "label"
            rest = iter(meta_names)
            names = [n if n is not None else next(rest) for n in names]
            write_header = False
        else:
            names = ["path", "label", *meta_names]
            write_header = True
    else:
        names, write_header = header, True
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8-sig" if info.get("bom") else "utf-8", newline="") as fh:
        w = csv.writer(fh, delimiter=info.get("delimiter", ","), lineterminator=info.get("newline", "\n"))
        if write_header:
            w.writerow(names)
        for r in records:
            label = r.label
            if isinstance(label, dict):
                label = label.get("class")
            text = "" if label is None or label == -1 else (
                class_names[label] if class_names else str(label))
            row = []
            for i, n in enumerate(names):
                if i == pcol:
                    row.append(r.key)
                elif i == lcol:
                    row.append(text)
                else:
                    row.append((r.metadata or {}).get(n, ""))
            w.writerow(row)
    os.replace(tmp, out_path)


def _detect(path) -> bool:
    """A ``.csv`` or ``.tsv`` file."""
    path = Path(path)
    return path.is_file() and path.suffix.lower() in (".csv", ".tsv")


def _parse(labels: Path, root, keys, options) -> ParsedLabels:
    if not labels.is_file():
        raise UsageError(f"{labels}: --labels-format csv expects a .csv file")
    return parse_csv(labels, root, keys, columns=options.csv_columns)


class CsvMapping(MappingWriter):
    """``labels.csv``: header ``path,label`` then one row per image."""

    name = "csv"

    def finish(self):
        path = self.out / "labels.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["path", "label"])
            for key, value in self.rows.items():
                w.writerow([key, value])
        return path


class CsvSource(RecordsWriter):
    """``labels.csv`` written by :func:`write_csv`: a CSV-built store's CSV in its own layout."""

    name = "csv-source"
    target = "labels.csv"
    write = staticmethod(write_csv)


FORM = LabelForm("csv", detect=_detect, order=40, parse=_parse, write=write_csv, exports=(CsvMapping, CsvSource),
                 schemas=("class",), choices=("csv",))
