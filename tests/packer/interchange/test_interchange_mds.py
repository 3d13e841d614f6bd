"""MosaicML MDS in and out (issue 28), checked with mosaicml-streaming on the other side.

Datasets are written by ``streaming.MDSWriter`` and scanned by packer; stores exported by packer
are read back by ``streaming.StreamingDataset(local=...)``; damaged datasets are made from writer
output. Set PACKER_REQUIRE_MDS=1 to fail (not skip) without mosaicml-streaming.
"""
from __future__ import annotations

import gc
import io
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# mosaicml-streaming imports torchvision and transformers, and pins transformers<5 against
# datasets 5: scripts/install.sh installs it where torchvision is, and scripts/test.sh then sets
# PACKER_REQUIRE_MDS=1.
if os.environ.get("PACKER_REQUIRE_MDS") == "1":
    import streaming
else:
    streaming = pytest.importorskip("streaming", reason="mosaicml-streaming (needs torchvision) is not installed")

from packer.core.errors import SourceError, UsageError
from packer.core.records import labels_equal
from packer.interchange.base import ExportOptions, ScanOptions, read_locator
from packer.interchange.mds import FORMAT
from packer.stores import open_store
from tests.interchange_fixtures import check_export_refusals, check_round_trip, dataset_store, jpegs

pytestmark = pytest.mark.timeout(180)


def _pngs(n: int) -> list:
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", (10 + i, 7), (i * 20, 5, 200)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def _write(folder: Path, columns: dict, samples: list, per_shard: int = 1000, **kw) -> Path:
    """An MDS dataset by streaming's own writer, ``per_shard`` samples a shard (flushed as
    MDSWriter.write does when its size_limit is reached)."""
    kw.setdefault("hashes", ["sha1", "xxh64"])
    with streaming.MDSWriter(out=str(folder), columns=columns, size_limit=None, **kw) as w:
        for i, s in enumerate(samples, 1):
            w.write(s)
            if i % per_shard == 0 and i < len(samples):
                w.flush_shard()
                w._reset_cache()
    return folder


def _shards(folder: Path) -> list:
    return [s["raw_data"]["basename"] for s in json.loads((folder / "index.json").read_text())["shards"]]


def _streaming_samples(folder: Path) -> list:
    """Every sample as StreamingDataset (local, no remote) gives it, in order."""
    ds = streaming.StreamingDataset(local=str(folder), remote=None, shuffle=False, batch_size=1)
    try:
        return [ds[i] for i in range(len(ds))]
    finally:
        del ds
        gc.collect()
        streaming.base.util.clean_stale_shared_memory()


def _image_bytes(img) -> bytes:
    """The file bytes a StreamingDataset 'jpeg'/'png' column was opened from (PIL keeps its BytesIO)."""
    return img.fp.getvalue()


# ------------------------------------------------------------------------------------- scan


def test_scan_class_ids_from_mds_writer(tmp_path):
    imgs = jpegs(7)
    src = _write(tmp_path / "src", {"image": "jpeg", "label": "int", "caption": "str"},
                 [{"image": b, "label": i % 3, "caption": f"photo {i}"} for i, b in enumerate(imgs)], per_shard=3)
    (src / "classes.json").write_text(json.dumps(["cat", "dog", "bird"]))
    assert FORMAT.detect(str(src)) and FORMAT.detect(str(src / "index.json"))
    scan = FORMAT.scan(str(src), ScanOptions())
    assert scan.problems == []
    assert scan.keys == [f"{i:08d}.jpg" for i in range(7)]
    assert [read_locator(loc) for loc in scan.locators] == imgs
    assert all(loc[0] == "range" for loc in scan.locators)
    assert scan.labels == [i % 3 for i in range(7)]
    assert scan.label_schema == "class" and scan.class_names == ["cat", "dog", "bird"]
    assert scan.label_source == "mds label (int) + classes.json"
    assert scan.displays[4] == "shard.00001.mds:sample 1"
    assert [os.path.basename(f[0]) for f in scan.fingerprint] == [
        "index.json", "shard.00000.mds", "shard.00001.mds", "shard.00002.mds", "classes.json"]
    # sample i of the scan is sample i of StreamingDataset
    got = _streaming_samples(src)
    assert [s["label"] for s in got] == scan.labels
    assert [_image_bytes(s["image"]) for s in got] == imgs


