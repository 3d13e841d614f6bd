"""Labels that come back as they went in (issue 25).

* YOLO class names from ``obj.names`` (darknet, CVAT, datumaro), ``classes.txt`` and ``data.yaml``
  (list or map), found beside the labels or above them; ``--classes obj.names``; two files that
  disagree stop the build (exit 2) naming both and the first differing class.
* ``packer export`` of a YOLO store writes every label file byte for byte (``0.133333`` stays
  ``0.133333``; ``%.6f`` rows, CRLF, a BOM, seg rows too) and the class-name files, and a rebuild
  from the export is the same store. A store that did not keep the text says so.
* ``instance_masks=True`` rasterizes COCO polygons exactly as pycocotools does
  (``frPyObjects`` + ``merge`` + ``decode``, torchvision's COCO wrapper).
* VOC / COCO export writes nothing for an image stored unlabeled.

The CLI runs are real subprocesses (``python -m packer``), as a user types them.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.core.errors import UsageError
from packer.core.records import labels_equal
from packer.jobs.export import export
from packer.labels import yolo as yolo_labels
from packer.stores import open_store
from tests import REPO, corpus
from tests import label_corpus as lc

pytestmark = [pytest.mark.timeout(180),
              # pycocotools' decode under numpy 2 (its own code, not ours)
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]



def _packer(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=120)


def _ok(*args):
    r = _packer(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _image(path: Path, seed: int, h: int = 40, w: int = 48) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(corpus.good_jpeg(seed, h, w))


def _store(loc):
    with open_store(str(loc)) as st:
        return st.metadata, st.get_many(list(range(len(st))))


def _same_store(a, b) -> None:
    """Same keys, labels, per-sample metadata, class names and image bytes."""
    meta_a, recs_a = _store(a)
    meta_b, recs_b = _store(b)
    assert meta_a.label_schema == meta_b.label_schema
    assert list(meta_a.class_names) == list(meta_b.class_names)
    assert [r.key for r in recs_a] == [r.key for r in recs_b]
    for ra, rb in zip(recs_a, recs_b):
        assert labels_equal(ra.label, rb.label), ra.key
        assert ra.metadata == rb.metadata, ra.key
        assert bytes(ra.data) == bytes(rb.data), ra.key


# ---------------------------------------------------------------------------------------
# YOLO class names
# ---------------------------------------------------------------------------------------
def _yolo_folder(root: Path, n: int = 2) -> tuple[Path, Path]:
    images, labels = root / "images", root / "labels"
    labels.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        _image(images / f"{i}.jpg", i)
        (labels / f"{i}.txt").write_text(f"{i % 2} 0.5 0.5 0.25 0.25\n")
    return images, labels


def test_obj_names_beside_the_labels_names_the_classes(tmp_path):
    images, labels = _yolo_folder(tmp_path / "ds")
    (labels / "obj.names").write_text("cat\ndog\n")
    _ok("build", images, labels, "-o", tmp_path / "s.lmdb", "-q")
    meta, _ = _store(tmp_path / "s.lmdb")
    assert list(meta.class_names) == ["cat", "dog"]


def test_cvat_layout_obj_names_above_obj_train_data(tmp_path):
    """CVAT / datumaro 'YOLO 1.1': obj.names and obj.data next to obj_train_data/."""
    root = tmp_path / "cvat"
    for i in range(2):
        _image(root / "obj_train_data" / f"f{i}.jpg", i)
        (root / "obj_train_data" / f"f{i}.txt").write_text("1 0.500000 0.500000 0.200000 0.300000\n")
    (root / "obj.names").write_text("car\ntraffic light\n")
    (root / "obj.data").write_text("classes = 2\nnames = data/obj.names\ntrain = data/train.txt\n")
    assert packer.build(root / "obj_train_data", root / "obj_train_data", tmp_path / "s.lmdb", workers=1).ok
    meta, _ = _store(tmp_path / "s.lmdb")
    assert list(meta.class_names) == ["car", "traffic light"]


@pytest.mark.parametrize("names_yaml", ["names: [cat, dog]\n", "names:\n  0: cat\n  1: dog\n",
                                        "names: {1: dog, 0: cat}\n"])
def test_data_yaml_names_list_or_map_beside_the_labels(tmp_path, names_yaml):
    images, labels = _yolo_folder(tmp_path / "ds")
    (tmp_path / "ds" / "data.yaml").write_text("path: .\ntrain: images\n" + names_yaml)
    assert packer.build(images, labels, tmp_path / "s.lmdb", workers=1).ok
    assert list(_store(tmp_path / "s.lmdb")[0].class_names) == ["cat", "dog"]


def test_classes_option_takes_obj_names(tmp_path):
    images, labels = _yolo_folder(tmp_path / "ds")
    (tmp_path / "obj.names").write_text("cat\ndog\n")
    _ok("build", images, labels, "-o", tmp_path / "s.lmdb", "-q", "--classes", tmp_path / "obj.names")
    assert list(_store(tmp_path / "s.lmdb")[0].class_names) == ["cat", "dog"]


@pytest.mark.parametrize("name,text", [("obj.names", "cat\ndog\n"), ("classes.txt", "# pinned\ncat\ndog\n"),
                                       ("data.yaml", "names:\n  0: cat\n  1: dog\n"),
                                       ("coco8.yml", "names: [cat, dog]\n")])
def test_classes_file_forms(tmp_path, name, text):
    from packer.sources.classes import load_class_map

    (tmp_path / name).write_text(text)
    assert load_class_map(tmp_path / name) == ["cat", "dog"]


@pytest.mark.parametrize("first,second,why", [
    (("labels/obj.names", "cat\ndog\n"), ("labels/classes.txt", "cat\nbird\n"),
     "class 1 is 'dog' in {a} but 'bird' in {b}"),
    (("labels/classes.txt", "cat\ndog\n"), ("data.yaml", "names: [cat, dog, bird]\n"),
     "{a} names 2 classes, {b} names 3 (class 2, 'bird', is only in {b})"),
    (("obj.names", "cat\ndog\n"), ("../obj.names", "dog\ncat\n"), "class 0 is 'cat' in {a} but 'dog' in {b}"),
])
def test_conflicting_names_files_stop_the_build_naming_both(tmp_path, first, second, why):
    ds = tmp_path / "top" / "ds"
    images, labels = _yolo_folder(ds)
    a, b = (Path(os.path.normpath(ds / f)) for f, _ in (first, second))
    a.write_text(first[1])
    b.write_text(second[1])
    with pytest.raises(UsageError) as err:
        packer.build(images, labels, tmp_path / "s.lmdb", workers=1)
    assert "conflicting YOLO class names" in str(err.value) and why.format(a=a, b=b) in str(err.value)
    assert not (tmp_path / "s.lmdb").exists()


def test_conflicting_names_files_exit_2_on_the_command_line(tmp_path):
    images, labels = _yolo_folder(tmp_path / "ds")
    (labels / "classes.txt").write_text("cat\ndog\n")
    (tmp_path / "ds" / "obj.names").write_text("cat\nhorse\n")
    r = _packer("build", images, labels, "-o", tmp_path / "s.lmdb", "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"class 1 is 'dog' in {labels / 'classes.txt'} but 'horse' in {tmp_path / 'ds' / 'obj.names'}"
            in r.stderr), r.stderr
    assert not (tmp_path / "s.lmdb").exists()


def test_agreeing_names_files_are_fine(tmp_path):
    images, labels = _yolo_folder(tmp_path / "ds")
    (labels / "obj.names").write_text("cat\ndog\n")
    (labels / "classes.txt").write_text("cat\r\ndog\r\n\r\n")
    (tmp_path / "ds" / "data.yaml").write_text("names: {0: cat, 1: dog}\n")
    assert packer.build(images, labels, tmp_path / "s.lmdb", workers=1).ok
    assert list(_store(tmp_path / "s.lmdb")[0].class_names) == ["cat", "dog"]


# ---------------------------------------------------------------------------------------
# YOLO export byte for byte, and the rebuild
# ---------------------------------------------------------------------------------------
BOX_FILES = {
    "a": "0 0.133333 0.5 0.2 0.3\n1 0.1 0.2 0.1 0.2\n",                  # ultralytics' %g
    "b": "1 0.500000 0.250000 0.333333 0.100000\n",                       # CVAT / datumaro's %.6f
    "c": "",                                                               # background
    "sub/d": "0 0.5 0.5 0.00001 1e-05\r\n1 .25  .25 0.5 0.5\r\n",         # CRLF, odd spacing, 1e-05
    "e": "\ufeff0 0.7 0.7 0.1 0.1",                                        # BOM, no final newline
}


def _box_dataset(root: Path, names_file: str = "classes.txt") -> tuple[Path, Path]:
    images, labels = root / "images", root / "labels"
    for i, (stem, text) in enumerate(BOX_FILES.items()):
        _image(images / f"{stem}.jpg", 10 + i, 30 + 4 * i, 40)
        (labels / stem).parent.mkdir(parents=True, exist_ok=True)
        (labels / f"{stem}.txt").write_bytes(text.encode("utf-8"))
    if names_file == "data.yaml":
        (root / "data.yaml").write_text("names:\n  0: cat\n  1: dog\n")
    else:
        (labels / names_file).write_text("cat\ndog\n")
    return images, labels


@pytest.mark.parametrize("names_file", ["classes.txt", "obj.names", "data.yaml"])
def test_yolo_export_writes_each_label_file_back_byte_for_byte(tmp_path, names_file):
    images, labels = _box_dataset(tmp_path / "ds", names_file)
    if names_file == "classes.txt":   # as a user does it; the other cases in-process (faster)
        _ok("build", images, labels, "-o", tmp_path / "s.lmdb", "-q")
        r = _ok("export", tmp_path / "s.lmdb", tmp_path / "out")
        assert "WARNING" not in r.stderr
    else:
        assert packer.build(images, labels, tmp_path / "s.lmdb", workers=1).ok
        assert not export(tmp_path / "s.lmdb", tmp_path / "out").label_notes
    assert _store(tmp_path / "s.lmdb")[0].label_schema == "boxes"
    out = tmp_path / "out" / "labels"
    for stem, text in BOX_FILES.items():
        assert (out / f"{stem}.txt").read_bytes() == text.encode("utf-8"), stem
    assert (out / "classes.txt").read_text() == "cat\ndog\n"   # every YOLO tool reads it
    if names_file != "classes.txt":                            # and the source's own convention
        assert yolo_labels.read_names_file(out / names_file) == ["cat", "dog"]
    # a rebuild from the export is the same store
    assert packer.build(tmp_path / "out" / "images", out, tmp_path / "again.lmdb", workers=1).ok
    _same_store(tmp_path / "s.lmdb", tmp_path / "again.lmdb")
    assert _store(tmp_path / "again.lmdb")[0].label_info.get("names_file") == names_file


def test_yolo_seg_export_byte_for_byte_and_rebuild(tmp_path):
    root = lc.make_ultralytics(tmp_path / "ds", background=False)
    odd = "2  0.1 0.1 0.5 0.1 0.5 0.6 0.1 0.6\r\n0 0.750000 0.750000 0.500000 0.500000\r\n"
    (root / "labels/train/b.txt").write_bytes(odd.encode())
    assert packer.build(root / "images/train", root / "labels/train", tmp_path / "s.lmdb", workers=1).ok
    assert _store(tmp_path / "s.lmdb")[0].label_schema == "objects"
    export(tmp_path / "s.lmdb", tmp_path / "out")
    out = tmp_path / "out" / "labels"
    assert (out / "b.txt").read_bytes() == odd.encode()
    for stem in ("a", "c"):
        assert (out / f"{stem}.txt").read_text() == lc.YOLO_TRAIN[stem]
    assert (out / "classes.txt").read_text() == "person\nbicycle\ntraffic light\n"
    assert packer.build(tmp_path / "out" / "images", out, tmp_path / "again.lmdb", workers=1).ok
    _same_store(tmp_path / "s.lmdb", tmp_path / "again.lmdb")


def test_yolo_store_without_the_file_text_exports_rows_that_read_back_and_says_so(tmp_path, monkeypatch,
                                                                                   caplog):
    """A store built before the text was kept: float32 rows written as the shortest decimals that
    read back the same (0.133333, not 0.1333329975605011), with a note that the text may differ."""
    images, labels = _box_dataset(tmp_path / "ds")
    monkeypatch.setattr(yolo_labels, "source_metadata", lambda mapping: {})   # what older builds stored
    assert packer.build(images, labels, tmp_path / "old.lmdb", workers=1).ok
    monkeypatch.undo()
    assert all(not r.metadata for r in _store(tmp_path / "old.lmdb")[1])
    with caplog.at_level(logging.WARNING, logger="packer.jobs.export"):
        rep = export(tmp_path / "old.lmdb", tmp_path / "out")
    assert rep.label_notes and "before packer kept each file's text" in rep.label_notes[0]
    assert any("may differ from the original files" in m for m in caplog.messages)
    out = tmp_path / "out" / "labels"
    assert (out / "a.txt").read_text() == "0 0.133333 0.5 0.2 0.3\n1 0.1 0.2 0.1 0.2\n"
    assert (out / "b.txt").read_text() == "1 0.5 0.25 0.333333 0.1\n"
    assert (out / "classes.txt").read_text() == "cat\ndog\n"
    assert packer.build(tmp_path / "out" / "images", out, tmp_path / "again.lmdb", workers=1).ok
    old, again = _store(tmp_path / "old.lmdb")[1], _store(tmp_path / "again.lmdb")[1]
    for ra, rb in zip(old, again):
        assert ra.key == rb.key and labels_equal(ra.label, rb.label)   # the same float32 rows


def test_yolo_file_text_kept_in_record_metadata(tmp_path):
    images, labels = _box_dataset(tmp_path / "ds")
    assert packer.build(images, labels, tmp_path / "s.lmdb", workers=1).ok
    recs = {r.key: r for r in _store(tmp_path / "s.lmdb")[1]}
    assert recs["sub/d.jpg"].metadata == {"yolo_txt": BOX_FILES["sub/d"]}
    assert recs["a.jpg"].label.dtype == np.float32   # the readers' rows are unchanged


# ---------------------------------------------------------------------------------------
# COCO polygons: the pixels pycocotools gives
# ---------------------------------------------------------------------------------------
def _coco_mask(rings, h, w):
    coco_mask = pytest.importorskip("pycocotools.mask")
    return coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects([list(map(float, r)) for r in rings], h, w)))


def _random_rings(seed: int, count: int):
    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w = (int(v) for v in rng.integers(1, 70, 2))
        k = int(rng.integers(3, 10))
        kind = i % 6
        if kind == 0:      # anywhere, past every edge
            ring = rng.uniform(-12, max(h, w) + 12, 2 * k)
        elif kind == 1:    # on the half-pixel grid
            ring = np.round(rng.uniform(-4, max(h, w) + 4, 2 * k) * 2) / 2
        elif kind == 2:    # integer vertices
            ring = rng.integers(-3, max(h, w) + 3, 2 * k).astype(float)
        elif kind == 3:    # tenths: values whose x5 lands on .5 exactly
            ring = np.round(rng.uniform(-4, max(h, w) + 4, 2 * k) * 10) / 10
        elif kind == 4:    # rectangles
            x0, y0 = rng.uniform(-5, w), rng.uniform(-5, h)
            a, b = rng.uniform(0, 25, 2)
            ring = np.array([x0, y0, x0 + a, y0, x0 + a, y0 + b, x0, y0 + b])
        else:              # tiny: a pixel or two
            x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
            ring = np.array([x0, y0, x0 + rng.uniform(0, 2), y0, x0 + 1, y0 + rng.uniform(0, 2)])
        yield h, w, [float(v) for v in ring]


def test_polygon_rasterizer_equals_pycocotools_on_random_polygons():
    from packer.labels.masks import polygon_mask

    pytest.importorskip("pycocotools")
    bad = []
    for h, w, ring in _random_rings(2025, 3000):
        if not np.array_equal(polygon_mask(ring, h, w), _coco_mask([ring], h, w)):
            bad.append((h, w, ring))
    assert not bad, f"{len(bad)} of 3000 differ, e.g. {bad[0]}"


def test_polygons_mask_without_pycocotools_equals_pycocotools(monkeypatch):
    """Multi-ring objects (union), with the numpy port (pycocotools hidden) and with pycocotools."""
    from packer.labels import masks

    pytest.importorskip("pycocotools")
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(5, 60, 2))
        rings = [list(map(float, rng.uniform(-5, max(h, w) + 5, 2 * int(rng.integers(3, 7)))))
                 for _ in range(int(rng.integers(1, 4)))]
        cases.append((h, w, rings, _coco_mask(rings, h, w)))
    for h, w, rings, ref in cases:
        assert np.array_equal(masks.polygons_mask(rings, h, w), ref)
    monkeypatch.setitem(sys.modules, "pycocotools", None)    # import fails: the port is used
    with pytest.raises(ImportError):
        import pycocotools  # noqa: F401
    for h, w, rings, ref in cases:
        assert np.array_equal(masks.polygons_mask(rings, h, w), ref)


@pytest.mark.torchvision
def test_instance_masks_of_a_coco_store_equal_pycocotools(tmp_path, monkeypatch):
    """Through a store and StoreDataset(instance_masks=True): a 200x150 rectangle is 200x150
    pixels (not 201x151), a 2-pixel polygon 2 pixels, multi-ring objects and polygons past the
    edge as pycocotools fills them: what torchvision's COCO wrapper gives Mask R-CNN."""
    from readers.dataset import StoreDataset

    pytest.importorskip("pycocotools")
    h, w = 180, 240
    _image(tmp_path / "images" / "a.jpg", 1, h, w)
    segs = [
        [[10, 20, 210, 20, 210, 170, 10, 170]],                          # 200x150 rectangle
        [[100.5, 100.5, 102.5, 100.5, 102.5, 101.5, 100.5, 101.5]],      # 2x1 pixels
        [[5, 5, 40, 5, 40, 30], [50.3, 60.7, 90.1, 61.2, 70.4, 99.9]],  # two rings
        [[-20.4, 150.2, 60.6, 120.1, 30.3, 200.9]],                      # past the left and bottom edges
        [[230.25, 3.75, 260, 40.5, 225.5, 60.1, 219.9, 20.2]],          # past the right edge
    ]
    anns = []
    for i, seg in enumerate(segs):
        xs = [v for r in seg for v in r[0::2]]
        ys = [v for r in seg for v in r[1::2]]
        x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
        anns.append({"id": i + 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": seg,
                     "bbox": [x0, y0, min(float(w), max(xs)) - x0, min(float(h), max(ys)) - y0]})
    coco = {"images": [{"id": 1, "file_name": "a.jpg", "width": w, "height": h}], "annotations": anns,
            "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    assert packer.build(tmp_path / "images", tmp_path / "instances.json", tmp_path / "s.lmdb", workers=1,
                     clip_boxes=True).ok
    for hide in (False, True):
        if hide:
            monkeypatch.setitem(sys.modules, "pycocotools", None)
        ds = StoreDataset(tmp_path / "s.lmdb", instance_masks=True)
        masks = ds[0][1]["masks"].numpy()
        assert masks.shape == (len(segs), h, w)
        assert masks[0].sum() == 200 * 150 and masks[1].sum() == 2
        for i, seg in enumerate(segs):
            monkeypatch.delitem(sys.modules, "pycocotools", raising=False)
            assert np.array_equal(masks[i], _coco_mask(seg, h, w)), (hide, i)
            if hide:
                monkeypatch.setitem(sys.modules, "pycocotools", None)


