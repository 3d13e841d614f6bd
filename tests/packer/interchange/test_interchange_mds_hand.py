"""MDS inputs written by hand (``tests.interchange_fixtures.write_mds``, no mosaicml-streaming
needed): compressed shards whose headers lie about their size, and an index that overstates a
shard's size (issue 46).

zstd and snappy frames are made byte by byte (RFC 8878; snappy's length varint), so these run
without the codec libraries; where ``zstd`` / ``snappy`` are installed, real frames are read too.
"""
from __future__ import annotations

import struct
import sys
import types

import pytest

import packer
from packer.core.errors import SourceError
from packer.interchange.mds import FORMAT
from packer.interchange.mds.shards import check_declared
from tests.interchange_fixtures import jpegs, mds_shard, write_mds

pytestmark = pytest.mark.timeout(120)

_MAGIC = struct.pack("<I", 0xFD2FB528)


def _rle_block(size: int, last: bool) -> bytes:
    return ((size << 3) | (1 << 1) | int(last)).to_bytes(3, "little") + b"\0"


def _zstd_bomb_without_size(blocks: int) -> bytes:
    """A zstd frame with no content size: ``blocks`` RLE blocks of 128 KiB each (6 MiB of zeros
    per 200 bytes)."""
    body = b"".join(_rle_block(128 << 10, i == blocks - 1) for i in range(blocks))
    return _MAGIC + bytes([0x00, 0x70]) + body   # descriptor: no FCS, window byte


def _zstd_frame_claiming(size: int) -> bytes:
    """A single-segment frame whose 8-byte content size says ``size``, holding one RLE block."""
    return _MAGIC + bytes([0xE0]) + struct.pack("<Q", size) + _rle_block(1000, True)


@pytest.fixture
def spy_codecs(monkeypatch):
    """Stand-in ``zstd`` / ``snappy`` modules recording what they are asked to inflate."""
    calls = []
    for name in ("zstd", "snappy"):
        mod = types.ModuleType(name)
        mod.Error = mod.UncompressError = type("Error", (Exception,), {})
        mod.decompress = lambda data, _n=name: calls.append((_n, len(data))) or b""
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


@pytest.mark.parametrize("zipped,says", [
    (_zstd_bomb_without_size(12_000), "zstd frames can give up to 1572864000 bytes"),
    (_zstd_frame_claiming(1 << 40), f"zstd frames say they hold {1 << 40} bytes"),
])
def test_zstd_shard_that_inflates_past_the_index_is_never_inflated(tmp_path, spy_codecs, zipped, says):
    imgs = jpegs(2)
    raw = mds_shard(imgs, [0, 1])
    folder = write_mds(tmp_path / "d", imgs, [0, 1], compression="zstd", zipped=zipped, raw_file=False)
    scan = FORMAT.scan(str(folder))
    assert spy_codecs == []   # the codec was never asked
    assert scan.keys == []
    [problem] = scan.problems
    assert problem["path"] == "shard.00000.mds.zstd"
    assert says in problem["reason"] and f"index.json says {len(raw)}" in problem["reason"]


def test_snappy_header_claiming_more_is_never_inflated(tmp_path, spy_codecs):
    imgs = jpegs(2)
    raw = mds_shard(imgs, [0, 1])
    zipped = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\0" * 64   # a varint of 2**32 - 1
    folder = write_mds(tmp_path / "d", imgs, [0, 1], compression="snappy", zipped=zipped, raw_file=False)
    scan = FORMAT.scan(str(folder))
    assert spy_codecs == []
    [problem] = scan.problems
    assert problem["path"] == "shard.00000.mds.snappy"
    assert f"snappy header says it holds {(1 << 32) - 1} bytes, index.json says {len(raw)}" in problem["reason"]


