"""torchvision is optional: what packer says without it, and how the tests that need it behave.

* The install hint names the torchvision that matches the installed torch, from PyTorch's index of
  that build's flavour (``+cpu``, ``+cu128``): a plain ``pip install torchvision`` would replace a
  CPU torch by PyPI's ~5.5 GB CUDA build.
* Tests marked ``torchvision`` (tests/conftest.py) skip without it with that hint, and fail where
  ``PACKER_REQUIRE_TORCHVISION=1``.
"""
from __future__ import annotations

import sys

import pytest
import torch

from packer.core.errors import DependencyError
from readers.targets import decode_target, matching_torchvision, torchvision_install_hint
from tests import conftest


@pytest.mark.parametrize("torch_version, torchvision", [
    ("2.13.0+cpu", "0.28.0"), ("2.14.1", "0.29.1"), ("2.14.1+cu128", "0.29.1"), ("2.1.2", "0.16.2"),
    ("2.0.1", "0.15.2"), ("2.0.0+cpu", "0.15.1"),
    ("1.13.1", None), ("2.15.0a0+git1f2e3d4", None), ("nonsense", None),
])
def test_matching_torchvision_follows_pytorchs_release_rule(torch_version, torchvision):
    assert matching_torchvision(torch_version) == torchvision


def test_hint_for_a_cpu_torch_keeps_it_cpu():
    assert (torchvision_install_hint("2.13.0+cpu")
            == "pip install torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu")


def test_hint_for_a_cuda_torch():
    assert torchvision_install_hint("2.14.1") == "pip install torchvision==0.29.1"   # PyPI's is CUDA
    assert (torchvision_install_hint("2.14.1+cu128")
            == "pip install torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cu128")


def test_hint_for_an_unknown_torch_names_it():
    hint = torchvision_install_hint("2.15.0a0+git1f2e3d4")
    assert "2.15.0a0+git1f2e3d4" in hint and "previous-versions" in hint


def test_hint_defaults_to_the_installed_torch():
    assert torchvision_install_hint() == torchvision_install_hint(torch.__version__)


def _without_torchvision(monkeypatch):
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchvision", None)   # `import torchvision` -> ImportError


def test_detection_targets_without_torchvision_name_the_matching_build(monkeypatch):
    _without_torchvision(monkeypatch)
    with pytest.raises(DependencyError) as ei:
        decode_target({"objects": [{"class": 1, "box": [.5, .5, .2, .2]}]}, 10, 10)
    msg = str(ei.value)
    assert "detection targets need torchvision" in msg
    assert torchvision_install_hint(torch.__version__) in msg and torch.__version__ in msg
    assert isinstance(ei.value.__cause__, ImportError)


class _Item:
    """Enough of a pytest item for conftest.pytest_runtest_setup."""

    def __init__(self, marked: bool):
        self.marked = marked

    def get_closest_marker(self, name):
        return object() if self.marked and name == "torchvision" else None


def test_marked_tests_skip_without_torchvision_with_the_hint(monkeypatch):
    _without_torchvision(monkeypatch)
    monkeypatch.delenv(conftest.REQUIRE_TORCHVISION_ENV, raising=False)
    conftest.pytest_runtest_setup(_Item(marked=False))   # unmarked: runs
    with pytest.raises(pytest.skip.Exception) as ei:
        conftest.pytest_runtest_setup(_Item(marked=True))
    assert "needs torchvision" in str(ei.value) and torchvision_install_hint() in str(ei.value)


def test_marked_tests_fail_without_torchvision_where_required(monkeypatch):
    _without_torchvision(monkeypatch)
    monkeypatch.setenv(conftest.REQUIRE_TORCHVISION_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="PACKER_REQUIRE_TORCHVISION=1 says it must be present"):
        conftest.pytest_runtest_setup(_Item(marked=True))


def test_a_torchvision_built_for_another_torch_counts_as_missing(monkeypatch):
    """PyPI's torchvision over a CPU torch raises RuntimeError on import ('operator
    torchvision::nms does not exist'), not ImportError."""
    import importlib.abc

    class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "torchvision":
                return importlib.util.spec_from_loader(name, self)
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise RuntimeError("operator torchvision::nms does not exist")

    import importlib.util

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    why = conftest.torchvision_missing()
    assert why is not None and "torchvision::nms" in why and torchvision_install_hint() in why
    with pytest.raises(DependencyError, match="torchvision::nms"):
        decode_target(None, 4, 4)
