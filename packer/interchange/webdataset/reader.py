"""WebDataset scan: each sample's fields -> key, locator, label; the whole dataset's samples,
class names and keys."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from packer.core import remote
from packer.core.paths import safe_relative
from packer.core.records import loads_bounded
from packer.core.uri import redact
from packer.interchange.base import Scan, ScanOptions, class_ids, majority_kind, read_class_file
from packer.interchange.webdataset.tar import IMAGE_FIELDS, Input, Sample, ShardScan, expand, scan_shard, shard_stem
from packer.sources.folders import parse_label_json

log = logging.getLogger(__name__)


#: Fields read during the scan (labels and packer's own record fields); all others are skipped.
TEXT_FIELDS = ("cls", "json", "txt", "packer.json")


# ---------------------------------------------------------------------------------------------
# A sample's fields -> key, locator, label


def _text(sample: Sample, suffix: str) -> Optional[str]:
    data = sample.texts.get(suffix)
    if data is None:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{sample.fields[suffix][0]}: not UTF-8 text (byte {exc.start})") from None


def _json(sample: Sample, suffix: str):
    text = _text(sample, suffix)
    if text is None:
        return None
    try:
        return loads_bounded(text)
    except ValueError as exc:
        raise ValueError(f"{sample.fields[suffix][0]}: invalid JSON: {exc}") from None


def _label_of_json(value, where: str):
    """(kind, label) of a ``.json`` value, or None when it is no label (metadata, captions...)."""
    if isinstance(value, dict) and isinstance(value.get("objects"), list) and "boxes" not in value:
        return "objects", value
    if isinstance(value, list) or (isinstance(value, dict) and "boxes" in value):
        return "boxes", parse_label_json(value, where)
    if isinstance(value, dict) and any(k in value for k in ("class", "label", "class_id")):
        return "class", parse_label_json(value, where)
    if isinstance(value, int) and not isinstance(value, bool):
        return "class", parse_label_json(value, where)
    return None


def _label_of_field(sample: Sample, suffix: str):
    """(kind, label, field) of one field, or None when it holds no label."""
    where = sample.fields[suffix][0]
    if suffix == "json" or suffix.endswith(".json"):
        found = _label_of_json(_json(sample, suffix), where)
        return found + (suffix,) if found else None
    text = _text(sample, suffix).strip()
    if suffix == "txt" or suffix.endswith(".txt"):
        try:
            int(text)
        except ValueError:
            return None   # a caption
    return "class", parse_label_json(text, where), suffix


def _label(sample: Sample, label_field: Optional[str]):
    """(kind, label, field) of a sample, or None when it has none. Raises ValueError naming the member."""
    if label_field:
        return _label_of_field(sample, label_field) if label_field in sample.texts else None
    from_json = _label_of_field(sample, "json") if "json" in sample.texts else None
    if from_json and from_json[0] in ("objects", "boxes"):
        return from_json
    if "cls" in sample.texts:
        return _label_of_field(sample, "cls")
    if from_json:
        return from_json
    return _label_of_field(sample, "txt") if "txt" in sample.texts else None


@dataclass
class _Entry:
    key: str
    shard: int
    locator: tuple
    display: str
    kind: Optional[str]
    label: object
    metadata: dict
    label_field: Optional[str] = None
    number: int = 0            # the sample's place in its shard
    ext: str = "jpg"           # its image field
    unlabeled: bool = False    # packer.json says it has no label (packer's export of an unlabeled record)


def _entry(sample: Sample, shard: ShardScan, index: int, shard_path: str, options: ScanOptions, number: int = 0):
    """An _Entry, or a problem reason. ``shard_path``: the shard's absolute path (one string per shard)."""
    if sample.bad:
        return sample.bad
    image_fields = (options.image_column.lower(),) if options.image_column else IMAGE_FIELDS
    image = next((f for f in image_fields if f in sample.fields), None)
    if image is None:
        return (f"no image member ({', '.join('.' + f for f in image_fields)}); "
                f"fields: {', '.join(sorted(sample.fields)) or 'none'}")
    name, offset, size = sample.fields[image]
    try:
        extra = _json(sample, "packer.json") if "packer.json" in sample.texts else {}
        if not isinstance(extra, dict):
            raise ValueError(f"{sample.fields['packer.json'][0]}: expected a JSON object")
        found = _label(sample, options.label_column.lower() if options.label_column else None)
    except ValueError as exc:
        return str(exc)
    key = extra.get("key", name)
    metadata = extra.get("metadata", {})
    if not isinstance(key, str) or not key or not isinstance(metadata, dict):
        return f"{sample.fields['packer.json'][0]}: 'key' must be a non-empty string, 'metadata' an object"
    kind, label, label_field = found if found else (None, None, None)
    locator = (("bytes", sample.blobs[image]) if image in sample.blobs
               else ("range", shard_path, offset, size) + shard.pin)
    return _Entry(key, index, locator, f"{shard.display}:{name}", kind, label,
                  metadata, label_field, number, image, found is None and extra.get("unlabeled") is True)


