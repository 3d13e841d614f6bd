"""HDF5-specific tests: layout and chunking, pixel mode, damaged chunks, resume, fork/spawn.

The generic guarantees (round trip, atomic publish, ...) are also covered for every backend by
tests/packer/stores/test_store_contract.py; these tests look inside the file.
"""
from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
cv2 = pytest.importorskip("cv2")

from packer.core.errors import DependencyError, RecordError, ResumeMismatchError, StoreError, UsageError  # noqa: E402
from packer.core.records import Record, StoreMetadata, checksum, index_checksum, labels_equal  # noqa: E402
from packer.stores import available_formats, detect_format, get_store, open_store  # noqa: E402
from packer.stores.hdf5 import HDF5Store, decode_resize  # noqa: E402
from tests import REPO, corpus  # noqa: E402

make_jpeg = corpus.jpeg_of_shape
make_records = corpus.make_records






def metadata_for(writer, count: int, schema: str = "class") -> StoreMetadata:
    return StoreMetadata(format="hdf5", count=count, label_schema=schema, class_names=["a", "b", "c", "d"],
                         build_options={}, index_checksum=index_checksum(writer.iter_index()))


def add_all(writer, state, records):
    """The build loop of packer.jobs.build, as base.py describes it."""
    for rec in records:
        assert rec.index == state.next_index
        writer.add(rec)
        state.next_index += 1
        state.next_input += 1
        writer.checkpoint(state)


def build(location, records, schema="class", fingerprint="fp", commit_bytes=8 << 10, overwrite=False, **options):
    with HDF5Store.create_writer(str(location), commit_bytes=commit_bytes, **options) as writer:
        state = writer.open(fingerprint, resume=True)
        add_all(writer, state, records[state.next_index:])
        writer.flush()
        writer.publish(metadata_for(writer, len(records), schema), overwrite=overwrite)
    return str(location)


def assert_same(got: Record, want: Record):
    for name in Record.META_FIELDS:
        if name == "label":
            assert labels_equal(got.label, want.label), (got.key, got.label, want.label)
        elif name == "meta_checksum":  # written by the store: covers every field of what was added
            assert got.meta_checksum == want.meta_digest() and got.meta_ok(), got.key
        else:
            assert getattr(got, name) == getattr(want, name), (got.key, name)
    assert bytes(got.data) == bytes(want.data)


@pytest.fixture
def records():
    return make_records()


@pytest.fixture
def store(tmp_path, records):
    return build(tmp_path / "store.h5", records)


# ---------------------------------------------------------------------------------------
# registry, options
# ---------------------------------------------------------------------------------------
def test_registered_and_claims_only_existing_hdf5(tmp_path, store):
    assert "hdf5" in available_formats()
    assert get_store("hdf5") is HDF5Store
    assert HDF5Store.claims(store) and detect_format(store) == "hdf5"
    assert not HDF5Store.claims(str(tmp_path / "new.h5"))          # not there yet
    (tmp_path / "text.h5").write_text("not hdf5")
    assert not HDF5Store.claims(str(tmp_path / "text.h5"))
    assert not HDF5Store.claims(str(tmp_path))                     # a folder


@pytest.mark.parametrize("options, words", [
    ({"bogus": 1}, ["bogus", "pixels", "compression"]),
    ({"pixels": "224by"}, ["pixels", "HxW"]),
    ({"pixels": "0x10"}, ["pixels"]),
    ({"compression": "lzf"}, ["compression", "pixel mode"]),
    ({"pixels": "8x8", "compression": "zstd"}, ["compression", "lzf", "gzip"]),
    ({"chunk_bytes": "12"}, ["chunk_bytes"]),
])
def test_bad_writer_options_are_usage_errors(tmp_path, options, words):
    with pytest.raises(UsageError) as exc:
        HDF5Store.create_writer(str(tmp_path / "s.h5"), **options)
    for word in words:
        assert word in str(exc.value)


def test_options_accept_strings_and_python_values(tmp_path):
    a = HDF5Store.create_writer(str(tmp_path / "a.h5"), pixels="24x32", compression="gzip:6", chunk_bytes="64K",
                                commit_bytes="4096")
    b = HDF5Store.create_writer(str(tmp_path / "b.h5"), pixels=(24, 32), compression="gzip:6", chunk_bytes=65536)
    assert a.pixels == b.pixels == (24, 32) and a.compression == "gzip" and a.compression_level == 6
    assert a.chunk_bytes == b.chunk_bytes == 65536 and a.commit_bytes == 4096
    assert HDF5Store.create_writer(str(tmp_path / "c.h5"), pixels="none").pixels is None
    with pytest.raises(UsageError, match="cache_bytes"):
        HDF5Store.open_reader(str(tmp_path / "c.h5"), cache=1)


