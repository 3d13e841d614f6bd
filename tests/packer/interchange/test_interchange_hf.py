"""Hugging Face datasets in and out (packer.interchange.hf), checked with the ``datasets`` library on
the other side: what ``Dataset.save_to_disk`` / ``to_parquet`` write is scanned to the same keys,
bytes, labels and class names; what packer exports is read back by ``load_dataset("parquet")`` and
``save_to_disk`` -> ``load_from_disk`` sample by sample; damaged files are listed by file and row
group / record batch with the rest kept; memory stays flat."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

if os.environ.get("PACKER_REQUIRE_INTERCHANGE") == "1":
    import datasets
else:
    try:
        import datasets
    except ImportError as exc:   # e.g. a huggingface_hub that this datasets does not take
        pytest.skip(f"the datasets library cannot be imported: {exc}", allow_module_level=True)

from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Sequence, Value  # noqa: E402

from packer.core.errors import UsageError  # noqa: E402
from packer.interchange import ExportOptions, ScanOptions, get_format, read_locator  # noqa: E402
from packer.interchange.hf import LazyLocators  # noqa: E402
from packer.sample import make_dataset  # noqa: E402
from packer.stores import open_store  # noqa: E402
from tests.interchange_fixtures import dataset_store, parquet_chunk, store_records  # noqa: E402

HF = get_format("hf")
NAMES = ["bird", "cat", "dog"]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """12 real JPEGs of three sizes (make_dataset's), with their (width, height)."""
    import cv2

    root = tmp_path_factory.mktemp("jpegs")
    images, _ = make_dataset(root, 12, kind="classes", seed=3)
    out = []
    for p in sorted(images.rglob("*.jpg")):
        data = p.read_bytes()
        h, w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2]
        out.append((p.name, data, (w, h)))
    return out


def _class_ds(jpegs, labels=None, paths=True) -> Dataset:
    labels = [i % 3 for i in range(len(jpegs))] if labels is None else labels
    feats = Features({"image": Image(), "label": ClassLabel(names=NAMES)})
    return Dataset.from_dict({"image": [{"bytes": d, "path": n if paths else None} for n, d, _ in jpegs],
                              "label": labels}, features=feats)


def _bytes(scan) -> list:
    return [read_locator(scan.locators[i]) for i in range(len(scan.keys))]


def _problem(scan, *parts) -> dict:
    found = [p for p in scan.problems if all(s in p["path"] + " " + p["reason"] for s in parts)]
    assert found, scan.problems
    return found[0]


# ---------------------------------------------------------------------------------------
# In: what datasets writes
# ---------------------------------------------------------------------------------------
def test_save_to_disk_class_labels_as_written(jpegs, tmp_path):
    ds = _class_ds(jpegs)
    ds.save_to_disk(str(tmp_path / "saved"))
    assert HF.detect(tmp_path / "saved")
    scan = HF.scan(str(tmp_path / "saved"), ScanOptions())
    assert scan.keys == [n for n, _, _ in jpegs]
    assert _bytes(scan) == [d for _, d, _ in jpegs]
    assert scan.labels == ds["label"] and scan.class_names == NAMES and scan.label_schema == "class"
    assert not scan.problems and len(scan.fingerprint) == 1
    # arrow files keep the bytes as they are: byte ranges, nothing held in memory
    assert all(scan.locators[i][0] == "range" for i in range(len(scan.keys)))


