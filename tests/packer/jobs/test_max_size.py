"""packer build --max-size N: images stored downscaled (aspect kept, INTER_AREA), recorded as converted."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer import open_store
from packer.cli import cli
from packer.core.errors import UsageError
from packer.core.integrity import turbo_decode
from packer.sample import make_dataset


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ms"), 9, kind="classes", seed=5)[0]


def test_max_size_downscales_long_side(images, tmp_path):
    out = tmp_path / "s.lmdb"
    packer.build(images, None, out, workers=1, max_size=200, quality=92)
    plain = tmp_path / "p.lmdb"
    packer.build(images, None, plain, workers=1)
    assert packer.verify(out, deep=True).ok
    with open_store(str(out)) as small, open_store(str(plain)) as full:
        assert small.metadata.build_options["max_size"] == 200
        seen_big = seen_small = 0
        for i in range(len(full)):
            a, b = full.get(i), small.get(i)
            assert a.key == b.key and a.label == b.label and a.source_checksum == b.source_checksum
            assert b.source_size == a.source_size
            pix = turbo_decode(b.data)
            assert pix.shape[:2] == (b.height, b.width)
            if max(a.width, a.height) <= 200:
                assert b.data == a.data and b.converted == a.converted
                seen_small += 1
                continue
            seen_big += 1
            assert max(b.width, b.height) == 200
            assert abs(b.width / b.height - a.width / a.height) < 0.02
            assert f"downscaled {a.width}x{a.height}->{b.width}x{b.height}" in b.converted
            ref = cv2.resize(turbo_decode(a.data), (b.width, b.height), interpolation=cv2.INTER_AREA)
            assert np.abs(pix.astype(int) - ref.astype(int)).mean() < 3.0   # only the re-encode differs
        assert seen_big and seen_small


def test_max_size_cli_and_bad_value(images, tmp_path):
    out = tmp_path / "c.lmdb"
    r = CliRunner().invoke(cli, ["build", str(images), "-o", str(out), "--max-size", "64", "-j", "1", "-q"])
    assert r.exit_code == 0, r.output
    with open_store(str(out)) as s:
        assert all(max(s.get(i).width, s.get(i).height) <= 64 for i in range(len(s)))
    r = CliRunner().invoke(cli, ["build", str(images), "-o", str(tmp_path / "d.lmdb"), "--max-size", "0"])
    assert r.exit_code == 2
    with pytest.raises(UsageError):
        packer.build(images, None, tmp_path / "e.lmdb", max_size=0)
