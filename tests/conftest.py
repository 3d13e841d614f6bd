"""Shared fixtures: generated datasets and one store location per registered format."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from packer.sample import make_dataset
from packer.stores import available_formats

_SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "manifest": ".packer-manifest.json"}


def _format_params():
    params = []
    for name in available_formats():
        marks = [pytest.mark.mongo] if name == "mongo" else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture(params=_format_params())
def fmt(request):
    """Each registered store format in turn (the store contract suite runs over all)."""
    return request.param


@pytest.fixture
def location_for(fmt, tmp_path, monkeypatch):
    """``location_for(name)`` -> a fresh, unused store location of format ``fmt``."""
    created = []
    if fmt == "mongo":
        monkeypatch.chdir(tmp_path)  # build reports for server URLs go to the working directory

    def make(name: str = "store") -> str:
        if fmt == "mongo":
            from tests import mongo_support
            loc = mongo_support.new_store_location(name)
        else:
            loc = str(tmp_path / (name + _SUFFIX.get(fmt, "." + fmt)))
        created.append(loc)
        return loc

    yield make
    if fmt == "mongo":
        from tests import mongo_support
        drop = getattr(mongo_support, "drop_location", None)
        for loc in created:
            if drop:
                drop(loc)


@pytest.fixture(scope="session")
def boxes_dataset(tmp_path_factory) -> tuple[Path, Path]:
    """24 JPEGs in two sub-folders with YOLO labels (some empty), 3 sizes, gray and progressive."""
    return make_dataset(tmp_path_factory.mktemp("boxes"), 24, kind="boxes", seed=1)


@pytest.fixture(scope="session")
def classes_dataset(tmp_path_factory) -> Path:
    """18 JPEGs in class folders (ImageFolder layout)."""
    images, _ = make_dataset(tmp_path_factory.mktemp("classes"), 18, kind="classes", seed=2)
    return images


@pytest.fixture
def boxes_copy(boxes_dataset, tmp_path) -> tuple[Path, Path]:
    """A private, modifiable copy of boxes_dataset."""
    images, labels = boxes_dataset
    shutil.copytree(images, tmp_path / "images")
    shutil.copytree(labels, tmp_path / "labels")
    return tmp_path / "images", tmp_path / "labels"


@pytest.fixture(params=["native", "python"])
def record_path(request, monkeypatch):
    """Both ways known records are checked and copied (readers/raw.py): gpu_ops' C++ op
    (``gather_check_xxh3``, ``PACKER_NATIVE_RECORDS=1``: whatever the batch's bytes) and the
    Python loop (``PACKER_NATIVE_RECORDS=0``). Yields the name and a list of what each
    ``RecordFacts.native_spans`` call returned (True: the op did it, or raised RecordError for a
    damaged record)."""
    from packer.core.errors import RecordError
    from readers import raw

    monkeypatch.setenv(raw.NATIVE_RECORDS_ENV, "1" if request.param == "native" else "0")
    if request.param == "native":
        from tests.gpu_ops_helpers import gather_op_or_skip

        gather_op_or_skip()
    calls = []
    real = raw.RecordFacts.native_spans

    def spy(self, *args, **kwargs):
        try:
            calls.append(real(self, *args, **kwargs))
        except RecordError:  # only the op's verdict raises there
            calls.append(True)
            raise
        return calls[-1]

    monkeypatch.setattr(raw.RecordFacts, "native_spans", spy)
    yield request.param, calls


def pytest_configure(config):
    # Tests never depend on how many cores the machine has.
    os.environ.setdefault("PACKER_TEST", "1")


@pytest.fixture
def s3(monkeypatch):
    """A fresh bucket on the S3 test server (tests/s3_support.py), with ``AWS_ENDPOINT_URL`` and
    test keys in the environment, as a user points any AWS client at an S3-compatible server."""
    from tests import s3_support
    endpoint = s3_support.endpoint()
    s3_support.s3_env(monkeypatch, endpoint)
    yield s3_support.S3Bucket(endpoint, s3_support.new_bucket(endpoint))
    s3_support._clear_fs_cache()


@pytest.fixture
def s3_faults(s3, monkeypatch):
    """``(bucket, proxy)``: the bucket of ``s3`` reached through a :class:`tests.s3_support.FaultProxy`
    that injects throttling, resets, short bodies, delays or a dead server on request."""
    from tests import s3_support
    proxy = s3_support.FaultProxy(s3.endpoint)
    s3_support.s3_env(monkeypatch, proxy.url)
    monkeypatch.setattr("packer.core.remote.RETRY_BUDGET_S", 8.0)
    yield s3, proxy
    proxy.close()


#: Set to 1 where torchvision must be present (the ``cuda`` stage of scripts/check_install.sh):
#: a test marked ``torchvision`` then fails instead of skipping without it.
REQUIRE_TORCHVISION_ENV = "PACKER_REQUIRE_TORCHVISION"


def torchvision_missing() -> str | None:
    """None when torchvision imports, else why not and the pip command of the torchvision that
    matches the installed torch (a plain ``pip install torchvision`` would replace a CPU torch by
    PyPI's 5.5 GB CUDA build)."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError) as exc:   # RuntimeError: built for another torch
        import torch

        from readers.targets import torchvision_install_hint

        return (f"needs torchvision ({type(exc).__name__}: {exc}); for torch {torch.__version__}: "
                f"{torchvision_install_hint()}")
    return None


def pytest_runtest_setup(item):
    """Tests marked ``torchvision`` skip without it, saying what to install (fail where
    PACKER_REQUIRE_TORCHVISION=1)."""
    if item.get_closest_marker("torchvision") is None:
        return
    why = torchvision_missing()
    if why is None:
        return
    if os.environ.get(REQUIRE_TORCHVISION_ENV) == "1":
        pytest.fail(f"{why}, and {REQUIRE_TORCHVISION_ENV}=1 says it must be present", pytrace=False)
    pytest.skip(why)
