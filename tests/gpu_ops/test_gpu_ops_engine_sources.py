"""The native decoder's sources (gpu_ops/csrc/engine/, split along its seams): what gpu_ops/engine.py
compiles and what its build cache is keyed on. Fast: nothing here compiles."""
from __future__ import annotations

import os
import shutil

from gpu_ops import build
from gpu_ops import engine as native


def test_every_translation_unit_is_compiled():
    names = [os.path.basename(p) for p in native.sources()]
    assert names == sorted(names)
    assert {"engine.cpp", "job.cpp", "pool.cpp", "hardware.cpp", "balancer.cpp", "header.cpp", "hybrid.cpp",
            "module.cpp", "common.cpp"} <= set(names)
    assert names.count("module.cpp") == 1  # the one PYBIND11_MODULE


def test_the_cache_key_covers_every_source_and_header(tmp_path):
    """A changed header rebuilds the native decoder as a changed .cpp does; a file that is no
    source (a note) does not; and none of it is part of the kernels' own key."""
    root = tmp_path / "engine"
    shutil.copytree(native.ENGINE_DIR, root)
    before = native.source_digest(str(root))
    assert before == native.source_digest(native.ENGINE_DIR)
    (root / "NOTES.txt").write_text("not a source\n")
    assert native.source_digest(str(root)) == before
    for name in ("hardware.h", "job.cpp"):
        path = root / name
        text = path.read_text()
        path.write_text(text + "// changed\n")
        assert native.source_digest(str(root)) != before, name
        path.write_text(text)
    assert native.source_digest(str(root)) == before
    csrc = tmp_path / "csrc"
    shutil.copytree(build.CSRC, csrc)
    kernels = build.sources_digest(str(csrc))
    (csrc / "engine" / "hardware.h").write_text("// changed\n")
    assert build.sources_digest(str(csrc)) == kernels
