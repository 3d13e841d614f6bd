"""Every command that writes answers an output it cannot write with one line: exit 1, the output
named, no traceback, and nothing of the user's removed (inputs, an output being replaced).

The errors are made for real where this machine allows: ENOTDIR (the output's folder is a file)
everywhere, EROFS from a read-only tmpfs when the tests run as root (a chmod'ed folder does not
stop root). EACCES, EIO, ENOSPC and EROFS are also injected at the operating-system call that
writes (``os.open``/``open`` for writing, ``os.mkdir``, ``os.replace``/``os.rename``) under the
output's folder: at the first write, and at the publishing rename.
"""
from __future__ import annotations

import builtins
import errno
import hashlib
import io
import os
import shutil
import struct
import subprocess

import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.sample import make_dataset

INJECTED = [errno.EROFS, errno.EACCES, errno.ENOSPC, errno.EIO]

#: command -> (argv from (ctx, out folder), the output's name in that folder, what is there before)
#: ``before``: None (nothing), "store" (a store the command replaces or rewrites), "report".
COMMANDS = {
    "build": (lambda c, d: ["build", c["images"], c["labels"], "-o", f"{d}/x.lmdb", "-j", "1", "-q",
                            "--overwrite"], "x.lmdb", "build"),
    "build-hdf5": (lambda c, d: ["build", c["images"], c["labels"], "-o", f"{d}/x.h5", "-j", "1", "-q"],
                   "x.h5", None),
    "convert": (lambda c, d: ["convert", c["store"], f"{d}/x.h5", "--format", "hdf5", "-q", "--overwrite"],
                "x.h5", "convert"),
    "export": (lambda c, d: ["export", c["store"], f"{d}/out", "-q"], "out", None),
    "export-webdataset": (lambda c, d: ["export", c["store"], f"{d}/out", "--to", "webdataset", "-q"], "out", None),
    "export-hf": (lambda c, d: ["export", c["store"], f"{d}/out", "--to", "hf", "-q"], "out", None),
    "export-mds": (lambda c, d: ["export", c["store"], f"{d}/out", "--to", "mds", "-q"], "out", None),
    "export-tfrecord": (lambda c, d: ["export", c["store"], f"{d}/out", "--to", "tfrecord", "-q"], "out", None),
    "merge": (lambda c, d: ["merge", c["store"], "-o", f"{d}/m.packer-manifest.json", "-q", "--overwrite"],
              "m.packer-manifest.json", "merge"),
    "merge-copy": (lambda c, d: ["merge", c["store"], "--copy", "-o", f"{d}/m.lmdb", "-q"], "m.lmdb", None),
    "append": (lambda c, d: ["append", f"{d}/s.lmdb", c["more"], c["more_labels"], "-q"], "s.lmdb", "store"),
    "repair": (lambda c, d: ["repair", f"{d}/s.lmdb", "-q"], "s.lmdb", "damaged"),
    "report": (lambda c, d: ["report", c["store"], "-o", f"{d}/r.html", "-q", "--thumbs", "0",
                             "--pixel-sample", "0", "--sample", "10"], "r.html", "report"),
    "verify-html": (lambda c, d: ["verify", c["store"], "-q", "--html", f"{d}/r.html"], "r.html", None),
}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    """Inputs shared by every case: a small dataset, a second one to append, and a store."""
    root = tmp_path_factory.mktemp("write_errors")
    images, labels = make_dataset(root / "ds", 4, kind="boxes", seed=1)
    more, more_labels = make_dataset(root / "more", 2, kind="boxes", seed=2)
    for folder in (more, more_labels):   # other keys than the store's
        for part in list(folder.iterdir()):
            part.rename(folder / f"extra-{part.name}")
    store = root / "s.lmdb"
    r = CliRunner().invoke(cli, ["build", str(images), str(labels), "-o", str(store), "-j", "1", "-q"])
    assert r.exit_code == 0, r.output
    return {"root": root, "images": str(images), "labels": str(labels), "more": str(more),
            "more_labels": str(more_labels), "store": str(store)}


def _damage(store: str) -> None:
    import lmdb

    env = lmdb.open(store, max_dbs=8)
    db = env.open_db(b"data")   # before the write transaction: open_db inside one waits on it forever
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", 1), b"\xff\xd8junk", db=db)
    env.close()


def _prepare(ctx, name: str, folder) -> list:
    """Make ``folder`` and what the command finds there before it runs; its argv."""
    argv_of, out, before = COMMANDS[name]
    os.makedirs(folder, exist_ok=True)
    if before in ("store", "damaged"):
        shutil.copytree(ctx["store"], os.path.join(folder, out))
        if before == "damaged":
            _damage(os.path.join(folder, out))
    elif before is not None:   # the command's own earlier output, which it replaces
        r = CliRunner().invoke(cli, argv_of(ctx, str(folder)))
        assert r.exit_code == 0, r.output
    return argv_of(ctx, str(folder))


