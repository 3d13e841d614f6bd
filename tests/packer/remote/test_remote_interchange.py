"""``packer build`` of another stack's dataset in a bucket (WebDataset shards, MDS, TFRecord; Hugging
Face datasets in tests/packer/remote/test_remote_hf.py) against the S3 test server (moto on
loopback): each dataset is written locally by its own library (webdataset, tfrecord; MDS by the
hand-written writer of the fixtures), uploaded, and the store built from the bucket equals the one
built from the local copy (keys, labels, bytes, checksums). Plus: a shard replaced mid-build, a
truncated shard, throttling and resets, the requests a build costs, resume by ETag, storage_options
reaching every read."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

import packer
from packer.core import remote
from packer.core.errors import SourceError
from packer.jobs.inputs import gather_sources
from packer.jobs.options import BuildOptions
from packer.stores import open_store
from tests.interchange_fixtures import jpegs
from tests.interchange_fixtures import same_store as _same_store
from tests.s3_support import options_from_env, spy_read_options

pytestmark = pytest.mark.s3

wds = pytest.importorskip("webdataset")


def _upload(bucket, root: Path, prefix: str) -> None:
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            bucket.put(prefix + p.relative_to(root).as_posix(), p.read_bytes())


def _write_wds(folder: Path, n: int = 30, per_shard: int = 10, *, seed: int = 1, gz: bool = False) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    images = jpegs(n, seed)
    pattern = str(folder / ("data-%06d.tar" + (".gz" if gz else "")))
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as sink:
        for i, img in enumerate(images):
            sink.write({"__key__": f"s{i:05d}", "jpg": img, "cls": str(i % 3).encode()})
    (folder / "classes.txt").write_text("cat\ndog\nfox\n")
    return sorted(p.name for p in folder.iterdir() if ".tar" in p.name)


# ---------------------------------------------------------------------------------------------
# WebDataset
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_webdataset_from_a_bucket_equals_the_local_build(s3, tmp_path, gz):
    """A prefix of shards, a brace pattern and one shard: the same store as the local dataset."""
    shards = _write_wds(tmp_path / "wds", gz=gz)
    _upload(s3, tmp_path / "wds", "shards/")
    ext = ".tar.gz" if gz else ".tar"
    local = packer.build(str(tmp_path / "wds"), None, str(tmp_path / "local.lmdb"), workers=1)
    assert local.published and local.records == 30
    for i, src in enumerate([s3.url("shards/"), s3.url("shards/data-{000000..000002}" + ext)]):
        out = tmp_path / f"remote{i}.lmdb"
        rep = packer.build(src, None, str(out), workers=2)
        assert rep.published and rep.records == 30, rep.rejected
        _same_store(tmp_path / "local.lmdb", out)
        with open_store(out) as r:
            assert r.metadata.class_names == ["cat", "dog", "fox"]
    one = packer.build(s3.url("shards/" + shards[1]), None, str(tmp_path / "one.lmdb"), workers=1,
                       source_format="webdataset")
    assert one.published and one.records == 10
    sources = gather_sources(s3.url("shards/"), None, BuildOptions())
    want = ("bytes",) if gz else ("range", s3.url("shards/" + shards[0]))
    assert sources.locators[0][:len(want)] == want
    if not gz:   # pinned: (range, url, offset, size, ETag)
        assert sources.locators[0][4] == remote.stat(s3.url("shards/" + shards[0])).version
    assert [f[0] for f in sources.shard_fingerprint] == [s3.url("shards/" + s) for s in shards]
    assert all(f[2] == remote.stat(f[0]).version for f in sources.shard_fingerprint)


def test_webdataset_missing_shards_of_a_pattern_are_named(s3, tmp_path):
    _write_wds(tmp_path / "wds", n=20)
    _upload(s3, tmp_path / "wds", "shards/")
    rep = packer.build(s3.url("shards/data-{000000..000002}.tar"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert not rep.published
    assert [(r["path"], r["reason"]) for r in rep.rejected] == [(s3.url("shards/data-000002.tar"), "no such shard")]
    rep = packer.build(s3.url("shards/data-{000000..000002}.tar"), None, str(tmp_path / "o.lmdb"), workers=1,
                       on_corrupt="skip")
    assert rep.published and rep.records == 20


def test_truncated_remote_shard_is_named_like_a_local_one(s3, tmp_path):
    _write_wds(tmp_path / "wds")
    path = tmp_path / "wds" / "data-000001.tar"
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2])
    _upload(s3, tmp_path / "wds", "shards/")
    local = packer.build(str(tmp_path / "wds"), None, str(tmp_path / "l.lmdb"), workers=1)
    rem = packer.build(s3.url("shards/"), None, str(tmp_path / "r.lmdb"), workers=1)
    assert not local.published and not rem.published
    assert [(r["path"], r["reason"]) for r in rem.rejected] == [(r["path"], r["reason"]) for r in local.rejected]
    assert any(r["path"].startswith("data-000001.tar:") and "cut short" in r["reason"] for r in rem.rejected)


def test_a_shard_replaced_mid_build_is_an_error_naming_it(s3, tmp_path, monkeypatch):
    """The scan pins each shard's ETag; the workers' ranged reads of a shard replaced since then
    fail naming it (never a member of the new shard under the old offsets)."""
    _write_wds(tmp_path / "wds")
    _upload(s3, tmp_path / "wds", "shards/")
    from packer.jobs import pack as pack_mod
    real = pack_mod.plan_build

    def plan_then_replace(*a, **kw):
        plan = real(*a, **kw)
        s3.put("shards/data-000001.tar", (tmp_path / "wds" / "data-000002.tar").read_bytes())
        return plan
    monkeypatch.setattr(pack_mod, "plan_build", plan_then_replace)
    rep = packer.build(s3.url("shards/"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert not rep.published
    bad = [r for r in rep.rejected if r["path"].startswith("data-000001.tar:")]
    assert len(bad) == 10 and len(rep.rejected) == 10
    assert all(s3.url("shards/data-000001.tar") in r["reason"] and "changed since it was opened" in r["reason"]
               for r in bad), bad[0]


def test_throttling_and_resets_are_retried_and_requests_are_bounded(s3_faults, tmp_path):
    """Scan: each shard streamed once in READ_AHEAD chunks (ceil(size / chunk) GETs a shard, one
    LIST); workers: one ranged GET per image; throttling and resets on the way are retried."""
    s3, proxy = s3_faults
    _write_wds(tmp_path / "wds", n=30, per_shard=10)
    _upload(s3, tmp_path / "wds", "shards/")
    sizes = [p.stat().st_size for p in sorted((tmp_path / "wds").glob("*.tar"))]
    proxy.counts.clear()
    gather_sources(s3.url("shards/"), None, BuildOptions())
    chunk = remote.READ_AHEAD
    scan_gets = sum(math.ceil(s / chunk) for s in sizes)
    # one LIST tells the format, one lists the shards (and finds classes.txt beside them)
    assert proxy.counts["LIST"] == 2 and proxy.counts.get("HEAD", 0) <= 1, dict(proxy.counts)   # classes.txt
    assert scan_gets <= proxy.counts["GET"] <= scan_gets + 1 + 3, dict(proxy.counts)   # + classes.txt
    proxy.counts.clear()
    proxy.fail(3, 503, "SlowDown", only="GET")
    proxy.reset(2, only="GET")
    rep = packer.build(s3.url("shards/"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert rep.published and rep.records == 30, rep.rejected
    # the scan again (+ throttled/reset retries) and one GET per image
    assert proxy.counts["GET"] <= scan_gets + 2 + 30 + 5 + 2, dict(proxy.counts)
    assert proxy.bytes_out < 2 * sum(sizes) + 64 * 1024


def test_storage_options_reach_every_read_of_a_dataset(s3, tmp_path, monkeypatch):
    """packer.build(..., storage_options=...) reaches the scan's reads and the workers' ranged
    reads (with no endpoint in the environment, only storage_options reach the server)."""
    _write_wds(tmp_path / "wds", n=12, per_shard=6)
    _upload(s3, tmp_path / "wds", "shards/")
    opts = options_from_env()
    seen = spy_read_options(monkeypatch)
    rep = packer.build(s3.url("shards/"), None, str(tmp_path / "o.lmdb"), workers=1, executor="thread",
                       storage_options=opts)
    assert rep.published and rep.records == 12
    assert len(seen) >= 2 + 12 and all(o == opts for o in seen)
    assert "secret" not in json.dumps(json.loads(Path(str(tmp_path / "o.lmdb") + ".report.json").read_text()))


def test_resume_fingerprint_is_url_size_etag(s3, tmp_path):
    """Same shards: the same fingerprint (a killed build resumes); a replaced shard: another."""
    from packer.jobs.steps import fingerprint
    _write_wds(tmp_path / "wds", n=12, per_shard=6)
    _upload(s3, tmp_path / "wds", "shards/")
    fp = [fingerprint("lmdb", gather_sources(s3.url("shards/"), None, BuildOptions()), {}) for _ in range(2)]
    assert fp[0] == fp[1]
    s3.put("shards/data-000001.tar", (tmp_path / "wds" / "data-000000.tar").read_bytes())
    assert fingerprint("lmdb", gather_sources(s3.url("shards/"), None, BuildOptions()), {}) != fp[0]


# ---------------------------------------------------------------------------------------------
# TFRecord, MDS
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_tfrecord_from_a_bucket_equals_the_local_build(s3, tmp_path, gz):
    tfrecord = pytest.importorskip("tfrecord")
    images = jpegs(12, seed=5)
    folder = tmp_path / "tf"
    folder.mkdir()
    for j in range(2):
        plain = folder / f"train.tfrecord-0000{j}-of-00002"
        w = tfrecord.TFRecordWriter(str(plain))
        for i in range(j, 12, 2):
            w.write({"image/encoded": (images[i], "byte"), "image/filename": (f"img_{i:03d}.jpg".encode(), "byte"),
                     "image/class/label": (i % 4, "int")})
        w.close()
        if gz:
            plain.with_name(plain.name + ".gz").write_bytes(gzip.compress(plain.read_bytes()))
            plain.unlink()
    _upload(s3, folder, "tf/")
    local = packer.build(str(folder), None, str(tmp_path / "local.lmdb"), workers=1)
    assert local.published and local.records == 12
    suffix = ".gz" if gz else ""
    for i, src in enumerate([s3.url("tf/"), s3.url("tf/train.tfrecord-0000{0..1}-of-00002" + suffix)]):
        rep = packer.build(src, None, str(tmp_path / f"r{i}.lmdb"), workers=2)
        assert rep.published and rep.records == 12, rep.rejected
        _same_store(tmp_path / "local.lmdb", tmp_path / f"r{i}.lmdb")
    sources = gather_sources(s3.url("tf/"), None, BuildOptions())
    assert {loc[0] for loc in sources.locators} == ({"bytes"} if gz else {"range"})
    assert sources.shard_fingerprint[0][0] == s3.url("tf/train.tfrecord-00000-of-00002" + suffix)
    # a file cut short is named as locally
    raw = (folder / f"train.tfrecord-00001-of-00002{suffix}").read_bytes()
    cut = raw[:len(raw) - 40] if not gz else gzip.compress(gzip.decompress(raw)[:-40])
    (folder / f"train.tfrecord-00001-of-00002{suffix}").write_bytes(cut)
    s3.put(f"tf/train.tfrecord-00001-of-00002{suffix}", cut)
    a = packer.build(str(folder), None, str(tmp_path / "lc.lmdb"), workers=1)
    b = packer.build(s3.url("tf/"), None, str(tmp_path / "rc.lmdb"), workers=1)
    assert not a.published and [(r["path"], r["reason"]) for r in a.rejected] == \
        [(r["path"], r["reason"]) for r in b.rejected]


@pytest.mark.parametrize("compressed", [False, True])
def test_mds_from_a_bucket_equals_the_local_build(s3, tmp_path, compressed):
    from tests.interchange_fixtures import mds_shard, write_mds
    images, labels = jpegs(9, seed=7), [i % 3 for i in range(9)]
    zipped = gzip.compress(mds_shard(images, labels)) if compressed else None
    write_mds(tmp_path / "mds", images, labels, compression="gz" if compressed else None, zipped=zipped,
              raw_file=not compressed)
    (tmp_path / "mds" / "classes.txt").write_text("a\nb\nc\n")
    _upload(s3, tmp_path / "mds", "mds/")
    local = packer.build(str(tmp_path / "mds"), None, str(tmp_path / "local.lmdb"), workers=1)
    assert local.published and local.records == 9, local.rejected
    for i, src in enumerate([s3.url("mds/"), s3.url("mds/index.json")]):
        rep = packer.build(src, None, str(tmp_path / f"r{i}.lmdb"), workers=2)
        assert rep.published and rep.records == 9, rep.rejected
        _same_store(tmp_path / "local.lmdb", tmp_path / f"r{i}.lmdb")
    sources = gather_sources(s3.url("mds/"), None, BuildOptions())
    assert {loc[0] for loc in sources.locators} == ({"bytes"} if compressed else {"range"})
    # a shard whose hash does not match the index is refused by name, as locally
    name = "shard.00000.mds" + (".gz" if compressed else "")
    data = bytearray((tmp_path / "mds" / name).read_bytes())
    data[-3] ^= 0xFF
    (tmp_path / "mds" / name).write_bytes(bytes(data))
    s3.put("mds/" + name, bytes(data))
    with pytest.raises(SourceError) as err:
        packer.build(s3.url("mds/"), None, str(tmp_path / "bad.lmdb"), workers=1)
    assert any(name in p and "does not match" in p for p in err.value.problems), err.value.problems

