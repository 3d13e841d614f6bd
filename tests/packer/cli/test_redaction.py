"""A connection string's password never appears in anything packer prints, logs, raises or writes.

Each output is checked by running the CLI in a subprocess and searching its stdout, its stderr
and every file under the test's folder (the working directory of the run included: server
stores write their reports there) for the password and for each piece of it. The server tests
use a user with a password created on the test server (``PACKER_TEST_MONGO_URI``); the error
paths also use a server that is not there (127.0.0.1 port 1).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from packer.sample import make_dataset

pytest.importorskip("pymongo")

from tests import REPO, mongo_support  # noqa: E402

mongo = pytest.mark.mongo
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
    # odd shapes: no scheme, no path, trailing text, percent-encoding, other schemes, query secrets
    ("carol:pw@127.0.0.1:27017", "carol:***@127.0.0.1:27017"),
    ("carol:pw@127.0.0.1:27017: a MongoDB connection string starts with mongodb://",
     "carol:***@127.0.0.1:27017: a MongoDB connection string starts with mongodb://"),
    ("carol:pw@dbhost", "carol:***@dbhost"),
    ("--uri=carol:pw@dbhost?authSource=admin", "--uri=carol:***@dbhost?authSource=admin"),
    ("error: 'carol:p@w@[::1]:27017' refused", "error: 'carol:***@[::1]:27017' refused"),
    ("(carol:pw@h:1)", "(carol:***@h:1)"),
    ("mongodb://carol:p%2Fw%40x@h/db/c", "mongodb://carol:***@h/db/c"),
    ("carol:p%40w@h/db/c", "carol:***@h/db/c"),
    ("x?next=mongodb%3A%2F%2Fcarol%3Apw%40h%2Fdb&a=1", "x?next=mongodb%3A%2F%2Fcarol%3A***%40h%2Fdb&a=1"),
    ("https://carol:pw@example.com/data.tar", "https://carol:***@example.com/data.tar"),
    ("HTTP://carol:pw@example.com", "HTTP://carol:***@example.com"),
    ("s3://AKIAX:pw@bucket/key: no such key", "s3://AKIAX:***@bucket/key: no such key"),
    ("https://b/k?X-Amz-Credential=AKIAX&X-Amz-Signature=pw", "https://b/k?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("https://a/b?sv=1&sig=pw&se=2", "https://a/b?sv=1&sig=***&se=2"),
    ("mongodb://h/d/c?password=pw&w=1", "mongodb://h/d/c?password=***&w=1"),
    ("mongodb://h/d/c?authMechanismProperties=AWS_SESSION_TOKEN:pw", "mongodb://h/d/c?authMechanismProperties=AWS_SESSION_TOKEN:***"),
    ("https://a/b?design=x&key=1", "https://a/b?design=x&key=1"),
])
def test_redact(text, expected):
    from packer.core.uri import redact

    assert redact(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("carol:S3 cr@t@db1:27017", "carol:***@db1:27017"),
    ("mongodb://carol:p w@h/db/c?w=1", "mongodb://carol:***@h/db/c?w=1"),
    ("carol:pw@h/db/c?password=x", "carol:***@h/db/c?password=***"),
    ("mongodb://x509user@h/db/c", "mongodb://x509user@h/db/c"),
    ("/data/train.lmdb", "/data/train.lmdb"),
])
def test_redact_location(text, expected):
    from packer.core.uri import redact_location

    assert redact_location(text) == expected


# ---------------------------------------------------------------------------------------
# every report: one base, every field that can hold a location masked
# ---------------------------------------------------------------------------------------
SECRET_URI = f"mongodb://{USER}:{PASSWORD}@h1:27017/db/c?authSource=admin"


def report_classes() -> list:
    """Every report the public API returns, discovered from ``packer.__all__``: its classes named
    ``*Report`` and every dataclass there with a ``to_dict``."""
    import packer

    found = []
    for name in packer.__all__:
        obj = getattr(packer, name)
        if isinstance(obj, type) and (name.endswith("Report") or
                                      (dataclasses.is_dataclass(obj) and hasattr(obj, "to_dict"))):
            found.append(obj)
    return found


def _holding_secrets(annotation: str):
    """A value for a field of this annotation that holds the password wherever it can."""
    if "list" in annotation:
        return [SECRET_URI, {"location": SECRET_URI, "nested": [SECRET_URI, {"deep": SECRET_URI}]}]
    if "dict" in annotation:
        return {"location": SECRET_URI, SECRET_URI: [SECRET_URI], "nested": {"shards": [SECRET_URI]}}
    if "str" in annotation:
        return SECRET_URI
    return {"bool": True, "int": 3, "float": 0.5}.get(annotation.replace("Optional[", "").rstrip("]"), SECRET_URI)


def _assert_no_password(rep) -> None:
    d = rep.to_dict()
    for shown in (json.dumps(d), repr(d), str(rep), repr(rep), f"{rep!r}", f"{rep}"):
        for secret in secrets_of(PASSWORD):
            assert secret not in shown, f"{type(rep).__name__}: {secret!r} in {shown}"
    assert MASKED in json.dumps(d)


def test_every_report_is_one_redacting_report():
    from packer.jobs.reports import Report

    classes = report_classes()
    assert len(classes) >= 8, classes    # build, verify, info, repair, convert, export x2, merge
    for cls in classes:
        assert issubclass(cls, Report), f"{cls.__name__} is not a packer.jobs.reports.Report"
        assert cls.__module__ == "packer.jobs.reports", f"{cls.__name__} lives in {cls.__module__}"


@pytest.mark.parametrize("cls", report_classes(), ids=lambda c: c.__name__)
def test_every_report_hides_the_password_in_every_field(cls, tmp_path):
    from packer.jobs.reports import Problem

    fields = dataclasses.fields(cls)
    values = {f.name: _holding_secrets(str(f.type)) for f in fields}
    rep = cls(**values)
    for f in fields:       # the attributes themselves, as made
        for secret in secrets_of(PASSWORD):
            assert secret not in repr(getattr(rep, f.name)), (cls.__name__, f.name)
    _assert_no_password(rep)
    # fields set or grown after the report was made (as the jobs do) are masked when shown
    for f in fields:
        value = getattr(rep, f.name)
        if isinstance(value, list):
            value.extend([SECRET_URI, Problem(SECRET_URI, key=SECRET_URI), {"location": SECRET_URI}])
        elif isinstance(value, dict):
            value[SECRET_URI] = {"backup": SECRET_URI}
        elif isinstance(value, str) or value is None:
            setattr(rep, f.name, SECRET_URI)
    _assert_no_password(rep)
    if hasattr(rep, "save"):
        path = rep.save(tmp_path / "saved.json")
        assert PASSWORD not in path.read_text() and MASKED in path.read_text()


@mongo
@pytest.mark.timeout(300)
def test_export_and_convert_json_hide_the_password(store, tmp_path):
    runs = [("export", store, str(tmp_path / "folder"), "--json"),
            ("export", store, str(tmp_path / "wds"), "--to", "webdataset", "--json"),
            ("convert", store, str(tmp_path / "copy.lmdb"), "--format", "lmdb", "--json"),
            ("merge", store, "-o", str(tmp_path / "merged.lmdb"), "--copy", "--format", "lmdb", "--json")]
    for args in runs:
        proc = run_cli(tmp_path, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert_hidden(proc, tmp_path)
        shown = json.loads(proc.stdout)
        assert (shown.get("source") or shown["location"]).startswith(f"mongodb://{MASKED}") or args[0] == "merge"


# ---------------------------------------------------------------------------------------
# odd shapes: a connection string without its scheme, its path, or with escapes
# ---------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_uri_without_scheme_is_refused_without_the_password(images, tmp_path):
    bare = f"{USER}:{PASSWORD}@{DEAD}"
    runs = [("verify", "mongodb://127.0.0.1:1/db/c", "--uri", bare),
            ("info", "mongodb://127.0.0.1:1/db/c", "--uri", bare, "--json"),
            ("export", "mongodb://127.0.0.1:1/db/c", str(tmp_path / "out"), "--uri", bare),
            ("build", str(images), "-o", bare),
            ("build", str(images), "-o", f"{USER}:{PASSWORD}@dbhost"),
            ("build", str(images), "-o", "mongodb://127.0.0.1:1/db/c", "--uri", bare)]
    for args in runs:
        proc = run_cli(tmp_path, *args)
        text = assert_hidden(proc, tmp_path)
        assert proc.returncode == 2 and MASKED in text and "mongodb://" in text, (args, text)
    assert not list(tmp_path.glob(f"{USER}*")), "a build made a folder named after the URL"


@mongo
@pytest.mark.timeout(300)
def test_escaped_password_hides_in_messages_logs_and_files(account, images, tmp_path, monkeypatch, caplog):
    """A password that needs escaping, given escaped: the jobs through the library, their log
    lines (caplog), their reports and every file they write hide it in each form."""
    import urllib.parse

    import pymongo

    import packer

    password = "Pw/4@redact:me%"
    server, db = account
    admin = mongo_support.client_for(mongo_support.new_store_location("redact_admin"))
    try:
        admin[db].command("createUser", "dave", pwd=password, roles=[{"role": "readWrite", "db": db}])
    except pymongo.errors.OperationFailure:
        pass   # made by an earlier run of this module's account
    loc = f"mongodb://dave:{urllib.parse.quote_plus(password)}@{server}/{db}/escaped?authSource={db}&{FAST}"
    monkeypatch.chdir(tmp_path)                    # a server store's build report goes here
    caplog.set_level(logging.DEBUG, logger="packer")
    try:
        reports = [packer.build(str(images), None, loc, overwrite=True), packer.verify(loc, deep=True),
                   packer.info(loc), packer.export(loc, tmp_path / "out"),
                   packer.convert(loc, tmp_path / "copy.h5", "hdf5")]
        with pytest.raises(packer.UsageError) as err:
            packer.info(f"mongodb://{server}/{db}/escaped", uri=f"dave:{password}@{server}")
    finally:
        admin[db].command("dropUser", "dave")
        admin.close()
    texts = [caplog.text, str(err.value)] + [json.dumps(r.to_dict()) + repr(r) for r in reports]
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "escaped.report.json" for p in tmp_path.iterdir())
    for secret in secrets_of(password) | {urllib.parse.quote_plus(password)}:
        for text in texts:
            assert secret not in text, f"{secret!r} in {text}"
        for data in written:
            assert secret.encode() not in data
    assert caplog.text and "dave:***@" in json.dumps(reports[0].to_dict())
