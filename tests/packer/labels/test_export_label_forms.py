"""``packer export`` of stores built from COCO / VOC / masks / YOLO-seg: the original form comes
back (same COCO document, byte-identical VOC XML and mask PNGs, YOLO rows as written), and
``labels_form`` converts between them through each form's ``write`` (:func:`packer.labels.get_label_form`)."""
from __future__ import annotations

import json

import pytest

import packer
from packer.jobs.export import export
from packer.sources.folders import collect_sources
from tests import label_corpus as lc

pytestmark = pytest.mark.timeout(120)


def _by_id(d):
    return {k: sorted(v, key=lambda x: x["id"]) if k in ("images", "annotations", "categories") else v
            for k, v in d.items()}


def _build(images, labels, loc, **kw):
    rep = packer.build(images, labels, loc, "lmdb", workers=1, **kw)
    assert rep.ok, rep
    return loc


def test_coco_store_exports_the_same_coco_document(tmp_path):
    images, path, coco = lc.make_coco(tmp_path / "src")
    loc = _build(images, path, str(tmp_path / "c.lmdb"))
    rep = export(loc, tmp_path / "out")
    assert rep.ok and rep.label_form == "coco" and rep.identical == 4
    # the same document: every value as COCO gave it (lists in id order; the store keeps
    # images in key order, as tests/packer/labels/test_labels.py compares them)
    assert _by_id(json.loads(open(rep.labels).read())) == _by_id(coco)
    # and the export builds the same store again
    again = _build(rep.images, rep.labels, str(tmp_path / "again.lmdb"))
    a, b = collect_sources(images, path), collect_sources(rep.images, rep.labels)
    assert a.keys == b.keys and a.labels == b.labels and a.class_names == b.class_names
    assert packer.info(again).metadata["index_checksum"] == packer.info(loc).metadata["index_checksum"]


def test_voc_store_exports_byte_identical_xml(tmp_path):
    images, ann = lc.make_voc(tmp_path / "VOC2007")
    loc = _build(images, ann, str(tmp_path / "v.lmdb"))
    rep = export(loc, tmp_path / "out")
    assert rep.ok and rep.label_form == "voc"
    written = sorted(p.name for p in (tmp_path / "out" / "labels").glob("*.xml"))
    assert written == sorted(p.name for p in ann.glob("*.xml"))
    for name in written:
        assert (tmp_path / "out" / "labels" / name).read_bytes() == (ann / name).read_bytes(), name


def test_masks_and_yolo_seg_stores_export_their_form(tmp_path):
    images, masks, arrays = lc.make_masks(tmp_path / "m")
    loc = _build(images, masks, str(tmp_path / "m.lmdb"))
    rep = export(loc, tmp_path / "mo")
    assert rep.ok and rep.label_form == "masks"
    for key, (_, data) in arrays.items():
        assert (tmp_path / "mo" / "labels" / key).with_suffix(".png").read_bytes() == data, key

    root = lc.make_ultralytics(tmp_path / "y", background=False)
    loc = _build(root / "images", root / "data.yaml", str(tmp_path / "y.lmdb"))
    rep = export(loc, tmp_path / "yo")
    assert rep.ok and rep.label_form == "yolo"
    out = tmp_path / "yo" / "labels"
    for split, rows in (("train", lc.YOLO_TRAIN), ("val", lc.YOLO_VAL)):
        for stem, text in rows.items():
            assert (out / split / f"{stem}.txt").read_text() == text, (split, stem)
    assert (out / "classes.txt").read_text() == "person\nbicycle\ntraffic light\n"


def test_labels_form_converts_objects(tmp_path):
    images, path, coco = lc.make_coco(tmp_path / "src")
    loc = _build(images, path, str(tmp_path / "c.lmdb"))
    src = collect_sources(images, path)
    # COCO -> VOC: boxes come back in pixels, names and keys kept; it builds again.
    rep = export(loc, tmp_path / "voc", labels_form="voc")
    assert rep.ok and rep.label_form == "voc" and len(list((tmp_path / "voc" / "labels").rglob("*.xml"))) == 4
    back = collect_sources(rep.images, rep.labels)
    # VOC has no class list: names come back in sorted order
    assert back.keys == src.keys and back.class_names == sorted(src.class_names)
    n_boxes = sum(len(lab["objects"]) for lab in back.labels)
    assert n_boxes == sum(len(lab["objects"]) for lab in src.labels)
    # COCO -> YOLO rows (polygons as YOLO-seg, crowd RLEs as boxes) with classes.txt
    rep = export(loc, tmp_path / "yolo", labels_form="yolo")
    assert rep.ok and (tmp_path / "yolo" / "labels" / "classes.txt").read_text().split("\n")[:3] == \
        list(src.class_names)
    rows = (tmp_path / "yolo" / "labels" / "a.txt").read_text().splitlines()
    assert len(rows) == 2 and len(rows[0].split()) == 9       # a 4-point polygon


def test_csv_store_exports_its_own_csv_layout(tmp_path):
    images, path, data = lc.make_csv(tmp_path / "csv")
    loc = _build(images, path, str(tmp_path / "v.lmdb"))
    rep = export(loc, tmp_path / "plain")
    assert rep.ok and rep.label_form == "csv"          # packer's path,label mapping, as before
    rep = export(loc, tmp_path / "own", labels_form="csv-source")
    assert rep.ok and rep.label_form == "csv-source" and open(rep.labels, "rb").read() == data
    a, b = collect_sources(images, path), collect_sources(rep.images, rep.labels)
    assert a.keys == b.keys and a.labels == b.labels and a.class_names == b.class_names