def test_parquet_hub_layout_splits_and_row_keys(jpegs, tmp_path):
    ds = _class_ds(jpegs, paths=False)
    data = tmp_path / "repo" / "data"
    ds.select(range(0, 5)).to_parquet(str(data / "train-00000-of-00002.parquet"))
    ds.select(range(5, 9)).to_parquet(str(data / "train-00001-of-00002.parquet"))
    ds.select(range(9, 12)).to_parquet(str(data / "test-00000-of-00001.parquet"))
    repo = str(tmp_path / "repo")
    assert HF.detect(repo) and HF.detect(str(data / "train-*.parquet"))
    train = HF.scan(repo, ScanOptions())                     # default: train, both shards in order
    assert train.keys == [f"train/{i}.jpg" for i in range(9)]
    assert _bytes(train) == [d for _, d, _ in jpegs[:9]] and train.labels == ds["label"][:9]
    assert train.displays[5] == "data/train-00001-of-00002.parquet:row 5"
    test = HF.scan(repo, ScanOptions(split="test"))
    assert test.keys == [f"test/{i}.jpg" for i in range(3)] and _bytes(test) == [d for _, d, _ in jpegs[9:]]
    with pytest.raises(UsageError, match="no split 'validation'; splits: test, train"):
        HF.scan(repo, ScanOptions(split="validation"))
    braces = HF.scan(str(data / "train-{00000..00001}-of-00002.parquet"), ScanOptions())   # a brace pattern
    assert HF.detect(str(data / "train-{00000,00001}-of-00002.parquet"))
    assert braces.keys == train.keys and _bytes(braces) == _bytes(train)
    one = HF.scan(str(data / "test-00000-of-00001.parquet"), ScanOptions())   # a single file
    assert one.keys == test.keys and one.class_names == NAMES
    assert isinstance(one.locators, LazyLocators)


def test_dataset_dict_split_choice(jpegs, tmp_path):
    ds = _class_ds(jpegs)
    DatasetDict({"train": ds.select(range(8)), "validation": ds.select(range(8, 12))}).save_to_disk(
        str(tmp_path / "dd"))
    assert HF.detect(tmp_path / "dd")
    assert HF.scan(str(tmp_path / "dd"), ScanOptions()).keys == [n for n, _, _ in jpegs[:8]]
    val = HF.scan(str(tmp_path / "dd"), ScanOptions(split="validation"))
    assert _bytes(val) == [d for _, d, _ in jpegs[8:]] and val.displays[0].startswith("validation/")
    with pytest.raises(UsageError, match="no split 'test'; splits: train, validation"):
        HF.scan(str(tmp_path / "dd"), ScanOptions(split="test"))
    DatasetDict({"a": ds, "b": ds}).save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(UsageError, match=r"several splits \(a, b\) and no .train.: name one with --split"):
        HF.scan(str(tmp_path / "ab"), ScanOptions())


@pytest.mark.parametrize("style", ["sequence", "list"])
def test_detection_objects_become_normalized_yolo_rows(jpegs, tmp_path, style):
    """objects: {bbox: [[x, y, w, h]...] (COCO pixels), category}: float32 (N, 5) rows, class first,
    normalized by the size in the JPEG header; no boxes: (0, 5)."""
    if style == "sequence":    # the datasets 2.x/3.x spelling most hub detection sets carry
        objects = Sequence({"bbox": Sequence(Value("float32"), length=4), "category": ClassLabel(names=NAMES)})
    else:
        objects = {"bbox": datasets.List(datasets.List(Value("float32"), length=4)),
                   "category": datasets.List(ClassLabel(names=NAMES))}
    rows = [{"bbox": [[w * 0.25, h * 0.5, w * 0.5, h * 0.25], [0, 0, w, h]], "category": [2, 0]}
            if i % 3 else {"bbox": [], "category": []} for i, (_, _, (w, h)) in enumerate(jpegs)]
    ds = Dataset.from_dict({"image": [{"bytes": d, "path": None} for _, d, _ in jpegs], "objects": rows},
                           features=Features({"image": Image(), "objects": objects}))
    ds.to_parquet(str(tmp_path / "det.parquet"))
    scan = HF.scan(str(tmp_path / "det.parquet"), ScanOptions())
    assert scan.label_schema == "boxes" and scan.class_names == NAMES and not scan.problems
    assert scan.keys == [f"train/{i}.jpg" for i in range(len(jpegs))]
    for i, lab in enumerate(scan.labels):
        assert lab.dtype == np.float32 and lab.shape == ((2, 5) if i % 3 else (0, 5))
        if i % 3:
            np.testing.assert_allclose(lab, [[2, 0.5, 0.625, 0.5, 0.25], [0, 0.5, 0.5, 1, 1]], rtol=1e-6)


