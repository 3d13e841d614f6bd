"""packer's own JSON labels (per-image files, a ``{path: label}`` file), and JSON read in bounded memory.

The form ``json`` (:data:`FORM`; not a ``--labels-format`` choice: it is what LABELS is when no
other form claims it):

* a folder of per-image files ``LABELS/<dir>/<stem>.json`` (read with YOLO ``.txt`` files by
  :mod:`packer.labels.perimage`), each holding a class (int or name), ``{"class": ...}``, a list
  of 5-number rows, or ``{"boxes": [[class, cx, cy, w, h], ...]}`` (:func:`parse_label_json`);
* a ``.json`` file ``{"relative/path.jpg": label, ...}`` (:func:`parse_json_map`).

Exported as ``--labels-form json`` (per-image files) or ``json-map`` (one mapping file).

Reading:

* :func:`load_json` reads a small file whole (a per-image label): at most
  :data:`~packer.labels.limits.MAX_PER_IMAGE_BYTES`, nesting bounded by
  :func:`packer.core.records.loads_bounded` (the stores' own bound).
* :func:`members` streams a dataset-wide file (COCO, ``{path: label}``) one top-level member,
  or one array item, at a time: memory holds one entry (at most
  :data:`~packer.labels.limits.MAX_JSON_ENTRY_CHARS`) plus what the caller keeps, whatever the
  file's size.

Text is UTF-8 as RFC 8259 asks; a byte order mark is dropped and UTF-16/32 with one is read
as the json module reads bytes. Anything else is an error naming the line of the first bad byte.

Example:
    >>> for name, value, is_array in members("instances.json"):   # doctest: +SKIP
    ...     items = value if is_array else [(None, value)]
"""
from __future__ import annotations

import codecs
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from packer.core.errors import UsageError
from packer.core.records import MAX_JSON_DEPTH, json_depth, loads_bounded
from packer.labels.base import LabelForm, MappingWriter, ParsedLabels, PerImageWriter
from packer.labels.limits import (
    MAX_JSON_ENTRY_CHARS,
    MAX_PER_IMAGE_BYTES,
    Problems,
    TooManyProblems,
    check_class_id,
    read_bounded,
    utf8_error,
)

_CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")


def _interned(pairs) -> dict:
    # json.loads shares the key strings of one document; entry by entry, every COCO annotation
    # would hold its own "image_id", "bbox"... (about 10% more memory on a COCO file)
    return {sys.intern(k): v for k, v in pairs}


_DECODER = json.JSONDecoder(object_pairs_hook=_interned)
#: A decode error this close to the end of what is read may be an entry cut by the read.
_TAIL = 256


