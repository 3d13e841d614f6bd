"""LMDB-specific behaviour: map growth, damage detection, zero-copy reads."""
from __future__ import annotations

import contextlib
import struct

import lmdb
import pytest

import packer
from packer.core.errors import RecordError
from packer.stores import open_store
from readers import StoreDataset


def test_map_grows_instead_of_map_full(boxes_dataset, tmp_path):
    out = tmp_path / "s.lmdb"
    rep = packer.build(*boxes_dataset, out, workers=1, store_options={"map_size": 1 << 16},
                    commit_bytes=1 << 30)
    assert rep.ok and rep.records == 24
    assert packer.verify(out, deep=True).ok


def test_a_build_starts_over_an_empty_staging_folder(boxes_dataset, tmp_path):
    """A kill between the staging folder's mkdir and LMDB's first write leaves ``<out>.partial/``
    empty (the full suite's SIGKILL test once hit that moment): the rerun builds there, as over
    no staging area, instead of failing on the missing data.mdb."""
    out = tmp_path / "s.lmdb"
    (tmp_path / "s.lmdb.partial").mkdir()
    rep = packer.build(*boxes_dataset, out, workers=1)
    assert rep.ok and rep.records == 24 and packer.verify(out).ok
    assert not (tmp_path / "s.lmdb.partial").exists()


@contextlib.contextmanager
def _tamper(out):
    """A write transaction on a published store and its named databases, to damage it."""
    env = lmdb.open(str(out), max_dbs=8)
    # Opened before the write txn: open_db inside one deadlocks py-lmdb.
    dbs = {name: env.open_db(name.encode()) for name in ("data", "records")}
    try:
        with env.begin(write=True) as txn:
            yield txn, dbs
    finally:
        env.close()


def _ik(index: int) -> bytes:
    return struct.pack(">Q", index)


def _corrupt(out, index: int, data: bytes):
    with _tamper(out) as (txn, dbs):
        txn.put(_ik(index), data, db=dbs["data"])


def test_verify_lists_every_damaged_record(boxes_dataset, tmp_path):
    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    with open_store(out) as r:
        keys = [r.get(i).key for i in (3, 17)]
        good = bytes(r.get(3).data)
    _corrupt(out, 3, good[:-100])
    with _tamper(out) as (txn, dbs):
        txn.delete(_ik(17), db=dbs["data"])
    rep = packer.verify(out)
    bad = {(p.key, p.index) for p in rep.problems if p.key}
    assert bad == {(keys[0], 3), (keys[1], 17)}
    reasons = " ".join(p.reason for p in rep.problems)
    assert "checksum mismatch" in reasons and "image bytes are missing" in reasons


def test_deep_verify_decodes_what_checksums_cannot_catch(boxes_dataset, tmp_path):
    """Bytes replaced together with their record checksum: the index checksum still notices,
    and --deep names the record whose JPEG no longer decodes."""
    import dataclasses

    from packer.core.records import checksum

    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    with open_store(out) as r:
        rec = r.get(9)
    forged_bytes = bytes(rec.data)[: len(rec.data) // 2]
    forged = dataclasses.replace(rec, data=forged_bytes, checksum=checksum(forged_bytes))
    with _tamper(out) as (txn, dbs):  # bytes, checksum and record checksum all consistent
        txn.put(_ik(9), forged_bytes, db=dbs["data"])
        txn.put(_ik(9), forged.meta_to_json(), db=dbs["records"])
    shallow = packer.verify(out)
    assert [p.key for p in shallow.problems] == [None]
    assert "index checksum mismatch" in shallow.problems[0].reason
    deep = packer.verify(out, deep=True)
    assert [(p.key, p.index) for p in deep.problems if p.key] == [(rec.key, 9)]
    assert "does not decode cleanly" in str(deep.problems[0])


def test_dataset_raises_with_key_or_skips_and_counts(boxes_dataset, tmp_path):
    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    with open_store(out) as r:
        key, data = r.get(4).key, bytes(r.get(4).data)
    _corrupt(out, 4, data[:200])
    ds = StoreDataset(out)
    with pytest.raises(RecordError, match=f"{out}: key '{key}' \\(index 4\\): checksum mismatch"):
        ds[4]
    unchecked = StoreDataset(out, check=False)
    with pytest.raises(RecordError, match="JPEG does not decode"):
        unchecked[4]
    skipping = StoreDataset(out, on_error="skip")
    assert skipping[4] is None
    batch = skipping.__getitems__([3, 4, 5])
    assert len(batch) == 2 and skipping.skipped == 2


def test_one_store_open_many_times_in_one_process(boxes_dataset, tmp_path):
    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    a, b = StoreDataset(out), StoreDataset(out, layout="HWC")
    assert a[0][0].permute(1, 2, 0).equal(b[0][0])
    with open_store(out) as r:
        assert r.get(1).key == a.reader.get(1).key
    a.close()
    assert b[1][0].shape[2] == 3  # b's shared handle survives a's close
    # A rebuilt store at the same path is a new file: readers opened afterwards see it.
    packer.build(*boxes_dataset, out, workers=1, overwrite=True, no_labels=True)
    with open_store(out) as r:
        assert r.metadata.label_schema == "none"
    b.close()


def test_a_store_deleted_under_an_open_reader_does_not_block_the_next_file_opened(boxes_dataset, tmp_path):
    """A store folder deleted while one of its readers is open frees its ``lock.mdb`` inode (a
    lock-free reader never opens that file), and ext4 gives it to the next file made: a shard
    downloaded into a cache. py-lmdb keyed the open reader on that inode too and refused the new
    store ("already open in this process"; CI hit it when a cache re-downloaded a shard)."""
    import os
    import shutil

    src = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, src, workers=1)
    keep = tmp_path / "data.mdb"
    shutil.copy(src / "data.mdb", keep)
    lock_inode = os.stat(src / "lock.mdb").st_ino
    folders = [tmp_path / f"n{i}.lmdb" for i in range(64)]
    for f in folders:
        f.mkdir()
    with open_store(src) as old:
        shutil.rmtree(src)
        for new in folders:                      # the next files made, until one takes that inode
            shutil.copy(keep, new / "data.mdb")
            if os.stat(new / "data.mdb").st_ino == lock_inode:
                break
        else:
            pytest.skip("this file system did not hand the freed inode to a new file")
        with open_store(new) as r:
            assert r.get(3).key == old.get(3).key


