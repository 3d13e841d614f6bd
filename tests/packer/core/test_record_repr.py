"""``repr(Record)`` shows what identifies a record (key, size, byte count, a short checksum), never
its bytes: a photo printed in a log or a debugger is one line, not kilobytes of escapes."""
from __future__ import annotations

import numpy as np
import pytest

import packer
from packer.sample import make_dataset


@pytest.mark.timeout(120)
def test_repr_of_a_stored_photo_is_short_and_names_the_record(tmp_path):
    images, labels = make_dataset(tmp_path / "src", 2, kind="boxes", sizes=((375, 500),))
    out = str(tmp_path / "s.lmdb")
    packer.build(str(images), str(labels), out, format="lmdb", workers=1)
    with packer.open_store(out) as store:
        rec = store.get(0)
    data = bytes(rec.data)
    assert len(data) > 5000                   # a real photo's worth of bytes
    shown = repr(rec)
    assert len(shown) < 400, shown
    assert "\\x" not in shown and data[:16].hex() not in shown and "b'" not in shown, shown
    assert f"key={rec.key!r}" in shown and f"index={rec.index}" in shown
    assert f"{rec.width}x{rec.height}x{rec.channels}" in shown and f"{len(data)} bytes" in shown
    assert f"checksum={rec.checksum[:8]}..." in shown and rec.checksum not in shown
    assert str(rec) == shown


def test_repr_of_views_arrays_and_no_data():
    rec = packer.Record(0, "a.jpg", memoryview(np.zeros((40, 50), np.uint8)), np.zeros((300, 300)), 50, 40, 1,
                        "jpeg", "png->jpeg", 1, "ab" * 16, "", 10)
    shown = repr(rec)
    assert "2000 bytes" in shown and "converted='png->jpeg'" in shown and len(shown) < 300, shown
    rec.data = None
    assert "no data" in repr(rec)
