"""Hostile label files through the real CLI (issue 26, "Hostile label files").

Each case must end in exit 1 with a message naming the file (and line), no traceback, and, for
the big files, in bounded memory: the build runs under an address-space limit of 1 GiB, so a
reader that loads a 300 MB or 1 GiB file whole (or builds a tree of it) fails with MemoryError.
Big files are sparse (``truncate``) or written in 1 MiB chunks, and deleted after the test.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packer.labels.limits import (
    MAX_CLASS_ID,
    MAX_JSON_ENTRY_CHARS,
    MAX_LINE_CHARS,
    MAX_PER_IMAGE_BYTES,
    MAX_PROBLEMS,
    size_text,
)
from packer.sample import make_dataset

#: Address-space limit of a build reading a big hostile file: "well under 1 GiB" of real use
#: (the interpreter, numpy and packer take about 0.4 GiB of it).
MEMORY = 1 << 30
GIB, MB = 1 << 30, 1_000_000


def packer(*args, memory: int | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit if memory else None)


def assert_refused(proc, *needles):
    """Exit 1, no traceback, every needle in stderr."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "Error:" not in proc.stderr.replace("error:", ""), proc.stderr[-3000:]
    for needle in needles:
        assert str(needle) in proc.stderr, (needle, proc.stderr[-3000:])


def write_repeated(path: Path, head: bytes, line: bytes, size: int, tail: bytes = b"") -> None:
    """``head``, then ``line`` repeated up to ``size`` bytes (written in 1 MiB chunks), then ``tail``."""
    chunk = line * max(1, (1 << 20) // len(line))
    with open(path, "wb") as fh:
        fh.write(head)
        written = len(head)
        while written < size:
            fh.write(chunk)
            written += len(chunk)
        fh.write(tail)


def dataset(root: Path, n: int = 4):
    """(IMAGES, the image keys) of a small flat dataset (labels.csv is replaced by the tests)."""
    images, _ = make_dataset(root, n=n, kind="csv", sizes=((40, 48),))
    return images, sorted(p.relative_to(images).as_posix() for p in images.rglob("*.jpg"))


@pytest.fixture
def flat(tmp_path):
    return dataset(tmp_path / "ds")


# ---------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_sparse_1gib_csv_is_refused_in_bounded_memory(flat, tmp_path):
    images, _ = flat
    csv_path = tmp_path / "labels.csv"
    with open(csv_path, "wb") as fh:
        fh.truncate(GIB)   # 1 GiB of NUL bytes, no newline: one "line"
    try:
        proc = packer("build", images, csv_path, "-o", tmp_path / "out.lmdb", memory=MEMORY)
    finally:
        csv_path.unlink()
    assert_refused(proc, f"{csv_path}:1:", f"a line longer than {MAX_LINE_CHARS} characters")
    assert not (tmp_path / "out.lmdb").exists()


@pytest.mark.timeout(60)
def test_csv_of_repeated_lines_stops_after_a_bounded_number_of_problems(flat, tmp_path):
    images, keys = flat
    csv_path = tmp_path / "labels.csv"
    write_repeated(csv_path, b"path,label\n", f"{keys[0]},cat\n".encode(), 300 * MB)
    try:
        proc = packer("build", images, csv_path, "-o", tmp_path / "out.lmdb", memory=MEMORY)
    finally:
        csv_path.unlink()
    assert_refused(proc, f"{csv_path}:3: {keys[0]} is labeled twice", f"stopped reading after {MAX_PROBLEMS} problems")


@pytest.mark.timeout(90)
def test_big_csv_is_streamed_not_loaded(flat, tmp_path):
    """300 MB of blank rows before the labels: read through in bounded memory, and built."""
    images, keys = flat
    csv_path = tmp_path / "labels.csv"
    rows = "".join(f"{k},{i % 2}\n" for i, k in enumerate(keys)).encode()
    write_repeated(csv_path, b"path,label\n", b" " * 9999 + b"\n", 300 * MB, rows)
    try:
        proc = packer("build", images, csv_path, "-o", tmp_path / "out.lmdb", "-j", 1, memory=MEMORY)
    finally:
        csv_path.unlink()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(keys)} records" in proc.stdout


