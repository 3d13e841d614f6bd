"""The packer CLI through click's CliRunner: output, --json and exit codes (0 / 1 / 2)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from packer.cli import cli
from tests import REPO, corpus


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


# --- the format follows the output; an unknown suffix is refused -----------------------------
@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from packer.sample import make_dataset

    root = tmp_path_factory.mktemp("small")
    images, labels = make_dataset(root / "ds", 4, kind="boxes", seed=3)
    out = root / "s.lmdb"
    r = CliRunner().invoke(cli, ["build", str(images), str(labels), "-o", str(out), "-j", "1", "-q"])
    assert r.exit_code == 0, r.output
    return {"images": images, "labels": labels, "store": out}


def test_convert_takes_the_format_from_the_output(runner, small_store, tmp_path):
    import packer

    r = runner.invoke(cli, ["convert", str(small_store["store"]), str(tmp_path / "x.h5"), "-q"])
    assert r.exit_code == 0, r.output
    assert packer.info(tmp_path / "x.h5").format == "hdf5"
    assert packer.convert(small_store["store"], tmp_path / "y.hdf5").format == "hdf5"   # the library too
    r = runner.invoke(cli, ["convert", str(small_store["store"]), str(tmp_path / "bare"), "-q"])
    assert r.exit_code == 0 and packer.info(tmp_path / "bare").format == "lmdb"   # no suffix: lmdb


def test_merge_copy_takes_the_format_from_the_output(runner, small_store, tmp_path):
    import packer

    r = runner.invoke(cli, ["merge", str(small_store["store"]), "--copy", "-o", str(tmp_path / "m.h5"), "-q"])
    assert r.exit_code == 0, r.output
    assert packer.info(tmp_path / "m.h5").format == "hdf5"
    r = runner.invoke(cli, ["merge", str(small_store["store"]), "--copy", "-o", str(tmp_path / "m2"), "-q"])
    assert r.exit_code == 0 and packer.info(tmp_path / "m2").format == "lmdb"   # no suffix: the first input's


@pytest.mark.parametrize("command", ["build", "convert", "merge-copy"])
def test_an_unknown_output_suffix_is_refused_without_format(runner, small_store, tmp_path, command):
    out = tmp_path / "train.hd5"
    src = str(small_store["store"])
    argv = {"build": ["build", str(small_store["images"]), str(small_store["labels"]), "-o", str(out), "-j", "1"],
            "convert": ["convert", src, str(out)],
            "merge-copy": ["merge", src, "--copy", "-o", str(out)]}[command]
    r = runner.invoke(cli, argv + ["-q"])
    assert r.exit_code == 2, r.output
    for word in ("train.hd5", ".hd5", ".h5", ".hdf5", ".lmdb", "mongodb://", "--format"):
        assert word in r.stderr, (word, r.stderr)
    assert not out.exists() and not (tmp_path / "train.hd5.partial").exists()
    r = runner.invoke(cli, argv + ["-q", "--format", "lmdb"])   # said: accepted
    assert r.exit_code == 0, r.output
    assert (out / "data.mdb").exists()


# --- inputs given the wrong way round, a LABELS folder without labels -------------------------
def test_swapped_images_and_labels_are_named(runner, small_store, tmp_path):
    images, labels = small_store["images"], small_store["labels"]
    r = runner.invoke(cli, ["build", str(labels), str(images), "-o", str(tmp_path / "s.lmdb")])
    assert r.exit_code == 2
    assert "no files found" not in r.stderr
    assert f"{labels}: IMAGES holds 4 label file(s)" in r.stderr and "no images" in r.stderr
    assert "the order is IMAGES [LABELS]" in r.stderr and f"packer build {images} {labels}" in r.stderr


def test_an_empty_labels_folder_is_one_summary_line(runner, small_store, tmp_path):
    (tmp_path / "labels").mkdir()
    r = runner.invoke(cli, ["build", str(small_store["images"]), str(tmp_path / "labels"), "-o",
                            str(tmp_path / "s.lmdb"), "-j", "1"])
    assert r.exit_code == 1
    lines = r.stderr.splitlines()
    assert lines[0] == (f"error: {tmp_path / 'labels'} holds no label: 4 image(s) have no label; nothing was "
                        f"written (pass --no-labels to build without labels, or --allow-unlabeled to keep them "
                        f"unlabeled)")
    assert len(lines) == 5 and lines[-1] == "  ... and 1 more"   # three examples, not one line per image


# --- Ctrl-C says what it leaves ----------------------------------------------------------------
def _interrupt_at(monkeypatch, call: int, commit_first: bool):
    from packer.stores.staging import Stage

    real, calls = Stage.add, []

    def add(self, rec, **kwargs):
        calls.append(rec)
        if len(calls) == call:
            if commit_first:
                self.writer.flush()   # the records staged so far, committed as a batch would be
            raise KeyboardInterrupt
        return real(self, rec, **kwargs)

    monkeypatch.setattr(Stage, "add", add)


def test_ctrl_c_before_the_first_commit_says_nothing_is_kept(runner, small_store, tmp_path, monkeypatch):
    _interrupt_at(monkeypatch, 1, commit_first=False)
    r = runner.invoke(cli, ["build", str(small_store["images"]), str(small_store["labels"]), "-o",
                            str(tmp_path / "s.lmdb"), "-j", "1", "-q"])
    assert r.exit_code == 130
    assert "committed so far is kept" not in r.stderr
    assert "interrupted before anything was committed; nothing is kept to resume from" in r.stderr


def test_ctrl_c_after_a_commit_names_what_is_kept(runner, small_store, tmp_path, monkeypatch):
    out = tmp_path / "s.lmdb"
    _interrupt_at(monkeypatch, 3, commit_first=True)
    r = runner.invoke(cli, ["build", str(small_store["images"]), str(small_store["labels"]), "-o", str(out),
                            "-j", "1", "-q"])
    assert r.exit_code == 130
    assert f"the work committed so far is kept in {out}.partial (rerun the same command to resume)" in r.stderr
    monkeypatch.undo()
    r = runner.invoke(cli, ["build", str(small_store["images"]), str(small_store["labels"]), "-o", str(out),
                            "-j", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["resumed_from"] > 0


# --- a Dask build names the output as given ----------------------------------------------------
@pytest.mark.dask
@pytest.mark.timeout(330)
def test_dask_build_prints_the_output_as_given(small_store, tmp_path):
    import os
    import subprocess
    import sys

    pytest.importorskip("dask.distributed", reason="dask.distributed is not installed")
    root = REPO
    r = subprocess.run([sys.executable, "-m", "packer", "build", str(small_store["images"]),
                        str(small_store["labels"]), "-o", "d.packer-manifest.json", "--engine", "dask",
                        "--shards", "2", "--dask-workers", "1"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(root)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["d.packer-manifest.json: 4 records (manifest, labels: boxes)",
                                     "report: d.packer-manifest.json.report.json"], r.stdout + r.stderr
