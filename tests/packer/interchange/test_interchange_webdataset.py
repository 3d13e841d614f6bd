"""WebDataset in and out (issue 28), checked with the webdataset library on the other side.

Shards are written by ``webdataset.ShardWriter`` / ``TarWriter`` and scanned by packer; stores
exported by packer are read back by ``webdataset.WebDataset``; damaged shards are made from
writer output. Set PACKER_REQUIRE_INTERCHANGE=1 to fail (not skip) without webdataset.
"""
from __future__ import annotations

import json
import os
import tarfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("PACKER_REQUIRE_INTERCHANGE") == "1":
    import webdataset as wds
else:
    wds = pytest.importorskip("webdataset")

import packer
from packer.core.records import labels_equal
from packer.interchange.base import ExportOptions, ScanOptions, read_locator
from packer.interchange.webdataset import FORMAT
from packer.sample import make_dataset, synthetic_image
from packer.stores import open_store
from tests.interchange_fixtures import check_export_refusals, check_round_trip, dataset_store, jpegs

pytestmark = pytest.mark.timeout(120)


def _write(folder: Path, samples: list, maxcount: int = 1000) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "data-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for s in samples:
            sink.write(s)
    return sorted(str(p) for p in folder.glob("*.tar"))


def _wds_samples(urls) -> list:
    """What webdataset itself reads: raw bytes per field, in order."""
    return list(wds.WebDataset(list(urls), shardshuffle=False, empty_check=False))


def _members(shard) -> list:
    with tarfile.open(shard) as tf:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tf.getmembers()]


# ------------------------------------------------------------------------------------- scan


def test_scan_class_ids_from_shard_writer(tmp_path):
    imgs = jpegs(7)
    _write(tmp_path / "src", [{"__key__": f"train/s{i:03d}", "jpg": b, "cls": i % 3,
                               "json": {"caption": f"image {i}", "width": 24}, "txt": f"a photo {i}"}
                              for i, b in enumerate(imgs)], maxcount=3)
    (tmp_path / "src" / "classes.txt").write_text("cat\ndog\nbird\n")
    scan = FORMAT.scan(str(tmp_path / "src"), ScanOptions())
    assert scan.problems == []
    assert scan.keys == [f"train/s{i:03d}.jpg" for i in range(7)]
    assert [read_locator(loc) for loc in scan.locators] == imgs
    assert all(loc[0] == "range" for loc in scan.locators)
    assert scan.labels == [i % 3 for i in range(7)]
    assert scan.label_schema == "class" and scan.class_names == ["cat", "dog", "bird"]
    assert scan.displays[3] == "data-000001.tar:train/s003.jpg"
    assert [f[0] for f in scan.fingerprint] == ["data-000000.tar", "data-000001.tar", "data-000002.tar"]
    # the same keys webdataset's own grouping gives
    keys = [s["__key__"] + ".jpg" for s in _wds_samples(sorted(map(str, (tmp_path / "src").glob("*.tar"))))]
    assert keys == scan.keys


def test_scan_class_names_in_cls(tmp_path):
    names = ["dog", "cat", "dog", "emu", "cat"]
    _write(tmp_path, [{"__key__": f"k{i}", "jpg": b, "cls": n} for i, (b, n) in enumerate(zip(jpegs(5), names))])
    scan = FORMAT.scan(str(tmp_path / "data-000000.tar"))
    assert scan.problems == []
    assert scan.class_names == ["cat", "dog", "emu"]
    assert scan.labels == [1, 0, 1, 2, 0]


