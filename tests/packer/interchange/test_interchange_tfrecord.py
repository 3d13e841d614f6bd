"""TFRecord in and out (issue 28), checked with the ``tfrecord`` package on the other side.

Files are written by ``tfrecord.TFRecordWriter`` (gzip ones are its output gzipped, as
TensorFlow's GZIP option writes them) and scanned by packer; stores exported by packer are read
back by ``tfrecord.tfrecord_loader`` and ``tfrecord.torch.dataset.TFRecordDataset`` (with its
``.tfindex`` files, compared with ``tfrecord.tools.tfrecord2idx``'s); damaged files are made from
writer output (a flipped byte, a cut). Set PACKER_REQUIRE_INTERCHANGE=1 to fail (not skip)
without tfrecord.
"""
from __future__ import annotations

import gzip
import json
import os
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("PACKER_REQUIRE_INTERCHANGE") == "1":
    import tfrecord
else:
    tfrecord = pytest.importorskip("tfrecord")

import packer
from packer.core.errors import UsageError
from packer.core.records import labels_equal
from packer.interchange.base import ExportOptions, ScanOptions, read_locator
from packer.interchange.tfrecord import FORMAT, LABEL_MAP, PACKER_LABEL, encoded_range, placeholder
from packer.sample import make_dataset
from packer.stores import open_store
from tests.interchange_fixtures import dataset_store, jpegs, store_records

pytestmark = pytest.mark.timeout(120)

BOX_KEYS = [f"image/object/bbox/{c}" for c in ("xmin", "ymin", "xmax", "ymax")]


