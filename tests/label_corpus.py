"""Real annotation files in every label format, generated from small test images.

Each ``make_*`` writes images and labels under a folder and returns what a test needs to
check the round trip (paths and the values written). Odd cases are included on purpose:
COCO images without annotations, crowd boxes with RLE, VOC ``difficult``, YOLO-seg rows, CSV
with a BOM and quoted commas, ultralytics layout with ``data.yaml``.
"""
from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from tests import corpus

SIZES = [(48, 64), (40, 40), (64, 32), (50, 70)]   # (h, w)


def _img(path: Path, seed: int, h: int, w: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(corpus.good_jpeg(seed, h, w))


def rle_encode(mask: np.ndarray) -> dict:
    """COCO compressed RLE of a 2-D 0/1 mask (pycocotools ``rleToString``), for tests."""
    h, w = mask.shape
    flat = mask.T.reshape(-1)
    counts, val, run = [], 0, 0
    for v in flat:
        if v != val:
            counts.append(run)
            run, val = 0, v
        run += 1
    counts.append(run)
    out = []
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if (c & 0x10) else (x != 0)
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return {"size": [h, w], "counts": "".join(out)}


def make_coco(root: Path) -> tuple[Path, Path, dict]:
    """IMAGES = root/images (one image in a sub-folder named as COCO's file_name lacks it),
    LABELS = root/instances.json. Returns (images, json path, the COCO dict)."""
    images = root / "images"
    names = ["a.jpg", "b.jpg", "sub/c.jpg", "d.jpg"]
    entries = []
    for i, (name, (h, w)) in enumerate(zip(names, SIZES)):
        _img(images / name, i, h, w)
        entries.append({"id": 10 + i, "file_name": name.split("/")[-1] if i == 2 else name,
                        "width": w, "height": h, "license": 1})
    crowd = np.zeros((64, 32), np.uint8)
    crowd[5:20, 3:9] = 1
    coco = {
        "info": {"description": "packer test", "year": 2026},
        "licenses": [{"id": 1, "name": "test"}],
        "images": entries,
        "annotations": [
            {"id": 1, "image_id": 10, "category_id": 3, "bbox": [4, 6.5, 20, 10], "area": 200,
             "iscrowd": 0, "segmentation": [[4, 6.5, 24, 6.5, 24, 16.5, 4, 16.5]]},
            {"id": 2, "image_id": 10, "category_id": 7, "bbox": [30.25, 1, 33.75, 40], "area": 1350,
             "iscrowd": 0, "segmentation": [[30.25, 1, 64, 1, 50, 41]], "note": "extra field"},
            {"id": 3, "image_id": 12, "category_id": 1, "bbox": [3, 5, 6, 15], "area": 90, "iscrowd": 1,
             "segmentation": rle_encode(crowd)},
            {"id": 4, "image_id": 12, "category_id": 3, "bbox": [0, 0, 32, 64], "area": 2048, "iscrowd": 1,
             "segmentation": {"size": [64, 32], "counts": [100, 50, 1898]}},
            {"id": 5, "image_id": 13, "category_id": 1, "bbox": [10, 10, 5, 5], "area": 25, "iscrowd": 0,
             "segmentation": [[10, 10, 15, 10, 15, 15]]},
        ],   # image 11 ("b.jpg") has no annotation: an image without objects
        "categories": [{"id": 7, "name": "zebra", "supercategory": "animal"},
                       {"id": 1, "name": "person", "supercategory": "person"},
                       {"id": 3, "name": "car", "supercategory": "vehicle"}],
    }
    path = root / "instances.json"
    path.write_text(json.dumps(coco, indent=2))
    return images, path, coco


def make_voc(root: Path) -> tuple[Path, Path]:
    """VOCdevkit-like: root/JPEGImages + root/Annotations (difficult, truncated, pose)."""
    images = root / "JPEGImages"
    ann_dir = root / "Annotations"
    ann_dir.mkdir(parents=True)
    objs = [
        [("dog", 1, 0, "Left", (5, 6, 30, 40)), ("cat", 0, 1, "Frontal", (1, 1, 64, 48))],
        [("cat", 0, 0, "Unspecified", (10.5, 2, 20.5, 38))],
        [],
    ]
    for i, objects in enumerate(objs):
        h, w = SIZES[i]
        name = f"{2007000 + i:06d}"
        _img(images / f"{name}.jpg", 20 + i, h, w)
        a = ET.Element("annotation")
        ET.SubElement(a, "folder").text = "VOC2007"
        ET.SubElement(a, "filename").text = f"{name}.jpg"
        src = ET.SubElement(a, "source")
        ET.SubElement(src, "database").text = "packer test"
        size = ET.SubElement(a, "size")
        for tag, v in (("width", w), ("height", h), ("depth", 3)):
            ET.SubElement(size, tag).text = str(v)
        ET.SubElement(a, "segmented").text = "0"
        for cls, difficult, truncated, pose, box in objects:
            o = ET.SubElement(a, "object")
            ET.SubElement(o, "name").text = cls
            ET.SubElement(o, "pose").text = pose
            ET.SubElement(o, "truncated").text = str(truncated)
            ET.SubElement(o, "difficult").text = str(difficult)
            b = ET.SubElement(o, "bndbox")
            for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), box):
                ET.SubElement(b, tag).text = str(v)
        ET.indent(a, space="\t")
        (ann_dir / f"{name}.xml").write_text(ET.tostring(a, encoding="unicode") + "\n")
    return images, ann_dir