def _snapshot(*roots) -> dict:
    """Every file under ``roots`` -> a hash of its bytes (LMDB's reader-lock file and the verify
    result that ``verify`` keeps beside the store it checked left out)."""
    found = {}
    for root in roots:
        for base, _, files in os.walk(root):
            for f in files:
                if f == "lock.mdb" or f.endswith((".lock", ".verify.json")):
                    continue
                p = os.path.join(base, f)
                with open(p, "rb") as fh:
                    found[p] = hashlib.blake2b(fh.read(), digest_size=16).hexdigest()
    return found


def _assert_one_line(result, out_path) -> str:
    err = result.stderr
    assert result.exit_code == 1, (result.exit_code, result.output, err)
    assert "Traceback" not in result.output and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and str(out_path) in lines[0], lines[0]
    return lines[0]


def _assert_kept(before: dict, after: dict) -> None:
    changed = sorted(p for p, h in before.items() if after.get(p) != h)
    assert not changed, f"the user's files were removed or changed: {changed}"


class _Injector:
    """Make the operating-system calls that write under ``folder`` fail with ``code``:
    every one (``at="first"``: the first write fails), only the renames (``"publish"``) or only
    the second rename (``"second-rename"``)."""

    def __init__(self, monkeypatch, folder, code: int, at: str):
        self.folder, self.code, self.at, self.hits = os.path.abspath(folder) + os.sep, code, at, []
        real_open, real_os_open = builtins.open, os.open
        real_mkdir, real_replace, real_rename = os.mkdir, os.replace, os.rename

        def os_open(path, flags, *a, **k):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                self._check(path, "open")
            return real_os_open(path, flags, *a, **k)

        def py_open(file, mode="r", *a, **k):
            if isinstance(file, (str, bytes, os.PathLike)) and any(m in mode for m in "wax+"):
                self._check(file, "open")
            return real_open(file, mode, *a, **k)

        def mkdir(path, *a, **k):
            self._check(path, "mkdir")
            return real_mkdir(path, *a, **k)

        def replace(src, dst, *a, **k):
            self._check(dst, "rename")
            return real_replace(src, dst, *a, **k)

        def rename(src, dst, *a, **k):
            self._check(src, "rename")
            return real_rename(src, dst, *a, **k)

        for target, attr, fn in ((os, "open", os_open), (builtins, "open", py_open), (io, "open", py_open),
                                 (os, "mkdir", mkdir), (os, "replace", replace), (os, "rename", rename)):
            monkeypatch.setattr(target, attr, fn)

    def _check(self, path, call: str) -> None:
        if isinstance(path, int):
            return
        path = os.path.abspath(os.fsdecode(path))
        if not path.startswith(self.folder) or (self.at != "first" and call != "rename"):
            return
        if self.at == "second-rename":   # the old output moved aside, the new one not yet in place
            self.renames = getattr(self, "renames", 0) + 1
            if self.renames != 2:
                return
        self.hits.append((call, path))
        raise OSError(self.code, os.strerror(self.code), path)


@pytest.mark.parametrize("code", INJECTED, ids=[errno.errorcode[c] for c in INJECTED])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_injected_write_error_is_one_line(ctx, tmp_path, monkeypatch, name, code):
    folder = tmp_path / "target"
    argv = _prepare(ctx, name, folder)
    before = _snapshot(ctx["root"], folder)
    inject = _Injector(monkeypatch, folder, code, "first")
    result = CliRunner().invoke(cli, argv)
    monkeypatch.undo()
    assert inject.hits, "no write was made under the output's folder"
    line = _assert_one_line(result, folder / COMMANDS[name][1])
    if code == errno.ENOSPC:
        assert "disk full" in line
    else:
        assert os.strerror(code) in line
    _assert_kept(before, _snapshot(ctx["root"], folder))


#: The commands that publish by renaming over, or beside, what is already there.
PUBLISHING = ["build", "convert", "merge", "append", "repair", "report", "export-webdataset", "export-mds"]


@pytest.mark.parametrize("name", PUBLISHING)
def test_a_failed_publish_keeps_what_was_there(ctx, tmp_path, monkeypatch, name):
    if name == "export-mds":
        pytest.importorskip("streaming", reason="writing MDS needs mosaicml-streaming")
    folder = tmp_path / "target"
    argv = _prepare(ctx, name, folder)
    before = _snapshot(ctx["root"], folder)
    inject = _Injector(monkeypatch, folder, errno.EIO, "publish")
    result = CliRunner().invoke(cli, argv)
    monkeypatch.undo()
    assert inject.hits, "nothing was renamed under the output's folder"
    _assert_one_line(result, folder / COMMANDS[name][1])
    _assert_kept(before, _snapshot(ctx["root"], folder))


