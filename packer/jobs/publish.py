"""Publishing to a bucket: a store written to ``s3://...`` (or any :mod:`packer.core.remote` URL).

A store in a bucket is always a manifest (:mod:`packer.stores.manifest`) over shard stores
beside it, ``<name>.shards/...``. Every job that writes to a bucket composes the same steps:

1. **stage**: the job runs as it does for a local output, into a staging folder on this machine,
   ``$PACKER_STAGING_DIR/<16 hex>/`` (default ``~/.cache/packer/publish/<16 hex>/``, the hex
   from the SHA-256 of the URL), so its checks, resume and report are the local ones;
2. **upload** every shard file (:func:`packer.core.remote.upload`: multipart for large ones,
   checked by size and ETag, an identical object already there kept: the resume);
3. **manifest last**: the manifest JSON, its shard locations relative and each shard entry with
   ``"files": [{"name", "size", "xxh3_128", "etag"}]``, is written with one request
   (:func:`packer.core.remote.put_bytes`): a reader sees the old dataset or the new one, never a
   mix;
4. **replaced shards**: with ``overwrite``, objects under ``<name>.shards/`` that the new manifest
   does not list are deleted, only after the new manifest is written.

A failure at any step leaves the staging folder in place: a rerun of the same command finds the
finished local store (its build fingerprint, or the job, recorded in ``publish.json`` there) and
only uploads what is missing. The staging folder is removed once the manifest is written.

Reading back, without a shard cache: :func:`remote_info` reads the manifest only;
:func:`fetch_manifest` downloads the manifest and every shard once into a folder, checking each
file's size and xxh3_128 against the manifest, and :func:`verify_remote` verifies that copy.

Example:
    >>> from packer import build                                                    # doctest: +SKIP
    >>> build("imgs", None, "s3://bucket/train.packer-manifest.json").published    # doctest: +SKIP
    True
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from packer.core import remote
from packer.core.errors import LockedError, PackerError, StoreError, UsageError
from packer.core.locking import describe_holder, file_lock, lock_path
from packer.core.records import xxh3_file
from packer.core.sharding import shard_name
from packer.core.uri import redact
from packer.jobs.reshard import DEFAULT_SHARD_BYTES, parse_bytes, split_shards
from packer.stores import get_store
from packer.stores.extents import EXTENTS_SUFFIX, dump_extents, load_extents
from packer.stores.manifest import (
    MANIFEST_SUFFIX,
    manifest_checksum,
    read_manifest,
    resolve_location,
    shard_formats,
    shard_suffix,
)

log = logging.getLogger(__name__)

#: The environment variable naming the folder that holds staging folders.
STAGING_ENV = "PACKER_STAGING_DIR"
#: The file in a staging folder that says what was staged there (no credentials in it).
MARKER = "publish.json"
#: Files of a shard folder never uploaded (LMDB's lock file is per machine).
_NOT_UPLOADED = {"lock.mdb"}
#: Top-level files of an exported dataset uploaded last: what its readers open first.
_INDEX_FILES = ("index.json", "dataset_info.json", "state.json", "dataset_dict.json", "README.md")
#: The object an export to a bucket writes last (a hidden name: the datasets' readers skip it).
EXPORT_MARKER = ".packer-export.json"


def is_bucket(location) -> bool:
    """Whether ``location`` is an object-storage URL that publishing handles (not ``mongodb://``)."""
    return remote.is_url(location)


# ---------------------------------------------------------------------------------------------
# Staging
# ---------------------------------------------------------------------------------------------
def staging_dir(url: str) -> Path:
    """The local staging folder of a publish to ``url``: ``$PACKER_STAGING_DIR/<16 hex>`` or
    ``~/.cache/packer/publish/<16 hex>`` (outside the read cache: never evicted)."""
    root = os.environ.get(STAGING_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "packer", "publish")
    return Path(root) / hashlib.sha256(url.encode()).hexdigest()[:16]


def read_marker(stage: Path) -> dict:
    """What ``publish.json`` in ``stage`` says ({} when absent or unreadable)."""
    try:
        doc = json.loads((stage / MARKER).read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def write_marker(stage: Path, url: str, **fields) -> None:
    """Record in ``stage`` what was staged for ``url`` (atomically)."""
    stage.mkdir(parents=True, exist_ok=True)
    tmp = stage / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"url": redact(url), **fields}, indent=1, sort_keys=True, default=str))
    os.replace(tmp, stage / MARKER)


