"""The store contract, run unchanged against every registered format (see stores/base.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import packer
from packer.core.errors import StoreError, UsageError
from packer.core.records import Record, labels_equal
from packer.sources.folders import collect_sources
from packer.stores import detect_format, get_store, open_store
from readers import StoreDataset, collate_list
from tests import REPO


def _records(location, fmt):
    with open_store(location, fmt) as r:
        return [r.get(i) for i in range(r.metadata.count)], r.metadata


def _same_records(a: Record, b: Record):
    assert a.meta_dict().keys() == b.meta_dict().keys()
    for k, v in a.meta_dict().items():
        if k == "label":
            assert labels_equal(a.label, b.label), k
        else:
            assert v == b.meta_dict()[k], k
    assert bytes(a.data) == bytes(b.data)


def test_round_trip(fmt, location_for, boxes_dataset):
    images, labels = boxes_dataset
    loc = location_for()
    rep = packer.build(images, labels, loc, fmt, workers=1)
    assert rep.published and rep.ok and rep.records == 24
    assert detect_format(loc) == fmt
    src = collect_sources(images, labels)
    recs, meta = _records(loc, fmt)
    assert meta.count == 24 and meta.label_schema == "boxes" and meta.format == fmt
    with open_store(loc, fmt) as reader:
        for i, (rec, key, label) in enumerate(zip(recs, src.keys, src.labels)):
            assert rec.index == i and rec.key == key
            assert labels_equal(rec.label, label)
            assert rec.data_ok()
            if reader.encoding == "jpeg":
                # Clean baseline/progressive JPEGs are stored byte for byte.
                assert bytes(rec.data) == (images / key).read_bytes()
                assert rec.converted == ""
            assert reader.index_of(key) == i
        with pytest.raises(KeyError):
            reader.index_of("no/such/key.jpg")
        with pytest.raises(IndexError):
            reader.get(24)
    v = packer.verify(loc, deep=True)
    assert v.ok, [str(p) for p in v.problems]
    assert v.checked == 24


def test_get_many_matches_get(fmt, location_for, boxes_dataset):
    loc = location_for()
    packer.build(*boxes_dataset, loc, fmt, workers=1)
    with open_store(loc, fmt) as r:
        order = [5, 0, 23, 5, 11, 12, 13, 1]
        for a, i in zip(r.get_many(order), order):
            _same_records(a, r.get(i))
        assert r.get_many([]) == []


def test_class_folders(fmt, location_for, classes_dataset):
    loc = location_for()
    rep = packer.build(classes_dataset, None, loc, fmt, workers=1)
    assert rep.ok
    recs, meta = _records(loc, fmt)
    assert meta.label_schema == "class" and meta.class_names == ["bird", "cat", "dog"]
    for rec in recs:
        assert meta.class_names[rec.label] == rec.key.split("/")[0]


def test_worker_count_does_not_change_the_store(fmt, location_for, boxes_dataset):
    a, b = location_for("one"), location_for("two")
    packer.build(*boxes_dataset, a, fmt, workers=1)
    packer.build(*boxes_dataset, b, fmt, workers=2, commit_bytes=50_000)
    ra, ma = _records(a, fmt)
    rb, mb = _records(b, fmt)
    assert ma.index_checksum == mb.index_checksum
    for x, y in zip(ra, rb):
        _same_records(x, y)


def test_exception_inside_writer_publishes_nothing(fmt, location_for, boxes_dataset):
    loc = location_for()
    cls = get_store(fmt)
    with pytest.raises(RuntimeError, match="boom"):
        with cls.create_writer(loc) as w:
            w.open("fp", resume=True)
            w.flush()
            raise RuntimeError("boom")
    assert not cls.exists(loc)
    with pytest.raises(StoreError):
        open_store(loc, fmt)


def test_publish_refuses_existing_store(fmt, location_for, boxes_dataset):
    loc = location_for()
    packer.build(*boxes_dataset, loc, fmt, workers=1)
    with pytest.raises(UsageError, match="exists"):
        packer.build(*boxes_dataset, loc, fmt, workers=1)
    rep = packer.build(*boxes_dataset, loc, fmt, workers=1, overwrite=True, quality=80)
    assert rep.ok
    assert packer.verify(loc).ok


def _kill_build_script(images, labels, loc, fmt, commit_bytes) -> str:
    return (f"import sys; sys.path.insert(0, {str(REPO)!r}); import packer; "
            f"packer.build({str(images)!r}, {str(labels)!r}, {loc!r}, {fmt!r}, workers=1, "
            f"commit_bytes={commit_bytes})")


def test_killed_build_resumes_to_the_same_store(fmt, location_for, boxes_dataset):
    images, labels = boxes_dataset
    ref, loc = location_for("ref"), location_for("killed")
    packer.build(images, labels, ref, fmt, workers=1)
    env = dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="2")
    proc = subprocess.run([sys.executable, "-c", _kill_build_script(images, labels, loc, fmt, 40_000)],
                          env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not get_store(fmt).exists(loc)
    rep = packer.build(images, labels, loc, fmt, workers=2, commit_bytes=40_000)
    assert rep.published and 0 < rep.resumed_from < 24
    ra, ma = _records(ref, fmt)
    rb, mb = _records(loc, fmt)
    assert ma.index_checksum == mb.index_checksum and ma.count == mb.count == 24
    for x, y in zip(ra, rb):
        _same_records(x, y)
    assert packer.verify(loc, deep=True).ok


def test_resume_refuses_other_inputs(fmt, location_for, boxes_copy):
    images, labels = boxes_copy
    loc = location_for()
    env = dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="1")
    proc = subprocess.run([sys.executable, "-c", _kill_build_script(images, labels, loc, fmt, 40_000)],
                          env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    (labels / "part0" / "img_00000.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    with pytest.raises(UsageError, match="partial build"):
        packer.build(images, labels, loc, fmt, workers=1)
    rep = packer.build(images, labels, loc, fmt, workers=1, resume=False)
    assert rep.ok and rep.resumed_from == 0
    with open_store(loc, fmt) as r:
        assert np.allclose(r.get(0).label, [[0, 0.5, 0.5, 0.1, 0.1]])


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_dataloader_workers_see_every_sample_once(fmt, location_for, boxes_dataset, ctx):
    loc = location_for()
    packer.build(*boxes_dataset, loc, fmt, workers=1)
    ds = StoreDataset(loc, return_key=True, layout="HWC")
    ds[0]  # open a handle in the parent first: workers must not reuse it
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=ctx,
                                         collate_fn=collate_list, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    keys = [s[2] for batch in loader for s in batch]
    assert sorted(keys) == sorted(collect_sources(*boxes_dataset).keys)
    assert len(keys) == len(set(keys)) == 24
    ds.close()


# -- the registry and the facts each store declares --------------------------------------------
def test_registry_lists_its_backends_explicitly():
    """The backends are the modules named in BACKENDS; the package's other modules (the cache,
    staging, sampling...) are not imported as backends."""
    code = ("import sys; import packer.stores as s; names = s.available_formats(); "
            "mods = sorted({s.get_store(n).__module__.split('.')[2] for n in names}); "
            "import json; print(json.dumps([mods, list(s.BACKENDS), 'packer.stores.cache' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mods, backends, cache = json.loads(out.stdout)
    assert mods == sorted(backends) == ["hdf5", "lmdb", "manifest", "mongo"]
    assert not cache   # imported by a manifest in a bucket when it reads, not as a backend


# What each store is, as the jobs ask it (never by comparing format names).
FACTS = {"lmdb": dict(composite=False, can_hold_pixels=False, server_backed=False, folder=True),
         "hdf5": dict(composite=False, can_hold_pixels=True, server_backed=False, folder=False),
         "mongo": dict(composite=False, can_hold_pixels=False, server_backed=True, folder=False),
         "manifest": dict(composite=True, can_hold_pixels=False, server_backed=False, folder=False)}


@pytest.mark.parametrize("fmt", sorted(FACTS))
def test_store_declares_its_facts(fmt):
    cls = get_store(fmt)
    assert {k: getattr(cls, k) for k in FACTS[fmt]} == FACTS[fmt]
    # a server-backed store is named by a URL of its schemes; the others by a path
    assert bool(cls.schemes) == cls.server_backed


def test_jobs_ask_facts_not_format_names():
    """No job, the CLI or the report compares a format with a store's name: adding a store
    that is, say, composite needs no edit there."""
    name = r"""["'](lmdb|hdf5|mongo|manifest)["']"""
    pattern = re.compile(rf"""(==|!=)\s*{name}|{name}\s*(==|!=)|in\s*\((None,\s*)?{name}""")
    found = []
    for root in ("packer/jobs", "packer/report", "packer/cli.py"):
        for path in sorted((REPO / root).rglob("*.py")) if (REPO / root).is_dir() else [REPO / root]:
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line.split("#")[0]):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
