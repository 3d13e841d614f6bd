"""Publishing stores to a bucket (packer.jobs.publish) against the S3 test server: build, convert,
merge, append and export to s3://, the manifest written last with each shard's files, resume
after a killed upload, overwrite deleting replaced shards only afterwards, info/verify/report
on the URL, and faults (throttling, a dead server) at the CLI without a traceback or a secret."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import xxhash
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.core import remote
from packer.stores import open_store
from tests import REPO
from tests.corpus import jpeg_of_shape

pytestmark = pytest.mark.s3
MANIFEST = "ds/train.packer-manifest.json"


@pytest.fixture(autouse=True)
def _staging(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.chdir(tmp_path)


def images(root, n=4, seed=0, classes=("a", "b")):
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / c / f"{c}{seed}_{i}.jpg").write_bytes(jpeg_of_shape(30 + i, 41 + seed, seed * 100 + i))
    return str(root)


def local_store(tmp_path, name, seed):
    out = str(tmp_path / f"{name}.lmdb")
    assert packer.build(images(tmp_path / f"src-{name}", seed=seed), None, out, workers=1).published
    return out


def manifest_doc(s3, key=MANIFEST):
    return json.loads(s3.get(key))


def cli_env(**extra):
    """The environment of a CLI subprocess: this checkout's packer first (the tests run elsewhere)."""
    root = str(REPO)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or cli_env())


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------
def test_build_uploads_shards_then_manifest_with_files(s3, tmp_path, monkeypatch):
    order = []
    real_upload, real_put = remote.upload, remote.put_bytes
    monkeypatch.setattr(remote, "upload", lambda local, url, **kw: order.append(url) or real_upload(local, url, **kw))
    monkeypatch.setattr(remote, "put_bytes", lambda data, url, **kw: order.append(url) or real_put(data, url, **kw))
    url = s3.url(MANIFEST)
    rep = packer.build(images(tmp_path / "imgs"), None, url, workers=1)
    assert rep.published and rep.location == url and rep.records == 8
    assert order[-1] == url and len(order) >= 2            # the manifest last, after the shard file
    doc = manifest_doc(s3)
    (entry,) = doc["shards"]
    assert entry["location"] == "train.packer-manifest.json.shards/shard-00000-of-00001.lmdb"
    names = {f["name"] for f in entry["files"]}
    assert "data.mdb" in names and "lock.mdb" not in names
    for f in entry["files"]:
        key = "ds/" + entry["location"] + "/" + f["name"]
        body = s3.get(key)
        assert f["size"] == len(body) and f["xxh3_128"] == xxhash.xxh3_128(body).hexdigest()
        assert f["etag"] == remote.stat(s3.url(key)).version
    # the report goes where server outputs' reports go: the working directory
    report = json.loads((tmp_path / "train.packer-manifest.json.report.json").read_text())
    assert report["location"] == url and report["published_to"]["files"] == len(entry["files"])
    assert not list((tmp_path / "staging").glob("*"))       # staging removed once published
    assert packer.verify(url).ok and packer.info(url).count == 8


def test_a_second_job_writing_one_url_on_this_machine_is_refused_naming_it(s3, tmp_path):
    """Jobs to one URL stage in one folder: a second build, convert, merge, append or export to a
    URL another job on this machine is writing is refused in one line naming the URL and that job
    (it used to fail on the first job's half-written shard, naming the staging folder), and the
    store in the bucket is left as it was."""
    from packer.jobs.publish import folder_url, publishing

    a = local_store(tmp_path, "a", 1)
    url = s3.url(MANIFEST)
    assert packer.build(images(tmp_path / "imgs"), None, url, workers=1).published
    before = s3.get(MANIFEST)
    more = images(tmp_path / "more", seed=3)
    with publishing(url, "build"):   # the other job (a flock: refused to another open of it, here too)
        for args in (["build", more, "-o", url, "--overwrite"], ["convert", a, url, "--overwrite"],
                     ["merge", a, "-o", url, "--copy", "--overwrite"], ["append", url, more]):
            r = CliRunner().invoke(cli, [*args, "-q"])
            assert r.exit_code == 1, (args, r.output)
            assert f"{url}: another build by pid {os.getpid()}" in r.output and "is writing this output" in r.output
            assert "staging" not in r.output.split("lock file")[0], r.output
    assert s3.get(MANIFEST) == before and packer.verify(url).ok
    folder = s3.url("exp/folder/")
    with publishing(folder_url(folder), "export"):
        r = CliRunner().invoke(cli, ["export", a, folder, "-q"])
    assert r.exit_code == 1 and f"{folder}: another export" in r.output, r.output
    assert not any(k.startswith("exp/") for k in s3.keys())
    r = CliRunner().invoke(cli, ["build", more, "-o", url, "--overwrite", "-q", "-j", "1"])   # free again
    assert r.exit_code == 0, r.output