def test_declared_sizes_that_agree_are_inflated(tmp_path, spy_codecs):
    frame = _MAGIC + bytes([0x20, 200]) + _rle_block(200, True)   # 1-byte content size 200
    check_declared("zstd", frame, 200)
    check_declared("zstd", _zstd_bomb_without_size(2), 200 << 10)   # within one block of the size
    check_declared("snappy:1", bytes([0xC8, 0x01]) + b"x", 200)
    with pytest.raises(ValueError, match="say they hold 200 bytes, index.json says 199"):
        check_declared("zstd:3", frame, 199)


def test_real_zstd_and_snappy_shards(tmp_path):
    imgs = jpegs(3)
    raw = mds_shard(imgs, [2, 0, 1])
    for name, package in (("zstd", "zstd"), ("snappy", "snappy")):
        codec = pytest.importorskip(package)
        zipped = codec.compress(raw)
        folder = write_mds(tmp_path / name, imgs, [2, 0, 1], compression=name, zipped=zipped, raw_file=False)
        scan = FORMAT.scan(str(folder))
        assert scan.problems == [] and scan.labels == [2, 0, 1]
        short = write_mds(tmp_path / f"{name}-short", imgs, [2, 0, 1], compression=name, zipped=zipped,
                          raw_file=False, raw_bytes=len(raw) - 10)
        [problem] = FORMAT.scan(str(short)).problems
        assert f"{len(raw)} bytes, index.json says {len(raw) - 10}" in problem["reason"]


@pytest.mark.parametrize("extra", [0, 1000])
def test_index_that_overstates_a_shard_does_not_switch_its_hash_check_off(tmp_path, extra):
    imgs = jpegs(3)
    raw = mds_shard(imgs, [0, 1, 2])
    folder = write_mds(tmp_path / "d", imgs, [0, 1, 2], raw_bytes=len(raw) + extra, hashes={"sha1": "0" * 40})
    [problem] = FORMAT.scan(str(folder)).problems
    assert problem["path"] == "shard.00000.mds"
    if extra:
        assert problem["reason"] == (f"{len(raw)} bytes, index.json says {len(raw) + extra}: cut short, or the "
                                     f"index overstates it; its hash cannot be checked")
    else:
        assert "does not match index.json's" in problem["reason"]
        with pytest.raises(SourceError, match="no sample found"):
            packer.build(str(folder), None, str(tmp_path / "o.lmdb"), workers=1)
    if extra:   # its samples lie whole: --on-corrupt stop publishes nothing, skip publishes them
        assert not packer.build(str(folder), None, str(tmp_path / "o.lmdb"), workers=1).published


def test_image_the_decode_check_rejects_is_named_by_shard_and_sample(tmp_path):
    from tests.interchange_fixtures import check_damage_named
    imgs = jpegs(3)
    imgs[1] = b"\xff\xd8 not a jpeg"
    folder = write_mds(tmp_path / "d", imgs, [0, 1, 2])
    check_damage_named(str(folder), tmp_path / "o.lmdb", "shard.00000.mds:sample 1")


def test_hints_name_the_mds_extra_and_the_real_import_error(tmp_path, monkeypatch):
    from packer.core import deps
    from packer.core.errors import DependencyError
    from packer.interchange.mds import writer

    monkeypatch.setitem(sys.modules, "streaming", None)          # not installed
    monkeypatch.setattr(deps.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DependencyError,
                       match=r"writing MDS needs mosaicml-streaming: pip install 'packer-vision\[mds\]'"):
        writer._streaming()
    monkeypatch.undo()
    fake = tmp_path / "site" / "streaming"                        # installed, but its imports fail
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torchvision'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "streaming", raising=False)
    with pytest.raises(DependencyError, match="installed but does not import: ImportError: No module named "
                                              "'torchvision'"):
        writer._streaming()
    monkeypatch.setitem(sys.modules, "zstd", None)
    n = len(mds_shard(jpegs(1), [0]))
    folder = write_mds(tmp_path / "d", jpegs(1), [0], compression="zstd", raw_file=False,
                       zipped=_MAGIC + bytes([0xA0]) + struct.pack("<I", n) + _rle_block(n, True))
    with pytest.raises(DependencyError, match=r"needs the zstd package: pip install zstd .*\[mds\]"):
        FORMAT.scan(str(folder))
