"""Deterministic shards of a build's input list (``packer build --shard I/N``).

Shard ``I`` of ``N`` is the contiguous slice ``[M*I//N, M*(I+1)//N)`` of the sorted input list
of ``M`` images, so the shards' records, concatenated in shard order, are exactly the records
of one unsharded build, in the same order. Every shard lists (and labels) the whole input
tree, so class ids come from all of it and agree across shards.

A shard store records where it came from in ``metadata.build_options["shard"]``::

    {"index": I, "count": N, "input_start": a, "input_stop": b, "inputs_total": M,
     "inputs_checksum": "<BLAKE2b of the full sorted key list and labels>"}

``packer merge`` uses it to order shards, to find missing or doubled ones, and to refuse shards
of different input lists.

Example:
    >>> parse_shard("3/8")
    (3, 8)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re

from packer.core.errors import UsageError
from packer.core.records import label_to_json


def parse_shard(spec) -> tuple[int, int]:
    """``"I/N"`` or ``(I, N)`` -> ``(I, N)`` with ``0 <= I < N``; UsageError otherwise."""
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        i, n = spec
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
        if not m:
            raise UsageError(f"--shard expects I/N (e.g. 0/8, shards numbered from 0), got {spec!r}")
        i, n = m.groups()
    i, n = int(i), int(n)
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard {i}/{n}: need 0 <= I < N")
    return i, n


def shard_range(total: int, index: int, count: int) -> tuple[int, int]:
    """[start, stop) of shard ``index`` of ``count`` over ``total`` inputs."""
    return total * index // count, total * (index + 1) // count


def inputs_checksum(sources) -> str:
    """Checksum of the full sorted key list with labels and class names (no file I/O)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([sources.label_schema, list(sources.class_names)]).encode())
    for key, label in zip(sources.keys, sources.labels):
        h.update(f"{key}\0{json.dumps(label_to_json(label))}\n".encode())
    return h.hexdigest()


def select_shard(sources, spec):
    """(sources restricted to shard ``spec``, shard info dict for the store metadata)."""
    index, count = parse_shard(spec)
    total = len(sources.keys)
    start, stop = shard_range(total, index, count)
    info = {"index": index, "count": count, "input_start": start, "input_stop": stop,
            "inputs_total": total, "inputs_checksum": inputs_checksum(sources)}
    part = dataclasses.replace(
        sources, keys=sources.keys[start:stop], labels=sources.labels[start:stop],
        metadata=sources.metadata[start:stop],
        locators=None if sources.locators is None else sources.locators[start:stop],
        displays=None if sources.displays is None else sources.displays[start:stop])
    return part, info


def shard_name(index: int, count: int, suffix: str = "") -> str:
    """File name of a shard store: ``shard-00003-of-00008<suffix>``."""
    return f"shard-{index:05d}-of-{count:05d}{suffix}"
