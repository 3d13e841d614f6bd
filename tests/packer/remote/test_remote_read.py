"""Reading a manifest store from a bucket: the node-local shard cache (one download per shard per
node, checked on arrival, pinned versions), its size limit and next-use eviction, read-ahead, the
readers taking a URL, and faults while reading (throttling, resets, a dead server, credentials).

Runs against the S3 test server (tests/s3_support.py); the data is a local manifest over 20
small LMDB shards, uploaded as remote.md lays a published store out."""
from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packer
from packer.core import remote
from packer.core.errors import StoreError, UsageError
from packer.core.remote import RemoteError
from packer.stores import open_store
from packer.stores.manifest import read_manifest
from tests.corpus import good_jpeg

pytestmark = pytest.mark.s3
N_SHARDS = 20


# ---------------------------------------------------------------------------------------------
# Test data: a local manifest over small shards, published to the bucket as remote.md says
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_manifest(tmp_path_factory):
    """A manifest over ``N_SHARDS`` LMDB shards of 4 records each (80 JPEGs in 4 classes)."""
    root = tmp_path_factory.mktemp("remote_read")
    images = root / "images"
    for i in range(4 * N_SHARDS):
        d = images / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"im{i:03d}.jpg").write_bytes(good_jpeg(i))
    parts = []
    for i in range(N_SHARDS):
        loc = str(root / f"part{i:02d}.lmdb")
        assert packer.build(str(images), None, loc, "lmdb", workers=1, shard=f"{i}/{N_SHARDS}",
                            report_path=str(root / f"r{i}.json")).ok
        parts.append(loc)
    from packer.jobs.merge import merge
    out = str(root / "train.packer-manifest.json")
    merge(parts, out)
    return out


def publish(local: str, s3, name: str = "train", *, files: bool = True, xxh=None) -> str:
    """Upload the manifest store ``local`` to the bucket as remote.md lays it out: each shard's
    files (never lock.mdb) at ``<name>.shards/shard-0000j-of-0000N.lmdb/...`` first, each shard
    entry then listing its "files" (name, size, xxh3_128, etag), the manifest JSON last."""
    import xxhash

    meta, shards = read_manifest(local)
    doc = json.loads(open(local, "rb").read())
    url = s3.url(f"{name}.packer-manifest.json")
    for j, entry in enumerate(shards):
        src = os.path.join(os.path.dirname(local), entry["location"])
        rel = f"{name}.shards/shard-{j:05d}-of-{len(shards):05d}.lmdb"
        listed = []
        for fname in sorted(os.listdir(src)):
            if fname == "lock.mdb":
                continue
            path = os.path.join(src, fname)
            info = remote.upload(path, remote.resolve(url, f"{rel}/{fname}"))
            digest = xxhash.xxh3_128(open(path, "rb").read()).hexdigest()
            listed.append({"name": fname, "size": info.size, "xxh3_128": (xxh or {}).get(j, digest),
                           "etag": info.version})
        doc["shards"][j]["location"] = rel
        if files:
            doc["shards"][j]["files"] = listed
    remote.put_bytes(json.dumps(doc, indent=1).encode(), url)
    return url


def shard_bytes(url: str) -> list:
    """Bytes of each shard as the manifest lists them."""
    doc = json.loads(remote.read(url))
    return [sum(f["size"] for f in s["files"]) for s in doc["shards"]]


