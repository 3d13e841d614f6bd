"""The contract every interchange format (WebDataset, Hugging Face datasets, MDS, TFRecord) keeps.

A format is one module or subpackage of :mod:`packer.interchange` with a ``FORMAT`` object that
has:

* ``name``: what ``--from`` / ``--to`` call it (``"webdataset"``, ``"hf"``, ``"mds"``, ``"tfrecord"``);
* ``detect(path) -> bool``: True when ``path`` (a file, a folder or a brace pattern) is data of
  this format; cheap (reads at most a few KiB), never raises for a path of another format;
* ``scan(path, options: ScanOptions) -> Scan``: lists every sample, its label and where its image
  bytes are (a :data:`Locator`), without reading the image bytes where the format lets them be
  read later by offset (tar members, uncompressed MDS shards); damaged parts (a truncated tar
  member, a bad CRC, a corrupt parquet page, a shard whose hash does not match the index, a
  sample with an image but no label) go into ``Scan.problems`` naming shard and member/row, and
  scanning goes on with the rest;
* ``export(reader, out, options: ExportOptions) -> ExportResult``: writes every record of an open
  store reader (:func:`packer.stores.open_store`) as this format, in shards of
  ``options.shard_size`` samples, with the labels in the format's own convention and the index
  the peer library expects; the image bytes exactly as stored.

Round trips are exact: what ``export`` writes, ``scan`` of the same format gives back with equal
keys, image bytes, labels and class names (formats whose own box convention loses float bits carry
packer's label JSON beside it, in a field named ``packer_label``/``packer.json``).

The build reads image bytes in its worker processes through :func:`read_locator`, so a scan keeps
the whole dataset's bytes out of the main process.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from packer.core import remote
from packer.core.diskspace import disk_full, is_disk_full
from packer.core.records import UNLABELED_CLASS, loads_bounded
from packer.core.uri import redact
from packer.labels.limits import MAX_PER_IMAGE_BYTES

#: Class-name side files beside a dataset, in the order they are looked for (a JSON list, then
#: one name per line): what the WebDataset and MDS scans read and exports write.
CLASS_FILES = ("classes.json", "classes.txt")

#: Where one sample's image bytes are:
#: ``("range", shard_path, offset, size)``: ``size`` bytes at ``offset`` of a plain file;
#: ``("range", url, offset, size, version[, storage_options])``: the same in an object of a bucket,
#: read with one ranged GET pinned to ``version`` (the ETag the scan saw; see :func:`range_locator`);
#: ``("bytes", data)``: the bytes themselves (formats with no byte range: parquet, gzip TFRecord),
#: handed to the worker with its task (the build keeps a bounded window of tasks in flight).
Locator = tuple


@dataclass(frozen=True)
class InterchangeFormat:
    """A format module's ``FORMAT``: its name and its three functions (see the module docstring).

    Example:
        >>> FORMAT = InterchangeFormat("webdataset", detect, scan, export)   # doctest: +SKIP
    """

    name: str
    detect: Callable
    scan: Callable
    export: Callable


@dataclass
class ScanOptions:
    """What the user said about the input (``packer build --from ... --split ...``)."""

    split: Optional[str] = None          # HF: which split (train/validation/...)
    image_column: Optional[str] = None   # HF/MDS: the image column when not obvious
    label_column: Optional[str] = None   # HF/MDS: the label column when not obvious
    allow_unlabeled: bool = False        # a sample with no label: label None instead of a problem
    storage_options: Optional[dict] = None   # fsspec's, for a dataset in a bucket (never printed)


@dataclass
class Scan:
    """What a scan found, in sample order (shards in sorted order, samples in shard order).

    Attributes:
        root: the input as given (for messages and the report).
        keys: one unique key per sample (the record key; for WebDataset the sample key plus the
            image extension, e.g. ``"000123.jpg"``; ``"<shard>/..."`` where keys repeat across shards).
        locators: one :data:`Locator` per key.
        displays: one printable name per key, ``"data-000000.tar:000123.jpg"``, for messages.
        labels: one label per key: an ``int`` class id, a float32 ``(N, 5)`` array of YOLO rows
            ``class cx cy w h`` (normalized), a label-model dict (:mod:`packer.labels.model`), or
            None (unlabeled).
        label_schema: ``"class"``, ``"boxes"``, ``"objects"`` or ``"none"``.
        class_names: class names by id (``[]`` when the source has none).
        label_source: a short description (``"webdataset .cls"``), for the store's build options.
        metadata: per-sample metadata dicts (``{}`` each when none).
        problems: ``{"path": display, "reason": text}`` for each damaged or unusable sample/shard.
        fingerprint: ``(name, size, mtime_ns)`` per shard file, for resuming a killed build.
    """

    root: str
    keys: list = field(default_factory=list)
    locators: list = field(default_factory=list)
    displays: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    label_schema: str = "none"
    class_names: list = field(default_factory=list)
    label_source: str = ""
    metadata: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    fingerprint: list = field(default_factory=list)

    def set_samples(self, entries: list) -> None:
        """Keys, locators, displays, labels and metadata from ``entries`` (objects with those
        attributes: ``key``, ``locator``, ``display``, ``label``, ``metadata``), in order."""
        self.keys = [e.key for e in entries]
        self.locators = [e.locator for e in entries]
        self.displays = [e.display for e in entries]
        self.labels = [e.label for e in entries]
        self.metadata = [e.metadata for e in entries]


@dataclass
class ExportOptions:
    """What the user said about the output (``packer export --to ... --shard-size N``)."""

    shard_size: int = 10_000             # samples per shard
    prefix: str = "data"                 # shard file name prefix


@dataclass
class ExportResult:
    """What a format's ``export`` wrote: the folder, the records, the shard files, notes for the user."""

    out: str
    records: int = 0
    shards: list = field(default_factory=list)   # the files written
    notes: list = field(default_factory=list)