def test_bucket_output_must_be_a_manifest_and_is_not_replaced_without_overwrite(s3, tmp_path):
    imgs = images(tmp_path / "imgs")
    r = CliRunner().invoke(cli, ["build", imgs, "-o", s3.url("ds/train.lmdb"), "-q"])
    assert r.exit_code == 2 and ".packer-manifest.json" in r.output and s3.keys() == []
    r = CliRunner().invoke(cli, ["build", imgs, "-o", s3.url(MANIFEST), "-q", "-j", "1"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["build", imgs, "-o", s3.url(MANIFEST), "-q", "-j", "1"])
    assert r.exit_code == 2 and "already exists" in r.output and "--overwrite" in r.output
    s3.put("ds/other.packer-manifest.json", b"not a manifest at all")
    r = CliRunner().invoke(cli, ["build", imgs, "-o", s3.url("ds/other.packer-manifest.json"), "--overwrite", "-q"])
    assert r.exit_code == 2 and "not a packer manifest" in r.output


def test_overwrite_deletes_replaced_shards_only_after_the_new_manifest(s3, tmp_path, monkeypatch):
    a, b = local_store(tmp_path, "a", 1), local_store(tmp_path, "b", 2)
    url = s3.url(MANIFEST)
    packer.merge([a, b], url)
    assert len(manifest_doc(s3)["shards"]) == 2
    s3.put("ds/train.packer-manifest.json.shardsX/keep.bin", b"x")     # not under <name>.shards/
    s3.put("ds/unrelated.bin", b"y")
    events = []
    real_put, real_delete = remote.put_bytes, remote.delete
    monkeypatch.setattr(remote, "put_bytes", lambda d, u, **kw: events.append(("put", u)) or real_put(d, u, **kw))
    monkeypatch.setattr(remote, "delete", lambda u, *a, **kw: events.append(("delete", u)) or real_delete(u, *a, **kw))
    rep = packer.build(images(tmp_path / "imgs", seed=5), None, url, workers=1, overwrite=True)
    assert rep.published
    assert events[0] == ("put", url) and {e[0] for e in events[1:]} == {"delete"}
    keys = s3.keys()
    assert not any("shard-00001-of-00002" in k for k in keys)
    assert "ds/train.packer-manifest.json.shardsX/keep.bin" in keys and "ds/unrelated.bin" in keys
    assert packer.verify(url).ok and packer.info(url).count == 8


# ---------------------------------------------------------------------------------------------
# resume after a kill, faults
# ---------------------------------------------------------------------------------------------
def _wait_for_key(s3, needle, proc, timeout=60):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if any(needle in k for k in s3.keys()):
            return
        if proc.poll() is not None:
            pytest.fail(f"the upload ended before it could be killed: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail(f"{needle} never appeared")


def test_killed_upload_resumes_without_resending_finished_shards(s3_faults, tmp_path):
    s3, proxy = s3_faults
    stores = [local_store(tmp_path, n, i) for i, n in enumerate("abc")]
    url = s3.url(MANIFEST)
    proxy.delay(0.4)                # slow enough to kill between the first and the last shard
    env = cli_env(PACKER_REMOTE_RETRY_BUDGET="5")
    proc = subprocess.Popen([sys.executable, "-m", "packer", "merge", *stores, "-o", url, "-q"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_key(s3, "shard-00000-of-00003.lmdb/data.mdb", proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    keys = s3.keys()
    assert MANIFEST not in keys                              # no manifest: readers see nothing new
    assert not any("shard-00002-of-00003" in k for k in keys)
    sent = sum(1 for k in keys if k.endswith("data.mdb"))
    extents = sum(1 for k in keys if k.endswith(".extents.npy"))    # where each record lies
    proxy.delay(0)
    proxy.counts.clear()
    r = run_cli("merge", *stores, "-o", url, "-q", env=env)
    assert r.returncode == 0, r.stderr
    # only the shard files still missing and the manifest are sent again
    assert proxy.counts["PUT"] == (3 - sent) + (3 - extents) + 1, dict(proxy.counts)
    assert packer.verify(url).ok and packer.info(url).count == 24


def test_killed_build_upload_reruns_only_the_upload(s3_faults, tmp_path):
    s3, proxy = s3_faults
    imgs = images(tmp_path / "imgs")
    url = s3.url(MANIFEST)
    proxy.delay(2.0)
    env = cli_env(PACKER_REMOTE_RETRY_BUDGET="5")
    proc = subprocess.Popen([sys.executable, "-m", "packer", "build", imgs, "-o", url, "-j", "1", "-q"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        while proxy.counts["HEAD"] + proxy.counts["PUT"] < 2 and time.monotonic() - t0 < 60:
            time.sleep(0.05)          # the build finished locally and its upload started
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert MANIFEST not in s3.keys()
    staged = list((tmp_path / "staging").glob("*/publish.json"))
    assert len(staged) == 1                                   # the finished build is kept
    proxy.delay(0)
    r = run_cli("build", imgs, "-o", url, "-j", "1", "-v", env=env)
    assert r.returncode == 0, r.stderr
    assert "finished; uploading it" in r.stderr               # not built again
    assert packer.info(url).count == 8 and packer.verify(url).ok


def test_throttled_upload_is_retried(s3_faults, tmp_path):
    s3, proxy = s3_faults
    proxy.fail(3, 503, "SlowDown", only="PUT")
    rep = packer.build(images(tmp_path / "imgs"), None, s3.url(MANIFEST), workers=1)
    assert rep.published and packer.verify(s3.url(MANIFEST)).ok


def test_dead_server_is_one_line_and_the_staging_is_kept(s3_faults, tmp_path, monkeypatch):
    s3, proxy = s3_faults
    secret = "pk-SECRET-never-printed-0123456789"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    imgs = images(tmp_path / "imgs")
    url = s3.url(MANIFEST)
    env = cli_env(PACKER_REMOTE_RETRY_BUDGET="2", PACKER_REMOTE_ATTEMPT_TIMEOUT="2")
    proxy.down()
    r = run_cli("build", imgs, "-o", url, "-j", "1", env=env)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and secret not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and url in lines[0], r.stderr
    # the server died while uploading a finished build: the staged build is kept for the rerun
    proxy.up()
    monkeypatch.setattr(remote, "upload", _dies_once(remote.upload))
    with pytest.raises(remote.RemoteError):
        packer.build(imgs, None, url, workers=1)
    marker = next((tmp_path / "staging").glob("*/publish.json"))
    assert secret not in marker.read_text()
    rep = packer.build(imgs, None, url, workers=1)
    assert rep.published and packer.info(url).count == 8
    assert secret not in (tmp_path / "train.packer-manifest.json.report.json").read_text()


def _dies_once(real):
    state = {"n": 0}

    def upload(local, url, **kw):
        state["n"] += 1
        if state["n"] == 1:
            raise remote.RemoteError(url, "upload failed: server gone", transient=True)
        return real(local, url, **kw)
    return upload


# ---------------------------------------------------------------------------------------------
# convert, merge --copy, append, export
# ---------------------------------------------------------------------------------------------
def test_convert_and_merge_copy_to_a_bucket(s3, tmp_path):
    a, b = local_store(tmp_path, "a", 1), local_store(tmp_path, "b", 2)
    url = s3.url("c/conv.packer-manifest.json")
    r = CliRunner().invoke(cli, ["convert", a, url, "--format", "hdf5", "-q"])
    assert r.exit_code == 0, r.output
    (entry,) = manifest_doc(s3, "c/conv.packer-manifest.json")["shards"]
    assert entry["format"] == "hdf5" and entry["files"][0]["name"] == ""
    assert "c/conv.packer-manifest.json.shards/shard-00000-of-00001.h5" in s3.keys()
    assert packer.verify(url).ok and packer.info(url).count == 8
    r = CliRunner().invoke(cli, ["convert", a, s3.url("c/conv.h5"), "--format", "hdf5"])
    assert r.exit_code == 2 and ".packer-manifest.json" in r.output
    murl = s3.url("m/all.packer-manifest.json")
    rep = packer.merge([a, b], murl, copy=True)
    assert rep.location == murl and rep.records == 16
    assert len(manifest_doc(s3, "m/all.packer-manifest.json")["shards"]) == 1 and packer.verify(murl).ok


def test_merge_copy_takes_stores_in_a_bucket_and_a_logical_merge_refuses_them(s3, tmp_path):
    """A bucket store as a merge input: ``--copy`` reads it through the shard cache into the
    merged store (local or in a bucket), records in input order; a manifest merge, which would
    point at its files, is refused in one line saying to add --copy (it read "No such file")."""
    a, b = local_store(tmp_path, "a", 1), local_store(tmp_path, "b", 2)
    url = s3.url("in/a.packer-manifest.json")
    packer.convert(a, url)
    assert packer.info(url).count == 8
    out = str(tmp_path / "ab.lmdb")
    rep = packer.merge([url, b], out, copy=True)
    assert rep.records == 16 and packer.verify(out).ok
    with open_store(a) as ra, open_store(b) as rb, open_store(out) as ro:
        assert [r.key for r in ro.get_many(range(16))] == \
            [r.key for r in ra.get_many(range(8))] + [r.key for r in rb.get_many(range(8))]
        assert [bytes(r.data) for r in ro.get_many(range(8))] == [bytes(r.data) for r in ra.get_many(range(8))]
    murl = s3.url("in/ab.packer-manifest.json")
    r = run_cli("merge", url, b, "--copy", "-o", murl, "-q")
    assert r.returncode == 0, r.stderr
    assert packer.verify(murl).ok and packer.info(murl).count == 16
    for target in (str(tmp_path / "logical.packer-manifest.json"), s3.url("in/logical.packer-manifest.json")):
        r = run_cli("merge", url, b, "-o", target)
        assert r.returncode == 2 and "add --copy" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "logical.packer-manifest.json")
    assert "in/logical.packer-manifest.json" not in s3.keys()


def test_repair_of_a_bucket_store_is_refused_saying_what_to_do(s3, tmp_path):
    """``packer repair s3://...`` is not built (a repair keeps the old shards beside the new ones);
    it said "cannot read the manifest: No such file or directory". Now: one line, exit 2, the
    steps that work, and the bucket untouched."""
    url = s3.url("r/train.packer-manifest.json")
    packer.convert(local_store(tmp_path, "a", 1), url)
    before = sorted(s3.keys())
    r = run_cli("repair", url)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "not yet on one in a bucket" in r.stderr and f"packer verify {url}" in r.stderr
    assert sorted(s3.keys()) == before and not list(tmp_path.glob("*.repair*"))


def test_append_to_a_bucket_store_uploads_only_the_new_shard(s3_faults, tmp_path):
    s3, proxy = s3_faults
    url = s3.url(MANIFEST)
    packer.build(images(tmp_path / "imgs"), None, url, workers=1)
    first = manifest_doc(s3)["shards"][0]
    proxy.counts.clear()
    r = CliRunner().invoke(cli, ["append", url, images(tmp_path / "more", seed=7), "-q"])
    assert r.exit_code == 0, r.output
    doc = manifest_doc(s3)
    assert len(doc["shards"]) == 2 and doc["shards"][0]["files"] == first["files"]
    assert doc["metadata"]["count"] == 16 and all(s["files"] for s in doc["shards"])
    assert doc["shards"][0]["extents"] == first["extents"]
    # the new shard's files and extents, and the manifest
    assert proxy.counts["PUT"] == len(doc["shards"][1]["files"]) + 1 + 1, dict(proxy.counts)
    assert packer.verify(url).ok
    assert (tmp_path / "train.packer-manifest.json.report.json").exists()


def test_export_folder_and_dataset_to_a_bucket(s3, tmp_path, monkeypatch):
    store = local_store(tmp_path, "a", 1)
    r = CliRunner().invoke(cli, ["export", store, s3.url("exp/folder/"), "-q"])
    assert r.exit_code == 0, r.output
    keys = s3.keys()
    assert sum(k.startswith("exp/folder/images/") for k in keys) == 8
    r = CliRunner().invoke(cli, ["export", store, s3.url("exp/folder"), "-q"])
    assert r.exit_code == 2 and "empty folder" in r.output
    order = []
    real, real_put = remote.upload, remote.put_bytes
    monkeypatch.setattr(remote, "upload", lambda local, url, **kw: order.append(url) or real(local, url, **kw))
    monkeypatch.setattr(remote, "put_bytes", lambda d, url, **kw: order.append(url) or real_put(d, url, **kw))
    pytest.importorskip("datasets")
    rep = packer.export_dataset(store, s3.url("exp/hf"), "hf", shard_size=3)
    assert rep.out == s3.url("exp/hf/") and rep.records == 8
    assert all(sh.startswith(s3.url("exp/hf/")) for sh in rep.shards) and rep.shards
    assert order[-1] == s3.url("exp/hf/.packer-export.json") and len(order) == len(rep.shards) + 1
    marker = json.loads(s3.get("exp/hf/.packer-export.json"))     # the commit marker, written last
    assert sorted("exp/hf/" + f["name"] for f in marker["files"]) == sorted(
        k for k in s3.keys() if k.startswith("exp/hf/") and not k.endswith(".packer-export.json"))
    assert all(f["xxh3_128"] == xxhash.xxh3_128(s3.get("exp/hf/" + f["name"])).hexdigest() for f in marker["files"])


def test_killed_export_upload_resumes_without_resending_finished_files(s3_faults, tmp_path):
    """``export`` to a bucket killed (SIGKILL) during its upload: no commit marker, so the folder
    is not complete; the same command again sends only the files still missing and the marker,
    and the folder then equals a local export of the same store."""
    s3, proxy = s3_faults
    store = local_store(tmp_path, "a", 1)
    url = s3.url("exp/folder/")
    env = cli_env(PACKER_REMOTE_RETRY_BUDGET="5")
    proxy.delay(0.3)                   # slow enough to kill between the first and the last file
    proc = subprocess.Popen([sys.executable, "-m", "packer", "export", store, url, "-q"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_key(s3, "exp/folder/images/", proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    sent = [k for k in s3.keys() if k.startswith("exp/folder/")]
    assert sent and "exp/folder/.packer-export.json" not in sent      # not complete: no marker
    proxy.delay(0)
    proxy.counts.clear()
    r = run_cli("export", store, url, "-q", env=env)
    assert r.returncode == 0, r.stderr
    local = tmp_path / "local-export"
    assert run_cli("export", store, str(local), "-q").returncode == 0
    want = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    got = {k[len("exp/folder/"):]: s3.get(k) for k in s3.keys() if k.startswith("exp/folder/")}
    marker = json.loads(got.pop(".packer-export.json"))
    assert got == want and sorted(f["name"] for f in marker["files"]) == sorted(want)
    assert proxy.counts["PUT"] == len(want) - len(sent) + 1, (dict(proxy.counts), len(want), len(sent))


# ---------------------------------------------------------------------------------------------
# info, verify, report on the URL
# ---------------------------------------------------------------------------------------------
def test_info_reads_only_the_manifest(s3_faults, tmp_path):
    s3, proxy = s3_faults
    url = s3.url(MANIFEST)
    packer.build(images(tmp_path / "imgs"), None, url, workers=1)
    proxy.counts.clear()
    r = CliRunner().invoke(cli, ["info", url, "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["count"] == 8 and rep["format"] == "manifest" and rep["location"] == url
    doc = manifest_doc(s3)
    assert rep["size_bytes"] == len(s3.get(MANIFEST)) + sum(f["size"] for f in doc["shards"][0]["files"])
    assert proxy.counts["GET"] == 1, dict(proxy.counts)          # the manifest, no shard


def test_verify_and_report_on_the_url(s3, tmp_path):
    url = s3.url(MANIFEST)
    packer.build(images(tmp_path / "imgs"), None, url, workers=1)
    r = CliRunner().invoke(cli, ["verify", url])
    assert r.exit_code == 0 and "OK (8 records" in r.output, r.output
    pytest.importorskip("matplotlib")
    r = CliRunner().invoke(cli, ["report", url, "-o", str(tmp_path / "r.html"), "-q"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_verify_finds_a_shard_changed_in_the_bucket(s3, tmp_path):
    url = s3.url(MANIFEST)
    packer.build(images(tmp_path / "imgs"), None, url, workers=1)
    entry = manifest_doc(s3)["shards"][0]
    key = "ds/" + entry["location"] + "/data.mdb"
    body = bytearray(s3.get(key))
    body[len(body) // 2] ^= 0xFF
    s3.put(key, bytes(body))
    r = CliRunner().invoke(cli, ["verify", url])
    assert r.exit_code == 1 and "data.mdb" in r.output and "changed" in r.output, r.output


def test_bucket_stores_are_split_into_shards_of_the_size_asked(s3, tmp_path):
    """A build (and a convert) to a bucket publishes shards of about -O shard_bytes each, in
    record order, with the records, keys, labels and checksums of a local build."""
    imgs = images(tmp_path / "imgs", n=12)
    local = str(tmp_path / "local.lmdb")
    packer.build(imgs, None, local, workers=1)
    r = CliRunner().invoke(cli, ["build", imgs, "-o", s3.url(MANIFEST), "-q", "-j", "1",
                                 "-O", "shard_bytes=20K"])
    assert r.exit_code == 0, r.output
    doc = manifest_doc(s3)
    assert len(doc["shards"]) >= 3, [s["location"] for s in doc["shards"]]
    assert sum(s["count"] for s in doc["shards"]) == 24 == doc["metadata"]["count"]
    assert [s["shard"] for s in doc["shards"]] == [{"index": j, "count": len(doc["shards"])}
                                                   for j in range(len(doc["shards"]))]
    for s in doc["shards"]:                             # each shard file within about the size asked
        assert sum(f["size"] for f in s["files"]) < 20 * 2**10 + 64 * 2**10
    with packer.open_store(local) as want, packer.open_store(s3.url(MANIFEST), cache_dir=str(tmp_path / "c")) as got:
        for i in range(24):
            a, b = want.get(i), got.get(i)
            assert (a.key, bytes(a.data), a.checksum, a.label) == (b.key, bytes(b.data), b.checksum, b.label)
    assert packer.verify(s3.url(MANIFEST)).ok
    assert packer.info(s3.url(MANIFEST)).count == 24
    rep = packer.convert(local, s3.url("ds/conv.packer-manifest.json"), store_options={"shard_bytes": "20K"})
    assert rep.records == 24 and len(manifest_doc(s3, "ds/conv.packer-manifest.json")["shards"]) >= 3
    r = CliRunner().invoke(cli, ["build", imgs, "-o", s3.url("ds/x.packer-manifest.json"), "-q",
                                 "-O", "shard_bytes=lots"])
    assert r.exit_code == 2 and "shard_bytes" in r.output
