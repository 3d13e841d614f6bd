"""Hostile file names and folders in IMAGES (issue 26): a name that is not UTF-8, a symbolic link
loop between two files, a class folder the build cannot read. Each is listed in the build report
with its reason, none gives a traceback, and an input that cannot be read or stored stops the
build (exit 1) unless the user says to skip it (``--on-corrupt skip``)."""
from __future__ import annotations

import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

import packer
from packer.sources.folders import collect_sources
from packer.stores import open_store
from tests import REPO, corpus

BAD = "cats/bad\\xff.jpg"   # how the report shows b"cats/bad\xff.jpg"


def _images(root: Path) -> Path:
    for rel, seed in (("cats/1.jpg", 1), ("dogs/2.jpg", 2)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(corpus.good_jpeg(seed))
    return root


def _bad_name(folder: Path, name: bytes, data: bytes) -> None:
    """Create ``folder/name`` (raw bytes, not UTF-8); skip where the file system refuses it."""
    try:
        fd = os.open(os.fsencode(folder) + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        pytest.skip(f"this file system does not take a name that is not UTF-8: {exc}")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))


def _report(out: Path) -> dict:
    return json.loads(Path(f"{out}.report.json").read_text())


# ---------------------------------------------------------------------------------------------
# A file name that is not UTF-8
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_name_not_utf8_is_refused_and_listed_not_a_traceback(tmp_path):
    images = _images(tmp_path / "images")
    _bad_name(images / "cats", b"bad\xff.jpg", corpus.good_jpeg(3))
    out = tmp_path / "o.lmdb"
    r = _cli("build", images, "-o", out, "-j", "1")
    assert "Traceback" not in r.stderr and "UnicodeEncodeError" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"refused: {BAD}: file name is not valid UTF-8" in r.stderr
    assert "NOT published" in r.stderr and not out.exists()
    rep = _report(out)
    assert rep["published"] is False
    assert [(x["path"], x["kind"]) for x in rep["rejected"]] == [(BAD, "refused")]
    assert "rename it" in rep["rejected"][0]["reason"]

    # Told to skip it: the two good images are published, the refused one is still listed.
    r = _cli("build", images, "-o", out, "-j", "1", "--on-corrupt", "skip")
    assert "Traceback" not in r.stderr and r.returncode == 1, r.stderr[-3000:]
    assert f"refused: {BAD}" in r.stderr
    with open_store(out) as s:
        assert [s.get(i).key for i in range(len(s))] == ["cats/1.jpg", "dogs/2.jpg"]
        assert s.metadata.stats["rejected"] == 1
    assert [x["path"] for x in _report(out)["rejected"]] == [BAD]


def test_folder_name_not_utf8_is_refused_once(tmp_path):
    from packer.sources.folders import scan_images

    images = _images(tmp_path / "images")
    folder = os.fsencode(images) + b"/caf\xe9"
    os.mkdir(folder)
    _bad_name(Path(os.fsdecode(folder)), b"x.jpg", corpus.good_jpeg(4))
    _bad_name(Path(os.fsdecode(folder)), b"y.jpg", corpus.good_jpeg(5))
    walk = scan_images(images)
    assert walk.keys == ["cats/1.jpg", "dogs/2.jpg"]
    assert [(e["path"], e["kind"]) for e in walk.unreadable] == [("caf\\xe9/", "refused")]
    assert "folder name is not valid UTF-8" in walk.unreadable[0]["reason"]
    rep = packer.build(images, None, tmp_path / "o.lmdb", workers=1)
    assert not rep.published and [x["path"] for x in rep.rejected] == ["caf\\xe9/"]
    json.dumps(rep.to_dict(), ensure_ascii=False).encode("utf-8")   # printable, storable text


def test_display_path_escapes_only_what_is_not_utf8():
    from packer.sources.folders import display_path

    assert display_path(os.fsdecode(b"a/b\xff\xfe.jpg")) == "a/b\\xff\\xfe.jpg"
    assert display_path("a/caf\u00e9.jpg") == "a/caf\u00e9.jpg"


# ---------------------------------------------------------------------------------------------
# A symbolic link loop between two files
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_file_symlink_loop_is_ignored_with_its_reason(tmp_path):
    images = _images(tmp_path / "images")
    os.symlink("b.jpg", images / "cats" / "a.jpg")
    os.symlink("a.jpg", images / "cats" / "b.jpg")
    out = tmp_path / "o.lmdb"
    r = _cli("build", images, "-o", out, "-j", "1")
    assert "Traceback" not in r.stderr and "Too many levels" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 non-image file(s) ignored" in r.stdout
    rep = _report(out)
    assert rep["published"] and rep["records"] == 2
    assert rep["ignored"] == ["cats/a.jpg", "cats/b.jpg"]
    assert all("symbolic link loop" in rep["ignored_reasons"][k] for k in rep["ignored"])


