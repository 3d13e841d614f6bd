"""Object storage: reading and writing bytes in a bucket (``s3://``, ``gs://``, ``az://``,
``https://``, ...) through fsspec, the one small interface every layer above uses.

Sources, interchange scans, stores, jobs and readers never talk to a cloud client themselves:
they hand a URL to the functions here (``list_objects``, ``stat``, ``read``, ``download``,
``upload``), which reach the bucket through the fsspec implementation of its scheme (``s3fs``
for ``s3://``, ``gcsfs``, ``adlfs``, ``fsspec``'s own ``http``/``memory``), with the cloud's own
environment and configuration for credentials and endpoints (for S3: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
``~/.aws/config``), or fsspec ``storage_options`` from Python.

What this layer adds to fsspec:

* **a time budget**: every operation is retried with exponential backoff (throttling such as S3's
  503 SlowDown, a reset connection, a body cut short, a server restarting) until
  :data:`RETRY_BUDGET_S` seconds have passed, each attempt bounded too, then one
  :class:`RemoteError` that names the object; a missing object or refused credentials fail at once;
* **pinned versions**: :func:`stat` gives an :class:`ObjectInfo` whose ``version`` (the ETag, a
  GCS generation...) a later :func:`read` or :func:`download` can require: an object changed
  since is an error naming it, never a mix of two versions;
* **checked uploads**: :func:`upload` compares the object's size, and on S3 its ETag with the one
  computed from the local file (MD5, or the multipart MD5 of MD5s), and skips a file already
  there unchanged, so a killed upload resumes without sending finished files again;
* **streamed listing**: :func:`list_objects` yields objects page by page in key order, so listing
  a million objects holds one page in memory, not a million entries;
* **no credentials in words**: URLs are masked (:func:`packer.core.uri.redact`) in every message,
  and ``storage_options`` never appear in one.

Filesystems are made lazily in the process that uses them (fsspec keys its instance cache by
process id), so a store or dataset can be pickled to DataLoader workers and Dask workers.

Example:
    >>> from packer.core import remote
    >>> remote.is_url("s3://bucket/train/"), remote.is_url("train.lmdb")
    (True, False)
    >>> remote.join("s3://bucket/train", "shard-00000.h5")
    's3://bucket/train/shard-00000.h5'
"""
from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from packer.core.errors import DependencyError, PackerError, UsageError
from packer.core.uri import MASK, redact

log = logging.getLogger(__name__)

__all__ = ["RemoteError", "ObjectInfo", "is_url", "join", "parent", "basename", "stat", "exists",
           "list_objects", "read", "download", "upload", "put_bytes", "delete", "filesystem",
           "RemoteFile", "open_input", "input_info", "file_size", "READ_AHEAD", "RETRY_BUDGET_S"]

