"""BuildOptions: the build's options in one typed object, checked once (issue 27)."""
from __future__ import annotations

import pickle

import pytest

import packer
from packer import BuildOptions, UsageError
from packer.sample import make_dataset

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("field,value,says", [
    ("quality", 0, "quality must be 1..100"),
    ("quality", "abc", "quality must be a whole number"),
    ("quality", True, "quality must be a whole number"),
    ("max_size", 1.5, "max_size must be a whole number"),
    ("max_size", 0, "max_size must be >= 1"),
    ("max_pixels", -1, "max_pixels must be >= 0"),
    ("on_corrupt", "ignore", "on_corrupt must be one of"),
    ("exif", "rotate", "exif must be one of"),
    ("executor", "gpu", "executor must be one of"),
])
def test_a_bad_option_is_refused_naming_it(field, value, says):
    with pytest.raises(UsageError, match=says):
        BuildOptions(**{field: value})
    with pytest.raises(UsageError, match=says):   # the same through the public keywords
        packer.build("nowhere", None, "nowhere.lmdb", **{field: value})


def test_options_are_normalized_once_and_travel_whole():
    o = BuildOptions(quality="90", max_size=512.0, store_options=None)
    assert (o.quality, o.max_size, o.store_options) == (90, 512, {})
    assert pickle.loads(pickle.dumps(o)) == o   # what the dask engine ships to its tasks
    assert o.replace(workers=3).workers == 3 and o.workers is None
    with pytest.raises(UsageError):
        o.replace(quality=101)


def test_keywords_override_an_options_object_and_engine_options_are_kept_apart():
    base = BuildOptions(quality=80, on_corrupt="skip")
    merged, rest = BuildOptions.split_kwargs({"quality": 70, "shards": 4}, base)
    assert (merged.quality, merged.on_corrupt, rest) == (70, "skip", {"shards": 4})
    with pytest.raises(UsageError, match=r"unknown build option\(s\) \['shards'\]"):
        packer.build("nowhere", None, "nowhere.lmdb", shards=4)


def test_options_object_and_keywords_build_the_same_store(tmp_path):
    images, _ = make_dataset(tmp_path / "ds", 6, kind="class")
    a = packer.build(images, None, tmp_path / "a.lmdb", options=BuildOptions(quality=85, workers=1,
                                                                              executor="inline"))
    b = packer.build(images, None, tmp_path / "b.lmdb", quality=85, workers=1, executor="inline")
    assert a.published and b.published and a.records == b.records == 6
    with packer.open_store(tmp_path / "a.lmdb") as ra, packer.open_store(tmp_path / "b.lmdb") as rb:
        assert ra.metadata.index_checksum == rb.metadata.index_checksum
        assert ra.metadata.build_options["quality"] == 85
