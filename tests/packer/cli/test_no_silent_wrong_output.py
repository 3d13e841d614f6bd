"""No silent wrong output: the format follows the output, impossible outputs are usage errors,
messages are printed once, logs get no progress-bar noise, reports survive a resume, and verify
says what is actually wrong."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.core.errors import UsageError
from packer.stores import available_formats, get_store, output_format
from tests import REPO, corpus


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(REPO), **extra)


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def small_images(tmp_path):
    images = tmp_path / "images"
    for i in range(6):
        p = images / f"c{i % 2}" / f"{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(corpus.good_jpeg(i, 40, 56))
    return images


@pytest.mark.parametrize("out,fmt", [("x.h5", "hdf5"), ("x.HDF5", "hdf5"), ("x.lmdb", "lmdb"),
                                     ("x", "lmdb"), ("dir/x", "lmdb"), ("x.2024", "lmdb"),
                                     ("mongodb://h:1/db/c", "mongo"), ("mongodb+srv://h/db/c", "mongo")])
def test_output_format_inferred_from_the_output(out, fmt):
    assert output_format(out) == fmt


def test_every_suffix_and_scheme_comes_from_the_registry():
    for name in available_formats():
        cls = get_store(name)
        for suffix in cls.suffixes:
            assert output_format("out" + suffix) == name
        for scheme in cls.schemes:
            assert output_format(scheme + "host/db/coll") == name


@pytest.mark.parametrize("out,fmt,words", [
    ("s3://bucket/x", None, "no store format writes to s3://"),
    ("gs://bucket/x.h5", None, "gs://"),
    ("http://example.com/x", "lmdb", "http://"),
    ("x.h5", "lmdb", "--format lmdb contradicts the output's suffix .h5"),
    ("x.lmdb", "hdf5", "contradicts"),
    ("mongodb://h/db/c", "hdf5", "contradicts the output, a mongodb:// URL"),
    ("local/path", "mongo", "needs an output URL"),
    ("dir/x.data", None, "no store format has the suffix .data (known: .h5, .hdf5, .lmdb"),
    ("train.hd5", None, "say the format with --format"),
])
def test_impossible_or_contradicting_outputs_are_refused(out, fmt, words):
    """Also an unknown suffix without --format: ``train.hd5`` must not silently become LMDB."""
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(".", r"\.")):
        output_format(out, fmt)


def test_cli_h5_output_builds_hdf5_without_format(runner, small_images, tmp_path):
    out = tmp_path / "x.h5"
    r = runner.invoke(cli, ["build", str(small_images), "-o", str(out), "-j", "1", "-q"])
    assert r.exit_code == 0, r.output
    assert h5py.is_hdf5(out)
    assert packer.info(out).format == "hdf5"


def test_cli_refuses_s3_and_contradictions_with_exit_2(runner, small_images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(cli, ["build", str(small_images), "-o", "s3://bucket/train", "-j", "1"])
    assert r.exit_code == 2 and "s3://bucket/train" in r.output and "s3://" in r.output
    assert not (tmp_path / "s3:").exists()
    r = runner.invoke(cli, ["build", str(small_images), "-o", "x.h5", "--format", "lmdb", "-j", "1"])
    assert r.exit_code == 2 and "contradicts" in r.output
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "x.h5.partial").exists()


@pytest.mark.parametrize("cmd", ["verify", "info"])
def test_verify_and_info_of_a_missing_path_are_usage_errors(runner, tmp_path, cmd):
    r = runner.invoke(cli, [cmd, str(tmp_path / "nope.lmdb")])
    assert r.exit_code == 2
    assert "nope.lmdb: no such file or folder" in r.output


@pytest.mark.timeout(120)
def test_damaged_input_printed_once_and_no_progress_noise_in_logs(small_images, tmp_path):
    (small_images / "c0" / "broken.jpg").write_bytes(corpus.good_jpeg(9)[:300])
    r = subprocess.run([sys.executable, "-m", "packer", "build", str(small_images), "-o",
                        str(tmp_path / "o.lmdb"), "-j", "1"], capture_output=True, text=True,
                       timeout=100, env=_env())
    assert r.returncode == 1
    assert r.stderr.count("broken.jpg") == 1, r.stderr
    assert "\r" not in r.stderr and "packing" not in r.stderr


@pytest.mark.timeout(120)
def test_progress_bar_on_a_terminal(small_images, tmp_path):
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # as a real terminal
    proc = subprocess.Popen([sys.executable, "-m", "packer", "build", str(small_images), "-o",
                             str(tmp_path / "o.lmdb"), "-j", "1"], stdout=subprocess.PIPE, stderr=slave,
                            env=_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:   # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=100)
    os.close(master)
    assert proc.returncode == 0
    assert b"packing" in b"".join(chunks)


@pytest.mark.timeout(200)
def test_resumed_build_report_keeps_the_earlier_runs_entries(tmp_path):
    images = tmp_path / "images"
    files = {}
    for i in range(40):
        files[f"c{i % 2}/{i:03d}.jpg"] = corpus.jpeg_of_shape(300, 400, seed=i)
    files["c0/000_png_named.jpg"] = corpus.png_bytes(1)[0]          # converted, first input
    files["c0/001_trailing.jpg"] = corpus.good_jpeg(3) + b"junk"     # a note, second input
    files["c1/zzz.png"] = corpus.png_bytes(2)[0]                      # converted, last input
    for rel, data in files.items():
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        (images / rel).write_bytes(data)
    out = tmp_path / "o.lmdb"
    cmd = [sys.executable, "-m", "packer", "build", str(images), "-o", str(out), "-j", "1", "-q",
           "--commit-mb", "1"]
    r = subprocess.run(cmd, capture_output=True, timeout=100, env=_env(PACKER_FAULT_KILL_AFTER_COMMITS="1"))
    assert r.returncode == -9
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=_env())
    assert r.returncode == 0, r.stderr
    rep = json.loads(Path(f"{out}.report.json").read_text())
    assert rep["resumed_from"] > 2
    assert {c["path"] for c in rep["converted"]} == {"c0/000_png_named.jpg", "c1/zzz.png"}
    assert [n["path"] for n in rep["notes"]] == ["c0/001_trailing.jpg"]
    stats = packer.info(out).metadata["stats"]
    assert stats["converted"] == len(rep["converted"]) and stats["with_notes"] == len(rep["notes"])


def test_hdf5_damaged_chunk_is_not_also_an_index_mismatch(small_images, tmp_path):
    out = tmp_path / "s.h5"
    assert packer.build(small_images, None, out, workers=1).published
    with h5py.File(out, "r") as f:
        info = f["jpeg_bytes"].id.get_chunk_info(0)
    with open(out, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        b = fh.read(1)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    rep = packer.verify(out)
    assert not rep.ok
    assert all(p.key is not None for p in rep.problems), [str(p) for p in rep.problems]
    assert not any("index checksum" in p.reason for p in rep.problems)
    assert all("damaged chunk" in p.reason for p in rep.problems)


def test_index_mismatch_still_reported_when_every_record_reads(small_images, tmp_path):
    """A renamed key with its record checksum intact is what the index checksum is for."""
    import lmdb
    out = tmp_path / "s.lmdb"
    assert packer.build(small_images, None, out, workers=1).published
    env = lmdb.open(str(out), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True, db=meta) as txn:
        m = json.loads(txn.get(b"metadata"))
        m["index_checksum"] = "0" * len(m["index_checksum"])
        txn.put(b"metadata", json.dumps(m).encode())
    env.close()
    rep = packer.verify(out)
    assert [p.reason for p in rep.problems if p.key is None] and "index checksum mismatch" in rep.problems[-1].reason
