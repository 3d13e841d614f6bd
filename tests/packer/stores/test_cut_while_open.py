"""A store file cut short while readers have it open (truncated by another process, a failed
copy over it): the next read raises StoreError naming the store, never SIGBUS.

LMDB and the readers' record facts read ``data.mdb`` through memory maps; touching a mapped page
past the end of a file cut short raises SIGBUS, which kills the process. Each case runs in a
child process, so a crash fails its test (rc -7) instead of taking pytest down."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import packer
from packer.sample import make_dataset
from tests import REPO

_PRELUDE = """
import os, sys
from pathlib import Path
from packer.core.errors import StoreError
store = Path(sys.argv[1])

def cut():
    f = store / "data.mdb"
    os.truncate(f, f.stat().st_size // 4)

def expect_store_error(fn):
    try:
        fn()
    except StoreError as exc:
        assert "cut short while open" in str(exc) and str(store) in str(exc), exc
        print("StoreError:", exc)
        return
    raise SystemExit("no error: read on past a cut")
"""

CASES = {
    # CropDataset: the second batch decodes the records straight from the map of data.mdb
    "crop-dataset-in-place": """
from readers import CropDataset, RandomResizedCrop
ds = CropDataset(store, RandomResizedCrop(24, seed=3))
ds.load_batch(list(range(8)))
ds.load_batch(list(range(8)))
cut()
expect_store_error(lambda: ds.load_batch(list(range(8))))
""",
    # read in place before the cut, decoded after it (BatchLoader reads batches ahead)
    "crop-dataset-read-then-cut": """
from readers import CropDataset, RandomResizedCrop
ds = CropDataset(store, RandomResizedCrop(24, seed=3))
ds.load_batch(list(range(8)))
prepared = ds.prepare_batch(list(range(8)))
assert prepared.packed[1].dim() == 2  # spans in the map
cut()
expect_store_error(lambda: ds.decode_batch(prepared))
""",
    # first reads after the cut go through LMDB itself (no facts kept yet)
    "crop-dataset-first-read": """
from readers import CropDataset, RandomResizedCrop
ds = CropDataset(store, RandomResizedCrop(24, seed=3))
ds.load_batch([0])
cut()
expect_store_error(lambda: ds.load_batch(list(range(1, 8))))
""",
    "store-dataset": """
from readers import StoreDataset
ds = StoreDataset(store)
ds[0]
cut()
expect_store_error(lambda: ds[5])
""",
    "batch-loader": """
import torch
from readers import BatchLoader, CropDataset, FullDecode
torch.set_num_threads(2)
loader = BatchLoader(CropDataset(store, FullDecode(), layout="HWC"), batch_size=2)
list(loader)
list(loader)  # every record read in place from the map now
cut()         # between epochs: nothing is being decoded (a cut during a decode still crashes)
expect_store_error(lambda: list(loader))
""",
    "raw-reader": """
from readers.raw import RawReader
rr = RawReader(str(store), threads=2)
rr.read([0, 3, 5])
rr.read([0, 3, 5])
cut()
expect_store_error(lambda: rr.read([0, 3, 5]))
""",
}
# The same reads with the record checks in gpu_ops' C++ op (PACKER_NATIVE_RECORDS=1: whatever the
# batch's size), which reads the map from its own threads.
_NATIVE = """
os.environ["PACKER_NATIVE_RECORDS"] = "1"
from readers.raw import _gather_op
print("native op:", _gather_op() is not None)
"""
for _name in ("crop-dataset-in-place", "raw-reader"):
    CASES[_name + "-native-checks"] = _NATIVE + CASES[_name]


@pytest.fixture(scope="module")
def same_size_images(tmp_path_factory):
    images, _ = make_dataset(tmp_path_factory.mktemp("cut"), 8, kind="classes", seed=6, sizes=((48, 64),))
    return images


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_a_store_cut_while_open_raises_instead_of_crashing(case, same_size_images, tmp_path):
    store = tmp_path / "s.lmdb"
    packer.build(same_size_images, None, store, workers=1)
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(_PRELUDE) + textwrap.dedent(CASES[case]))
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, str(script), str(store)], cwd=REPO, capture_output=True, text=True,
                          timeout=100, env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "StoreError:" in proc.stdout
    if "native op: False" in proc.stdout:  # the case ran, through the Python loop
        from tests.gpu_ops_helpers import gather_op_or_skip

        gather_op_or_skip()
        pytest.fail("gpu_ops' record op loads here but not in the child process")
