"""Small things users see (issue 25): the messages for a missing or flat IMAGES folder, the mode
of the report files, the class plot of a box store, the thumbnail of a tiny image, and a quiet
Dask build that prints its damaged inputs once."""
from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.core.integrity import turbo_decode
from tests import REPO, corpus


def _cli(*args, timeout=120, umask=None):
    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _class_tree(root: Path, files: dict) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


# ---------------------------------------------------------------------------------------------
# The front door: IMAGES that does not exist, a flat IMAGES without LABELS
# ---------------------------------------------------------------------------------------------
def test_missing_images_path_says_it_does_not_exist(tmp_path):
    r = _cli("build", tmp_path / "nope", "-o", tmp_path / "o.lmdb")
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path / 'nope'}: IMAGES does not exist" in r.stderr
    assert "must be a folder" not in r.stderr


def test_flat_folder_without_labels_lists_a_few_files_and_counts_the_rest(tmp_path):
    images = _class_tree(tmp_path / "flat", {f"img{i:02d}.jpg": corpus.good_jpeg(i) for i in range(43)})
    r = _cli("build", images, "-o", tmp_path / "o.lmdb")
    assert r.returncode == 1, r.stderr
    listed = [line for line in r.stderr.splitlines() if "not in a class folder" in line]
    assert len(listed) == 10, r.stderr
    assert "... and 33 more" in r.stderr
    assert "43 image(s) are directly in" in r.stderr
    assert len(r.stderr.splitlines()) <= 13, r.stderr