def folder_bytes(path) -> int:
    """Bytes under ``path`` now, counted while holding the lock under which every cache in it
    evicts and reserves (``locks/cache``): a walk without it can see a shard about to be evicted
    and the download that replaces it both, more than was ever on disk at once (a file the
    read-ahead thread removes meanwhile counts 0)."""
    import fcntl

    fds = []
    try:
        for lock in sorted([*Path(path).glob("locks/cache"), *Path(path).glob("*/locks/cache")]):
            fd = os.open(lock, os.O_RDWR)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        total = 0
        for d, _, fs in os.walk(path):
            for f in fs:
                try:
                    total += os.lstat(os.path.join(d, f)).st_size
                except FileNotFoundError:
                    pass
        return total
    finally:
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# Reading through the cache
# ---------------------------------------------------------------------------------------------
def test_open_store_on_a_url_reads_every_record(local_manifest, s3, tmp_path):
    url = publish(local_manifest, s3)
    with open_store(local_manifest) as loc, open_store(url, cache_dir=str(tmp_path / "c")) as r:
        assert len(r) == len(loc) == 4 * N_SHARDS
        assert r.build_id == loc.build_id and r.shard_boundaries == loc.shard_boundaries
        for i in range(len(r)):
            a, b = r.get(i), loc.get(i)
            assert (a.key, a.data, a.label) == (b.key, b.data, b.label)
        assert r.cache.stats["downloads"] == N_SHARDS
    with open_store(url, cache_dir=str(tmp_path / "c")) as r:   # a second open: all cached
        assert [x.key for x in r.get_many(range(len(r)))] == [loc_key for loc_key in _keys(local_manifest)]
        assert r.cache.stats["downloads"] == 0 and r.cache.stats["hits"] == N_SHARDS


def _keys(loc):
    with open_store(loc) as r:
        return [x.key for x in r.get_many(range(len(r)))]