def drop_staging(stage: Path) -> None:
    """Remove the staging folder once its store is published (every byte has a remote copy)."""
    shutil.rmtree(stage, ignore_errors=True)
    log.info("%s: staging removed (published)", stage)


@contextlib.contextmanager
def publishing(url: str, purpose: str) -> Iterator[Path]:
    """Hold this machine's lock on writing ``url`` for the block; yields its staging folder.

    Every job to one URL stages in the same folder (:func:`staging_dir`), so a second job to it on
    this machine is refused, naming the URL and the job that holds it, as a second writer of a
    local output is (:func:`packer.core.locking.file_lock`; the lock file is ``<staging
    folder>.lock``, beside the folder, which a finished job removes). Jobs on other machines stage
    in their own folders: a bucket has no lock, and of two publishes of one URL the manifest
    written last is the store (each is whole, see the module docstring).

    Raises:
        LockedError: another job on this machine is writing ``url``.
    """
    stage = staging_dir(url)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(file_lock(str(stage), purpose=purpose))
        except LockedError as exc:
            raise LockedError(
                f"{redact(url)}: another {describe_holder(exc.holder)} is writing this output from this machine "
                f"(lock file {lock_path(str(stage))}); wait for it to finish, or stop it. (The lock is released "
                f"automatically when that process ends, even if it is killed.)", exc.holder) from None
        yield stage


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------
def check_manifest_url(url: str, *, overwrite: bool = False, storage_options: Optional[dict] = None) -> None:
    """Refuse a bucket output that is not a manifest name, or that holds one and ``overwrite``
    is False, or that holds something else than a packer manifest.

    Raises:
        UsageError: naming the URL and why.
        RemoteError: the bucket cannot be reached.
    """
    shown = redact(url)
    if not url.endswith(MANIFEST_SUFFIX) or remote.basename(url) == MANIFEST_SUFFIX:
        raise UsageError(f"{shown}: a store in a bucket is a manifest over shard stores; name it "
                         f"NAME{MANIFEST_SUFFIX} (e.g. {remote.parent(url)}train{MANIFEST_SUFFIX}); "
                         f"--format lmdb or hdf5 picks its shards' format")
    if not remote.exists(url, storage_options):
        return
    if not overwrite:
        raise UsageError(f"{shown} already exists (hint: --overwrite replaces it)")
    head = remote.read(url, 0, min(64, remote.stat(url, storage_options).size), storage_options=storage_options)
    if not b"".join(head.split()).startswith(b'{"packer_manifest":'):
        raise UsageError(f"{shown} holds an object that is not a packer manifest; refusing to replace it "
                         f"(--overwrite replaces only packer stores: choose another name)")


def shard_format_for(url: str, format: Optional[str], store_options: dict) -> str:
    """The shards' format of a bucket store: ``format`` when it is ``lmdb``/``hdf5``, else the
    ``shard_format`` store option (default ``lmdb``)."""
    if format is None or get_store(format).composite:
        fmt = store_options.get("shard_format", "lmdb")
    else:
        fmt = format
    if fmt not in shard_formats():
        raise UsageError(f"{redact(url)}: a store in a bucket is a manifest over shard files; --format "
                         f"{fmt} cannot be a shard there (choose {', '.join(shard_formats())} or manifest)")
    return fmt


# ---------------------------------------------------------------------------------------------
# Upload: shards, then the manifest, then what it replaced
# ---------------------------------------------------------------------------------------------
def shard_files(location: str) -> list[tuple[str, str]]:
    """``[(name, path)]`` of a local shard store: ``[("", file)]`` for a one-file store, every
    regular file of a store folder (by its path inside it, sorted) but LMDB's ``lock.mdb``."""
    if os.path.isfile(location):
        return [("", location)]
    if not os.path.isdir(location):
        raise StoreError(f"{location}: shard store missing; nothing to upload")
    out = []
    for folder, _, names in os.walk(location):
        for n in names:
            path = os.path.join(folder, n)
            rel = os.path.relpath(path, location).replace(os.sep, "/")
            if n not in _NOT_UPLOADED and os.path.isfile(path) and not os.path.islink(path):
                out.append((rel, path))
    return sorted(out)


