"""``packer.core.deps.optional_import``: one helper, one message, and every hint names a real extra."""
from __future__ import annotations

import ast
import configparser
import sys

import pytest

from packer.core.deps import install_hint, missing_message, optional_import
from packer.core.errors import DependencyError
from tests import REPO

pytestmark = pytest.mark.timeout(60)


def _extras() -> set:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return set(cfg["options.extras_require"])


def _call_sites() -> list:
    """``(file:line, args, keywords)`` of every ``optional_import(...)`` call in packer/ and readers/."""
    sites = []
    for root in ("packer", "readers"):
        for path in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "optional_import":
                    sites.append((f"{path.relative_to(REPO)}:{node.lineno}", node.args,
                                  {k.arg: k.value for k in node.keywords}))
    return sites


def test_every_call_site_names_an_extra_that_exists():
    extras, sites = _extras(), _call_sites()
    assert len(sites) >= 8, sites   # the stores, the report, dask, turbojpeg
    for where, args, kw in sites:
        assert len(args) >= 2 and all(isinstance(a, ast.Constant) for a in args), \
            f"{where}: optional_import takes literal module, feature and extra (so this test can check them)"
        extra = args[2] if len(args) > 2 else kw.get("extra")
        if extra is None or (isinstance(extra, ast.Constant) and extra.value is None):
            package = kw.get("package")
            assert isinstance(package, ast.Constant) and package.value, \
                f"{where}: a core dependency (no extra) says its pip name with package="
            continue
        assert isinstance(extra, ast.Constant), f"{where}: the extra must be a literal"
        assert extra.value in extras, f"{where}: extra {extra.value!r} is not in setup.cfg [options.extras_require]"


def test_no_hand_written_import_helper_is_left():
    """DependencyError for a missing package is raised only by optional_import (the sites that
    remain are listed here with why: another team's area, or not a missing-package error)."""
    allowed = {
        "packer/core/integrity.py",     # libturbojpeg, the C library, is missing: apt-get, not pip
        "packer/core/remote.py",        # fsspec and the scheme's implementation (remote area)
        "packer/labels/yolo.py",        # PyYAML (labels area)
        "readers/targets.py",           # torchvision matched to the installed torch
    }
    found = set()
    for root in ("packer", "readers"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel.startswith(("packer/interchange/", "readers/gpu/")) or rel == "packer/core/deps.py":
                continue   # interchange and readers.gpu: their own teams' areas for now
            if "raise DependencyError(" in path.read_text(encoding="utf-8"):
                found.add(rel)
    assert found <= allowed, sorted(found - allowed)


def test_missing_module_names_the_extra_and_keeps_the_cause(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymongo", None)   # "import pymongo" now fails
    with pytest.raises(DependencyError) as exc:
        optional_import("pymongo", "the MongoDB store", "mongo")
    assert str(exc.value) == "the MongoDB store needs pymongo: pip install 'packer-vision[mongo]'"
    assert isinstance(exc.value.__cause__, ImportError)


def test_core_dependency_names_its_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(DependencyError, match=r"^the HDF5 store needs h5py: pip install h5py$"):
        optional_import("h5py", "the HDF5 store", package="h5py")


def test_installed_but_broken_module_shows_the_real_error(tmp_path, monkeypatch):
    """A package that is there but fails to import is not 'missing': the message says what broke."""
    pkg = tmp_path / "packer_broken_dep"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import packer_absent_inner_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DependencyError) as exc:
        optional_import("packer_broken_dep", "the widget", "report")
    msg = str(exc.value)
    assert msg.startswith("the widget needs packer_broken_dep, which is installed but does not import: "
                          "ModuleNotFoundError"), msg
    assert "packer_absent_inner_dep" in msg and "pip install" not in msg
    assert isinstance(exc.value.__cause__, ModuleNotFoundError)


def test_submodule_missing_is_a_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "json.packer_nope", None)
    msg = missing_message("json.packer_nope", "the thing", "report",
                          exc=ModuleNotFoundError("no", name="json.packer_nope"))
    assert msg == "the thing needs json: pip install 'packer-vision[report]'"


def test_optional_import_returns_the_module():
    import json
    assert optional_import("json", "anything", "report") is json
    assert install_hint(None, "lmdb") == "pip install lmdb"
    with pytest.raises(ValueError):
        install_hint(None)