def test_two_processes_download_each_shard_once(local_manifest, s3_faults, tmp_path):
    """Two processes (as two DataLoader workers or two ranks of a node) read every shard at the
    same time through one cache folder: each shard file is fetched once (the proxy's GETs)."""
    s3, proxy = s3_faults
    url = publish(local_manifest, s3)
    cache = str(tmp_path / "c")
    before = proxy.counts["GET"]
    code = ("import sys; from packer.stores import open_store\n"
            "with open_store(sys.argv[1], cache_dir=sys.argv[2], read_ahead=0) as r:\n"
            "    assert len(r.get_many(range(len(r)))) == len(r)\n")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    procs = [subprocess.Popen([sys.executable, "-c", code, url, cache], env=env) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    shard_gets = proxy.counts["GET"] - before - 2      # one manifest GET per process
    assert shard_gets == N_SHARDS, proxy.counts


def _record_arrivals(monkeypatch, log: Path):
    """After every shard download, in this process or in a DataLoader worker forked from it (the
    read-ahead thread's too), the cache folder's size is appended to ``log``; returns a function
    that reads the sizes back."""
    from packer.stores.cache import ShardCache

    real = ShardCache._download

    def measured(self, s, files):
        real(self, s, files)
        with open(log, "a") as fh:
            fh.write(f"{folder_bytes(self.root)}\n")
    monkeypatch.setattr(ShardCache, "_download", measured)
    return lambda: [int(x) for x in log.read_text().split()] if log.exists() else []


def _epochs(r, sampler, epochs: int, limit: int, plan: bool, monkeypatch, log: Path) -> list:
    """Read ``epochs`` epochs of ``sampler``'s order through ``r``; bytes downloaded per epoch.
    Checks the cache folder's size against ``limit`` after every shard arrival."""
    arrivals = _record_arrivals(monkeypatch, log)
    per_epoch = []
    for e in range(epochs):
        sampler.set_epoch(e)
        if plan:
            r.set_shard_order(sampler.shard_order(e) + sampler.shard_order(e + 1), epoch=e)
        start = r.cache.stats["bytes"]
        for i in sampler:
            assert r.get(i).index == i
        per_epoch.append(r.cache.stats["bytes"] - start)
    sizes = arrivals()
    assert sizes and max(sizes) <= limit, (max(sizes), limit)
    return per_epoch


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_eviction_by_next_use_downloads_only_what_does_not_fit(local_manifest, s3, tmp_path, monkeypatch,
                                                               read_ahead):
    """With a cache of half the dataset and the sampler's order handed over, each epoch after the
    first downloads at most half of it (plus one shard); LRU on the same orders (the same cache
    without an order) downloads nearly all of it again, so the bound is a real one. Measured:
    planned 712704/778240 bytes in epochs 2/3 of 1421312 (bound 784384), LRU 1138688/1277952."""
    from readers.sampler import DistributedSampler

    url = publish(local_manifest, s3)
    sizes = shard_bytes(url)
    total, f = sum(sizes), 0.5
    limit = int(f * total)
    bound = (1 - f) * total + max(sizes)
    runs = {}
    for plan in (True, False):
        with open_store(url, cache_dir=str(tmp_path / f"c{plan}"), cache_limit=limit,
                        read_ahead=read_ahead) as r:
            sampler = DistributedSampler(len(r), num_replicas=1, rank=0, seed=3,
                                         boundaries=r.shard_boundaries, shard_window=2)
            runs[plan] = _epochs(r, sampler, 3, limit, plan, monkeypatch, tmp_path / f"arrivals-{plan}")
            r.cache.close()
            assert folder_bytes(tmp_path / f"c{plan}") <= limit
    planned, lru = runs[True], runs[False]
    assert planned[0] >= total - max(sizes)        # the first epoch fetches (nearly) everything
    if read_ahead == 0:
        assert all(b <= bound for b in planned[1:]), (planned, bound, total)
    else:   # read-ahead moves up to read_ahead shards' downloads across an epoch's boundary
        assert sum(planned[1:]) <= 2 * (1 - f) * total + (read_ahead + 1) * max(sizes), (planned, total)
    assert sum(lru[1:]) > 2 * bound + max(sizes), (lru, bound, total)   # LRU: most of the dataset again


def test_a_cache_too_small_for_read_ahead_is_refused_up_front(local_manifest, s3, tmp_path, caplog):
    url = publish(local_manifest, s3)
    largest = max(shard_bytes(url))
    need = largest * (2 + 4) + (4 << 10)    # read_ahead 2 + 4 shards open (the defaults) + plans, locks
    with pytest.raises(UsageError, match=f"needs at least {need} bytes") as e:
        open_store(url, cache_dir=str(tmp_path / "c"), cache_limit=need - 1)
    assert "cache_limit" in str(e.value) and s3.bucket in str(e.value) and "KiB;" in str(e.value)
    with caplog.at_level(logging.WARNING, logger="packer.stores.cache"):
        with open_store(url, cache_dir=str(tmp_path / "c"), cache_limit=need) as r:   # exactly enough
            assert len(r.get_many(range(len(r)))) == len(r)
            assert folder_bytes(tmp_path / "c") <= need
        # accepted, with a warning: the shards in flight leave little to keep between epochs
        assert "later epochs will download most of the dataset again" in caplog.text
        # sizes in units that say something for small shards too (it said "0 MiB")
        from packer.core.diskspace import size_text
        assert f"up to {size_text(largest)} per process" in caplog.text and " 0 MiB" not in caplog.text
        caplog.clear()
        with open_store(url, cache_dir=str(tmp_path / "d"), cache_limit=2 * need):
            pass
        assert "later epochs" not in caplog.text


# ---------------------------------------------------------------------------------------------
# Versions and checks on arrival
# ---------------------------------------------------------------------------------------------
def test_a_shard_changed_in_the_bucket_is_an_error_naming_it(local_manifest, s3, tmp_path):
    url = publish(local_manifest, s3)
    with open_store(url, cache_dir=str(tmp_path / "c"), read_ahead=0) as r:
        r.get(0)
        key = "train.shards/shard-00003-of-00020.lmdb/data.mdb"
        s3.put(key, s3.get(key) + b"\0")          # republished by hand under the reader
        with pytest.raises(RemoteError, match="changed since it was opened|holds") as e:
            r.get(r.shard_boundaries[3])
        assert "shard-00003-of-00020.lmdb/data.mdb" in str(e.value)
        assert not r.cache.is_cached(3) and not os.listdir(os.path.join(r.cache.root, "reserve"))


def test_a_file_damaged_on_arrival_is_refused(local_manifest, s3, tmp_path):
    url = publish(local_manifest, s3, xxh={2: "0" * 32})
    with open_store(url, cache_dir=str(tmp_path / "c"), read_ahead=0) as r:
        r.get(0)
        with pytest.raises(StoreError, match="arrived damaged") as e:
            r.get(r.shard_boundaries[2])
        assert "shard-00002-of-00020.lmdb/data.mdb" in str(e.value)
        assert not r.cache.is_cached(2)


def test_a_manifest_without_files_pins_what_it_sees(local_manifest, s3, tmp_path):
    """No "files" (a hand-made manifest): the shard's objects are listed and pinned at download,
    the shard's own index checksum is checked against the manifest entry."""
    url = publish(local_manifest, s3, files=False)
    with open_store(url, cache_dir=str(tmp_path / "c")) as r:
        assert [x.key for x in r.get_many(range(len(r)))] == _keys(local_manifest)
    # a shard swapped for another one (same layout, other records): refused by its checksum
    url2 = publish(local_manifest, s3, name="other", files=False)
    s3.put("other.shards/shard-00001-of-00020.lmdb/data.mdb",
           s3.get("other.shards/shard-00004-of-00020.lmdb/data.mdb"))
    with open_store(url2, cache_dir=str(tmp_path / "c2"), read_ahead=0) as r:
        with pytest.raises(StoreError, match="shard 1 .*changed since the manifest was written"):
            r.get(r.shard_boundaries[1])


def test_detect_format_and_bad_urls(local_manifest, s3, tmp_path):
    from packer.stores import detect_format
    url = publish(local_manifest, s3)
    assert detect_format(url) == "manifest"
    with pytest.raises(RemoteError, match="no such object"):
        open_store(s3.url("missing.packer-manifest.json"), cache_dir=str(tmp_path))
    with pytest.raises(UsageError, match="for a manifest in a bucket"):
        open_store(local_manifest, cache_limit="1G")


# ---------------------------------------------------------------------------------------------
# Faults while reading
# ---------------------------------------------------------------------------------------------
def test_throttling_resets_and_short_bodies_are_retried(local_manifest, s3_faults, tmp_path):
    s3, proxy = s3_faults
    url = publish(local_manifest, s3)
    with open_store(url, cache_dir=str(tmp_path / "c"), read_ahead=0) as r:
        proxy.fail(3, 503, "SlowDown", only="GET")
        proxy.reset(2, only="GET")
        proxy.cut(2)
        assert [x.key for x in r.get_many(range(len(r)))] == _keys(local_manifest)
        assert r.cache.stats["downloads"] == N_SHARDS


def test_a_server_dead_mid_epoch_is_one_error_within_the_budget(local_manifest, s3_faults, tmp_path):
    s3, proxy = s3_faults
    url = publish(local_manifest, s3)
    with open_store(url, cache_dir=str(tmp_path / "c")) as r:
        r.get(0)
        proxy.down()
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as e:
            for i in range(len(r)):
                r.get(i)
        took = time.monotonic() - t0
    assert took < 8.0 * 2 + 15, took           # the budget (8 s here), a read-ahead's included
    assert e.value.transient and "train.shards/shard-" in str(e.value)


def test_refused_credentials_fail_at_once(local_manifest, s3_faults, tmp_path):
    s3, proxy = s3_faults
    url = publish(local_manifest, s3)
    proxy.fail(50, 403, "AccessDenied")
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as e:
        open_store(url, cache_dir=str(tmp_path / "c"))
    assert time.monotonic() - t0 < 5 and not e.value.transient and "train.packer-manifest.json" in str(e.value)
    assert "testing" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# The readers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_store_dataset_on_a_url_with_workers_and_the_shard_shuffle(local_manifest, s3, tmp_path, context):
    """A StoreDataset on the URL under DataLoader workers (fork and spawn) and the shard-aware
    DistributedSampler: every record once per epoch, the epoch's plan handed to the cache
    folder, the cache under its limit, resume mid-epoch unchanged."""
    import torch

    from readers import DistributedSampler, StoreDataset

    url = publish(local_manifest, s3)
    limit = int(0.6 * sum(shard_bytes(url)))
    ds = StoreDataset(url, cache_dir=str(tmp_path / "c"), cache_limit=limit, return_key=True)
    assert pickle.loads(pickle.dumps(ds)).location == url       # nothing open crosses a pickle
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, seed=5, shard_local=True, shard_window=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2,
                                         multiprocessing_context=context, collate_fn=list)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        keys = [k for batch in loader for _, _, k in batch]
        assert sorted(keys) == sorted(_keys(local_manifest))
        plans = [n for n in os.listdir(next((tmp_path / "c").iterdir())) if n.startswith("plan-")]
        assert plans == ["plan-0.json"]
        assert folder_bytes(tmp_path / "c") <= limit
    sampler.set_epoch(1)
    it = iter(sampler)
    first = [next(it) for _ in range(10)]
    state = sampler.state_dict()
    rest = list(it)
    again = DistributedSampler(ds, num_replicas=1, rank=0, seed=5, shard_local=True, shard_window=3)
    again.load_state_dict(state)
    assert list(again) == rest and len(first + rest) == len(ds)


