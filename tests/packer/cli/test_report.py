"""The HTML report (packer.report, ``packer report``, ``--html``), checked in a real headless browser."""
from __future__ import annotations

import json
import re
import struct
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.core.errors import DependencyError
from packer.report import pixel_stats, sample_indices, write_html
from packer.report.data import collect
from packer.stores import open_store
from tests import browser, corpus

pytest.importorskip("matplotlib")

THUMBS = 12
PLOTS = {"boxes": {"image-sizes", "file-sizes", "classes", "boxes-per-image", "box-sizes", "box-aspect",
                   "conversions", "pixels"},
         "class": {"image-sizes", "file-sizes", "classes", "conversions", "pixels"}}


def damage_record(fmt: str, location: str, index: int) -> None:
    """Flip 24 bytes in the middle of record ``index``'s stored JPEG, behind the store's back."""
    def flip(raw: bytes) -> bytes:
        buf = bytearray(raw)
        mid = len(buf) // 2
        for i in range(mid, mid + 24):
            buf[i] ^= 0x5A
        return bytes(buf)

    if fmt == "lmdb":
        import lmdb
        env = lmdb.open(location, max_dbs=8)
        db = env.open_db(b"data")
        with env.begin(write=True) as txn:
            k = struct.pack(">Q", index)
            txn.put(k, flip(bytes(txn.get(k, db=db))), db=db)
        env.close()
    elif fmt == "hdf5":
        import h5py
        with h5py.File(location, "r+") as f:
            lo, hi = (int(v) for v in f["jpeg_offsets"][index:index + 2])
            raw = f["jpeg_bytes"][lo:hi].tobytes()
            f["jpeg_bytes"][lo:hi] = np.frombuffer(flip(raw), np.uint8)
    elif fmt == "mongo":
        from bson import Binary

        from tests import mongo_support
        _, db, coll = mongo_support.split_location(location)
        client = mongo_support.client_for(location)
        try:
            doc = client[db][coll].find_one({"_id": index})
            client[db][coll].update_one({"_id": index}, {"$set": {"data": Binary(flip(bytes(doc["data"])))}})
        finally:
            client.close()
    else:
        pytest.skip(f"no damage helper for format {fmt}")


def _build_damaged(kind, fmt, location_for, boxes_dataset, classes_dataset):
    loc = location_for(f"rep_{kind}")
    if kind == "boxes":
        images, labels = boxes_dataset
    else:
        images, labels = classes_dataset, None
    rep = packer.build(images, labels, loc, fmt, workers=1)
    assert rep.published
    # A record outside the thumbnail prefix of the seeded sample: the grid keeps THUMBS pictures.
    victim = int(sample_indices(rep.records, 2000, seed=0)[-1])
    damage_record(fmt, loc, victim)
    with open_store(loc, fmt) as reader:
        key = reader.get(victim).key
    return loc, key


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["boxes", "class"])
def test_report_renders_in_a_real_browser(kind, fmt, location_for, boxes_dataset, classes_dataset, tmp_path):
    loc, bad_key = _build_damaged(kind, fmt, location_for, boxes_dataset, classes_dataset)
    ver = packer.verify(loc, format=fmt)
    assert [p.key for p in ver.problems] == [bad_key]
    out = write_html(tmp_path / "report.html", loc, format=fmt, verify_report=ver, thumbs=THUMBS)
    html = out.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained
    assert out.stat().st_size < 3 << 20

    page = browser.load(out, tmp_path / "browser")
    assert 'data-probe="done"' in page.dom, "the probe did not run: the page did not load"
    assert 'data-broken-images="0"' in page.dom, page.console
    assert page.console == [], page.console
    assert page.count(r'<figure class="thumb"') == THUMBS
    assert set(re.findall(r'data-plot="([\w-]+)"', page.dom)) == PLOTS[kind]
    assert page.count(r'<tr class="damaged"') == 1
    assert f'<tr class="damaged" data-key="{bad_key}">' in page.dom
    assert 'data-status="bad"' in page.dom
    # The damaged JPEG still decodes (cleanly or with errors, flagged then): its thumbnail is shown.
    row = page.dom.split(f'data-key="{bad_key}">', 1)[1].split("</tr>", 1)[0]
    assert "checksum mismatch" in row and "<img" in row

    from PIL import Image
    shot = np.asarray(Image.open(page.screenshot).convert("RGB"))
    assert shot.std() > 20, "screenshot is blank"
    assert len(np.unique(shot.reshape(-1, 3), axis=0)) > 2000, "screenshot shows no pictures"
    assert np.abs(shot[5, 5].astype(int) - (0x1D, 0x23, 0x30)).max() < 12, "inline CSS not applied"


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_build_html_lists_rejected_inputs_in_browser(classes_dataset, tmp_path):
    import shutil
    images = tmp_path / "imgs"
    shutil.copytree(classes_dataset, images)
    (images / "cat" / "broken.jpg").write_bytes(corpus.damaged_set()["truncated.jpg"][0])
    (images / "cat" / "notes.txt").write_text("not an image")
    out = tmp_path / "s.lmdb"
    html = tmp_path / "build.html"
    r = CliRunner().invoke(cli, ["build", str(images), "-o", str(out), "-j", "1", "-q", "--html", str(html)])
    assert r.exit_code == 1  # not published: a damaged input under --on-corrupt fail
    page = browser.load(html, tmp_path / "browser", height=1200)
    assert page.console == [] and 'data-broken-images="0"' in page.dom
    assert '<tr class="build-rejected" data-key="cat/broken.jpg">' in page.dom
    assert '<tr class="build-ignored" data-key="cat/notes.txt">' in page.dom
    assert "truncated" in page.dom and 'data-published="no"' in page.dom


