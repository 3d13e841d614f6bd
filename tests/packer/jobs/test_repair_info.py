"""After a repair, every figure ``info`` shows counts the same records: those the repaired store
holds. A store of 48 records with 2 damaged and quarantined by repair shows 46 everywhere (record
count, sizes, common sizes, channels, sources, image bytes, box counts), in the library's report
and in ``packer info``'s text, not the build's 48 beside the repaired 46."""
from __future__ import annotations

import re
import struct

import pytest
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.sample import make_dataset

lmdb = pytest.importorskip("lmdb")


def _damage(loc: str, indices) -> None:
    env = lmdb.open(loc, max_dbs=8)
    data = env.open_db(b"data")
    with env.begin(write=True) as txn:
        for i in indices:
            key = struct.pack(">Q", i)
            jpeg = bytearray(txn.get(key, db=data))
            jpeg[len(jpeg) // 2] ^= 0xFF
            txn.put(key, bytes(jpeg), db=data)
    env.close()


@pytest.mark.timeout(300)
def test_info_after_repair_counts_only_the_records_the_store_holds(tmp_path):
    images, labels = make_dataset(tmp_path / "src", 48, kind="boxes", sizes=((40, 56), (48, 64), (30, 30)))
    loc = str(tmp_path / "s.lmdb")
    assert packer.build(str(images), str(labels), loc, format="lmdb", workers=1).records == 48
    _damage(loc, (3, 17))
    rep = packer.repair(loc)
    assert rep.ok and rep.records == 46 and sum(a["action"] == "quarantined" for a in rep.actions) == 2

    with packer.open_store(loc) as store:
        live = [store.get(i) for i in range(len(store))]
    assert len(live) == 46
    st = packer.info(loc, pixel_sample=0).metadata["stats"]
    assert st["records"] == 46
    assert sum(st["sizes"].values()) == sum(st["channels"].values()) == sum(st["source_formats"].values()) == 46
    assert st["bytes"] == sum(len(bytes(r.data)) for r in live)
    assert st["source_bytes"] == sum(r.source_size for r in live)
    assert st["width_sum"] == sum(r.width for r in live) and st["height_sum"] == sum(r.height for r in live)
    assert st["boxes"] == sum(len(r.label) for r in live)
    assert st["boxes_max_per_image"] == max(len(r.label) for r in live)
    assert st["inputs"] == 48        # what the build was given: a fact of the build, labelled so

    out = CliRunner().invoke(cli, ["info", loc], catch_exceptions=False).output
    common = re.search(r"common sizes: (.*)", out).group(1)
    assert sum(int(n) for n in re.findall(r"\((\d+)\)", common)) == 46, out
    channels = re.search(r"channels:\s+(.*)", out).group(1)
    assert sum(int(n) for n in re.findall(r": (\d+)", channels)) == 46, out
    assert f"{st['boxes']} boxes" in out and re.search(r"records:\s+46\b", out), out
