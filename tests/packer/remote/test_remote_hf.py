"""``packer build`` of a Hugging Face dataset in a bucket, against the S3 test server (moto on
loopback): datasets written locally by the ``datasets`` library (``save_to_disk`` folders, a
``DatasetDict``, parquet in the hub layout; ClassLabel, Image, COCO ``objects``), uploaded with
:func:`packer.core.remote.upload`, and the store built from the bucket equals the one built from
the local copy (keys, bytes, labels, class names, record checksums, index checksum). Plus: damage
named by file and row as locally, a file replaced mid-build named, requests and bytes bounded
(fault proxy counts), throttling retried, storage_options and pins carried by the lazy locators,
resume by (URL, size, ETag)."""
from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.core import remote
from packer.core.errors import SourceError, UsageError
from packer.interchange import ScanOptions, get_format, read_locator
from packer.jobs.inputs import gather_sources
from packer.jobs.options import BuildOptions
from tests.interchange_fixtures import jpegs, parquet_chunk, same_store, store_rows
from tests.s3_support import options_from_env, spy_read_options

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]

if os.environ.get("PACKER_REQUIRE_INTERCHANGE") == "1":
    import datasets  # noqa: F401
else:
    try:
        import datasets  # noqa: F401
    except ImportError as exc:   # e.g. a huggingface_hub that this datasets does not take
        pytest.skip(f"the datasets library cannot be imported: {exc}", allow_module_level=True)

from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Sequence, Value  # noqa: E402

HF = get_format("hf")
NAMES = ["bird", "cat", "dog"]


def _images(n: int = 12, seed: int = 11) -> list:
    """``(name, jpeg bytes, (w, h))`` of ``n`` generated JPEGs."""
    import cv2

    out = []
    for i, data in enumerate(jpegs(n, seed)):
        h, w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2]
        out.append((f"img_{i:03d}.jpg", data, (w, h)))
    return out


def _class_ds(images, paths: bool = True) -> Dataset:
    feats = Features({"image": Image(), "label": ClassLabel(names=NAMES)})
    return Dataset.from_dict({"image": [{"bytes": d, "path": n if paths else None} for n, d, _ in images],
                              "label": [i % 3 for i in range(len(images))]}, features=feats)


def _box_ds(images) -> Dataset:
    objects = Sequence({"bbox": Sequence(Value("float32"), length=4), "category": ClassLabel(names=NAMES)})
    rows = [{"bbox": [[w * 0.25, h * 0.5, w * 0.5, h * 0.25], [0, 0, w, h]], "category": [2, i % 3]}
            if i % 4 else {"bbox": [], "category": []} for i, (_, _, (w, h)) in enumerate(images)]
    return Dataset.from_dict({"image": [{"bytes": d, "path": None} for _, d, _ in images], "objects": rows},
                             features=Features({"image": Image(), "objects": objects}))


def _hub(ds: Dataset, root: Path, shards: int = 3, test: int = 0) -> list:
    """``ds`` as the hub layout under ``root``: ``data/train-0000i-of-0000N.parquet`` (and the
    last ``test`` rows as ``data/test-00000-of-00001.parquet``); the train file names."""
    data = root / "data"
    n = len(ds) - test
    bounds = [round(i * n / shards) for i in range(shards + 1)]
    names = []
    for i in range(shards):
        names.append(f"train-{i:05d}-of-{shards:05d}.parquet")
        ds.select(range(bounds[i], bounds[i + 1])).to_parquet(str(data / names[-1]), batch_size=3)
    if test:
        ds.select(range(n, len(ds))).to_parquet(str(data / "test-00000-of-00001.parquet"))
    return names