def test_cli_report_verify_sidecar_and_info(boxes_dataset, tmp_path):
    runner = CliRunner()
    images, labels = boxes_dataset
    out = tmp_path / "s.lmdb"
    assert runner.invoke(cli, ["build", str(images), str(labels), "-o", str(out), "-j", "1", "-q"]).exit_code == 0
    r = runner.invoke(cli, ["report", str(out), "-o", str(tmp_path / "a.html"), "-q"])
    assert r.exit_code == 0, r.output
    a = (tmp_path / "a.html").read_text()
    assert 'data-status="unknown"' in a and "never verified" in a
    assert a.count('<figure class="thumb"') == 24 and a.count('<figure class="plot"') == 8

    damage_record("lmdb", str(out), 5)
    r = runner.invoke(cli, ["verify", "-q", str(out), "--html", str(tmp_path / "v.html")])
    assert r.exit_code == 1
    side = json.loads((tmp_path / "s.lmdb.verify.json").read_text())
    assert side["ok"] is False and side["problems"][0]["index"] == 5 and side["when"]
    # A later report shows the saved verify result without verifying again.
    r = runner.invoke(cli, ["report", str(out), "-o", str(tmp_path / "b.html"), "--thumbs", "4"])
    assert r.exit_code == 0 and "html report:" in r.output
    b = (tmp_path / "b.html").read_text()
    assert 'data-status="bad"' in b and side["when"] in b and b.count('<tr class="damaged"') == 1
    # --verify re-checks and exits 1 on damage
    r = runner.invoke(cli, ["report", str(out), "-o", str(tmp_path / "c.html"), "--verify", "-q"])
    assert r.exit_code == 1 and (tmp_path / "c.html").exists()

    r = runner.invoke(cli, ["info", "--json", str(out), "--html", str(tmp_path / "i.html")])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert len(info["pixels"]["mean"]) == 3 and len(info["pixels"]["std"]) == 3
    assert info["pixels"]["records"] == 23 and info["pixels"]["skipped"] == 1  # the damaged one
    assert (tmp_path / "i.html").exists()
    r = runner.invoke(cli, ["info", str(out)])
    assert "normalize:    mean=" in r.output


def test_pixel_stats_match_a_full_decode(boxes_dataset, tmp_path):
    """The reduced-scale sample gives the Normalize numbers a full-resolution pass gives."""
    from packer.core.integrity import turbo_decode
    images, labels = boxes_dataset
    loc = str(tmp_path / "s.lmdb")
    packer.build(images, labels, loc, workers=1)
    with open_store(loc) as reader:
        st = pixel_stats(reader, 1000)
        px = np.concatenate([turbo_decode(reader.get(i).data).reshape(-1, 3) for i in range(len(reader))])
    assert st["records"] == 24 and st["skipped"] == 0
    mean, std = px.mean(0) / 255, px.std(0) / 255
    assert np.allclose(st["mean"], mean, atol=0.01), (st, mean)
    assert np.allclose(st["std"], std, rtol=0.06), (st, std)
    again = packer.info(loc).pixels
    assert again == packer.info(loc).pixels  # seeded: the same numbers every time