@pytest.mark.timeout(60)
def test_csv_field_over_the_field_limit_names_file_and_line(flat, tmp_path):
    images, keys = flat
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text(f"path,label\n{keys[0]},cat\n{keys[1]},\"{'x' * 200_000}\"\n")
    proc = packer("build", images, csv_path, "-o", tmp_path / "out.lmdb")
    assert_refused(proc, f"{csv_path}:3: a field longer than 131072 characters")


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------

def _nested(path: Path, head: bytes, depth: int, tail: bytes) -> None:
    """``head`` + ``depth`` '[' + ``depth`` ']' + ``tail``, in chunks."""
    with open(path, "wb") as fh:
        fh.write(head)
        for ch in (b"[", b"]"):
            left = depth
            while left:
                n = min(left, 1 << 20)
                fh.write(ch * n)
                left -= n
        fh.write(tail)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("form", ["coco", "mapping", "mapping-value", "wide-value"])
def test_200mb_of_nested_arrays_in_labels_json(flat, tmp_path, form):
    images, keys = flat
    js = tmp_path / "labels.json"
    depth = 100 * MB   # 200 MB of brackets
    if form == "coco":        # a COCO file (detected by its "annotations") with one nested annotation
        _nested(js, b'{"images": [], "annotations": [', depth, b"]}")
        why = "nested deeper than 100 levels"
    elif form == "mapping":   # nothing but brackets: packer's own {path: label} form
        _nested(js, b"", depth, b"")
        why = "expected an object mapping relative path -> label, found a JSON array"
    elif form == "mapping-value":
        _nested(js, f'{{"{keys[0]}": '.encode(), depth, b"}")
        why = "nested deeper than 100 levels"
    else:                     # a label value of 200 MB of empty arrays, nested 2 deep
        write_repeated(js, f'{{"{keys[0]}": [[]'.encode(), b",[]", 200 * MB, b"]}")
        why = f"an entry longer than {MAX_JSON_ENTRY_CHARS} characters"
    try:
        proc = packer("build", images, js, "-o", tmp_path / "out.lmdb", memory=MEMORY)
    finally:
        js.unlink()
    assert_refused(proc, f"{js}:1:", why)


@pytest.mark.timeout(60)
def test_per_image_json_nested_100000_deep(flat, tmp_path):
    images, keys = flat
    labels = tmp_path / "labels"
    for k in keys:
        (labels / k).parent.mkdir(parents=True, exist_ok=True)
        (labels / k).with_suffix(".json").write_text(json.dumps({"class": "cat"}))
    deep = (labels / keys[1]).with_suffix(".json")
    deep.write_text("[" * 100_000 + "]" * 100_000)
    proc = packer("build", images, labels, "-o", tmp_path / "out.lmdb", memory=MEMORY)
    assert_refused(proc, f"{deep}: JSON nested 100000 levels deep (at most 100 allowed)")


@pytest.mark.timeout(60)
def test_labels_json_in_latin1_is_not_utf8(flat, tmp_path):
    images, keys = flat
    js = tmp_path / "labels.json"
    js.write_bytes(("{\n" + ",\n".join(f'"{k}": "caf\u00e9"' for k in keys) + "\n}\n").encode("latin-1"))
    proc = packer("build", images, js, "-o", tmp_path / "out.lmdb")
    assert_refused(proc, f"{js}:2: not UTF-8 text (byte 0xe9")


@pytest.mark.timeout(60)
def test_coco_json_in_latin1_is_not_utf8(tmp_path):
    from tests import label_corpus as lc

    images, js, coco = lc.make_coco(tmp_path / "c")
    coco["categories"][0]["name"] = "caf\u00e9"
    js.write_bytes(json.dumps(coco, indent=1, ensure_ascii=False).encode("latin-1"))
    proc = packer("build", images, js, "-o", tmp_path / "out.lmdb")
    assert_refused(proc, f"{js}:", "not UTF-8 text (byte 0xe9")


