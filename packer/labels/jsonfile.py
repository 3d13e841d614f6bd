"""JSON label files read in bounded memory, with errors that name the file and line.

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
from typing import Any, Iterator

from packer.core.records import MAX_JSON_DEPTH, json_depth, loads_bounded
from packer.labels.limits import MAX_JSON_ENTRY_CHARS, MAX_PER_IMAGE_BYTES, read_bounded, utf8_error

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
