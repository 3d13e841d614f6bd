"""``packer build s3://bucket/images/ [LABELS] -o OUT`` against the S3 test server (moto on loopback):
the store equals a local build of the same tree, hostile listings get the local refusals, resume
after a SIGKILL, a Dask build from the bucket, and faults (throttling, a replaced or missing
object, a dead server) within the time budget, credentials never printed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packer
from packer.core import remote
from packer.core.errors import SourceError, UsageError
from packer.core.records import label_to_json
from packer.jobs.inputs import gather_sources
from packer.jobs.options import BuildOptions
from packer.jobs.pack import pack
from packer.jobs.steps import fingerprint
from packer.sample import make_dataset
from packer.stores import open_store
from tests import REPO, corpus


def cli_env() -> dict:
    """The environment for a CLI run from another folder: it imports this checkout (not whatever
    packer is installed), with the variables a test has set."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path)

pytestmark = pytest.mark.s3


def _upload(bucket, root: Path, prefix: str) -> None:
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            bucket.put(prefix + p.relative_to(root).as_posix(), p.read_bytes())


def _records(store, **options) -> list:
    with open_store(str(store), **options) as r:
        recs = r.get_many(range(r.metadata.count))
        return [(x.key, bytes(x.data), json.dumps(label_to_json(x.label)), x.checksum,
                 x.source_checksum) for x in recs]


def _same_store(a, b) -> None:
    with open_store(a) as ra, open_store(b) as rb:
        ma, mb = ra.metadata, rb.metadata
        assert ma.index_checksum == mb.index_checksum and ma.count == mb.count
        assert ma.class_names == mb.class_names and ma.label_schema == mb.label_schema
        assert ma.label_info == mb.label_info
        assert {k: v for k, v in ma.build_options.items() if k not in ("images", "labels")} == \
            {k: v for k, v in mb.build_options.items() if k not in ("images", "labels")}
    assert _records(a) == _records(b)


@pytest.mark.parametrize("kind", ["class", "boxes"])
def test_bucket_build_equals_local_build(s3, tmp_path, kind):
    images, labels = make_dataset(tmp_path / "d", 24, kind=kind, seed=3)
    _upload(s3, images, "images/")
    if labels is not None:
        _upload(s3, labels, "labels/") if Path(labels).is_dir() else s3.put("labels.csv", Path(labels).read_bytes())
    remote_labels = None if labels is None else (s3.url("labels/") if Path(labels).is_dir() else s3.url("labels.csv"))
    local = packer.build(images, labels, tmp_path / "local.lmdb", workers=1)
    rem = packer.build(s3.url("images/"), remote_labels, tmp_path / "remote.lmdb", workers=2)
    assert rem.published and rem.records == local.records == 24
    _same_store(tmp_path / "local.lmdb", tmp_path / "remote.lmdb")
    with open_store(tmp_path / "remote.lmdb") as r:
        assert r.metadata.build_options["images"] == s3.url("images")
    assert packer.verify(tmp_path / "remote.lmdb", deep=True).ok