def _upload(root: Path, url: str) -> dict:
    """Every file under ``root`` to the prefix ``url`` with remote.upload; URL -> ObjectInfo."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            dest = remote.join(url, p.relative_to(root).as_posix())
            out[dest] = remote.upload(str(p), dest)
    return out


def _build(src, out: Path, **kw):
    rep = packer.build(src, None, str(out), **{"workers": 1, **kw})
    assert rep.published, rep.rejected
    return rep


# ---------------------------------------------------------------------------------------------
# The same store as from the local copy
# ---------------------------------------------------------------------------------------------
def test_save_to_disk_from_a_bucket_equals_the_local_build(s3, tmp_path):
    """A ``save_to_disk`` folder (two arrow files): byte-range locators pinned to each file's
    ETag, read by the workers; keys from the image paths, ClassLabel names, identical store."""
    images = _images()
    _class_ds(images).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    uploaded = _upload(tmp_path / "saved", s3.url("saved/"))
    local = _build(str(tmp_path / "saved"), tmp_path / "local.lmdb")
    assert local.records == len(images)
    for i, src in enumerate([s3.url("saved/"), s3.url("saved")]):
        _build(src, tmp_path / f"r{i}.lmdb", workers=2)
        same_store(tmp_path / "local.lmdb", tmp_path / f"r{i}.lmdb")
    assert [k for k, *_ in store_rows(tmp_path / "r0.lmdb")] == [n for n, _, _ in images]
    sources = gather_sources(s3.url("saved/"), None, BuildOptions())
    arrow = s3.url("saved/data-00000-of-00002.arrow")
    loc = sources.task_input(0)
    assert loc[:2] == ("range", arrow) and loc[4] == uploaded[arrow].version and len(loc) == 5
    assert read_locator(loc) == images[0][1]
    assert sources.class_names == NAMES and sources.displays[0] == "data-00000-of-00002.arrow:row 0"
    assert [tuple(f) for f in sources.shard_fingerprint] == [
        (u, uploaded[u].size, uploaded[u].version) for u in sorted(uploaded) if u.endswith(".arrow")]


def test_dataset_dict_from_a_bucket_picks_the_split(s3, tmp_path):
    images = _images()
    ds = _class_ds(images)
    DatasetDict({"train": ds.select(range(8)), "validation": ds.select(range(8, 12))}).save_to_disk(
        str(tmp_path / "dd"))
    _upload(tmp_path / "dd", s3.url("dd/"))
    for split in ("train", "validation"):
        _build(str(tmp_path / "dd"), tmp_path / f"l-{split}.lmdb", split=split)
        _build(s3.url("dd/"), tmp_path / f"r-{split}.lmdb", split=split)
        same_store(tmp_path / f"l-{split}.lmdb", tmp_path / f"r-{split}.lmdb")
    scan = HF.scan(s3.url("dd/"), ScanOptions(split="validation"))
    assert scan.displays[0] == "validation/data-00000-of-00001.arrow:row 0"
    with pytest.raises(UsageError, match="no split 'test'; splits: train, validation"):
        HF.scan(s3.url("dd/"), ScanOptions(split="test"))


@pytest.mark.parametrize("kind", ["classes", "boxes"])
def test_parquet_hub_layout_from_a_bucket_equals_the_local_build(s3, tmp_path, kind):
    """The hub layout as a prefix, one file, a glob and a brace pattern: the same store as the
    local copy (ClassLabel names from the features metadata; COCO objects as YOLO rows)."""
    images = _images()
    ds = _class_ds(images, paths=False) if kind == "classes" else _box_ds(images)
    names = _hub(ds, tmp_path / "repo", shards=3, test=3)
    _upload(tmp_path / "repo", s3.url("repo/"))
    local = _build(str(tmp_path / "repo"), tmp_path / "local.lmdb")
    assert local.records == 9
    for i, src in enumerate([s3.url("repo/"), s3.url("repo/data/train-*.parquet"),
                             s3.url("repo/data/train-{00000..00002}-of-00003.parquet")]):
        _build(src, tmp_path / f"r{i}.lmdb", workers=2)
        same_store(tmp_path / "local.lmdb", tmp_path / f"r{i}.lmdb")
    with packer.open_store(str(tmp_path / "r0.lmdb")) as r:
        assert r.metadata.class_names == NAMES
        assert r.metadata.label_schema == ("class" if kind == "classes" else "boxes")
    one_local = _build(str(tmp_path / "repo/data" / names[1]), tmp_path / "one-l.lmdb")
    one = _build(s3.url("repo/data/" + names[1]), tmp_path / "one-r.lmdb")
    assert one.records == one_local.records == 3
    same_store(tmp_path / "one-l.lmdb", tmp_path / "one-r.lmdb")
    assert HF.detect(s3.url("repo/")) and HF.detect(s3.url("repo/data/" + names[0]))
    assert not HF.detect(s3.url("nothing/")) and not HF.detect(s3.url("repo/data/none-*.parquet"))
    test = HF.scan(s3.url("repo/"), ScanOptions(split="test"))
    assert test.keys == ["test/0.jpg", "test/1.jpg", "test/2.jpg"]
    assert [read_locator(loc) for loc in test.locators] == [d for _, d, _ in images[9:]]


def test_lazy_locators_carry_the_pin_and_open_the_object_where_they_are_read(s3, tmp_path):
    """Parquet rows are read lazily: each entry carries (URL, size, ETag) and storage_options,
    never an open file; a pickled slice (what a worker or a Dask task gets) opens the object
    itself and reads the same bytes, one footer read per file, not per row group."""
    images = _images()
    _hub(_class_ds(images, paths=False), tmp_path / "repo", shards=2)
    uploaded = _upload(tmp_path / "repo", s3.url("repo/"))
    opts = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"], "key": os.environ["AWS_ACCESS_KEY_ID"],
            "secret": os.environ["AWS_SECRET_ACCESS_KEY"]}
    scan = HF.scan(s3.url("repo/"), ScanOptions(storage_options=opts))
    entry = scan.locators._entries[7]
    first = s3.url("repo/data/train-00001-of-00002.parquet")
    assert entry[:4] == ("parquet", first, 0, 1) and entry[4] == uploaded[first] and entry[5] == opts
    want = [d for _, d, _ in images]
    assert [read_locator(scan.locators[i]) for i in range(12)] == want
    part = pickle.loads(pickle.dumps(scan.locators[5:11]))
    assert part._open is None and part._cursor is None
    assert [read_locator(x) for x in part] == want[5:11]
    part.close()


# ---------------------------------------------------------------------------------------------
# Damage, changes, faults
# ---------------------------------------------------------------------------------------------
def test_damage_is_named_by_file_and_row_like_locally(s3, tmp_path):
    """An image the decode check rejects: ``train-00000-of-00001.parquet:row 1``; a corrupt page:
    the file and row group; a cut save_to_disk file: the record batch; all as locally."""
    from tests.interchange_fixtures import check_damage_named

    images = _images(6)
    bad = [(n, b"not a jpeg" if i == 1 else d, wh) for i, (n, d, wh) in enumerate(images[:3])]
    (tmp_path / "in").mkdir()
    _class_ds(bad, paths=False).to_parquet(str(tmp_path / "in" / "train-00000-of-00001.parquet"))
    _upload(tmp_path / "in", s3.url("in/"))
    check_damage_named(s3.url("in/"), tmp_path / "o.lmdb", "train-00000-of-00001.parquet:row 1")
    # a corrupt page header in row group 1 (rows 3-5), the others kept
    path = tmp_path / "pq" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    _class_ds(images).to_parquet(str(path), batch_size=3)
    start, _ = parquet_chunk(str(path), 1)
    raw = bytearray(path.read_bytes())
    raw[start:start + 16] = b"\xde\xad\xbe\xef" * 4
    path.write_bytes(bytes(raw))
    _upload(tmp_path / "pq", s3.url("pq/"))
    local, rem = HF.scan(str(tmp_path / "pq"), ScanOptions()), HF.scan(s3.url("pq/"), ScanOptions())
    assert rem.problems == local.problems and rem.keys == local.keys == [n for n, _, _ in images[:3]]
    assert rem.problems[0]["path"] == "train-00000-of-00001.parquet:row group 1"
    # a save_to_disk file cut short
    _class_ds(images).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    second = tmp_path / "saved" / "data-00001-of-00002.arrow"
    second.write_bytes(second.read_bytes()[: second.stat().st_size // 2])
    _upload(tmp_path / "saved", s3.url("saved/"))
    local, rem = HF.scan(str(tmp_path / "saved"), ScanOptions()), HF.scan(s3.url("saved/"), ScanOptions())
    assert rem.problems == local.problems and rem.keys == local.keys
    assert rem.problems[0]["path"] == "data-00001-of-00002.arrow:record batch 0"


def test_an_object_state_json_names_but_the_bucket_lacks_is_named(s3, tmp_path):
    images = _images()
    _class_ds(images).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    _upload(tmp_path / "saved", s3.url("saved/"))
    remote.delete(s3.url("saved/data-00001-of-00002.arrow"))
    scan = HF.scan(s3.url("saved/"), ScanOptions())
    assert len(scan.keys) == 6
    assert [(p["path"], "no such object" in p["reason"]) for p in scan.problems] == [
        ("data-00001-of-00002.arrow", True)]
    with pytest.raises(SourceError, match="no parquet or arrow object there"):
        HF.scan(s3.url("saved/nothing.parquet"), ScanOptions())


def _replace_after_plan(monkeypatch, bucket, key: str, data: bytes) -> None:
    from packer.jobs import pack as pack_mod
    real = pack_mod.plan_build

    def plan_then_replace(*a, **kw):
        plan = real(*a, **kw)
        bucket.put(key, data)
        return plan
    monkeypatch.setattr(pack_mod, "plan_build", plan_then_replace)


def test_a_parquet_file_replaced_mid_build_is_an_error_naming_it(s3, tmp_path, monkeypatch):
    """The lazy reads ask for the ETag the scan listed: the build stops with an error naming the
    file, never rows of the new file under the old row numbers."""
    images = _images()
    names = _hub(_class_ds(images, paths=False), tmp_path / "repo", shards=2)
    _upload(tmp_path / "repo", s3.url("repo/"))
    other = (tmp_path / "repo" / "data" / names[0]).read_bytes()
    _replace_after_plan(monkeypatch, s3, "repo/data/" + names[1], other)
    with pytest.raises(remote.RemoteError) as err:
        packer.build(s3.url("repo/"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert s3.url("repo/data/" + names[1]) in str(err.value) and "changed since it was opened" in str(err.value)
    assert not (tmp_path / "o.lmdb").exists()


def test_an_arrow_file_replaced_mid_build_is_named_for_each_of_its_images(s3, tmp_path, monkeypatch):
    images = _images()
    _class_ds(images).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    _upload(tmp_path / "saved", s3.url("saved/"))
    first = (tmp_path / "saved" / "data-00000-of-00002.arrow").read_bytes()
    _replace_after_plan(monkeypatch, s3, "saved/data-00001-of-00002.arrow", first)
    rep = packer.build(s3.url("saved/"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert not rep.published
    assert [r["path"] for r in rep.rejected] == [f"data-00001-of-00002.arrow:row {i}" for i in range(6, 12)]
    url = s3.url("saved/data-00001-of-00002.arrow")
    assert all(url in r["reason"] and "changed since it was opened" in r["reason"] for r in rep.rejected)


def test_requests_are_bounded_and_faults_retried(s3_faults, tmp_path, monkeypatch):
    """Scan: one LIST to tell the format, one to list the prefix; each parquet file streamed once
    in READ_AHEAD windows (its column chunks read in turns hit the windows already fetched);
    build: the lazy reads stream each file once more; throttling and resets are retried."""
    s3, proxy = s3_faults
    monkeypatch.setattr(remote, "READ_AHEAD", 64 << 10)
    from packer.sample import encode_jpeg
    rng = np.random.default_rng(0)
    big = [(f"{i:03d}.jpg", encode_jpeg(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8), quality=95), (96, 96))
           for i in range(60)]
    _hub(_class_ds(big, paths=False), tmp_path / "repo", shards=2)
    _upload(tmp_path / "repo", s3.url("repo/"))
    sizes = [p.stat().st_size for p in sorted((tmp_path / "repo" / "data").glob("*.parquet"))]
    assert min(sizes) > 4 * (64 << 10)   # several windows a file
    windows = sum(math.ceil(s / (64 << 10)) for s in sizes)
    proxy.counts.clear()
    proxy.bytes_out = 0
    gather_sources(s3.url("repo/"), None, BuildOptions())
    counts = dict(proxy.counts)
    assert counts.get("LIST") == 2 and counts.get("HEAD", 0) == 0, counts
    # per file: the footer, then the row groups' column chunks, each byte fetched about once
    assert counts["GET"] <= windows + 2 * len(sizes) * 3, (counts, windows)
    assert proxy.bytes_out < 1.5 * sum(sizes) + 64 * 1024, (proxy.bytes_out, sum(sizes))
    proxy.counts.clear()
    proxy.fail(3, 503, "SlowDown", only="GET")
    proxy.reset(2, only="GET")
    rep = packer.build(s3.url("repo/"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert rep.published and rep.records == 60, rep.rejected
    assert proxy.counts["GET"] <= 2 * (windows + 2 * len(sizes) * 3) + 5, dict(proxy.counts)
    _build(str(tmp_path / "repo"), tmp_path / "local.lmdb")
    same_store(tmp_path / "local.lmdb", tmp_path / "o.lmdb")


def test_storage_options_reach_the_lazy_reads_and_stay_out_of_the_report(s3, tmp_path, monkeypatch):
    images = _images()
    _hub(_class_ds(images, paths=False), tmp_path / "repo", shards=2)
    _upload(tmp_path / "repo", s3.url("repo/"))
    opts = options_from_env()
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)   # only storage_options reach the server now
    seen = spy_read_options(monkeypatch)
    rep = packer.build(s3.url("repo/"), None, str(tmp_path / "o.lmdb"), workers=1, executor="thread",
                       storage_options=opts)
    assert rep.published and rep.records == 12
    assert len(seen) >= 4 and all(o == opts for o in seen)
    assert opts["secret"] not in Path(str(tmp_path / "o.lmdb") + ".report.json").read_text()


def test_resume_fingerprint_is_url_size_etag(s3, tmp_path):
    """Same files: the same fingerprint (a killed build resumes); a replaced file: another."""
    from packer.jobs.steps import fingerprint
    images = _images()
    names = _hub(_class_ds(images, paths=False), tmp_path / "repo", shards=2)
    uploaded = _upload(tmp_path / "repo", s3.url("repo/"))
    sources = gather_sources(s3.url("repo/"), None, BuildOptions())
    assert [tuple(f) for f in sources.shard_fingerprint] == [(u, i.size, i.version) for u, i in uploaded.items()]
    fp = fingerprint("lmdb", sources, {})
    assert fingerprint("lmdb", gather_sources(s3.url("repo/"), None, BuildOptions()), {}) == fp
    s3.put("repo/data/" + names[1], (tmp_path / "repo" / "data" / names[0]).read_bytes())
    assert fingerprint("lmdb", gather_sources(s3.url("repo/"), None, BuildOptions()), {}) != fp
    assert json.dumps(sources.shard_fingerprint)   # plain data: written into the resume state


def test_a_server_gone_during_the_scan_stops_it_naming_the_file(s3_faults, tmp_path, monkeypatch):
    """A file the server stops serving once listed (throttled past the retry budget) is no damage
    to list: one RemoteError names it, and no store is written."""
    from packer.interchange.hf import reader
    s3, proxy = s3_faults
    names = _hub(_class_ds(_images(), paths=False), tmp_path / "repo", shards=2)
    _upload(tmp_path / "repo", s3.url("repo/"))
    real = reader.url_layout

    def listed_then_throttled(*a, **kw):
        layout = real(*a, **kw)
        proxy.fail(1000, 503, "SlowDown")
        return layout
    monkeypatch.setattr(reader, "url_layout", listed_then_throttled)
    with pytest.raises(remote.RemoteError) as err:
        packer.build(s3.url("repo/"), None, str(tmp_path / "o.lmdb"), workers=1)
    assert s3.url("repo/data/" + names[0]) in str(err.value) and err.value.transient
    assert not (tmp_path / "o.lmdb").exists()


@pytest.mark.dask
@pytest.mark.timeout(400)
def test_dask_build_of_parquet_in_a_bucket_equals_local(s3, tmp_path):
    """Each shard task gets its slice of the lazy locators (pins, no open file) and reads its
    rows from the bucket on its worker: the manifest holds the local build's records."""
    if os.environ.get("PACKER_REQUIRE_DASK") != "1":
        pytest.importorskip("dask.distributed")
    _hub(_class_ds(_images(), paths=False), tmp_path / "repo", shards=3)
    _upload(tmp_path / "repo", s3.url("repo/"))
    _build(str(tmp_path / "repo"), tmp_path / "local.lmdb")
    manifest = tmp_path / "train.packer-manifest.json"
    rep = packer.build(s3.url("repo/"), None, str(manifest), engine="dask", shards=2, n_workers=1,
                       connect_timeout=120)
    assert rep.published, rep.to_dict()
    assert store_rows(str(manifest)) == store_rows(tmp_path / "local.lmdb")