def test_no_label_columns_gives_an_unlabeled_dataset(jpegs, tmp_path):
    Dataset.from_dict({"image": [{"bytes": d, "path": n} for n, d, _ in jpegs]},
                      features=Features({"image": Image()})).save_to_disk(str(tmp_path / "s"))
    scan = HF.scan(str(tmp_path / "s"), ScanOptions())
    assert scan.label_schema == "none" and scan.labels == [None] * len(jpegs) and not scan.problems
    assert scan.class_names == []


def test_path_only_images_read_from_their_files(jpegs, tmp_path):
    """``to_parquet`` of an Image column cast from file paths keeps only the paths."""
    folder = tmp_path / "files"
    folder.mkdir()
    for n, d, _ in jpegs:
        (folder / n).write_bytes(d)
    ds = Dataset.from_dict({"image": [str(folder / n) for n, _, _ in jpegs]}).cast_column("image", Image())
    ds.to_parquet(str(tmp_path / "paths.parquet"))
    scan = HF.scan(str(tmp_path / "paths.parquet"), ScanOptions())
    assert scan.keys == [n for n, _, _ in jpegs]          # absolute paths: their base names
    assert _bytes(scan) == [d for _, d, _ in jpegs]
    (folder / jpegs[0][0]).unlink()
    scan = HF.scan(str(tmp_path / "paths.parquet"), ScanOptions())
    assert len(scan.keys) == len(jpegs) - 1
    assert "no image bytes" in _problem(scan, "paths.parquet:row 0")["reason"]


def test_a_row_without_label_is_a_problem_unless_allowed(jpegs, tmp_path):
    labels = [i % 3 for i in range(len(jpegs))]
    labels[4] = -1                                        # ClassLabel's "no label"
    _class_ds(jpegs, labels).to_parquet(str(tmp_path / "u.parquet"))
    scan = HF.scan(str(tmp_path / "u.parquet"), ScanOptions())
    p = _problem(scan, "u.parquet:row 4")
    assert p["kind"] == "unlabeled" and "no label" in p["reason"]
    assert jpegs[4][0] not in scan.keys and len(scan.keys) == len(jpegs) - 1
    allowed = HF.scan(str(tmp_path / "u.parquet"), ScanOptions(allow_unlabeled=True))
    assert allowed.labels[4] is None and not allowed.problems


def test_ambiguous_columns_are_usage_errors_listing_them(jpegs, tmp_path):
    two = Features({"a": Image(), "b": Image(), "label": ClassLabel(names=NAMES)})
    rows = {"a": [{"bytes": d, "path": None} for _, d, _ in jpegs], "label": [0] * len(jpegs)}
    rows["b"] = rows["a"]
    Dataset.from_dict(rows, features=two).to_parquet(str(tmp_path / "two.parquet"))
    with pytest.raises(UsageError, match=r"several Image columns \(a, b\)"):
        HF.scan(str(tmp_path / "two.parquet"), ScanOptions())
    assert _bytes(HF.scan(str(tmp_path / "two.parquet"), ScanOptions(image_column="b")))[0] == jpegs[0][1]
    cls = Features({"image": Image(), "coarse": ClassLabel(names=["x", "y"]), "fine": ClassLabel(names=NAMES)})
    Dataset.from_dict({"image": rows["a"], "coarse": [1] * len(jpegs), "fine": [2] * len(jpegs)},
                      features=cls).to_parquet(str(tmp_path / "cls.parquet"))
    with pytest.raises(UsageError, match=r"several label columns \(coarse, fine\)"):
        HF.scan(str(tmp_path / "cls.parquet"), ScanOptions())
    fine = HF.scan(str(tmp_path / "cls.parquet"), ScanOptions(label_column="fine"))
    assert fine.class_names == NAMES and set(fine.labels) == {2}
    with pytest.raises(UsageError, match="no column 'nope'"):
        HF.scan(str(tmp_path / "cls.parquet"), ScanOptions(label_column="nope"))