# ---------------------------------------------------------------------------------------------
# The whole dataset


#: Shards are scanned in parallel worker processes (one shard per task) when there are several
#: and together they hold at least this many bytes (below it starting workers costs more).
PARALLEL_MIN_BYTES = 512 << 20
#: Most worker processes a scan starts.
MAX_SCAN_WORKERS = 16


def _scan_task(task: tuple) -> ShardScan:
    return scan_shard(*task)


def _scan_shards(tasks: list, total_bytes: int) -> Iterator[ShardScan]:
    """``scan_shard`` of every task, in order; header parsing is CPU-bound, so large inputs of
    several shards use worker processes (:func:`packer.core.workers.ordered_map`)."""
    workers = min(len(tasks), os.cpu_count() or 1, MAX_SCAN_WORKERS)
    if workers < 2 or total_bytes < PARALLEL_MIN_BYTES:
        yield from map(_scan_task, tasks)
        return
    from packer.core.workers import ordered_map
    yield from ordered_map(_scan_task, tasks, workers=workers, window=2 * workers,
                           describe=lambda t: t[1])


def _display_names(shards: list, folder) -> list:
    """Shard names for messages: relative to the input folder where they lie in it (a shard in a
    bucket: relative to the prefix, else its URL with credentials masked)."""
    out = []
    for s in shards:
        if remote.is_url(s):
            out.append(s[len(folder):] if s.startswith(folder) and len(s) > len(folder) else redact(s))
            continue
        rel = os.path.relpath(s, folder)
        out.append(Path(rel).as_posix() if not rel.startswith("..") else s)
    return out


def _shard_stem(display: str, index: int) -> str:
    stem = shard_stem(display)
    for candidate in (stem, os.path.basename(stem)):
        if safe_relative(candidate) is None:
            return candidate
    return f"shard{index:06d}"


def _safe_keys(entries: list, displays: list) -> None:
    """Keys from member names or ``packer.json`` that could leave a folder (``..``, an absolute
    path, a backslash, a NUL byte, too long: :func:`packer.core.paths.safe_relative`) are not
    kept: as the TFRecord, MDS and HF scans do, every sample is then keyed
    ``<shard stem>/<sample number in the shard>.<image field>``, and a warning names them."""
    unsafe = [(e, why) for e in entries if (why := safe_relative(e.key))]
    if not unsafe:
        return
    shown = "; ".join(f"{e.display[:120]}: key {e.key[:80]!r} ({why})" for e, why in unsafe[:5])
    more = f" and {len(unsafe) - 5} more" if len(unsafe) > 5 else ""
    log.warning("%d WebDataset key(s) cannot be record keys: %s%s; every sample is keyed "
                "<shard>/<sample number>.<ext> instead", len(unsafe), shown, more)
    for e in entries:
        e.key = f"{_shard_stem(displays[e.shard], e.shard)}/{e.number:06d}.{e.ext}"


def _unique_keys(entries: list, displays: list, problems: list) -> list:
    """Keys repeated across shards get their shard's name in front (all keys, so keying stays one
    rule); a key repeated within a shard is a problem for its later samples."""
    first_shard: dict = {}
    across = False
    for e in entries:
        across = across or first_shard.setdefault(e.key, e.shard) != e.shard
    del first_shard
    if across:
        for e in entries:
            stem = displays[e.shard]
            e.key = f"{shard_stem(stem)}/{e.key}"
    seen, kept = set(), []
    for e in entries:
        if e.key in seen:
            problems.append({"path": e.display, "reason": f"key {e.key!r} again in the same shard (its members "
                                                          f"are not next to each other, or two samples name it)"})
            continue
        seen.add(e.key)
        kept.append(e)
    return kept


def _sample_member(sample: Sample) -> str:
    """The member that names a sample in messages: its image, else its first member."""
    image = next((f for f in IMAGE_FIELDS if f in sample.fields), None) or next(iter(sample.fields), None)
    return sample.fields[image][0] if image else sample.key


