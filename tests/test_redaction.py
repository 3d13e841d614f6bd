"""A connection string's password never appears in anything packer prints, logs, raises or writes.

Each output is checked by running the CLI in a subprocess and searching its stdout, its stderr
and every file under the test's folder (the working directory of the run included: server
stores write their reports there) for the password and for each piece of it. The server tests
use a user with a password created on the test server (``PACKER_TEST_MONGO_URI``); the error
paths also use a server that is not there (127.0.0.1 port 1).
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from packer.sample import make_dataset

pytest.importorskip("pymongo")

from tests import mongo_support  # noqa: E402

mongo = pytest.mark.mongo
REPO = Path(__file__).resolve().parent.parent
USER = "carol"
PASSWORD = "S3cretPW4redact"
MASKED = f"{USER}:***@"
# A server that is not there, and a short server selection so that each read gives up quickly.
DEAD = "127.0.0.1:1"
FAST = "serverSelectionTimeoutMS=200&connectTimeoutMS=200"


def run_cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MONGODB_URI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "packer", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def secrets_of(password: str) -> set[str]:
    """The password, its escaped forms, and every piece of it between the characters a broken
    parse could split it at (each long enough to mean something)."""
    found = {password, urllib.parse.quote_plus(password), urllib.parse.quote(password, safe="")}
    for sep in "/@: ":
        found.update(p for p in password.split(sep) if len(p) >= 4)
    return found


def assert_hidden(proc: subprocess.CompletedProcess, root: Path, password: str = PASSWORD) -> str:
    """No trace of ``password`` in the run's output or in any file (name or bytes) under ``root``.

    Returns stdout + stderr, for further checks."""
    text = proc.stdout + proc.stderr
    written = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for secret in secrets_of(password):
        assert secret not in text, f"{secret!r} shown:\n{text}"
        for path, data in written.items():
            assert secret not in str(path.relative_to(root)), f"{secret!r} in a file name: {path}"
            assert secret.encode() not in data, f"{secret!r} written to {path}"
    return text


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("redact_src"), 4, kind="classes", sizes=((48, 64),))[0]


@pytest.fixture(scope="module")
def account():
    """A user with a password on the test server, in a database of its own: (host:port, db)."""
    import pymongo

    loc = mongo_support.new_store_location("redact")
    server, db, _ = mongo_support.split_location(loc)
    client = mongo_support.client_for(loc)
    try:
        client[db].command("createUser", USER, pwd=PASSWORD, roles=[{"role": "readWrite", "db": db}])
        yield server.split("://", 1)[1], db
    finally:
        try:
            client[db].command("dropUser", USER)
        except pymongo.errors.OperationFailure:
            pass  # never created
        client.close()
        mongo_support.drop_location(loc)


def location(account, coll: str = "c", password: str = PASSWORD, scheme: str = "mongodb",
             host: str | None = None, query: str = "") -> str:
    server, db = account
    opts = f"authSource={db}" + (f"&{query}" if query else "")
    return f"{scheme}://{USER}:{password}@{host or server}/{db}/{coll}?{opts}"


@pytest.fixture(scope="module")
def store(account, images, tmp_path_factory) -> str:
    """A published store behind the password (built through the CLI)."""
    loc = location(account)
    proc = run_cli(tmp_path_factory.mktemp("redact_build"), "build", str(images), "-o", loc, "-q")
    assert proc.returncode == 0, proc.stderr
    return loc


# ---------------------------------------------------------------------------------------
# the outputs of a store that works
# ---------------------------------------------------------------------------------------
@mongo
@pytest.mark.timeout(180)
def test_info_hides_the_password(store, tmp_path):
    proc = run_cli(tmp_path, "info", store)
    text = assert_hidden(proc, tmp_path)
    assert proc.returncode == 0 and f"store:        mongodb://{MASKED}" in text


@mongo
@pytest.mark.timeout(180)
def test_info_json_hides_the_password(store, tmp_path):
    proc = run_cli(tmp_path, "info", store, "--json")
    assert_hidden(proc, tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["location"].startswith(f"mongodb://{MASKED}")


@mongo
@pytest.mark.timeout(180)
def test_verify_hides_the_password(store, tmp_path):
    proc = run_cli(tmp_path, "verify", store)
    text = assert_hidden(proc, tmp_path)
    assert proc.returncode == 0 and f"{MASKED}" in text and ": OK (4 records)" in text


@mongo
@pytest.mark.timeout(180)
def test_verify_deep_hides_the_password(store, tmp_path):
    proc = run_cli(tmp_path, "verify", "--deep", store)
    text = assert_hidden(proc, tmp_path)
    assert proc.returncode == 0 and "OK (4 records, decoded)" in text and MASKED in text


@mongo
@pytest.mark.timeout(180)
def test_verify_json_hides_the_password(store, tmp_path):
    proc = run_cli(tmp_path, "verify", "--json", store)
    assert_hidden(proc, tmp_path)
    rep = json.loads(proc.stdout)
    assert proc.returncode == 0 and rep["ok"] and rep["location"].startswith(f"mongodb://{MASKED}")


@mongo
@pytest.mark.timeout(180)
def test_verify_sidecar_file_hides_the_password(store, tmp_path):
    proc = run_cli(tmp_path, "verify", "-q", store)
    assert proc.returncode == 0, proc.stderr
    sidecar = tmp_path / "c.verify.json"     # a server store's sidecar goes to the working directory
    saved = json.loads(sidecar.read_text())
    assert saved["ok"] and saved["location"].startswith(f"mongodb://{MASKED}")
    assert_hidden(proc, tmp_path)


@mongo
@pytest.mark.timeout(180)
def test_already_exists_error_hides_the_password(store, images, tmp_path):
    proc = run_cli(tmp_path, "build", str(images), "-o", store, "-q")
    text = assert_hidden(proc, tmp_path)
    assert proc.returncode == 2 and f"{MASKED}" in text and "already exists" in text
    proc = run_cli(tmp_path, "build", str(images), "-o", store, "--json")
    assert_hidden(proc, tmp_path)
    assert proc.returncode == 2 and "already exists" in json.loads(proc.stdout)["error"]


@mongo
@pytest.mark.timeout(180)
def test_build_report_and_log_lines_hide_the_password(account, images, tmp_path):
    loc = location(account, coll="rebuilt")
    proc = run_cli(tmp_path, "build", str(images), "-o", loc, "-v")   # -v: INFO log lines too
    text = assert_hidden(proc, tmp_path)
    assert proc.returncode == 0 and "INFO: " in text and f"{MASKED}" in text
    assert json.loads((tmp_path / "rebuilt.report.json").read_text())["location"].startswith(f"mongodb://{MASKED}")
    proc = run_cli(tmp_path, "build", str(images), "-o", loc, "--overwrite", "--json")
    assert_hidden(proc, tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["location"].startswith(f"mongodb://{MASKED}")


@mongo
@pytest.mark.timeout(180)
def test_upper_case_scheme_is_read_and_hides_the_password(store, tmp_path):
    upper = "MongoDB" + store[len("mongodb"):]
    for args in (["info", upper], ["verify", upper], ["verify", "--json", upper]):
        proc = run_cli(tmp_path, *args)
        text = assert_hidden(proc, tmp_path)
        assert proc.returncode == 0 and MASKED in text, args


# ---------------------------------------------------------------------------------------
# locations that cannot work: the error names them, masked
# ---------------------------------------------------------------------------------------
@mongo
@pytest.mark.timeout(180)
def test_location_without_scheme_hides_the_password(store, images, tmp_path):
    bare = store[len("mongodb://"):]
    for args in (["info", bare], ["verify", bare], ["build", str(images), "-o", bare]):
        proc = run_cli(tmp_path, *args)
        text = assert_hidden(proc, tmp_path)
        assert proc.returncode == 2 and MASKED in text and "mongodb://" in text, (args, text)
    assert not list(tmp_path.glob(f"{USER}*")), "a build made a folder named after the URL"


@mongo
@pytest.mark.timeout(180)
@pytest.mark.parametrize("password", ["S3cr/etPW4redact", "S3cr@etPW4redact", "S3cr:etPW4redact",
                                      "S3cr etPW4redact"], ids=["slash", "at", "colon", "space"])
def test_unescaped_password_characters_hide_the_password(account, images, tmp_path, password):
    loc = location(account, password=password)
    for args in (["info", loc], ["verify", loc], ["verify", "--json", loc], ["build", str(images), "-o", loc]):
        proc = run_cli(tmp_path, *args)
        text = assert_hidden(proc, tmp_path, password)
        assert proc.returncode == 2 and MASKED in text and "escape" in text, (args, text)


@pytest.mark.timeout(180)
def test_dead_server_hides_the_password(images, tmp_path):
    loc = f"mongodb://{USER}:{PASSWORD}@{DEAD}/db/c?{FAST}"
    for args in (["info", loc], ["verify", loc], ["verify", "--json", loc], ["build", str(images), "-o", loc]):
        proc = run_cli(tmp_path, *args)
        text = assert_hidden(proc, tmp_path)
        assert proc.returncode == 1 and f"mongodb://{MASKED}{DEAD}/db/c" in text, (args, text)


# ---------------------------------------------------------------------------------------
# exceptions, repr() and the redaction itself
# ---------------------------------------------------------------------------------------
def test_exceptions_and_reprs_hide_the_password():
    from packer.core.errors import PackerError, RecordError, StoreError, UsageError
    from packer.stores import open_store
    from packer.stores.mongo import parse_location

    loc = f"mongodb://{USER}:{PASSWORD}@{DEAD}/db/c?{FAST}"
    parsed = parse_location(loc)
    assert PASSWORD in parsed.client_uri                      # still what the client connects with
    assert PASSWORD not in repr(parsed) and PASSWORD not in parsed.name and PASSWORD not in parsed.server
    with pytest.raises(StoreError) as err:
        open_store(loc, timeout=1, retries=0)
    errors = [err.value, UsageError(f"{loc} already exists"), RecordError(loc, "k", "bad", 3)]
    for bad in ("S3cr/et", "S3cr@et", "S3cr:et"):
        with pytest.raises(UsageError) as err:
            parse_location(loc.replace(PASSWORD, bad))
        assert "S3cr" not in str(err.value) and MASKED in str(err.value)
        errors.append(err.value)
    for exc in errors:
        assert isinstance(exc, PackerError)
        for shown in (str(exc), repr(exc), repr(exc.args), repr(vars(exc))):
            assert PASSWORD not in shown and "S3cr" not in shown, shown
        assert PASSWORD.encode() not in pickle.dumps(exc)


@mongo
@pytest.mark.timeout(180)
def test_reader_reprs_hide_the_password(store):
    from packer.stores import open_store
    from readers import StoreDataset

    with open_store(store) as reader:
        assert MASKED in repr(reader) and PASSWORD not in repr(reader)
        assert PASSWORD not in reader.location
    ds = StoreDataset(store)
    assert len(ds) == 4 and MASKED in repr(ds) and PASSWORD not in repr(ds)


@pytest.mark.parametrize("text, expected", [
    ("mongodb://carol:pw@h1:27017,h2/db/c?replicaSet=rs", "mongodb://carol:***@h1:27017,h2/db/c?replicaSet=rs"),
    ("MongoDB://carol:pw@h/db/c", "MongoDB://carol:***@h/db/c"),
    ("mongodb+srv://carol:pw@cluster.example/?w=1", "mongodb+srv://carol:***@cluster.example/?w=1"),
    ("mongodb://carol:p/w@h/db/c", "mongodb://carol:***@h/db/c"),
    ("mongodb://carol:p@w@h/db/c", "mongodb://carol:***@h/db/c"),
    ("mongodb://carol:p:w@h/db/c", "mongodb://carol:***@h/db/c"),
    ("mongodb://carol:a@b/c@h/db/c", "mongodb://carol:***@h/db/c"),
    ("error: mongodb://carol:p w@h/db/c: bad", "error: mongodb://carol:***@h/db/c: bad"),
    ("mongodb://carol:pw@h", "mongodb://carol:***@h"),
    ("carol:pw@10.0.0.1:27017/db/c: no such file", "carol:***@10.0.0.1:27017/db/c: no such file"),
    ('{"location": "mongodb://carol:pw@h/db/c"}', '{"location": "mongodb://carol:***@h/db/c"}'),
    ("mongodb://carol:pw@h/db/c: key 'cls/a@b.jpg': bad", "mongodb://carol:***@h/db/c: key 'cls/a@b.jpg': bad"),
    ("mongodb://h/db/c?tlsCertificateKeyFilePassword=pw&w=1", "mongodb://h/db/c?tlsCertificateKeyFilePassword=***&w=1"),
    # nothing to mask: left as it is
    ("mongodb://x509user@h/db/c", "mongodb://x509user@h/db/c"),
    ("mongodb://h:27017/db/c", "mongodb://h:27017/db/c"),
    ("cls/a:b@c.jpg: damaged", "cls/a:b@c.jpg: damaged"),
    ("/data/train.lmdb: index 3: bad", "/data/train.lmdb: index 3: bad"),
])
def test_redact(text, expected):
    from packer.core.uri import redact

    assert redact(text) == expected