def _rows(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [np.c_[rng.integers(0, 5, (k, 1)), rng.uniform(0.1, 0.9, (k, 4))].astype(np.float32) for k in (2, 0, 1, 3)]


@pytest.mark.parametrize("form", ["json-boxes", "json-rows", "json-class", "str", "str_int", "uint8", "coco",
                                  "none"])
def test_scan_label_forms(tmp_path, form):
    imgs, rows = jpegs(4), _rows(3)
    names = ["emu", "cat", "emu", "ant"]
    columns = {"image": "jpeg"}
    label = {"json-boxes": "json", "json-rows": "json", "json-class": "json", "str": "str", "str_int": "str_int",
             "uint8": "uint8"}.get(form)
    if label:
        columns["label"] = label
    if form == "coco":   # streaming's own COCO converter's columns (vision/convert/coco.py)
        columns.update({"bbox_sizes": "ndarray:float32", "bbox_labels": "ndarray:int64"})
    samples = []
    for i, b in enumerate(imgs):
        s = {"image": b}
        r = [[float(v) for v in row] for row in rows[i]]
        if form == "json-boxes":
            s["label"] = {"boxes": r}
        elif form == "json-rows":
            s["label"] = r
        elif form == "json-class":
            s["label"] = {"class": i, "caption": "x"}
        elif form == "str":
            s["label"] = names[i]
        elif form in ("str_int", "uint8"):
            s["label"] = i
        elif form == "coco":
            k = max(len(rows[i]), 1)
            ltrb = np.random.default_rng(i).uniform(0, 0.5, (k, 4)).astype(np.float32)
            ltrb[:, 2:] += 0.4
            s["bbox_sizes"], s["bbox_labels"] = ltrb, np.arange(1, k + 1, dtype=np.int64)
        samples.append(s)
    src = _write(tmp_path / "src", columns, samples, per_shard=3)
    scan = FORMAT.scan(str(src))
    assert scan.problems == []
    if form in ("json-boxes", "json-rows"):
        assert scan.label_schema == "boxes"
        for got, want in zip(scan.labels, rows):
            assert got.dtype == np.float32 and got.shape == (len(want), 5) and np.array_equal(got, want)
    elif form == "coco":
        assert scan.label_schema == "boxes"
        for got, s in zip(scan.labels, samples):
            l, t, r, b = (s["bbox_sizes"].astype(np.float64).T)
            want = np.c_[s["bbox_labels"], (l + r) / 2, (t + b) / 2, r - l, b - t].astype(np.float32)
            assert np.array_equal(got, want)
    elif form == "str":
        assert scan.label_schema == "class" and scan.class_names == ["ant", "cat", "emu"]
        assert scan.labels == [2, 1, 2, 0]
    elif form == "none":
        assert scan.label_schema == "none" and scan.labels == [None] * 4
    else:
        assert scan.label_schema == "class" and scan.labels == [0, 1, 2, 3]


@pytest.mark.parametrize("encoding", ["jpeg", "png", "bytes", "pil"])
def test_scan_image_encodings(tmp_path, encoding):
    imgs = jpegs(3) if encoding in ("jpeg", "bytes") else _pngs(3)
    column = "img" if encoding == "bytes" else "picture"
    value = [Image.open(io.BytesIO(b)) for b in imgs] if encoding == "pil" else imgs
    src = _write(tmp_path / "src", {column: encoding, "label": "int"},
                 [{column: v, "label": i} for i, v in enumerate(value)], per_shard=2)
    scan = FORMAT.scan(str(src))
    assert scan.problems == [] and scan.labels == [0, 1, 2]
    if encoding != "pil":
        assert [read_locator(loc) for loc in scan.locators] == imgs
        assert scan.keys == [f"{i:08d}.{'png' if encoding == 'png' else 'jpg'}" for i in range(3)]
        return
    # pil: raw pixels, re-encoded as PNG; the pixels are those streaming's own decoder gives
    assert scan.keys == [f"{i:08d}.png" for i in range(3)]
    assert all(loc[0] == "bytes" and loc[1].startswith(b"\x89PNG") for loc in scan.locators)
    theirs = [np.asarray(s[column]) for s in _streaming_samples(src)]
    ours = [np.asarray(Image.open(io.BytesIO(read_locator(loc)))) for loc in scan.locators]
    assert all(np.array_equal(a, b) for a, b in zip(theirs, ours))
    assert all(np.array_equal(a, np.asarray(Image.open(io.BytesIO(b)))) for a, b in zip(ours, imgs))


@pytest.mark.parametrize("compression", ["zstd", "gz", "bz2", "br:5", "snappy"])
def test_scan_compressed_shards(tmp_path, compression):
    imgs = jpegs(5)
    src = _write(tmp_path / "src", {"image": "jpeg", "label": "int"},
                 [{"image": b, "label": i} for i, b in enumerate(imgs)], per_shard=2, compression=compression)
    assert not list(src.glob("*.mds"))    # only the compressed files
    scan = FORMAT.scan(str(src))
    assert scan.problems == [] and scan.labels == list(range(5))
    assert all(loc[0] == "bytes" for loc in scan.locators)
    assert [read_locator(loc) for loc in scan.locators] == imgs
    # StreamingDataset's local cache decompresses next to them: then the raw files are read by range
    assert len(_streaming_samples(src)) == 5
    if list(src.glob("*.mds")):
        again = FORMAT.scan(str(src))
        assert again.problems == [] and all(loc[0] == "range" for loc in again.locators)
        assert [read_locator(loc) for loc in again.locators] == imgs


def test_scan_key_and_metadata_columns(tmp_path):
    imgs = jpegs(4)
    keys = ["a/x.jpg", "b.jpg", "c d.jpg", "a/y.JPEG"]
    src = _write(tmp_path / "s1", {"image": "jpeg", "key": "str", "metadata": "json"},
                 [{"image": b, "key": k, "metadata": {"n": i}} for i, (b, k) in enumerate(zip(imgs, keys))])
    scan = FORMAT.scan(str(src))
    assert scan.keys == keys and scan.metadata == [{"n": i} for i in range(4)]
    # a repeated or unsafe key: every sample is keyed by its index instead
    for bad in ("b.jpg", "../up.jpg"):
        src = _write(tmp_path / f"s-{bad[:2]}", {"image": "jpeg", "key": "str"},
                     [{"image": b, "key": k} for b, k in zip(imgs, keys[:3] + [bad])])
        assert FORMAT.scan(str(src)).keys == [f"{i:08d}.jpg" for i in range(4)]


def test_scan_splits_and_detect(tmp_path):
    imgs = jpegs(4)
    for split, part in (("train", imgs[:3]), ("val", imgs[3:])):
        _write(tmp_path / "ds" / split, {"image": "jpeg", "label": "int"}, [{"image": b, "label": 0} for b in part])
    assert FORMAT.detect(str(tmp_path / "ds"))
    val = FORMAT.scan(str(tmp_path / "ds"), ScanOptions(split="val"))
    assert [read_locator(loc) for loc in val.locators] == imgs[3:]
    with pytest.raises(UsageError, match="several MDS splits.*train, val"):
        FORMAT.scan(str(tmp_path / "ds"))
    with pytest.raises(UsageError, match="no split 'test'"):
        FORMAT.scan(str(tmp_path / "ds"), ScanOptions(split="test"))
    assert len(FORMAT.scan(str(tmp_path / "ds" / "train")).keys) == 3


def test_detect_is_false_for_other_data(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(jpegs(1)[0])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index.json").write_text(json.dumps({"version": 2, "shards": [{"format": "json"}]}))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "index.json").write_bytes(os.urandom(5000))
    for p in ("imgs", "imgs/a.jpg", "other", "bin", "missing", "data-{000..003}.tar"):
        assert FORMAT.detect(str(tmp_path / p)) is False


def test_scan_unlabeled_sample_is_a_problem_unless_allowed(tmp_path):
    imgs = jpegs(4)
    src = _write(tmp_path / "i", {"image": "jpeg", "label": "int"},
                 [{"image": b, "label": -1 if i == 2 else i} for i, b in enumerate(imgs)], per_shard=2)
    scan = FORMAT.scan(str(src))
    assert [(p["path"], p["kind"]) for p in scan.problems] == [("shard.00001.mds:sample 0", "unlabeled")]
    assert "--allow-unlabeled" in scan.problems[0]["reason"] and len(scan.keys) == 3
    scan = FORMAT.scan(str(src), ScanOptions(allow_unlabeled=True))
    assert scan.problems == [] and scan.labels == [0, 1, -1, 3]
    src = _write(tmp_path / "j", {"image": "jpeg", "label": "json"},
                 [{"image": b, "label": None if i == 1 else {"boxes": [[0, .5, .5, .2, .2]]}}
                  for i, b in enumerate(imgs)])
    scan = FORMAT.scan(str(src), ScanOptions(allow_unlabeled=True))
    assert scan.label_schema == "boxes" and scan.labels[1] is None and scan.labels[0].shape == (1, 5)


def test_scan_column_choice(tmp_path):
    imgs = jpegs(2)
    src = _write(tmp_path / "two", {"a": "jpeg", "b": "png", "label": "int"},
                 [{"a": j, "b": p, "label": 1} for j, p in zip(imgs, _pngs(2))])
    with pytest.raises(UsageError, match="several image columns.*--image-column"):
        FORMAT.scan(str(src))
    assert [read_locator(loc) for loc in FORMAT.scan(str(src), ScanOptions(image_column="a")).locators] == imgs
    with pytest.raises(UsageError, match="--label-column 'a' is encoded 'jpeg'"):
        FORMAT.scan(str(src), ScanOptions(image_column="a", label_column="a"))
    src = _write(tmp_path / "none", {"uid": "bytes", "n": "int"}, [{"uid": b"x", "n": 1}])
    with pytest.raises(UsageError, match="no image column"):
        FORMAT.scan(str(src))


@pytest.mark.timeout(300)
def test_scan_holds_no_image_bytes(tmp_path):
    """3000 samples of 16 KiB: the scan's peak Python memory stays far below the 47 MiB of images."""
    blob = os.urandom(16 << 10)
    src = _write(tmp_path / "big", {"image": "jpeg", "label": "int"},
                 [{"image": b"\xff\xd8\xff" + blob[i % 64:] + blob[:i % 64], "label": i % 10} for i in range(3000)],
                 per_shard=1000)
    tracemalloc.start()
    try:
        scan = FORMAT.scan(str(src))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(scan.keys) == 3000 and scan.problems == []
    assert read_locator(scan.locators[2999])[3:7] == blob[2999 % 64:][:4]
    assert peak < 8 << 20, f"scan peak {peak} bytes"


# ------------------------------------------------------------------------------------- damage


def _three_shards(tmp_path, **kw) -> tuple:
    imgs = jpegs(9)
    src = _write(tmp_path / "s", {"image": "jpeg", "label": "int"},
                 [{"image": b, "label": i % 3} for i, b in enumerate(imgs)], per_shard=3, **kw)
    return src, imgs


def test_shard_whose_hash_does_not_match_is_named_and_the_rest_kept(tmp_path):
    src, imgs = _three_shards(tmp_path)
    loc = FORMAT.scan(str(src)).locators[4]          # shard 1, sample 1
    with open(loc[1], "r+b") as fh:                  # one bit flipped inside its JPEG: same size
        fh.seek(loc[2] + loc[3] // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 1]))
    scan = FORMAT.scan(str(src))
    assert len(scan.problems) == 1 and scan.problems[0]["path"] == "shard.00001.mds"
    assert "xxh64" in scan.problems[0]["reason"] and "does not match index.json" in scan.problems[0]["reason"]
    assert "3 sample(s) are left out" in scan.problems[0]["reason"]
    assert scan.keys == [f"{i:08d}.jpg" for i in (0, 1, 2, 6, 7, 8)]
    assert [read_locator(loc) for loc in scan.locators] == imgs[:3] + imgs[6:]
    # sha1 only in the index: checked with it
    index = json.loads((src / "index.json").read_text())
    for s in index["shards"]:
        s["raw_data"]["hashes"].pop("xxh64")
    (src / "index.json").write_text(json.dumps(index))
    assert "sha1" in FORMAT.scan(str(src)).problems[0]["reason"]


def test_missing_shard_keeps_the_others_and_their_keys(tmp_path):
    src, imgs = _three_shards(tmp_path)
    os.remove(src / "shard.00000.mds")
    scan = FORMAT.scan(str(src))
    assert scan.problems == [{"path": "shard.00000.mds", "kind": "unreadable",
                              "reason": "listed in index.json but missing; its 3 sample(s) are left out"}]
    assert scan.keys == [f"{i:08d}.jpg" for i in range(3, 9)]
    assert [read_locator(loc) for loc in scan.locators] == imgs[3:]


def test_truncated_shard_keeps_the_samples_before_the_cut(tmp_path):
    src, imgs = _three_shards(tmp_path)
    last = src / "shard.00002.mds"
    locs = FORMAT.scan(str(src)).locators
    with open(last, "r+b") as fh:
        fh.truncate(locs[7][2] + 10)                 # inside sample 1 of the last shard
    scan = FORMAT.scan(str(src))
    paths = [p["path"] for p in scan.problems]
    assert paths == ["shard.00002.mds", "shard.00002.mds:sample 1", "shard.00002.mds:sample 2"]
    assert "its hash cannot be checked" in scan.problems[0]["reason"]   # the shard itself is damaged
    assert all("cut short: the shard holds" in p["reason"] for p in scan.problems[1:])
    assert [read_locator(loc) for loc in scan.locators] == imgs[:7]
    with open(last, "r+b") as fh:                    # now inside the offset table
        fh.truncate(9)
    scan = FORMAT.scan(str(src))
    assert [p["path"] for p in scan.problems] == ["shard.00002.mds", "shard.00002.mds"]
    assert "bad shard header" in scan.problems[1]["reason"] and len(scan.keys) == 6


def test_damaged_compressed_shard(tmp_path):
    src, imgs = _three_shards(tmp_path, compression="zstd", hashes=None)
    z = src / "shard.00001.mds.zstd"
    z.write_bytes(b"\0\0\0\0" + z.read_bytes()[4:])       # no zstd frame (same size, no hash)
    cut = src / "shard.00002.mds.zstd"
    cut.write_bytes(cut.read_bytes()[:-7])
    scan = FORMAT.scan(str(src))
    assert [p["path"] for p in scan.problems] == ["shard.00001.mds.zstd", "shard.00002.mds.zstd"]
    assert "does not decompress as zstd" in scan.problems[0]["reason"]
    assert "bytes, index.json says" in scan.problems[1]["reason"]
    assert [read_locator(loc) for loc in scan.locators] == imgs[:3]
    src, _ = _three_shards(tmp_path / "h", compression="zstd")
    z = src / "shard.00002.mds.zstd"
    z.write_bytes(z.read_bytes()[:-1] + bytes([z.read_bytes()[-1] ^ 1]))
    scan = FORMAT.scan(str(src))
    assert [p["path"] for p in scan.problems] == ["shard.00002.mds.zstd"] and "xxh64" in scan.problems[0]["reason"]


def test_bad_sample_and_label_are_named_and_the_rest_kept(tmp_path):
    imgs = jpegs(4)
    src = _write(tmp_path / "s", {"image": "jpeg", "label": "json"},
                 [{"image": b, "label": {"class": i}} for i, b in enumerate(imgs)], hashes=None)
    shard = src / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    locs = FORMAT.scan(str(src)).locators
    # sample 1: its image size field says one byte more (the columns no longer add up)
    size_at = locs[1][2] - 8
    data[size_at:size_at + 4] = (locs[1][3] + 1).to_bytes(4, "little")
    # sample 3: its JSON label broken (same length)
    at = data.index(b'{"class": 3}')
    data[at:at + 1] = b"["
    shard.write_bytes(bytes(data))
    scan = FORMAT.scan(str(src))
    assert [p["path"] for p in scan.problems] == ["shard.00000.mds:sample 1", "shard.00000.mds:sample 3"]
    assert "columns take" in scan.problems[0]["reason"]
    assert scan.labels == [0, 2] and [read_locator(loc) for loc in scan.locators] == [imgs[0], imgs[2]]


def test_bad_index(tmp_path):
    src, _ = _three_shards(tmp_path)
    index = json.loads((src / "index.json").read_text())
    index["shards"][1]["raw_data"]["basename"] = "../../etc/passwd"
    (src / "index.json").write_text(json.dumps(index))
    scan = FORMAT.scan(str(src))
    assert [p["path"] for p in scan.problems] == ["index.json:shards[1]"] and "'..'" in scan.problems[0]["reason"]
    assert scan.keys == [f"{i:08d}.jpg" for i in (0, 1, 2, 6, 7, 8)]
    (src / "index.json").write_text('{"version": 2, "shards": [')
    with pytest.raises(SourceError, match="index.json: cannot read the MDS index"):
        FORMAT.scan(str(src))
    (src / "index.json").write_text(json.dumps({"version": 1, "shards": []}))
    with pytest.raises(SourceError, match="not an MDS index of version 2"):
        FORMAT.scan(str(src))
    with pytest.raises(UsageError, match="no index.json"):
        FORMAT.scan(str(tmp_path))


# ------------------------------------------------------------------------------------- export


def _store(tmp_path, kind: str, n: int = 13, **build) -> str:
    loc = str(tmp_path / f"{kind}{'.h5' if build.get('format') == 'hdf5' else '.lmdb'}")
    return dataset_store(tmp_path / kind, kind, loc, n=n, **build)


def _check_read_back(reader, out: Path, shard_size: int) -> None:
    """StreamingDataset gives every record's bytes, key, label and metadata."""
    meta = reader.metadata
    index = json.loads((out / "index.json").read_text())
    assert [s["samples"] for s in index["shards"]] == [min(shard_size, meta.count - i)
                                                       for i in range(0, meta.count, shard_size)]
    samples = _streaming_samples(out)
    assert len(samples) == meta.count
    for i, s in enumerate(samples):
        rec = reader.get(i)
        assert s["key"] == rec.key and s["metadata"] == rec.metadata
        if reader.encoding == "raw":
            pixels = np.frombuffer(bytes(rec.data), np.uint8).reshape(reader.raw_shape)
            assert np.array_equal(np.asarray(s["image"]), pixels)
        else:
            assert _image_bytes(s["image"]) == bytes(rec.data) and s["image"].format == "JPEG"
        if meta.label_schema == "class":
            assert s["label"] == rec.label
        elif meta.label_schema == "boxes":
            rows = np.asarray(s["label"]["boxes"], np.float32).reshape(-1, 5)
            assert labels_equal(rows, rec.label)
        elif meta.label_schema == "objects":
            assert s["label"] == rec.label
        else:
            assert "label" not in s
    names = json.loads((out / "classes.json").read_text()) if (out / "classes.json").exists() else []
    assert names == list(meta.class_names)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["boxes", "classes", "coco"])
def test_export_read_by_streaming_and_scanned_back(tmp_path, kind):
    loc = _store(tmp_path, kind)
    out = tmp_path / "mds"
    with open_store(loc) as reader:
        result = FORMAT.export(reader, out, ExportOptions(shard_size=5))
        assert result.records == reader.metadata.count
        assert result.shards == [str(out / n) for n in _shards(out)]
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["index.json", *_shards(out)] + (["classes.json"] if reader.metadata.class_names else []))
        assert FORMAT.detect(str(out))
        _check_read_back(reader, out, 5)
        check_round_trip(FORMAT, reader, out, byte_ranges=True)


@pytest.mark.timeout(300)
def test_export_of_decoded_pixels_is_png(tmp_path):
    loc = _store(tmp_path, "classes", n=5, format="hdf5", store_options={"pixels": "24x16"})
    out = tmp_path / "mds"
    with open_store(loc) as reader:
        assert reader.encoding == "raw"
        result = FORMAT.export(reader, out, ExportOptions(shard_size=2))
        assert any("lossless PNG" in n for n in result.notes)
        assert json.loads((out / "index.json").read_text())["shards"][0]["column_encodings"][0] == "png"
        _check_read_back(reader, out, 2)


def test_export_refuses_bad_output_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    loc = _store(tmp_path, "classes", n=9)
    import packer.interchange.mds.writer as mod
    with open_store(loc) as reader:
        check_export_refusals(FORMAT, reader, tmp_path, monkeypatch, mod, "_sample")