@dataclass
class PublishReport:
    """What a publish sent: the manifest URL, the shard files (uploaded or kept), the bytes,
    and the objects of replaced shards deleted."""

    url: str
    shards: int = 0
    files: int = 0
    bytes: int = 0
    deleted: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _remote_names(local_manifest: str, name: str, shards: list) -> list[str]:
    """Each shard's location relative to the manifest in the bucket: kept when the staged shard
    already lies under ``<name>.shards/``, else ``<name>.shards/shard-JJJJJ-of-NNNNN.<ext>``."""
    folder = os.path.join(os.path.dirname(os.path.abspath(local_manifest)), name + ".shards")
    out = []
    for j, s in enumerate(shards):
        loc = s["location"]
        if "://" in loc:
            raise UsageError(f"{local_manifest}: shard {j} is at {redact(loc)}; a store in a bucket lists "
                             f"LMDB/HDF5 shard stores uploaded beside it")
        path = resolve_location(local_manifest, loc)
        if os.path.commonpath([path, folder]) == folder and path != folder:
            out.append(name + ".shards/" + os.path.relpath(path, folder).replace(os.sep, "/"))
        else:
            suffix = shard_suffix(s["format"])
            out.append(f"{name}.shards/" + shard_name(j, len(shards), suffix))
    if len(set(out)) != len(out):
        raise UsageError(f"{local_manifest}: two shards would share one name in the bucket ({sorted(out)})")
    return out


def publish_manifest(local_manifest: str, url: str, *, overwrite: bool = False,
                     storage_options: Optional[dict] = None) -> PublishReport:
    """Upload the local manifest store ``local_manifest`` to ``url``: shard files first, the
    manifest (with ``"files"`` per shard) last, then (``overwrite``) delete the objects under
    ``<name>.shards/`` that the new manifest does not list.

    Raises:
        UsageError: a shard is not a local LMDB/HDF5 store. RemoteError: an upload failed
        (names the object; nothing was replaced: a rerun resumes).
    """
    read_manifest(local_manifest)          # StoreError when the staged manifest is damaged
    with open(local_manifest, "rb") as fh:
        doc = json.loads(fh.read())
    name = remote.basename(url)
    shards = doc["shards"]
    rep = PublishReport(redact(url), shards=len(shards))
    names = _remote_names(local_manifest, name, shards)
    keep = set()
    for j, (entry, rel) in enumerate(zip(shards, names)):
        local = resolve_location(local_manifest, entry["location"])
        files = []
        for fname, path in shard_files(local):
            target = remote.resolve(url, rel + ("/" + fname if fname else ""))
            digest = xxh3_file(path)
            info = remote.upload(path, target, storage_options=storage_options)
            files.append({"name": fname, "size": info.size, "xxh3_128": digest, "etag": info.version})
            keep.add(target)
            rep.files += 1
            rep.bytes += info.size
        extents = _upload_extents(local, entry["format"], remote.resolve(url, rel + EXTENTS_SUFFIX),
                                  storage_options)
        entry.pop("extents", None)          # a staged copy's old entry never outlives its shard
        if extents is not None:
            extents["name"] = rel + EXTENTS_SUFFIX
            keep.add(remote.resolve(url, extents["name"]))
            entry["extents"] = extents
        log.info("%s: shard %d/%d uploaded (%d file(s))", redact(url), j + 1, len(shards), len(files))
        entry["location"], entry["files"] = rel, files
    raw = json.dumps(doc, indent=1).encode()
    remote.put_bytes(raw, url, storage_options=storage_options)       # the commit: last
    if overwrite:
        prefix = remote.join(remote.parent(url), name + ".shards/")
        for obj in remote.list_objects(prefix, storage_options):
            if obj.url not in keep:
                remote.delete(obj.url, storage_options)
                rep.deleted.append(redact(obj.url))
        if rep.deleted:
            log.info("%s: %d object(s) of replaced shards deleted", redact(url), len(rep.deleted))
    return rep


