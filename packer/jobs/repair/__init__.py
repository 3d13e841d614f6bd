"""``packer repair``: bring a damaged store back, losing no byte it cannot restore.

What repair does, for every format in the registry:

1. **Find** what ``verify --deep`` finds, reading the store in salvage mode
   (:meth:`~packer.stores.base.Store.open_salvage`): every record whose bytes, fields, index
   entry or key are wrong, and store-level damage (metadata missing or damaged, file cut short,
   index databases inconsistent).
2. **Decide**, per bad record, in this order: *from source* (``source=IMAGES``: the original
   file is accepted only when its checksum equals the one the record stored, and it goes
   through the build's checks again; a record whose fields still verify keeps its label,
   per-sample metadata and notes and takes only its bytes from the file, the source's labels
   go only into records whose fields are damaged or lost), *salvage* (a JPEG that lost its
   EOI is completed and kept only if it then decodes cleanly under the build's strict decode;
   flagged in its notes), else *quarantine*: the record leaves the live index and its bytes
   and the reason go to the store's quarantine area (``StoreMetadata.quarantine`` + the
   backend's bytes), restorable with
   ``restore=[key]`` (the record comes back as it is, checksums recomputed over what it holds,
   its notes saying why it had been quarantined).
3. **Rewrite** the store through the backend's own writer into its staging area (like a build),
   check what was staged as verify will read it (:class:`packer.stores.staging.StagedCheck`: a result
   that would not verify is never published, and the old store stays in place, untouched),
   move the old store aside as a backup next to it (never deleted by packer) and publish the
   repaired one atomically. A journal next to the store makes a killed repair finish on rerun.

Labels from ``source``: ``--source IMAGES`` alone on a store whose labels came from elsewhere
(YOLO boxes, COCO...) gives bytes only: records whose stored labels verify keep them, and a
record that needs its labels from the source (its stored labels damaged or lost) makes repair
refuse with UsageError (exit 2) before it writes anything, naming the record and saying to pass
``--source IMAGES LABELS``. LABELS (or class folders on a class-folder store) must give labels of
the store's label schema, or repair refuses the same way. A store of no labels is rebuilt from
IMAGES alone.

Indices: a store's index is a record's *position*, 0..len-1 (what ``len()``, samplers and
DataLoaders use), and stays contiguous. Records keep their keys, bytes, labels and checksums and
their order; when a record is quarantined the records after it move down one position, exactly
as if the build had left that input out (``index_of(key)`` finds them). The quarantine entry
keeps the position the record had, and restoring it puts it back there.

The package, by step: :mod:`.scan` (find), :mod:`.source` (the ``--source`` files),
:mod:`.salvage` (complete a JPEG that lost its EOI), :mod:`.plan` (decide), :mod:`.write`
(rewrite and publish), :mod:`.journal` (backup and journal), :mod:`.store` (one store, the
steps in order) and :mod:`.manifest` (each shard, then the manifest re-sealed).

Example:
    >>> rep = repair("train.lmdb", source="data/images")     # doctest: +SKIP
    >>> rep.ok, [a["action"] for a in rep.actions]           # doctest: +SKIP
    (True, ['from-source', 'quarantined'])
"""
from __future__ import annotations

from typing import Optional

from packer.core.errors import UsageError
from packer.core.remote import parent as remote_parent
from packer.core.uri import redact
from packer.core.writes import writes_to
from packer.jobs.publish import is_bucket
from packer.jobs.repair.journal import detect_repair_format
from packer.jobs.repair.manifest import repair_manifest
from packer.jobs.repair.plan import ACTIONS
from packer.jobs.repair.salvage import salvage_jpeg
from packer.jobs.repair.store import repair_store
from packer.jobs.reports import RepairReport
from packer.stores import get_store


@writes_to("location", what="the repair")
def repair(location, source=None, labels=None, *, format: Optional[str] = None, dry_run: bool = False,
           restore=(), report_path=None, progress: bool = False, commit_bytes: Optional[int] = None,
           **reader_options) -> RepairReport:
    """Repair the store at ``location`` (see the module docstring for what that means).

    Args:
        location: the store (path or ``mongodb://`` URL), or a manifest (each shard is repaired,
            then the manifest re-sealed: :func:`packer.jobs.repair.manifest.repair_manifest`).
        source: the IMAGES folder the store was built from (optional): damaged or lost records
            are rebuilt from it when the original file is the one the record was made from.
            A record whose fields still verify keeps its stored label; the others take the
            source's.
        labels: the LABELS the store was built from (as for ``build``), with ``source``;
            needed unless the store's labels are its class folders (or it has none): the
            source's label schema must be the store's.
        format: the store's format (detected when None).
        dry_run: plan only; the store is not touched (the plan goes to ``<location>.repair-plan.json``).
        restore: keys of quarantined records to put back into the live store as they are.
        report_path: where the JSON report goes (default ``<location>.repair.json``, for a server
            URL ``<collection>.repair.json`` in the working directory).
        progress: tqdm progress bars.
        commit_bytes: write-batch size of the rewrite.
        **reader_options: backend reader options (e.g. ``uri`` for MongoDB).

    Returns:
        RepairReport. ``ok`` is False when something could not be repaired (listed in
        ``unrepaired``) or the repaired store does not verify.

    Raises:
        UsageError: bad arguments, e.g. ``restore`` names a key that is not quarantined, or
            ``source``/``labels`` give labels of another schema than the store's (nothing is
            written; the message says what to pass).
        StoreError: nothing readable at ``location``, or the repaired store would not verify
            (nothing is published; the old store stays in place as it was).

    Example:
        >>> r = repair("train.h5", dry_run=True)     # doctest: +SKIP
        >>> r.nothing_to_repair                       # doctest: +SKIP
        True
    """
    location = str(location)
    if is_bucket(location):
        # A repair rewrites shards and keeps the old ones beside them (STORE.repair-backup-*);
        # in a bucket that is a new version published over the old one, not built yet.
        shown = redact(location)
        raise UsageError(
            f"{shown}: repair works on a store on this machine, not yet on one in a bucket: copy the "
            f"manifest and its shards here as they are (e.g. aws s3 cp --recursive), run packer repair on "
            f"the local manifest, then publish the result (packer convert LOCAL.packer-manifest.json "
            f"{remote_parent(shown)}NEW.packer-manifest.json); packer verify {shown} lists what is damaged")
    fmt = detect_repair_format(location, format)
    if get_store(fmt).composite:   # no records of its own: repair each shard, then re-seal the manifest
        return repair_manifest(location, source, labels, dry_run=dry_run, restore=restore,
                               report_path=report_path, progress=progress, commit_bytes=commit_bytes,
                               **reader_options)
    return repair_store(location, source, labels, format=fmt, dry_run=dry_run, restore=restore,
                        report_path=report_path, progress=progress, commit_bytes=commit_bytes, **reader_options)


__all__ = ["repair", "RepairReport", "salvage_jpeg", "ACTIONS"]