def scan(path, options: Optional[ScanOptions] = None) -> Scan:
    """List the samples of a WebDataset (see the module docstring).

    Args:
        path: a ``.tar`` shard, a folder of them, or a brace pattern.
        options: ``allow_unlabeled`` (unlabeled samples kept with label None), ``image_column``
            / ``label_column`` (the field to take the image / label from).

    Returns:
        Scan, samples in shard order; damaged parts in ``problems``.

    Raises:
        UsageError: ``path`` names nothing (a missing file, a pattern with unbalanced braces).
        DependencyError: a brace pattern and no ``braceexpand``.
    """
    options = options or ScanOptions()
    opts = options.storage_options
    src = expand(path, opts)
    result = Scan(root=os.fspath(path))
    result.problems.extend({"path": m, "reason": "no such shard"} for m in src.missing)
    result.problems.extend({"path": m, "reason": "a compressed tar packer does not read (only .tar, .tar.gz and "
                            ".tgz shards are): decompress it to a .tar"} for m in src.skipped)
    if not src.shards and not src.missing:
        result.problems.append({"path": src.root, "reason": "no .tar (or .tar.gz, .tgz) shard here"})
    wanted = TEXT_FIELDS + ((options.label_column.lower(),) if options.label_column else ())
    images = (options.image_column.lower(),) if options.image_column else IMAGE_FIELDS
    tasks, total = [], 0
    for shard, display in zip(src.shards, _display_names(src.shards, src.folder)):
        info = src.objects.get(shard)
        if info is not None:   # in a bucket: (URL, size, ETag) as listed, the ETag pinned for every read
            result.fingerprint.append((shard, info.size, info.version))
            tasks.append((shard, display, wanted, images, opts, info))
            total += info.size
            continue
        try:
            st = os.stat(shard)
        except OSError as exc:
            result.problems.append({"path": display, "reason": f"cannot read: {exc.strerror or exc}"})
            continue
        result.fingerprint.append((display, st.st_size, st.st_mtime_ns))
        tasks.append((shard, display, wanted, images))
        total += st.st_size
    displays = [t[1] for t in tasks]
    entries = []
    for i, found in enumerate(_scan_shards(tasks, total)):
        result.problems.extend(found.problems)
        shard_path = found.path if remote.is_url(found.path) else os.path.abspath(found.path)
        for number, sample in enumerate(found.samples):
            got = _entry(sample, found, i, shard_path, options, number)
            if isinstance(got, str):
                result.problems.append({"path": f"{found.display}:{_sample_member(sample)}", "reason": got})
            else:
                entries.append(got)
    _finish_labels(result, entries, src, options)
    _safe_keys(entries, displays)
    entries = _unique_keys(entries, displays, result.problems)
    log.debug("%s: %d sample(s) in %d shard(s), %d problem(s)", result.root, len(entries), len(src.shards),
              len(result.problems))
    result.set_samples(entries)
    return result


def _finish_labels(result: Scan, entries: list, src: Input, options: ScanOptions) -> None:
    """Label schema, class ids and names, unlabeled and mixed samples (into problems); filters
    ``entries`` in place."""
    names, names_file, bad_file = read_class_file(src.folder, full_path=True, storage_options=options.storage_options,
                                                  listed=src.listed)
    if bad_file:
        result.problems.append(bad_file)
        names_file = ""
    kind = majority_kind(entries)
    kept = []
    for e in entries:
        if e.kind is None and not (options.allow_unlabeled or e.unlabeled):
            result.problems.append({"path": e.display, "reason": "image without a label (.cls, .json or .txt) "
                                                                 "(--allow-unlabeled keeps it unlabeled)"})
        elif e.kind is not None and e.kind != kind:
            result.problems.append({"path": e.display, "reason": f"a {e.kind} label, but the other samples have "
                                                                 f"{kind} labels; a store holds one kind"})
        else:
            kept.append(e)
    if kind == "class":
        kept, result.class_names = class_ids(kept, names, names_file, result.problems, untied="minority")
    else:
        result.class_names = list(names or [])
    entries[:] = kept
    result.label_schema = kind or "none"
    fields = sorted({e.label_field for e in kept if e.label_field})
    result.label_source = (f"webdataset {' '.join('.' + f for f in fields) or 'unlabeled'}"
                           + (f" + {names_file}" if names_file else ""))
