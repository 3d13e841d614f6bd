"""What a label file may hold, in one place, and the bounded readers that hold files to it.

Label files come from users and from other tools, so a broken or hostile one must give an error
naming the file (and line), never a traceback, and must be read in bounded memory whatever it
holds (a 1 GiB file without a newline, a 100,000-deep JSON array, UTF-16 or binary junk):

* text label files (YOLO rows, CSV) are read line by line, each line at most
  :data:`MAX_LINE_CHARS` characters, and must be UTF-8 (a UTF-8 byte order mark is fine);
* a per-image label file (YOLO ``.txt``, per-image ``.json``, VOC ``.xml``) is at most
  :data:`MAX_PER_IMAGE_BYTES`, a mask PNG at most :data:`MAX_MASK_BYTES`;
* dataset-wide JSON files (COCO, ``{path: label}``) are streamed entry by entry
  (:mod:`packer.labels.jsonfile`), each entry at most :data:`MAX_JSON_ENTRY_CHARS` and every
  JSON value nested at most :data:`~packer.core.records.MAX_JSON_DEPTH` deep (the stores' bound);
  memory then holds what is kept (the labels of the images in IMAGES), not the file;
* a parser stops reading a file after :data:`MAX_PROBLEMS` problems (the build fails anyway);
* a class id must be one the store keeps exactly: :func:`check_class_id`.

Example:
    >>> check_class_id(16777217, "a.txt:1", "boxes")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: a.txt:1: class id 16777217 is larger than 16777216 (2**24),
    the largest a box row stores exactly (boxes are float32)
"""
from __future__ import annotations

import codecs
import os
from typing import Iterator

from packer.core.diskspace import size_text

#: Longest line of a text label file (a YOLO row, a CSV line), in characters.
MAX_LINE_CHARS = 1 << 20
#: Largest per-image label file (YOLO ``.txt``, per-image ``.json``, VOC ``.xml``), in bytes
#: (8 MiB of JSON is about 0.2 GiB of Python objects at worst).
MAX_PER_IMAGE_BYTES = 8 << 20
#: Largest mask PNG, in bytes (its pixels are bounded by Pillow's decompression-bomb limit).
MAX_MASK_BYTES = 64 << 20
#: Largest entry of a dataset-wide JSON file (one COCO image, annotation or category, one other
#: top-level member or item of one, one value of a ``{path: label}`` file), in characters.
MAX_JSON_ENTRY_CHARS = 4 << 20
#: Most characters of the top-level members of a COCO file other than images, annotations and
#: categories (``info``, ``licenses`` ...), kept in the store's ``label_info``.
MAX_LABEL_INFO_CHARS = 16 << 20
#: Most columns a CSV label file may have (a row is at most MAX_LINE_CHARS characters, a field
#: within the csv module's field limit, 128 KiB unless changed).
MAX_CSV_COLUMNS = 4096
#: Deepest element nesting of a VOC XML file (VOC's own files nest 4 deep).
MAX_XML_DEPTH = 64
#: Most classes a label file may declare (COCO ``categories``): the largest label sets in use
#: have about 22,000 (ImageNet-21k).
MAX_CLASSES = 100_000
#: Problems one label file may give before it stops being read.
MAX_PROBLEMS = 1000

_INT64_MAX = 2 ** 63 - 1
#: Largest class id each label schema stores exactly: ``"boxes"`` rows are float32 (integers
#: exact up to 2**24) in every store; a ``"class"`` id is int64 in HDF5 (``class_ids``) and
#: MongoDB (BSON); ``"objects"`` class ids become int64 tensors (``readers.targets``). Class ids
#: are never negative (-1 is "unlabeled").
MAX_CLASS_ID = {"boxes": 2 ** 24, "class": _INT64_MAX, "objects": _INT64_MAX}
_WHY = {"boxes": "(2**24), the largest a box row stores exactly (boxes are float32)",
        "class": "(2**63 - 1), the largest a store keeps (int64)",
        "objects": "(2**63 - 1), the largest a store keeps (int64)"}


def check_class_id(value: int, where: str, schema: str) -> int:
    """``value`` when a store of label schema ``schema`` keeps it exactly.

    Raises:
        ValueError: naming ``where``, the value and the limit.
    """
    limit = MAX_CLASS_ID[schema]
    if value < 0:
        raise ValueError(f"{where}: class id {value} is negative (class ids are 0..{limit})")
    if value > limit:
        raise ValueError(f"{where}: class id {value} is larger than {limit} {_WHY[schema]}")
    return value


