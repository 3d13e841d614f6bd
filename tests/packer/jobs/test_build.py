"""Build policies for damaged inputs: nothing is silently dropped, padded or lost."""
from __future__ import annotations

import json

import pytest

import packer
from packer.core.errors import StoreError
from packer.core.records import checksum
from packer.stores import get_store, open_store
from tests import corpus


@pytest.fixture
def mixed_inputs(tmp_path):
    """Good JPEGs, odd-but-valid inputs (CMYK, PNG named .jpg, EXIF-rotated, progressive, gray,
    trailing bytes) and every damaged variant, in class folders."""
    root = tmp_path / "in"
    files = {f"good/{i}.jpg": corpus.good_jpeg(i, 40 + i, 50 + 2 * i) for i in range(6)}
    files["odd/cmyk.jpg"] = corpus.cmyk_jpeg(1)[0]
    files["odd/png_named.jpg"] = corpus.png_bytes(2)[0]
    files["odd/rotated.jpg"] = corpus.with_exif(corpus.good_jpeg(3, 30, 60), 6)
    files["odd/progressive.jpg"] = corpus.good_jpeg(4, progressive=True)
    files["odd/gray.jpg"] = corpus.encode_jpeg(corpus.rgb(5)[:, :, :1])
    files["odd/trailing.jpg"] = corpus.good_jpeg(6) + b"garbage"
    for name, (data, _) in corpus.damaged_set().items():
        files[f"bad/{name}"] = data
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root, files


def test_fail_policy_lists_every_damaged_input_and_publishes_nothing(mixed_inputs, tmp_path):
    root, files = mixed_inputs
    out = tmp_path / "s.lmdb"
    rep = packer.build(root, None, out, workers=2)
    assert not rep.published and not out.exists()
    damaged = corpus.damaged_set()
    assert sorted(r["path"] for r in rep.rejected) == sorted(f"bad/{n}" for n in damaged)
    for r in rep.rejected:
        assert damaged[r["path"].split("/")[1]][1] in r["reason"]
    report = json.loads((tmp_path / "s.lmdb.report.json").read_text())
    assert len(report["rejected"]) == len(damaged) and report["published"] is False
    # Rerunning with --on-corrupt skip resumes the checked work and publishes.
    rep2 = packer.build(root, None, out, workers=1, on_corrupt="skip")
    assert rep2.published and rep2.records == 12 and len(rep2.rejected) == len(damaged)
    assert rep2.resumed_from == len(files)


def test_skip_policy_keeps_odd_inputs_with_reasons(mixed_inputs, tmp_path):
    root, files = mixed_inputs
    out = tmp_path / "s.lmdb"
    rep = packer.build(root, None, out, workers=1, on_corrupt="skip")
    assert rep.published and not rep.ok
    assert rep.records + len(rep.rejected) == len(files)
    conv = {c["path"]: c["converted"] for c in rep.converted}
    assert conv["odd/png_named.jpg"] == "png->jpeg"
    assert conv["odd/cmyk.jpg"].endswith("->rgb")
    assert conv["odd/rotated.jpg"] == "exif-orientation 6 applied"
    assert rep.notes == [{"path": "odd/trailing.jpg", "note": "trimmed 7 bytes after EOI"}]
    with open_store(out) as r:
        by_key = {r.get(i).key: r.get(i) for i in range(r.metadata.count)}
        assert r.metadata.stats["rejected"] == len(rep.rejected)
    rot = by_key["odd/rotated.jpg"]
    assert (rot.width, rot.height) == (30, 60)
    assert by_key["odd/gray.jpg"].channels == 1
    for key, rec in by_key.items():  # the original file's checksum is always kept
        assert rec.source_checksum == checksum(files[key])
    assert packer.verify(out, deep=True).ok


def test_stop_policy_halts_at_first_damaged(mixed_inputs, tmp_path):
    root, _ = mixed_inputs
    rep = packer.build(root, None, tmp_path / "s.lmdb", workers=1, on_corrupt="stop")
    assert not rep.published and len(rep.rejected) == 1
    assert rep.rejected[0]["path"] == "bad/bitflip.jpg"  # first damaged file in sorted order
    assert not get_store("lmdb").exists(str(tmp_path / "s.lmdb"))


def test_cli_build_killed_mid_write_resumes(tmp_path):
    """A real SIGKILL at whatever point the build has reached, then the same command again."""
    import signal
    import subprocess
    import sys
    import time

    from packer.sample import make_dataset

    images, labels = make_dataset(tmp_path / "d", 60, kind="boxes", seed=5)
    ref, out = tmp_path / "ref.lmdb", tmp_path / "out.lmdb"
    packer.build(images, labels, ref, workers=1)
    cmd = [sys.executable, "-m", "packer.cli", "build", str(images), str(labels), "-o", str(out),
           "-j", "1", "-q", "--commit-mb", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (tmp_path / "out.lmdb.partial" / "data.mdb").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    result = subprocess.run(cmd, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    with open_store(ref) as a, open_store(out) as b:
        assert a.metadata.index_checksum == b.metadata.index_checksum
        assert [bytes(r.data) for r in a.get_many(range(60))] == [bytes(r.data) for r in b.get_many(range(60))]
    assert packer.verify(out, deep=True).ok


def test_stray_files_are_ignored_but_fake_images_are_damaged(tmp_path):
    root = tmp_path / "in" / "c"
    root.mkdir(parents=True)
    (root / "a.jpg").write_bytes(corpus.good_jpeg(0))
    (root / "LICENSE").write_text("MIT License\n")
    (root / "Makefile").write_text("all:\n")
    (root / "fake.png").write_text("not a png\n")
    out = tmp_path / "s.lmdb"
    rep = packer.build(tmp_path / "in", None, out, workers=1)
    assert [r["path"] for r in rep.rejected] == ["c/fake.png"] and not rep.published
    assert rep.ignored == ["c/LICENSE", "c/Makefile"]
    with pytest.raises(StoreError, match="not published yet"):
        packer.verify(out)
    rep = packer.build(tmp_path / "in", None, out, workers=1, on_corrupt="skip")
    assert rep.records == 1 and rep.ignored == ["c/LICENSE", "c/Makefile"]
    with open_store(out) as r:
        assert r.metadata.stats["ignored"] == 2 and "stray_files" not in r.metadata.stats