def test_raw_reader_and_gpu_loader_take_the_url(local_manifest, s3, tmp_path):
    from readers.gpu import GPULoader
    from readers.raw import RawReader

    url = publish(local_manifest, s3)
    raw = RawReader(url, cache_dir=str(tmp_path / "c"), threads=2)
    assert raw.reader_options["cache_dir"] == str(tmp_path / "c") and len(raw) == 4 * N_SHARDS
    loader = GPULoader(url, None, batch_size=16, device="cpu", decoder="turbojpeg", threads=1,
                       cache_dir=str(tmp_path / "c"), cache_limit="10M")
    n = sum(len(b.images) for b in loader)
    assert n == 4 * N_SHARDS


@pytest.mark.cuda
@pytest.mark.parametrize("decoder", ["nvjpeg", "auto"])
def test_gpu_loader_on_a_url_decodes_on_the_gpu(local_manifest, s3, tmp_path, decoder):
    """The GPU path from a bucket: records through the node-local cache, decoded on the GPU
    (torchvision's nvJPEG, and the default: the native engine where it is built), every image
    once, the same pixels as the local store gives."""
    import torch

    from readers.gpu import GPULoader
    from tests.gpu_ops_helpers import cuda_available_or_skip

    cuda_available_or_skip()
    url = publish(local_manifest, s3)
    got = GPULoader(url, None, batch_size=16, device="cuda", decoder=decoder, threads=2,
                    cache_dir=str(tmp_path / "c"), cache_limit="10M")
    local = GPULoader(local_manifest, None, batch_size=16, device="cuda", decoder=decoder, threads=2)
    n = 0
    for a, b in zip(got, local):
        assert len(a.images) == len(b.images)
        for x, y in zip(a.images, b.images):
            assert x.is_cuda and torch.equal(x, y)
        n += len(a.images)
    assert n == 4 * N_SHARDS