def _upload_extents(local: str, fmt: str, target: str, storage_options: Optional[dict]) -> Optional[dict]:
    """Upload where each record of the local shard ``local`` lies in its data file (an ``.npy``
    of (count, 4) uint64: metadata offset, length, image offset, length; see
    :meth:`~packer.stores.base.StoreReader.record_extents`), for a reader's ``ds[i]`` by ranged
    reads. Returns the manifest entry's ``"extents"`` (without its name), None where the store
    gives none."""
    with get_store(fmt).open_reader(local) as reader:
        found = reader.record_extents()
    if found is None:
        return None
    data_file, table = found
    fd, tmp = tempfile.mkstemp(suffix=".npy")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(dump_extents(table))
        digest = xxh3_file(tmp)
        info = remote.upload(tmp, target, storage_options=storage_options)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)
    return {"file": data_file, "size": info.size, "xxh3_128": digest, "etag": info.version}


def upload_folder(local: Path, url: str, *, storage_options: Optional[dict] = None) -> PublishReport:
    """Upload every file under ``local`` to the folder ``url`` (same relative names), the top
    level's index files (``index.json``, ``dataset_info.json``, ``state.json``...) after the
    rest, and last :data:`EXPORT_MARKER`, listing every file with its size, xxh3_128 and ETag:
    the folder is complete once it is there."""
    files = sorted(p for p in local.rglob("*") if p.is_file() and not p.is_symlink())
    last = [p for p in files if p.parent == local and p.name in _INDEX_FILES]
    rep = PublishReport(redact(url))
    listed = []
    for p in [p for p in files if p not in last] + last:
        name = p.relative_to(local).as_posix()
        info = remote.upload(str(p), remote.join(url, name), storage_options=storage_options)
        listed.append({"name": name, "size": info.size, "xxh3_128": xxh3_file(str(p)), "etag": info.version})
        rep.files += 1
        rep.bytes += info.size
    marker = {"packer_export": 1, "files": listed}
    remote.put_bytes(json.dumps(marker, indent=1).encode(), remote.join(url, EXPORT_MARKER),
                     storage_options=storage_options)
    return rep


def folder_url(url: str) -> str:
    """``url`` as a folder (one trailing ``/``)."""
    return url.rstrip("/") + "/"


def check_empty_folder(url: str, storage_options: Optional[dict] = None, *, ours: Optional[set] = None) -> None:
    """UsageError when the bucket folder ``url`` holds objects (``ours``: names a resumed export
    of this staging may have put there already, which are allowed)."""
    for obj in remote.list_objects(folder_url(url), storage_options):
        rel = obj.url[len(folder_url(url)):]
        if ours is None or rel not in ours or rel == EXPORT_MARKER:
            raise UsageError(f"{redact(url)} is not an empty folder (it holds {redact(obj.url)}); export "
                             f"writes only into a new or empty folder and never replaces files")


# ---------------------------------------------------------------------------------------------
# Jobs to a bucket
# ---------------------------------------------------------------------------------------------
def reuse_staged(url: str, job) -> tuple[Path, str, Optional[dict]]:
    """``(stage, local manifest, marker)``: the marker when a finished local store of the same
    ``job`` is staged for ``url`` (a rerun then only uploads), else None."""
    stage = staging_dir(url)
    local = str(stage / remote.basename(url))
    marker = read_marker(stage)
    if marker.get("job") == job and marker.get("state") == "staged" and os.path.isfile(local):
        log.info("%s: the staged store at %s is finished; uploading it", redact(url), stage)
        return stage, local, marker
    stage.mkdir(parents=True, exist_ok=True)
    return stage, local, None