def pin_of(fh) -> tuple:
    """What a range locator of the file ``fh`` (opened by :func:`packer.core.remote.open_input`)
    carries after ``(kind, path, offset, size)``: nothing for a local file; for an object in a
    bucket the version the scan read (and the fsspec options, when given), so that the worker's
    ranged GET reads that version or fails naming the object. Picklable (a scan worker returns it)."""
    if isinstance(fh, remote.RemoteFile):
        return (fh.version, fh.storage_options) if fh.storage_options else (fh.version,)
    return ()


def pin_of_object(path: str, info, storage_options: Optional[dict] = None) -> tuple:
    """:func:`pin_of` for the file at ``path`` whose :class:`~packer.core.remote.ObjectInfo` is
    ``info`` (nothing for a local path)."""
    if not remote.is_url(path):
        return ()
    return (info.version, storage_options) if storage_options else (info.version,)


def range_locator(fh, path: str, offset: int, size: int) -> Locator:
    """The locator of ``size`` bytes at ``offset`` of the shard ``fh`` opened from ``path``."""
    return ("range", fh.name if isinstance(fh, remote.RemoteFile) else path, offset, size) + pin_of(fh)


def read_locator(loc: Union[Locator, str, os.PathLike]) -> bytes:
    """The image bytes a locator names (a plain path reads the whole file).

    Raises:
        OSError: the shard cannot be read, or holds fewer bytes than the range says (a
            truncated shard), with the shard's path in the message.
        RemoteError: an object in a bucket is missing, changed since the scan, or unreachable.
    """
    if isinstance(loc, tuple):
        kind = loc[0]
        if kind == "bytes":
            return loc[1]
        if kind == "range":
            path, offset, size = loc[1:4]
            if remote.is_url(path):
                return remote.read(path, offset, offset + size, version=loc[4] if len(loc) > 4 else "",
                                   storage_options=loc[5] if len(loc) > 5 else None)
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(size)
            if len(data) != size:
                raise OSError(f"{path}: cut short: {size} bytes expected at offset {offset}, {len(data)} found")
            return data
        raise ValueError(f"unknown locator kind {kind!r}")
    with open(loc, "rb") as fh:
        return fh.read()


# ---------------------------------------------------------------------------------------------
# Labels and class names, as the scans of several formats resolve them
# ---------------------------------------------------------------------------------------------
def majority_kind(entries: list) -> Optional[str]:
    """The label kind (``"class"``, ``"boxes"``, ``"objects"``) most entries have (``entry.kind``;
    a tie goes to the name first in sorted order), or None when no entry has one."""
    counts: dict = {}
    for e in entries:
        if e.kind:
            counts[e.kind] = counts.get(e.kind, 0) + 1
    return max(sorted(counts), key=counts.get) if counts else None


def _class_file(folder, name: str, storage_options, listed) -> Optional[str]:
    """The class-name file ``name`` in ``folder`` (a local folder or a prefix in a bucket, whose
    objects' URLs ``listed`` may give: no request then), or None."""
    if remote.is_url(str(folder)):
        url = remote.join(str(folder), name)
        if listed is not None:
            return url if url in listed else None
        return url if remote.exists(url, storage_options) else None
    path = os.path.join(folder, name)
    return path if os.path.isfile(path) else None


