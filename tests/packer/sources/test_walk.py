"""The IMAGES walk: special files are ignored without being opened; symbolic links are followed
as torchvision's ImageFolder follows them, with loops reported instead of followed forever."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import packer
from packer.jobs.steps import check_one
from packer.sources.folders import collect_sources, list_images
from packer.stores import open_store
from tests import REPO, corpus


def _tree(root: Path, files: dict) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


@pytest.mark.timeout(120)
def test_fifo_socket_and_device_among_images_are_ignored_not_opened(tmp_path):
    images = tmp_path / "images"
    _tree(images, {"a/1.jpg": corpus.good_jpeg(1), "b/2.jpg": corpus.good_jpeg(2)})
    os.mkfifo(images / "a" / "x.jpg")
    os.mkfifo(images / "a" / "noext")          # would block the sniffing of its first bytes
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(images / "b" / "s.png"))
    os.symlink("/dev/null", images / "b" / "dev.jpg")   # a character device, through a link
    out = tmp_path / "o.lmdb"
    # In a subprocess: were anything opened, it would block and the timeout would fail the test.
    code = (f"import packer; r = packer.build({str(images)!r}, None, {str(out)!r}, workers=2)\n"
            "print(sorted(r.ignored), r.records, r.published)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    sock.close()
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "['a/noext', 'a/x.jpg', 'b/dev.jpg', 'b/s.png'] 2 True"
    assert "a FIFO (named pipe)" in r.stderr and "a socket" in r.stderr and "a device file" in r.stderr


def test_worker_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "late.jpg"
    os.mkfifo(fifo)
    pos, rec, reason = check_one((0, str(fifo), "late.jpg", 95, "apply", None, 0))
    assert rec is None and "not a regular file" in reason


def test_symlinked_class_folders_and_images_are_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _tree(elsewhere, {"dogs/d1.jpg": corpus.good_jpeg(3), "dogs/d2.jpg": corpus.good_jpeg(4),
                      "birds/b1.jpg": corpus.good_jpeg(5), "single.jpg": corpus.good_jpeg(6)})
    images = tmp_path / "images"
    _tree(images, {"cats/c1.jpg": corpus.good_jpeg(7)})
    os.symlink(elsewhere / "dogs", images / "dogs")
    os.symlink(elsewhere / "birds", images / "birds")
    os.symlink(elsewhere / "single.jpg", images / "cats" / "linked.jpg")
    src = collect_sources(images)
    assert src.class_names == ["birds", "cats", "dogs"]
    assert src.keys == ["birds/b1.jpg", "cats/c1.jpg", "cats/linked.jpg", "dogs/d1.jpg", "dogs/d2.jpg"]
    out = tmp_path / "o.lmdb"
    rep = packer.build(images, None, out, workers=1)
    assert rep.published and rep.records == 5
    with open_store(out) as s:
        assert s.get(s.index_of("cats/linked.jpg")).data_ok()
        assert s.metadata.class_names == ["birds", "cats", "dogs"]


@pytest.mark.timeout(60)
def test_symlink_loops_are_reported_not_followed(tmp_path, caplog):
    images = tmp_path / "images"
    _tree(images, {"a/1.jpg": corpus.good_jpeg(1), "a/sub/2.jpg": corpus.good_jpeg(2)})
    os.symlink(images / "a", images / "a" / "sub" / "back")   # a/sub/back -> a: a loop
    os.symlink(images, images / "a" / "root")                 # a/root -> IMAGES: a loop
    os.symlink(tmp_path / "missing", images / "a" / "gone.jpg")  # broken link
    with caplog.at_level("WARNING"):
        keys, ignored = list_images(images)
    assert keys == ["a/1.jpg", "a/sub/2.jpg"]
    assert ignored == ["a/gone.jpg", "a/root/", "a/sub/back/"]
    assert "symbolic link loop" in caplog.text and "broken symbolic link" in caplog.text


def test_two_links_to_one_folder_are_both_walked(tmp_path):
    """Not a loop: like ImageFolder, each link is a folder of its own."""
    shared = tmp_path / "shared"
    _tree(shared, {"x.jpg": corpus.good_jpeg(1)})
    images = tmp_path / "images"
    images.mkdir()
    os.symlink(shared, images / "one")
    os.symlink(shared, images / "two")
    keys, ignored = list_images(images)
    assert keys == ["one/x.jpg", "two/x.jpg"] and ignored == []