def test_hostile_listing_gets_the_local_refusals(s3, tmp_path):
    """What a local tree can hold gets the local build's verdicts; keys no local tree can hold
    (``..``, ``.``, empty parts, a leading /) are refused by name; folder markers are no objects."""
    tree = {"cat/a.jpg": corpus.good_jpeg(1), "cat/ü é#%?.jpg": corpus.good_jpeg(2),
            "cat/empty.jpg": b"", "cat/EMPTYNOEXT": b"", "cat/LICENSE": b"MIT License\n",
            "cat/notes.txt": b"x", "cat/.hidden.jpg": corpus.good_jpeg(3), ".git/x.jpg": corpus.good_jpeg(4),
            "dog/bomb.jpg": corpus.bomb_jpeg(), "dog/b.jpg": corpus.good_jpeg(5), "dog/noext": corpus.good_jpeg(6)}
    local_root = tmp_path / "in"
    for rel, data in tree.items():
        (local_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (local_root / rel).write_bytes(data)
    _upload(s3, local_root, "images/")
    hostile = ["images/cat/../../escape.jpg", "images/cat/./dot.jpg", "images/cat//double.jpg",
               "images//abs.jpg"]
    for key in hostile:
        s3.put(key, corpus.good_jpeg(7))
    s3.put("images/dog/", b"")            # folder markers, as consoles create them
    s3.put("images/", b"")
    local = packer.build(local_root, None, tmp_path / "l.lmdb", workers=1, on_corrupt="skip")
    rem = packer.build(s3.url("images/"), None, tmp_path / "r.lmdb", workers=1, on_corrupt="skip")
    assert local.ignored == rem.ignored and local.ignored_reasons == rem.ignored_reasons
    by = {r["path"]: r for r in rem.rejected}
    for r in local.rejected:
        assert by.pop(r["path"])["reason"] == r["reason"]
    assert sorted(by) == sorted(k[len("images/"):] for k in hostile)
    assert all(r["kind"] == "refused" and "cannot be a record key" in r["reason"] for r in by.values())
    _same_store(tmp_path / "l.lmdb", tmp_path / "r.lmdb")
    # Under the default policy the refused keys stop the build, as unreadable files do.
    rep = packer.build(s3.url("images/"), None, tmp_path / "r2.lmdb", workers=1)
    assert not rep.published


def test_replaced_and_deleted_objects_are_named_problems(s3, tmp_path):
    images, _ = make_dataset(tmp_path / "d", 8, kind="class", seed=1)
    _upload(s3, images, "images/")
    opts = BuildOptions(workers=1, on_corrupt="skip")
    sources = gather_sources(s3.url("images/"), None, opts)
    s3.put("images/" + sources.keys[2], corpus.good_jpeg(99))          # replaced after the listing
    s3.client().delete_object(Bucket=s3.bucket, Key="images/" + sources.keys[5])
    rep = pack(s3.url("images/"), None, str(tmp_path / "o.lmdb"), "lmdb", opts, prepared=(sources, None))
    assert rep.published and rep.records == 6
    why = {r["path"]: r["reason"] for r in rep.rejected}
    assert set(why) == {sources.keys[2], sources.keys[5]}
    assert "changed since it was opened" in why[sources.keys[2]] and s3.url("images/" + sources.keys[2]) in \
        why[sources.keys[2]]
    assert "no such object" in why[sources.keys[5]]


def test_resume_fingerprint_is_key_size_etag(s3, tmp_path):
    images, _ = make_dataset(tmp_path / "d", 6, kind="class", seed=2)
    _upload(s3, images, "images/")
    opts = BuildOptions()
    a = gather_sources(s3.url("images/"), None, opts)
    items = list(a.fingerprint_items())
    assert [(k, s) for k, s, _ in items] == [(k, len(s3.get("images/" + k))) for k in a.keys]
    assert all(v == remote.stat(s3.url("images/" + k)).version for k, _, v in items)
    s3.put("images/" + a.keys[0], corpus.good_jpeg(50))   # same key, new bytes: a new build
    b = gather_sources(s3.url("images/"), None, opts)
    assert fingerprint("lmdb", a, {}) != fingerprint("lmdb", b, {})
    assert fingerprint("lmdb", b, {}) == fingerprint("lmdb", gather_sources(s3.url("images/"), None, opts), {})


def test_cli_build_from_bucket_killed_resumes(s3, tmp_path):
    """A real SIGKILL of the CLI mid-build, then the same command: it resumes and the store
    equals a local build's."""
    images, labels = make_dataset(tmp_path / "d", 60, kind="boxes", seed=5)
    _upload(s3, images, "images/")
    _upload(s3, labels, "labels/")
    ref, out = tmp_path / "ref.lmdb", tmp_path / "out.lmdb"
    packer.build(images, labels, ref, workers=1)
    cmd = [sys.executable, "-m", "packer.cli", "build", s3.url("images/"), s3.url("labels/"), "-o", str(out),
           "-j", "1", "-q", "--commit-mb", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while not (tmp_path / "out.lmdb.partial" / "data.mdb").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    result = subprocess.run(cmd, capture_output=True, timeout=180)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    _same_store(ref, out)
    report = json.loads((tmp_path / "out.lmdb.report.json").read_text())
    assert report["published"] and report["inputs"] == 60


def test_remote_labels_problems_name_objects(s3, tmp_path):
    images, labels = make_dataset(tmp_path / "d", 6, kind="boxes", seed=4)
    _upload(s3, images, "images/")
    _upload(s3, labels, "labels/")
    first = sorted(p.relative_to(labels).as_posix() for p in Path(labels).rglob("*.txt"))[0]
    s3.client().delete_object(Bucket=s3.bucket, Key="labels/" + first)
    with pytest.raises(SourceError) as err:
        packer.build(s3.url("images/"), s3.url("labels/"), tmp_path / "o.lmdb", workers=1)
    text = "\n".join(err.value.problems)
    stem = first.rsplit(".", 1)[0]
    assert s3.url("images/" + stem) in text and s3.url("labels") in text and "/tmp" not in text
    # A label object over the per-file limit is refused before it is downloaded.
    from packer.labels.limits import MAX_PER_IMAGE_BYTES
    s3.put("labels/" + first, b"0 0.5 0.5 0.1 0.1\n" + b" " * MAX_PER_IMAGE_BYTES)
    with pytest.raises(SourceError, match="problem") as err:
        packer.build(s3.url("images/"), s3.url("labels/"), tmp_path / "o.lmdb", workers=1)
    assert any(s3.url("labels/" + first) in p and "more than a label file may hold" in p for p in err.value.problems)


def test_remote_inputs_that_are_no_image_folder_say_why(s3, tmp_path):
    """Dataset names in a bucket are read as those datasets
    (tests/packer/remote/test_remote_interchange.py): a shard that is no tar is named; one object of
    images is no folder; nothing there is said."""
    s3.put("shards/data-000000.tar", b"x" * 1024)
    for images in (s3.url("shards/data-{000000..000009}.tar"), s3.url("shards/data-000000.tar")):
        with pytest.raises(SourceError, match="no sample found in this webdataset data") as err:
            packer.build(images, None, tmp_path / "o.lmdb")
        assert any("data-000000.tar: not a tar file" in p for p in err.value.problems), err.value.problems
    s3.put("one.jpg", corpus.good_jpeg(1))
    with pytest.raises(UsageError, match="must be a folder"):
        packer.build(s3.url("one.jpg"), None, tmp_path / "o.lmdb")
    with pytest.raises(UsageError, match="no objects found"):
        packer.build(s3.url("nothing/"), None, tmp_path / "o.lmdb")
    with pytest.raises(UsageError, match="needs IMAGES in a bucket"):
        packer.build(make_dataset(tmp_path / "d", 2, kind="class")[0], s3.url("labels/"), tmp_path / "o.lmdb")


# ---------------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------------
def test_throttling_and_resets_are_retried(s3_faults, tmp_path):
    s3, proxy = s3_faults
    images, _ = make_dataset(tmp_path / "d", 10, kind="class", seed=6)
    _upload(s3, images, "images/")
    proxy.fail(3, 503, "SlowDown", only="GET")
    proxy.reset(2, only="GET")
    rep = packer.build(s3.url("images/"), None, tmp_path / "o.lmdb", workers=1)
    assert rep.published and rep.records == 10 and not rep.rejected


def test_one_unreachable_object_is_a_problem_not_a_traceback(s3, tmp_path, monkeypatch):
    images, _ = make_dataset(tmp_path / "d", 6, kind="class", seed=7)
    _upload(s3, images, "images/")
    keys = gather_sources(s3.url("images/"), None, BuildOptions()).keys
    real = remote.read

    def flaky(url, *a, **kw):
        if url.endswith(keys[3]):
            raise remote.RemoteError(url, "read failed after 9 attempts in 8 s: SlowDown", transient=True)
        return real(url, *a, **kw)
    monkeypatch.setattr(remote, "read", flaky)
    rep = packer.build(s3.url("images/"), None, tmp_path / "o.lmdb", workers=1, on_corrupt="skip")
    assert rep.published and rep.records == 5
    assert rep.rejected == [{"path": keys[3], "reason": f"cannot read: {s3.url('images/' + keys[3])}: read failed "
                                                         f"after 9 attempts in 8 s: SlowDown", "unreachable": True}]
    # without --on-corrupt skip: the build stops at it (read twice), one line naming it, what is
    # done kept; once the storage answers, a plain rerun reads it again, in its place
    from click.testing import CliRunner

    from packer.cli import cli
    r = CliRunner().invoke(cli, ["build", s3.url("images/"), "-o", str(tmp_path / "s.lmdb"), "-j", "1",
                                 "--on-corrupt", "skip"])
    assert r.exit_code == 1, r.output   # published, with an input left out (as for damaged ones)
    assert f"unreachable: {keys[3]}: cannot read" in r.output and "damaged" not in r.output, r.output
    assert "1 input(s) left out that the storage did not answer for" in r.output
    out = str(tmp_path / "p.lmdb")
    r = CliRunner().invoke(cli, ["build", s3.url("images/"), "-o", out, "-j", "1", "-q"])
    assert r.exit_code == 1, r.output
    assert s3.url("images/" + keys[3]) in r.output and "could not be read twice" in r.output
    assert "rerun to resume" in r.output and "damaged" not in r.output and "Traceback" not in r.output
    monkeypatch.setattr(remote, "read", real)
    rep = packer.build(s3.url("images/"), None, out, workers=1)
    assert rep.published and rep.records == 6 and not rep.rejected and rep.resumed_from == 3
    clean = packer.build(s3.url("images/"), None, tmp_path / "clean.lmdb", workers=1)
    with open_store(out) as a, open_store(str(tmp_path / "clean.lmdb")) as b:
        assert clean.records == 6 and a.metadata.index_checksum == b.metadata.index_checksum


def test_an_object_the_server_did_not_answer_for_once_is_read_again_in_its_place(s3, tmp_path, monkeypatch):
    """One object's reads time out through the whole retry budget once (a blip, or a slow answer
    on a loaded machine), then it answers: it is read once more in its place, and the store is
    the one a build without the blip makes (same records, same order)."""
    images, _ = make_dataset(tmp_path / "d", 6, kind="class", seed=7)
    _upload(s3, images, "images/")
    keys = gather_sources(s3.url("images/"), None, BuildOptions()).keys
    real, failed = remote.read, []

    def once(url, *a, **kw):
        if url.endswith(keys[3]) and not failed:
            failed.append(url)
            raise remote.RemoteError(url, "read failed after 3 attempts in 2 s: FSTimeoutError: timed out",
                                     transient=True)
        return real(url, *a, **kw)
    monkeypatch.setattr(remote, "read", once)
    rep = packer.build(s3.url("images/"), None, tmp_path / "o.lmdb", workers=1)
    assert failed and rep.published and rep.records == 6 and not rep.rejected
    monkeypatch.setattr(remote, "read", real)
    clean = packer.build(s3.url("images/"), None, tmp_path / "clean.lmdb", workers=1)
    with open_store(str(tmp_path / "o.lmdb")) as a, open_store(str(tmp_path / "clean.lmdb")) as b:
        assert a.metadata.index_checksum == b.metadata.index_checksum and clean.records == 6


@pytest.mark.timeout(240)
def test_dead_server_stops_the_build_naming_the_object_then_resumes(s3_faults, tmp_path, monkeypatch):
    """The server dies mid-build: the build stops within the budget with one line naming an object,
    keeps what it did, and a rerun after the server is back resumes and publishes; the secret key
    appears nowhere."""
    s3, proxy = s3_faults
    secret = "sEcReT-kEy-1234567890"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)   # moto accepts any key
    monkeypatch.setenv("PACKER_REMOTE_RETRY_BUDGET", "2")
    images, _ = make_dataset(tmp_path / "d", 40, kind="class", seed=8)
    _upload(s3, images, "images/")
    out = tmp_path / "o.lmdb"
    cmd = [sys.executable, "-m", "packer.cli", "build", s3.url("images/"), "-o", str(out), "-j", "1",
           "--commit-mb", "1"]
    # Kill the server after the listing and a few reads: by count of GETs through the proxy.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while proxy.counts.get("GET", 0) < 10 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proxy.down()
    t0 = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    err = stderr.decode()
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err and "the storage stopped answering" in err and s3.url("images/") in err
    assert took < 60
    assert secret not in err + stdout.decode()
    proxy.up()
    # The rerun with the default retry budget: 2 s (for the stop above to come quickly) let a read
    # that was slow on a loaded 2-core machine (16 at once) fail as an unreadable input (full suite, once).
    env = {k: v for k, v in os.environ.items() if k != "PACKER_REMOTE_RETRY_BUDGET"}
    again = subprocess.run(cmd, capture_output=True, timeout=180, env=env)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    report = (tmp_path / "o.lmdb.report.json").read_text()
    assert json.loads(report)["records"] == 40 and json.loads(report)["resumed_from"] > 0
    assert secret not in report + again.stderr.decode() + again.stdout.decode()


# ---------------------------------------------------------------------------------------------
# Dask: listed once on the client, each shard task sent and reading only its part
# ---------------------------------------------------------------------------------------------
def test_dask_parts_hold_only_their_slice(s3, tmp_path):
    from packer.jobs.distributed import _listed_parts
    images, _ = make_dataset(tmp_path / "d", 30, kind="class", seed=9)
    _upload(s3, images, "images/")
    full = gather_sources(s3.url("images/"), None, BuildOptions())
    parts = _listed_parts(s3.url("images/"), None, BuildOptions(), 4)
    assert [len(p.keys) for p, _ in parts] == [7, 8, 7, 8]
    assert [k for p, _ in parts for k in p.keys] == full.keys
    for part, info in parts:
        assert len(part.locators) == len(part.keys) and info["inputs_total"] == 30
        assert [part.task_input(i)[1] for i in range(len(part.keys))] == [s3.url("images/" + k) for k in part.keys]
        assert len(part.locators.sizes) == len(part.keys)


@pytest.mark.dask
@pytest.mark.timeout(400)
def test_dask_build_from_bucket_equals_local(s3_faults, tmp_path):
    """A real LocalCluster on loopback: the store equals a local build's, the bucket is listed once
    (by the client: one LIST for IMAGES, one for LABELS), and the shard tasks read the objects."""
    s3, proxy = s3_faults
    try:
        import distributed  # noqa: F401
    except ImportError:
        if os.environ.get("PACKER_REQUIRE_DASK"):
            raise
        pytest.skip("dask.distributed is not installed (pip install 'packer-vision[dask]')")
    images, labels = make_dataset(tmp_path / "d", 30, kind="boxes", seed=10)
    _upload(s3, images, "images/")
    _upload(s3, labels, "labels/")
    packer.build(images, labels, tmp_path / "ref.lmdb", workers=1)
    out = tmp_path / "d.packer-manifest.json"
    proxy.counts.clear()
    r = subprocess.run([sys.executable, "-m", "packer.cli", "build", s3.url("images/"), s3.url("labels/"),
                        "-o", str(out), "--engine", "dask", "--shards", "3", "--dask-workers", "2", "-q"],
                       capture_output=True, timeout=360)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert _records(tmp_path / "ref.lmdb") == _records(out)
    report = json.loads((tmp_path / "d.packer-manifest.json.report.json").read_text())
    assert report["records"] == 30 and len(report["shards"]) == 3
    label_files = sum(1 for p in Path(labels).rglob("*") if p.is_file() and p.stat().st_size)   # empty: no GET
    assert proxy.counts["LIST"] == 2 and proxy.counts["GET"] == 30 + label_files   # each object read once
    assert len({s["worker_pid"] for s in report["shards"]}) >= 1


@pytest.mark.dask
@pytest.mark.timeout(400)
def test_dask_build_from_a_bucket_to_a_bucket(s3, tmp_path, monkeypatch):
    """Bucket to bucket with the Dask executor: the shards are built on the cluster, staged here,
    uploaded, and the manifest written last; the store reads back equal to a local build."""
    pytest.importorskip("distributed")
    monkeypatch.setenv("PACKER_STAGING_DIR", str(tmp_path / "staging"))
    images, labels = make_dataset(tmp_path / "d", 18, kind="boxes", seed=12)
    _upload(s3, images, "images/")
    _upload(s3, labels, "labels/")
    packer.build(images, labels, tmp_path / "ref.lmdb", workers=1)
    url = s3.url("out/train.packer-manifest.json")
    r = subprocess.run([sys.executable, "-m", "packer.cli", "build", s3.url("images/"), s3.url("labels/"),
                        "-o", url, "--engine", "dask", "--shards", "2", "--dask-workers", "2", "-q"],
                       capture_output=True, timeout=360, cwd=tmp_path, env=cli_env())
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    doc = json.loads(s3.get("out/train.packer-manifest.json"))
    assert len(doc["shards"]) == 2 and all(s["files"] for s in doc["shards"])
    assert _records(tmp_path / "ref.lmdb") == _records(url, cache_dir=str(tmp_path / "cache"))
    assert packer.verify(url).ok


# ---------------------------------------------------------------------------------------------
# Memory: the listing is streamed, a shard task's part is its slice (scripts/listing_memory.py)
# ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_listing_memory_is_flat_and_a_shard_part_holds_its_slice():
    # Each measure in a process of its own: tracemalloc counts every thread's allocations, and the
    # threads earlier tests leave in this one (fsspec's loop, a proxy) made the numbers move.
    def measure(entries: int, shards: int) -> dict:
        r = subprocess.run([sys.executable, str(REPO / "scripts" / "listing_memory.py"), "--entries",
                            str(entries), "--shards", str(shards)], capture_output=True, text=True,
                           timeout=120, env=cli_env())
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)["synthetic"]

    small, big = measure(5_000, 8), measure(40_000, 64)
    # Streaming the listing holds one page, whatever the number of objects.
    assert big["stream_peak_bytes"] < 1.5 * small["stream_peak_bytes"] + 100_000
    # The client keeps compact entries; a task is sent and holds its slice only, not the listing.
    assert big["client_bytes_per_entry"] < 300
    assert big["task_entries"] == 625 and small["task_entries"] == 625
    assert big["task_held_bytes"] < 2 * small["task_held_bytes"] + 50_000
    assert big["task_sent_bytes"] < big["client_bytes"] / 20