# ---------------------------------------------------------------------------------------------
# Report files are written with the mode any file gets (umask), as the build's report is
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
@pytest.mark.parametrize("umask,expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_html_report_and_verify_sidecar_honour_the_umask(tmp_path, umask, expected):
    pytest.importorskip("matplotlib")
    images = _class_tree(tmp_path / "images", {"a/1.jpg": corpus.good_jpeg(1), "b/2.jpg": corpus.good_jpeg(2)})
    store = tmp_path / "s.lmdb"
    r = _cli("build", images, "-o", store, "-j", "1", umask=umask)
    assert r.returncode == 0, r.stderr
    assert _mode(f"{store}.report.json") == expected   # the build's report: the reference
    r = _cli("verify", store, "--html", tmp_path / "v.html", umask=umask)
    assert r.returncode == 0, r.stderr
    assert _mode(f"{store}.verify.json") == expected
    assert _mode(tmp_path / "v.html") == expected
    r = _cli("report", store, "-o", tmp_path / "r.html", umask=umask)
    assert r.returncode == 0, r.stderr
    assert _mode(tmp_path / "r.html") == expected


def test_rewritten_report_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    from packer.report.sidecar import write_atomic

    path = tmp_path / "r.html"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o640


# ---------------------------------------------------------------------------------------------
# The report: every class in the class plot, a tiny image's thumbnail visible
# ---------------------------------------------------------------------------------------------
def _boxes_store(tmp_path: Path, images: dict, rows: dict, names: list) -> Path:
    img_dir = _class_tree(tmp_path / "images", images)
    lab_dir = tmp_path / "labels"
    for rel, text in rows.items():
        (lab_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (lab_dir / rel).write_text(text)
    (lab_dir / "classes.txt").write_text("\n".join(names) + "\n")
    out = tmp_path / "b.lmdb"
    rep = packer.build(img_dir, lab_dir, out, workers=1)
    assert rep.published
    return out


def _classes_plot(html: str) -> tuple[str, dict]:
    fig = re.search(r'<figure class="plot" data-plot="classes">(.*?)</figure>', html, re.S)
    assert fig, "no class plot"
    title = re.search(r'alt="([^"]*)"', fig.group(1)).group(1)
    table = dict(re.findall(r"<tr><td>([^<]*)</td><td>(\d+)</td></tr>", fig.group(1)))
    return title, {k: int(v) for k, v in table.items()}


def test_class_plot_of_a_box_store_shows_classes_without_boxes(tmp_path):
    pytest.importorskip("matplotlib")
    from packer.report import write_html

    store = _boxes_store(tmp_path, {"1.jpg": corpus.good_jpeg(1), "2.jpg": corpus.good_jpeg(2)},
                         {"1.txt": "0 0.5 0.5 0.2 0.2\n2 0.3 0.3 0.1 0.1\n", "2.txt": "0 0.4 0.4 0.2 0.2\n"},
                         ["cat", "dog", "zebra", "yak"])
    html = write_html(tmp_path / "r.html", store, thumbs=0).read_text()
    title, counts = _classes_plot(html)
    assert title == "Class distribution (4 classes)"
    assert counts == {"cat": 2, "dog": 0, "zebra": 1, "yak": 0}


def test_class_plot_of_a_class_store_shows_empty_classes(tmp_path):
    pytest.importorskip("matplotlib")
    from packer.report import write_html

    images = _class_tree(tmp_path / "images", {"a/1.jpg": corpus.good_jpeg(1), "c/2.jpg": corpus.good_jpeg(2),
                                               "c/3.jpg": corpus.good_jpeg(3)})
    (tmp_path / "names.txt").write_text("a\nb\nc\n")
    store = tmp_path / "c.lmdb"
    assert packer.build(images, None, store, workers=1, classes=tmp_path / "names.txt").published
    title, counts = _classes_plot(write_html(tmp_path / "r.html", store, thumbs=0).read_text())
    assert title == "Class distribution (3 classes)" and counts == {"a": 1, "b": 0, "c": 2}


def _thumb_sizes(html: str) -> dict:
    """data-key -> (height, width) of each sample thumbnail, decoded from its data URI."""
    out = {}
    for key, b64 in re.findall(r'<figure class="thumb" data-key="([^"]*)"><img class="thumb" '
                               r'src="data:image/jpeg;base64,([^"]*)"', html):
        out[key] = turbo_decode(base64.b64decode(b64)).shape[:2]
    return out


def test_thumbnail_of_a_tiny_image_is_enlarged_not_a_dot(tmp_path):
    pytest.importorskip("matplotlib")
    from packer.report import write_html

    images = _class_tree(tmp_path / "images", {"a/tiny.jpg": corpus.good_jpeg(1, h=10, w=5),
                                               "a/big.jpg": corpus.good_jpeg(2, h=300, w=400)})
    store = tmp_path / "t.lmdb"
    assert packer.build(images, None, store, workers=1).published
    sizes = _thumb_sizes(write_html(tmp_path / "r.html", store, thumbs=2).read_text())
    assert set(sizes) == {"a/tiny.jpg", "a/big.jpg"}
    assert sizes["a/tiny.jpg"] == (160, 80)          # 16x, nearest-neighbour: aspect kept
    assert sizes["a/big.jpg"] == (120, 160)          # large images still shrink to 160 px


def test_enlarged_thumbnail_is_nearest_neighbour():
    from packer.report.images import enlarge

    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    big = enlarge(img, 12)
    assert big.shape == (8, 12, 3)
    assert np.array_equal(big[::4, ::4], img) and np.array_equal(big[3, 11], img[0, 2])


# ---------------------------------------------------------------------------------------------
# A quiet Dask build is quiet, and lists each damaged input once
# ---------------------------------------------------------------------------------------------
def _need_dask():
    try:
        import distributed  # noqa: F401  (only whether it imports)
    except ImportError:
        if os.environ.get("PACKER_REQUIRE_DASK"):
            raise
        pytest.skip("dask.distributed is not installed (pip install 'packer-vision[dask]')")


@pytest.mark.dask
@pytest.mark.timeout(330)
@pytest.mark.parametrize("quiet", [True, False], ids=["q", "default"])
def test_dask_build_logs_at_packers_level_and_lists_damage_once(tmp_path, quiet):
    _need_dask()
    images = _class_tree(tmp_path / "images", {f"{c}/{i}.jpg": corpus.good_jpeg(i) for i, c in
                                               enumerate("aabbab")})
    (images / "b" / "bad.jpg").write_bytes(b"garbage, not a JPEG")
    out = tmp_path / "d.packer-manifest.json"
    args = ["build", images, "-o", out, "--engine", "dask", "--shards", "2", "--dask-workers", "1",
            "--on-corrupt", "skip"] + (["-q"] if quiet else [])
    r = _cli(*args, timeout=300)   # a LocalCluster starts slowly on a busy machine
    assert r.returncode == 1, r.stderr[-3000:]   # published, with a damaged input left out
    assert json.loads(Path(f"{out}.report.json").read_text())["published"] is True
    assert not re.search(r"^INFO", r.stderr, re.M), r.stderr[-3000:]
    assert "distributed." not in r.stderr and "Scheduler" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.count("bad.jpg") == 1, r.stderr[-3000:]
    assert "damaged: b/bad.jpg: not an image" in r.stderr