def test_missing_h5py_is_a_dependency_error(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)       # "import h5py" now fails
    with pytest.raises(DependencyError, match=r"pip install h5py") as exc:
        HDF5Store.open_reader(store)
    assert isinstance(exc.value.__cause__, ImportError)
    assert HDF5Store.claims(store)                        # detection needs no h5py


# ---------------------------------------------------------------------------------------
# round trip and layout
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("schema", ["class", "boxes", "none"])
def test_round_trip_field_for_field(tmp_path, schema):
    recs = make_records(11, schema)
    loc = build(tmp_path / "s.h5", recs, schema=schema)
    with open_store(loc) as reader:
        assert len(reader) == 11 and reader.encoding == "jpeg" and reader.raw_shape is None
        for rec in recs:
            assert_same(reader.get(rec.index), rec)
            assert reader.get(rec.index).data_ok()
            assert reader.index_of(rec.key) == rec.index
        order = [7, 3, 4, 5, 10, 0, 4]
        for got, i in zip(reader.get_many(order), order):
            assert_same(got, recs[i])
        assert reader.get_many([]) == []
        assert reader.check_structure() == []
        assert reader.size_bytes() == os.path.getsize(loc)
        with pytest.raises(IndexError):
            reader.get(11)
        with pytest.raises(KeyError):
            reader.index_of("nope.jpg")


def test_layout_chunks_and_attributes(tmp_path, records):
    loc = build(tmp_path / "s.h5", records, chunk_bytes="4K")
    with h5py.File(loc, "r") as f:
        assert set(f) == {"jpeg_bytes", "jpeg_offsets", "keys", "checksums", "record_meta",
                          "record_meta_offsets", "class_ids"}
        data = f["jpeg_bytes"]
        assert data.chunks == (4096,) and data.fletcher32 and data.maxshape == (None,)
        offs = f["jpeg_offsets"][:]
        assert offs.shape == (13,) and offs[0] == 0 and offs[-1] == data.shape[0]
        assert bytes(data[offs[2]:offs[3]]) == records[2].data
        for name in ("keys", "checksums", "record_meta", "record_meta_offsets", "class_ids", "jpeg_offsets"):
            assert f[name].chunks is not None and "description" in f[name].attrs
        assert f["record_meta"].fletcher32
        mo = f["record_meta_offsets"][:]
        meta = json.loads(bytes(f["record_meta"][mo[4]:mo[5]]))
        assert meta["key"] == records[4].key and meta["notes"] == records[4].notes and "label" not in meta
        assert list(f["keys"].asstr()[:3]) == [r.key for r in records[:3]]
        assert f["class_ids"][:].tolist() == [r.label for r in records]
        assert json.loads(f.attrs["packer_metadata"])["count"] == 12
        assert f.attrs["packer_layout"] == "jpeg"
        assert "_resume_state" not in f


def test_get_many_reads_each_contiguous_run_once(store, monkeypatch):
    reader = open_store(store)
    runs = []
    real = type(reader)._data

    def spy(self, s, e):
        runs.append((s, e))
        return real(self, s, e)

    monkeypatch.setattr(type(reader), "_data", spy)
    got = reader.get_many([9, 2, 3, 4, 8, 3, 11])
    assert [r.index for r in got] == [9, 2, 3, 4, 8, 3, 11]
    assert runs == [(2, 5), (8, 10), (11, 12)]


@pytest.mark.skipif(shutil.which("h5ls") is None, reason="h5ls not installed (apt-get install hdf5-tools)")
def test_standard_tools_show_the_layout(store):
    out = subprocess.run(["h5ls", "-r", store], capture_output=True, text=True, check=True).stdout
    for name in ("/jpeg_bytes", "/jpeg_offsets", "/keys", "/checksums", "/class_ids", "/record_meta",
                 "/record_meta_offsets"):
        assert name in out
    keys = subprocess.run(["h5dump", "-d", "keys", "-c", "2", store], capture_output=True, text=True,
                          check=True).stdout
    assert '"cls0/img_000.jpg", "cls1/img_001.jpg"' in keys


