"""The build on this machine: ``plan -> check inputs -> stage records -> seal -> publish -> report``.

:func:`packer.build` calls :func:`pack` (or the distributed engine, whose shards each run it).
Every input is read and checked on worker processes (:func:`packer.jobs.steps.check_images`),
in input order; each good image becomes a record bound to its label and is staged through a
:class:`packer.stores.staging.Stage` (checked as verify will read it, committed in batches,
resumable after a kill); damaged inputs are listed. Under ``on_corrupt="fail"`` or ``"stop"``
with damage found, nothing is published and the staging area stays for a rerun.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packer.core.diskspace import build_bytes, more_needed, require_room
from packer.core.errors import DiskFullError, WorkerError
from packer.core.progress import progress_bar
from packer.core.records import StoreMetadata
from packer.core.remote import RemoteError
from packer.core.uri import redact
from packer.core.workers import refuse_in_bootstrap
from packer.jobs.inputs import gather_sources, pin_and_shard
from packer.jobs.options import BuildOptions
from packer.jobs.reports import BuildReport, default_report_path, write_build_report
from packer.jobs.steps import (
    FETCH_BATCH,
    Unreachable,
    add_stats,
    check_images,
    check_one,
    fingerprint,
    is_remote_input,
    with_label,
)
from packer.sources.folders import Sources
from packer.stores import get_store
from packer.stores.base import partial_location
from packer.stores.outputs import check_output
from packer.stores.staging import Stage
from packer.version import __version__

log = logging.getLogger(__name__)

#: A build from a bucket stops (kept for a resume) when this many inputs in a row could not be
#: read because the server did not answer within the retry budget: a dead server, not a few bad objects.
UNREACHABLE_STOP = 3


@dataclass
class BuildPlan:
    """What one build will do, decided before anything is written."""

    out: str
    format: str
    options: BuildOptions
    store_cls: type
    sources: Sources
    shard_info: Optional[dict]
    fingerprint: str
    report_path: Path
    #: the inputs the output must not be, hold or lie inside (``check_output``)
    inputs: list = field(default_factory=list)


@dataclass
class StagedInputs:
    """What staging the inputs gave besides the records: the inputs the walk could not read
    (the damaged ones are in the stage's resume state), and whether the build stopped at one."""

    unreadable: list
    stopped: bool = False


def plan_build(images, labels, out: str, format: str, options: BuildOptions, prepared=None) -> BuildPlan:
    """Check the output, read the inputs' list and labels, and fingerprint them.

    ``prepared``: ``(sources, shard_info)`` listed and sharded already (a Dask build from a bucket
    lists once on the client and hands each shard its part), used instead of reading the inputs.

    Raises:
        UsageError: the output cannot be written (see :func:`packer.stores.outputs.check_output`);
        SourceError: the inputs cannot be read.
    """
    store_cls = get_store(format)
    inputs = [("images", images), ("labels", labels), ("masks", options.masks)]
    # The staging area is judged under the output lock (Stage): before it, another build may be
    # writing there, and the lock is what refuses this one then, naming the holder.
    check_output(out, inputs=inputs, overwrite=options.overwrite, fmt=format,
                 connection=options.connection(store_cls), staging=False)
    if prepared is not None:
        sources, shard_info = prepared
    else:
        sources = gather_sources(images, labels, options)
        sources, shard_info = pin_and_shard(sources, options.classes, options.shard)
    content = {"quality": options.quality, "exif": options.exif,
               "store_options": options.content_store_options(store_cls), "max_pixels": options.max_pixels}
    if shard_info is not None:
        content["shard"] = shard_info
    if options.max_size is not None:  # only when used: fingerprints of earlier partial builds stay valid
        content["max_size"] = options.max_size
    report_path = Path(options.report_path) if options.report_path else default_report_path(out)
    return BuildPlan(out, format, options, store_cls, sources, shard_info,
                     fingerprint(format, sources, content), report_path, inputs)


def stage_inputs(plan: BuildPlan, stage: Stage) -> StagedInputs:
    """Check every input from the stage's resume point on, on workers, and stage the good ones
    in input order; damaged ones are listed (and logged), ``on_corrupt="stop"`` halts at the
    first. The work done is committed for a resume whatever ends the loop."""
    sources, opts, state = plan.sources, plan.options, stage.state
    # Refused before any work when the inputs clearly do not fit (packer.core.diskspace).
    left = sources.keys[state.next_input:]
    require_room(plan.out, lambda: build_bytes(sources.size_paths(left)),
                 staging=partial_location(plan.out) if "://" not in plan.out else None,
                 what=f"the build ({len(left)} inputs)")
    # Inputs the walk could not read (listed once: by shard 0 of a sharded build).
    unreadable = list(sources.unreadable) if plan.shard_info is None or plan.shard_info["index"] == 0 else []
    run = StagedInputs(unreadable, stopped=bool(unreadable) and opts.on_corrupt == "stop")
    if run.stopped:
        return run
    # A generator: interchange inputs may carry their bytes in the task (bounded window).
    tasks = (_task(plan, pos) for pos in range(state.next_input, len(sources.keys)))
    workers = opts.worker_count
    # inputs in a bucket: each worker reads FETCH_BATCH of them at once (their GETs overlap)
    far = state.next_input < len(sources.keys) and is_remote_input(sources.task_input(state.next_input))
    results = check_images(tasks, workers, workers * 16, opts.executor, batch=FETCH_BATCH if far else 1)
    try:
        _stage_results(plan, stage, run, results)
    except WorkerError:
        stage.writer.flush()  # keep every input checked so far: a rerun resumes after them
        raise
    except DiskFullError as exc:   # a batch did not fit: say what the whole rest needs
        rest = sources.size_paths(sources.keys[state.next_input:])
        raise more_needed(exc, build_bytes(rest), "the rest of the build") from exc
    finally:
        # Stops the pool now, whatever ended the loop (break, an error, Ctrl-C), rather than
        # when the generator is collected: idle workers would keep the interpreter's exit
        # waiting for them.
        results.close()
    return run


def _task(plan: BuildPlan, pos: int) -> tuple:
    """The checking task of input ``pos`` (:func:`~packer.jobs.steps.check_one`)."""
    opts, sources = plan.options, plan.sources
    return (pos, sources.task_input(pos), sources.keys[pos], opts.quality, opts.exif, opts.max_size,
            opts.max_pixels)


def _stage_results(plan: BuildPlan, stage: Stage, run: StagedInputs, results) -> None:
    """Stage the workers' results in input order. An input whose server did not answer within the
    retry budget (:class:`~packer.jobs.steps.Unreachable`) waits for the next one read: after
    :data:`UNREACHABLE_STOP` in a row the build stops with a RemoteError naming the last object,
    what is done kept and those inputs read again by a rerun; fewer are read once more here, in
    their place (a blip of the server, or a slow answer on a loaded machine): see
    :func:`_stage_held`."""
    held = []
    for pos, checked, reason in results:
        if isinstance(reason, Unreachable):
            held.append((pos, None, reason))
            if len(held) >= UNREACHABLE_STOP:
                _stop_unanswered(plan, stage, pos, reason,
                                 f"{len(held)} objects in a row could not be read within the retry budget; the "
                                 f"{{done}} inputs before them are kept: rerun to resume")
            continue
        if _stage_held(plan, stage, run, held) or _stage_checked(plan, stage, run, pos, checked, reason):
            return
        held.clear()
    _stage_held(plan, stage, run, held)   # the last inputs


def _stage_held(plan: BuildPlan, stage: Stage, run: StagedInputs, held: list) -> bool:
    """Stage the inputs ``held`` (their server did not answer within the retry budget), each read
    and checked once more here, in its place; whether the build stops. One that fails again stops
    the build like the storage going away (what is done kept, a rerun reads it again), unless
    ``on_corrupt="skip"``: then it is listed, ``unreachable``, and left out."""
    for p, _, _ in held:
        path = plan.sources.path(plan.sources.keys[p])
        log.info("%s: reading it once more (its storage did not answer in time)", path)
        pos, checked, reason = check_one(_task(plan, p))
        if isinstance(reason, Unreachable) and plan.options.on_corrupt != "skip":
            _stop_unanswered(plan, stage, pos, reason,
                             "this object could not be read twice within the retry budget; the {done} inputs "
                             "before it are kept: rerun to resume, or --on-corrupt skip to leave it out")
        if _stage_checked(plan, stage, run, pos, checked, reason):
            return True
    return False


def _stop_unanswered(plan: BuildPlan, stage: Stage, pos: int, reason: str, what: str) -> None:
    """Commit what is staged and stop the build: the storage did not answer for input ``pos``
    (``what`` says how; ``{done}`` in it becomes the count of inputs kept).

    Raises:
        RemoteError: naming the input's object (transient: a rerun resumes there).
    """
    stage.writer.flush()
    why = reason.split(": ", 2)[-1]   # "cannot read: URL: why"
    raise RemoteError(str(plan.sources.path(plan.sources.keys[pos])),
                      f"the storage stopped answering ({what.format(done=stage.state.next_input)}): {why}",
                      transient=True)


def _stage_checked(plan: BuildPlan, stage: Stage, run: StagedInputs, pos: int, checked, reason) -> bool:
    """:func:`_stage_one`, then whether the build stops here (``on_corrupt="stop"`` at a damaged input)."""
    _stage_one(plan, stage, pos, checked, reason)
    if checked is None and plan.options.on_corrupt == "stop":
        run.stopped = True
    return run.stopped


def _stage_one(plan: BuildPlan, stage: Stage, pos: int, checked, reason) -> None:
    """Stage the checked input at ``pos`` (or list it as damaged), then move the resume point."""
    sources, state = plan.sources, stage.state
    key = sources.keys[pos]
    if checked is None:
        # an interchange input is named by its shard and member or row (``data.tar:0001.jpg``)
        stage.reject(key if sources.displays is None else sources.displays[pos], reason,
                     unreachable=isinstance(reason, Unreachable))
        # The CLI prints the damaged inputs itself: it drops these records (extra).
        log.warning("%s: %s", sources.path(key), reason, extra={"packer_damaged_input": True})
    else:
        rec = stage.add(with_label(checked, state.next_index, sources, pos))
        add_stats(state.stats, rec, sources.label_schema)
        if rec.converted:
            state.converted.append({"path": key, "converted": rec.converted})
        if rec.notes:
            state.notes.extend({"path": key, "note": n} for n in rec.notes)
    stage.advance()


def seal_and_publish(plan: BuildPlan, stage: Stage, run: StagedInputs) -> bool:
    """Publish the staged store when the damage found allows it; returns whether it did."""
    state, opts, sources = stage.state, plan.options, plan.sources
    publish = not (state.rejects or run.unreadable) or opts.on_corrupt == "skip"
    if not publish or run.stopped:
        stage.writer.flush()
        return False
    n, index_sum = stage.seal(expected=state.next_index)
    stats = dict(state.stats, inputs=len(sources.keys), rejected=len(run.unreadable) + len(state.rejects),
                 ignored=len(sources.ignored))
    meta = StoreMetadata(
        format=plan.format, count=n, label_schema=sources.label_schema,
        class_names=list(sources.class_names), label_info=dict(sources.label_info),
        build_options={"quality": opts.quality, "exif": opts.exif, "on_corrupt": opts.on_corrupt,
                       "max_size": opts.max_size, "labels": sources.label_source, "images": str(sources.root),
                       "store_options": opts.content_store_options(plan.store_cls),
                       **({"shard": plan.shard_info} if plan.shard_info is not None else {})},
        index_checksum=index_sum, packer_version=__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        stats=stats)
    stage.publish(meta, overwrite=opts.overwrite)
    return True


def pack(images, labels, out: str, format: str, options: BuildOptions,
         plan: Optional[BuildPlan] = None, prepared=None) -> BuildReport:
    """Build the store at ``out`` on this machine (see :func:`packer.build` for what it does;
    ``prepared`` as for :func:`plan_build`).

    ``plan``: the :func:`plan_build` of these arguments when the caller made it already (a
    publish to a bucket compares its fingerprint with the staged build's).

    Returns:
        BuildReport (also written as JSON at ``options.report_path``).
    """
    refuse_in_bootstrap()
    plan = plan if plan is not None else plan_build(images, labels, out, format, options, prepared)
    opts = plan.options
    bar = progress_bar(len(plan.sources.keys), 0, opts.progress, "packing")
    stage = Stage(plan.store_cls, out, plan.fingerprint, label_schema=plan.sources.label_schema,
                  purpose="build", connection=opts.connection(plan.store_cls),
                  writer_options=dict(opts.store_options, commit_bytes=opts.commit_bytes),
                  resume=opts.resume, bar=bar,
                  # Again under the lock: something may have been published there while we waited.
                  under_lock=lambda: check_output(out, inputs=plan.inputs, overwrite=opts.overwrite,
                                                  fmt=format, connection=opts.connection(plan.store_cls)))
    try:
        with stage:
            run = stage_inputs(plan, stage)
            published = seal_and_publish(plan, stage, run)
    finally:
        bar.close()
    return _report(plan, stage, run, published)


def _report(plan: BuildPlan, stage: Stage, run: StagedInputs, published: bool) -> BuildReport:
    """The build's report, written next to the output."""
    state, sources = stage.state, plan.sources
    # The report is a file users share: a connection string's password never goes into it.
    report = BuildReport(location=redact(str(plan.out)), format=plan.format, published=published,
                         records=state.next_index, inputs=len(sources.keys),
                         rejected=run.unreadable + list(state.rejects), converted=list(state.converted),
                         notes=list(state.notes), ignored=list(sources.ignored),
                         resumed_from=stage.resumed_from, report_path=str(plan.report_path),
                         label_schema=sources.label_schema, ignored_reasons=dict(sources.ignored_reasons))
    write_build_report(plan.report_path, report, {"on_corrupt": plan.options.on_corrupt,
                                                  "stopped_early": run.stopped})
    return report


__all__ = ["pack", "plan_build", "stage_inputs", "seal_and_publish", "BuildPlan"]