@pytest.mark.timeout(120)
def test_a_worker_reads_its_objects_with_overlapping_gets(s3_faults, tmp_path):
    """Each checking worker is handed FETCH_BATCH inputs in a bucket and reads them on as many
    threads: with 150 ms added to every request (a bucket across a network), 32 objects read by
    one worker take about two rounds of latency, where one GET after another took 32 (4.8 s).
    The store is the local build's, in the same order."""
    from packer.jobs.steps import FETCH_BATCH

    s3, proxy = s3_faults
    images, _ = make_dataset(tmp_path / "d", 32, kind="class", seed=8)
    _upload(s3, images, "images/")
    assert FETCH_BATCH >= 16
    proxy.delay(0.15)
    before = proxy.counts["GET"]
    t0 = time.monotonic()
    rep = packer.build(s3.url("images/"), None, tmp_path / "o.lmdb", workers=1)
    took = time.monotonic() - t0
    proxy.delay(0)
    assert rep.published and rep.records == 32 and not rep.rejected
    assert proxy.counts["GET"] - before == 32                  # one GET per object, none twice
    assert took < 0.5 * 32 * 0.15, took                       # serial GETs alone would take 4.8 s
    assert packer.build(images, None, tmp_path / "local.lmdb", workers=1).published
    _same_store(tmp_path / "o.lmdb", tmp_path / "local.lmdb")