def load_json(path, max_bytes: int = MAX_PER_IMAGE_BYTES) -> Any:
    """The JSON value in ``path``, a small file read whole.

    Raises:
        ValueError: naming ``path`` (and the line): too large, not UTF-8, invalid JSON, or
            nested deeper than :data:`~packer.core.records.MAX_JSON_DEPTH`.
    """
    data = read_bounded(path, max_bytes)
    encoding = json.detect_encoding(data)
    try:
        text = data.decode(encoding)   # a BOM dropped
    except UnicodeDecodeError as exc:
        raise ValueError(utf8_error(path, data, exc.start, encoding=encoding)) from None
    try:
        return loads_bounded(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    except ValueError as exc:   # nested too deep
        raise ValueError(f"{path}: {exc}") from None


class _Stream:
    """Decoded text of a JSON file in a window that holds the entry being read."""

    def __init__(self, fh, path, max_entry: int):
        self.fh, self.path, self.max_entry = fh, path, max_entry
        self.buf, self.pos, self.eof = "", 0, False
        self.lines = 0       # newlines before buf[0]
        self.offset = 0      # bytes read so far
        head = fh.read(4)
        self.encoding = json.detect_encoding(head) if head else "utf-8"
        self.decoder = codecs.getincrementaldecoder(self.encoding)()
        self._append(head)

    def line(self, pos: int | None = None) -> int:
        return self.lines + self.buf.count("\n", 0, self.pos if pos is None else pos) + 1

    def where(self, pos: int | None = None) -> str:
        return f"{self.path}:{self.line(pos)}"

    def _append(self, raw: bytes) -> None:
        pending = len(self.decoder.getstate()[0])
        try:
            text = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            lines = self.lines + self.buf.count("\n")
            raise ValueError(utf8_error(self.path, raw, exc.start - pending, offset=self.offset, lines=lines,
                                        encoding=self.encoding)) from None
        self.offset += len(raw)
        self.eof = not raw
        if self.pos:   # drop what is read: the window holds one entry
            self.lines += self.buf.count("\n", 0, self.pos)
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += text

    def more(self) -> bool:
        """Read on; False at the end of the file.

        Raises:
            ValueError: the entry at ``pos`` is longer than ``max_entry``.
        """
        if len(self.buf) - self.pos > self.max_entry:
            raise ValueError(f"{self.where()}: an entry longer than {self.max_entry} characters "
                             f"(a label file's entries are far smaller: is this a label file?)")
        while not self.eof:
            unread = len(self.buf) - self.pos
            # doubling what is held: an entry is decoded again after each read, so a few times
            self._append(self.fh.read(max(_CHUNK, min(unread, self.max_entry + 1 - unread))))
            if len(self.buf) - self.pos > unread:
                return True
        return False

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            found = f"{c!r}" if c else "the end of the file"
            raise ValueError(f"{self.where()}: invalid JSON: expected {what}, found {found}")
        self.pos += 1
        return c

    def value(self) -> Any:
        """Decode the next JSON value (at most ``max_entry`` characters, nesting bounded)."""
        self.peek()
        while True:   # more() moves the window: positions are kept relative to self.pos
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                at = exc.pos - self.pos
                cut = exc.pos >= len(self.buf) - _TAIL or exc.msg.startswith("Unterminated string")
                if cut and self.more():
                    continue
                raise ValueError(f"{self.where(self.pos + at)}: invalid JSON: {exc.msg}") from None
            except RecursionError:
                raise ValueError(f"{self.where()}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
            size = end - self.pos
            if end >= len(self.buf) - _TAIL and self.more():   # a number may go on in what is not read yet
                continue
            end = self.pos + size
            break
        if self.buf.count("[", self.pos, end) + self.buf.count("{", self.pos, end) > MAX_JSON_DEPTH:
            depth = json_depth(self.buf[self.pos:end].encode("utf-8", "surrogatepass"))
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"{self.where()}: JSON nested {depth} levels deep (at most "
                                 f"{MAX_JSON_DEPTH} allowed)")
        self.pos = end
        return obj

    def items(self) -> Iterator[tuple[int, Any]]:
        """``(index, item)`` of the array whose ``[`` was just read."""
        if self.peek() == "]":
            self.pos += 1
            return
        i = 0
        while True:
            yield i, self.value()
            i += 1
            if self.expect(",]", "',' or ']' after an array item") == "]":
                return


def members(path, *, expected: str = "a JSON object", max_entry: int = MAX_JSON_ENTRY_CHARS,
            split_arrays: bool = True):
    """Stream the members of the JSON object in ``path``.

    Yields ``(name, value, is_array)``: for a member whose value is an array, ``value`` is an
    iterator of ``(index, item)`` (read it before the next member, or it is skipped); for any
    other member the decoded value. A name given twice is yielded twice.

    Args:
        expected: what the top level must be, for the error when it is not an object.
        max_entry: the most characters of one entry (a member's value, or an array item).
        split_arrays: False: an array is one entry like any other value (``is_array`` is
            always False).

    Raises:
        ValueError: naming ``path`` and the line: unreadable, not UTF-8, invalid JSON, not an
            object, an entry longer than ``max_entry`` characters or nested deeper than
            :data:`~packer.core.records.MAX_JSON_DEPTH`.
    """
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with fh:
        s = _Stream(fh, path, max_entry)
        c = s.peek()
        if c != "{":
            if c and c in '["-0123456789tfn':
                raise ValueError(f"{s.where()}: expected {expected}, found a JSON {'array' if c == '[' else 'value'}")
            raise ValueError(f"{s.where()}: invalid JSON: expected {expected}, found "
                             f"{repr(c) if c else 'no JSON value'}")
        s.pos += 1
        if s.peek() == "}":
            s.pos += 1
        else:
            while True:
                if s.peek() != '"':
                    s.expect('"', "a member name in double quotes")
                name = s.value()
                s.expect(":", "':' after a member name")
                if split_arrays and s.peek() == "[":
                    s.pos += 1
                    items = s.items()
                    yield name, items, True
                    for _ in items:   # what the caller did not read
                        pass
                else:
                    yield name, s.value(), False
                if s.expect(",}", "',' or '}' after a member") == "}":
                    break
        if s.peek():
            raise ValueError(f"{s.where()}: invalid JSON: extra data after the top-level object")


# ---------------------------------------------------------------------------------------------
# The json label form
# ---------------------------------------------------------------------------------------------
def parse_class(value, where: str):
    """A class label, an int or a name -> (int|str); what a per-image JSON file, a ``{path: label}``
    file and a CSV label column hold.

    Raises:
        ValueError: naming ``where``: not an integer or a name, or an id past the stores' limit.
    """
    if isinstance(value, bool):
        raise ValueError(f"{where}: class must be an integer or a name, got {value!r}")
    if isinstance(value, int):
        return check_class_id(value, where, "class")
    if isinstance(value, float) and value.is_integer():
        return check_class_id(int(value), where, "class")
    if isinstance(value, str) and value.strip():
        v = value.strip()
        try:
            number = int(v)
        except ValueError:
            return v
        return check_class_id(number, where, "class")
    raise ValueError(f"{where}: class must be an integer or a name, got {value!r}")


def parse_box_rows(rows, where: str) -> np.ndarray:
    """``[[class, cx, cy, w, h], ...]`` -> float32 ``(N, 5)``.

    Raises:
        ValueError: naming ``where`` and the box: not 5 numbers, not finite, a class that is not a
            non-negative integer within the stores' limit.
    """
    arr = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 5:
            raise ValueError(f"{where}: box {i} must be [class, cx, cy, w, h], got {row!r}")
        try:
            vals = [float(v) for v in row]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: box {i} has a non-number: {row!r}") from None
        if not all(np.isfinite(vals)):
            raise ValueError(f"{where}: box {i} has a non-finite value: {row!r}")
        if not vals[0].is_integer() or vals[0] < 0:
            raise ValueError(f"{where}: box {i} class must be a non-negative integer, got {row[0]!r}")
        exact = row[0] if isinstance(row[0], int) else int(vals[0])   # float64 loses ids past 2**53
        check_class_id(exact, f"{where}: box {i}", "boxes")
        arr.append(vals)
    return np.asarray(arr, dtype=np.float32).reshape(-1, 5)


def parse_label_json(value, where: str):
    """A per-image JSON label -> class (int|str) or boxes array.

    Raises:
        ValueError: naming ``where`` (see :func:`parse_class`, :func:`parse_box_rows`).
    """
    if isinstance(value, dict):
        if "boxes" in value:
            return parse_box_rows(value["boxes"], where)
        for k in ("class", "label", "class_id"):
            if k in value:
                return parse_class(value[k], where)
        raise ValueError(f"{where}: expected a 'class' or 'boxes' field, found {sorted(value)}")
    if isinstance(value, list):
        return parse_box_rows(value, where)
    return parse_class(value, where)


def parse_file(path, *, clip: bool = False):
    """One per-image ``.json`` label file -> class (int|str) or boxes array (``clip`` unused: the
    rows are checked as they are).

    Raises:
        ValueError: naming ``path``: unreadable, invalid JSON, or not a label.
    """
    return parse_label_json(load_json(path), str(path))


def parse_json_map(path, root, keys) -> ParsedLabels:
    """A ``{path: label}`` file, streamed (:func:`members`): a label for a path that is not an
    image under ``root`` is a problem at once, not kept."""
    key_set = set(keys)
    mapping, problems = {}, Problems(path)
    try:
        for key, value, _ in members(path, expected="an object mapping relative path -> label", split_arrays=False):
            k = key.replace("\\", "/")
            if k not in key_set:
                problems.append(f"{path}: label for {k!r}, but there is no such image in {root}")
            elif k in mapping:
                problems.append(f"{path} [{key!r}]: {k} is labeled twice")
            else:
                try:
                    mapping[k] = parse_label_json(value, f"{path} [{key!r}]")
                except ValueError as exc:
                    problems.append(str(exc))
    except TooManyProblems:
        pass
    except ValueError as exc:   # unreadable, not UTF-8, invalid JSON, an entry too large or deep
        problems = [*problems, str(exc)]
    return ParsedLabels(mapping, list(problems), "", str(path))


def _detect(path) -> bool:
    """A ``.json`` file (that another form did not claim), or any folder: per-image files."""
    path = Path(path)
    return path.is_dir() or (path.is_file() and path.suffix.lower() == ".json")


def _parse(labels: Path, root, keys, options) -> ParsedLabels:
    if labels.is_file() and labels.suffix.lower() == ".json":
        return parse_json_map(labels, root, keys)
    raise UsageError(f"{labels}: json labels are a folder of per-image .json files or a .json file "
                     f"mapping relative path -> label")


class JsonPerImage(PerImageWriter):
    """``labels/<dir>/<stem>.json``: ``{"class": name-or-id}`` or ``{"boxes": [[c, cx, cy, w, h]]}``."""

    name = "json"
    suffix = ".json"

    def add(self, key, label):
        if label is None or (isinstance(label, (int, np.integer)) and label < 0):
            self.skipped.append({"key": key, "reason": "unlabeled (no label file written)"})
            return
        if isinstance(label, (int, np.integer)):
            value = {"class": self.class_value(int(label))}
        else:
            value = {"boxes": [[float(v) for v in row] for row in np.asarray(label, np.float32).reshape(-1, 5)]}
        self.path_for(key).write_text(json.dumps(value), encoding="utf-8")


class JsonMapping(MappingWriter):
    """``labels.json``: ``{"relative/path.jpg": label, ...}`` (class labels; boxes as rows)."""

    name = "json-map"

    def add(self, key, label):
        if label is not None and not isinstance(label, (int, np.integer)):
            self.rows[key] = [[float(v) for v in row] for row in np.asarray(label, np.float32).reshape(-1, 5)]
            return
        super().add(key, label)

    def finish(self):
        path = self.out / "labels.json"
        path.write_text(json.dumps(self.rows, indent=1), encoding="utf-8")
        return path


#: Asked last: what LABELS is when no other form claims it.
FORM = LabelForm("json", detect=_detect, order=90, parse=_parse, suffix=".json", parse_file=parse_file,
                 exports=(JsonPerImage, JsonMapping), schemas=("class", "boxes"))
