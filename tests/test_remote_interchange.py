"""``packer build`` of another stack's dataset in a bucket (WebDataset shards, Hugging Face parquet,
MDS, TFRecord) against the S3 test server (moto on loopback): each dataset is written locally by its
own library (webdataset, datasets, tfrecord; MDS by the hand-written writer of the fixtures),
uploaded, and the store built from the bucket equals the one built from the local copy (keys,
labels, bytes, checksums). Plus: a shard replaced mid-build, a truncated shard, throttling and
resets, the requests a build costs, resume by ETag, storage_options reaching every read."""
from __future__ import annotations

import gzip
import io
import json
import math
import tarfile
from pathlib import Path

import pytest

import packer
from packer.core import remote
from packer.core.errors import SourceError
from packer.core.records import label_to_json
from packer.jobs.inputs import gather_sources
from packer.jobs.options import BuildOptions
from packer.stores import open_store
from tests.interchange_fixtures import jpegs

pytestmark = pytest.mark.s3

wds = pytest.importorskip("webdataset")


def _upload(bucket, root: Path, prefix: str) -> None:
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            bucket.put(prefix + p.relative_to(root).as_posix(), p.read_bytes())


def _records(store) -> list:
    with open_store(store) as r:
        return [(x.key, bytes(x.data), json.dumps(label_to_json(x.label)), x.checksum, x.source_checksum)
                for x in r.get_many(range(r.metadata.count))]


def _same_store(a, b) -> None:
    """Two stores hold the same records, labels, class names and index checksum."""
    with open_store(a) as ra, open_store(b) as rb:
        ma, mb = ra.metadata, rb.metadata
        assert ma.count == mb.count and ma.index_checksum == mb.index_checksum
        assert ma.class_names == mb.class_names and ma.label_schema == mb.label_schema
    assert _records(a) == _records(b)


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
