"""The README's Python snippet runs as written: from a script file without a
``if __name__ == "__main__":`` guard, and from stdin (``python - < snippet``)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from packer.sample import make_dataset

ROOT = Path(__file__).resolve().parents[1]


def readme_python_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README.md has no ```python block under '## Python'"
    return m.group(1)


@pytest.fixture(scope="module")
def snippet_dir(tmp_path_factory):
    """A working folder with data/images and data/labels, the paths the snippet uses."""
    root = tmp_path_factory.mktemp("readme")
    make_dataset(root / "data", 12, kind="boxes", seed=11)
    return root


def _run(args, cwd, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240,
                          env=env, **kw)


def test_snippet_uses_the_generated_paths():
    code = readme_python_snippet()
    assert '"data/images"' in code and '"data/labels"' in code and "__main__" not in code


@pytest.mark.timeout(300)
def test_readme_snippet_runs_from_an_unguarded_file(snippet_dir, tmp_path):
    work = tmp_path / "file"
    work.mkdir()
    (work / "data").symlink_to(snippet_dir / "data")
    (work / "snippet.py").write_text(readme_python_snippet() + "\nprint('SNIPPET OK', len(ds))\n")
    r = _run(["snippet.py"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SNIPPET OK 12" in r.stdout
    assert (work / "train.lmdb").is_dir()


@pytest.mark.timeout(300)
def test_readme_snippet_runs_from_stdin(snippet_dir, tmp_path):
    work = tmp_path / "stdin"
    work.mkdir()
    (work / "data").symlink_to(snippet_dir / "data")
    r = _run(["-"], work, input=readme_python_snippet() + "\nprint('SNIPPET OK', len(ds))\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SNIPPET OK 12" in r.stdout