# ---------------------------------------------------------------------------------------
# pixel mode
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "lzf", "gzip"])
def test_pixel_mode(tmp_path, records, compression):
    size = (48, 40)  # smaller than some inputs (INTER_AREA), larger than others (INTER_LINEAR)
    opts = {"pixels": "48x40"} if compression is None else {"pixels": "48x40", "compression": compression}
    loc = build(tmp_path / "p.h5", records, **opts)
    with h5py.File(loc, "r") as f:
        d = f["pixels"]
        assert d.shape == (12, 48, 40, 3) and d.chunks == (1, 48, 40, 3) and d.fletcher32
        assert d.compression == compression
        assert "jpeg_bytes" not in f and f.attrs["packer_layout"] == "pixels"
    with open_store(loc) as reader:
        assert reader.encoding == "raw" and reader.raw_shape == (48, 40, 3)
        for rec, got in zip(records, reader.get_many(range(12))):
            img = cv2.cvtColor(cv2.imdecode(np.frombuffer(rec.data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            shrink = rec.height >= 48 and rec.width >= 40
            want = cv2.resize(img, (40, 48), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
            assert np.array_equal(np.frombuffer(got.data, np.uint8).reshape(48, 40, 3), want), rec.key
            assert got.data_ok() and got.checksum == checksum(want.tobytes())
            assert (got.width, got.height, got.channels) == (40, 48, 3)
            assert got.source_checksum == rec.source_checksum and got.source_size == rec.source_size
            assert got.key == rec.key and got.label == rec.label and got.notes == rec.notes
        assert reader.check_structure() == []
    assert decode_resize(records[1].data, size).shape == (48, 40, 3)   # grey input -> 3 channels


def test_pixel_mode_applies_recorded_orientation(tmp_path, records):
    rec = records[2]                       # 75x100, landscape
    rec.orientation = 6                    # "rotate 90 clockwise when reading"
    loc = build(tmp_path / "o.h5", records[:3], pixels="50x40")
    got = open_store(loc).get(2)
    img = cv2.cvtColor(cv2.imdecode(np.frombuffer(rec.data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    want = cv2.resize(cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE), (40, 50), interpolation=cv2.INTER_AREA)
    assert np.array_equal(np.frombuffer(got.data, np.uint8).reshape(50, 40, 3), want)
    assert got.orientation == 1 and "exif-orientation 6 applied" in got.converted


def test_lzf_and_gzip_shrink_pixels(tmp_path, records):
    sizes = {c: os.path.getsize(build(tmp_path / f"{c}.h5", records, pixels="96x96",
                                      **({} if c == "none" else {"compression": c})))
             for c in ("none", "lzf", "gzip")}
    assert sizes["gzip"] < sizes["none"] and sizes["lzf"] < sizes["none"], sizes


# ---------------------------------------------------------------------------------------
# damage
# ---------------------------------------------------------------------------------------
def flip_bytes(path, offset, n=8):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        raw = bytearray(fh.read(n))
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in raw))


def test_corrupted_chunk_is_a_record_error_and_verify_finds_it(tmp_path, records):
    loc = build(tmp_path / "s.h5", records, chunk_bytes="4K")
    with h5py.File(loc, "r") as f:
        offs = f["jpeg_offsets"][:]
        victim = 6
        info = f["jpeg_bytes"].id.get_chunk_info_by_coord((int(offs[victim]) // 4096 * 4096,))
        chunk_lo = int(offs[victim]) // 4096 * 4096
        hit = [i for i in range(12) if offs[i] < chunk_lo + 4096 and offs[i + 1] > chunk_lo]
        clean = [i for i in range(12) if i not in hit]
    flip_bytes(loc, info.byte_offset + (int(offs[victim]) - chunk_lo) + 5)
    reader = open_store(loc)
    with pytest.raises(RecordError) as exc:
        reader.get(victim)
    assert exc.value.key == records[victim].key and exc.value.index == victim
    assert loc in str(exc.value) and "damaged chunk" in exc.value.reason
    with pytest.raises(RecordError) as exc:
        reader.get_many([0, 1, victim, 11])
    assert exc.value.key in {records[i].key for i in hit}
    for i in clean:
        assert_same(reader.get(i), records[i])
    import packer
    report = packer.verify(loc)
    assert not report.ok
    assert {p.key for p in report.problems if p.key} == {records[i].key for i in hit}


def test_corrupted_pixel_chunk(tmp_path, records):
    loc = build(tmp_path / "p.h5", records, pixels="32x32", compression="gzip")
    with h5py.File(loc, "r") as f:
        info = f["pixels"].id.get_chunk_info_by_coord((3, 0, 0, 0))
    flip_bytes(loc, info.byte_offset + info.size // 2)
    reader = open_store(loc)
    with pytest.raises(RecordError) as exc:
        reader.get(3)
    assert exc.value.key == records[3].key
    assert reader.get(4).key == records[4].key


def test_changed_bytes_without_chunk_damage_fail_the_checksum(tmp_path, records):
    """Bytes rewritten through HDF5 (Fletcher32 recomputed) still fail the record checksum."""
    loc = build(tmp_path / "s.h5", records)
    with h5py.File(loc, "r+") as f:
        o = int(f["jpeg_offsets"][4])
        f["jpeg_bytes"][o + 10] ^= 0x55
    rec = open_store(loc).get(4)
    assert not rec.data_ok()


def test_structure_problems_are_reported(tmp_path, records):
    loc = build(tmp_path / "s.h5", records)
    with h5py.File(loc, "r+") as f:
        f["jpeg_offsets"][5] = f["jpeg_offsets"][7] + 1
        f["checksums"].resize((10,))
    problems = open_store(loc).check_structure()
    assert any("'jpeg_offsets' decreases" in p for p in problems)
    assert any("'checksums' holds 10 entries, expected 12" in p for p in problems)
    loc = build(tmp_path / "t.h5", records)
    with h5py.File(loc, "r+") as f:
        f["keys"][3] = "renamed.jpg"
        f["checksums"][7] = b"0" * 32
    problems = open_store(loc).check_structure()
    assert len(problems) == 2 and "record 3:" in problems[0] and "'renamed.jpg'" in problems[0]
    assert "record 7:" in problems[1]


# ---------------------------------------------------------------------------------------
# staging, publish, resume
# ---------------------------------------------------------------------------------------
def test_nothing_visible_until_publish_and_incomplete_file_refused(tmp_path, records):
    loc = str(tmp_path / "s.h5")
    with pytest.raises(RuntimeError, match="boom"):
        with HDF5Store.create_writer(loc, commit_bytes=4096) as writer:
            state = writer.open("fp")
            add_all(writer, state, records[:5])
            raise RuntimeError("boom")
    assert not os.path.exists(loc) and os.path.exists(loc + ".partial")
    with pytest.raises(StoreError, match="no HDF5 store here.*interrupted"):
        open_store(loc, format="hdf5")
    with pytest.raises(StoreError, match="incomplete store"):
        HDF5Store.open_reader(loc + ".partial")


def test_publish_refuses_existing_store_unless_overwrite(tmp_path, records):
    loc = build(tmp_path / "s.h5", records[:4])
    assert HDF5Store.exists(loc)
    with pytest.raises(UsageError, match="exists"):
        build(loc, records[:6], fingerprint="fp2")
    assert len(open_store(loc)) == 4 and os.path.exists(loc + ".partial")
    build(loc, records[:6], fingerprint="fp2", overwrite=True)
    assert len(open_store(loc)) == 6 and not os.path.exists(loc + ".partial")


def test_resume_discards_records_written_after_the_last_state(tmp_path, records):
    loc = str(tmp_path / "s.h5")
    writer = HDF5Store.create_writer(loc, commit_bytes=1 << 30)
    state = writer.open("fp")
    for batch in (records[0:4], records[4:7]):
        add_all(writer, state, batch)
        writer.flush()                       # two committed batches: data, then state
    writer._append(records[7:10])            # a third batch's data, its state never written
    writer._file.flush()
    writer.abort()                           # "crash": close without publishing

    writer = HDF5Store.create_writer(loc, commit_bytes=1 << 30)
    state = writer.open("fp")
    assert (state.next_index, state.next_input) == (7, 7)
    f = writer._file
    assert f["keys"].shape == (7,) and f["jpeg_offsets"].shape == (8,) and f["class_ids"].shape == (7,)
    assert f["jpeg_bytes"].shape == (int(f["jpeg_offsets"][7]),)
    add_all(writer, state, records[7:])
    writer.flush()
    writer.publish(metadata_for(writer, 12))
    writer._close()
    ref = build(tmp_path / "ref.h5", records)
    with open_store(loc) as a, open_store(ref) as b:
        assert a.metadata.index_checksum == b.metadata.index_checksum
        for i, rec in enumerate(records):
            assert_same(a.get(i), rec)


def test_resume_with_other_fingerprint_or_layout(tmp_path, records):
    loc = str(tmp_path / "s.h5")
    with HDF5Store.create_writer(loc, commit_bytes=4096) as writer:
        add_all(writer, writer.open("fp"), records[:6])
        writer.flush()
    with pytest.raises(ResumeMismatchError, match=r"s\.h5\.partial.*--no-resume"):
        HDF5Store.create_writer(loc).open("other", resume=True)
    with pytest.raises(ResumeMismatchError, match="pixels"):
        HDF5Store.create_writer(loc, pixels="16x16").open("fp", resume=True)
    with HDF5Store.create_writer(loc) as writer:
        assert writer.open("fp", resume=True).next_index == 6
    with HDF5Store.create_writer(loc) as writer:
        state = writer.open("other", resume=False)
        assert state.next_index == 0 and writer._file["keys"].shape == (0,)


def test_unreadable_partial_starts_fresh_with_a_warning(tmp_path, records, caplog):
    loc = str(tmp_path / "s.h5")
    with open(loc + ".partial", "wb") as fh:
        fh.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)     # what a kill mid-flush can leave
    with caplog.at_level(logging.WARNING, logger="packer.stores.hdf5"):
        build(loc, records)
    assert any("s.h5.partial" in r.getMessage() and "scratch" in r.getMessage() for r in caplog.records)
    assert len(open_store(loc)) == 12


def _interrupted(loc, records, n, *, killed):
    """A partial build with ``n`` committed records; ``killed`` drops the clean-close mark."""
    with HDF5Store.create_writer(loc, commit_bytes=1) as writer:
        add_all(writer, writer.open("fp"), records[:n])
    if killed:
        with h5py.File(loc + ".partial", "r+") as f:
            del f.attrs["_closed_cleanly"]


def test_killed_partial_is_checked_and_copied(tmp_path, records, caplog):
    loc = str(tmp_path / "s.h5")
    _interrupted(loc, records, 7, killed=True)
    with caplog.at_level(logging.WARNING, logger="packer.stores.hdf5"):
        build(loc, records)
    assert "checking the 7 committed records" in caplog.text and "scratch" not in caplog.text
    ref = build(tmp_path / "ref.h5", records)
    with open_store(loc) as a, open_store(ref) as b:
        assert a.metadata.index_checksum == b.metadata.index_checksum
        for i in range(12):
            assert_same(a.get(i), b.get(i))
    with h5py.File(loc, "r") as f:
        assert "_closed_cleanly" not in f.attrs and "_resume_state" not in f


def test_killed_partial_with_a_damaged_record_starts_fresh(tmp_path, records, caplog):
    loc = str(tmp_path / "s.h5")
    _interrupted(loc, records, 7, killed=True)
    with h5py.File(loc + ".partial", "r+") as f:   # a torn write the chunk checksum cannot see
        f["jpeg_bytes"][int(f["jpeg_offsets"][6]) + 20] ^= 0x01
    with caplog.at_level(logging.WARNING, logger="packer.stores.hdf5"):
        with HDF5Store.create_writer(loc) as writer:
            assert writer.open("fp").next_index == 0
    assert "record 6" in caplog.text and "from scratch" in caplog.text


def test_cleanly_closed_partial_is_resumed_in_place(tmp_path, records, caplog):
    loc = str(tmp_path / "s.h5")
    _interrupted(loc, records, 7, killed=False)
    with caplog.at_level(logging.WARNING, logger="packer.stores.hdf5"):
        with HDF5Store.create_writer(loc) as writer:
            assert writer.open("fp").next_index == 7
            assert "_closed_cleanly" not in writer._file.attrs   # a kill from here on is detectable
    assert caplog.text == ""


def test_long_rejects_list_survives_in_the_resume_state(tmp_path, records):
    loc = str(tmp_path / "s.h5")
    rejects = [{"path": f"bad/{i:06d}_{'x' * 80}.jpg", "reason": "truncated"} for i in range(2000)]
    with HDF5Store.create_writer(loc) as writer:
        state = writer.open("fp")
        state.rejects = rejects
        add_all(writer, state, records[:3])
        writer.flush()
    with HDF5Store.create_writer(loc) as writer:
        assert writer.open("fp").rejects == rejects


KILL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}]
    from tests.packer.stores.test_hdf5_store import build, make_records
    build({loc!r}, make_records(), commit_bytes=1)
""")


def test_killed_build_resumes_to_the_same_store(tmp_path, records, caplog):
    """SIGKILL right after the 5th commit (base.py's fault hook), then resume in this process."""
    loc = str(tmp_path / "s.h5")
    script = KILL_SCRIPT.format(repo=str(REPO), loc=loc)
    env = dict(os.environ, PACKER_FAULT_KILL_AFTER_COMMITS="5")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert not os.path.exists(loc) and os.path.exists(loc + ".partial")
    with caplog.at_level(logging.WARNING, logger="packer.stores.hdf5"):
        with HDF5Store.create_writer(loc) as writer:
            assert writer.open("fp").next_index == 5
    assert "not closed cleanly" in caplog.text           # checked and copied, not trusted
    build(loc, records)
    ref = build(tmp_path / "ref.h5", records)
    with open_store(loc) as a, open_store(ref) as b:
        assert a.metadata.index_checksum == b.metadata.index_checksum
        assert [bytes(r.data) for r in a.get_many(range(12))] == [bytes(r.data) for r in b.get_many(range(12))]


# ---------------------------------------------------------------------------------------
# processes, locking
# ---------------------------------------------------------------------------------------
class StoreDataset:
    """Minimal map-style dataset over a reader made in the parent (the risky way round)."""

    def __init__(self, reader):
        self.reader = reader

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        rec = self.reader.get(i)
        return i, os.getpid(), rec.checksum, checksum(rec.data)


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_read_correctly(store, records, method):
    torch_data = pytest.importorskip("torch.utils.data")
    reader = open_store(store)
    reader.get(0)                      # the parent holds an open handle when workers start
    loader = torch_data.DataLoader(StoreDataset(reader), batch_size=3, num_workers=2,
                                   multiprocessing_context=method, collate_fn=list)
    items = [item for batch in loader for item in batch]
    assert [i for i, *_ in items] == list(range(12))
    assert all(stored == actual == records[i].checksum for i, _, stored, actual in items)
    assert {pid for _, pid, *_ in items} - {os.getpid()}
    assert reader.get(5).checksum == records[5].checksum        # parent handle still good


def _child_read(reader, q):
    q.put([reader.get(i).checksum for i in range(len(reader))])


def test_plain_fork_reopens_in_the_child(store, records):
    reader = open_store(store)
    reader.get(1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(reader, q))
    p.start()
    got = q.get(timeout=30)
    p.join(30)
    assert p.exitcode == 0 and got == [r.checksum for r in records]


def test_reads_while_another_process_holds_a_file_lock(store, records):
    """Readers open without HDF5 file locking (NFS, writers holding locks) with no env var set."""
    if "HDF5_USE_FILE_LOCKING" in os.environ:
        pytest.skip("HDF5_USE_FILE_LOCKING is set in the environment")
    fd = os.open(store, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OSError):
            h5py.File(store, "r", locking=True)            # what a default open would hit
        assert open_store(store).get(3).checksum == records[3].checksum
    finally:
        os.close(fd)
    assert "HDF5_USE_FILE_LOCKING" not in os.environ


def test_store_dataset_reads_pixel_mode_in_workers(tmp_path, records):
    """readers.StoreDataset over a pixel-mode store: no decode, batches via get_many."""
    torch_data = pytest.importorskip("torch.utils.data")
    readers = pytest.importorskip("readers.dataset")
    loc = build(tmp_path / "p.h5", records, pixels="24x20")
    with open_store(loc) as reader:
        want = {r.key: np.frombuffer(r.data, np.uint8).reshape(24, 20, 3) for r in reader.get_many(range(12))}
    ds = readers.StoreDataset(loc, layout="HWC", return_key=True)
    ds[0]                                   # a handle in the parent before the fork
    loader = torch_data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                                   collate_fn=readers.collate_list)
    got = {key: img.numpy() for batch in loader for img, _, key in batch}
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in want)
    ds.close()


def test_old_hdf5_without_locking_argument_falls_back_to_the_env_var(store, records, monkeypatch):
    real_file = h5py.File

    def old_file(*args, **kw):
        if "locking" in kw:
            raise ValueError("HDF5 version >= 1.12.1 or 1.10.x >= 1.10.7 required for file locking options.")
        return real_file(*args, **kw)

    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "x")    # so that teardown restores "unset"
    monkeypatch.delenv("HDF5_USE_FILE_LOCKING")
    monkeypatch.setattr(h5py, "File", old_file)
    assert open_store(store).get(2).checksum == records[2].checksum
    assert os.environ["HDF5_USE_FILE_LOCKING"] == "FALSE"
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "TRUE")  # a user's choice is left alone
    open_store(store).get(2)
    assert os.environ["HDF5_USE_FILE_LOCKING"] == "TRUE"