def test_string_labels_give_sorted_class_names(jpegs, tmp_path):
    words = ["zebra", "ant", "moth"]
    Dataset.from_dict({"image": [{"bytes": d, "path": n} for n, d, _ in jpegs],
                       "label": [words[i % 3] for i in range(len(jpegs))]},
                      features=Features({"image": Image(), "label": Value("string")})).to_parquet(
        str(tmp_path / "s.parquet"))
    scan = HF.scan(str(tmp_path / "s.parquet"), ScanOptions())
    assert scan.class_names == ["ant", "moth", "zebra"]
    assert [scan.class_names[c] for c in scan.labels] == [words[i % 3] for i in range(len(jpegs))]


# ---------------------------------------------------------------------------------------
# Out: a store -> parquet shards, read back by datasets
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["boxes", "classes"])
def store(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"store-{request.param}")
    loc = dataset_store(root / "data", request.param, str(root / "s.lmdb"), n=13, seed=7, format="lmdb")
    meta, recs = store_records(loc)
    return loc, meta.label_schema, list(meta.class_names), \
        [(x.key, bytes(x.data), x.label, dict(x.metadata)) for x in recs]


def _export(store, out):
    with open_store(store[0]) as reader:
        return HF.export(reader, str(out), ExportOptions(shard_size=5))


def _same_label(got, want) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == np.float32 and np.array_equal(got, want)
    return got == want


