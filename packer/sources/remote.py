"""Image folders in a bucket: ``packer build s3://bucket/images/ s3://bucket/labels/ -o OUT``.

IMAGES is a prefix of an object store (any URL :mod:`packer.core.remote` reads); its objects are
listed once, streamed page by page in key order (:func:`packer.core.remote.list_objects`), and
sorted out as a local walk sorts files (:func:`packer.sources.folders.scan_images`): hidden
objects and objects under hidden "folders" are left out, text/metadata extensions are ignored
with why, an object with neither an image extension nor an image's first bytes is ignored, and
``images/`` "folder marker" objects are skipped. A key that cannot be a record key as it stands
(``..`` or ``.`` parts, a leading ``/``, an empty part as in ``a//b.jpg``: nothing a local tree can
hold, see :func:`packer.core.paths.safe_relative`) is refused and listed like an unreadable file.
Keys are the objects' paths relative to IMAGES, so the store equals the one a local build of the
same tree gives, except the source location.

Images are never read here: each becomes a ``("url", url, size, version)`` locator, read by the
build's workers with :func:`packer.core.remote.read` pinned to the listed version (the ETag): an
object replaced since the listing, deleted, or unreachable after the retry budget is that
image's "cannot read" problem in the report, as an unreadable file is.

Labels are small files: LABELS (a prefix or one object; or a local path) is downloaded into a
temporary folder, each object of a prefix refused above
:data:`packer.labels.limits.MAX_PER_IMAGE_BYTES`, and parsed by the very code of a local build
(:func:`packer.sources.folders.label_walk`); messages name the objects' URLs, not the folder.

The resume fingerprint uses each object's ``(key, size, ETag)`` where a local build uses
``(name, size, mtime)``.

Datasets of other stacks in a bucket (WebDataset, MDS, TFRecord) are told apart from an image
folder by :func:`remote_input_format` and scanned by their own formats (:mod:`packer.interchange`).

Example:
    >>> src = collect_remote_sources("s3://bucket/images/", "s3://bucket/labels/")   # doctest: +SKIP
    >>> src.keys[0], src.task_input(0)[0]                                            # doctest: +SKIP
    ('cat/0001.jpg', 'url')
"""
from __future__ import annotations

import array
import dataclasses
import itertools
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from packer.core import remote
from packer.core.errors import SourceError, UsageError
from packer.core.integrity import IMAGE_EXTENSIONS, is_image_bytes
from packer.core.paths import safe_relative
from packer.core.uri import redact
from packer.labels.limits import MAX_PER_IMAGE_BYTES, size_text
from packer.sources.folders import NON_IMAGE_EXTENSIONS, Sources, Walk, label_walk

log = logging.getLogger(__name__)

__all__ = ["UrlRoot", "UrlLocators", "RemoteSources", "scan_remote", "collect_remote_sources",
           "remote_input_format", "SUPPORTED_REMOTE_INPUTS"]

#: What ``packer build`` reads from a bucket (said when something else is given).
SUPPORTED_REMOTE_INPUTS = ("an image folder given as a prefix (s3://bucket/images/), with LABELS as a prefix, "
                           "one label object (CSV, JSON, COCO, data.yaml) or a local path; or a dataset: "
                           "WebDataset shards (a .tar, a prefix of them, data-{000000..000099}.tar), "
                           "Hugging Face parquet, MDS (its folder or index.json) or TFRecord files")
