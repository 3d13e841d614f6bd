"""What every label parser returns, and the image matching they share."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass
class ParsedLabels:
    """One parser's result, before the images are checked.

    Attributes:
        mapping: image key -> label (class id/name, (N, 5) rows, or a label-model dict).
        problems: one line per problem, naming file (and line / entry).
        schema: ``"class"``, ``"boxes"`` or ``"objects"``.
        class_names: names for class ids (``[]`` when labels are bare integers or names to sort).
        label_info: what a writer needs to reproduce the source (categories, CSV header, ...).
        metadata: image key -> per-sample metadata dict.
        notes: image key -> notes for the record (clipped boxes, ...).
        source: human-readable description of the label source.
        unparsable: keys whose label file is reported already (not "unlabeled" too).
    """

    mapping: dict
    problems: list
    schema: str
    source: str
    class_names: list = field(default_factory=list)
    label_info: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    unparsable: set = field(default_factory=set)


class KeyMatcher:
    """Find the image key a label file names (``file_name`` in COCO, a CSV path, ...).

    Tried in order: the exact relative key; ``./`` and backslashes removed; an absolute path
    under IMAGES; a unique key ending in ``/<name>`` (COCO files name ``000001.jpg`` for
    ``train2017/000001.jpg``); a unique basename.
    """

    def __init__(self, root: Path, keys):
        self.root = Path(root)
        self.keys = set(keys)
        self._by_base = {}
        for k in keys:
            self._by_base.setdefault(PurePosixPath(k).name, []).append(k)
        try:
            self._root_abs = self.root.resolve()
        except OSError:
            self._root_abs = self.root.absolute()

    def match(self, name: str) -> tuple[str | None, str]:
        """(key, "") when found, else (None, why)."""
        raw = str(name).strip()
        norm = raw.replace("\\", "/")
        if norm in self.keys:
            return norm, ""
        while norm.startswith("./"):
            norm = norm[2:]
        if norm in self.keys:
            return norm, ""
        if os.path.isabs(raw) or norm.startswith("/"):
            p = Path(raw)
            for base in (self._root_abs, self.root.absolute()):
                try:
                    rel = p.relative_to(base).as_posix()
                except ValueError:
                    continue
                if rel in self.keys:
                    return rel, ""
            try:
                rel = p.resolve().relative_to(self._root_abs).as_posix()
            except (ValueError, OSError):
                return None, f"{raw} is outside IMAGES ({self.root})"
            if rel in self.keys:
                return rel, ""
            return None, f"there is no such image in {self.root}"
        tails = [k for k in self._by_base.get(PurePosixPath(norm).name, []) if k.endswith("/" + norm)]
        if len(tails) == 1:
            return tails[0], ""
        if len(tails) > 1:
            return None, f"{norm!r} matches {len(tails)} images ({', '.join(sorted(tails)[:3])}...)"
        return None, f"there is no such image in {self.root}"