def test_export_is_read_by_datasets_sample_by_sample(store, tmp_path):
    _, schema, names, recs = store
    res = _export(store, tmp_path / "out")
    shards = sorted(res.shards)
    assert [os.path.relpath(s, tmp_path / "out") for s in shards] == [
        f"data/train-0000{i}-of-00003.parquet" for i in range(3)] and res.records == len(recs)
    ds = datasets.load_dataset("parquet", data_files=shards, split="train",
                               cache_dir=str(tmp_path / "cache"))
    saved = tmp_path / "saved"
    ds.save_to_disk(str(saved))
    for copy in (ds, datasets.load_from_disk(str(saved))):
        raw = copy.cast_column("image", Image(decode=False))
        assert len(raw) == len(recs)
        for row, (key, data, label, _) in zip(raw, recs):
            assert row["image"]["bytes"] == data
            if schema == "class":
                assert row["label"] == label
            else:
                assert _same_label(np.asarray(json.loads(row["packer_label"]), np.float32).reshape(-1, 5), label)
                w, h = _size(data)
                coco = np.asarray(row["objects"]["bbox"], np.float64).reshape(-1, 4)
                want = [[(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
                        for _, cx, cy, bw, bh in label.astype(np.float64)]
                np.testing.assert_allclose(coco, np.reshape(want, (-1, 4)), rtol=1e-5, atol=1e-3)
                assert row["objects"]["category"] == [int(c) for c in label[:, 0]]
        if schema == "class":
            assert copy.features["label"].names == names
    assert ds.cast_column("image", Image(decode=False))[0]["image"]["path"] == recs[0][0]
    assert ds[0]["image"].size == _size(recs[0][1])     # decodes as a PIL image


def _size(data: bytes) -> tuple:
    import cv2

    h, w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2]
    return w, h


def test_export_then_scan_gives_the_store_back(store, tmp_path):
    _, schema, names, recs = store
    _export(store, tmp_path / "out")
    assert HF.detect(tmp_path / "out")
    scan = HF.scan(str(tmp_path / "out"), ScanOptions())
    assert scan.keys == [k for k, _, _, _ in recs]
    assert _bytes(scan) == [d for _, d, _, _ in recs]
    assert all(_same_label(g, w) for g, (_, _, w, _) in zip(scan.labels, recs))
    assert scan.class_names == names and scan.label_schema == schema and not scan.problems
    assert scan.metadata == [m for _, _, _, m in recs]


def test_boxes_from_coco_objects_alone_when_packer_label_is_dropped(store, tmp_path):
    _, schema, _, recs = store
    if schema != "boxes":
        pytest.skip("box stores only")
    res = _export(store, tmp_path / "out")
    ds = datasets.load_dataset("parquet", data_files=sorted(res.shards), split="train",
                               cache_dir=str(tmp_path / "cache")).remove_columns(["packer_label"])
    ds.save_to_disk(str(tmp_path / "saved"))
    scan = HF.scan(str(tmp_path / "saved"), ScanOptions())
    assert scan.label_schema == "boxes" and len(scan.labels) == len(recs)
    for got, (_, _, want, _) in zip(scan.labels, recs):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_lazy_locators_slice_pickle_and_go_back(store, tmp_path):
    _, _, _, recs = store
    _export(store, tmp_path / "out")
    locs = HF.scan(str(tmp_path / "out"), ScanOptions()).locators
    assert isinstance(locs, LazyLocators) and len(locs) == len(recs)
    want = [d for _, d, _, _ in recs]
    assert [read_locator(locs[i]) for i in (12, 0, 7, 6, 1)] == [want[i] for i in (12, 0, 7, 6, 1)]
    part = pickle.loads(pickle.dumps(locs[5:9]))
    assert [read_locator(x) for x in part] == want[5:9]


# ---------------------------------------------------------------------------------------
# Damage
# ---------------------------------------------------------------------------------------
def test_corrupt_parquet_page_names_file_and_row_group(jpegs, tmp_path):
    path = str(tmp_path / "train-00000-of-00001.parquet")
    _class_ds(jpegs).to_parquet(path, batch_size=4)       # row groups of 4 rows
    start, _ = parquet_chunk(path, 1)
    with open(path, "r+b") as fh:                          # the page header of group 1's image bytes
        fh.seek(start)
        fh.write(b"\xde\xad\xbe\xef" * 4)
    scan = HF.scan(path, ScanOptions())
    p = _problem(scan, "train-00000-of-00001.parquet:row group 1", "rows 4-7")
    assert "\n" not in p["reason"] and p["kind"] == "damaged"
    assert scan.keys == [n for n, _, _ in jpegs[:4] + jpegs[8:]]
    assert _bytes(scan) == [d for _, d, _ in jpegs[:4] + jpegs[8:]]


def test_bit_flip_in_an_exported_page_fails_its_checksum(store, tmp_path):
    _, _, _, recs = store
    res = _export(store, tmp_path / "out")
    first = sorted(res.shards)[0]
    start, size = parquet_chunk(first, 0)
    with open(first, "r+b") as fh:                         # inside the image data, not the header
        fh.seek(start + size // 2)
        b = fh.read(1)
        fh.seek(start + size // 2)
        fh.write(bytes([b[0] ^ 0x10]))
    scan = HF.scan(str(tmp_path / "out"), ScanOptions())
    assert _problem(scan, "data/train-00000-of-00003.parquet:row group 0", "rows 0-4")
    assert scan.keys == [k for k, _, _, _ in recs[5:]] and _bytes(scan) == [d for _, d, _, _ in recs[5:]]


def test_cut_and_unreadable_files_are_listed_and_the_rest_kept(jpegs, tmp_path):
    ds = _class_ds(jpegs)
    saved = tmp_path / "saved"
    ds.save_to_disk(str(saved), num_shards=2)
    second = saved / "data-00001-of-00002.arrow"
    second.write_bytes(second.read_bytes()[: second.stat().st_size // 2])
    scan = HF.scan(str(saved), ScanOptions())
    p = _problem(scan, "data-00001-of-00002.arrow:record batch 0")
    assert "rest of the file" in p["reason"]
    assert scan.keys == [n for n, _, _ in jpegs[:6]] and _bytes(scan) == [d for _, d, _ in jpegs[:6]]
    # a parquet folder: one shard cut (footer gone), one not parquet at all
    data = tmp_path / "pq" / "data"
    for i in range(3):
        ds.select(range(4 * i, 4 * i + 4)).to_parquet(str(data / f"train-0000{i}-of-00003.parquet"))
    cut = data / "train-00001-of-00003.parquet"
    cut.write_bytes(cut.read_bytes()[:100])
    scan = HF.scan(str(tmp_path / "pq"), ScanOptions())
    assert "footer" in _problem(scan, "data/train-00001-of-00003.parquet")["reason"]
    assert scan.keys == [n for n, _, _ in jpegs[:4] + jpegs[8:]]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.parquet").write_bytes(b"PAR1 not really")
    assert "x.parquet" in _problem(HF.scan(str(tmp_path / "junk"), ScanOptions()), "x.parquet")["path"]


def test_detect_claims_hf_layouts_only(jpegs, tmp_path):
    assert not HF.detect(tmp_path / "missing")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(jpegs[0][1])
    assert not HF.detect(tmp_path / "images") and not HF.detect(tmp_path / "images" / "a.jpg")
    (tmp_path / "mds").mkdir()
    (tmp_path / "mds" / "index.json").write_text("{}")
    assert not HF.detect(tmp_path / "mds")


# ---------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures the peak through Linux /proc")
def test_scan_memory_stays_flat(tmp_path):
    """4000 rows of ~19 KB (~75 MB): scanning and reading every locator in order grows the
    process by far less than the data (image bytes never pile up)."""
    from packer.sample import encode_jpeg

    rng = np.random.default_rng(0)
    base = []
    for _ in range(20):
        img = rng.integers(0, 256, (72, 72, 3), dtype=np.uint8)
        base.append(encode_jpeg(np.repeat(np.repeat(img, 2, 0), 2, 1), quality=90))
    n = 4000
    feats = Features({"image": Image(), "label": ClassLabel(names=NAMES)})
    ds = Dataset.from_dict({"image": [{"bytes": base[i % 20], "path": f"{i:05d}.jpg"} for i in range(n)],
                            "label": [i % 3 for i in range(n)]}, features=feats)
    ds.to_parquet(str(tmp_path / "pq" / "data" / "train-00000-of-00001.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    total = sum(len(base[i % 20]) for i in range(n))
    probe = textwrap.dedent("""
        import sys
        from packer.interchange import ScanOptions, get_format, read_locator
        import packer.jobs.export, packer.interchange.hf, pyarrow.parquet
        def status(field):
            with open("/proc/self/status") as fh:
                return next(int(line.split()[1]) << 10 for line in fh if line.startswith(field))
        with open("/proc/self/clear_refs", "w") as fh:   # the peak (VmHWM) starts again from here
            fh.write("5")
        before = status("VmRSS:")
        scan = get_format("hf").scan(sys.argv[1], ScanOptions())
        got = sum(len(read_locator(scan.locators[i])) for i in range(len(scan.keys)))
        print(got, status("VmHWM:") - before)
    """)
    for src in ("pq", "saved"):
        out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / src)], capture_output=True, text=True,
                             timeout=240)
        assert out.returncode == 0, out.stderr
        got, grew = map(int, out.stdout.split())
        assert got == total
        assert grew < total * 0.5, f"{src}: the process grew {grew >> 20} MiB reading {total >> 20} MiB"


def test_image_the_decode_check_rejects_is_named_by_file_and_row(jpegs, tmp_path):
    from tests.interchange_fixtures import check_damage_named
    bad = [(n, b"not a jpeg" if i == 1 else d, wh) for i, (n, d, wh) in enumerate(jpegs[:3])]
    (tmp_path / "in").mkdir()
    _class_ds(bad, paths=False).to_parquet(str(tmp_path / "in" / "train.parquet"))
    check_damage_named(str(tmp_path / "in"), tmp_path / "o.lmdb", "train.parquet:row 1")