def test_report_samples_instead_of_reading_everything(tmp_path, monkeypatch):
    """A store bigger than the sample is read only at the sampled indices."""
    from packer.sample import make_dataset
    images, _ = make_dataset(tmp_path / "ds", 60, kind="classes", sizes=((24, 32),), seed=4)
    loc = str(tmp_path / "s.lmdb")
    packer.build(images, None, loc, workers=1)
    from packer.stores.lmdb import LMDBReader
    read = []
    orig = LMDBReader.get_many

    def counting(self, indices):
        read.extend(indices)
        return orig(self, indices)

    monkeypatch.setattr(LMDBReader, "get_many", counting)
    d = collect(loc, sample=20, thumbs=5, pixel_sample=10, seed=3)
    assert len(read) == 20 and len(set(read)) == 20
    assert len(d.sample.indices) == 20 and len(d.thumbs) == 5 and d.pixels["records"] == 10
    assert collect(loc, sample=20, thumbs=5, pixel_sample=10, seed=3).sample.indices == d.sample.indices


def test_hdf5_pixel_store_thumbnails_and_escaping(tmp_path):
    """Raw-pixel HDF5 records get thumbnails too; names from the data are HTML-escaped."""
    from packer.sample import make_dataset
    images, _ = make_dataset(tmp_path / "ds", 6, kind="classes", classes=("<i>cat&dog", "bird"), seed=5)
    loc = str(tmp_path / "p.h5")
    packer.build(images, None, loc, "hdf5", workers=1, store_options={"pixels": "32x32"})
    html = write_html(tmp_path / "r.html", loc, thumbs=6).read_text()
    assert html.count('<img class="thumb"') == 6
    assert "<i>cat" not in html and "&lt;i&gt;cat&amp;dog" in html
    assert "decoded pixels 32x32x3 uint8" in html


def test_unpublished_build_and_repair_reports(boxes_dataset, tmp_path):
    images, labels = boxes_dataset
    loc = str(tmp_path / "s.lmdb")
    packer.build(images, labels, loc, workers=1)
    with open_store(loc) as reader:
        key = reader.get(3).key
    repair = {"location": loc, "ok": True, "quarantined": [{"key": key, "reason": "checksum mismatch"}],
              "salvaged": [], "removed": 1}
    html = write_html(tmp_path / "r.html", loc, repair_report=repair, thumbs=0).read_text()
    assert f'<tr class="repair" data-key="{key}">' in html
    row = html.split(f'<tr class="damaged" data-key="{key}">', 1)[1].split("</tr>", 1)[0]
    assert "repair: quarantined" in row and "<img" in row
    rep = packer.BuildReport(location=str(tmp_path / "never.lmdb"), format="lmdb", published=False, records=0,
                          inputs=1, rejected=[{"path": "a.jpg", "reason": "truncated"}], converted=[],
                          notes=[], ignored=[], resumed_from=0, report_path="x", label_schema="class")
    html = write_html(tmp_path / "b.html", None, build_report=rep).read_text()
    assert '<tr class="build-rejected" data-key="a.jpg">' in html
    with pytest.raises(TypeError):
        write_html(tmp_path / "c.html")


