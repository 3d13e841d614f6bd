"""No command loses a user's files (issue 25, "Data loss").

``--overwrite`` replaces only a packer store of any format (or its partial build); anything else
at the output is refused with exit 2, naming it and saying what it is. An output that is, lies
inside or contains one of the command's inputs is refused whatever the options. Every test
checks that the files are still there, byte for byte, afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import packer as pk
from packer.core.errors import UsageError
from packer.sample import make_dataset
from packer.stores import open_store

pytestmark = pytest.mark.timeout(180)


def snapshot(path) -> dict:
    """Every file at or under ``path`` -> its bytes (symbolic links -> their target)."""
    path = Path(path)
    if path.is_symlink():
        return {"": ("link", os.readlink(path))}
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else "dir")
            for p in sorted(path.rglob("*"))}


def packer(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer", *map(str, args)], capture_output=True,
                          text=True, timeout=150, cwd=cwd)


def assert_refused(r: subprocess.CompletedProcess, path, *words) -> None:
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert str(path) in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.fixture
def data(tmp_path):
    """parent/images + parent/labels (6 small YOLO-labelled JPEGs) and the user's thesis beside
    them; a folder of 12 of the user's files; a text file of the user's."""
    images, labels = make_dataset(tmp_path / "parent", 6, kind="boxes", sizes=((40, 56),), seed=3)
    (tmp_path / "parent" / "thesis.tex").write_text("\\chapter{Years of work}\n")
    mine = tmp_path / "notastore"
    for i in range(12):
        (mine / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (mine / f"d{i % 3}" / f"note{i}.txt").write_bytes(f"note {i}\n".encode() * (i + 1))
    (tmp_path / "existing.txt").write_text("keep me\n")
    return tmp_path, images, labels


def _store(tmp_path, images, labels, name="s.lmdb", fmt=None) -> Path:
    out = tmp_path / name
    assert pk.build(images, labels, out, fmt, workers=1, executor="inline").published
    return out


# -- build: what --overwrite may replace ------------------------------------------------------

@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_build_overwrite_refuses_a_folder_of_user_files(data, fmt):
    tmp, images, labels = data
    before = snapshot(tmp)
    r = packer("build", images, labels, "-o", tmp / "notastore", "--format", fmt, "--overwrite", "-j", "1")
    assert_refused(r, tmp / "notastore", "is a folder of 12 files", "not a packer store", "refusing")
    assert snapshot(tmp) == before


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_build_overwrite_refuses_a_file(data, fmt):
    tmp, images, labels = data
    before = snapshot(tmp)
    r = packer("build", images, labels, "-o", tmp / "existing.txt", "--format", fmt, "--overwrite", "-j", "1")
    assert_refused(r, tmp / "existing.txt", "is a file of 8 bytes", "not a packer store")
    assert snapshot(tmp) == before


def test_build_overwrite_refuses_another_programs_lmdb_and_hdf5(data):
    """Recognised by packer's metadata and layout, not by the file type."""
    import h5py
    import lmdb

    tmp, images, labels = data
    env = lmdb.open(str(tmp / "caffe.lmdb"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"00000001", b"someone else's datum")
    env.close()
    with h5py.File(tmp / "results.h5", "w") as f:
        f["loss"] = [0.5, 0.25]
    before = snapshot(tmp)
    for out in ("caffe.lmdb", "results.h5"):
        r = packer("build", images, labels, "-o", tmp / out, "--overwrite", "-j", "1")
        assert_refused(r, tmp / out, "not a packer store")
    assert snapshot(tmp) == before


def test_library_build_refuses_too(data):
    """The check is in the library entry point: library users get it, not just the CLI."""
    tmp, images, labels = data
    before = snapshot(tmp)
    with pytest.raises(UsageError, match="notastore is a folder of 12 files"):
        pk.build(images, labels, tmp / "notastore", overwrite=True, workers=1)
    assert snapshot(tmp) == before


# -- build: outputs that are, contain or lie inside an input ----------------------------------

@pytest.mark.parametrize("out, how, overwrite", [
    ("parent/images", "is the input images", True),
    ("parent/images", "is the input images", False),
    ("parent/labels", "is the input labels", True),
    ("parent", "contains the input images", True),
    (".", "contains the input images", True),
    ("parent/images/part0/new.lmdb", "lies inside the input images", True),
    ("parent/images/part0/new.lmdb", "lies inside the input images", False),
    ("parent/labels/new.h5", "lies inside the input labels", False),
    ("parent/labels/../images", "is the input images", True),
])
def test_build_output_related_to_an_input_is_always_refused(data, out, how, overwrite):
    tmp, images, labels = data
    before = snapshot(tmp)
    r = packer("build", "parent/images", "parent/labels", "-o", out, "-j", "1",
               *(["--overwrite"] if overwrite else []), cwd=tmp)
    assert_refused(r, out, how, "with or without --overwrite")
    assert snapshot(tmp) == before


def test_build_output_through_a_symlink_to_the_inputs_is_refused(data):
    tmp, images, labels = data
    (tmp / "link").symlink_to(images, target_is_directory=True)
    (tmp / "up").symlink_to(tmp / "parent", target_is_directory=True)
    before = snapshot(tmp / "parent")
    assert_refused(packer("build", images, labels, "-o", tmp / "link", "--overwrite", "-j", "1"),
                   tmp / "link", "is the input images")
    assert_refused(packer("build", images, labels, "-o", tmp / "up", "--overwrite", "-j", "1"),
                   tmp / "up", "contains the input images")
    assert snapshot(tmp / "parent") == before and (tmp / "link").is_symlink()


def test_build_html_report_over_a_user_file_is_refused_before_the_build(data):
    tmp, images, labels = data
    before = snapshot(tmp)
    r = packer("build", images, labels, "-o", tmp / "new.lmdb", "--html", tmp / "existing.txt", "-j", "1")
    assert_refused(r, tmp / "existing.txt", "not an HTML report packer wrote")
    assert snapshot(tmp) == before and not (tmp / "new.lmdb").exists()


# -- build: what --overwrite does replace, and resume -------------------------------------------

@pytest.mark.parametrize("fmt, name", [("lmdb", "s.lmdb"), ("hdf5", "s.h5")])
@pytest.mark.parametrize("damage", ["intact", "cut short"])
def test_build_overwrite_replaces_a_packer_store(data, fmt, name, damage):
    tmp, images, labels = data
    out = _store(tmp, images, labels, name)
    if damage == "cut short":   # a damaged store is still recognisably packer's: rebuilding it is allowed
        f = out / "data.mdb" if fmt == "lmdb" else out
        os.truncate(f, f.stat().st_size // 2)
    assert_refused(packer("build", images, labels, "-o", out, "-j", "1"), out, "already exists", "--overwrite")
    r = packer("build", images, "-o", out, "--no-labels", "--overwrite", "-j", "1", "-q")
    assert r.returncode == 0, r.stderr
    with open_store(out) as s:
        assert s.metadata.label_schema == "none" and len(s) == 6
    assert pk.verify(out).ok


def test_overwrite_keeps_a_user_backup_named_out_old(data):
    """Publishing moves the old store aside under a fresh name, never over ``<out>.old``."""
    tmp, images, labels = data
    out = _store(tmp, images, labels)
    backup = tmp / "s.lmdb.old"
    shutil.copytree(out, backup)
    (backup / "why.txt").write_text("my copy of last week's store\n")
    before = snapshot(backup)
    r = packer("build", images, labels, "-o", out, "--overwrite", "--quality", "80", "-j", "1", "-q")
    assert r.returncode == 0, r.stderr
    assert snapshot(backup) == before
    assert not [p for p in tmp.iterdir() if p.name.startswith("s.lmdb.old-")]


def test_a_user_folder_at_out_partial_is_never_discarded(data):
    tmp, images, labels = data
    staged = tmp / "out.partial"
    shutil.copytree(tmp / "notastore", staged)
    before = snapshot(tmp)
    for extra in ([], ["--no-resume"], ["--overwrite", "--no-resume"]):
        r = packer("build", images, labels, "-o", tmp / "out", "-j", "1", *extra)
        assert_refused(r, staged, "not a packer partial build")
    assert snapshot(tmp) == before


@pytest.mark.parametrize("fmt, name", [("lmdb", "k.lmdb"), ("hdf5", "k.h5")])
def test_killed_build_still_resumes(data, fmt, name):
    tmp, images, labels = data
    out = tmp / name
    script = (f"import packer; packer.build({str(images)!r}, {str(labels)!r}, {str(out)!r}, "
              f"workers=1, executor='inline', commit_bytes=1)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          env=dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="2"))
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert (tmp / (name + ".partial")).exists() and not out.exists()
    rep = pk.build(images, labels, out, workers=1, executor="inline", commit_bytes=1)
    assert rep.published and 0 < rep.resumed_from < 6
    assert pk.verify(out).ok


# -- the other commands ---------------------------------------------------------------------------

def test_convert_refuses_user_files_and_its_own_source(data):
    tmp, images, labels = data
    src = _store(tmp, images, labels)
    before = snapshot(tmp)
    assert_refused(packer("convert", src, tmp / "notastore", "--format", "hdf5", "--overwrite"),
                   tmp / "notastore", "is a folder of 12 files", "not a packer store")
    assert_refused(packer("convert", src, tmp / "existing.txt", "--format", "hdf5", "--overwrite"),
                   tmp / "existing.txt", "not a packer store")
    assert_refused(packer("convert", src, src / "inner.h5", "--format", "hdf5"),
                   src / "inner.h5", "lies inside the input source store")
    assert_refused(packer("convert", src, src, "--format", "lmdb", "--overwrite"), src, "is the input source store")
    assert snapshot(tmp) == before
    r = packer("convert", src, tmp / "s.h5", "--format", "hdf5", "-q")
    assert r.returncode == 0, r.stderr
    r = packer("convert", src, tmp / "s.h5", "--format", "hdf5", "--overwrite", "-q")   # a store: replaced
    assert r.returncode == 0, r.stderr


def test_export_never_writes_into_user_files_or_the_store(data):
    tmp, images, labels = data
    store = _store(tmp, images, labels)
    before = snapshot(tmp)
    assert_refused(packer("export", store, tmp / "notastore"), tmp / "notastore", "is a folder of 12 files",
                   "new or empty folder")
    assert_refused(packer("export", store, store / "exported"), store / "exported", "lies inside the input store")
    assert_refused(packer("export", store, tmp / "existing.txt"), tmp / "existing.txt")
    assert snapshot(tmp) == before
    (tmp / "empty").mkdir()
    assert packer("export", store, tmp / "empty", "-q").returncode == 0


def test_merge_refuses_user_files_and_its_own_inputs(data):
    tmp, images, labels = data
    for i in range(2):
        assert pk.build(images, labels, tmp / f"s{i}.h5", workers=1, shard=(i, 2), executor="inline").published
    a, b = tmp / "s0.h5", tmp / "s1.h5"
    before = snapshot(tmp)
    assert_refused(packer("merge", a, b, "-o", tmp / "existing.txt", "--overwrite"), tmp / "existing.txt",
                   "is a file of", "not a packer store")
    assert_refused(packer("merge", a, b, "-o", a, "--overwrite"), a, "is the input store")
    assert_refused(packer("merge", a, b, "--copy", "--format", "lmdb", "-o", tmp / "notastore", "--overwrite"),
                   tmp / "notastore", "is a folder of 12 files")
    assert snapshot(tmp) == before
    man = tmp / "m.packer-manifest.json"
    assert packer("merge", a, b, "-o", man, "-q").returncode == 0
    before = snapshot(tmp)
    assert_refused(packer("merge", man, "-o", a, "--copy", "--format", "hdf5", "--overwrite"), a,
                   "is the input shard")
    assert snapshot(tmp) == before
    assert packer("merge", a, b, "-o", man, "--overwrite", "-q").returncode == 0   # a manifest: replaced


def test_append_refuses_a_store_inside_its_images(data):
    tmp, images, labels = data
    store = _store(tmp, images, labels)
    more, more_labels = make_dataset(tmp / "more", 3, kind="boxes", sizes=((40, 56),), seed=9)
    inside = more / "s.lmdb"
    shutil.move(store, inside)
    before = snapshot(tmp)
    r = packer("append", inside, more, more_labels)
    assert_refused(r, inside, "lies inside the input images")
    assert snapshot(tmp) == before


def test_report_never_replaces_a_user_file_or_writes_into_the_store(data):
    pytest.importorskip("matplotlib")
    tmp, images, labels = data
    store = _store(tmp, images, labels)
    (tmp / "index.html").write_text("<html><body>my home page</body></html>\n")
    before = snapshot(tmp)
    assert_refused(packer("report", store, "-o", tmp / "index.html"), tmp / "index.html",
                   "not an HTML report packer wrote")
    assert_refused(packer("report", store, "-o", store / "r.html"), store / "r.html", "lies inside the input store")
    assert_refused(packer("report", store, "-o", tmp / "notastore"), tmp / "notastore", "is a folder of 12 files")
    assert snapshot(tmp) == before
    for _ in range(2):   # an earlier report of packer's is replaced
        r = packer("report", store, "-o", tmp / "r.html", "-q", "--thumbs", "2", "--sample", "6")
        assert r.returncode == 0, r.stderr


def test_repair_refuses_a_store_inside_its_source(data):
    tmp, images, labels = data
    store = _store(tmp, images, labels)
    inside = images / "s.lmdb"
    shutil.move(store, inside)
    before = snapshot(tmp)
    r = packer("repair", inside, "--source", images, labels)
    assert_refused(r, inside, "lies inside the input --source images")
    assert snapshot(tmp) == before


def test_repair_backup_never_lands_on_user_files(data):
    """A repair journal (left by a killed repair) names where the old store goes: a folder of the
    user's there is refused, not used."""
    tmp, images, labels = data
    store = _store(tmp, images, labels)
    from tests.corpus import cut_lmdb_record
    cut_lmdb_record(store, 2)
    journal = tmp / "s.lmdb.repair-journal.json"
    journal.write_text(json.dumps({"phase": "staging", "backup": str(tmp / "notastore"), "format": "lmdb"}))
    before = snapshot(tmp)
    r = packer("repair", store, "--source", images, labels)
    assert_refused(r, tmp / "notastore", "is a folder of 12 files", "not a packer store")
    assert snapshot(tmp) == before
    journal.unlink()
    r = packer("repair", store, "--source", images, labels, "-q")
    assert r.returncode == 0, r.stderr
    assert snapshot(tmp / "notastore") == {k[len("notastore/"):]: v for k, v in before.items()
                                           if k.startswith("notastore/")}


def test_distributed_build_checks_before_starting_a_cluster(data):
    tmp, images, labels = data
    before = snapshot(tmp)
    with pytest.raises(UsageError, match="contains the input images"):
        pk.build(images, labels, tmp / "parent", engine="dask", shards=2, overwrite=True)
    with pytest.raises(UsageError, match="not a packer store"):
        pk.build(images, labels, tmp / "existing.txt", engine="dask", shards=2, overwrite=True)
    with pytest.raises(UsageError, match="lies inside the input images"):
        pk.build(images, labels, tmp / "m.packer-manifest.json", engine="dask", shards=2,
                  shard_dir=str(images / "shards"))
    assert snapshot(tmp) == before


# -- server stores --------------------------------------------------------------------------------

@pytest.mark.mongo
def test_mongo_overwrite_replaces_only_a_packer_collection_set(data, monkeypatch):
    from tests import mongo_support

    tmp, images, labels = data
    monkeypatch.chdir(tmp)
    loc = mongo_support.new_store_location("theirs")
    try:
        client = mongo_support.client_for(loc)
        _, db, coll = mongo_support.split_location(loc)
        client[db][coll].insert_many([{"_id": i, "name": f"customer {i}"} for i in range(5)])
        with pytest.raises(UsageError, match="not a packer store"):
            pk.build(images, labels, loc, overwrite=True, workers=1)
        assert sorted(d["name"] for d in client[db][coll].find()) == [f"customer {i}" for i in range(5)]
        client[db].drop_collection(coll)
        assert pk.build(images, labels, loc, workers=1).published
        assert pk.build(images, None, loc, no_labels=True, overwrite=True, workers=1).published
        with open_store(loc) as r:
            assert r.metadata.label_schema == "none"
        client.close()
    finally:
        mongo_support.drop_location(loc)


@pytest.mark.timeout(120)
def test_an_empty_lmdb_staging_env_is_taken_and_a_foreign_one_refused(tmp_path):
    """A build killed before its first commit leaves an LMDB environment with nothing in it at
    ``<out>.partial``: the rerun takes it. One holding another program's data is refused."""
    import lmdb

    from packer.sample import make_dataset
    images, _ = make_dataset(tmp_path / "d", 6, kind="classes", seed=2)
    out = tmp_path / "out.lmdb"
    lmdb.open(str(tmp_path / "out.lmdb.partial"), map_size=1 << 20).close()   # empty, as killed early
    rep = pk.build(images, None, str(out), "lmdb", workers=1)
    assert rep.published and rep.records == 6
    other = tmp_path / "other.lmdb"
    env = lmdb.open(str(tmp_path / "other.lmdb.partial"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"thesis", b"chapter 1")
    env.close()
    with pytest.raises(UsageError, match="not a packer partial build"):
        pk.build(images, None, str(other), "lmdb", workers=1)
    env = lmdb.open(str(tmp_path / "other.lmdb.partial"), readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"thesis") == b"chapter 1"
    env.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dbs", [["data"], ["data", "records"]])
def test_a_build_killed_just_after_creating_its_databases_resumes(tmp_path, dbs):
    """Killed after LMDB created some of packer's named databases, before anything was written
    into them: the rerun takes the staging env (it was refused, about 1 kill in 3 of
    tests/packer/jobs/test_build.py's kill-at-data.mdb test). The same names holding data are
    refused."""
    import lmdb

    from packer.sample import make_dataset
    images, _ = make_dataset(tmp_path / "d", 6, kind="classes", seed=2)
    for name, filled in (("out", False), ("other", True)):
        env = lmdb.open(str(tmp_path / f"{name}.lmdb.partial"), map_size=1 << 20, max_dbs=8)
        for db in dbs:
            handle = env.open_db(db.encode())
            if filled:
                with env.begin(write=True, db=handle) as txn:
                    txn.put(b"thesis", b"chapter 1")
        env.close()
    rep = pk.build(images, None, str(tmp_path / "out.lmdb"), "lmdb", workers=1)
    assert rep.published and rep.records == 6 and pk.verify(str(tmp_path / "out.lmdb"), deep=True).ok
    with pytest.raises(UsageError, match="not a packer partial build"):
        pk.build(images, None, str(tmp_path / "other.lmdb"), "lmdb", workers=1)