def build_to_bucket(images, labels, url: str, format: Optional[str], options, *, engine: str = "local",
                    engine_options: Optional[dict] = None, storage_options: Optional[dict] = None,
                    run_dask: Optional[Callable] = None):
    """``build`` to a bucket: the build runs into the staging folder as a manifest over its
    shard(s) (resumed there like any build), then the store is published to ``url``.

    The report goes where reports of server outputs go, the working directory
    (``<name>.report.json``), unless ``options.report_path`` says otherwise.
    """
    from packer.jobs.pack import pack, plan_build
    from packer.jobs.reports import BuildReport, default_report_path

    with publishing(url, "build") as stage:
        store_options = dict(options.store_options)
        shard_bytes = _shard_bytes(url, store_options)
        store_options["shard_format"] = shard_format_for(url, format, store_options)
        check_manifest_url(url, overwrite=options.overwrite, storage_options=storage_options)
        report_path = Path(options.report_path) if options.report_path else default_report_path(url)
        opts = options.replace(overwrite=True, store_options=store_options, report_path=str(report_path))
        stage.mkdir(parents=True, exist_ok=True)
        local = str(stage / remote.basename(url))
        if engine == "dask":
            if (engine_options or {}).get("shard_dir"):
                raise UsageError(f"{redact(url)}: --shard-dir is for local outputs; a bucket store's shards go "
                                 f"beside its manifest")
            eo = {k: v for k, v in (engine_options or {}).items() if k != "shard_dir"}
            rep = run_dask(images, labels, local, store_options.pop("shard_format"),
                           options=opts.replace(store_options=store_options), **eo)
        else:
            plan = plan_build(images, labels, local, "manifest", opts)
            marker = read_marker(stage)
            if marker.get("job") == plan.fingerprint and marker.get("state") == "staged" and os.path.isfile(local):
                log.info("%s: the staged build at %s is finished; uploading it", redact(url), stage)
                rep = BuildReport(**marker["report"])
            else:
                rep = pack(images, labels, local, "manifest", opts, plan=plan)
                if rep.published:
                    split_shards(local, shard_bytes)   # a shard is what a reader downloads at once
                    write_marker(stage, url, job=plan.fingerprint, state="staged", report=rep.to_dict())
        rep = dataclasses.replace(rep, location=redact(url))
        if not rep.published:
            return rep
        sent = publish_manifest(local, url, overwrite=options.overwrite, storage_options=storage_options)
        _rewrite_report(report_path, url, sent)
        drop_staging(stage)
        return rep


def _shard_bytes(url: str, store_options: dict) -> int:
    """The ``shard_bytes`` store option (popped: no backend takes it), default 128 MiB.

    Raises:
        UsageError: not a size.
    """
    value = store_options.pop("shard_bytes", DEFAULT_SHARD_BYTES)
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise UsageError(f"{redact(url)}: -O shard_bytes={value}: {exc} (e.g. 128M, 1G)") from exc