def voc_dict(path: Path) -> dict:
    """An XML file as a nested structure that ignores whitespace (for comparisons)."""
    def conv(e):
        return (e.tag, (e.text or "").strip(), [conv(c) for c in e])
    return conv(ET.parse(path).getroot())


YOLO_TRAIN = {
    "a": "0 0.5 0.5 0.25 0.5\n1 0.1 0.2 0.1 0.2\n",
    "b": "2 0.1 0.1 0.5 0.1 0.5 0.6 0.1 0.6\n0 0.75 0.75 0.5 0.5\n",   # a YOLO-seg row and a box
    "c": "",                                                        # empty: no objects
}
YOLO_VAL = {"d": "1 0.333333 0.5 0.2 0.2\n"}


def make_ultralytics(root: Path, *, background: bool = True) -> Path:
    """root/images/{train,val}, root/labels/{train,val}, root/data.yaml (names as a map).
    With ``background``, images/train/e.jpg has no label file (ultralytics: background)."""
    i = 0
    for split, rows in (("train", YOLO_TRAIN), ("val", YOLO_VAL)):
        for stem, text in rows.items():
            h, w = SIZES[i % len(SIZES)]
            _img(root / "images" / split / f"{stem}.jpg", 40 + i, h, w)
            (root / "labels" / split).mkdir(parents=True, exist_ok=True)
            (root / "labels" / split / f"{stem}.txt").write_text(text)
            i += 1
    if background:
        _img(root / "images" / "train" / "e.jpg", 99, 32, 32)
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n"
                                    "names:\n  0: person\n  1: bicycle\n  2: traffic light\n")
    return root


def make_csv(root: Path) -> tuple[Path, Path, bytes]:
    """A CSV with a BOM, a header naming the columns 'filename,category,notes,score', quoted commas
    and CRLF line ends. Returns (images, csv path, its bytes)."""
    images = root / "images"
    rows = [("x/1.jpg", "dog", "big, brown", "0.9"), ("x/2.jpg", "cat", 'says "meow"', "0.5"),
            ("y/3.jpg", "dog", "", "1")]
    for i, (name, *_rest) in enumerate(rows):
        _img(images / name, 60 + i, *SIZES[i])
    import csv
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(["filename", "category", "notes", "score"])
    w.writerows(rows)
    data = b"\xef\xbb\xbf" + buf.getvalue().encode()
    path = root / "labels.csv"
    path.write_bytes(data)
    return images, path, data


def png(arr: np.ndarray, mode: str | None = None, palette: bool = False) -> bytes:
    from PIL import Image

    im = Image.fromarray(arr, mode) if mode else Image.fromarray(arr)
    if palette:
        im = im.convert("P") if im.mode != "P" else im
        im.putpalette([v for i in range(256) for v in (i, 255 - i, (i * 7) % 256)])
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def make_masks(root: Path) -> tuple[Path, Path, dict]:
    """IMAGES root/images, masks root/masks (L, palette P and 16-bit instance ids), classes.txt."""
    images, masks = root / "images", root / "masks"
    out = {}
    rng = np.random.default_rng(5)
    for i, name in enumerate(["s/1", "s/2", "3"]):
        h, w = SIZES[i]
        _img(images / f"{name}.jpg", 80 + i, h, w)
        if i == 2:
            arr = rng.integers(0, 1000, (h, w)).astype(np.uint16)
            data = png(arr)
        else:
            arr = rng.integers(0, 3, (h, w)).astype(np.uint8)
            data = png(arr, palette=(i == 1))
        p = masks / f"{name}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        out[f"{name}.jpg"] = (arr, data)
    (masks / "classes.txt").write_text("background\nroad\ncar\n")
    return images, masks, out