def test_read_ahead_fetches_the_next_shards_of_the_order(local_manifest, s3, tmp_path):
    """After the first shard of the planned order is read, the next ``read_ahead`` shards arrive
    without being asked for (so later reads find them cached), and no more than that."""
    url = publish(local_manifest, s3)
    with open_store(url, cache_dir=str(tmp_path / "c"), read_ahead=2, max_open=1) as r:
        order = [7, 3, 12, 0, 5]
        r.set_shard_order(order)
        r.get(r.shard_boundaries[7])
        deadline = time.monotonic() + 20
        while not (r.cache.is_cached(3) and r.cache.is_cached(12)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.cache.is_cached(3) and r.cache.is_cached(12)
        time.sleep(0.3)
        assert not r.cache.is_cached(0) and r.cache.stats["downloads"] == 3
        hits = r.cache.stats["hits"]
        r.get(r.shard_boundaries[3])
        assert r.cache.stats["hits"] == hits + 1


def _wait_cached(cache, shards, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while not all(cache.is_cached(j) for j in shards) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(cache.is_cached(j) for j in shards)


def test_a_scan_in_manifest_order_reads_ahead_without_a_plan(local_manifest, s3, tmp_path):
    """No sampler handed a plan (a plain DataLoader reading 0, 1, 2...): the shards after the
    current one arrive without being asked for; a scan that starts elsewhere reads nothing ahead."""
    url = publish(local_manifest, s3)
    with open_store(url, cache_dir=str(tmp_path / "a"), read_ahead=2, max_open=1) as r:
        r.get(0)
        assert _wait_cached(r.cache, [1, 2])
        time.sleep(0.3)
        assert not r.cache.is_cached(3) and r.cache.stats["downloads"] == 3
        r.get(r.shard_boundaries[1])          # the scan moves on: one more ahead, no new demand
        assert _wait_cached(r.cache, [3])
        assert r.cache.stats["hits"] == 1
    with open_store(url, cache_dir=str(tmp_path / "b"), read_ahead=2, max_open=1) as r:
        for j in (5, 12, 2):                  # a first open deep in the dataset, then jumps: no scan
            r.get_many([r.shard_boundaries[j], r.shard_boundaries[j] + 1])
        time.sleep(0.5)
        cached = {j for j in range(N_SHARDS) if r.cache.is_cached(j)}
        assert cached == {5, 12, 2}, cached


def test_read_ahead_starts_with_the_first_shard_and_skips_one_downloading_elsewhere(local_manifest, s3,
                                                                                    tmp_path):
    """While the first shard asked for is still on its way (here: another process holds its
    download lock), the next shards already arrive; a shard another process is downloading is
    skipped by read-ahead, which goes on to the one after it."""
    import fcntl
    import threading

    url = publish(local_manifest, s3)
    with open_store(url, cache_dir=str(tmp_path / "c"), read_ahead=2, max_open=1) as r:
        c = r.cache
        lock0 = os.path.join(c.root, "locks", c.shards[0].key + ".dl")
        lock1 = os.path.join(c.root, "locks", c.shards[1].key + ".dl")
        fds = []
        for path in (lock0, lock1):                  # "another process" downloading shards 0 and 1
            fd = os.open(path, os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            fds.append(fd)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("rec", r.get(0)), daemon=True)
        t.start()
        try:
            assert _wait_cached(c, [2])              # read ahead while the demand for 0 waits
            assert not c.is_cached(0) and not c.is_cached(1) and t.is_alive()
        finally:
            for fd in fds:
                os.close(fd)                         # "the other process" gives up: no files
        t.join(timeout=30)
        assert not t.is_alive() and got["rec"].index == 0 and c.is_cached(0)
        with open_store(local_manifest) as loc:
            assert got["rec"].data == loc.get(0).data


# ---------------------------------------------------------------------------------------------
# ds[i] by ranged reads (the extents publish writes beside each LMDB shard)
# ---------------------------------------------------------------------------------------------
def test_one_record_is_read_by_ranges_without_its_shard(local_manifest, s3_faults, tmp_path):
    """``ds[i]`` of a shard not on this node reads that record's bytes by ranged GETs (pinned to
    the shard's ETag), never the shard; a second read in the same shard brings the whole shard."""
    from packer.jobs.publish import publish_manifest
    from readers import StoreDataset

    s3, proxy = s3_faults
    url = s3.url("r/train.packer-manifest.json")
    publish_manifest(local_manifest, url)
    doc = json.loads(s3.get("r/train.packer-manifest.json"))
    assert all(s["extents"]["file"] == "data.mdb" for s in doc["shards"])
    shard_size = doc["shards"][7]["files"][0]["size"]
    with open_store(local_manifest) as loc:
        want = [loc.get(i) for i in range(len(loc))]
    proxy.counts.clear()
    proxy.bytes_out = 0
    ds = StoreDataset(url, cache_dir=str(tmp_path / "c"))
    i = ds.reader.shard_boundaries[7] + 2
    img, label = ds[i]
    ref_img, ref_label = StoreDataset(local_manifest)[i]
    assert img.equal(ref_img) and label == ref_label
    stats = ds.reader.cache.stats
    assert stats["downloads"] == 0 and stats["ranged"] == 1
    assert not any(ds.reader.cache.is_cached(j) for j in range(N_SHARDS))
    # the manifest (HEAD + GET), the extents table, one or two ranges of data.mdb: no shard
    assert proxy.counts["GET"] <= 4 and proxy.bytes_out < shard_size, (dict(proxy.counts), proxy.bytes_out)
    rec = ds.reader.get(i + 1)                     # a second read in shard 7: the whole shard
    assert rec.data == want[i + 1].data and ds.reader.cache.is_cached(7) and stats["ranged"] == 1
    time.sleep(0.3)                                # a lone shard deep in the dataset: no read-ahead
    assert stats["downloads"] == 1, stats
    for j in (0, 12):                              # and the records read by ranges are whole
        k = ds.reader.shard_boundaries[j] + 1
        r2 = open_store(url, cache_dir=str(tmp_path / f"c{j}"))
        got = r2.get(k)
        assert (got.key, got.data, got.label, got.index) == (want[k].key, want[k].data, want[k].label, k)
        assert r2.cache.stats["ranged"] == 1 and r2.cache.stats["downloads"] == 0
        r2.close()
    ds.close()


def test_damaged_or_wrong_extents_never_hand_over_wrong_bytes(local_manifest, s3, tmp_path):
    """Extents changed in the bucket (ETag) are refused by the pin; extents that point at other
    bytes (a hand-edited manifest with a matching checksum) give an error naming the record, and
    ``verify`` on the URL reports them."""
    import io

    import numpy as np
    import xxhash

    from packer.core.errors import RecordError
    from packer.jobs.publish import publish_manifest

    url = s3.url("d/train.packer-manifest.json")
    publish_manifest(local_manifest, url)
    doc = json.loads(s3.get("d/train.packer-manifest.json"))
    ext = doc["shards"][3]["extents"]
    key = f"d/{ext['name']}"
    table = np.load(io.BytesIO(s3.get(key)))
    bad = table.copy()
    bad[:, 0], bad[:, 2] = table[:, 2], table[:, 0]   # metadata and image swapped
    buf = io.BytesIO()
    np.save(buf, bad)
    s3.put(key, buf.getvalue())                     # changed behind the manifest's back
    with open_store(url, cache_dir=str(tmp_path / "a")) as r:
        with pytest.raises(RemoteError, match="changed"):
            r.get(r.shard_boundaries[3])
    # a hand-edited manifest that vouches for the wrong table
    info = remote.stat(s3.url(key))
    doc["shards"][3]["extents"].update(size=info.size, etag=info.version,
                                       xxh3_128=xxhash.xxh3_128_hexdigest(buf.getvalue()))
    s3.put("d/train.packer-manifest.json", json.dumps(doc).encode())
    with open_store(url, cache_dir=str(tmp_path / "b")) as r:
        with pytest.raises(RecordError, match="record metadata is not valid JSON") as err:
            r.get(r.shard_boundaries[3])
        assert r.shard_location(3) in str(err.value)      # names the shard and the record
    rep = packer.verify(url)
    assert not rep.ok and any("extents do not match" in str(p) for p in rep.problems), rep.problems


def test_a_manifest_that_shrinks_a_files_size_is_an_error_naming_both(local_manifest, s3, tmp_path):
    """A hand-edited manifest listing a shard file smaller than it is: a record read by ranges
    whose extents lie past that size fails, naming the file, the size the manifest lists and
    both suspects (the extents or the manifest); ``verify`` on the URL reports it."""
    from packer.jobs.publish import publish_manifest

    url = s3.url("e/train.packer-manifest.json")
    publish_manifest(local_manifest, url)
    doc = json.loads(s3.get("e/train.packer-manifest.json"))
    f = doc["shards"][2]["files"][0]
    f["size"] = 1234
    s3.put("e/train.packer-manifest.json", json.dumps(doc).encode())
    with open_store(url, cache_dir=str(tmp_path / "c")) as r:
        with pytest.raises(StoreError) as err:
            r.get(r.shard_boundaries[2])
    msg = str(err.value)
    assert f["name"] in msg and "1234 bytes, as the manifest lists it" in msg and "manifest's size" in msg
    assert not packer.verify(url).ok


@pytest.mark.parametrize("read_ahead", [0, 2])
def test_a_scan_in_manifest_order_with_half_a_cache_downloads_half_again(local_manifest, s3, tmp_path,
                                                                          monkeypatch, read_ahead):
    """No plan, a plain sequential scan each epoch (the DataLoader without a sampler) and a cache
    of half the dataset: eviction by the scan's next use keeps half of it, so each later epoch
    downloads about half (LRU would download all of it again under a repeated scan). Measured:
    epochs 2/3 downloaded 778240/716800 (read_ahead 0) and 712704/847872 to 782336/999424
    (read_ahead 2, which holds two shards of the room) bytes of 1421312."""
    url = publish(local_manifest, s3)
    sizes = shard_bytes(url)
    total, f = sum(sizes), 0.5
    limit = int(f * total)

    class Scan:
        def set_epoch(self, e):
            pass

        def __iter__(self):
            return iter(range(4 * N_SHARDS))

    with open_store(url, cache_dir=str(tmp_path / "c"), cache_limit=limit, read_ahead=read_ahead) as r:
        per_epoch = _epochs(r, Scan(), 3, limit, False, monkeypatch, tmp_path / "arrivals")
    assert per_epoch[0] >= total - max(sizes)
    # read-ahead holds read_ahead shards of the cache's room; LRU would fetch 2 x total again
    assert sum(per_epoch[1:]) <= 2 * ((1 - f) * total + (read_ahead + 1) * max(sizes)), (per_epoch, total)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("read_ahead", [0, 2])
def test_many_workers_without_a_plan_share_a_cache_that_holds_one_process(local_manifest, s3, tmp_path,
                                                                          monkeypatch, read_ahead):
    """Four DataLoader workers, a plain sequential sampler (no plan, and each worker's shards four
    apart, too far apart to be taken for a scan) and a cache that holds what one process may pin
    (the smallest limit accepted): four workers keeping their open shards would pin 16 of the 20
    shards, more than fits, and in-order delivery leaves workers idle, pins held, while another
    waits for room. It used to end each epoch in "no room in the cache ... held by shards in use
    by other processes" (10 workers, a cache of half the dataset on the H200). A process that
    finds no room closes what it has open, and asks the others (through their read-ahead threads)
    to do the same: every record once per epoch, the folder never above its limit."""
    import torch

    from readers import StoreDataset

    url = publish(local_manifest, s3)
    largest = max(shard_bytes(url))
    limit = largest * (read_ahead + 4) + (4 << 10)     # one process's pins (max_open 4), no more
    ds = StoreDataset(url, cache_dir=str(tmp_path / "c"), cache_limit=limit, return_key=True,
                      reader_options={"read_ahead": read_ahead})
    arrivals = _record_arrivals(monkeypatch, tmp_path / "arrivals")   # the workers' downloads too
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=4, collate_fn=list,
                                         multiprocessing_context="fork", persistent_workers=True)
    for _ in range(2):
        keys = [k for batch in loader for _, _, k in batch]
        assert sorted(keys) == sorted(_keys(local_manifest))
        assert folder_bytes(tmp_path / "c") <= limit
    del loader    # its persistent workers go now, not while the next test runs
    sizes = arrivals()
    assert sizes and max(sizes) <= limit, (max(sizes), limit)