def read_class_file(folder, *, full_path: bool = False, unicode_lines: bool = False,
                    storage_options: Optional[dict] = None, listed=None) -> tuple:
    """``(names or None, file name, problem or None)`` of the first :data:`CLASS_FILES` file in
    ``folder`` (``(None, "", None)`` when there is none).

    Args:
        folder: where the dataset lies (a local folder, or a prefix in a bucket).
        storage_options / listed: for a prefix, fsspec's options and the URLs of the objects
            under it when listed already (else one request per name looked for).
        full_path: the problem names the file by its path (else by its name).
        unicode_lines: ``classes.txt`` lines end at every Unicode line break (``str.splitlines``),
            else at ``\\n`` only (a name may then hold ``\\x1c``, ``\\x85``...: what the WebDataset
            export writes to a line file).

    Returns:
        The problem is ``{"path", "reason"}`` for a file too large, not UTF-8, or (JSON) not a
        list of names.
    """
    for name in CLASS_FILES:
        path = _class_file(folder, name, storage_options, listed)
        if path is None:
            continue
        try:
            with remote.open_input(path, storage_options) as fh:
                if remote.file_size(fh) > MAX_PER_IMAGE_BYTES:
                    raise ValueError(f"more than {MAX_PER_IMAGE_BYTES} bytes")
                text = fh.read().decode("utf-8-sig")
            if name.endswith(".json"):
                names = loads_bounded(text)
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError("expected a JSON list of class names")
            else:
                lines = text.splitlines() if unicode_lines else text.split("\n")
                names = [ln.strip() for ln in lines if ln.strip()]
        except (OSError, ValueError, remote.RemoteError) as exc:   # UnicodeDecodeError is a ValueError
            shown = (redact(path) if remote.is_url(path) else str(Path(folder) / name)) if full_path else name
            return None, name, {"path": shown, "reason": f"unreadable class-name file: {exc}"}
        return names, name, None
    return None, "", None


def class_ids(entries: list, names: Optional[list], names_file: str, problems: list, *,
              untied: str = "ids") -> tuple:
    """Class labels given as ids or names -> ids; ``(entries kept, class names)``.

    ``entries`` have ``label`` (an int id or a str name) and ``display``; a name is replaced by its
    id in ``names`` (from ``names_file``), or, with no names, in the sorted names the entries give.
    A name not in ``names_file``, or an id past its names, is a problem and the entry is left out.

    Args:
        untied: with no names file, samples that give ids beside samples that give names cannot be
            tied to them: ``"ids"`` leaves out every entry with an id (but ``-1``, unlabeled),
            ``"minority"`` the entries of the smaller group (ids win a tie), ``"keep"`` keeps the
            ids as they are.
    """
    if names is None:
        if untied != "keep":
            entries = (_drop_ids if untied == "ids" else _drop_minority)(entries, problems)
        names = sorted({e.label for e in entries if isinstance(e.label, str)})
    ids = {n: i for i, n in enumerate(names)}
    kept = []
    for e in entries:
        if isinstance(e.label, str):
            if e.label not in ids:
                problems.append({"path": e.display, "reason": f"class name {e.label!r} is not in {names_file}"})
                continue
            e.label = ids[e.label]
        elif names_file and isinstance(e.label, int) and e.label >= len(names):   # None: unlabeled
            problems.append({"path": e.display, "reason": f"class id {e.label}, but {names_file} names "
                                                          f"{len(names)} classes"})
            continue
        kept.append(e)
    return kept, list(names)


def _drop_ids(entries: list, problems: list) -> list:
    def is_id(e) -> bool:
        return isinstance(e.label, int) and e.label != UNLABELED_CLASS

    if not any(isinstance(e.label, str) for e in entries) or not any(is_id(e) for e in entries):
        return entries
    for e in entries:
        if is_id(e):
            problems.append({"path": e.display, "reason": f"class id {e.label}, but other samples give "
                             f"class names and there is no {' or '.join(CLASS_FILES)} to tie them"})
    return [e for e in entries if not is_id(e)]


def _drop_minority(entries: list, problems: list) -> list:
    named = [e for e in entries if isinstance(e.label, str)]
    if not named or len(named) >= len(entries):
        return entries
    want = str if 2 * len(named) > len(entries) else int
    for e in entries:
        if not isinstance(e.label, want):
            problems.append({"path": e.display, "reason": f"class {e.label!r}, but the other samples "
                             f"give class {'names' if want is str else 'ids'} and there is no "
                             f"{' or '.join(CLASS_FILES)} to tie them"})
    return [e for e in entries if isinstance(e.label, want)]


@contextlib.contextmanager
def staged_export(staging: Path, out, room: dict) -> Iterator[Path]:
    """The block that writes an export's shards into ``staging`` (a folder inside ``out``) and
    moves them into place: whatever stops it removes ``staging``, and a full disk ends it as
    one DiskFullError naming ``out`` and what the export needs (``room``: ``needed``, ``what``)."""
    try:
        yield staging
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full(str(out), cause=exc, **room) from exc
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
