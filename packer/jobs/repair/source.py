"""The ``--source`` of a repair: the original files, and their labels in the store's terms."""
from __future__ import annotations

import dataclasses
from typing import Optional

from packer.core.errors import ImageError, SourceError, UsageError
from packer.core.integrity import process_image
from packer.core.records import Record, StoreMetadata, checksum, checksum_matches


class Source:
    """The original files, and their labels mapped to the store's class ids.

    Labels: a record whose stored fields still verify keeps them (label, per-sample metadata,
    notes) and takes only its bytes from the original file; the source's labels go only into
    records whose own fields are damaged or lost. Either way the source must give labels of the
    store's label schema, or it is refused here, before anything is written (a record rebuilt
    with labels of another schema cannot be read back: the issue of ``--source IMAGES`` alone,
    class folders, on a store of YOLO boxes).

    Raises:
        UsageError: the source's label schema is not the store's (the message says what to pass).
        SourceError: the source folders or labels are unreadable.
    """

    def __init__(self, images, labels, meta: StoreMetadata, location: str = "STORE"):
        from packer.sources.folders import collect_sources
        opts = meta.build_options or {}
        self.built_from = opts.get("labels")
        # IMAGES alone on a store whose labels came from elsewhere (YOLO boxes, COCO...): the
        # files give bytes only. Records whose stored labels verify keep them; only a record that
        # needs its labels from the source asks for LABELS (see record()).
        self.bytes_only = (labels is None and meta.label_schema != "none"
                           and self.built_from != "class-per-subfolder")
        try:
            # A store of no labels is rebuilt from its images alone (IMAGES with no LABELS).
            self.src = collect_sources(images, labels, allow_unlabeled=True,
                                       no_labels=labels is None and (meta.label_schema == "none" or self.bytes_only))
        except SourceError as exc:
            raise SourceError(f"--source: {exc}", exc.problems) from exc
        from packer.stores.mongo import redact
        self.location = redact(location)   # messages never show a connection string's password
        self.images = images
        if self.src.label_schema != meta.label_schema and not self.bytes_only:
            raise UsageError(self._schema_mismatch(images, labels, meta))
        self.labels = dict(zip(self.src.keys, self.src.labels))
        # Per-sample metadata the build stored with the label (extra CSV columns, a YOLO file's text).
        self.metadata = dict(zip(self.src.keys, self.src.metadata))
        names = list(meta.class_names or [])
        self.remap = None
        if names and self.src.class_names and names != list(self.src.class_names):
            ids = {n: i for i, n in enumerate(names)}
            self.remap = {i: ids.get(n) for i, n in enumerate(self.src.class_names)}
        self.quality = int(opts.get("quality", 95))
        self.exif = opts.get("exif", "apply")
        # A store built with --max-size holds downscaled images: a rebuilt record must be too.
        self.max_size = opts.get("max_size")

    def _schema_mismatch(self, images, labels, meta: StoreMetadata) -> str:
        given = f"--source {images}" + (f" {labels}" if labels is not None else "")
        built = f" (built with labels from {self.built_from})" if self.built_from else ""
        if meta.label_schema == "none":
            hint = f"pass the IMAGES folder alone: packer repair {self.location} --source IMAGES"
        elif self.built_from == "class-per-subfolder":
            hint = (f"pass the IMAGES folder alone, its class folders are the store's labels: "
                    f"packer repair {self.location} --source IMAGES")
        else:
            hint = (f"pass the LABELS the store was built from{f' ({self.built_from})' if self.built_from else ''}: "
                    f"packer repair {self.location} --source IMAGES LABELS")
        return (f"{self.location}: holds {meta.label_schema!r} labels{built}, but {given} gives "
                f"{self.src.label_schema!r} labels ({self.src.label_source}); records rebuilt with them would "
                f"not verify, so nothing was changed. Hint: {hint}")

    def keys(self) -> list:
        return list(self.src.keys)

    def label(self, key):
        lab = self.labels[key]
        if self.remap is not None and isinstance(lab, int) and lab >= 0:
            mapped = self.remap.get(lab)
            if mapped is None:
                raise UsageError(f"--source: class {self.src.class_names[lab]!r} of {key} is not a class of the "
                                 f"store; nothing was changed (hint: pass the LABELS the store was built from"
                                 f"{f' ({self.built_from})' if self.built_from else ''}: "
                                 f"packer repair {self.location} --source IMAGES LABELS)")
            return mapped
        return lab

    def record(self, key: str, expect: Optional[Record], keep_fields: bool = False) -> tuple[Optional[Record], str]:
        """(record from the original file, why not).

        Args:
            key: the record's key.
            expect: the damaged record as read (or as its quarantine entry kept it), None when
                unreadable: the original file must be the one it was built from.
            keep_fields: ``expect``'s fields verify (only its bytes are bad): the record keeps
                its label, per-sample metadata and notes, and takes its bytes (and what
                describes them) from the file. Otherwise the label comes from the source.
        """
        if key not in self.labels:
            return None, f"{key} is not in --source"
        if self.bytes_only and (expect is None or not keep_fields):
            raise UsageError(
                f"{self.location}: {key} needs its labels from the source (its stored labels are "
                f"{'lost' if expect is None else 'damaged'}), and --source {self.images} gives images "
                f"only; nothing was changed. Hint: pass the LABELS the store was built from"
                f"{f' ({self.built_from})' if self.built_from else ''}: "
                f"packer repair {self.location} --source IMAGES LABELS")
        path = self.src.path(key)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            return None, f"{path}: cannot read: {exc.strerror or exc}"
        try:
            rec = process_image(key, raw, quality=self.quality, exif=self.exif, max_size=self.max_size)
        except ImageError as exc:
            return None, f"{path}: {exc.reason}"
        same_bytes = False
        if expect is not None:
            same_file = checksum_matches(raw, expect.source_checksum)   # either algorithm (old stores)
            same_bytes = checksum_matches(rec.data, expect.checksum)
            if not (same_file or same_bytes):
                return None, (f"{path}: differs from the file the record was built from "
                              f"(checksum {checksum(raw)}, record says {expect.source_checksum})")
        if expect is None or not keep_fields:
            return dataclasses.replace(rec, label=self.label(key), metadata=dict(self.metadata.get(key) or {})), ""
        if same_bytes:
            # The file gives back the very bytes the record held: the record is the one built.
            return dataclasses.replace(expect, data=rec.data, meta_checksum=""), ""
        # Same original file, encoded differently now (another libjpeg): the bytes and what
        # describes them come from the file, the label and what came with it from the record.
        notes = list(rec.notes) + [n for n in expect.notes if n not in rec.notes]
        return dataclasses.replace(rec, label=expect.label, metadata=dict(expect.metadata), notes=notes), ""



__all__ = ["Source"]
