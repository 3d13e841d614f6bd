"""The packer CLI through click's CliRunner: output, --json and exit codes (0 / 1 / 2)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from packer.cli import cli
from tests import corpus


@pytest.fixture
def runner():
    return CliRunner()


def test_build_verify_info(runner, boxes_dataset, tmp_path):
    images, labels = boxes_dataset
    out = tmp_path / "s.lmdb"
    r = runner.invoke(cli, ["build", str(images), str(labels), "-o", str(out), "-j", "1", "-q"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s.lmdb.report.json").exists()
    r = runner.invoke(cli, ["verify", "--deep", str(out)])
    assert r.exit_code == 0 and "OK (24 records, decoded)" in r.output
    r = runner.invoke(cli, ["info", str(out)])
    assert r.exit_code == 0 and "records:      24" in r.output and "labels:       boxes" in r.output
    r = runner.invoke(cli, ["info", "--json", str(out)])
    info = json.loads(r.output)
    assert info["count"] == 24 and info["metadata"]["stats"]["inputs"] == 24


def test_build_json_and_damaged_inputs(runner, classes_dataset, tmp_path):
    import shutil
    images = tmp_path / "imgs"
    shutil.copytree(classes_dataset, images)
    (images / "cat" / "broken.jpg").write_bytes(corpus.damaged_set()["truncated.jpg"][0])
    out = tmp_path / "s.lmdb"
    r = runner.invoke(cli, ["build", str(images), "-o", str(out), "-j", "1", "--json"])
    assert r.exit_code == 1
    rep = json.loads(r.output)
    assert rep["published"] is False
    assert rep["rejected"] == [{"path": "cat/broken.jpg", "reason": rep["rejected"][0]["reason"]}]
    assert "truncated" in rep["rejected"][0]["reason"]
    assert not out.exists()
    r = runner.invoke(cli, ["build", str(images), "-o", str(out), "-j", "1", "-q", "--on-corrupt", "skip"])
    assert r.exit_code == 1  # published, but the damaged input is reflected in the exit code
    assert "cat/broken.jpg" in r.output and out.exists()
    r = runner.invoke(cli, ["verify", "--json", str(out)])
    assert r.exit_code == 0 and json.loads(r.output)["ok"] is True


def test_verify_lists_bad_records_and_exits_1(runner, boxes_dataset, tmp_path):
    import struct

    import lmdb
    images, labels = boxes_dataset
    out = tmp_path / "s.lmdb"
    assert runner.invoke(cli, ["build", str(images), str(labels), "-o", str(out), "-j", "1", "-q"]).exit_code == 0
    env = lmdb.open(str(out), max_dbs=8)
    db = env.open_db(b"data")
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", 2), b"\xff\xd8junk", db=db)
    env.close()
    r = runner.invoke(cli, ["verify", str(out)])
    assert r.exit_code == 1
    assert "BAD key 'part0/img_00004.jpg' (index 2): checksum mismatch" in r.output
    r = runner.invoke(cli, ["verify", "--json", str(out)])
    rep = json.loads(r.output)
    assert rep["ok"] is False and rep["problems"][0]["key"] == "part0/img_00004.jpg"


def test_usage_errors_exit_2(runner, boxes_dataset, tmp_path):
    images, labels = boxes_dataset
    assert runner.invoke(cli, ["build", str(images)]).exit_code == 2  # no -o
    assert runner.invoke(cli, ["build", str(images), "-o", "x", "--format", "zip"]).exit_code == 2
    out = tmp_path / "s.lmdb"
    assert runner.invoke(cli, ["build", str(images), str(labels), "-o", str(out), "-q", "-j", "1"]).exit_code == 0
    r = runner.invoke(cli, ["build", str(images), str(labels), "-o", str(out), "-q"])
    assert r.exit_code == 2 and "already exists" in r.output and "--overwrite" in r.output
    r = runner.invoke(cli, ["build", str(images), str(labels), "-o", str(tmp_path / "o.lmdb"), "-O", "bogus=1"])
    assert r.exit_code == 2 and "bogus" in r.output


def test_label_problems_exit_1_with_paths(runner, tmp_path):
    (tmp_path / "i").mkdir()
    (tmp_path / "i" / "a.jpg").write_bytes(corpus.good_jpeg(0))
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "a.txt").write_text("0 0.5 0.5 0.2\n")
    r = runner.invoke(cli, ["build", str(tmp_path / "i"), str(tmp_path / "l"), "-o", str(tmp_path / "s.lmdb")])
    assert r.exit_code == 1
    assert f"{tmp_path / 'l' / 'a.txt'}:1: expected 5 values" in r.output
    assert not (tmp_path / "s.lmdb").exists() and not (tmp_path / "s.lmdb.partial").exists()


def test_formats_lists_registry(runner):
    r = runner.invoke(cli, ["formats"])
    assert r.exit_code == 0 and "lmdb:" in r.output