class TooManyProblems(Exception):
    """Raised by :class:`Problems` when a file reached MAX_PROBLEMS: it stops being read."""


class Problems(list):
    """A parser's problem lines for one file: at the MAX_PROBLEMS-th, a first line says the file
    stopped being read and :class:`TooManyProblems` is raised (the build fails anyway; a file of
    a billion bad lines must not become a billion messages)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def append(self, line: str) -> None:
        super().append(line)
        if len(self) >= MAX_PROBLEMS:   # said first: the CLI lists only the first problems
            self.insert(0, f"{self.path}: stopped reading after {MAX_PROBLEMS} problems")
            raise TooManyProblems(self.path)


def snippet(text: str, n: int = 80) -> str:
    """``repr`` of at most ``n`` characters of ``text`` (a hostile line can be a MiB long)."""
    text = text.strip()
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text)} characters)"


def read_bounded(path, max_bytes: int, what: str = "label file") -> bytes:
    """The bytes of ``path``, refusing a file over ``max_bytes`` before reading it.

    Raises:
        ValueError: too large or unreadable, naming ``path``.
    """
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(max_bytes + 1) if size <= max_bytes else b""
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if size > max_bytes or len(data) > max_bytes:
        raise ValueError(f"{path}: {size_text(max(size, len(data)))} is more than a {what} may hold "
                         f"({size_text(max_bytes)})")
    return data


def utf8_error(path, data: bytes, start: int, *, offset: int = 0, lines: int = 0, encoding: str = "utf-8") -> str:
    """``"<path>:<line>: not UTF-8 text (...)"`` for the bad byte at ``data[start]``; ``data``
    starts ``offset`` bytes and ``lines`` newlines into the file (``encoding``: the one it
    was read as, when a byte order mark said UTF-16/32)."""
    start = max(0, min(start, len(data) - 1))
    line = lines + data.count(b"\n", 0, start) + 1
    hint = ""
    if offset == 0 and data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        hint = "; it starts with a UTF-16 byte order mark"
    byte = f"byte 0x{data[start]:02x}" if data else "a byte"
    name = "UTF-8" if encoding.lower().startswith("utf-8") else encoding.upper()
    return f"{path}:{line}: not {name} text ({byte} at offset {offset + start}{hint}): save it as UTF-8"


def _bad_utf8(path) -> str:
    """:func:`utf8_error` for the first byte of ``path`` that is not UTF-8 (read in chunks)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 0
    try:
        fh = open(path, "rb")
    except OSError:   # gone since it was opened: the decoder's word is all there is
        return f"{path}: not UTF-8 text: save it as UTF-8"
    with fh:
        while True:
            chunk = fh.read(1 << 20)
            pending = len(dec.getstate()[0])   # bytes of a character the last chunk cut
            try:
                dec.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                return utf8_error(path, chunk, exc.start - pending, offset=offset, lines=lines)
            if not chunk:
                return f"{path}: not UTF-8 text: save it as UTF-8"
            offset += len(chunk)
            lines += chunk.count(b"\n")


def text_lines(path, *, max_bytes: int | None = None, max_line: int = MAX_LINE_CHARS,
               newline: str | None = "") -> Iterator[str]:
    """The lines of a UTF-8 text file (BOM dropped), each with its line ending, read in bounded
    memory: lines of at most ``max_line`` characters, ``max_bytes`` in all when given.

    ``newline`` is passed to :func:`open` (``""``: line endings kept as written, as the csv
    module wants). A generator: errors come while iterating.

    Raises:
        ValueError: naming ``path`` (and the line): unreadable, not UTF-8, a line too long, or
            the file too large.
    """
    lineno, total = 0, 0
    try:
        fh = open(path, encoding="utf-8-sig", newline=newline)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"{path}: {size_text(size)} is more than a label file may hold ({size_text(max_bytes)})")
        while True:
            try:
                line = fh.readline(max_line + 1)
            except UnicodeDecodeError:
                raise ValueError(_bad_utf8(path)) from None
            except OSError as exc:
                raise ValueError(f"{path}:{lineno + 1}: cannot read: {exc.strerror or exc}") from exc
            if not line:
                return
            lineno += 1
            total += len(line)
            if len(line) > max_line:
                raise ValueError(f"{path}:{lineno}: a line longer than {max_line} characters: not a label file?")
            if max_bytes is not None and total > max_bytes:
                raise ValueError(f"{path}: more than a label file may hold ({size_text(max_bytes)})")
            yield line
