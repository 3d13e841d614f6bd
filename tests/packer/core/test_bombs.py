"""Decompression bombs are refused from the header, quickly and with little memory."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import packer
from packer.core.errors import ImageError
from packer.core.integrity import DEFAULT_MAX_PIXELS, header_dimensions, process_image, sniff_format
from tests import REPO, corpus


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(width: int = 12000, height: int = 12000) -> bytes:
    """A valid RGBA PNG of zeros, ~0.56 MB for 12000x12000 (576 MB of pixels).

    The deflate stream repeats one fully-flushed segment of 1000 rows, so making it takes a
    second instead of compressing 576 MB.
    """
    row = b"\0" * (1 + width * 4)
    assert height % 1000 == 0
    block = row * 1000
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    seg = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    fin = c.flush(zlib.Z_FINISH)
    adler = 1
    for _ in range(height // 1000):
        adler = zlib.adler32(block, adler)
    idat = b"\x78\xda" + seg * (height // 1000) + fin + struct.pack(">I", adler)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def bomb_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bombs") / "images"
    (root / "a").mkdir(parents=True)
    (root / "a" / "ok.jpg").write_bytes(corpus.good_jpeg(2))
    (root / "a" / "bomb.png").write_bytes(bomb_png())
    (root / "a" / "bomb.jpg").write_bytes(corpus.bomb_jpeg())
    return root


def test_bomb_files_are_what_they_claim(bomb_dir):
    png = (bomb_dir / "a" / "bomb.png").read_bytes()
    assert len(png) < 700_000
    assert header_dimensions(png, "png") == (12000, 12000)
    assert header_dimensions(corpus.bomb_jpeg(), "jpeg") == (30000, 30000)


@pytest.mark.timeout(120)
def test_bombs_refused_quickly_with_low_peak_memory(bomb_dir, tmp_path):
    """In a fresh process. Peak memory is the process's VmHWM (high-water RSS), which execve
    resets; getrusage's ru_maxrss is not reset by execve on Linux, so a child forked from a big
    pytest process would report the parent's size (seen: 632 MB from a 38 MB build)."""
    out = tmp_path / "o.lmdb"
    code = (
        "import json, resource, time\n"
        "import packer\n"
        "def peak_mb():\n"
        "    try:\n"
        "        for line in open('/proc/self/status'):\n"
        "            if line.startswith('VmHWM:'):\n"
        "                return int(line.split()[1]) / 1024\n"
        "    except OSError:\n"
        "        pass\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "t = time.monotonic()\n"
        f"r = packer.build({str(bomb_dir)!r}, None, {str(out)!r}, workers=1, on_corrupt='skip')\n"
        "print(json.dumps({'rejected': r.rejected, 'records': r.records, 's': time.monotonic() - t,\n"
        "                  'peak_mb': peak_mb()}))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    reasons = {x["path"]: x["reason"] for x in res["rejected"]}
    assert set(reasons) == {"a/bomb.png", "a/bomb.jpg"} and res["records"] == 1
    assert "12000x12000 = 144,000,000 pixels" in reasons["a/bomb.png"]
    assert "30000x30000 = 900,000,000 pixels" in reasons["a/bomb.jpg"]
    for why in reasons.values():
        assert f"limit of {DEFAULT_MAX_PIXELS:,}" in why and "--max-pixels" in why
    # Decoding the PNG alone would take 576 MB (2.5 GB measured before the guard).
    assert res["peak_mb"] < 400, res
    assert res["s"] < 30, res


def test_cli_max_pixels_option(tmp_path):
    from click.testing import CliRunner

    from packer.cli import cli

    img = tmp_path / "in" / "c"
    img.mkdir(parents=True)
    (img / "x.jpg").write_bytes(corpus.good_jpeg(3, 40, 50))   # 2000 pixels
    runner = CliRunner()
    r = runner.invoke(cli, ["build", str(tmp_path / "in"), "-o", str(tmp_path / "a.lmdb"), "-j", "1",
                            "--max-pixels", "1999"])
    assert r.exit_code == 1
    assert "c/x.jpg" in r.output and "50x40 = 2,000 pixels, over the limit of 1,999" in r.output
    r = runner.invoke(cli, ["build", str(tmp_path / "in"), "-o", str(tmp_path / "b.lmdb"), "-j", "1",
                            "--max-pixels", "2000"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["build", str(tmp_path / "in"), "-o", str(tmp_path / "c.lmdb"), "-j", "1",
                            "--max-pixels", "-1"])
    assert r.exit_code == 2


def test_max_pixels_zero_means_no_limit_and_negative_is_refused(tmp_path):
    jpg = corpus.good_jpeg(4, 40, 50)
    assert process_image("x.jpg", jpg, max_pixels=0).width == 50
    with pytest.raises(ImageError, match="over the limit of 100"):
        process_image("x.jpg", jpg, max_pixels=100)
    (tmp_path / "i" / "c").mkdir(parents=True)
    (tmp_path / "i" / "c" / "x.jpg").write_bytes(jpg)
    with pytest.raises(packer.UsageError):
        packer.build(tmp_path / "i", None, tmp_path / "o.lmdb", max_pixels=-1)


@pytest.mark.parametrize("ext", [".png", ".bmp", ".tiff", ".webp"])
def test_header_dimensions_of_other_formats_without_decoding(ext):
    import cv2

    ok, buf = cv2.imencode(ext, np.zeros((37, 53, 3), np.uint8))
    assert ok
    raw = buf.tobytes()
    assert header_dimensions(raw, sniff_format(raw[:16])) == (53, 37)
    with pytest.raises(ImageError, match="53x37 = 1,961 pixels"):
        process_image("x" + ext, raw, max_pixels=1000)
