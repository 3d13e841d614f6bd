"""Writing onto a full disk (issue 26): every command that writes ends with one clear line,
exit 1, never a traceback or a crash, and keeps its staging area so that a rerun after making
room resumes to a store that verifies.

The disk is a real small file system: a tmpfs of 20 MiB mounted under tmp_path, enlarged in
place (``mount -o remount,size=200m``) before the rerun. Mounting needs root: elsewhere these
tests skip, unless ``PACKER_REQUIRE_SMALLFS=1`` (scripts/test.sh) makes that a failure.

The images are incompressible (noise JPEGs, about 54 MB), so no store can squeeze them in.
Two paths are covered: the free-space estimates refusing before writing (the default), and,
with ``PACKER_NO_SPACE_CHECK=1``, writes meeting the real limit (LMDB's commit failing with
EIO, HDF5 failing mid-flush: that one segfaulted before).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packer.sample import encode_jpeg
from tests import REPO

REQUIRE_ENV = "PACKER_REQUIRE_SMALLFS"
SMALL, LARGE = "20m", "200m"
CHECKS = {"checked": {}, "unchecked": {"PACKER_NO_SPACE_CHECK": "1"}}

pytestmark = pytest.mark.timeout(600)


# ---------------------------------------------------------------------------------------
# a small file system
# ---------------------------------------------------------------------------------------
class SmallFS:
    """A tmpfs mounted at ``path``; :meth:`resize` changes its size in place (files stay)."""

    def __init__(self, path: Path):
        self.path = path

    def resize(self, size: str) -> None:
        _mount(["-o", f"remount,size={size}", str(self.path)])

    def free(self) -> int:
        return shutil.disk_usage(self.path).free


def _mount(args: list) -> str:
    """Run mount(8); '' on success, else why not."""
    if shutil.which("mount") is None:
        return "no mount command"
    try:
        p = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if p.returncode == 0 else (p.stderr.strip() or f"mount exited {p.returncode}")


@pytest.fixture
def small_fs(tmp_path):
    """A 20 MiB tmpfs under tmp_path (unmounted afterwards)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = "mounting a tmpfs needs root" if os.geteuid() != 0 else \
        _mount(["-t", "tmpfs", "-o", f"size={SMALL},mode=0755", "tmpfs", str(mnt)])
    if why:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but no small file system can be mounted: {why}")
        pytest.skip(f"no small file system to fill: {why} (run as root; {REQUIRE_ENV}=1 makes this a failure)")
    try:
        yield SmallFS(mnt)
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------
def _noise_images(root: Path, n: int, h: int, w: int, seed: int) -> Path:
    """``n`` JPEGs of uniform noise (they do not compress) in two class folders."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.jpg").write_bytes(encode_jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), 95))
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """About 54 MB of incompressible JPEGs: 96 of 800x600."""
    root = _noise_images(tmp_path_factory.mktemp("photos") / "images", 96, 600, 800, seed=26)
    total = sum(p.stat().st_size for p in root.rglob("*.jpg"))
    assert 45e6 < total < 65e6, total
    return root


@pytest.fixture(scope="module")
def sources(photos, tmp_path_factory):
    """``sources(fmt)`` -> a store of the photos in ``fmt`` (on the big disk), built once."""
    root, built = tmp_path_factory.mktemp("sources"), {}

    def get(fmt: str) -> str:
        if fmt not in built:
            loc = str(root / ("src.lmdb" if fmt == "lmdb" else "src.h5"))
            p = packer("build", str(photos), "-o", loc, "--format", fmt, "-q")
            assert p.returncode == 0, p.stderr[-3000:]
            built[fmt] = loc
        return built[fmt]
    return get


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def packer(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    run_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    for name in CHECKS["unchecked"]:
        if not env or name not in env:
            run_env.pop(name, None)
    try:
        return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True,
                              timeout=timeout, env=run_env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`packer {' '.join(args)}` still running after {timeout} s")


def assert_disk_full(p: subprocess.CompletedProcess, out: str) -> str:
    """Exit 1 (not a signal), no traceback, one line on stderr: the output, "disk full" and how
    much more room is needed. Returns that line."""
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-4000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines[:20]
    line = lines[0]
    assert line.startswith("error: ") and out in line and "disk full" in line, line
    assert re.search(r"about \d+(\.\d+)? MiB more space needed", line), line
    return line


def assert_verifies(loc: str, records: int) -> None:
    p = packer("verify", "--deep", loc)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"OK ({records} records" in p.stdout + p.stderr, p.stdout + p.stderr


def report_of(loc: str) -> dict:
    return json.loads(Path(loc + ".report.json").read_text())


def partial(loc: str) -> Path:
    return Path(loc + ".partial")


# ---------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_build_refused_before_writing_then_resumes(small_fs, photos, fmt):
    """The free-space estimate (inputs' sizes) refuses the build before any record is written."""
    out = str(small_fs.path / ("out.lmdb" if fmt == "lmdb" else "out.h5"))
    p = packer("build", str(photos), "-o", out, "-q")
    line = assert_disk_full(p, out)
    assert "PACKER_NO_SPACE_CHECK" in line   # how to skip an estimate that is wrong
    assert partial(out).exists() and not os.path.exists(out)
    small_fs.resize(LARGE)
    p = packer("build", str(photos), "-o", out, "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert_verifies(out, 96)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_build_that_fills_the_disk_stops_cleanly_and_resumes(small_fs, photos, fmt):
    """Estimates off: the writes meet the real limit (LMDB: EIO from mdb_txn_commit; HDF5: a
    failed flush, after which HDF5 segfaulted). One line, exit 1, the staging area kept; after
    making room the rerun resumes where the committed batches end."""
    out = str(small_fs.path / ("out.lmdb" if fmt == "lmdb" else "out.h5"))
    p = packer("build", str(photos), "-o", out, "--commit-mb", "4", "-q", env=CHECKS["unchecked"])
    assert_disk_full(p, out)
    assert partial(out).exists() and not os.path.exists(out)
    assert small_fs.free() < 4 << 20   # the disk really filled up
    small_fs.resize(LARGE)
    p = packer("build", str(photos), "-o", out, "--commit-mb", "4", "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert report_of(out)["resumed_from"] > 0   # the batches committed before the disk filled were kept
    assert_verifies(out, 96)


def test_hdf5_batch_check_stops_before_the_disk_fills(small_fs, tmp_path):
    """Pixel mode stores far more than its inputs' size, so the estimate passes, and the check
    before each batch stops the build: HDF5 never meets a full disk, the partial file is closed
    cleanly and the rerun resumes it in place."""
    import h5py

    images = _noise_images(tmp_path / "tiny", 30, 48, 64, seed=5)
    out = str(small_fs.path / "pixels.h5")
    args = ("build", str(images), "-o", out, "-O", "pixels=512x512", "--commit-mb", "4", "-q")
    assert_disk_full(packer(*args), out)
    with h5py.File(partial(out), "r") as f:
        assert f.attrs.get("_closed_cleanly"), "the partial file was not closed cleanly"
        committed = f["pixels"].shape[0]
    assert 0 < committed < 30
    small_fs.resize(LARGE)
    p = packer(*args[:-1], "-v")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"({committed} records committed)" in p.stderr and "not closed cleanly" not in p.stderr, p.stderr
    assert_verifies(out, 30)


# ---------------------------------------------------------------------------------------
# other commands that write
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("checks", sorted(CHECKS))
@pytest.mark.parametrize("src_fmt, dst_fmt", [("lmdb", "hdf5"), ("hdf5", "lmdb")])
def test_convert_onto_a_full_disk_then_resumes(small_fs, sources, src_fmt, dst_fmt, checks):
    src = sources(src_fmt)
    dst = str(small_fs.path / ("dst.h5" if dst_fmt == "hdf5" else "dst.lmdb"))
    p = packer("convert", src, dst, "--format", dst_fmt, "-q", env=CHECKS[checks])
    assert_disk_full(p, dst)
    assert partial(dst).exists() and not os.path.exists(dst)
    small_fs.resize(LARGE)
    p = packer("convert", src, dst, "--format", dst_fmt, "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert_verifies(dst, 96)


@pytest.mark.parametrize("checks", sorted(CHECKS))
def test_export_onto_a_full_disk(small_fs, sources, checks):
    out = str(small_fs.path / "exported")
    p = packer("export", sources("lmdb"), out, env=CHECKS[checks])
    line = assert_disk_full(p, out)
    if checks == "unchecked":   # files were written until the disk filled: say what to do with them
        assert "partial export" in line, line
    small_fs.resize(LARGE)
    shutil.rmtree(out)
    p = packer("export", sources("lmdb"), out)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(list(Path(out, "images").rglob("*.jpg"))) == 96


@pytest.mark.parametrize("checks", sorted(CHECKS))
def test_merge_copy_onto_a_full_disk_then_resumes(small_fs, sources, tmp_path, checks):
    more = _noise_images(tmp_path / "more", 6, 600, 800, seed=3)
    for folder in more.iterdir():   # other keys than the photos'
        for f in folder.iterdir():
            f.rename(folder / f"more-{f.name}")
    second = str(tmp_path / "second.lmdb")
    assert packer("build", str(more), "-o", second, "-q").returncode == 0
    out = str(small_fs.path / "merged.lmdb")
    args = ("merge", sources("lmdb"), second, "-o", out, "--copy", "-q")
    assert_disk_full(packer(*args, env=CHECKS[checks]), out)
    assert partial(out).exists() and not os.path.exists(out)
    small_fs.resize(LARGE)
    p = packer(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert_verifies(out, 102)


@pytest.mark.parametrize("checks", sorted(CHECKS))
def test_append_onto_a_full_disk_then_resumes(small_fs, tmp_path, checks):
    """Append copies the store into its staging area and adds the new images: 8 MB + 8 MB more
    does not fit beside the 8 MB store on 20 MiB."""
    first = _noise_images(tmp_path / "first", 14, 600, 800, seed=1)
    more = _noise_images(tmp_path / "more", 14, 600, 800, seed=2)
    for folder in more.iterdir():   # other keys than the first set's
        for f in folder.iterdir():
            f.rename(folder / f"more-{f.name}")
    store = str(small_fs.path / "grow.lmdb")
    p = packer("build", str(first), "-o", store, "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    p = packer("append", store, str(more), "-q", env=CHECKS[checks])
    assert_disk_full(p, store)
    assert_verifies(store, 14)   # the published store is untouched
    small_fs.resize(LARGE)
    p = packer("append", store, str(more), "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert_verifies(store, 28)