# ---------------------------------------------------------------------------------------
# VOC / COCO export of images stored unlabeled
# ---------------------------------------------------------------------------------------
def test_voc_export_writes_no_xml_for_an_unlabeled_image(tmp_path):
    images, ann = lc.make_voc(tmp_path / "VOC2007")
    _image(images / "2007999.jpg", 77)                      # no Annotations/2007999.xml
    _ok("build", images, tmp_path / "VOC2007", "-o", tmp_path / "s.lmdb", "-q", "--allow-unlabeled")
    _ok("export", tmp_path / "s.lmdb", tmp_path / "out", "-q")
    out = tmp_path / "out" / "labels"
    assert sorted(p.name for p in out.glob("*.xml")) == sorted(p.name for p in ann.glob("*.xml"))
    assert not (out / "2007999.xml").exists()
    for xml in ann.glob("*.xml"):
        assert (out / xml.name).read_bytes() == xml.read_bytes()
    assert packer.build(tmp_path / "out" / "images", out, tmp_path / "again.lmdb", workers=1, allow_unlabeled=True).ok
    _same_store(tmp_path / "s.lmdb", tmp_path / "again.lmdb")
    assert {r.key: r.label for r in _store(tmp_path / "again.lmdb")[1]}["2007999.jpg"] is None


def test_coco_export_leaves_an_unlabeled_image_out(tmp_path):
    images, js, coco = lc.make_coco(tmp_path / "coco")
    _image(images / "extra.jpg", 78)                        # not in instances.json
    assert packer.build(images, js, tmp_path / "s.lmdb", workers=1, allow_unlabeled=True).ok
    export(tmp_path / "s.lmdb", tmp_path / "out")
    written = json.loads((tmp_path / "out" / "instances.json").read_text())
    assert sorted(i["file_name"] for i in written["images"]) == sorted(i["file_name"] for i in coco["images"])