def _write(path: Path, examples: list, *, gz: bool = False) -> Path:
    """Write ``examples`` (tfrecord datum dicts) with the tfrecord package's own writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = path.with_name(path.name + ".plain") if gz else path
    w = tfrecord.TFRecordWriter(str(plain))
    for ex in examples:
        w.write(ex)
    w.close()
    if gz:
        path.write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
    return path


def _od_example(image: bytes, name: str, boxes: list, classes: list, texts: list) -> dict:
    """A TF Object Detection API example: corners ``[xmin, ymin, xmax, ymax]`` per box."""
    ex = {"image/encoded": (image, "byte"), "image/format": (b"jpeg", "byte"),
          "image/filename": (name.encode(), "byte"), "image/height": (16, "int"), "image/width": (24, "int"),
          "image/object/class/label": (classes, "int"),
          "image/object/class/text": ([t.encode() for t in texts], "byte")}
    for i, k in enumerate(BOX_KEYS):
        ex[k] = ([b[i] for b in boxes], "float")
    return ex


def _yolo(boxes, classes) -> np.ndarray:
    """What the scan must give: rows computed from the float32 corners in float64."""
    c = np.asarray(boxes, np.float32).reshape(-1, 4).astype(np.float64)
    rows = np.stack([np.asarray(classes, np.float64), (c[:, 0] + c[:, 2]) / 2, (c[:, 1] + c[:, 3]) / 2,
                     c[:, 2] - c[:, 0], c[:, 3] - c[:, 1]], axis=1) if len(classes) else np.zeros((0, 5))
    return rows.astype(np.float32)


# --- scan: files the tfrecord writer wrote ---------------------------------------------------------

def _detection_set(folder: Path, n: int = 6, gz: bool = False) -> tuple:
    imgs = jpegs(n)
    names = {1: "cat", 2: "dog", 3: "bird"}
    rng = np.random.default_rng(1)
    exs, expected = [], []
    for i, img in enumerate(imgs):
        k = i % 3   # 0, 1 or 2 boxes
        x0 = rng.uniform(0, 0.5, (k, 2))
        boxes = [[a, b, a + 0.3, b + 0.4] for a, b in x0]
        classes = [int(c) for c in rng.integers(1, 4, k)]
        exs.append(_od_example(img, f"img_{i:03d}.jpg", boxes, classes, [names[c] for c in classes]))
        expected.append((f"img_{i:03d}.jpg", img, _yolo(boxes, classes)))
    files = [_write(folder / f"train.record-0000{j}-of-00002{'.gz' if gz else ''}", exs[j::2], gz=gz)
             for j in range(2)]
    order = [e for j in range(2) for e in expected[j::2]]
    used = {int(c) for _, _, rows in expected for c in rows[:, 0]}
    class_names = [names[i] if i in used else placeholder(i) for i in range(max(used) + 1)]
    return files, order, class_names


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_scan_detection_records_tf_od_api(tmp_path, gz):
    files, expected, class_names = _detection_set(tmp_path / "od", gz=gz)
    assert FORMAT.detect(str(tmp_path / "od")) and FORMAT.detect(str(files[0]))
    scan = FORMAT.scan(str(tmp_path / "od"), ScanOptions())
    assert not scan.problems and scan.label_schema == "boxes"
    assert scan.keys == [k for k, _, _ in expected]
    assert [read_locator(loc) for loc in scan.locators] == [img for _, img, _ in expected]
    for got, (_, _, rows) in zip(scan.labels, expected):
        assert got.dtype == np.float32 and got.shape == rows.shape and got.tobytes() == rows.tobytes()
    # TF OD ids are 1-based: kept as given, id 0 (and any id never named) gets the placeholder
    assert scan.class_names == class_names and class_names[0] == placeholder(0) and len(class_names) >= 3
    kinds = {loc[0] for loc in scan.locators}
    assert kinds == ({"bytes"} if gz else {"range"})   # plain files: byte ranges, no image bytes held
    assert scan.displays[0] == "train.record-00000-of-00002" + (".gz" if gz else "") + ":record 0"
    assert [f[0] for f in scan.fingerprint] == [p.name for p in files]


def test_scan_classification_with_label_map_and_patterns(tmp_path):
    imgs = jpegs(5)
    labels = [0, 2, 2, 0, 2]
    exs = [{"image/encoded": (img, "byte"), "image/class/label": (lab, "int")} for img, lab in zip(imgs, labels)]
    a = _write(tmp_path / "ds" / "part-00000.tfrecord", exs[:3])
    _write(tmp_path / "ds" / "part-00001.tfrecord", exs[3:])
    # the TF OD label map (extra fields it may carry are skipped); id 1 is named but never used
    (tmp_path / "ds" / LABEL_MAP).write_text(
        "item {\n  id: 0\n  name: 'n0'\n  display_name: \"tabby cat\"\n}\n"
        "item { name: \"dog\" id: 1 keypoints { id: 0 label: \"nose\" } }\nitem { id: 2 name: 'bird' }\n")
    for src in (str(tmp_path / "ds"), str(tmp_path / "ds" / "part-*.tfrecord"),
                str(tmp_path / "ds" / "part-{00000..00001}.tfrecord")):
        assert FORMAT.detect(src)
        scan = FORMAT.scan(src, ScanOptions())
        assert not scan.problems and scan.label_schema == "class"
        assert scan.labels == labels and scan.class_names == ["tabby cat", "dog", "bird"]
        # no image/filename: <file stem>/<record no>.<ext>, ext from the magic bytes
        assert scan.keys == ["part-00000/000000.jpg", "part-00000/000001.jpg", "part-00000/000002.jpg",
                             "part-00001/000000.jpg", "part-00001/000001.jpg"]
        assert [read_locator(x) for x in scan.locators] == imgs
    one = FORMAT.scan(str(a), ScanOptions())
    assert one.labels == labels[:3] and one.class_names == ["tabby cat", "dog", "bird"]


def test_scan_class_text_only_names_and_no_label_sets(tmp_path):
    imgs = jpegs(4)
    texts = ["zebra", "ant", "zebra", "mole"]
    exs = [{"image/encoded": (img, "byte"), "image/class/text": (t.encode(), "byte")} for img, t in zip(imgs, texts)]
    scan = FORMAT.scan(str(_write(tmp_path / "t.tfrecord", exs)), ScanOptions())
    assert scan.class_names == ["ant", "mole", "zebra"] and scan.labels == [2, 0, 2, 1]
    # no label anywhere: schema none, every label None, no problem
    bare = [{"image/encoded": (img, "byte"), "image/filename": (f"x{i}.jpg".encode(), "byte")}
            for i, img in enumerate(imgs)]
    scan = FORMAT.scan(str(_write(tmp_path / "bare.tfrecords", bare)), ScanOptions())
    assert scan.label_schema == "none" and scan.labels == [None] * 4 and not scan.problems
    assert scan.keys == ["x0.jpg", "x1.jpg", "x2.jpg", "x3.jpg"] and scan.class_names == []


def test_unlabeled_record_is_a_problem_unless_allowed(tmp_path):
    imgs = jpegs(3)
    exs = [_od_example(imgs[0], "a.jpg", [[0.1, 0.1, 0.5, 0.5]], [1], ["cat"]),
           {"image/encoded": (imgs[1], "byte"), "image/filename": (b"b.jpg", "byte")},
           _od_example(imgs[2], "c.jpg", [], [], [])]   # no objects: a label (zero rows)
    path = _write(tmp_path / "u.tfrecord", exs)
    scan = FORMAT.scan(str(path), ScanOptions())
    assert scan.keys == ["a.jpg", "c.jpg"] and scan.labels[1].shape == (0, 5)
    assert [(p["path"], p["kind"]) for p in scan.problems] == [("u.tfrecord:record 1", "unlabeled")]
    scan = FORMAT.scan(str(path), ScanOptions(allow_unlabeled=True))
    assert scan.keys == ["a.jpg", "b.jpg", "c.jpg"] and scan.labels[1] is None and not scan.problems


def test_duplicate_filenames_fall_back_to_record_keys(tmp_path):
    imgs = jpegs(2)
    exs = [{"image/encoded": (img, "byte"), "image/filename": (b"same.jpg", "byte"),
            "image/format": (b"png", "byte")} for img in imgs]   # format wins over magic bytes
    scan = FORMAT.scan(str(_write(tmp_path / "d.tfrec", exs)), ScanOptions())
    assert scan.keys == ["d/000000.png", "d/000001.png"]


def test_encoded_range_is_the_image_value(tmp_path):
    img = jpegs(1)[0]
    path = _write(tmp_path / "r.tfrecord", [_od_example(img, "a.jpg", [[0, 0, 1, 1]], [1], ["x"])])
    data = path.read_bytes()[12:-4]
    off, size = encoded_range(data)
    assert data[off:off + size] == img


def test_detect_refuses_other_inputs(tmp_path):
    images, _ = make_dataset(tmp_path / "imgs", 3, kind="classes")
    assert not FORMAT.detect(str(images))
    (tmp_path / "x.tfrecord").write_bytes(b"not a tfrecord file at all")
    assert not FORMAT.detect(str(tmp_path / "x.tfrecord"))
    assert not FORMAT.detect(str(tmp_path / "missing-{0..3}.tfrecord"))
    with pytest.raises(UsageError, match="no TFRecord"):
        FORMAT.scan(str(tmp_path / "missing.tfrecord"), ScanOptions())


# --- damage ----------------------------------------------------------------------------------------

def _three(tmp_path, name="dmg.tfrecord"):
    imgs = jpegs(3)
    exs = [_od_example(img, f"{i}.jpg", [[0.1, 0.2, 0.3, 0.4]], [1], ["cat"]) for i, img in enumerate(imgs)]
    path = _write(tmp_path / name, exs)
    sizes = []
    raw = path.read_bytes()
    pos = 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos:pos + 8], "little")
        sizes.append((pos, n))
        pos += 16 + n
    return path, imgs, sizes


def test_bad_data_crc_skips_that_record_only(tmp_path):
    path, imgs, sizes = _three(tmp_path)
    other = _write(tmp_path / "ok.tfrecord", [_od_example(jpegs(1, seed=9)[0], "z.jpg", [], [], [])])
    raw = bytearray(path.read_bytes())
    start, n = sizes[1]
    raw[start + 12 + n // 2] ^= 0xFF          # a flipped byte inside record 1's data
    path.write_bytes(bytes(raw))
    scan = FORMAT.scan(f"{tmp_path}/{{dmg,ok}}.tfrecord", ScanOptions())
    assert [p["path"] for p in scan.problems] == ["dmg.tfrecord:record 1"]
    assert "data CRC" in scan.problems[0]["reason"] and "skipped" in scan.problems[0]["reason"]
    assert scan.keys == ["0.jpg", "2.jpg", "z.jpg"]
    assert [read_locator(x) for x in scan.locators][:2] == [imgs[0], imgs[2]]
    assert other.exists()


def test_bad_length_crc_loses_the_rest_of_the_file(tmp_path):
    path, imgs, sizes = _three(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[sizes[1][0] + 9] ^= 0x01              # record 1's length CRC
    path.write_bytes(bytes(raw))
    scan = FORMAT.scan(str(path), ScanOptions())
    assert scan.keys == ["0.jpg"]
    (p,) = scan.problems
    assert p["path"] == "dmg.tfrecord:record 1" and "length CRC" in p["reason"] and "rest of" in p["reason"]


@pytest.mark.parametrize("cut", ["header", "data", "crc"])
def test_file_cut_short(tmp_path, cut):
    path, imgs, sizes = _three(tmp_path)
    raw = path.read_bytes()
    start, n = sizes[2]
    keep = {"header": start + 5, "data": start + 12 + n // 2, "crc": start + 12 + n + 2}[cut]
    path.write_bytes(raw[:keep])
    scan = FORMAT.scan(str(path), ScanOptions())
    assert scan.keys == ["0.jpg", "1.jpg"] and [read_locator(x) for x in scan.locators] == imgs[:2]
    (p,) = scan.problems
    assert p["path"] == "dmg.tfrecord:record 2" and "cut short" in p["reason"]


def test_gzip_file_cut_short(tmp_path):
    imgs = jpegs(4)
    exs = [{"image/encoded": (img, "byte"), "image/class/label": (i % 2, "int")} for i, img in enumerate(imgs)]
    path = _write(tmp_path / "z.tfrecord.gz", exs, gz=True)
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) * 2 // 3])
    scan = FORMAT.scan(str(path), ScanOptions())
    assert 1 <= len(scan.keys) < 4 and [read_locator(x) for x in scan.locators] == imgs[:len(scan.keys)]
    (p,) = scan.problems
    assert p["path"].startswith("z.tfrecord.gz:record ") and ("gzip" in p["reason"] or "cut short" in p["reason"])


def test_bad_examples_are_listed_not_raised(tmp_path):
    img = jpegs(1)[0]
    exs = [{"image/encoded": (img, "byte"), "image/class/label": (1, "int"), "image/class/text": (b"a", "byte")},
           {"image/encoded": (7, "int"), "image/class/label": (1, "int")},               # wrong type
           {"image/class/label": (1, "int")},                                            # no image
           {"image/encoded": (img, "byte"), "image/class/label": (1, "int"),
            "image/class/text": (b"b", "byte")},                                         # name clash
           {"image/encoded": (img, "byte"), PACKER_LABEL: (b"[[0, 0.5", "byte")},       # bad JSON
           {"image/encoded": (img, "byte"), BOX_KEYS[0]: ([0.1], "float")}]              # partial box
    path = _write(tmp_path / "bad.tfrecord", exs)
    scan = FORMAT.scan(str(path), ScanOptions())
    assert len(scan.keys) == 1
    reasons = {p["path"]: p["reason"] for p in scan.problems}
    assert sorted(reasons) == [f"bad.tfrecord:record {i}" for i in range(1, 6)]
    assert "int64_list" in reasons["bad.tfrecord:record 1"] and "no image" in reasons["bad.tfrecord:record 2"]
    assert "named" in reasons["bad.tfrecord:record 3"] and "JSON" in reasons["bad.tfrecord:record 4"]


# --- export: read back with the tfrecord package ---------------------------------------------------

@pytest.fixture(scope="module", params=["boxes", "classes"])
def store(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tfr-{request.param}")
    # YOLO ids get names, so class text and the label map are written
    return dataset_store(root / "data", request.param, str(root / "s.lmdb"), n=12, seed=3,
                         class_names=["cat", "dog", "bird"], format="lmdb")


def test_export_read_back_by_tfrecord(store, tmp_path):
    from tfrecord.tools.tfrecord2idx import create_index
    from tfrecord.torch.dataset import TFRecordDataset

    meta, recs = store_records(store)
    out = tmp_path / "out"
    with open_store(store) as reader:
        res = FORMAT.export(reader, out, ExportOptions(shard_size=5))
    assert res.records == 12 and [os.path.basename(s) for s in res.shards] == [
        "data-00000-of-00003.tfrecord", "data-00001-of-00003.tfrecord", "data-00002-of-00003.tfrecord"]
    got = []
    for shard in res.shards:
        index = os.path.splitext(shard)[0] + ".tfindex"
        create_index(shard, str(tmp_path / "ref.idx"))
        assert Path(index).read_text() == (tmp_path / "ref.idx").read_text()
        got.extend(tfrecord.tfrecord_loader(shard, None))   # with an index it starts at a random record
    assert len(got) == len(recs)
    for ex, rec in zip(got, recs):
        assert ex["image/encoded"] == bytes(rec.data) and ex["image/filename"].decode() == rec.key
        if meta.label_schema == "class":
            assert int(ex["image/class/label"][0]) == rec.label
            assert ex["image/class/text"].decode() == meta.class_names[rec.label]
        else:
            corners = np.stack([ex[k] for k in BOX_KEYS], axis=1) if len(rec.label) else np.zeros((0, 4))
            rows = _yolo(corners, ex["image/object/class/label"])
            if PACKER_LABEL in ex:   # float32 corners do not give the rows back exactly: JSON does
                assert labels_equal(np.asarray(json.loads(ex[PACKER_LABEL]), np.float32).reshape(-1, 5), rec.label)
                assert np.allclose(rows, rec.label, atol=1e-6)
            else:
                assert rows.tobytes() == rec.label.tobytes()
    # the torch Dataset with the index files (sharded over workers, as TFRecordDataset does)
    ds = TFRecordDataset(res.shards[0], os.path.splitext(res.shards[0])[0] + ".tfindex",
                         {"image/encoded": "byte", "image/filename": "byte"}, shuffle_queue_size=None)
    first = list(ds)
    assert sorted(bytes(x["image/filename"]).decode() for x in first) == sorted(r.key for r in recs[:5])
    # class names: the TF OD label map
    assert (out / LABEL_MAP).exists()
    from packer.interchange.tfrecord import read_label_map
    assert read_label_map(str(out / LABEL_MAP)) == dict(enumerate(meta.class_names))


def test_export_scan_round_trip_is_exact(store, tmp_path):
    meta, recs = store_records(store)
    out = tmp_path / "rt"
    with open_store(store) as reader:
        FORMAT.export(reader, out, ExportOptions(shard_size=5))
    assert FORMAT.detect(str(out))
    scan = FORMAT.scan(str(out), ScanOptions())
    assert not scan.problems and scan.label_schema == meta.label_schema
    assert scan.keys == [r.key for r in recs] and scan.class_names == list(meta.class_names)
    assert [read_locator(x) for x in scan.locators] == [bytes(r.data) for r in recs]
    assert all(labels_equal(a, b.label) for a, b in zip(scan.labels, recs))
    assert all(x[0] == "range" for x in scan.locators)


def test_export_of_unlabeled_and_placeholder_names_round_trips(tmp_path):
    # a 1-based TF OD set with an unlabeled record -> store -> TFRecord -> scan
    imgs = jpegs(3)
    exs = [_od_example(imgs[0], "a.jpg", [[0.1, 0.1, 0.5, 0.7]], [2], ["dog"]),
           {"image/encoded": (imgs[1], "byte"), "image/filename": (b"b.jpg", "byte")},
           _od_example(imgs[2], "c.jpg", [[0.0, 0.25, 1.0, 0.75]], [1], ["cat"])]
    src = _write(tmp_path / "src" / "in.tfrecord", exs)
    loc = str(tmp_path / "s.lmdb")
    rep = packer.build(str(src), None, loc, format="lmdb", workers=1, allow_unlabeled=True,
                       source_format="tfrecord")
    assert rep.published, rep.to_dict()
    meta, recs = store_records(loc)
    assert list(meta.class_names) == [placeholder(0), "cat", "dog"]
    with open_store(loc) as reader:
        res = FORMAT.export(reader, tmp_path / "out", ExportOptions(shard_size=2))
    assert not any("reserves id 0" in n for n in res.notes)
    back = FORMAT.scan(str(tmp_path / "out"), ScanOptions())
    assert not back.problems and back.class_names == list(meta.class_names)
    assert back.keys == [r.key for r in recs] and all(labels_equal(a, r.label) for a, r in zip(back.labels, recs))
    assert back.labels[1] is None


def test_export_refuses_a_non_empty_folder(store, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with open_store(store) as reader, pytest.raises(UsageError):
        FORMAT.export(reader, tmp_path / "full", ExportOptions(shard_size=5))


def test_objects_store_round_trips_through_packer_label(tmp_path):
    from tests import label_corpus as lc

    images, path, _ = lc.make_coco(tmp_path / "src")
    loc = str(tmp_path / "c.lmdb")
    assert packer.build(images, path, loc, format="lmdb", workers=1).published
    meta, recs = store_records(loc)
    assert meta.label_schema == "objects"
    with open_store(loc) as reader:
        res = FORMAT.export(reader, tmp_path / "out", ExportOptions(shard_size=3))
    # the TF OD box features are there for TF readers; packer's label model rides in packer/label
    got = [ex for s in res.shards for ex in tfrecord.tfrecord_loader(s, None)]
    assert all(PACKER_LABEL in ex for ex in got)
    boxed = [len([o for o in r.label["objects"] if "box" in o]) for r in recs]
    assert [len(ex.get(BOX_KEYS[0], [])) for ex in got] == boxed
    scan = FORMAT.scan(str(tmp_path / "out"), ScanOptions())
    assert not scan.problems and scan.label_schema == "objects" and scan.class_names == list(meta.class_names)
    assert scan.keys == [r.key for r in recs] and scan.labels == [r.label for r in recs]
    assert scan.metadata == [r.metadata for r in recs]


def test_unlabeled_class_records_round_trip_as_minus_one(tmp_path):
    imgs = jpegs(3)
    exs = [{"image/encoded": (imgs[0], "byte"), "image/filename": (b"a.jpg", "byte"), "image/class/label": (1, "int"),
            "image/class/text": (b"dog", "byte")},
           {"image/encoded": (imgs[1], "byte"), "image/filename": (b"b.jpg", "byte")},
           {"image/encoded": (imgs[2], "byte"), "image/filename": (b"c.jpg", "byte"), "image/class/label": (0, "int"),
            "image/class/text": (b"cat", "byte")}]
    src = _write(tmp_path / "in.tfrecord", exs)
    assert FORMAT.scan(str(src), ScanOptions(allow_unlabeled=True)).labels == [1, -1, 0]
    loc = str(tmp_path / "s.lmdb")
    assert packer.build(str(src), None, loc, format="lmdb", workers=1, allow_unlabeled=True,
                        source_format="tfrecord").published
    meta, recs = store_records(loc)
    with open_store(loc) as reader:
        res = FORMAT.export(reader, tmp_path / "out", ExportOptions(shard_size=2))
    assert any("reserves id 0" in n for n in res.notes)   # a 0-based set exports 0-based ids
    got = [ex for s in res.shards for ex in tfrecord.tfrecord_loader(s, None)]
    assert "image/class/label" not in got[1] and json.loads(got[1][PACKER_LABEL]) == -1
    back = FORMAT.scan(str(tmp_path / "out"), ScanOptions())   # packer's -1 is explicit: no problem
    assert not back.problems and back.labels == [r.label for r in recs] == [1, -1, 0]
    assert back.class_names == list(meta.class_names) == ["cat", "dog"]


def test_bad_label_map_and_missing_library_are_packer_errors(tmp_path, monkeypatch):
    from packer.core.errors import DependencyError
    from packer.interchange.tfrecord import files as mod

    path = _write(tmp_path / "a.tfrecord", [{"image/encoded": (jpegs(1)[0], "byte"), "image/class/label": (1, "int")}])
    (tmp_path / LABEL_MAP).write_text("item { id: 1 name: 'cat' \n")   # unclosed
    with pytest.raises(UsageError, match=LABEL_MAP):
        FORMAT.scan(str(path), ScanOptions())
    (tmp_path / LABEL_MAP).write_text("item { id: 1 name: 'cat' }\nitem { id: 1 name: 'dog' }\n")
    with pytest.raises(UsageError, match="twice"):
        FORMAT.scan(str(path), ScanOptions())
    (tmp_path / "junk.tfrecord.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 30)   # gzip magic, no gzip stream
    assert not FORMAT.detect(str(tmp_path / "junk.tfrecord.gz"))

    def missing():
        raise ImportError("No module named 'tfrecord'")
    monkeypatch.setattr(mod, "_example_pb2", missing)
    with pytest.raises(DependencyError, match="pip install"):
        FORMAT.scan(str(path), ScanOptions())


def _gzip_record_head(path: Path, length: int, zeros: int, before: bytes = b"") -> Path:
    """A gzip TFRecord: ``before`` (whole records), then a header declaring ``length`` bytes (a
    valid length CRC) followed by ``zeros`` zero bytes, compressed in chunks."""
    import crc32c
    crc = crc32c.crc32c(struct.pack("<Q", length))
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        fh.write(comp.compress(before + struct.pack("<QI", length, masked)))
        for _ in range(zeros >> 22):
            fh.write(comp.compress(bytes(4 << 20)))
        fh.write(comp.flush())
    return path


@pytest.mark.parametrize("length,zeros,says", [
    (2 ** 31 - 2, 64 << 20, "more than a record of a gzip TFRecord may hold"),
    (200 << 20, 8 << 20, "cut short"),
])
def test_gzip_record_length_is_bounded_before_it_is_read(tmp_path, length, zeros, says):
    good = _write(tmp_path / "good.tfrecord", [{"image/encoded": (jpegs(1)[0], "byte"),
                                                "image/class/label": (0, "int")}])
    path = _gzip_record_head(tmp_path / "bomb.tfrecord.gz", length, zeros, good.read_bytes())
    good.unlink()
    tracemalloc.start()
    try:
        scan = FORMAT.scan(str(path), ScanOptions())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(scan.keys) == 1
    (p,) = scan.problems
    assert p["path"] == "bomb.tfrecord.gz:record 1" and says in p["reason"]
    assert peak < 48 << 20, peak   # never the declared length


def test_image_the_decode_check_rejects_is_named_by_file_and_record(tmp_path):
    from tests.interchange_fixtures import check_damage_named
    imgs = jpegs(3)
    imgs[1] = b"not a jpeg"
    for gz in (False, True):
        name = "data.tfrecord" + (".gz" if gz else "")
        path = _write(tmp_path / f"in{gz}" / name, [{"image/encoded": (img, "byte"), "image/class/label": (i, "int")}
                                                    for i, img in enumerate(imgs)], gz=gz)
        check_damage_named(str(path.parent), tmp_path / f"o{gz}.lmdb", f"{name}:record 1")
