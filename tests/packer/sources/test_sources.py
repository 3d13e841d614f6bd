"""Input discovery and label parsing: every problem reported with its path (and line)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from packer.core.errors import SourceError, UsageError
from packer.sources.folders import collect_sources
from tests import corpus


def _img(path, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(corpus.good_jpeg(seed, 16, 16))


def test_order_is_sorted_and_text_files_ignored(tmp_path):
    for name in ["b/2.jpg", "a/10.jpg", "a/9.jpg", "a/notes.txt", "a/.hidden.jpg"]:
        _img(tmp_path / "i" / name)
    src = collect_sources(tmp_path / "i")
    assert src.keys == ["a/10.jpg", "a/9.jpg", "b/2.jpg"]
    assert src.ignored == ["a/.hidden.jpg", "a/notes.txt"]
    assert src.label_schema == "class" and src.class_names == ["a", "b"] and src.labels == [0, 0, 1]


def test_yolo_folder_matched_by_relative_path_and_stem(tmp_path):
    _img(tmp_path / "i/x/1.jpg")
    _img(tmp_path / "i/y/1.png")
    (tmp_path / "l/x").mkdir(parents=True)
    (tmp_path / "l/y").mkdir(parents=True)
    (tmp_path / "l/x/1.txt").write_text("0 0.5 0.5 0.2 0.2\n3 0.1 0.1 0.1 0.1\n")
    (tmp_path / "l/y/1.txt").write_text("")
    src = collect_sources(tmp_path / "i", tmp_path / "l")
    assert src.label_schema == "boxes"
    assert src.labels[0].shape == (2, 5) and src.labels[0].dtype == np.float32
    assert src.labels[1].shape == (0, 5)


def test_label_problems_listed_with_path_and_line(tmp_path):
    _img(tmp_path / "i/1.jpg")
    _img(tmp_path / "i/2.jpg")
    _img(tmp_path / "i/3.jpg")
    (tmp_path / "l").mkdir()
    (tmp_path / "l/1.txt").write_text("0 0.5 0.5 0.2 0.2\n0 0.5 0.5\n")
    (tmp_path / "l/2.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (tmp_path / "l/4.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(SourceError) as err:
        collect_sources(tmp_path / "i", tmp_path / "l")
    text = "\n".join(err.value.problems)
    assert f"{tmp_path / 'l/1.txt'}:2: expected 5 values" in text
    assert f"{tmp_path / 'i/3.jpg'}: image without a label" in text
    assert f"{tmp_path / 'l/4.txt'}: label file without an image" in text
    assert len(err.value.problems) == 3


def test_allow_unlabeled(tmp_path):
    _img(tmp_path / "i/1.jpg")
    _img(tmp_path / "i/2.jpg")
    (tmp_path / "l").mkdir()
    (tmp_path / "l/1.json").write_text(json.dumps({"class": "cat"}))
    src = collect_sources(tmp_path / "i", tmp_path / "l", allow_unlabeled=True)
    assert src.labels == [0, -1] and src.class_names == ["cat"]


def test_csv_and_json_mapping_files(tmp_path):
    _img(tmp_path / "i/a.jpg")
    _img(tmp_path / "i/sub/b.jpg")
    (tmp_path / "labels.csv").write_text("path,label\na.jpg,dog\nsub/b.jpg,cat\n")
    src = collect_sources(tmp_path / "i", tmp_path / "labels.csv")
    assert src.class_names == ["cat", "dog"] and src.labels == [1, 0]
    (tmp_path / "labels.json").write_text(json.dumps({"a.jpg": [[1, .5, .5, .1, .1]], "sub/b.jpg": []}))
    src = collect_sources(tmp_path / "i", tmp_path / "labels.json")
    assert src.label_schema == "boxes" and src.labels[1].shape == (0, 5)
    (tmp_path / "bad.csv").write_text("a.jpg,1\nsub/b.jpg\nmissing.jpg,2\n")
    with pytest.raises(SourceError) as err:
        collect_sources(tmp_path / "i", tmp_path / "bad.csv")
    text = "\n".join(err.value.problems)
    assert "bad.csv:2: expected 2 columns" in text and "'missing.jpg', but there is no such image" in text


def test_bad_json_label_names_file_and_line(tmp_path):
    _img(tmp_path / "i/1.jpg")
    (tmp_path / "l").mkdir()
    (tmp_path / "l/1.json").write_text('{"class":\n  oops}')
    with pytest.raises(SourceError) as err:
        collect_sources(tmp_path / "i", tmp_path / "l")
    assert f"{tmp_path / 'l/1.json'}:2: invalid JSON" in err.value.problems[0]


def test_images_outside_class_folders_need_labels(tmp_path):
    _img(tmp_path / "i/1.jpg")
    with pytest.raises(SourceError, match="one folder per class"):
        collect_sources(tmp_path / "i")
    with pytest.raises(UsageError):
        collect_sources(tmp_path / "nope")


def test_csv_with_byte_order_mark(tmp_path):
    _img(tmp_path / "i/a.jpg")
    (tmp_path / "labels.csv").write_bytes("path,label\na.jpg,dog\n".encode("utf-8-sig"))
    src = collect_sources(tmp_path / "i", tmp_path / "labels.csv")
    assert src.labels == [0] and src.class_names == ["dog"]


def test_stray_files_do_not_need_labels(tmp_path):
    _img(tmp_path / "i/cat/1.jpg")
    (tmp_path / "i/LICENSE").write_text("MIT\n")
    (tmp_path / "i/cat/copyright").write_text("Format: ...\n")
    src = collect_sources(tmp_path / "i")
    assert src.keys == ["cat/1.jpg"] and src.ignored == ["LICENSE", "cat/copyright"]