@pytest.mark.timeout(60)
def test_labels_json_in_utf16_with_a_bom_is_read(flat, tmp_path):
    """JSON in UTF-16 with a byte order mark is what the json module reads from bytes: kept."""
    images, keys = flat
    js = tmp_path / "labels.json"
    js.write_bytes(json.dumps({k: "cat" if i % 2 else "dog" for i, k in enumerate(keys)}).encode("utf-16"))
    proc = packer("build", images, js, "-o", tmp_path / "out.lmdb")
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# YOLO text files
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def yolo(tmp_path):
    images, labels = make_dataset(tmp_path / "y", n=4, kind="boxes", sizes=((40, 48),))
    return images, labels, sorted(labels.rglob("*.txt"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content, why", [
    ("0 0.5 0.5 0.2 0.2\n".encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0; it starts with a UTF-16 "
                                              "byte order mark)"),
    (bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)), "not UTF-8 text"),
], ids=["utf-16", "binary-junk"])
def test_yolo_txt_not_utf8_names_the_file(yolo, tmp_path, content, why):
    images, labels, txts = yolo
    txts[0].write_bytes(content)
    proc = packer("build", images, labels, "-o", tmp_path / "out.lmdb")
    assert_refused(proc, f"{txts[0]}:", why)


@pytest.mark.timeout(60)
def test_sparse_1gib_yolo_txt_is_refused_unread(yolo, tmp_path):
    images, labels, txts = yolo
    with open(txts[0], "wb") as fh:
        fh.truncate(GIB)
    try:
        proc = packer("build", images, labels, "-o", tmp_path / "out.lmdb", memory=MEMORY)
    finally:
        txts[0].unlink()
    assert_refused(proc, f"{txts[0]}: 1 GiB is more than a label file may hold ({size_text(MAX_PER_IMAGE_BYTES)})")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", [2 ** 24 + 1, 10 ** 12, 2 ** 53 + 1])
def test_yolo_class_id_a_float32_box_row_cannot_hold_is_refused(yolo, tmp_path, cls):
    images, labels, txts = yolo
    txts[1].write_text(f"0 0.5 0.5 0.2 0.2\n{cls} 0.5 0.5 0.2 0.2\n")
    proc = packer("build", images, labels, "-o", tmp_path / "out.lmdb")
    assert_refused(proc, f"{txts[1]}:2: class id {cls} is larger than 16777216 (2**24)", "float32")
    assert MAX_CLASS_ID["boxes"] == 2 ** 24


@pytest.mark.timeout(60)
def test_yolo_class_id_2_to_24_is_stored_exactly(yolo, tmp_path):
    from packer import open_store

    images, labels, txts = yolo
    txts[1].write_text(f"{2 ** 24} 0.5 0.5 0.2 0.2\n")
    proc = packer("build", images, labels, "-o", tmp_path / "out.lmdb")
    assert proc.returncode == 0, proc.stderr[-3000:]
    key = txts[1].relative_to(labels).with_suffix(".jpg").as_posix()
    with open_store(tmp_path / "out.lmdb") as store:
        rec = next(r for r in map(store.get, range(len(store))) if r.key == key)
    assert int(rec.label[0, 0]) == 2 ** 24


# ---------------------------------------------------------------------------------------------
# Class ids a store cannot hold; VOC nesting
# ---------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("out", ["out.h5", "out.lmdb"])
def test_csv_class_id_beyond_int64_is_refused(flat, tmp_path, out):
    images, keys = flat
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("path,label\n" + "".join(f"{k},{10 ** 20 if i == 2 else i}\n" for i, k in enumerate(keys)))
    proc = packer("build", images, csv_path, "-o", tmp_path / out)
    assert_refused(proc, f"{csv_path}:4: class id {10 ** 20} is larger than {2 ** 63 - 1}")


@pytest.mark.timeout(60)
def test_voc_xml_nested_100000_deep(tmp_path):
    from tests import label_corpus as lc

    images, ann_dir = lc.make_voc(tmp_path / "v")
    xml = sorted(Path(ann_dir).rglob("*.xml"))[0]
    xml.write_text("<annotation><folder>" + "<a>" * 100_000 + "</a>" * 100_000 + "</folder></annotation>")
    proc = packer("build", images, ann_dir, "-o", tmp_path / "out.lmdb")
    assert_refused(proc, f"{xml}: XML elements nested more than 64 deep")