_DATASET_NAME = re.compile(r"\.(packer-manifest\.json|mds|zst|zip|lmdb|h5|hdf5)$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


class UrlRoot(str):
    """IMAGES as a URL that joins like a :class:`~pathlib.Path` (``root / key`` is the object's URL),
    so messages written for folders (``f"{root / key}: ..."``) name objects."""

    def __truediv__(self, rel) -> "UrlRoot":
        return UrlRoot(remote.join(self, str(rel)))

    @property
    def name(self) -> str:
        return remote.basename(self)


class _Sized(str):
    """An object's URL carrying its size (``nbytes``), for the disk-space estimate."""

    nbytes: int = 0


class UrlLocators(Sequence):
    """``("url", url, size, version)`` per key, made on demand from compact columns: the keys (shared
    with :attr:`Sources.keys`), sizes in an ``array('q')``, and ETags packed 16 bytes each where they
    are MD5s (others kept as text). A slice is another :class:`UrlLocators` (a shard's part).

    ``storage_options`` (fsspec's) travel with each locator when given (never printed).
    """

    def __init__(self, base: str, keys: list, sizes, versions, storage_options: Optional[dict] = None):
        self.base, self.keys, self.storage_options = base, keys, storage_options
        self.sizes = sizes if isinstance(sizes, array.array) else array.array("q", sizes)
        self._packed, self._odd = versions if isinstance(versions, tuple) else _pack_versions(versions)

    def __len__(self) -> int:
        return len(self.keys)

    def version(self, i: int) -> str:
        """The listed version (ETag) of entry ``i``."""
        odd = self._odd.get(i)
        return odd if odd is not None else self._packed[16 * i:16 * i + 16].hex()

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("UrlLocators slices are contiguous")
            odd = {j - start: v for j, v in self._odd.items() if start <= j < stop}
            return UrlLocators(self.base, self.keys[start:stop], self.sizes[start:stop],
                               (self._packed[16 * start:16 * stop], odd), self.storage_options)
        if i < 0:
            i += len(self)
        loc = ("url", remote.join(self.base, self.keys[i]), int(self.sizes[i]), self.version(i))
        return loc + (self.storage_options,) if self.storage_options else loc


def _pack_versions(versions) -> tuple[bytearray, dict]:
    packed, odd = bytearray(), {}
    for i, v in enumerate(versions):
        if _MD5.match(v):
            packed += bytes.fromhex(v)
        else:
            packed += bytes(16)
            odd[i] = v
    return packed, odd


@dataclasses.dataclass
class RemoteSources(Sources):
    """:class:`~packer.sources.folders.Sources` of an image folder in a bucket: ``root`` is a
    :class:`UrlRoot`, ``locators`` a :class:`UrlLocators` (sliced with the keys by ``--shard``)."""

    def path(self, key: str):
        """The object's URL."""
        return self.root / key

    def size_paths(self, keys) -> list:
        """The objects of ``keys`` (a suffix of :attr:`keys`, as the build asks) with their sizes."""
        n, locs = len(keys), self.locators
        if n and self.keys[len(self.keys) - n] == keys[0]:
            positions = range(len(self.keys) - n, len(self.keys))
        else:
            where = self._positions()
            positions = [where[k] for k in keys]
        out = []
        for i in positions:
            s = _Sized(self.root / self.keys[i])
            s.nbytes = int(locs.sizes[i])
            out.append(s)
        return out

    def fingerprint_items(self):
        """``(key, size, ETag)`` per object: what identifies it for resuming a build."""
        locs = self.locators
        for i, key in enumerate(self.keys):
            yield key, int(locs.sizes[i]), locs.version(i)


def _refusal(rel: str) -> Optional[str]:
    """Why the object key ``rel`` (relative to IMAGES) cannot be a record key, or None."""
    why = safe_relative(rel.replace("\\", "/"))
    if why is None and any(p in ("", ".", "..") for p in rel.split("/")):
        why = "path with '..', '.' or empty components"   # a/./b and a//b would pose as a/b
    if why is None:
        return None
    return (f"object key cannot be a record key ({why}): no local folder holds such a name; rename the "
            f"object, or pass --on-corrupt skip to build without it")


def _first_bytes_are_image(info: remote.ObjectInfo, storage_options) -> bool:
    if info.size == 0:
        return False
    try:
        return is_image_bytes(remote.read(info.url, 0, min(16, info.size), version=info.version,
                                          storage_options=storage_options))
    except remote.RemoteError:
        return True   # unreadable: keep it as a candidate, the build reports why


def scan_remote(url: str, storage_options: Optional[dict] = None, listing=None):
    """List IMAGES in a bucket: ``(Walk, sizes, versions)``, the walk as
    :func:`packer.sources.folders.scan_images` gives for a folder (keys sorted), and each key's
    size and version (ETag). Streamed: memory holds the kept entries, never a listing page more.
    ``listing``: IMAGES's listing already begun (:func:`remote_input_format`), else listed here.

    Raises:
        RemoteError: the prefix cannot be listed (names it).
    """
    base = url.rstrip("/") + "/"
    keys, sizes, versions, ignored, reasons, unreadable = [], array.array("q"), [], [], {}, []
    for info in listing if listing is not None else remote.list_objects(base, storage_options):
        rel = info.url[len(base):]
        if not rel or rel.endswith("/"):
            continue   # a "folder marker"
        parts = rel.split("/")
        name = parts[-1]
        if any(p.startswith(".") and p not in (".", "..") for p in parts[:-1]):
            continue   # under a hidden folder: a local walk never enters it
        why = _refusal(rel)
        suffix = Path(name).suffix.lower()
        if why is not None:
            log.warning("%s: %s", redact(info.url), why, extra={"packer_damaged_input": True})
            unreadable.append({"path": rel, "reason": why, "kind": "refused"})
        elif name.startswith("."):
            ignored.append(rel)
            reasons[rel] = "hidden file"
        elif suffix in NON_IMAGE_EXTENSIONS:
            ignored.append(rel)
            reasons[rel] = f"not an image: {suffix} files hold text or metadata"
        elif suffix not in IMAGE_EXTENSIONS and not _first_bytes_are_image(info, storage_options):
            ignored.append(rel)
            reasons[rel] = "not an image: no image extension, and its first bytes are not an image's"
        else:
            keys.append(rel)
            sizes.append(info.size)
            versions.append(info.version)
    if any(a > b for a, b in zip(keys, keys[1:])):   # S3 lists in UTF-8 byte order: this is rare
        order = sorted(range(len(keys)), key=keys.__getitem__)
        keys = [keys[i] for i in order]
        sizes = array.array("q", (sizes[i] for i in order))
        versions = [versions[i] for i in order]
    ignored.sort()
    unreadable.sort(key=lambda e: e["path"])
    return Walk(keys, ignored, {k: reasons[k] for k in ignored}, unreadable), sizes, versions


def remote_input_format(images: str, source_format: Optional[str] = None,
                        storage_options: Optional[dict] = None) -> tuple:
    """What IMAGES in a bucket holds: ``"folder"`` (images) or an interchange format name
    (``"webdataset"``, ``"hf"``, ``"mds"``, ``"tfrecord"``), as ``--from`` says, else by the names
    (a brace pattern or a ``.tar`` is WebDataset, ``index.json`` MDS, ``.parquet``/``.arrow`` HF,
    ``.tfrecord`` TFRecord), and for a prefix by the objects right under it on the first listing
    page (an ``index.json``, ``.tar`` shards, ``.parquet`` files, TFRecord files; else images),
    as a local folder is told apart.

    Returns:
        ``(kind, listing)``: ``listing`` is None, or for a prefix the listing of IMAGES, the
        entries already read first (:func:`scan_remote` takes it: IMAGES is listed once).

    Raises:
        RemoteError: the prefix cannot be listed.
    """
    if source_format not in (None, "auto"):
        return source_format, None
    low = images.lower().rstrip("/")
    by_name = _format_of_name(re.sub(r"\{[^{}]*\}", "0", low))   # a pattern: by the names it gives
    if by_name or "{" in low:
        return by_name or "webdataset", None
    if not images.endswith("/") and _DATASET_NAME.search(low):
        return "folder", None   # an unknown dataset file: the folder path says it is one object
    base = images.rstrip("/") + "/"
    listing = remote.list_objects(base, storage_options)
    first = list(itertools.islice(listing, 1000))
    return _kind_of_listing(base, first), itertools.chain(first, listing)


def _kind_of_listing(base: str, first: list) -> str:
    """The dataset kind the first objects of a prefix show (see :func:`remote_input_format`)."""
    names = []
    for info in first:
        rel = info.url[len(base):]
        # right under the prefix, or in data/ (the Hugging Face hub layout)
        names.append(rel.lower() if "/" not in rel else rel.rpartition("/")[2].lower() if rel.startswith("data/")
                     else "")
    if "index.json" in names:
        return "mds"
    for name in names:
        kind = _format_of_name(name)
        if kind in ("webdataset", "hf", "tfrecord"):
            return kind
    if any(n in ("dataset_dict.json", "state.json") for n in names):
        return "hf"
    return "folder"


def _format_of_name(low: str) -> Optional[str]:
    if low.endswith((".tar", ".tar.gz", ".tgz")):
        return "webdataset"
    if low.endswith((".parquet", ".arrow")):
        return "hf"
    if re.search(r"(\.(tfrecords?|tfrec|records?)(-\d+-of-\d+)?|-\d+-of-\d+)(\.gz|\.gzip)?$", low):
        return "tfrecord"
    if low.endswith("index.json") and not low.endswith(".packer-manifest.json"):
        return "mds"
    return None


def collect_remote_sources(images: str, labels=None, *, allow_unlabeled: bool = False, no_labels: bool = False,
                           labels_format: Optional[str] = None, clip_boxes: bool = False, csv_columns=None,
                           masks=None, storage_options: Optional[dict] = None, listing=None) -> RemoteSources:
    """:func:`packer.sources.folders.collect_sources` for IMAGES in a bucket (see the module doc).

    Args:
        images: the IMAGES prefix (``s3://bucket/images/``).
        labels: a LABELS prefix or object in a bucket, a local LABELS path, or None.
        storage_options: fsspec's options for the bucket (credentials; never printed).
        listing: IMAGES's listing already begun (:func:`remote_input_format`), else listed here.
        (the others as for collect_sources)

    Raises:
        UsageError: nothing under IMAGES, IMAGES names one object, or ``masks`` (not supported
            from a bucket); SourceError: label problems, each naming the object; RemoteError:
            the bucket cannot be listed.
    """
    if masks is not None:
        raise UsageError(f"--masks with IMAGES in a bucket ({redact(images)}) is not supported yet")
    walk, sizes, versions = scan_remote(images, storage_options, listing)
    root = UrlRoot(images.rstrip("/"))
    if not walk.keys and not walk.unreadable:
        if not images.endswith("/") and remote.exists(images, storage_options):
            raise UsageError(f"{redact(images)}: IMAGES must be a folder (a prefix ending in /), not one object; "
                             f"packer builds from object storage only {SUPPORTED_REMOTE_INPUTS}")
        raise UsageError(f"{redact(images)}: no objects found under this prefix")
    if not walk.keys:
        raise SourceError(f"{redact(images)}: no image could be read",
                          [f"{root / e['path']}: {e['reason']}" for e in walk.unreadable])
    with tempfile.TemporaryDirectory(prefix="packer-labels-") as tmp:
        local_root = Path(tmp) / "images"
        local_root.mkdir()
        names = {str(local_root): str(root)}
        local_labels = labels
        if labels is not None and remote.is_url(str(labels)):
            local_labels = _fetch_labels(str(labels), Path(tmp) / "labels", storage_options)
            names[str(local_labels)] = redact(str(labels)).rstrip("/")
        try:
            src = label_walk(local_root, walk, local_labels, allow_unlabeled=allow_unlabeled, no_labels=no_labels,
                             labels_format=labels_format, clip_boxes=clip_boxes, csv_columns=csv_columns)
        except SourceError as exc:
            problems = [f"{root / e['path']}: {e['reason']}" for e in walk.unreadable] + list(exc.problems)
            raise SourceError(_named(str(exc), names), [_named(p, names) for p in problems]) from exc
        except UsageError as exc:
            raise UsageError(_named(str(exc), names)) from exc
    metadata = src.metadata if any(src.metadata) else [{}] * len(src.keys)
    locators = UrlLocators(str(root), src.keys, sizes, versions, storage_options)
    return RemoteSources(root, src.keys, src.labels, src.label_schema, src.class_names, src.ignored,
                         _named(src.label_source, names), label_info=_named(src.label_info, names),
                         metadata=metadata, label_notes=_named(src.label_notes, names),
                         ignored_reasons=walk.ignored_reasons, unreadable=walk.unreadable, locators=locators)


def _named(value, names: dict):
    """``value`` (text, or lists/dicts of it) with the temporary folders' paths replaced by URLs."""
    if isinstance(value, str):
        for local, url in names.items():
            value = value.replace(local, url)
        return value
    if isinstance(value, list):
        return [_named(v, names) for v in value]
    if isinstance(value, tuple):
        return tuple(_named(v, names) for v in value)
    if isinstance(value, dict):
        return {k: _named(v, names) for k, v in value.items()}
    return value


def _fetch_labels(url: str, dest: Path, storage_options) -> Path:
    """Download LABELS (one object, or every object under a prefix) into ``dest``; returns the
    local path to parse. Objects of a prefix are per-image label files and side files, each
    refused above :data:`MAX_PER_IMAGE_BYTES`; one object (a CSV, COCO or mapping JSON, which
    the parsers stream) is downloaded whole, in chunks.

    Raises:
        SourceError: a label object too large, or whose key leaves the prefix; UsageError: nothing there.
    """
    if not url.endswith("/"):
        try:
            info = remote.stat(url, storage_options)
        except remote.RemoteError as exc:
            if exc.transient:
                raise
        else:
            target = dest / remote.basename(url)
            remote.download(url, str(target), version=info.version, storage_options=storage_options)
            return target
    base = url.rstrip("/") + "/"
    found, problems = 0, []
    for info in remote.list_objects(base, storage_options):
        rel = info.url[len(base):]
        if not rel or rel.endswith("/"):
            continue
        found += 1
        why = safe_relative(rel)
        if why is not None:
            problems.append(f"{redact(info.url)}: label object key cannot be a file name ({why})")
        elif info.size > MAX_PER_IMAGE_BYTES:
            problems.append(f"{redact(info.url)}: {size_text(info.size)} is more than a label file may hold "
                            f"({size_text(MAX_PER_IMAGE_BYTES)})")
        else:
            remote.download(info.url, os.path.join(dest, *rel.split("/")), version=info.version,
                            size=info.size, storage_options=storage_options)
    if problems:
        raise SourceError(f"{len(problems)} problem(s) with the label objects under {redact(base)}; "
                          f"nothing was written", problems)
    if not found:
        raise UsageError(f"{redact(url)}: LABELS does not exist (no object there, nor under it)")
    return dest