def test_missing_matplotlib_says_what_to_install(boxes_dataset, tmp_path, monkeypatch):
    images, labels = boxes_dataset
    loc = str(tmp_path / "s.lmdb")
    packer.build(images, labels, loc, workers=1)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(DependencyError, match=r"packer-vision\[report\]"):
        write_html(tmp_path / "r.html", loc)
    assert not (tmp_path / "r.html").exists()
    r = CliRunner().invoke(cli, ["report", loc, "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "packer-vision[report]" in r.output


def test_label_shapes_and_drawing():
    from packer.report.images import draw_labels, label_shapes
    s = label_shapes(np.array([[1, 0.5, 0.5, 0.5, 0.5]], np.float32), "boxes", 40, 20, ["cat", "dog"])
    assert s.boxes.tolist() == [[10.0, 5.0, 30.0, 15.0]] and s.box_classes.tolist() == [1]
    assert s.caption == "1 box: dog"
    assert label_shapes(2, "class", 5, 5, ["a", "b"]).caption == "2"
    assert label_shapes(-1, "class", 5, 5, ["a"]).caption == "unlabeled"
    assert label_shapes(None, "boxes", 5, 5).caption == "no label"
    img = np.zeros((40, 80, 3), np.uint8)
    mask = np.zeros((20, 40), bool)
    mask[10:, 20:] = True   # bottom-right quarter, at half the image's resolution
    out = draw_labels(img, s.boxes, s.box_classes, ["cat", "dog"], [mask], scale=2.0)
    assert not img.any(), "the input was modified"
    assert out[10, 30:50].any() and out[30, 20].any()        # box edges (scaled x2) drawn
    assert out[35, 75].any() and not out[5, 75].any()        # the mask tints its region only


def test_thumbnails_follow_recorded_exif_orientation(tmp_path):
    """--exif record keeps the bytes unrotated: the thumbnail is rotated as the readers rotate."""
    import base64

    from packer.core.integrity import turbo_decode
    images = tmp_path / "imgs" / "a"
    images.mkdir(parents=True)
    (images / "rot.jpg").write_bytes(corpus.with_exif(corpus.good_jpeg(1, h=48, w=64), 6))
    loc = str(tmp_path / "s.lmdb")
    packer.build(tmp_path / "imgs", None, loc, workers=1, exif="record")
    d = collect(loc, thumbs=1)
    img = turbo_decode(base64.b64decode(d.thumbs[0].uri.split(",", 1)[1]))
    assert img.shape[0] > img.shape[1], img.shape   # 64x48 landscape bytes, shown as portrait


@pytest.mark.timeout(180)
def test_two_reports_at_once_each_write_a_whole_file(boxes_dataset, tmp_path):
    import threading
    images, labels = boxes_dataset
    loc = str(tmp_path / "s.lmdb")
    packer.build(images, labels, loc, workers=1)
    errors = []

    def one(seed):
        try:
            write_html(tmp_path / "r.html", loc, thumbs=4, seed=seed)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    html = (tmp_path / "r.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert html.count('<figure class="thumb"') == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_records_that_do_not_read_are_listed_without_a_picture(boxes_dataset, tmp_path):
    import lmdb
    images, labels = boxes_dataset
    loc = str(tmp_path / "s.lmdb")
    packer.build(images, labels, loc, workers=1)
    env = lmdb.open(loc, max_dbs=8)
    db = env.open_db(b"data")  # not inside the write transaction: open_db starts its own
    with env.begin(write=True) as txn:
        txn.delete(struct.pack(">Q", 7), db=db)
    env.close()
    ver = packer.verify(loc)
    key = next(p.key for p in ver.problems if p.key)
    d = collect(loc, verify_report=ver, thumbs=24)
    rows = [r for r in d.damaged if r["key"] == key]
    assert len(rows) == 1 and "image bytes are missing" in rows[0]["reason"]
    assert rows[0]["thumb"].uri is None and "does not read" in rows[0]["thumb"].note
    assert len(d.thumbs) == 23 and len(d.sample.indices) == 23
    html = write_html(tmp_path / "r.html", loc, verify_report=ver).read_text()
    row = html.split(f'<tr class="damaged" data-key="{key}">', 1)[1].split("</tr>", 1)[0]
    assert "does not read" in row and "<img" not in row


def test_objects_label_shapes():
    """COCO / VOC / YOLO-seg / masks labels ("objects" schema): boxes from the canonical
    normalized cx cy w h, polygon rings and PNG masks as masks, the image-level class as caption."""
    from packer.labels.model import encode_png
    from packer.report.images import label_shapes
    from tests.label_corpus import png

    mask = np.zeros((10, 20), np.uint8)
    mask[5:, :10] = 3
    label = {"format": "coco", "objects": [
        {"class": 1, "box": [0.5, 0.5, 0.5, 0.5], "polygon": [[0.25, 0.25, 0.75, 0.25, 0.75, 0.75]]},
        {"class": 0, "box": [0.1, 0.1, 0.2, 0.2]}], "mask": {"png": encode_png(png(mask))}}
    s = label_shapes(label, "objects", 40, 20, ["cat", "dog"])
    assert s.boxes.tolist() == [[10.0, 5.0, 30.0, 15.0], [0.0, 0.0, 8.0, 4.0]]
    assert s.box_classes.tolist() == [1, 0] and s.caption == "2 boxes: cat, dog"
    assert len(s.masks) == 2
    assert s.masks[0].tolist() == [[10.0, 5.0], [30.0, 5.0], [30.0, 15.0]]     # ring in pixels
    assert s.masks[1].shape == (10, 20) and s.masks[1][7, 2] and not s.masks[1][0, 0]
    assert label_shapes({"format": "csv", "class": 1, "objects": []}, "objects", 5, 5, ["a", "b"]).caption == "b"


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_report_of_a_coco_store_draws_its_objects(tmp_path):
    from tests.label_corpus import make_coco

    images, ann, _ = make_coco(tmp_path / "coco")
    loc = tmp_path / "coco.lmdb"
    rep = packer.build(images, ann, loc, workers=1)
    assert rep.published and rep.label_schema == "objects"
    out = write_html(tmp_path / "report.html", loc, thumbs=4)
    page = browser.load(out, tmp_path / "browser")
    assert 'data-broken-images="0"' in page.dom and page.console == [], page.console
    assert page.count(r'<figure class="thumb"') == 4
    # a.jpg holds a car and a zebra: its caption names both boxes drawn (COCO categories -> names)
    assert re.search(r"2 boxes: (car, zebra|zebra, car)", page.dom), page.dom[-3000:]
