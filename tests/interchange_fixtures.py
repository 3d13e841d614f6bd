"""What the interchange tests (``test_interchange_*.py``) share: generated images, stores built from
generated datasets, the exact round-trip check, and a stand-in that fails a write part-way."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

import packer
from packer.core.records import labels_equal
from packer.interchange.base import read_locator
from packer.sample import encode_jpeg, make_dataset, synthetic_image
from packer.stores import open_store


def jpegs(n: int, seed: int = 0) -> list:
    """``n`` small seeded JPEGs (bytes) of a few sizes."""
    rng = np.random.default_rng(seed)
    return [encode_jpeg(synthetic_image(rng, 16 + i % 5, 24 + i % 3)) for i in range(n)]


def dataset_store(folder: Path, kind: str, loc: str, *, n: int = 13, seed: int = 4,
                  class_names: Optional[list] = None, **build_options) -> str:
    """Build the store ``loc`` (one worker) from a generated dataset under ``folder``, and return it.

    ``kind`` is a :func:`packer.sample.make_dataset` kind (``n`` images, ``seed``), or ``"coco"``
    (the COCO set of ``tests/label_corpus``, made beside ``folder``). ``class_names`` are written
    to the labels' ``classes.txt`` (YOLO ids get names).
    """
    if kind == "coco":
        from tests.label_corpus import make_coco
        images, labels, _ = make_coco(folder.parent / "coco")
    else:
        images, labels = make_dataset(folder, n, kind=kind, seed=seed)
    if class_names is not None and labels is not None:
        (labels / "classes.txt").write_text("".join(f"{c}\n" for c in class_names))
    rep = packer.build(images, labels, loc, workers=1, **build_options)
    assert rep.published
    return loc


def store_records(loc: str) -> tuple:
    """``(metadata, records)`` of the store ``loc``, every record read."""
    with open_store(loc) as r:
        return r.metadata, [r.get(i) for i in range(r.metadata.count)]


def store_rows(store) -> list:
    """``(key, bytes, label JSON, checksum, source checksum)`` of every record of ``store``."""
    import json

    from packer.core.records import label_to_json

    with open_store(store) as r:
        return [(x.key, bytes(x.data), json.dumps(label_to_json(x.label)), x.checksum, x.source_checksum)
                for x in r.get_many(range(r.metadata.count))]


def same_store(a, b) -> None:
    """Two stores hold the same records (keys, bytes, labels, checksums), label schema, class
    names and index checksum: what a build from a bucket and one from the local copy must give."""
    with open_store(a) as ra, open_store(b) as rb:
        ma, mb = ra.metadata, rb.metadata
        assert ma.count == mb.count and ma.index_checksum == mb.index_checksum
        assert ma.class_names == mb.class_names and ma.label_schema == mb.label_schema
    assert store_rows(a) == store_rows(b)


def check_round_trip(fmt, reader, out: Path, *, byte_ranges: bool = False) -> None:
    """``fmt.scan(out)`` gives back every record of ``reader``: keys, bytes, labels, metadata, class
    names and schema, no problems; ``byte_ranges``: every locator is a byte range."""
    scan = fmt.scan(str(out))
    assert scan.problems == []
    recs = [reader.get(i) for i in range(reader.metadata.count)]
    assert scan.keys == [r.key for r in recs]
    assert [read_locator(loc) for loc in scan.locators] == [bytes(r.data) for r in recs]
    if byte_ranges:
        assert all(loc[0] == "range" for loc in scan.locators)
    assert all(labels_equal(a, r.label) for a, r in zip(scan.labels, recs))
    assert scan.metadata == [r.metadata for r in recs]
    assert scan.class_names == list(reader.metadata.class_names)
    assert scan.label_schema == reader.metadata.label_schema


def failing_on_call(real: Callable, n: int, calls: list) -> Callable:
    """``real`` that raises ``OSError("simulated write failure")`` on its ``n``-th call (its first
    argument, a record, is appended to ``calls`` by key on every call)."""
    def failing(rec, *args):
        calls.append(rec.key)
        if len(calls) == n:
            raise OSError("simulated write failure")
        return real(rec, *args)
    return failing


def check_export_refusals(fmt, reader, tmp_path: Path, monkeypatch, module, per_sample: str) -> None:
    """``fmt.export`` refuses a folder with files in it and a shard size of 0 (UsageError), and a
    write that fails half-way (``module.<per_sample>`` raising on its 6th call) leaves nothing
    in the output folder."""
    import pytest

    from packer.core.errors import UsageError
    from packer.interchange.base import ExportOptions

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UsageError):
        fmt.export(reader, tmp_path / "full", ExportOptions(shard_size=2))
    with pytest.raises(UsageError, match="shard-size"):
        fmt.export(reader, tmp_path / "zero", ExportOptions(shard_size=0))
    monkeypatch.setattr(module, per_sample, failing_on_call(getattr(module, per_sample), 6, []))
    with pytest.raises(OSError, match="simulated"):
        fmt.export(reader, tmp_path / "half", ExportOptions(shard_size=2))
    assert list((tmp_path / "half").iterdir()) == []


def mds_shard(images: list, labels: list) -> bytes:
    """One MDS shard file (streaming's layout: sample count, n + 1 offsets, then per sample the
    sizes of its variable columns and its columns) of columns ``image`` (jpeg) and ``label`` (int)."""
    import struct

    samples = [struct.pack("<I", len(img)) + img + struct.pack("<q", lab) for img, lab in zip(images, labels)]
    offsets = [4 * (len(samples) + 2)]
    for s in samples:
        offsets.append(offsets[-1] + len(s))
    return struct.pack(f"<{len(offsets) + 1}I", len(samples), *offsets) + b"".join(samples)


def write_mds(folder: Path, images: list, labels: list, *, compression: Optional[str] = None,
              zipped: Optional[bytes] = None, raw_bytes: Optional[int] = None, hashes: Optional[dict] = None,
              raw_file: bool = True) -> Path:
    """An MDS dataset of one shard written by hand (no mosaicml-streaming), as ``MDSWriter`` lays
    it out. ``compression``: the index names that codec and the shard file is ``zipped`` (bytes
    given, since the codec library may be missing); ``raw_bytes`` / ``hashes`` override what the
    index says of the raw shard; ``raw_file``: write the raw shard beside the compressed one."""
    import hashlib
    import json

    folder.mkdir(parents=True, exist_ok=True)
    raw = mds_shard(images, labels)
    name = "shard.00000.mds"
    if raw_file or compression is None:
        (folder / name).write_bytes(raw)
    raw_info = {"basename": name, "bytes": len(raw) if raw_bytes is None else raw_bytes,
                "hashes": {"sha1": hashlib.sha1(raw).hexdigest()} if hashes is None else hashes}
    zip_info = None
    if compression is not None:
        (folder / f"{name}.{compression}").write_bytes(zipped)
        zip_info = {"basename": f"{name}.{compression}", "bytes": len(zipped),
                    "hashes": {"sha1": hashlib.sha1(zipped).hexdigest()}}
    shard = {"column_encodings": ["jpeg", "int"], "column_names": ["image", "label"], "column_sizes": [None, 8],
             "compression": compression, "format": "mds", "hashes": ["sha1"], "raw_data": raw_info,
             "samples": len(images), "size_limit": 1 << 26, "version": 2, "zip_data": zip_info}
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": [shard]}))
    return folder


def check_damage_named(src, out: Path, where: str) -> None:
    """``packer build src -o out`` (one worker) refuses the one image the decode check rejects,
    naming it ``where`` (shard and member, or file and row/record) in the build report and its
    ``report.json``; ``--on-corrupt skip`` publishes the rest."""
    import json

    rep = packer.build(src, None, str(out), workers=1)
    assert not rep.published
    assert [r["path"] for r in rep.rejected] == [where], rep.rejected
    saved = json.loads(Path(str(out) + ".report.json").read_text())
    assert [r["path"] for r in saved["rejected"]] == [where]
    rep = packer.build(src, None, str(out), workers=1, on_corrupt="skip", resume=False)
    assert rep.published and [r["path"] for r in rep.rejected] == [where]


def parquet_chunk(path, group: int, column: str = "image.bytes"):
    """(offset, compressed size) of ``column``'s chunk in row group ``group`` of a parquet file."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata.row_group(group)
    col = next(md.column(i) for i in range(md.num_columns) if md.column(i).path_in_schema == column)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    return start, col.total_compressed_size
