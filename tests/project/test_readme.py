"""The README's Python quick start runs as written: from a script file (the code under the
``if __name__ == "__main__":`` guard a newcomer's script needs, with no warning printed), and from
stdin (``python - < snippet``).

(tests/project/test_docs_examples.py runs every block of the README and docs in order; this one
checks the two ways a newcomer runs the first Python block on its own.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from packer.sample import make_dataset
from tests import REPO


def readme_python_snippet() -> str:
    """The first ```python block under '## Quick start' / '### Python'."""
    text = (REPO / "README.md").read_text()
    assert "\n## Quick start\n" in text, "README.md has no '## Quick start' section"
    quick = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert "\n### Python\n" in quick, "README.md's quick start has no '### Python' part"
    section = quick.split("\n### Python\n", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README.md has no ```python block under '### Python'"
    return m.group(1)


@pytest.fixture(scope="module")
def snippet_dir(tmp_path_factory):
    """A working folder with data/images and data/labels, the paths the snippet uses."""
    root = tmp_path_factory.mktemp("readme")
    make_dataset(root / "data", 12, kind="boxes", seed=11)
    return root


def _run(args, cwd, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240,
                          env=env, **kw)


def test_snippet_uses_the_generated_paths():
    code = readme_python_snippet()
    assert '"data/images"' in code and '"data/labels"' in code
    # Under the guard: the example a user copies into a file is the right shape (the build's spawn
    # workers and DataLoader workers import that file again; without it packer warns).
    assert re.search(r'^if __name__ == "__main__":.*\n    main\(\)$', code, re.M), code
    # The DataLoader batches images of one size: collate_boxes cannot stack the reduced-scale
    # decodes of images of different sizes (the crash the README example once had).
    assert "DataLoader(" in code and "collate_fn=collate_boxes" in code and "transform=Resize(" in code


#: What packer logs when a script's workers cannot import it (packer/core/workers.py), and what
#: Python says about a main module that is not guarded.
_GUARD_WARNINGS = ("instead of worker processes", "__main__", "if __name__", "Traceback")


@pytest.mark.timeout(300)
def test_readme_snippet_runs_from_a_file_without_warnings(snippet_dir, tmp_path):
    work = tmp_path / "file"
    work.mkdir()
    (work / "data").symlink_to(snippet_dir / "data")
    (work / "snippet.py").write_text(readme_python_snippet())
    r = _run(["snippet.py"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^12 records packed, 12 read back, the first: \S+$", r.stdout, re.M), r.stdout
    assert (work / "train.lmdb").is_dir()
    told = [w for w in _GUARD_WARNINGS if w in r.stderr]
    assert not told, f"the README example printed {told}:\n{r.stderr[-3000:]}"
    assert "warning" not in r.stderr.lower(), r.stderr[-3000:]


@pytest.mark.timeout(300)
def test_readme_snippet_runs_from_stdin(snippet_dir, tmp_path):
    work = tmp_path / "stdin"
    work.mkdir()
    (work / "data").symlink_to(snippet_dir / "data")
    r = _run(["-"], work, input=readme_python_snippet())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "12 records packed, 12 read back" in r.stdout