def test_a_publish_failing_after_the_old_store_moved_aside_puts_it_back(ctx, tmp_path, monkeypatch):
    """LMDB publishes over a store by renaming it aside, then the new one in: when the second
    rename fails, the user's store is back at its name, not left at ``<out>.old-*``."""
    folder = tmp_path / "target"
    argv = _prepare(ctx, "build", folder)
    before = _snapshot(ctx["root"], folder)
    inject = _Injector(monkeypatch, folder, errno.EIO, "second-rename")
    result = CliRunner().invoke(cli, argv)
    monkeypatch.undo()
    assert len(inject.hits) == 1
    _assert_one_line(result, folder / "x.lmdb")
    _assert_kept(before, _snapshot(ctx["root"], folder))
    assert not [p for p in os.listdir(folder) if ".old-" in p]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_output_under_a_file_is_one_line(ctx, tmp_path, name):
    """ENOTDIR (or makedirs' EEXIST) for real: the output's folder is a file of the user's."""
    if COMMANDS[name][2] in ("store", "damaged"):
        pytest.skip("the output is the store the command rewrites: it exists, so its folder does")
    blocker = tmp_path / "notes.txt"
    blocker.write_text("the user's notes\n")
    argv = COMMANDS[name][0](ctx, str(blocker / "sub"))
    before = _snapshot(ctx["root"], tmp_path)
    result = CliRunner().invoke(cli, argv)
    line = _assert_one_line(result, blocker / "sub" / COMMANDS[name][1])
    assert f"{blocker} is a file, not a folder" in line or "Not a directory" in line
    _assert_kept(before, _snapshot(ctx["root"], tmp_path))


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder on a tmpfs remounted read-only (real EROFS, also for C libraries); root only."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only mount needs root (a chmod'ed folder does not stop root)")
    folder = tmp_path / "ro"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(folder)],
                          capture_output=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")

    def make_read_only():
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, timeout=30)

    yield folder, make_read_only
    subprocess.run(["umount", "-l", str(folder)], timeout=30)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_read_only_file_system_is_one_line(ctx, read_only_folder, name):
    folder, make_read_only = read_only_folder
    argv = _prepare(ctx, name, folder)
    make_read_only()
    before = _snapshot(ctx["root"], folder)
    result = CliRunner().invoke(cli, argv)
    line = _assert_one_line(result, folder / COMMANDS[name][1])
    assert "Read-only file system" in line
    _assert_kept(before, _snapshot(ctx["root"], folder))


def test_verify_on_a_read_only_store_says_its_result_is_not_kept(ctx, tmp_path, monkeypatch, caplog):
    """verify writes only an optional sidecar: its verdict stands (exit 0), one warning names it."""
    folder = tmp_path / "target"
    folder.mkdir()
    shutil.copytree(ctx["store"], folder / "s.lmdb")
    _Injector(monkeypatch, folder, errno.EROFS, "first")
    with caplog.at_level("WARNING"):
        result = CliRunner().invoke(cli, ["verify", str(folder / "s.lmdb")])
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output + result.stderr and "OK (4 records)" in result.output
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert str(folder / "s.lmdb.verify.json") in warnings[0] and "Read-only file system" in warnings[0]
    assert not (folder / "s.lmdb.verify.json").exists()


def test_the_library_raises_a_write_error_naming_the_output(ctx, tmp_path):
    """Python callers get the PackerError too, not an OSError from deep inside."""
    import packer

    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    with pytest.raises(packer.WriteError) as info:
        packer.export(ctx["store"], blocker / "out")
    assert info.value.location == str(blocker / "out") and info.value.path == str(blocker)
    assert isinstance(info.value, packer.PackerError)


def test_an_os_error_about_an_input_is_not_called_a_write_error(tmp_path):
    from packer.core.writes import is_about_output, os_error_message

    exc = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "in" / "a.jpg"))
    assert not is_about_output(exc, str(tmp_path / "out.lmdb"))
    assert os_error_message(exc, str(tmp_path / "out.lmdb")) == f"{tmp_path / 'in' / 'a.jpg'}: Permission denied"
    beside = OSError(errno.EIO, "Input/output error", str(tmp_path / ".out.lmdb.tmp-1"))
    assert is_about_output(beside, str(tmp_path / "out.lmdb"))
    inside_beside = OSError(errno.EIO, "Input/output error", str(tmp_path / ".out.partial-x1" / "a.tar"))
    assert is_about_output(inside_beside, str(tmp_path / "out"))
    assert is_about_output(OSError(errno.EIO, "Input/output error"), str(tmp_path / "out.lmdb"))  # an fd's write
    # a library's words about a source (no errno, no file): not called a write error
    assert not is_about_output(OSError("Unable to open file (file signature not found)"), str(tmp_path / "o"))
    h5 = OSError("Unable to create file (unable to open file: name = '/x/y.h5.partial', errno = 13, "
                 "error message = 'Permission denied', flags = 13)")
    assert os_error_message(h5, "/x/y.h5") == ("/x/y.h5: cannot write /x/y.h5.partial: Permission denied "
                                               "(hint: no permission to write there: check the folder's "
                                               "owner and mode, or choose another output)")