#: Seconds one operation may spend in retries before it fails (``PACKER_REMOTE_RETRY_BUDGET``).
RETRY_BUDGET_S = float(os.environ.get("PACKER_REMOTE_RETRY_BUDGET", "60"))
#: Seconds one attempt may take before it counts as failed (``PACKER_REMOTE_ATTEMPT_TIMEOUT``).
ATTEMPT_TIMEOUT_S = float(os.environ.get("PACKER_REMOTE_ATTEMPT_TIMEOUT", "120"))
_NOT_REMOTE = {"mongodb", "mongodb+srv", "file", "local"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# What each scheme needs installed, for the hint when it is missing.
_S3, _GCS, _AZ = ("pip install 'packer-vision[s3]'", "pip install 'packer-vision[gcs]'",
                  "pip install 'packer-vision[azure]'")
_EXTRA = {"s3": ("s3fs", _S3), "s3a": ("s3fs", _S3), "gs": ("gcsfs", _GCS), "gcs": ("gcsfs", _GCS),
          "az": ("adlfs", _AZ), "abfs": ("adlfs", _AZ), "abfss": ("adlfs", _AZ),
          "http": ("aiohttp", _S3), "https": ("aiohttp", _S3)}
#: Bytes one request of :class:`RemoteFile` reads ahead (``PACKER_REMOTE_READ_AHEAD``): a scan
#: streaming a shard costs ``ceil(size / READ_AHEAD)`` GETs.
READ_AHEAD = int(os.environ.get("PACKER_REMOTE_READ_AHEAD", str(8 * 2**20)))
# S3 multipart: the part size the upload uses (s3fs's default), so the ETag can be computed here.
_PART_SIZE = 50 * 2**20


class RemoteError(PackerError):
    """An object in a bucket cannot be read or written; names the object (credentials masked).

    ``url`` is the object, ``reason`` what went wrong, ``transient`` whether retrying might have
    helped (throttled, unreachable, cut short) as opposed to missing or forbidden.
    """

    def __init__(self, url: str, reason: str | None = None, *, transient: bool = False):
        super().__init__(f"{redact(url)}: {reason}" if reason is not None else url)
        self.url = redact(url)
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its URL, its size in bytes, and its version (ETag, generation or mtime)."""

    url: str
    size: int
    version: str = ""


def is_url(path) -> bool:
    """True when ``path`` names an object-storage location (``s3://``, ``gs://``, ``https://``...),
    False for a local path, a ``file://`` URL and a MongoDB connection string."""
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return bool(m) and m.group(1).lower() not in _NOT_REMOTE


def scheme(url: str) -> str:
    """The lower-case scheme of ``url`` (``"s3"``)."""
    m = _SCHEME.match(url)
    return m.group(1).lower() if m else ""


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, one ``/`` between each (``join("s3://b/x/", "y")``)."""
    out = url
    for p in parts:
        p = str(p).replace(os.sep, "/")
        out = out.rstrip("/") + "/" + p.lstrip("/") if p else out
    return out


def parent(url: str) -> str:
    """The URL's folder, with a trailing ``/`` (``s3://b/x/y.json`` -> ``s3://b/x/``)."""
    head, _, _ = url.rstrip("/").rpartition("/")
    return head + "/"


def basename(url: str) -> str:
    """The last part of the URL's path."""
    return url.rstrip("/").rpartition("/")[2]


def resolve(base_url: str, location: str) -> str:
    """``location`` as a URL: itself when it is one, else relative to ``base_url``'s folder;
    a relative location that climbs out of it (``..``) is refused."""
    if is_url(location):
        return location
    rel = location.replace("\\", "/")
    if rel.startswith("/") or any(p == ".." for p in rel.split("/")):
        raise UsageError(f"{redact(base_url)}: location {location!r} leaves the dataset's folder")
    return join(parent(base_url), rel)


# ---------------------------------------------------------------------------------------------
# Filesystems
# ---------------------------------------------------------------------------------------------
# Schemes whose URL's first part is a bucket name, which cannot hold "@" (Azure's
# abfs://container@account... can, and is left to fsspec), and where their credentials come from.
_AWS_CREDENTIALS = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws"
_GCP_CREDENTIALS = "GOOGLE_APPLICATION_CREDENTIALS or gcloud's default credentials"
_CREDENTIALS = {"s3": _AWS_CREDENTIALS, "s3a": _AWS_CREDENTIALS, "gs": _GCP_CREDENTIALS, "gcs": _GCP_CREDENTIALS}


def filesystem(url: str, storage_options: Optional[dict] = None):
    """``(fs, path)``: the fsspec filesystem for ``url`` and the path within it.

    S3 gets bounded connect/read timeouts unless ``storage_options`` says otherwise, so a dead
    server is an error, never a hang.

    Raises:
        DependencyError: the scheme's fsspec implementation is not installed (names the extra).
        UsageError: the scheme is unknown to fsspec, or a bucket URL holds credentials
            (``s3://KEY:SECRET@bucket/...``).
    """
    try:
        import fsspec
    except ImportError as exc:   # pragma: no cover - fsspec comes with the [s3] extra
        raise DependencyError("object storage needs fsspec: pip install 'packer-vision[s3]'") from exc
    opts = dict(storage_options or {})
    sch = scheme(url)
    authority, _, path = url.partition("://")[2].partition("/")
    if sch in _CREDENTIALS and "@" in authority:
        # s3://KEY:SECRET@bucket/...: a bucket name cannot hold "@", and the client would read the
        # credentials as part of it (a parameter-validation error quoting a regex). All that is
        # before the "@" is masked, a lone token too (redact() keeps a user name without password).
        shown = f"{url.split('://', 1)[0]}://{MASK}@{authority.rpartition('@')[2]}/{path}"
        raise UsageError(f"{redact(shown)}: credentials in a {sch}:// URL are not read; give them the usual way "
                         f"({_CREDENTIALS[sch]}; from Python: storage_options)")
    if sch in ("s3", "s3a"):
        cfg = dict(opts.get("config_kwargs") or {})
        cfg.setdefault("connect_timeout", 10)
        cfg.setdefault("read_timeout", 60)
        cfg.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
        opts["config_kwargs"] = cfg
    try:
        return fsspec.core.url_to_fs(url, **opts)
    except ImportError as exc:
        module, hint = _EXTRA.get(sch, (sch, _S3))
        raise DependencyError(f"{redact(url)}: reading {sch}:// needs {module}: {hint} ({exc})") from exc
    except ValueError as exc:
        if "Protocol not known" in str(exc) or "not known" in str(exc):
            raise UsageError(f"{redact(url)}: unknown storage scheme {sch!r}") from exc
        raise


def _fs_call(fs, name: str, *args, timeout: float, **kwargs):
    """``fs.name(*args, **kwargs)``, bounded by ``timeout`` seconds on async filesystems."""
    if getattr(fs, "async_impl", False) and hasattr(fs, "_" + name):
        from fsspec.asyn import sync
        return sync(fs.loop, getattr(fs, "_" + name), *args, timeout=timeout, **kwargs)
    return getattr(fs, name)(*args, **kwargs)


def _is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` might help: throttling, timeouts, resets, short reads, 5xx."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    name = type(exc).__name__
    if not isinstance(exc, (OSError, TimeoutError, ConnectionError)) and not any(
            w in name for w in ("Timeout", "Connection", "IncompleteRead", "ClientError", "ClientPayload",
                                "ResponseParser", "ServerDisconnected", "HTTPClientError", "Endpoint")):
        return False     # a programming error (TypeError...) is no reason to retry
    text = f"{name} {exc}".lower()
    if any(w in text for w in ("accessdenied", "access denied", "invalidaccesskeyid",
                               "signaturedoesnotmatch", "forbidden", "nosuchbucket",
                               "preconditionfailed", "precondition failed", "pre-condition")):
        return False
    return True


def _explain(exc: BaseException) -> str:
    """Short words for ``exc`` (no traceback, no credentials)."""
    if isinstance(exc, FileNotFoundError):
        return "no such object"
    if isinstance(exc, PermissionError):
        return f"access denied ({exc})"
    name = type(exc).__name__
    text = str(exc).strip() or name
    if "timeout" in name.lower() and "timed out" not in text.lower():
        text = f"{name}: timed out"
    return text if len(text) < 400 else text[:400] + "..."


def _retrying(url: str, what: str, fn: Callable, *, budget: Optional[float] = None):
    """Run ``fn(timeout)`` until it succeeds, retrying transient failures with exponential backoff
    and jitter until ``budget`` seconds (default :data:`RETRY_BUDGET_S`) have passed.

    Raises:
        RemoteError: at once for a permanent failure, after the budget for a transient one.
    """
    budget = RETRY_BUDGET_S if budget is None else budget
    deadline = time.monotonic() + budget
    delay, attempt = 0.2, 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        try:
            return fn(max(1.0, min(ATTEMPT_TIMEOUT_S, left)))
        except RemoteError:
            raise
        except (PackerError, KeyboardInterrupt):
            raise
        except Exception as exc:   # noqa: BLE001 - every client error becomes one RemoteError
            transient = _is_transient(exc)
            left = deadline - time.monotonic()
            if not transient or left <= delay:
                tries = f" after {attempt} attempts in {budget - max(left, 0):.0f} s" if attempt > 1 else ""
                raise RemoteError(url, f"{what} failed{tries}: {_explain(exc)}",
                                  transient=transient) from exc
            log.info("%s: %s failed (%s), retrying in %.1f s", redact(url), what, _explain(exc), delay)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 10.0)


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------
def _version_of(info: dict) -> str:
    for k in ("ETag", "etag", "generation", "VersionId", "version_id", "md5Hash", "mtime",
              "LastModified", "last_modified", "created"):
        v = info.get(k)
        if v not in (None, ""):
            return str(v).strip('"')
    return ""


def stat(url: str, storage_options: Optional[dict] = None) -> ObjectInfo:
    """The object's size and version.

    Raises:
        RemoteError: no such object (``transient`` False), or the bucket cannot be reached.
    """
    fs, path = filesystem(url, storage_options)

    def go(timeout):
        fs.invalidate_cache(path)
        info = _fs_call(fs, "info", path, timeout=timeout)
        if info.get("type") == "directory":
            raise IsADirectoryError(path)
        return ObjectInfo(url, int(info.get("size") or 0), _version_of(info))
    return _retrying(url, "stat", go)


def exists(url: str, storage_options: Optional[dict] = None) -> bool:
    """Whether ``url`` names an existing object (a folder counts as not existing)."""
    try:
        stat(url, storage_options)
        return True
    except RemoteError as exc:
        if exc.transient:
            raise
        return False


def list_objects(url: str, storage_options: Optional[dict] = None, *,
                 page_size: int = 1000) -> Iterator[ObjectInfo]:
    """Every object under the folder ``url`` (recursively), in key order, one page at a time.

    On S3 the listing is streamed from the server's pages (``list_objects_v2``), so memory stays
    flat in the number of objects; other filesystems list through ``fs.find``.

    Raises:
        RemoteError: the bucket cannot be listed (names the folder).
    """
    fs, path = filesystem(url, storage_options)
    base = url.rstrip("/") + "/"
    prefix_path = path.rstrip("/") + "/"
    if scheme(url) in ("s3", "s3a"):
        yield from _list_s3(fs, url, base, prefix_path, page_size)
        return
    found = _retrying(url, "list", lambda t: _fs_call(fs, "find", prefix_path, detail=True, timeout=t))
    for p in sorted(found):
        info = found[p]
        if info.get("type") == "directory":
            continue
        rel = p[len(prefix_path):] if p.startswith(prefix_path) else p
        yield ObjectInfo(base + rel, int(info.get("size") or 0), _version_of(info))


def _list_s3(fs, url, base, prefix_path, page_size) -> Iterator[ObjectInfo]:
    """S3 listing by pages: ``list_objects_v2`` with a continuation token, one page at a time."""
    from fsspec.asyn import sync

    bucket, _, prefix = prefix_path.partition("/")
    token = None
    while True:
        kw = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
        if token:
            kw["ContinuationToken"] = token

        def page(timeout, kw=kw):
            return sync(fs.loop, fs._call_s3, "list_objects_v2", timeout=timeout, **kw)
        resp = _retrying(url, "list", page)
        for obj in resp.get("Contents", []) or []:
            key = obj["Key"]
            if key.endswith("/"):
                continue
            # base + the rest as listed: join() would fold "a//b" and "/b" keys into other objects' names
            yield ObjectInfo(base + key[len(prefix):], int(obj.get("Size", 0)),
                             str(obj.get("ETag", "")).strip('"'))
        if not resp.get("IsTruncated"):
            return
        token = resp.get("NextContinuationToken")


def read(url: str, start: int = 0, end: Optional[int] = None, *, version: str = "",
         storage_options: Optional[dict] = None) -> bytes:
    """Bytes ``[start, end)`` of the object (``end`` None: to its end).

    Args:
        version: when given, the object must still be this version (see :func:`stat`); else the
            read fails with a :class:`RemoteError` saying it changed.

    Raises:
        RemoteError: missing, changed, unreachable, or fewer bytes than asked for.
    """
    fs, path = filesystem(url, storage_options)
    want = None if end is None else end - start

    def go(timeout):
        if scheme(url) in ("s3", "s3a"):     # one GET (s3fs would add a HEAD for a whole object)
            data = _s3_get(fs, path, start, end, version, timeout)
        else:
            data = _fs_call(fs, "cat_file", path, start=start or None, end=end, timeout=timeout)
            if version:
                now = stat(url, storage_options).version
                if now != version:
                    raise RemoteError(url, f"changed since it was opened (version {version}, now {now})")
        if want is not None and len(data) != want:
            raise ConnectionError(f"cut short: {want} bytes expected at offset {start}, {len(data)} arrived")
        return data
    return _retrying(url, "read", go)


def _s3_get(fs, path: str, start: int, end: Optional[int], version: str, timeout: float, sink=None) -> bytes:
    """One S3 GET of a byte range; when ``version`` is given the object must still have that ETag
    (``If-Match``). With ``sink`` (a file), the body is written to it as it arrives, 1 MiB at a
    time, each read bounded by ``timeout`` (not the whole body), and ``b""`` is returned."""
    from fsspec.asyn import sync

    bucket, _, key = path.partition("/")
    kw = {"Bucket": bucket, "Key": key}
    if version:
        kw["IfMatch"] = f'"{version}"'
    if end is not None and end <= start:
        return b""
    if start or end is not None:
        kw["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

    async def get():
        try:
            resp = await asyncio.wait_for(fs._call_s3("get_object", **kw), timeout)
        except OSError as exc:
            if re.search(r"pre-?condition|\b412\b", str(exc), re.I):
                raise RemoteError(f"s3://{path}", f"changed since it was opened (version {version})") from exc
            raise
        body = resp["Body"]
        try:
            if sink is None:
                return await body.read()
            while chunk := await asyncio.wait_for(body.read(1 << 20), timeout):
                sink.write(chunk)
            return b""
        finally:
            body.close()
    return sync(fs.loop, get, timeout=None if sink is not None else timeout)


def _s3_stream(fs, path: str, url: str, fh, info: "ObjectInfo", timeout: float) -> None:
    """GET the rest of the object, from ``fh.tell()`` on, into ``fh`` as it arrives (pinned to
    ``info.version``). A transient failure after some bytes arrived returns quietly: the caller
    asks again from there with a fresh retry budget, so the budget bounds time without progress,
    never a long transfer. One before any byte arrived raises, for :func:`_retrying`."""
    start = fh.tell()
    try:
        _s3_get(fs, path, start, None, info.version, timeout, sink=fh)
    except Exception as exc:   # noqa: BLE001 - classified as _retrying does
        if fh.tell() > start and not isinstance(exc, RemoteError) and _is_transient(exc):
            log.info("%s: transfer broke at byte %d (%s), resuming there", redact(url), fh.tell(), _explain(exc))
            return
        raise
    if fh.tell() > info.size:
        raise RemoteError(url, f"holds more than the {info.size} bytes it had when opened")
    if fh.tell() < info.size:
        raise ConnectionError(f"cut short: {info.size} bytes expected, {fh.tell()} arrived")


def download(url: str, dest: str, *, version: str = "", size: Optional[int] = None,
             storage_options: Optional[dict] = None, chunk: int = 16 * 2**20) -> ObjectInfo:
    """Copy the object to the local file ``dest`` (written as ``dest + ".part"`` then renamed).

    From S3: one GET streamed to the file, pinned to ``version`` (``If-Match``), so a changed
    object is an error; a transfer that breaks resumes from the last byte received (a ranged
    GET), so a reset costs neither the bytes already here nor a request per slice. Elsewhere:
    ``chunk``-byte ranged reads, each retried alone.

    Raises:
        RemoteError: as :func:`read`, or the object's size differs from ``size``.
        OSError: ``dest`` cannot be written.
    """
    s3 = scheme(url) in ("s3", "s3a")
    if version and size is not None and s3:
        # known version and size: no HEAD first (one round trip less per file); every GET is
        # pinned by If-Match, so a changed object still fails, naming it
        info = ObjectInfo(url, int(size), version)
    else:
        info = stat(url, storage_options)
        if version and info.version != version:
            raise RemoteError(url, f"changed since it was opened (version {version}, now {info.version})")
        if size is not None and info.size != size:
            raise RemoteError(url, f"holds {info.size} bytes, {size} expected")
    part = dest + ".part"
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    with open(part, "wb") as fh:
        if s3:
            fs, path = filesystem(url, storage_options)
            while fh.tell() < info.size:
                _retrying(url, "download", lambda timeout: _s3_stream(fs, path, url, fh, info, timeout))
        else:
            for off in range(0, info.size, chunk):
                fh.write(read(url, off, min(off + chunk, info.size), version=info.version,
                              storage_options=storage_options))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, dest)
    return info


def s3_etag(local: str, part_size: Optional[int] = None) -> str:
    """The ETag S3 gives ``local`` once uploaded by :func:`upload`: the MD5 of the file, or for a
    multipart upload the MD5 of the parts' MD5s followed by ``-<parts>``."""
    part_size = part_size or _PART_SIZE
    size = os.path.getsize(local)
    with open(local, "rb") as fh:
        if size < 2 * part_size:
            return hashlib.md5(fh.read(), usedforsecurity=False).hexdigest()
        digests = []
        while True:
            block = fh.read(part_size)
            if not block:
                break
            digests.append(hashlib.md5(block, usedforsecurity=False).digest())
    return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(digests)}"


def _same(url: str, local: str, info: ObjectInfo) -> bool:
    """Whether the object ``info`` holds exactly the local file (size, and the ETag on S3)."""
    if info.size != os.path.getsize(local):
        return False
    if scheme(url) in ("s3", "s3a") and info.version:
        return info.version == s3_etag(local)
    return True


def upload(local: str, url: str, *, storage_options: Optional[dict] = None,
           skip_same: bool = True) -> ObjectInfo:
    """Put the local file at ``url`` (multipart on S3 for large files) and check it arrived whole.

    Args:
        skip_same: an object already at ``url`` with the same size (and S3 ETag) is kept, not
            sent again: what makes a killed upload resume where it stopped.

    Returns:
        The uploaded object's :class:`ObjectInfo` (its version for readers to pin).

    Raises:
        RemoteError: the upload failed, or the object then differs from the file (size/ETag).
    """
    fs, path = filesystem(url, storage_options)
    if skip_same:
        try:
            info = stat(url, storage_options)
            if _same(url, local, info):
                log.info("%s: already uploaded, kept", redact(url))
                return info
        except RemoteError as exc:
            if exc.transient:
                raise

    def go(timeout):
        kw = {"chunksize": _PART_SIZE} if scheme(url) in ("s3", "s3a") else {}
        _fs_call(fs, "put_file", local, path, timeout=max(timeout, 600.0), **kw)
    _retrying(url, "upload", go)
    info = stat(url, storage_options)
    if not _same(url, local, info):
        raise RemoteError(url, f"upload check failed: {info.size} bytes (version {info.version}) "
                               f"arrived for {os.path.getsize(local)} sent")
    return info


def put_bytes(data: bytes, url: str, *, storage_options: Optional[dict] = None) -> ObjectInfo:
    """Write ``data`` as the object ``url`` in one request (small objects: a manifest, a report).
    An object store replaces an object atomically: readers see the old bytes or the new ones."""
    fs, path = filesystem(url, storage_options)
    _retrying(url, "write", lambda t: _fs_call(fs, "pipe_file", path, data, timeout=t))
    info = stat(url, storage_options)
    if info.size != len(data):
        raise RemoteError(url, f"write check failed: {info.size} bytes arrived for {len(data)} sent")
    return info


def delete(url: str, storage_options: Optional[dict] = None) -> None:
    """Remove the object (a missing one is not an error)."""
    fs, path = filesystem(url, storage_options)

    def go(timeout):
        try:
            _fs_call(fs, "rm_file", path, timeout=timeout)
        except FileNotFoundError:
            pass
    _retrying(url, "delete", go)


# ---------------------------------------------------------------------------------------------
# Opening an input: a local file or an object, as one read-only seekable file
# ---------------------------------------------------------------------------------------------
class RemoteFile(io.RawIOBase):
    """An object opened for reading like a local file: seekable, read-only, pinned to the version
    it had at open (a later read of a replaced object fails naming it), with a read-ahead buffer:
    a read past the buffer fetches ``max(chunk, wanted)`` bytes in one ranged GET, so reading
    the object through in small pieces (``tarfile``, ``gzip``, TFRecord framing) costs
    ``ceil(size / chunk)`` requests, and a seek inside the buffer costs none.

    Attributes:
        name: the URL (what messages and locators name); ``size``, ``version``: as at open;
        requests, bytes_read: what reading it cost so far.
    """

    def __init__(self, info: ObjectInfo, storage_options: Optional[dict] = None, chunk: int = 0):
        super().__init__()
        self.name, self.size, self.version = info.url, info.size, info.version
        self.storage_options = storage_options
        self.chunk = max(1, chunk or READ_AHEAD)
        self.requests = self.bytes_read = 0
        self._pos, self._buf, self._buf_at = 0, b"", 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{redact(self.name)}: negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def _fetch(self, start: int, n: int) -> bytes:
        end = min(self.size, start + max(n, self.chunk))
        data = read(self.name, start, end, version=self.version, storage_options=self.storage_options)
        self.requests += 1
        self.bytes_read += len(data)
        return data

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError(f"{redact(self.name)}: read from a closed object")
        left = self.size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        if n <= 0:
            return b""
        at = self._pos - self._buf_at
        if not (0 <= at and at + n <= len(self._buf)):
            head = self._buf[at:] if 0 <= at < len(self._buf) else b""   # keep what the buffer holds
            self._buf_at = self._pos + len(head)
            self._buf = self._fetch(self._buf_at, n - len(head))
            data = head + self._buf[:n - len(head)]
        else:
            data = self._buf[at:at + n]
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        self._buf = b""
        super().close()


def open_input(path, storage_options: Optional[dict] = None, *, info: Optional[ObjectInfo] = None,
               chunk: int = 0):
    """An input file opened for reading: a local path as ``open(path, "rb")``, a URL as a
    :class:`RemoteFile` pinned to its version now (or to ``info``, from a listing: no request).

    Raises:
        OSError: a local file cannot be opened; RemoteError: the object is missing or unreachable.
    """
    if not is_url(path):
        return open(path, "rb")
    return RemoteFile(info if info is not None else stat(path, storage_options), storage_options, chunk)


def file_size(fh) -> int:
    """The size in bytes of a file :func:`open_input` opened (local or remote)."""
    return fh.size if isinstance(fh, RemoteFile) else os.fstat(fh.fileno()).st_size


def input_info(path, storage_options: Optional[dict] = None) -> ObjectInfo:
    """What identifies an input file for resuming a build: ``(path, size, version)``, the version
    being the ETag of an object, the modification time in ns of a local file.

    Raises:
        OSError: a local file cannot be stat'ed; RemoteError: as :func:`stat`.
    """
    if is_url(path):
        return stat(path, storage_options)
    st = os.stat(path)
    return ObjectInfo(os.fspath(path), st.st_size, str(st.st_mtime_ns))
