"""``packer.build``: pack an image folder (or another stack's dataset) into a checked store.

The options travel as one :class:`packer.jobs.options.BuildOptions`; the build runs on this
machine (:func:`packer.jobs.pack.pack`) or, with ``engine="dask"``, as shards on a cluster
(:func:`packer.jobs.distributed.build_distributed`).

Example:
    >>> from packer import build, verify
    >>> report = build("data/images", "data/labels", "train.lmdb", format="lmdb")   # doctest: +SKIP
    >>> verify("train.lmdb", deep=True).ok                                           # doctest: +SKIP
    True
"""
from __future__ import annotations

from typing import Optional

from packer.core.errors import UsageError
from packer.core.writes import writes_to
from packer.jobs.distributed import DASK_OPTIONS, build_distributed
from packer.jobs.options import BuildOptions
from packer.jobs.pack import pack
from packer.jobs.publish import build_to_bucket, is_bucket
from packer.jobs.reports import BuildReport
from packer.stores import output_format

#: Where a build runs: this machine, or a dask.distributed cluster.
ENGINES = ("local", "dask")


@writes_to("out", what="the build")
def build(images, labels, out, format: Optional[str] = None, *, engine: Optional[str] = None,
          options: Optional[BuildOptions] = None, **settings) -> BuildReport:
    """Pack an image folder and its labels into a store, checking every image on the way in.

    Args:
        images: IMAGES folder (walked recursively, sorted), an image folder in a bucket
            (``s3://bucket/images/``: :mod:`packer.sources.remote`), or a WebDataset / Hugging
            Face / MDS / TFRecord dataset (:mod:`packer.interchange`).
        labels: LABELS folder / CSV / JSON file, or None (class-per-subfolder, or a dataset's
            own labels).
        out: where to publish the store (a path, ``mongodb://host/db/collection``, or a bucket
            manifest ``s3://bucket/NAME.packer-manifest.json``: staged here, then uploaded,
            :mod:`packer.jobs.publish`).
        format: a name from :func:`packer.stores.available_formats`; default: inferred from
            ``out`` (``.h5``/``.hdf5`` -> hdf5, ``.lmdb`` -> lmdb, ``mongodb://`` -> mongo,
            else lmdb). A format contradicting ``out``, or a URL no store writes, raises
            UsageError. For a bucket output, ``lmdb``/``hdf5`` name the shards' format.
        engine: ``None``/``"local"`` (this machine) or ``"dask"``: build ``shards=N`` shards on
            a dask.distributed cluster (``scheduler=ADDRESS`` or a LocalCluster) and publish a
            manifest at ``out`` (:func:`packer.jobs.distributed.build_distributed`).
        options: a :class:`~packer.jobs.options.BuildOptions`; ``settings`` override its fields.
        **settings: any :class:`~packer.jobs.options.BuildOptions` field by name (``quality``,
            ``exif``, ``workers``, ``on_corrupt``, ``resume``, ``overwrite``, ``classes``,
            ``max_size``, ``store_options``, ``progress``...), and with ``engine="dask"`` the
            engine's options (``shards``, ``scheduler``, ``n_workers``, ``retries``,
            ``shard_dir``, ``connect_timeout``). ``storage_options``: fsspec options of the
            bucket(s) read and written (inputs and output: credentials, endpoint), never
            printed or written anywhere.

    Returns:
        BuildReport (also written as JSON next to ``out``). ``published`` is False when damaged
        inputs were found under ``on_corrupt="fail"`` or ``"stop"``: the good records stay in
        the staging area, and a rerun (e.g. with ``on_corrupt="skip"``) resumes from there.

    Raises:
        UsageError (a bad option or output), SourceError (unreadable inputs), StoreError,
        LockedError (another build holds ``out``), WorkerError (a worker process died: the work
        done so far is kept for a resume).

    Example:
        >>> r = build("imgs", None, "out.lmdb", workers=4)   # doctest: +SKIP
        >>> r.published, r.records                          # doctest: +SKIP
        (True, 1000)
    """
    base = options if options is not None else BuildOptions()
    storage_options = settings.pop("storage_options", None)
    known, engine_options = BuildOptions.split_kwargs(settings, base)
    if storage_options is not None:   # for inputs in a bucket too (BuildOptions.storage_options)
        known = known.replace(storage_options=storage_options)
    storage_options = known.storage_options
    engine = engine or "local"
    if engine not in ENGINES:
        raise UsageError(f"engine must be one of {ENGINES}, got {engine!r}")
    if is_bucket(str(out)):
        if engine == "local" and engine_options:
            raise UsageError(f"unknown build option(s) {sorted(engine_options)} (scheduler/shards need "
                             f"engine='dask')")
        return build_to_bucket(images, labels, str(out), format, known, engine=engine,
                               engine_options=engine_options, storage_options=storage_options,
                               run_dask=build_distributed)
    if engine == "local":
        if engine_options:
            raise UsageError(f"unknown build option(s) {sorted(engine_options)} (scheduler/shards need "
                             f"engine='dask')")
        out = str(out)
        return pack(images, labels, out, output_format(out, format), known)
    if known.shard is not None:
        raise UsageError("--shard builds one part here; --engine dask builds all parts (--shards N): not both")
    unknown = sorted(set(engine_options) - set(DASK_OPTIONS))
    if unknown:
        raise UsageError(f"unknown dask engine option(s) {unknown}; accepted: {sorted(DASK_OPTIONS)}")
    # ``format`` names the shards' format; the manifest at ``out`` lists them.
    return build_distributed(images, labels, out, format or "lmdb", options=known, **engine_options)


__all__ = ["build", "ENGINES"]