# ---------------------------------------------------------------------------------------------
# A class folder the build cannot read
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def shared_tmp():
    """A temporary folder another user can reach, removed afterwards. Not tmp_path: pytest keeps
    /tmp/pytest-of-<user> private (0700) and makes it so again at the start of every session, so
    a chmod there is undone by any pytest run at the same time."""
    path = Path(tempfile.mkdtemp(prefix="packer-hostile-names-"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:   # give back what the test closed, so it can be removed
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(path)


def _run_as_nobody(args, timeout: float = 90) -> dict:
    """The CLI in a forked child that dropped root for ``nobody`` (setgid/setuid), so that file
    permissions apply. Forked, not exec'd: the interpreter and its packages may live where
    ``nobody`` cannot read. Returns ``{"code", "stdout", "stderr", "exception"}``."""
    from click.testing import CliRunner

    from packer.cli import cli

    nobody = pwd.getpwnam("nobody")
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 3
        try:
            os.close(r_fd)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            res = CliRunner().invoke(cli, [str(a) for a in args])
            exc = None
            if res.exception is not None and not isinstance(res.exception, SystemExit):
                exc = "".join(traceback.format_exception(*res.exc_info))
            os.write(w_fd, json.dumps({"code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
                                       "exception": exc}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w_fd)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r_fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the build as nobody did not finish in {timeout} s")
            chunk = os.read(r_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r_fd)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and chunks, "the child running as nobody failed"
    return json.loads(b"".join(chunks))


def _build_unreadable(args) -> dict:
    if os.geteuid() != 0:   # permissions already apply
        r = _cli(*args)
        return {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "exception": None}
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root and there is no user 'nobody' to drop privileges to")
    return _run_as_nobody(args)


@pytest.mark.timeout(180)
def test_unreadable_class_folder_fails_the_build_unless_skipped(shared_tmp):
    tmp_path = shared_tmp
    images = _images(tmp_path / "images")
    birds = images / "birds"
    birds.mkdir()
    for i in (3, 4):
        (birds / f"{i}.jpg").write_bytes(corpus.good_jpeg(i))
    # World-readable inputs, a world-writable output folder, then one class folder closed.
    for p in [images, *images.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    outdir = tmp_path / "out"
    outdir.mkdir()
    outdir.chmod(0o777)
    if os.geteuid() == 0:   # warm every import as root: the child cannot read the site-packages
        packer.build(images, None, tmp_path / "warm.lmdb", workers=1)
    birds.chmod(0)
    try:
        out = outdir / "o.lmdb"
        r = _build_unreadable(["build", images, "-o", out, "-j", "1"])
        assert r["exception"] is None and "Traceback" not in r["stderr"], r
        assert r["code"] == 1, r
        assert "unreadable: birds/: cannot read folder: Permission denied" in r["stderr"], r["stderr"]
        assert "NOT published" in r["stderr"] and not out.exists()
        rep = _report(out)
        assert [(x["path"], x["kind"]) for x in rep["rejected"]] == [("birds/", "unreadable")]

        # The user says to skip it: published without its images, listed; "birds" keeps its class id.
        r = _build_unreadable(["build", images, "-o", out, "-j", "1", "--on-corrupt", "skip"])
        assert r["exception"] is None and "Traceback" not in r["stderr"], r
        assert "unreadable: birds/" in r["stderr"]
        with open_store(out) as s:
            assert len(s) == 2 and s.metadata.class_names == ["birds", "cats", "dogs"]
            assert [s.get(i).label for i in range(2)] == [1, 2]
        assert [x["path"] for x in _report(out)["rejected"]] == ["birds/"]
    finally:
        birds.chmod(0o755)


def test_unreadable_folder_listed_by_the_walk(tmp_path, monkeypatch):
    """The same without privileges: os.walk's listing of one folder fails (as for chmod 000)."""
    images = _images(tmp_path / "images")
    real_scandir = os.scandir

    def scandir(path="."):
        if str(path).endswith("dogs"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    src = collect_sources(images)
    assert src.keys == ["cats/1.jpg"] and src.class_names == ["cats", "dogs"]
    assert src.unreadable == [{"path": "dogs/", "kind": "unreadable",
                               "reason": "cannot read folder: Permission denied; the images in it are left out"}]
    rep = packer.build(images, None, tmp_path / "o.lmdb", workers=1, on_corrupt="stop")
    assert not rep.published and rep.records == 0 and rep.rejected == src.unreadable
