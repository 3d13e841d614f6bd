"""Label formats: parse -> store (every format) -> readers -> writers back, plus the odd cases.

Each round trip builds a real store through ``packer.jobs.build.build``, reads it with
``StoreDataset`` (targets in torchvision v2 form) and writes the labels back with the format's
writer, which must give the original file (byte for byte where the format allows, else the
same document).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import packer
from packer.core.errors import SourceError, UsageError
from packer.labels import detect_format, get_label_form
from packer.labels.masks import mask_array
from packer.sources.folders import collect_sources
from packer.stores import open_store
from readers.dataset import StoreDataset
from readers.targets import decode_target, rle_to_mask
from tests import label_corpus as lc

pytestmark = pytest.mark.timeout(120)


def _records(loc):
    with open_store(loc) as st:
        return st.get_many(list(range(len(st)))), st.metadata


def _sorted_coco(d):
    d = dict(d)
    d["images"] = sorted(d["images"], key=lambda i: i["id"])
    d["annotations"] = sorted(d["annotations"], key=lambda a: a["id"])
    d["categories"] = sorted(d["categories"], key=lambda c: c["id"])
    return d


# ---------------------------------------------------------------------------------------
# COCO
# ---------------------------------------------------------------------------------------
@pytest.mark.torchvision
def test_coco_round_trip(fmt, location_for, tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "coco")
    assert detect_format(js) == "coco"
    loc = location_for("coco")
    rep = packer.build(images, js, loc, format=fmt, workers=1)
    assert rep.ok and rep.label_schema == "objects" and rep.records == 4
    ds = StoreDataset(loc, return_key=True, return_metadata=True)
    assert ds.metadata.class_names == ["person", "car", "zebra"]   # categories sorted by id: 1, 3, 7
    by_key = {key: (img, t, m) for img, t, key, m in (ds[i] for i in range(len(ds)))}
    img, t, m = by_key["a.jpg"]
    assert isinstance(t["boxes"], __import__("torchvision").tv_tensors.BoundingBoxes)
    assert t["boxes"].canvas_size == (48, 64) and t["boxes"].format.name == "XYXY"
    assert torch.allclose(t["boxes"], torch.tensor([[4, 6.5, 24, 16.5], [30.25, 1, 64, 41]]))
    assert t["labels"].tolist() == [1, 2] and t["iscrowd"].tolist() == [0, 0] and m == {"image_id": 10}
    assert torch.allclose(t["polygons"][0][0], torch.tensor([[4, 6.5], [24, 6.5], [24, 16.5], [4, 16.5]]))
    _, t, m = by_key["b.jpg"]   # a COCO image without annotations: kept, zero objects
    assert t["boxes"].shape == (0, 4) and t["labels"].shape == (0,) and m == {"image_id": 11}
    _, t, _ = by_key["sub/c.jpg"]   # matched by file_name "c.jpg"; crowd boxes with RLE
    assert t["iscrowd"].tolist() == [1, 1]
    crowd = rle_to_mask(t["rle"][0])
    assert crowd.shape == (64, 32) and crowd.sum() == 15 * 6 and crowd[5:20, 3:9].all()
    assert rle_to_mask(t["rle"][1]).sum() == 50
    records, meta = _records(loc)
    out = tmp_path / "out.json"
    get_label_form("coco").write(records, meta.class_names, out, meta.label_info)
    assert _sorted_coco(json.loads(out.read_text())) == _sorted_coco(coco)


def test_coco_problems_name_file_and_annotation(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "c")
    coco["annotations"][0]["bbox"] = [50, 40, 20, 10]          # past the 64x48 image
    coco["annotations"][1]["category_id"] = 99
    coco["annotations"][4]["bbox"] = [1, 2, float("nan"), 3]
    coco["images"].append({"id": 77, "file_name": "missing.jpg", "width": 5, "height": 5})
    js.write_text(json.dumps(coco))
    with pytest.raises(SourceError) as err:
        collect_sources(images, js)
    text = "\n".join(err.value.problems)
    assert "annotations[0] (id 1): bbox [50, 40, 20, 10] reaches outside the 64x48 image" in text
    assert "--clip-boxes" in text
    assert "annotations[1] (id 2): category_id 99 is not in 'categories'" in text
    assert "annotations[4] (id 5): bbox must be 4 finite numbers" in text
    assert "file_name 'missing.jpg': there is no such image" in text
    assert len(err.value.problems) == 4


def test_coco_box_rounding_past_the_edge_is_clipped_with_a_note(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "c")
    coco["annotations"][0]["bbox"] = [44.5, 38.2, 20.4, 10.6]   # 0.9 px past 64 x 48
    js.write_text(json.dumps(coco))
    rep = packer.build(images, js, tmp_path / "s.lmdb", workers=1)
    assert rep.ok and any("clipped to the 64x48 image" in n["note"] for n in rep.notes)


@pytest.mark.torchvision
def test_coco_clip_boxes_noted(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "c")
    coco["annotations"][0]["bbox"] = [50, 40, 20, 10]
    js.write_text(json.dumps(coco))
    rep = packer.build(images, js, tmp_path / "s.lmdb", workers=1, clip_boxes=True)
    assert rep.ok
    assert any("clipped to the 64x48 image" in n["note"] and n["path"] == "a.jpg" for n in rep.notes)
    t = StoreDataset(tmp_path / "s.lmdb")[0][1]
    assert t["boxes"][0].tolist() == [50, 40, 64, 48]


# ---------------------------------------------------------------------------------------
# Pascal VOC
# ---------------------------------------------------------------------------------------
@pytest.mark.torchvision
def test_voc_round_trip(fmt, location_for, tmp_path):
    images, ann = lc.make_voc(tmp_path / "VOC2007")
    assert detect_format(tmp_path / "VOC2007") == "voc" and detect_format(ann) == "voc"
    loc = location_for("voc")
    rep = packer.build(images, tmp_path / "VOC2007", loc, format=fmt, workers=1)
    assert rep.ok and rep.label_schema == "objects"
    ds = StoreDataset(loc)
    assert ds.metadata.class_names == ["cat", "dog"]
    t = ds[0][1]
    assert t["labels"].tolist() == [1, 0] and t["difficult"].tolist() == [1, 0]
    assert t["truncated"].tolist() == [0, 1]
    assert torch.allclose(t["boxes"], torch.tensor([[5., 6, 30, 40], [1, 1, 64, 48]]))
    assert ds[2][1]["boxes"].shape == (0, 4)   # an annotation without objects
    records, meta = _records(loc)
    out = tmp_path / "out"
    get_label_form("voc").write(records, meta.class_names, out, meta.label_info)
    for xml in sorted(ann.glob("*.xml")):
        assert lc.voc_dict(out / xml.name) == lc.voc_dict(xml), xml.name
        assert (out / xml.name).read_bytes() == xml.read_bytes()   # same layout: byte for byte


def test_voc_errors(tmp_path):
    images, ann = lc.make_voc(tmp_path / "v")
    (ann / "2007000.xml").write_text((ann / "2007000.xml").read_text().replace("<xmax>30</xmax>", "<xmax>99</xmax>")
                                     .replace("<difficult>1</difficult>", "<difficult>yes</difficult>"))
    (ann / "2007001.xml").write_text("<annotation><object>")
    (ann / "nothere.xml").write_text("<annotation><filename>nothere.jpg</filename></annotation>")
    with pytest.raises(SourceError) as err:
        collect_sources(images, ann)
    text = "\n".join(err.value.problems)
    assert "2007000.xml: object 0: <difficult> must be 0 or 1, got 'yes'" in text
    assert "2007001.xml: invalid XML" in text
    assert "nothere.xml: annotation without an image" in text


# ---------------------------------------------------------------------------------------
# YOLO / ultralytics
# ---------------------------------------------------------------------------------------
@pytest.mark.torchvision
def test_ultralytics_data_yaml_round_trip(fmt, location_for, tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    loc = location_for("yolo")
    rep = packer.build(root, root / "data.yaml", loc, format=fmt, workers=1)
    assert rep.ok and rep.label_schema == "objects"   # a seg row makes it the label model
    ds = StoreDataset(loc, return_key=True)
    assert ds.metadata.class_names == ["person", "bicycle", "traffic light"]
    samples = {key: t for _, t, key in (ds[i] for i in range(len(ds)))}
    t = samples["images/train/b.jpg"]
    assert t["labels"].tolist() == [2, 0]
    assert torch.allclose(t["polygons"][0][0], torch.tensor([[.1, .1], [.5, .1], [.5, .6], [.1, .6]]) *
                          torch.tensor([40., 40.]))
    assert torch.allclose(t["boxes"][0], torch.tensor([4., 4., 20., 24.]))   # the polygon's box
    assert samples["images/train/c.jpg"]["boxes"].shape == (0, 4)
    records, meta = _records(loc)
    out = tmp_path / "out"
    get_label_form("yolo").write(records, meta.class_names, out, meta.label_info)
    for split, rows in (("train", lc.YOLO_TRAIN), ("val", lc.YOLO_VAL)):
        for stem, text in rows.items():
            assert (out / "images" / split / f"{stem}.txt").read_text() == text   # byte for byte
    assert (out / "classes.txt").read_text() == "person\nbicycle\ntraffic light\n"


def test_yolo_folder_boxes_schema_keeps_class_names(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    (root / "labels/train/b.txt").write_text("0 0.75 0.75 0.5 0.5\n")   # detection rows only
    rep = packer.build(root / "images/train", root / "labels/train", tmp_path / "s.h5", format="hdf5", workers=1)
    assert rep.ok and rep.label_schema == "boxes"
    records, meta = _records(tmp_path / "s.h5")
    assert meta.class_names == ["person", "bicycle", "traffic light"]   # from ../../data.yaml
    get_label_form("yolo").write(records, meta.class_names, tmp_path / "out", meta.label_info)
    assert (tmp_path / "out/a.txt").read_text() == lc.YOLO_TRAIN["a"]


def test_yolo_background_image_hint(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=True)
    with pytest.raises(SourceError) as err:
        collect_sources(root, root / "data.yaml")
    assert len(err.value.problems) == 1
    assert "images/train/e.jpg: image without a label" in err.value.problems[0]
    assert "pass --allow-unlabeled" in err.value.problems[0]
    with pytest.raises(SourceError) as err:
        collect_sources(root / "images/train", root / "labels/train")
    assert "pass --allow-unlabeled" in err.value.problems[0]
    src = collect_sources(root, root / "data.yaml", allow_unlabeled=True)
    assert src.labels[src.keys.index("images/train/e.jpg")] is None


def test_ultralytics_tree_without_labels_is_refused_with_what_to_pass(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds")
    with pytest.raises(UsageError, match="looks like a YOLO/ultralytics dataset.*data.yaml"):
        collect_sources(root)
    with pytest.raises(UsageError, match="pass the labels folder as LABELS"):
        (root / "data.yaml").unlink()
        collect_sources(root / "images")
    with pytest.raises(UsageError, match=f"{root / 'labels/train'} holds YOLO label files for these images"):
        collect_sources(root / "images/train")
    proc = subprocess.run([sys.executable, "-m", "packer", "build", str(root), "-o", str(tmp_path / "x.lmdb")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "looks like a YOLO/ultralytics dataset" in proc.stderr
    assert not (tmp_path / "x.lmdb").exists()


@pytest.mark.parametrize("row, why", [
    ("0 0.5 0.5 1.2 0.2", "coordinate 1.2 is outside [0, 1]"),
    ("0 0.5 -0.1 0.2 0.2", "coordinate -0.1 is outside [0, 1]"),
    ("0 0.5 nan 0.2 0.2", "non-finite coordinate nan"),
    ("0 0.5 0.5 inf 0.2", "non-finite coordinate inf"),
    ("0 0.1 0.1 0.5 0.1 0.5", "expected 5 values"),
    ("1.5 0.5 0.5 0.2 0.2", "class must be a non-negative integer"),
])
def test_yolo_bad_rows_name_file_and_line(tmp_path, row, why):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    (root / "labels/train/a.txt").write_text("0 0.5 0.5 0.2 0.2\n" + row + "\n")
    with pytest.raises(SourceError) as err:
        collect_sources(root / "images/train", root / "labels/train")
    assert err.value.problems == [p for p in err.value.problems if "a.txt:2: " in p]
    assert why in err.value.problems[0]


def test_yolo_clip_boxes(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    (root / "labels/train/a.txt").write_text("0 0.9 0.5 0.2 0.2\n0 1.1 0.5 0.4 0.2\n")
    (root / "labels/train/b.txt").write_text("0 0.75 0.75 0.5 0.5\n")
    src = collect_sources(root / "images/train", root / "labels/train", clip_boxes=True)
    rows = src.labels[src.keys.index("a.jpg")]
    np.testing.assert_allclose(rows[1], [0, 0.95, 0.5, 0.1, 0.2], atol=1e-6)   # kept inside the image
    assert src.label_notes["a.jpg"] == [f"{root / 'labels/train/a.txt'}:2: coordinates clipped to [0, 1]"]


# ---------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------
def test_csv_bom_quotes_header_metadata_round_trip(fmt, location_for, tmp_path):
    images, path, data = lc.make_csv(tmp_path / "c")
    loc = location_for("csv")
    rep = packer.build(images, path, loc, format=fmt, workers=1)
    assert rep.ok and rep.label_schema == "class"
    ds = StoreDataset(loc, return_key=True, return_metadata=True)
    assert ds.metadata.class_names == ["cat", "dog"]
    got = {key: (label, m) for _, label, key, m in (ds[i] for i in range(len(ds)))}
    assert got["x/1.jpg"] == (1, {"notes": "big, brown", "score": "0.9"})
    assert got["x/2.jpg"] == (0, {"notes": 'says "meow"', "score": "0.5"})
    records, meta = _records(loc)
    get_label_form("csv").write(records, meta.class_names, tmp_path / "out.csv", meta.label_info)
    assert (tmp_path / "out.csv").read_bytes() == data


def test_csv_paths_and_columns(tmp_path):
    images, _, _ = lc.make_csv(tmp_path / "c")
    p = tmp_path / "odd.csv"
    p.write_text(f"image_id,label_text,source\n./x/1.jpg,dog,a\n{images / 'x/2.jpg'},cat,b\nx\\\\..\\\\y/3.jpg,dog,c\n"
                 .replace("x\\\\..\\\\y", "y"))
    with pytest.raises(UsageError, match="--csv-columns label='category': no such column"):
        collect_sources(images, p, csv_columns="path=image_id,label=category")
    src = collect_sources(images, p, csv_columns="path=image_id,label=label_text")
    assert src.labels == [1, 0, 1] and src.class_names == ["cat", "dog"]
    assert src.metadata == [{"source": "a"}, {"source": "b"}, {"source": "c"}]
    odd = tmp_path / "odd_header.csv"
    odd.write_text("img_name,cls\nx/1.jpg,dog\n")
    with pytest.raises(SourceError) as err:
        collect_sources(images, odd, allow_unlabeled=True)
    assert "odd_header.csv:1: label for 'img_name'" in err.value.problems[0]
    assert "--csv-columns path=COLUMN,label=COLUMN" in err.value.problems[0]
    src = collect_sources(images, odd, allow_unlabeled=True, csv_columns="path=img_name,label=cls")
    assert src.labels == [0, -1, -1] and src.class_names == ["dog"]
    bad = tmp_path / "bad.csv"
    bad.write_text("x/1.jpg,dog\n/elsewhere/x/2.jpg,cat\nx/9.jpg,dog\ny/3.jpg\n")
    with pytest.raises(SourceError) as err:
        collect_sources(images, bad)
    text = "\n".join(err.value.problems)
    assert "bad.csv:2: label for '/elsewhere/x/2.jpg', but /elsewhere/x/2.jpg is outside IMAGES" in text
    assert "bad.csv:3: label for 'x/9.jpg', but there is no such image" in text
    assert "bad.csv:4: expected 2 columns" in text


def test_metadata_is_under_the_record_checksum(tmp_path):
    import lmdb

    images, path, _ = lc.make_csv(tmp_path / "c")
    loc = tmp_path / "s.lmdb"
    assert packer.build(images, path, loc, workers=1).ok
    assert packer.verify(loc).ok
    env = lmdb.open(str(loc), subdir=True, max_dbs=8, lock=False)
    db = env.open_db(b"records")
    with env.begin(write=True, db=db) as txn:
        k, v = next(iter(txn.cursor()))
        meta = json.loads(v)
        meta["metadata"]["score"] = "1.0"
        txn.put(k, json.dumps(meta).encode())
    env.close()
    rep = packer.verify(loc)
    assert not rep.ok and "record checksum mismatch" in str(rep.problems[0])


# ---------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------
@pytest.mark.torchvision
def test_masks_round_trip(fmt, location_for, tmp_path):
    images, masks, want = lc.make_masks(tmp_path / "m")
    assert detect_format(masks) == "masks"
    loc = location_for("masks")
    rep = packer.build(images, masks, loc, format=fmt, workers=1)
    assert rep.ok and rep.label_schema == "objects"
    ds = StoreDataset(loc, return_key=True)
    assert ds.metadata.class_names == ["background", "road", "car"]
    from torchvision import tv_tensors
    for i in range(len(ds)):
        img, t, key = ds[i]
        arr = want[key][0]
        assert isinstance(t["masks"], tv_tensors.Mask) and t["masks"].shape == img.shape[1:]
        assert np.array_equal(t["masks"].numpy(), arr.astype(t["masks"].numpy().dtype))
    half = StoreDataset(loc, return_key=True, scale="1/2")
    img, t, key = half[0]
    assert t["masks"].shape == img.shape[1:]     # resized (nearest) with the image
    records, meta = _records(loc)
    out = tmp_path / "out"
    get_label_form("masks").write(records, meta.class_names, out, meta.label_info)
    for key, (_, data) in want.items():
        assert (out / key).with_suffix(".png").read_bytes() == data


def test_mask_problems(tmp_path):
    images, masks, _ = lc.make_masks(tmp_path / "m")
    (masks / "3.png").write_bytes(lc.png(np.zeros((4, 4, 3), np.uint8)))
    (masks / "s/9.png").write_bytes((masks / "s/1.png").read_bytes())
    with pytest.raises(SourceError) as err:
        collect_sources(images, masks)
    text = "\n".join(err.value.problems)
    assert "3.png: a mask must have one channel of ids" in text and "9.png: mask without an image" in text


# ---------------------------------------------------------------------------------------
# pieces
# ---------------------------------------------------------------------------------------
def test_rle_decoder_matches_encoder():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (7, 5), (30, 41)]:
        m = (rng.random(shape) > 0.6).astype(np.uint8)
        assert np.array_equal(rle_to_mask(lc.rle_encode(m)), m)


@pytest.mark.torchvision
def test_decode_target_unlabeled_and_flags():
    t = decode_target(None, 10, 20)
    assert t["boxes"].shape == (0, 4) and t["labels"].dtype == torch.int64
    t = decode_target({"objects": [{"class": 0, "box": [.5, .5, 1, 1], "difficult": 1},
                                   {"class": 1, "box": [.25, .5, .5, 1]}]}, 10, 20)
    assert t["difficult"].tolist() == [1, 0]
    assert t["boxes"].tolist() == [[0, 0, 20, 10], [0, 0, 10, 10]]


def test_labels_format_forced_and_wrong(tmp_path):
    images, js, _ = lc.make_coco(tmp_path / "c")
    with pytest.raises(UsageError, match="--labels-format voc expects an Annotations/ folder"):
        collect_sources(images, js, labels_format="voc")
    other = tmp_path / "renamed.txt"
    other.write_text(js.read_text())
    src = collect_sources(images, other, labels_format="coco")
    assert src.label_schema == "objects"


def test_cli_labels_options(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "c")
    coco["annotations"][0]["bbox"] = [50, 40, 20, 10]
    js.write_text(json.dumps(coco))
    cmd = [sys.executable, "-m", "packer", "build", str(images), str(js), "-o", str(tmp_path / "s.lmdb"),
           "-q", "-j", "1", "--labels-format", "coco"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 1 and "reaches outside the 64x48 image" in proc.stderr
    proc = subprocess.run(cmd + ["--clip-boxes"], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    csv_images, csv_path, _ = lc.make_csv(tmp_path / "csv")
    proc = subprocess.run([sys.executable, "-m", "packer", "build", str(csv_images), str(csv_path), "-o",
                           str(tmp_path / "c.lmdb"), "-q", "--csv-columns", "path=filename,label=nope"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2 and "label='nope': no such column" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "packer", "info", str(tmp_path / "s.lmdb")],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "objects" in proc.stdout
    assert mask_array(lc.png(np.ones((2, 3), np.uint8))).shape == (2, 3)


def test_labels_written_in_another_format(tmp_path):
    """COCO labels out as YOLO and VOC (boxes from the canonical form), YOLO-seg out as COCO."""
    images, js, coco = lc.make_coco(tmp_path / "c")
    assert packer.build(images, js, tmp_path / "s.lmdb", workers=1).ok
    records, meta = _records(tmp_path / "s.lmdb")
    assert meta.stats["objects"] == 5 and meta.stats["images_without_objects"] == 1
    get_label_form("yolo").write(records, meta.class_names, tmp_path / "y", meta.label_info)
    rows = (tmp_path / "y/a.txt").read_text().splitlines()
    assert rows[0].split()[0] == "1"    # car: class id 1 of [person, car, zebra]
    # a.jpg is 64x48; COCO bbox [4, 6.5, 20, 10] -> polygon row (it has a polygon)
    xs = [float(v) for v in rows[0].split()[1::2]]
    assert min(xs) == pytest.approx(4 / 64, abs=1e-5) and max(xs) == pytest.approx(24 / 64, abs=1e-5)
    get_label_form("voc").write(records, meta.class_names, tmp_path / "v", meta.label_info)
    objs = lc.voc_dict(tmp_path / "v/a.xml")[2]
    box = [o for o in objs if o[0] == "object"][1][2][-1]
    assert box == ("bndbox", "", [("xmin", "30.25", []), ("ymin", "1", []), ("xmax", "64", []), ("ymax", "41", [])])
    root = lc.make_ultralytics(tmp_path / "u", background=False)
    assert packer.build(root, root / "data.yaml", tmp_path / "u.lmdb", workers=1).ok
    records, meta = _records(tmp_path / "u.lmdb")
    get_label_form("coco").write(records, meta.class_names, tmp_path / "u.json", meta.label_info)
    out = json.loads((tmp_path / "u.json").read_text())
    assert [c["name"] for c in out["categories"]] == ["person", "bicycle", "traffic light"]
    seg = [a for a in out["annotations"] if a["category_id"] == 3][0]   # the YOLO-seg row, in pixels of 40x40
    assert seg["segmentation"] == [[4, 4, 20, 4, 20, 24, 4, 24]] and seg["bbox"] == [4, 4, 16, 20]
    # and it parses back as COCO
    assert collect_sources(root, tmp_path / "u.json").label_schema == "objects"
    images, ann = lc.make_voc(tmp_path / "VOC2007")     # VOC -> COCO and YOLO
    assert packer.build(images, ann, tmp_path / "voc.lmdb", workers=1).ok
    records, meta = _records(tmp_path / "voc.lmdb")
    get_label_form("coco").write(records, meta.class_names, tmp_path / "voc.json", meta.label_info)
    out = json.loads((tmp_path / "voc.json").read_text())
    assert [a["bbox"] for a in out["annotations"]] == [[5, 6, 25, 34], [1, 1, 63, 47], [10.5, 2, 10, 36]]
    assert [a["id"] for a in out["annotations"]] == [1, 2, 3] and [i["id"] for i in out["images"]] == [1, 2, 3]
    get_label_form("yolo").write(records, meta.class_names, tmp_path / "vy", meta.label_info)
    assert (tmp_path / "vy/2007001.txt").read_text() == "0 0.3875 0.5 0.25 0.9\n"


def test_declared_size_mismatch_is_noted(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "c")
    coco["images"][1]["width"], coco["images"][1]["height"] = 80, 80   # b.jpg is 40x40
    js.write_text(json.dumps(coco))
    rep = packer.build(images, js, tmp_path / "s.lmdb", workers=1)
    assert {"path": "b.jpg", "note": "label source says 80x80, the stored image is 40x40: coordinates kept "
                                     "in the source's frame"} in rep.notes


def test_objects_build_resumes(tmp_path):
    """The resume fingerprint is stable for label-model labels and metadata: a failed build is
    picked up again, not restarted, and gives the same store."""
    images, js, coco = lc.make_coco(tmp_path / "c")
    from tests import corpus
    (images / "zz.jpg").write_bytes(corpus.good_jpeg(3)[:200])   # damaged, sorted last
    coco["images"].append({"id": 99, "file_name": "zz.jpg", "width": 64, "height": 48})
    js.write_text(json.dumps(coco))
    first = packer.build(images, js, tmp_path / "s.lmdb", workers=1)
    assert not first.published and first.records == 4
    again = packer.build(images, js, tmp_path / "s.lmdb", workers=1, on_corrupt="skip")
    assert again.published and again.resumed_from == 5 and again.records == 4
    fresh = packer.build(images, js, tmp_path / "t.lmdb", workers=1, on_corrupt="skip")
    a, _ = _records(tmp_path / "s.lmdb")
    b, _ = _records(tmp_path / "t.lmdb")
    assert [r.meta_checksum for r in a] == [r.meta_checksum for r in b] and fresh.records == 4
    assert packer.verify(tmp_path / "s.lmdb").ok


_JUNK = [None, True, -1, 1e309, "x", [], [1, 2], {}, {"a": 1}, [[1, "a"]], float("nan")]


@pytest.mark.timeout(120)
def test_junk_in_a_coco_file_is_a_problem_not_a_crash(tmp_path):
    """Every field of every kind of COCO entry replaced by junk of every JSON type: a SourceError
    (or a clean parse), never a TypeError/KeyError escaping from the parser."""
    images, js, coco = lc.make_coco(tmp_path / "c")
    cases = []
    for section in ("images", "annotations", "categories"):
        for field in sorted({k for entry in coco[section] for k in entry}):
            for junk in _JUNK:
                cases.append((section, field, junk))
    cases += [("top", s, j) for s in ("images", "annotations", "categories") for j in _JUNK]
    for section, field, junk in cases:
        doc = json.loads(json.dumps(coco))
        if section == "top":
            doc[field] = junk
        else:
            doc[section][0][field] = junk
        js.write_text(json.dumps(doc))
        try:
            collect_sources(images, js, labels_format="coco")
        except (SourceError, UsageError):
            pass


@pytest.mark.parametrize("text, why", [
    ("names: [a, b\n", "invalid YAML"),
    ("names: 5\n", "'names' must be a list"),
    ("names: {0: a, 2: b}\n", "'names' ids must be 0..1"),
    ("- just a list\n", "expected a mapping"),
])
def test_bad_data_yaml(tmp_path, text, why):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    (root / "data.yaml").write_text(text)
    with pytest.raises(SourceError) as err:
        collect_sources(root, root / "data.yaml")
    assert why in err.value.problems[0] and "data.yaml" in err.value.problems[0]


def test_yolo_class_id_beyond_names(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    (root / "labels/val/d.txt").write_text("5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(SourceError) as err:
        collect_sources(root, root / "data.yaml")
    assert "class id 5 but" in err.value.problems[0] and "names 3 classes" in err.value.problems[0]


def test_folder_of_coco_files_says_which_to_pass(tmp_path):
    images, js, _ = lc.make_coco(tmp_path / "c")
    (tmp_path / "annotations").mkdir()
    js.rename(tmp_path / "annotations/instances_val2017.json")
    with pytest.raises(UsageError, match="pass the one that goes with the images as LABELS.*instances_val2017"):
        collect_sources(images, tmp_path / "annotations")


@pytest.mark.torchvision
def test_instance_masks_from_polygons_and_rle(tmp_path):
    images, js, _ = lc.make_coco(tmp_path / "c")
    assert packer.build(images, js, tmp_path / "s.lmdb", workers=1).ok
    ds = StoreDataset(tmp_path / "s.lmdb", return_key=True, instance_masks=True)
    got = {key: t for _, t, key in (ds[i] for i in range(len(ds)))}
    m = got["a.jpg"]["masks"]
    assert m.shape == (2, 48, 64) and m.dtype == torch.uint8
    assert m[0, 7:16, 5:24].all() and 200 <= m[0].sum() <= 21 * 11   # the 20x10 rectangle, edges included
    c = got["sub/c.jpg"]["masks"]
    assert c.shape == (2, 64, 32) and c[0, 5:20, 3:9].all() and c[0].sum() == 90 and c[1].sum() == 50
    assert got["b.jpg"]["masks"].shape == (0, 40, 40)
    half = StoreDataset(tmp_path / "s.lmdb", return_key=True, instance_masks=True, scale="1/2")
    img, t, key = half[3]
    assert key == "sub/c.jpg" and t["masks"].shape == (2, 32, 16) and t["masks"][0].sum() == pytest.approx(22, abs=8)


@pytest.mark.torchvision
def test_masks_alongside_voc_boxes(tmp_path):
    """VOC Annotations + SegmentationClass: boxes, flags and the palette mask in one target."""
    images, ann = lc.make_voc(tmp_path / "VOC2007")
    seg = tmp_path / "VOC2007/SegmentationClass"
    seg.mkdir()
    want = {}
    for i, img in enumerate(sorted(images.glob("*.jpg"))):
        h, w = lc.SIZES[i]
        arr = (np.arange(h * w).reshape(h, w) % 3).astype(np.uint8)
        data = lc.png(arr, palette=True)
        (seg / f"{img.stem}.png").write_bytes(data)
        want[img.name] = (arr, data)
    rep = packer.build(images, tmp_path / "VOC2007", tmp_path / "s.h5", format="hdf5", workers=1, masks=seg)
    assert rep.ok and rep.label_schema == "objects"
    ds = StoreDataset(tmp_path / "s.h5", return_key=True)
    img, t, key = ds[0]
    assert t["difficult"].tolist() == [1, 0] and t["boxes"].shape == (2, 4)
    assert np.array_equal(t["masks"].numpy(), want[key][0])
    records, meta = _records(tmp_path / "s.h5")
    get_label_form("voc").write(records, meta.class_names, tmp_path / "v", meta.label_info)
    get_label_form("masks").write(records, meta.class_names, tmp_path / "m", meta.label_info)
    for xml in ann.glob("*.xml"):
        assert (tmp_path / "v" / xml.name).read_bytes() == xml.read_bytes()
    for name, (_, data) in want.items():
        assert (tmp_path / "m" / name).with_suffix(".png").read_bytes() == data
    (seg / "2007000.png").unlink()
    with pytest.raises(SourceError, match="problem"):
        packer.build(images, tmp_path / "VOC2007", tmp_path / "t.h5", format="hdf5", workers=1, masks=seg)


def test_masks_alongside_classes_and_alone(tmp_path):
    images, masks = tmp_path / "i", tmp_path / "m"
    lc._img(images / "a/1.jpg", 1, 16, 16)
    lc._img(images / "b/2.jpg", 2, 16, 16)
    (masks / "a").mkdir(parents=True)
    data = lc.png(np.eye(16, dtype=np.uint8))
    (masks / "a/1.png").write_bytes(data)
    with pytest.raises(SourceError) as err:
        collect_sources(images, None, masks=masks)
    assert err.value.problems == [f"{images / 'b/2.jpg'}: image without a mask in {masks}"]
    src = collect_sources(images, None, masks=masks, allow_unlabeled=True)
    assert src.label_schema == "objects" and src.class_names == ["a", "b"]
    assert src.labels[0]["class"] == 0 and src.labels[0]["mask"]["png"] and src.labels[1] == {
        "format": "class", "size": None, "objects": [], "class": 1}
    src = collect_sources(images, None, masks=masks, allow_unlabeled=True, no_labels=True)
    assert src.label_schema == "objects" and "mask" in src.labels[0] and "mask" not in src.labels[1]


def test_metadata_names_with_dots_and_dollars(fmt, location_for, tmp_path):
    """CSV headers become metadata keys as they are, in every store (MongoDB field names too)."""
    images, path, data = lc.make_csv(tmp_path / "c")
    path.write_bytes(data.replace(b"notes,score", b"a.b,$x"))
    loc = location_for("dots")
    assert packer.build(images, path, loc, format=fmt, workers=1).ok
    ds = StoreDataset(loc, return_metadata=True)
    assert ds[0][2] == {"a.b": "big, brown", "$x": "0.9"}
    assert packer.verify(loc).ok


def test_darknet_labels_beside_images_without_labels_is_refused(tmp_path):
    lc._img(tmp_path / "i/cats/1.jpg", 1, 16, 16)
    (tmp_path / "i/cats/1.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(UsageError, match="YOLO label files sit next to the images"):
        collect_sources(tmp_path / "i")
    src = collect_sources(tmp_path / "i", tmp_path / "i")
    assert src.label_schema == "boxes" and src.labels[0].shape == (1, 5)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_label_follows_the_pixels(orientation):
    """A box drawn into raw pixels lands where orient_label puts it after apply_orientation."""
    from packer.core.integrity import apply_orientation
    from packer.labels.model import orient_label

    H, W = 30, 50
    img = np.zeros((H, W, 1), np.uint8)
    x1, y1, x2, y2 = 5, 3, 20, 12
    img[y1:y2, x1:x2] = 255
    turned = apply_orientation(img, orientation)[:, :, 0]
    ys, xs = np.nonzero(turned)
    th, tw = turned.shape
    label = {"size": [W, H], "objects": [{"class": 0, "box": [(x1 + x2) / 2 / W, (y1 + y2) / 2 / H,
                                                             (x2 - x1) / W, (y2 - y1) / H],
                                          "polygon": [[x1 / W, y1 / H, x2 / W, y1 / H, x2 / W, y2 / H]]}]}
    out = orient_label(label, orientation) if orientation != 1 else label
    cx, cy, w, h = out["objects"][0]["box"]
    got = [round((cx - w / 2) * tw), round((cy - h / 2) * th), round((cx + w / 2) * tw), round((cy + h / 2) * th)]
    assert got == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
    assert out["size"] == [tw, th]


@pytest.mark.torchvision
def test_exif_turned_images_turn_coco_labels(tmp_path):
    from tests import corpus

    images, js, coco = lc.make_coco(tmp_path / "c")
    (images / "a.jpg").write_bytes(corpus.with_exif((images / "a.jpg").read_bytes(), 6))   # raw 64x48
    rep = packer.build(images, js, tmp_path / "s.lmdb", workers=1)
    assert {"path": "a.jpg", "note": "labels turned with the pixels (EXIF orientation 6)"} in rep.notes
    img, t = StoreDataset(tmp_path / "s.lmdb")[0]
    assert img.shape[1:] == (64, 48) and t["boxes"].canvas_size == (64, 48)
    assert torch.allclose(t["boxes"][0], torch.tensor([31.5, 4, 41.5, 24]))   # bbox [4, 6.5, 20, 10] turned
    records, meta = _records(tmp_path / "s.lmdb")
    get_label_form("coco").write(records, meta.class_names, tmp_path / "out.json", meta.label_info)
    assert _sorted_coco(json.loads((tmp_path / "out.json").read_text())) == _sorted_coco(coco)
    rep = packer.build(images, js, tmp_path / "r.lmdb", workers=1, exif="record")   # turned when read
    assert not [n for n in rep.notes if "turned" in n["note"]]
    img, t = StoreDataset(tmp_path / "r.lmdb")[0]
    assert img.shape[1:] == (64, 48) and torch.allclose(t["boxes"][0], torch.tensor([31.5, 4, 41.5, 24]))
    img, t = StoreDataset(tmp_path / "r.lmdb", apply_exif=False)[0]
    assert img.shape[1:] == (48, 64) and torch.allclose(t["boxes"][0], torch.tensor([4, 6.5, 24, 16.5]))


@pytest.mark.torchvision
def test_hdf5_pixel_mode_scales_boxes_and_masks(tmp_path):
    """Normalized canonical boxes stay right when HDF5 pixel mode resizes every image."""
    images, js, _ = lc.make_coco(tmp_path / "c")
    rep = packer.build(images, js, tmp_path / "p.h5", format="hdf5", workers=1,
                    store_options={"pixels": "24x32"})
    assert rep.ok
    ds = StoreDataset(tmp_path / "p.h5", return_key=True, instance_masks=True)
    img, t, key = ds[0]
    assert key == "a.jpg" and img.shape == (3, 24, 32) and t["boxes"].canvas_size == (24, 32)
    assert torch.allclose(t["boxes"], torch.tensor([[2, 3.25, 12, 8.25], [15.125, .5, 32, 20.5]]))
    assert t["masks"].shape == (2, 24, 32)


def test_legacy_boxes_store_written_as_coco_and_voc(boxes_dataset, tmp_path):
    """Stores built before the label model ("boxes": N x 5 YOLO rows) export to every format."""
    images, labels = boxes_dataset
    assert packer.build(images, labels, tmp_path / "b.lmdb", workers=1).label_schema == "boxes"
    records, meta = _records(tmp_path / "b.lmdb")
    names = meta.class_names or [str(i) for i in range(100)]
    get_label_form("coco").write(records, names, tmp_path / "b.json", meta.label_info)
    out = json.loads((tmp_path / "b.json").read_text())
    n_boxes = sum(len(r.label) for r in records if r.label is not None)
    assert len(out["images"]) == len(records) and len(out["annotations"]) == n_boxes > 0
    r = next(r for r in records if r.label is not None and len(r.label))
    ann = next(a for a in out["annotations"] if a["image_id"] == records.index(r) + 1)
    cls, cx, cy, w, h = (float(v) for v in r.label[0])
    assert ann["bbox"] == pytest.approx([(cx - w / 2) * r.width, (cy - h / 2) * r.height, w * r.width,
                                         h * r.height], abs=0.01)
    get_label_form("voc").write(records, [str(i) for i in range(100)], tmp_path / "v", meta.label_info)
    assert len(list((tmp_path / "v").rglob("*.xml"))) == len(records)
    get_label_form("yolo").write(records, meta.class_names, tmp_path / "y", meta.label_info)
    for rec in records:
        if rec.label is not None:
            text = (tmp_path / "y" / Path(rec.key).with_suffix(".txt")).read_text()
            back = np.array([[float(v) for v in line.split()] for line in text.splitlines()]).reshape(-1, 5)
            np.testing.assert_allclose(back, rec.label, atol=1e-5)


def test_coco_detected_whatever_the_key_order(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "c")
    big = {"annotations": coco["annotations"], "info": {"pad": "x" * 100000}, "images": coco["images"],
           "categories": coco["categories"]}
    js.write_text(json.dumps(big))
    assert detect_format(js) == "coco"
    assert collect_sources(images, js).label_schema == "objects"


def test_data_yaml_orphan_label_file_reported(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    (root / "labels/val/zz.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    with pytest.raises(SourceError) as err:
        collect_sources(root, root / "data.yaml")
    assert err.value.problems == [f"{root / 'labels/val/zz.txt'}: label file without an image (looked for "
                                  f"{(root / 'images/val/zz').as_posix()}.*)"]