def test_zero_copy_batch_equals_single_reads(boxes_dataset, tmp_path):
    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    ds = StoreDataset(out, return_key=True)
    batch = ds.__getitems__([7, 2, 7])
    for (img, label, key), i in zip(batch, [7, 2, 7]):
        single = ds[i]
        assert key == single[2] and img.equal(single[0])


def test_skip_counts_an_unreadable_record_once(boxes_dataset, tmp_path):
    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    with _tamper(out) as (txn, dbs):
        txn.delete(_ik(6), db=dbs["data"])
    ds = StoreDataset(out, on_error="skip", return_key=True)
    batch = ds.__getitems__([5, 6, 7])
    assert [s[2] for s in batch] == [ds.reader.get(5).key, ds.reader.get(7).key]
    assert ds.skipped == 1
    with pytest.raises(RecordError, match="image bytes are missing"):
        StoreDataset(out).__getitems__([5, 6, 7])


def test_verify_catches_a_changed_label(boxes_dataset, tmp_path):
    import json

    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    with _tamper(out) as (txn, dbs):
        meta = json.loads(txn.get(_ik(0), db=dbs["records"]))
        meta["label"] = [[1, 0.5, 0.5, 0.5, 0.5]]
        txn.put(_ik(0), json.dumps(meta).encode(), db=dbs["records"])
    rep = packer.verify(out)
    assert [(p.key, p.index) for p in rep.problems] == [(meta["key"], 0)]
    assert "label or other record fields changed" in rep.problems[0].reason
    with pytest.raises(RecordError, match="label or record fields are damaged"):
        StoreDataset(out)[0]


def test_anything_at_the_output_path_blocks_the_build_up_front(boxes_dataset, tmp_path):
    from packer.core.errors import UsageError

    out = tmp_path / "s.lmdb"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists"):
        packer.build(*boxes_dataset, out, workers=1)
    assert (out / "notes.txt").read_text() == "mine"
    other = tmp_path / "file_out"
    other.write_text("x")
    # --overwrite replaces only a packer store, never a file of the user's (issue 25).
    with pytest.raises(UsageError, match="not a packer store"):
        packer.build(*boxes_dataset, other, workers=1, overwrite=True)
    assert other.read_text() == "x"
    other.write_text("")   # an empty file holds nothing to lose: replaced
    rep = packer.build(*boxes_dataset, other, workers=1, overwrite=True)
    assert rep.ok and (other / "data.mdb").exists() and not list(tmp_path.glob("file_out.old*"))
    with open_store(other) as r:
        with pytest.raises(IndexError):
            r.get(-1)


def _child_closes_inherited_reader(out, inherited, queue):
    mine = open_store(out)           # the child's own handle to the same files
    inherited.discard_after_fork()
    inherited.close()                # must not close the child's handle
    queue.put(mine.get(1).key)


def test_forked_child_closing_an_inherited_reader_keeps_its_own(boxes_dataset, tmp_path):
    import multiprocessing as mp

    out = tmp_path / "s.lmdb"
    packer.build(*boxes_dataset, out, workers=1)
    parent = open_store(out)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_closes_inherited_reader, args=(str(out), parent, q))
    p.start()
    key = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0 and key == parent.get(1).key
    parent.close()


@pytest.mark.timeout(60)
def test_a_store_that_vanishes_while_a_reader_opens_it_is_a_store_error(tmp_path, monkeypatch):
    """A publish replaces the store with two renames: a reader opening in between finds no
    data.mdb after its first check. That is a StoreError naming the store, never a bare
    FileNotFoundError (seen in the race test of tests/packer/stores/test_store_identity.py)."""
    import os

    import packer.stores.lmdb.reader as reader_mod
    from packer.core.errors import StoreError
    from packer.sample import make_dataset

    images, _ = make_dataset(tmp_path / "ds", 4, kind="class")
    loc = str(tmp_path / "s.lmdb")
    assert packer.build(images, None, loc, workers=1, executor="inline").published
    real = reader_mod.expected_data_size

    def vanishing(path):
        got = real(path)
        os.rename(loc, loc + ".away")   # the old store moves aside, the new one is not there yet
        return got

    monkeypatch.setattr(reader_mod, "expected_data_size", vanishing)
    with pytest.raises(StoreError, match="no LMDB store here") as exc:
        reader_mod.LMDBReader(loc)
    assert loc in str(exc.value) and isinstance(exc.value.__cause__, FileNotFoundError)