@pytest.mark.parametrize("form", ["boxes", "rows", "class", "txt"])
def test_scan_json_and_txt_label_forms(tmp_path, form):
    rng = np.random.default_rng(3)
    imgs = jpegs(4)
    rows = [np.c_[rng.integers(0, 5, (k, 1)), rng.uniform(0.1, 0.9, (k, 4))].astype(np.float32) for k in (2, 0, 1, 3)]
    samples = []
    for i, b in enumerate(imgs):
        s = {"__key__": f"k{i}", "jpg": b}
        box_rows = [[float(v) for v in r] for r in rows[i]]
        if form == "boxes":
            s["json"] = {"boxes": box_rows}
        elif form == "rows":
            s["json"] = box_rows
        elif form == "class":
            s["json"] = {"class": i, "caption": "x"}
        else:
            s["txt"] = str(i)
        samples.append(s)
    _write(tmp_path, samples)
    scan = FORMAT.scan(str(tmp_path))
    assert scan.problems == []
    if form in ("boxes", "rows"):
        assert scan.label_schema == "boxes"
        for got, want in zip(scan.labels, rows):
            assert got.dtype == np.float32 and got.shape == (len(want), 5) and np.array_equal(got, want)
    else:
        assert scan.label_schema == "class" and scan.labels == [0, 1, 2, 3]


def test_scan_brace_pattern_file_and_folder_agree(tmp_path):
    _write(tmp_path / "s", [{"__key__": f"{i:04d}", "jpg": b, "cls": i} for i, b in enumerate(jpegs(6))], maxcount=2)
    by_folder = FORMAT.scan(str(tmp_path / "s"))
    by_pattern = FORMAT.scan(str(tmp_path / "s" / "data-{000000..000002}.tar"))
    one = FORMAT.scan(str(tmp_path / "s" / "data-000001.tar"))
    assert by_folder.keys == by_pattern.keys == [f"{i:04d}.jpg" for i in range(6)]
    assert by_folder.labels == by_pattern.labels
    assert one.keys == ["0002.jpg", "0003.jpg"]
    assert FORMAT.detect(str(tmp_path / "s")) and FORMAT.detect(str(tmp_path / "s" / "data-{000000..000002}.tar"))
    missing = FORMAT.scan(str(tmp_path / "s" / "data-{000000..000004}.tar"))
    assert missing.keys == by_folder.keys
    assert [p["path"] for p in missing.problems] == [str(tmp_path / "s" / f"data-00000{i}.tar") for i in (3, 4)]


def test_key_split_is_webdatasets_own():
    from webdataset.tariterators import base_plus_ext as theirs

    from packer.interchange.webdataset import base_plus_ext
    for name in ["a.jpg", "dir/a.b.JPG", "d.v2/x.seg.png", "a/.hidden.jpg", ".x.jpg", "noext", "a/b/",
                 "__meta__/x.jpg", "x.", "k y/é.txt", "a.tar.gz"]:
        assert base_plus_ext(name) == theirs(name), name


def test_image_and_label_column_options(tmp_path):
    a, b = jpegs(2)
    _write(tmp_path, [{"__key__": f"k{i}", "jpg": a, "thumb.jpg": b, "cls": 0, "cls2": f"{5 + i}"}
                      for i in range(2)])
    scan = FORMAT.scan(str(tmp_path), ScanOptions(image_column="thumb.jpg", label_column="cls2"))
    assert scan.problems == []
    assert scan.keys == ["k0.thumb.jpg", "k1.thumb.jpg"] and scan.labels == [5, 6]
    assert [read_locator(loc) for loc in scan.locators] == [b, b]


