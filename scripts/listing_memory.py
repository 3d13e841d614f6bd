#!/usr/bin/env python3
"""Memory of building from a bucket, by the number of objects (docs/scaling.md, "Listing").

Measures with tracemalloc, over a synthetic listing of N objects (fake ObjectInfo pages fed to
packer.sources.remote in place of the server's pages, so a million entries need no million
objects):

* ``stream_peak``: iterating the listing alone (what :func:`packer.core.remote.list_objects`
  holds: one page), flat in N;
* ``client``: the client's sources after listing once (keys, labels, packed sizes and ETags),
  bytes per entry, and the peak while listing;
* ``task``: one shard task's part of ``--shards S`` (what dask sends it: the pickled part, and
  what it holds once unpickled), the same whatever N is for N/S entries.

With ``--endpoint URL`` (an S3 server, e.g. ``bash scripts/s3_server.sh start``) it also lists a
real prefix of ``--real`` objects (uploaded first) and reports the peak bytes per object of one
listing page as s3fs/botocore parse it.

Example:
    python scripts/listing_memory.py --entries 1000000 --shards 64
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import sys
import tracemalloc
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this checkout's packer

from packer.core import remote  # noqa: E402
from packer.core.remote import ObjectInfo  # noqa: E402


def fake_listing(n: int, classes: int = 1000, base: str = "s3://bucket/images/", page: int = 1000):
    """N objects ``cls0007/img_00001234.jpg`` with sizes and MD5-like ETags, yielded as the
    layer yields them (pages of ``page`` made one at a time, as a server's)."""
    for start in range(0, n, page):
        entries = []
        for i in range(start, min(n, start + page)):
            c = i * classes // n
            entries.append(ObjectInfo(f"{base}cls{c:04d}/img_{i:08d}.jpg", 100_000 + i % 50_000,
                                      f"{i * 2654435761 % 2**128:032x}"))
        yield from entries


def _traced(fn):
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    result = fn()
    now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, now - before, peak - before


def measure(n: int, shards: int) -> dict:
    """The figures above for ``n`` entries and ``shards`` shards (bytes)."""
    from packer.core.sharding import select_shard
    from packer.sources.remote import collect_remote_sources

    _, _, stream_peak = _traced(lambda: sum(1 for _ in fake_listing(n)))
    with mock.patch.object(remote, "list_objects", lambda url, opts=None: fake_listing(n)):
        sources, held, peak = _traced(lambda: collect_remote_sources("s3://bucket/images/", None))
    part, _ = select_shard(sources, (0, shards))
    blob = pickle.dumps((part, None), protocol=pickle.HIGHEST_PROTOCOL)
    del sources, part
    part, task_held, _ = _traced(lambda: pickle.loads(blob))
    return {"entries": n, "shards": shards, "stream_peak_bytes": stream_peak,
            "client_bytes": held, "client_bytes_per_entry": round(held / n, 1), "client_peak_bytes": peak,
            "task_entries": len(part[0].keys), "task_sent_bytes": len(blob), "task_held_bytes": task_held,
            "task_bytes_per_entry": round(task_held / max(1, len(part[0].keys)), 1)}


def measure_real(endpoint: str, count: int) -> dict:
    """Upload ``count`` small objects to a fresh bucket at ``endpoint``, then list them: peak
    bytes of the listing (one page of 1000 parsed at a time), per object of a page."""
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    bucket = f"listing-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"images/cls{i % 100:03d}/img_{i:08d}.jpg",
                                                  Body=b"x"), range(count)))
    url = f"s3://{bucket}/images/"
    next(iter(remote.list_objects(url)))   # the filesystem and its client made before measuring
    n, _, peak = _traced(lambda: sum(1 for _ in remote.list_objects(url)))
    return {"objects": n, "listing_peak_bytes": peak, "page": 1000, "peak_bytes_per_object_of_a_page": peak // 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--endpoint", default=None, help="an S3 server, to list a real prefix too")
    ap.add_argument("--real", type=int, default=20_000, help="objects in the real prefix")
    args = ap.parse_args()
    out = {"synthetic": measure(args.entries, args.shards)}
    if args.endpoint:
        out["real"] = measure_real(args.endpoint, args.real)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