def _rewrite_report(path: Path, url: str, sent: PublishReport) -> None:
    """The build report, naming the bucket store and what was uploaded (not the staging)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s: build report not updated with the upload (%s)", path, exc)
        return
    doc.update(location=redact(url), published_to=sent.to_dict())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, path)


def convert_to_bucket(src: str, url: str, format: str, *, overwrite: bool, storage_options: Optional[dict],
                      run_convert: Callable, report_cls: type, **kwargs):
    """``convert`` to a bucket: the records go into one local shard (``format``: lmdb/hdf5, or
    manifest for the default LMDB), a manifest is written over it, then published."""
    from packer.stores import detect_format, open_store

    with publishing(url, "convert"):
        store_options = dict(kwargs.pop("store_options", None) or {})
        shard_bytes = _shard_bytes(url, store_options)
        fmt = shard_format_for(url, format, store_options)
        store_options.pop("shard_format", None)
        check_manifest_url(url, overwrite=overwrite, storage_options=storage_options)
        src_options = dict(kwargs.get("src_options") or {})
        with open_store(src, kwargs.get("src_format") or detect_format(src), **src_options) as r:
            job = {"convert": os.path.abspath(src), "index_checksum": r.metadata.index_checksum,
                   "count": r.metadata.count, "format": fmt, "shard_bytes": shard_bytes,
                   "options": {k: str(v) for k, v in store_options.items() if k != "uri"}}
        stage, local, marker = reuse_staged(url, job)
        if marker is not None:
            names = {f.name for f in dataclasses.fields(report_cls)}
            rep = report_cls(**{k: v for k, v in marker["report"].items() if k in names})
        else:
            shard = str(stage / (remote.basename(url) + ".shards") / shard_name(0, 1, shard_suffix(fmt)))
            os.makedirs(os.path.dirname(shard), exist_ok=True)
            rep = run_convert(src, shard, fmt, overwrite=True, store_options=store_options, **kwargs)
            _wrap_one_shard(local, shard, fmt)
            split_shards(local, shard_bytes)
            write_marker(stage, url, job=job, state="staged", report=rep.to_dict())
        publish_manifest(local, url, overwrite=overwrite, storage_options=storage_options)
        drop_staging(stage)
        return dataclasses.replace(rep, location=redact(url), format="manifest")


def merge_to_bucket(stores, url: str, *, overwrite: bool, storage_options: Optional[dict], run_merge: Callable,
                    copy: bool = False, format: Optional[str] = None, **kwargs):
    """``merge`` to a bucket: the merged manifest (or, with ``copy``, a manifest over one copied
    shard) is written in the staging folder, then published with every shard it lists."""
    with publishing(url, "merge") as stage:
        check_manifest_url(url, overwrite=overwrite, storage_options=storage_options)
        shutil.rmtree(stage, ignore_errors=True)       # a logical merge is O(shards): redone, not resumed
        stage.mkdir(parents=True)
        local = str(stage / remote.basename(url))
        if copy:
            store_options = dict(kwargs.pop("store_options", None) or {})
            fmt = shard_format_for(url, format, store_options)
            store_options.pop("shard_format", None)
            shard = str(stage / (remote.basename(url) + ".shards") / shard_name(0, 1, shard_suffix(fmt)))
            os.makedirs(os.path.dirname(shard))
            rep = run_merge(stores, shard, copy=True, format=fmt, store_options=store_options, **kwargs)
            _wrap_one_shard(local, shard, fmt)
        else:
            if format is not None and not get_store(format).composite:
                raise UsageError(f"--format {format} needs --copy (a logical merge writes a manifest)")
            rep = run_merge(stores, local, **kwargs)
        publish_manifest(local, url, overwrite=overwrite, storage_options=storage_options)
        drop_staging(stage)
        return dataclasses.replace(rep, location=redact(url))


def _wrap_one_shard(local: str, shard: str, fmt: str) -> None:
    """Write a manifest at ``local`` listing the one store ``shard``."""
    from packer.stores.manifest import shard_entry, write_manifest

    with get_store(fmt).open_reader(shard) as reader:
        entry = shard_entry(local, shard, fmt, reader)
        meta = dataclasses.replace(reader.metadata, format="manifest", index_checksum=manifest_checksum([entry]),
                                   build_options=dict(reader.metadata.build_options, shard_format=fmt))
    write_manifest(local, meta, [entry], overwrite=True, build_id=meta.build_id)


def append_to_bucket(url: str, images, labels, *, run_append: Callable, options, reader_options: dict,
                     storage_options: Optional[dict] = None, **kwargs):
    """``append`` to a bucket store: its manifest and shards are downloaded into the staging
    folder (checked; files already there from a killed run are kept), the new images are
    appended there as a new shard, then the new shard is uploaded and the manifest written last.
    The manifest must not change in the bucket meanwhile (its ETag is compared before the write).
    """
    from packer.jobs.reports import default_report_path

    with publishing(url, "append") as stage:
        shown = redact(url)
        if not url.endswith(MANIFEST_SUFFIX):
            raise UsageError(f"{shown}: append to a bucket works on a manifest (NAME{MANIFEST_SUFFIX})")
        if not remote.exists(url, storage_options):
            raise UsageError(f"{shown}: no such object (a store in a bucket is its manifest)")
        before = remote.stat(url, storage_options).version
        stage.mkdir(parents=True, exist_ok=True)
        local, problems = fetch_manifest(url, str(stage), storage_options=storage_options)
        if problems:
            raise StoreError(f"{shown}: cannot append: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                                          if len(problems) > 1 else ""))
        _drop_unlisted(local)
        if not options.report_path:
            options = options.replace(report_path=str(default_report_path(url)))
        rep = run_append(local, images, labels, reader_options=reader_options, options=options, **kwargs)
        rep = dataclasses.replace(rep, location=shown)
        if not rep.published:
            return rep
        if remote.stat(url, storage_options).version != before:
            raise StoreError(f"{shown}: the manifest changed in the bucket while appending (another writer?); "
                             f"nothing written: rerun to append to the new version")
        sent = publish_manifest(local, url, overwrite=True, storage_options=storage_options)
        _rewrite_report(Path(options.report_path), url, sent)
        drop_staging(stage)
        return rep


def _drop_unlisted(local: str) -> None:
    """Remove what a killed earlier append left under ``<name>.shards/`` of the staged copy and
    the downloaded manifest does not list (a new shard is rebuilt from its images)."""
    _, shards = read_manifest(local)
    listed = {os.path.normpath(resolve_location(local, s["location"])) for s in shards}
    folder = local + ".shards"
    for entry in os.listdir(folder) if os.path.isdir(folder) else ():
        path = os.path.normpath(os.path.join(folder, entry))
        if path not in listed and not any(p.startswith(path + ".") for p in listed):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def store_identity(location: str, format: Optional[str] = None, **reader_options) -> dict:
    """What identifies a source store for a staged job: path, count and index checksum."""
    from packer.stores import detect_format, open_store

    with open_store(location, format or detect_format(location), **reader_options) as r:
        return {"store": os.path.abspath(location), "count": r.metadata.count,
                "index_checksum": r.metadata.index_checksum}


def export_to_bucket(url: str, job: dict, run: Callable[[str], object], report_cls: type, *,
                     storage_options: Optional[dict] = None):
    """``export`` to a bucket folder: written into the staging folder, then every file uploaded,
    the dataset's index files (``index.json``, ``dataset_info.json``...) last. The folder must
    be new or empty, except for the files a killed earlier upload of the same export left."""
    url = folder_url(url)
    with publishing(url, "export") as stage:
        local = stage / "export"
        marker = read_marker(stage)
        if marker.get("job") == job and marker.get("state") == "staged" and local.is_dir():
            check_empty_folder(url, storage_options, ours=set(marker.get("files") or ()))
            rep = marker["report"]
        else:
            check_empty_folder(url, storage_options)
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True)
            rep = run(str(local)).to_dict()
            files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
            write_marker(stage, url, job=job, state="staged", files=files, report=rep)
        upload_folder(local, url, storage_options=storage_options)
        drop_staging(stage)
        names = {f.name for f in dataclasses.fields(report_cls)}
        return report_cls(**{k: v for k, v in _as_urls(rep, str(local), url).items() if k in names})


def _as_urls(value, local: str, url: str):
    """``value`` (a report's dict) with every path under ``local`` written as under ``url``."""
    if isinstance(value, str):
        return url + value[len(local):].lstrip("/\\").replace(os.sep, "/") if value.startswith(local) else value
    if isinstance(value, list):
        return [_as_urls(v, local, url) for v in value]
    if isinstance(value, dict):
        return {k: _as_urls(v, local, url) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# Reading a bucket store back (no cache: see packer.stores.manifest for the reader's own)
# ---------------------------------------------------------------------------------------------
def _read_remote_manifest(url: str, dest: str, storage_options: Optional[dict]) -> tuple:
    """Download the manifest at ``url`` to ``dest``; ``(metadata, shards, size)``."""
    info = remote.download(url, dest, storage_options=storage_options)
    meta, shards = read_manifest(dest)
    if manifest_checksum(shards) != meta.index_checksum:
        raise StoreError(f"{redact(url)}: manifest checksum mismatch: the shard list was edited or damaged")
    return meta, shards, info.size


def remote_info(url: str, *, storage_options: Optional[dict] = None):
    """``info`` of a bucket store from its manifest alone (no shard is read): count, labels,
    build options, and the size of the manifest plus the shard files it lists."""
    from packer.jobs.reports import InfoReport

    with tempfile.TemporaryDirectory(prefix="packer-info-") as tmp:
        meta, shards, size = _read_remote_manifest(url, os.path.join(tmp, "manifest.json"), storage_options)
    for j, s in enumerate(shards):
        if isinstance(s.get("files"), list):
            size += sum(int(f.get("size") or 0) for f in s["files"])
        else:   # a hand-made manifest: ask the bucket
            size += sum(o.size for o in _listed_objects(remote.resolve(url, s["location"]), s, storage_options))
    enc = {(s.get("encoding", "jpeg"), tuple(s.get("raw_shape") or ())) for s in shards}
    encoding, shape = enc.pop() if len(enc) == 1 else ("jpeg", ())
    return InfoReport(url, "manifest", meta.count, size, dataclasses.asdict(meta), encoding,
                      list(shape) or None, None)


def _listed_objects(shard_url: str, entry: dict, storage_options) -> list:
    """The objects of a shard without ``"files"``: the object itself, or those under its folder."""
    if get_store(entry["format"]).folder or not remote.exists(shard_url, storage_options):
        return [o for o in remote.list_objects(shard_url.rstrip("/") + "/", storage_options)
                if remote.basename(o.url) not in _NOT_UPLOADED]
    return [remote.stat(shard_url, storage_options)]


def fetch_manifest(url: str, folder: str, *, storage_options: Optional[dict] = None) -> tuple[str, list]:
    """Download the bucket store ``url`` (manifest and every shard file, once) into ``folder``,
    checking each file's size and xxh3_128 against the manifest's ``"files"`` (pinned to their
    ETags). Returns ``(local manifest path, problems)``: a file that is missing, changed or
    damaged is a problem naming it, and its shard is left out of the local copy's checks.

    Raises:
        RemoteError: the bucket cannot be reached (a transient failure after the retries).
    """
    local = os.path.join(folder, remote.basename(url))
    _, shards, _ = _read_remote_manifest(url, local, storage_options)
    problems = []
    for j, s in enumerate(shards):
        shard_url = remote.resolve(url, s["location"])
        dest = resolve_location(local, s["location"]) if "://" not in s["location"] else None
        if dest is None or not os.path.abspath(dest).startswith(os.path.abspath(folder) + os.sep):
            problems.append(f"shard {j} ({redact(shard_url)}): not beside the manifest; not checked")
            continue
        files = s.get("files") if isinstance(s.get("files"), list) else [
            {"name": o.url[len(shard_url):].lstrip("/"), "size": o.size, "etag": o.version}
            for o in _listed_objects(shard_url, s, storage_options)]
        found = []
        for f in files:
            found.extend(_fetch_file(j, shard_url, dest, f, storage_options))
        if not found and isinstance(s.get("extents"), dict):
            found.extend(_check_extents(j, url, dest, s, storage_options))
        problems.extend(found)
    return local, problems


def _check_extents(j: int, url: str, dest: str, entry: dict, storage_options) -> list[str]:
    """Shard ``j``'s extents object (ranged reads) against the fetched shard: the problems found."""
    import numpy as np

    e = entry["extents"]
    obj = remote.resolve(url, e["name"])
    try:
        raw = remote.read(obj, 0, int(e["size"]), version=e.get("etag") or "", storage_options=storage_options)
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        return [f"shard {j}: {exc}"]
    try:
        with get_store(entry["format"]).open_reader(dest) as reader:
            want = reader.record_extents()
        got = load_extents(raw, redact(obj))
    except (StoreError, OSError) as exc:
        return [f"shard {j}: {redact(obj)}: extents cannot be checked: {exc}"]
    if want is None or want[0] != e.get("file") or got.shape != want[1].shape or not np.array_equal(got, want[1]):
        return [f"shard {j}: {redact(obj)}: the extents do not match the shard (ranged reads would read "
                f"the wrong bytes); republish it"]
    return []


def _fetch_file(j: int, shard_url: str, dest: str, f: dict, storage_options) -> list[str]:
    """Download one file of shard ``j`` and check it; the problems found (``[]`` when whole)."""
    obj = remote.join(shard_url, f["name"]) if f.get("name") else shard_url
    path = os.path.join(dest, f["name"]) if f.get("name") else dest
    if f.get("xxh3_128") and os.path.isfile(path) and os.path.getsize(path) == f.get("size") \
            and xxh3_file(path) == f["xxh3_128"]:
        return []      # fetched by an earlier run (a staged append resumed)
    try:
        remote.download(obj, path, version=f.get("etag") or "", size=f.get("size"),
                        storage_options=storage_options)
    except remote.RemoteError as exc:
        if exc.transient:
            raise
        return [f"shard {j}: {exc}"]
    if f.get("xxh3_128") and xxh3_file(path) != f["xxh3_128"]:
        return [f"shard {j}: {redact(obj)}: xxh3_128 differs from the manifest's (damaged in the bucket)"]
    return []


@contextlib.contextmanager
def fetched(url: str, *, storage_options: Optional[dict] = None):
    """A local, checked copy of the bucket store ``url`` for the time of the ``with`` block
    (``packer report`` reads it); PackerError when a file is missing or damaged."""
    with tempfile.TemporaryDirectory(prefix="packer-fetch-") as tmp:
        local, problems = fetch_manifest(url, tmp, storage_options=storage_options)
        if problems:
            raise PackerError(f"{redact(url)}: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                                 if len(problems) > 1 else ""))
        yield local


__all__ = ["is_bucket", "staging_dir", "check_manifest_url", "publish_manifest", "upload_folder",
           "convert_to_bucket", "merge_to_bucket", "remote_info", "fetch_manifest",
           "fetched", "PublishReport", "xxh3_file", "shard_files", "STAGING_ENV"]