@pytest.mark.timeout(300)
def test_parallel_shard_scan_equals_serial(tmp_path, monkeypatch):
    import packer.interchange.webdataset.reader as mod
    _write(tmp_path, [{"__key__": f"{i:04d}", "jpg": b, "cls": i % 4} for i, b in enumerate(jpegs(12))], maxcount=3)
    serial = FORMAT.scan(str(tmp_path))
    monkeypatch.setattr(mod, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(mod.os, "cpu_count", lambda: 2)
    parallel = FORMAT.scan(str(tmp_path))
    assert parallel.keys == serial.keys and parallel.labels == serial.labels
    assert parallel.locators == serial.locators and parallel.problems == serial.problems == []


def test_detect_is_false_for_other_data(tmp_path):
    images, _ = make_dataset(tmp_path / "imgs", 3, kind="classes")
    (tmp_path / "notes.tar").write_text("not a tar at all\n" * 100)
    (tmp_path / "empty").mkdir()
    assert not FORMAT.detect(str(images))
    assert not FORMAT.detect(str(tmp_path / "notes.tar"))
    assert not FORMAT.detect(str(tmp_path / "empty"))
    assert not FORMAT.detect(str(tmp_path / "nothing-{0..3}.tar"))
    assert not FORMAT.detect(str(tmp_path / "bad-{0..3.tar"))


def test_scan_image_field_choice_case_and_grouping_like_webdataset(tmp_path):
    """Image priority (jpg, jpeg, png, webp), upper-case extensions, folders, dotted fields,
    __meta__ members and a repeated key: packer groups as webdataset does."""
    a, b, c = jpegs(3)
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 40
    shard = tmp_path / "mix.tar"
    with wds.TarWriter(str(shard), encoder=False) as tw:
        tw.write({"__key__": "x/one", "png": png, "jpg": a, "cls": b"1"})
        tw.write({"__key__": "two", "JPEG": b, "seg.png": png, "cls": b"0"})
        tw.write({"__key__": "three", "webp": c, "cls": b"2"})
        tw.write({"__key__": "__meta__/skip", "jpg": a, "cls": b"2"})
    scan = FORMAT.scan(str(shard))
    assert scan.problems == []
    assert scan.keys == ["x/one.jpg", "two.JPEG", "three.webp"]
    assert [read_locator(loc) for loc in scan.locators] == [a, b, c]
    assert [s["__key__"] for s in _wds_samples([str(shard)])] == ["x/one", "two", "three"]


def test_scan_unlabeled_sample_is_a_problem_unless_allowed(tmp_path):
    imgs = jpegs(4)
    _write(tmp_path, [{"__key__": f"k{i}", "jpg": b, **({"cls": i} if i != 2 else {"txt": "a caption"})}
                      for i, b in enumerate(imgs)])
    scan = FORMAT.scan(str(tmp_path))
    assert scan.keys == ["k0.jpg", "k1.jpg", "k3.jpg"]
    assert [p["path"] for p in scan.problems] == ["data-000000.tar:k2.jpg"]
    assert "without a label" in scan.problems[0]["reason"]
    allowed = FORMAT.scan(str(tmp_path), ScanOptions(allow_unlabeled=True))
    assert allowed.problems == [] and allowed.labels == [0, 1, None, 3]


def test_scan_sample_without_image_mixed_kinds_and_names_file(tmp_path):
    imgs = jpegs(5)
    _write(tmp_path, [
        {"__key__": "a", "jpg": imgs[0], "cls": 0},
        {"__key__": "b", "txt": "only text", "cls": 1},
        {"__key__": "c", "jpg": imgs[1], "json": {"boxes": [[0, 0.5, 0.5, 0.2, 0.2]]}},
        {"__key__": "d", "jpg": imgs[2], "cls": 1},
        {"__key__": "e", "jpg": imgs[3], "cls": 7},
        {"__key__": "f", "jpg": imgs[4], "cls": "dog"},
    ])
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    scan = FORMAT.scan(str(tmp_path))
    assert scan.keys == ["a.jpg", "d.jpg", "f.jpg"] and scan.labels == [0, 1, 1]
    assert scan.class_names == ["cat", "dog"]
    why = {p["path"]: p["reason"] for p in scan.problems}
    assert set(why) == {"data-000000.tar:b.cls", "data-000000.tar:c.jpg", "data-000000.tar:e.jpg"}
    assert "no image" in why["data-000000.tar:b.cls"]
    assert "boxes label" in why["data-000000.tar:c.jpg"]
    assert "classes.txt names 2" in why["data-000000.tar:e.jpg"]


def test_scan_keys_repeated_across_shards_get_the_shard_name(tmp_path):
    imgs = jpegs(4)
    _write(tmp_path / "s", [{"__key__": f"k{i % 2}", "jpg": b, "cls": i} for i, b in enumerate(imgs)], maxcount=2)
    scan = FORMAT.scan(str(tmp_path / "s"))
    assert scan.problems == []
    assert scan.keys == ["data-000000/k0.jpg", "data-000000/k1.jpg", "data-000001/k0.jpg", "data-000001/k1.jpg"]
    assert [read_locator(loc) for loc in scan.locators] == imgs


@pytest.mark.timeout(300)
def test_scan_holds_no_image_bytes(tmp_path):
    """3000 samples of 16 KiB: the scan's peak Python memory stays far below the 47 MiB of images."""
    blob = os.urandom(16 << 10)
    _write(tmp_path, [{"__key__": f"{i:06d}", "jpg": blob[i % 64:] + blob[:i % 64], "cls": i % 10}
                      for i in range(3000)], maxcount=1000)
    tracemalloc.start()
    try:
        scan = FORMAT.scan(str(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(scan.keys) == 3000 and scan.problems == []
    assert read_locator(scan.locators[2999])[:4] == blob[2999 % 64:][:4]
    assert peak < 8 << 20, f"scan peak {peak} bytes"


# ------------------------------------------------------------------------------------- damage


def _three_shards(tmp_path) -> tuple[list, list]:
    imgs = jpegs(9)
    shards = _write(tmp_path / "s", [{"__key__": f"k{i}", "jpg": b, "cls": i % 3} for i, b in enumerate(imgs)],
                    maxcount=3)
    return shards, imgs


def test_truncated_member_keeps_what_came_before(tmp_path):
    shards, imgs = _three_shards(tmp_path)
    name, _, data_at, size = [m for m in _members(shards[1]) if m[0] == "k4.jpg"][0]
    with open(shards[1], "r+b") as fh:
        fh.truncate(data_at + size // 2)
    scan = FORMAT.scan(str(tmp_path / "s"))
    assert scan.keys == ["k0.jpg", "k1.jpg", "k2.jpg", "k3.jpg", "k6.jpg", "k7.jpg", "k8.jpg"]
    assert [read_locator(loc) for loc in scan.locators] == imgs[:4] + imgs[6:]
    assert len(scan.problems) == 1
    assert scan.problems[0]["path"] == "data-000001.tar:k4.jpg"
    assert "cut short" in scan.problems[0]["reason"]


def test_truncated_label_member_drops_its_sample(tmp_path):
    shards, imgs = _three_shards(tmp_path)
    _, _, data_at, _ = [m for m in _members(shards[0]) if m[0] == "k2.cls"][0]
    with open(shards[0], "r+b") as fh:
        fh.truncate(data_at)                # k2.cls's header is there, its byte is not
    scan = FORMAT.scan(str(tmp_path / "s"))
    assert scan.keys == ["k0.jpg", "k1.jpg"] + [f"k{i}.jpg" for i in range(3, 9)]
    assert [read_locator(loc) for loc in scan.locators] == imgs[:2] + imgs[3:]
    assert [p["path"] for p in scan.problems] == ["data-000000.tar:k2.cls"]
    assert "cut short" in scan.problems[0]["reason"]


@pytest.mark.parametrize("which", ["pax", "ustar"])
def test_corrupt_header_is_named_and_other_shards_scanned(tmp_path, which):
    """webdataset's writer gives each member a PAX header (fractional mtime) then its ustar
    header: damage to either is found (tarfile itself stops silently at the first)."""
    shards, _ = _three_shards(tmp_path)
    _, header_at, data_at, _ = [m for m in _members(shards[1]) if m[0] == "k5.cls"][0]
    with open(shards[1], "r+b") as fh:
        fh.seek((header_at if which == "pax" else data_at - 512) + 148)    # the header checksum field
        fh.write(b"9999999\0")
    scan = FORMAT.scan(str(tmp_path / "s"))
    assert scan.keys == ["k0.jpg", "k1.jpg", "k2.jpg", "k3.jpg", "k4.jpg", "k6.jpg", "k7.jpg", "k8.jpg"]
    assert len(scan.problems) == 1
    assert scan.problems[0]["path"] == "data-000001.tar:k4.jpg"
    assert "corrupt tar header" in scan.problems[0]["reason"]
    assert ("k5.cls" if which == "ustar" else "PaxHeader") in scan.problems[0]["reason"]


def test_cut_at_a_member_boundary_and_inside_a_header(tmp_path):
    shards, _ = _three_shards(tmp_path)
    _, header_at, _, _ = [m for m in _members(shards[0]) if m[0] == "k2.cls"][0]
    _, header2_at, _, _ = [m for m in _members(shards[2]) if m[0] == "k7.cls"][0]
    with open(shards[0], "r+b") as fh:
        fh.truncate(header_at)              # right after k1's last member: no end blocks
    with open(shards[2], "r+b") as fh:
        fh.truncate(header2_at + 100)       # inside k7.cls's header
    scan = FORMAT.scan(str(tmp_path / "s"))
    # the sample before each cut may have lost members: left out, and said so
    assert scan.keys == ["k0.jpg", "k3.jpg", "k4.jpg", "k5.jpg"]
    why = {p["path"]: p["reason"] for p in scan.problems}
    assert "'k1' is left out" in why["data-000000.tar:k1.jpg"]
    assert set(why) == {"data-000000.tar:k1.jpg", "data-000002.tar:k6.jpg"}
    assert "end-of-archive" in why["data-000000.tar:k1.jpg"]
    assert "inside the header" in why["data-000002.tar:k6.jpg"]


def test_not_a_tar_gzip_and_unreadable_json(tmp_path):
    shards, _ = _three_shards(tmp_path)
    with open(shards[1], "wb") as fh:
        fh.write(b"\x1f\x8b" + b"\0" * 600)
    with open(shards[2], "wb") as fh:
        fh.write(b"hello, not a tar\n" * 64)
    with wds.TarWriter(str(tmp_path / "s" / "data-000003.tar"), encoder=False) as tw:
        tw.write({"__key__": "j", "jpg": jpegs(1)[0], "json": b"{not json"})
    scan = FORMAT.scan(str(tmp_path / "s"))
    assert scan.keys == ["k0.jpg", "k1.jpg", "k2.jpg"]
    why = {p["path"]: p["reason"] for p in scan.problems}
    assert "gzip" in why["data-000001.tar"] and "not a tar" in why["data-000002.tar"]
    assert "invalid JSON" in why["data-000003.tar:j.jpg"]


def test_duplicate_field_is_a_problem_as_webdataset_refuses_it(tmp_path):
    a, b = jpegs(2)
    shard = tmp_path / "dup.tar"
    with wds.TarWriter(str(shard), encoder=False) as tw:
        tw.write({"__key__": "k", "jpg": a, "cls": b"0"})
        tw.write({"__key__": "k", "jpg": b})
        tw.write({"__key__": "m", "jpg": b, "cls": b"1"})
    with pytest.raises(ValueError, match="duplicate"):
        _wds_samples([str(shard)])
    scan = FORMAT.scan(str(shard))
    assert scan.keys == ["m.jpg"]
    assert scan.problems[0]["path"] == "dup.tar:k.jpg" and "second 'jpg'" in scan.problems[0]["reason"]


def test_concatenated_tar_is_reported(tmp_path):
    shards, _ = _three_shards(tmp_path)
    with open(shards[0], "ab") as out, open(shards[1], "rb") as more:
        out.write(more.read())
    scan = FORMAT.scan(shards[0])
    assert scan.keys == ["k0.jpg", "k1.jpg", "k2.jpg"]
    assert "after the end-of-archive" in scan.problems[0]["reason"]


# ------------------------------------------------------------------------------------- export


def _store(tmp_path, location_for, kind: str, n: int = 13):
    return dataset_store(tmp_path / kind, kind, location_for(kind), n=n)


def _check_read_back(reader, out: Path, shard_size: int) -> None:
    meta = reader.metadata
    urls = sorted(str(p) for p in out.glob("*.tar"))
    assert len(urls) == -(-meta.count // shard_size)
    samples = _wds_samples(urls)
    assert len(samples) == meta.count
    for i, s in enumerate(samples):
        rec = reader.get(i)
        extra = json.loads(s["packer.json"]) if "packer.json" in s else {}
        assert extra.get("key", s["__key__"] + ".jpg") == rec.key
        assert s["jpg"] == bytes(rec.data)
        assert extra.get("metadata", {}) == rec.metadata
        if meta.label_schema == "class":
            assert int(s["cls"]) == rec.label
        elif meta.label_schema == "boxes":
            rows = np.asarray(json.loads(s["json"])["boxes"], np.float32).reshape(-1, 5)
            assert labels_equal(rows, rec.label)
        else:
            assert json.loads(s["json"]) == rec.label
    names = (out / "classes.txt").read_text().splitlines() if (out / "classes.txt").exists() else []
    assert names == list(meta.class_names)


@pytest.mark.parametrize("kind", ["boxes", "classes", "coco"])
def test_export_read_by_webdataset_and_scanned_back(tmp_path, location_for, kind):
    loc = _store(tmp_path, location_for, kind)
    out = tmp_path / "wds"
    with open_store(loc) as reader:
        result = FORMAT.export(reader, out, ExportOptions(shard_size=5))
        assert result.records == reader.metadata.count
        assert result.shards == sorted(str(p) for p in out.glob("data-*.tar"))
        assert not list(out.glob(".*"))                    # no staging folder left
        _check_read_back(reader, out, 5)
        check_round_trip(FORMAT, reader, out)


def test_export_keys_webdataset_cannot_spell(tmp_path, location_for):
    """Dotted names, upper-case and .jpeg extensions, a PNG input (stored as JPEG): keys survive
    in packer.json and every sample still has a .jpg webdataset decodes."""
    images, _ = make_dataset(tmp_path / "c", 6, kind="classes", seed=5)
    files = sorted(images.rglob("*.jpg"))
    files[0].rename(files[0].with_name("a.b.c.jpg"))
    files[1].rename(files[1].with_name("UPPER.JPG"))
    files[2].rename(files[2].with_name("x.jpeg"))
    import cv2
    cv2.imwrite(str(files[3].with_suffix(".png")), synthetic_image(np.random.default_rng(1), 20, 30))
    files[3].unlink()
    loc = location_for("odd")
    packer.build(images, None, loc, workers=1)
    out = tmp_path / "wds"
    with open_store(loc) as reader:
        result = FORMAT.export(reader, out, ExportOptions(shard_size=4))
        assert any("packer.json" in n for n in result.notes)
        _check_read_back(reader, out, 4)
        check_round_trip(FORMAT, reader, out)
        decoded = list(wds.WebDataset(result.shards, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls"))
        assert len(decoded) == reader.metadata.count and all(img.ndim == 3 for img, _ in decoded)


def test_export_class_names_that_lines_cannot_hold(tmp_path, location_for):
    images, _ = make_dataset(tmp_path / "c", 6, kind="boxes", seed=6)
    labels = tmp_path / "labels.json"
    names = ["two\nlines", "plain", "x y"]
    labels.write_text(json.dumps({p.relative_to(images).as_posix(): names[i % 3]
                                  for i, p in enumerate(sorted(images.rglob("*.jpg")))}))
    loc = location_for("names")
    packer.build(images, labels, loc, workers=1)
    out = tmp_path / "wds"
    with open_store(loc) as reader:
        FORMAT.export(reader, out, ExportOptions(shard_size=10))
        assert "two\nlines" in reader.metadata.class_names
        assert json.loads((out / "classes.json").read_text()) == list(reader.metadata.class_names)
        assert FORMAT.scan(str(out)).class_names == list(reader.metadata.class_names)


def test_export_refuses_bad_output_and_leaves_nothing_on_failure(tmp_path, location_for, monkeypatch):
    loc = _store(tmp_path, location_for, "classes", n=9)
    import packer.interchange.webdataset.writer as mod
    with open_store(loc) as reader:
        check_export_refusals(FORMAT, reader, tmp_path, monkeypatch, mod, "_record_sample")


# ------------------------------------------------------------------------------------- hostile keys


def _tar_of(path: Path, members: list) -> Path:
    """A tar (PAX, so any name fits) of ``(name, bytes)`` members, written by the standard library."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, __import__("io").BytesIO(data))
    return path


@pytest.mark.parametrize("name,extra", [
    ("../../x", None), ("/tmp/x", None), ("a/../../x", None), ("sub\\x", None), ("a//x", None),
    ("a" * 600, None), ("b" * 300 + "/x", None),
    ("ok", {"key": "../../etc/x.jpg"}), ("ok", {"key": "/abs/x.jpg"}), ("ok", {"key": "a\u0000b.jpg"}),
    ("ok", {"key": "c:\\x.jpg"}), ("ok", {"key": "d/" * 300 + "x.jpg"}),
])
def test_keys_that_leave_a_folder_are_never_record_keys(tmp_path, caplog, name, extra):
    imgs = jpegs(2)
    members = [("first.jpg", imgs[0]), ("first.cls", b"0"), (f"{name}.jpg", imgs[1]), (f"{name}.cls", b"1")]
    if extra is not None:
        members.append((f"{name}.packer.json", json.dumps(extra).encode()))
    shard = _tar_of(tmp_path / "data-000000.tar", members)
    with caplog.at_level("WARNING", logger="packer.interchange.webdataset.reader"):
        scan = FORMAT.scan(str(shard))
    assert scan.problems == []
    # as the TFRecord / MDS / HF scans do: every sample keyed by its place, the warning names the key
    assert scan.keys == ["data-000000/000000.jpg", "data-000000/000001.jpg"]
    assert [read_locator(loc) for loc in scan.locators] == imgs
    assert "cannot be record keys" in caplog.text and "data-000000.tar:" in caplog.text
    out = tmp_path / "out.lmdb"
    rep = packer.build(str(shard), None, str(out), workers=1)
    assert rep.published
    with open_store(str(out)) as r:
        assert [r.get(i).key for i in range(r.metadata.count)] == scan.keys


def test_safe_keys_are_kept_as_they_are(tmp_path, caplog):
    shard = _tar_of(tmp_path / "d.tar", [("a/b.jpg", jpegs(1)[0]), ("a/b.cls", b"0")])
    with caplog.at_level("WARNING"):
        assert FORMAT.scan(str(shard)).keys == ["a/b.jpg"]
    assert "cannot be record keys" not in caplog.text


def test_image_the_decode_check_rejects_is_named_by_shard_and_member(tmp_path):
    from tests.interchange_fixtures import check_damage_named
    imgs = jpegs(3)
    _write(tmp_path / "src", [{"__key__": "a", "jpg": imgs[0], "cls": 0}, {"__key__": "bad", "jpg": b"not a jpeg",
                               "cls": 1}, {"__key__": "c", "jpg": imgs[2], "cls": 1}])
    check_damage_named(str(tmp_path / "src"), tmp_path / "o.lmdb", "data-000000.tar:bad.jpg")


def test_unlabeled_store_comes_back_from_webdataset(tmp_path):
    images, _ = make_dataset(tmp_path / "src", 5, kind="classes", seed=2)
    first = tmp_path / "a.lmdb"
    assert packer.build(images, None, str(first), workers=1, no_labels=True).published
    with open_store(str(first)) as r:
        FORMAT.export(r, tmp_path / "wds", ExportOptions(shard_size=2))
        want = [(rec.key, bytes(rec.data), rec.label) for rec in (r.get(i) for i in range(r.metadata.count))]
    second = tmp_path / "b.lmdb"
    rep = packer.build(str(tmp_path / "wds"), None, str(second), workers=1)   # no flag needed
    assert rep.published and rep.rejected == []
    with open_store(str(second)) as r:
        assert r.metadata.label_schema == "none"
        assert [(rec.key, bytes(rec.data), rec.label) for rec in (r.get(i) for i in range(r.metadata.count))] == want


def test_unlabeled_sample_beside_class_names_is_kept_when_marked(tmp_path):
    imgs = jpegs(3)
    _write(tmp_path, [{"__key__": "a", "jpg": imgs[0], "cls": 1}, {"__key__": "b", "jpg": imgs[1],
                       "packer.json": {"unlabeled": True}}, {"__key__": "c", "jpg": imgs[2], "cls": 0}])
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    scan = FORMAT.scan(str(tmp_path))
    assert scan.problems == [] and scan.labels == [1, None, 0] and scan.class_names == ["cat", "dog"]
    assert FORMAT.scan(str(tmp_path), ScanOptions(allow_unlabeled=True)).labels == [1, None, 0]


def test_bytes_after_eoi_are_trimmed_noted_and_the_source_checksum_is_of_the_input(tmp_path):
    from packer.core.integrity import checksum
    imgs = jpegs(3)
    mpo = imgs[1] + imgs[2]                      # an MPO-like file: a second frame after EOI
    _write(tmp_path / "src", [{"__key__": "a", "jpg": imgs[0], "cls": 0}, {"__key__": "mpo", "jpg": mpo, "cls": 1}])
    out = tmp_path / "o.lmdb"
    assert packer.build(str(tmp_path / "src"), None, str(out), workers=1).published
    with open_store(str(out)) as r:
        rec = r.get(1)
    assert bytes(rec.data) == imgs[1]            # stored: the first frame, as it is
    assert f"trimmed {len(imgs[2])} bytes after EOI" in rec.notes
    assert rec.source_checksum == checksum(mpo) != checksum(imgs[1]) and rec.source_size == len(mpo)


# ------------------------------------------------------------------------------------- gzip shards


def _gzip_shards(tmp_path, n: int = 5) -> tuple:
    """A folder holding only gzip shards (``.tar.gz`` and ``.tgz``) of ``n`` samples, and the plain
    scan of the same samples."""
    import gzip
    imgs = jpegs(n)
    plain = _write(tmp_path / "plain", [{"__key__": f"k{i}", "jpg": b, "cls": i % 2} for i, b in enumerate(imgs)],
                   maxcount=3)
    (tmp_path / "gz").mkdir()
    for shard, suffix in zip(plain, (".tar.gz", ".tgz")):
        (tmp_path / "gz" / (Path(shard).name[:-4] + suffix)).write_bytes(gzip.compress(Path(shard).read_bytes()))
    return tmp_path / "gz", FORMAT.scan(str(tmp_path / "plain")), imgs


def test_gzip_shards_are_read_and_detected(tmp_path):
    folder, plain, imgs = _gzip_shards(tmp_path)
    assert FORMAT.detect(folder) and FORMAT.detect(folder / "data-000000.tar.gz")
    scan = FORMAT.scan(str(folder))
    assert scan.problems == []
    assert scan.keys == plain.keys and scan.labels == plain.labels
    assert all(loc[0] == "bytes" for loc in scan.locators) and [read_locator(x) for x in scan.locators] == imgs
    assert scan.displays[3] == "data-000001.tgz:k3.jpg"
    ours = [s["__key__"] for s in _wds_samples(sorted(str(p) for p in folder.iterdir()))]
    assert [k + ".jpg" for k in ours] == scan.keys           # as webdataset reads them
    out = tmp_path / "o.lmdb"
    assert packer.build(str(folder), None, str(out), workers=1).published   # no --from
    with open_store(str(out)) as r:
        assert [bytes(r.get(i).data) for i in range(r.metadata.count)] == imgs


def test_gzip_shard_cut_short_or_with_a_huge_member_is_named(tmp_path, monkeypatch):
    folder, _, imgs = _gzip_shards(tmp_path)
    shard = folder / "data-000000.tar.gz"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) * 2 // 3])
    scan = FORMAT.scan(str(folder))
    (p,) = scan.problems
    assert p["path"].startswith("data-000000.tar.gz") and "damaged or cut gzip tar" in p["reason"]
    assert scan.keys[-2:] == ["k3.jpg", "k4.jpg"] and len(scan.keys) < 5
    from packer.interchange.webdataset import tar
    monkeypatch.setattr(tar, "MAX_GZIP_MEMBER", min(len(b) for b in imgs) - 1)
    scan = FORMAT.scan(str(folder / "data-000001.tgz"))
    assert scan.keys == [] and len(scan.problems) == 2
    assert all("more than an image member of a gzip shard may hold" in p["reason"] for p in scan.problems)


def test_shards_compressed_otherwise_are_named_not_skipped_silently(tmp_path):
    folder, plain, _ = _gzip_shards(tmp_path)
    (folder / "data-000002.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64))
    scan = FORMAT.scan(str(folder))
    assert scan.keys == plain.keys
    assert [p["path"] for p in scan.problems] == ["data-000002.tar.zst"]
    assert "decompress it to a .tar" in scan.problems[0]["reason"]
