"""Sharded builds on a dask.distributed cluster (``packer build --engine dask``).

The build is split into ``shards`` deterministic parts of the sorted input list
(:mod:`packer.core.sharding`); each part is one dask task that runs :func:`packer.build` with
``shard=(i, N)`` into its own store under ``<out>.shards/`` (or a ``mongodb://host/db/prefix``
given as ``shard_dir``: shard ``i`` is collection ``prefix-shard-0000i-of-0000N``). When every
shard is published, a manifest (:mod:`packer.stores.manifest`) is written atomically at
``out``: it reads as one store whose records, in order, are those of a single-machine build of
the same inputs (same keys, bytes, labels, class ids and record checksums).

Failures: a task that raises is retried (dask ``retries``); a task whose worker dies is
rescheduled by the scheduler (``distributed.scheduler.allowed-failures``, set to ``retries``
for a LocalCluster started here). Either way the new attempt resumes the shard's staging area,
and a shard already published by an earlier attempt (or an earlier run) is reused after
checking it is the same shard of the same inputs. Rerunning the whole command resumes too.

Every worker must see IMAGES, LABELS and the output folder at the same paths (a shared file
system), or write shards to MongoDB.

``dask[distributed]`` is an optional dependency (``pip install 'packer-vision[dask]'``), imported only
here and only when this engine is used.

Example:
    >>> from packer import build                                              # doctest: +SKIP
    >>> rep = build("imgs", None, "train.packer-manifest.json", "lmdb", engine="dask",
    ...             scheduler="tcp://10.0.0.1:8786", shards=64)
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Optional

from packer.core import remote
from packer.core.deps import optional_import
from packer.core.errors import PackerError, SourceError, UsageError
from packer.core.progress import progress_bar
from packer.jobs.inputs import gather_sources, pin_and_shard
from packer.jobs.merge import merge
from packer.jobs.options import BuildOptions
from packer.jobs.pack import pack
from packer.jobs.reports import BuildReport, default_report_path, write_build_report
from packer.stores import available_formats, get_store, open_store, output_format
from packer.stores.outputs import check_output

log = logging.getLogger(__name__)

#: The options of ``engine="dask"`` (:func:`build_distributed`'s keywords).
DASK_OPTIONS = ("scheduler", "shards", "n_workers", "retries", "shard_dir", "connect_timeout")
#: Test hook: ``DIR:INDEX`` makes the first attempt at shard INDEX SIGKILL its worker process
#: after its first committed batch (the marker file DIR/shard-INDEX.killed records the attempt).
_FAULT_SHARD_ENV = "PACKER_FAULT_KILL_SHARD_ONCE"


def _dask():
    return (optional_import("dask", "--engine dask", "dask"),
            optional_import("distributed", "--engine dask", "dask"))


def shard_locations(out: str, format: str, shards: int, shard_dir: Optional[str] = None) -> list:
    """Where each shard store of a distributed build goes."""
    from packer.core.sharding import shard_name
    from packer.stores.manifest import shard_suffix

    base = shard_dir or (str(out).rstrip("/") + ".shards")
    store = get_store(format)
    servers = tuple(s for name in available_formats() if get_store(name).server_backed
                    for s in get_store(name).schemes)
    if store.server_backed or base.startswith(servers):
        if store.server_backed and not base.startswith(store.schemes):
            raise UsageError(f"--format {format} with --engine dask needs shard_dir={store.schemes[0]}host/db/prefix")
        prefix, _, query = base.partition("?")
        return [prefix.rstrip("/") + "-" + shard_name(i, shards) + (f"?{query}" if query else "")
                for i in range(shards)]
    return [os.path.join(os.path.abspath(base), shard_name(i, shards, shard_suffix(format)))
            for i in range(shards)]


def _shard_report_path(out: str, loc: str) -> str:
    """Build report of a shard: next to it, or for a server shard in ``<out>.shards/``."""
    if "://" not in loc:
        return loc + ".report.json"
    name = loc.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    return os.path.join(str(out) + ".shards", name + ".report.json")


def _existing_shard(images, labels, loc, format, index, count, options: BuildOptions,
                    info: Optional[dict] = None) -> Optional[dict]:
    """Report of an already published shard store at ``loc`` if it is this very shard, else None
    (``info``: the shard's description when the client computed it)."""
    conn = options.connection(get_store(format))
    if not get_store(format).exists(loc, **conn):
        return None
    if info is None:
        sources = gather_sources(images, labels, options.replace(shard=None))
        _, info = pin_and_shard(sources, options.classes, (index, count))
    try:
        with open_store(loc, format, **conn) as r:
            meta = r.metadata
    except PackerError:
        return None
    opts = meta.build_options
    if opts.get("shard") != info or opts.get("quality") != options.quality or opts.get("exif") != options.exif:
        raise UsageError(f"{loc}: a store is in the way that is not shard {index}/{count} of these inputs "
                         f"and options (hint: --overwrite replaces it)")
    report_file = Path(options.report_path)
    rejected = []
    if report_file.is_file():
        rejected = json.loads(report_file.read_text()).get("rejected", [])
    return {"location": loc, "format": format, "published": True, "records": meta.count,
            "inputs": info["input_stop"] - info["input_start"], "rejected": rejected, "converted": [],
            "notes": [], "ignored": [], "resumed_from": info["input_stop"] - info["input_start"],
            "report_path": str(report_file), "label_schema": meta.label_schema, "reused": True}


#: dask.distributed's loggers (and the libraries it logs through) whose levels its config sets.
_DASK_LOGGERS = ("distributed", "distributed.client", "distributed.gc", "bokeh", "tornado", "tornado.application")


@contextlib.contextmanager
def _dask_log_level(level: int):
    """Hold dask's loggers in this process (client, and the scheduler and nannies of a
    LocalCluster) at packer's ``level`` while a build runs, never louder than dask's own
    setting; restored afterwards. ``-q`` then means errors only, and the default (warnings)
    hides dask's INFO lines (cluster start, every connection, the shutdown)."""
    saved = [(lg, lg.level) for lg in map(logging.getLogger, _DASK_LOGGERS)]
    for lg, _ in saved:
        lg.setLevel(max(level, lg.getEffectiveLevel()))
    try:
        yield
    finally:
        for lg, old in saved:
            lg.setLevel(old)


#: Loggers that log damaged or unreadable inputs (``extra={"packer_damaged_input": True}``).
_DAMAGED_INPUT_LOGGERS = ("packer.jobs.pack", "packer.sources.folders")


def _not_damaged_input(record: logging.LogRecord) -> bool:
    return not getattr(record, "packer_damaged_input", False)


@contextlib.contextmanager
def _worker_log_level(level: int):
    """In the worker running a shard: packer logs at the client's ``level``, and the damaged
    inputs are not logged there (the client prints them from the shard's report: once)."""
    packer_log = logging.getLogger("packer")
    emitters = [logging.getLogger(name) for name in _DAMAGED_INPUT_LOGGERS]
    old = packer_log.level
    packer_log.setLevel(level)
    for lg in emitters:   # a logger's filters see the records logged at it, not its children's
        lg.addFilter(_not_damaged_input)
    try:
        yield
    finally:
        for lg in emitters:
            lg.removeFilter(_not_damaged_input)
        packer_log.setLevel(old)


def _build_shard(images, labels, loc, format, index, count, options: BuildOptions,
                 log_level: int = logging.WARNING, part=None) -> dict:
    """One dask task: build (or resume, or reuse) shard ``index`` of ``count``, logging at the
    client's level. ``part``: ``(sources, shard_info)`` of this shard alone, listed by the client
    (IMAGES in a bucket: the task reads its own objects, never the whole listing)."""
    with _worker_log_level(log_level):
        return _build_one_shard(images, labels, loc, format, index, count, options, part)


def _build_one_shard(images, labels, loc, format, index, count, options: BuildOptions, part=None) -> dict:
    from packer.stores.base import FAULT_ENV

    t0 = time.perf_counter()
    if not options.overwrite:
        done = _existing_shard(images, labels, loc, format, index, count, options,
                               None if part is None else part[1])
        if done is not None:
            log.info("shard %d/%d: %s already published, reused", index, count, loc)
            return done
    fault = os.environ.get(_FAULT_SHARD_ENV)
    if fault:
        marker_dir, _, which = fault.rpartition(":")
        if int(which) == index:
            try:
                os.close(os.open(os.path.join(marker_dir, f"shard-{index}.killed"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                os.environ[FAULT_ENV] = "1"   # this attempt dies after its first commit
            except FileExistsError:
                pass
    try:
        rep = pack(images, labels, loc, output_format(loc, format), options.replace(shard=(index, count)),
               prepared=part)
    except (UsageError, SourceError) as exc:
        # The same on every attempt: report it instead of raising into dask's retries.
        return {"error": f"{type(exc).__name__}: {exc}", "problems": list(getattr(exc, "problems", []))}
    finally:
        os.environ.pop(FAULT_ENV, None)
    d = rep.to_dict()
    d["reused"] = False
    d["seconds"] = round(time.perf_counter() - t0, 3)
    d["worker_pid"] = os.getpid()
    return d


def _start_client(scheduler, n_workers, shards, retries, connect_timeout, log_level: int = logging.WARNING):
    dask, distributed = _dask()
    if scheduler:
        try:
            return distributed.Client(scheduler, timeout=connect_timeout), None
        except (OSError, TimeoutError) as exc:
            raise PackerError(f"cannot reach the dask scheduler at {scheduler}: {exc}") from exc
    import multiprocessing as mp
    if mp.parent_process() is not None:
        # We are a child re-running an unguarded script (spawn): starting a cluster here would
        # recurse. Say what to do instead of hanging.
        raise UsageError("engine='dask' without a scheduler starts a LocalCluster, whose worker processes "
                         "re-import your script: put the build call under `if __name__ == \"__main__\":`")
    n = max(1, int(n_workers or min(shards, os.cpu_count() or 1)))
    # Worker processes must be allowed children (a shard may use several checking processes),
    # and a worker that dies should be retried as often as a task that raises.
    # Measured here (README, Scaling out): a shard ran ~25% faster in a worker without dask's
    # statistical profiler (it samples the task thread every 10 ms) and without
    # MALLOC_TRIM_THRESHOLD_=64K (which hands every freed decode buffer back to the kernel, so
    # the next one page-faults again). Workers of a cluster you start yourself: set the same.
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    with dask.config.set({"distributed.worker.daemon": False,
                          "distributed.scheduler.allowed-failures": int(retries),
                          "distributed.worker.profile.enabled": False,
                          "distributed.nanny.pre-spawn-environ": environ}):
        try:
            # silence_logs: the level of the worker processes' own dask logging (WARNING is dask's default).
            cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                               dashboard_address=":0", host="127.0.0.1",
                                               silence_logs=max(log_level, logging.WARNING))
        except (RuntimeError, OSError, TimeoutError) as exc:
            raise PackerError(f"could not start a dask LocalCluster of {n} worker(s): {exc} (hint: worker "
                              f"processes re-import the calling script, so a script must run the build under "
                              f"`if __name__ == \"__main__\":`; or pass scheduler=ADDRESS)") from exc
        client = distributed.Client(cluster, timeout=connect_timeout)
    return client, cluster


def build_distributed(images, labels, out, format: str = "lmdb", *, shards: int, scheduler: Optional[str] = None,
                      n_workers: Optional[int] = None, retries: int = 3, shard_dir: Optional[str] = None,
                      connect_timeout: float = 60.0, options: Optional[BuildOptions] = None,
                      **settings) -> BuildReport:
    """Build ``shards`` shard stores on a dask cluster and publish a manifest at ``out``.

    Args:
        images, labels, format: as for :func:`packer.build` (``format`` is the shards' format).
        out: the manifest file to publish (e.g. ``train.packer-manifest.json``).
        shards: number of shards (tasks). More shards than workers balances load; each shard
            lists the whole input tree, so keep shards >= ~10k images.
        scheduler: ``tcp://host:8786`` of a running scheduler; None starts a LocalCluster of
            ``n_workers`` processes (default: min(shards, cores)) on this machine.
        retries: attempts after a failure, per shard (exception or dead worker).
        shard_dir: folder (default ``<out>.shards``) or ``mongodb://host/db/prefix`` for shards.
        options / settings: the build's :class:`~packer.jobs.options.BuildOptions` (``workers``
            is per shard task, default 1: parallelism comes from dask).

    Returns:
        BuildReport for the whole dataset (format ``"manifest"``); ``published`` only when
        every shard was published and the manifest written.

    Raises:
        DependencyError: dask.distributed is not installed. UsageError: bad options.
        PackerError: a shard failed after its retries (the message names it; rerun to resume).
    """
    options, _ = BuildOptions.split_kwargs(settings, options)
    shards = int(shards or 0)
    if shards < 1:
        raise UsageError(f"--shards must be >= 1 with --engine dask, got {shards}")
    if get_store(format).composite:
        raise UsageError("--engine dask writes a manifest over shard stores: --format names the shards' "
                         "format (lmdb, hdf5, mongo)")
    given = str(out)   # the report names the output as the user wrote it, as a local build does
    images, labels, out = _absolute(images), _absolute(labels), os.path.abspath(given)
    locs = _plan_shards(images, labels, out, format, shards, shard_dir, options)
    classes = options.classes
    task_options = options.replace(
        workers=1 if options.workers is None else options.workers, progress=False,
        classes=os.path.abspath(classes) if classes is not None and "://" not in str(classes) else classes)
    parts = _listed_parts(images, labels, task_options, shards) if remote.is_url(images) else None
    t0 = time.perf_counter()
    results = _run_shards(images, labels, out, format, locs, task_options, scheduler, n_workers, retries,
                          connect_timeout, options.progress, parts)
    seconds = time.perf_counter() - t0
    published = all(r["published"] for r in results)
    if published:
        merge(locs, out, overwrite=options.overwrite)
    report = _manifest_report(given, options, results, published, scheduler, seconds)
    log.info("%s: %d shards, %d records in %.1f s", out, shards, report.records, seconds)
    return report


def _absolute(path):
    """A local path made absolute (every worker must see it at the same path); a URL unchanged."""
    if path is None or remote.is_url(str(path)):
        return path
    return os.path.abspath(path)


def _listed_parts(images: str, labels, options: BuildOptions, shards: int) -> list:
    """List IMAGES in a bucket once, here on the client, parse the labels once, pin the class map,
    and cut the sorted list into ``shards`` parts: ``(sources, shard_info)`` each, holding only
    that shard's keys, labels and object locators (what its task is sent and reads)."""
    from packer.core.sharding import select_shard

    sources, _ = pin_and_shard(gather_sources(images, labels, options.replace(shard=None)), options.classes, None)
    parts = [select_shard(sources, (i, shards)) for i in range(shards)]
    log.info("%s: listed %d inputs once, %d shards of about %d", images, len(sources.keys), shards,
             len(sources.keys) // shards)
    return parts


def _plan_shards(images, labels, out: str, format: str, shards: int, shard_dir, options: BuildOptions) -> list:
    """Check the output and the shards' place; returns each shard's location."""
    read = [("images", images), ("labels", labels), ("masks", options.masks)]
    check_output(out, inputs=read, overwrite=options.overwrite, fmt="manifest")
    locs = shard_locations(out, format, shards, shard_dir)
    # Each shard's own build checks its store; the folder they go to must lie outside the inputs.
    check_output(os.path.dirname(locs[0]) if "://" not in locs[0] else locs[0], inputs=read, kind="place")
    os.makedirs(os.path.dirname(_shard_report_path(out, locs[0])), exist_ok=True)
    return locs


def _run_shards(images, labels, out, format, locs, options: BuildOptions, scheduler, n_workers, retries,
                connect_timeout, progress: bool, parts=None) -> list:
    """Run one dask task per shard and collect their reports (dicts), in shard order (``parts``:
    each shard's own listed part, see :func:`_listed_parts`).

    Raises:
        SourceError: shards refused their inputs (the same on every attempt).
        PackerError: shards failed after their retries.
    """
    shards = len(locs)
    level = logging.getLogger("packer").getEffectiveLevel()   # the CLI's -q / -v, or the caller's
    _, distributed = _dask()   # importing distributed sets its loggers to INFO: hold them at packer's level
    with _dask_log_level(level):
        client, cluster = _start_client(scheduler, n_workers, shards, retries, connect_timeout, level)
        try:
            log.info("dask dashboard: %s", client.dashboard_link)
            if progress:
                log.warning("packer: %d shards on %s (dashboard: %s)", shards, scheduler or "a LocalCluster",
                            client.dashboard_link)
            token = uuid.uuid4().hex[:8]
            futures = [client.submit(_build_shard, images, labels, loc, format, i, shards,
                                     options.replace(report_path=_shard_report_path(out, loc)), level,
                                     None if parts is None else parts[i],
                                     key=f"packer-shard-{i:05d}-of-{shards:05d}-{token}", pure=False,
                                     retries=int(retries))
                       for i, loc in enumerate(locs)]
            results, failures, usage = _gather(distributed, futures, locs, progress)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    if usage:
        i, first = min(usage, key=lambda u: u[0])
        problems = [f"shard {j}: {r['error']}" for j, r in usage] + list(first["problems"])
        raise SourceError(f"{len(usage)} of {shards} shard(s) refused their inputs, e.g. shard {i}: "
                          f"{first['error']}", problems)
    if failures:
        raise PackerError(f"{len(failures)} of {shards} shard(s) failed after {retries} retries (rerun to "
                          f"resume them; finished shards are reused): " + "; ".join(failures))
    return results


def _gather(distributed, futures, locs, progress: bool) -> tuple[list, list, list]:
    """``(results, failures, refusals)`` of the shard tasks as they complete."""
    shards = len(futures)
    index_of = {f.key: i for i, f in enumerate(futures)}
    results, failures, usage = [None] * shards, [], []
    bar = progress_bar(shards, 0, progress, "shards")
    try:
        for fut in distributed.as_completed(futures):
            i = index_of[fut.key]
            try:
                results[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - any task failure is reported per shard
                failures.append(f"shard {i}/{shards} ({locs[i]}): {type(exc).__name__}: {exc}")
                continue
            if "error" in results[i]:
                usage.append((i, results[i]))
            bar.update(1)
    finally:
        bar.close()
    return results, failures, usage


def _manifest_report(out: str, options: BuildOptions, results: list, published: bool, scheduler,
                     seconds: float) -> BuildReport:
    """The whole dataset's report, from the shards' (also written next to ``out``)."""
    report_path = Path(options.report_path) if options.report_path else default_report_path(out)
    report = BuildReport(location=out, format="manifest", published=published,
                         records=sum(r["records"] for r in results),
                         inputs=sum(r["inputs"] for r in results),
                         rejected=[x for r in results for x in r["rejected"]],
                         converted=[x for r in results for x in r["converted"]],
                         notes=[x for r in results for x in r["notes"]], ignored=list(results[0]["ignored"]),
                         ignored_reasons=dict(results[0].get("ignored_reasons") or {}),
                         resumed_from=sum(r["resumed_from"] for r in results), report_path=str(report_path),
                         label_schema=results[0]["label_schema"])
    shard_fields = ("location", "published", "records", "inputs", "resumed_from", "reused", "seconds", "worker_pid")
    write_build_report(report_path, report, {"engine": "dask", "scheduler": scheduler or "LocalCluster",
                                             "seconds": round(seconds, 3),
                                             "shards": [{k: r.get(k) for k in shard_fields} for r in results]})
    return report
