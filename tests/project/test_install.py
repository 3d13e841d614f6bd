"""packer installs like any Python library: scripts/check_install.sh in fresh virtualenvs.

``pip install REPO`` and ``pip install -e REPO`` with no flags (gpu_ops compiled on first use and
cached), and ``FORCE_CUDA=0 pip install --no-build-isolation REPO`` (compiled at install, the
CPU-only path), each followed by a check that the compiled kernels load and raise RuntimeError on a
bad argument. Slow (minutes: torch into each venv, one or two CPU compiles) and needs PyPI or a warm
pip cache for packer's dependencies; ``PACKER_CHECK_INSTALL_STAGES`` picks the stages
(default plain,editable,nbi; ``none`` skips the test). Its ``cuda`` stage (the CUDA torch, the
CUDA kernels compiled with FORCE_CUDA=1, then the tests that need torchvision and the MDS tests
there) is a test of its own that runs where ``PACKER_CHECK_INSTALL_CUDA=1`` (.ci/run: after the
suite, through scripts/test.sh for its MongoDB servers). The venvs (~1 GB each, ~6 GB for cuda)
are removed when the check passes and kept when it fails.

Also: the torch / torchvision pairs the scripts install match, and install.sh says which Python
(and which site-packages) it installs into before it starts.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO

TIMEOUT_S = 2400
CUDA_TIMEOUT_S = 3600


def _check_install(stages: str, tmp_path: Path, timeout_s: int):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (check_install.sh copies the tracked files)")
    r = subprocess.run(["bash", str(REPO / "scripts" / "check_install.sh"), stages],
                       env={**os.environ, "CHECK_INSTALL_DIR": str(tmp_path)},
                       capture_output=True, text=True, timeout=timeout_s)
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"all stages passed ({stages})" in r.stderr
    # The venvs and the kernel cache go now (kept above for a failure's post-mortem).
    for path in tmp_path.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_pip_install_plain_editable_and_no_build_isolation(tmp_path):
    stages = os.environ.get("PACKER_CHECK_INSTALL_STAGES", "plain,editable,nbi")
    if stages == "none":
        pytest.skip("PACKER_CHECK_INSTALL_STAGES=none")
    _check_install(stages, tmp_path, TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.timeout(CUDA_TIMEOUT_S + 60)
def test_cuda_build_and_the_tests_that_need_torchvision(tmp_path):
    """check_install.sh's cuda stage: what CI keeps of the CUDA path while installing like a user
    without a GPU (the CUDA kernels compile with FORCE_CUDA=1; the torchvision and MDS tests run)."""
    if os.environ.get("PACKER_CHECK_INSTALL_CUDA") != "1":
        pytest.skip("the CUDA torch (5.5 GB), a CUDA compile and the torchvision tests: set "
                    "PACKER_CHECK_INSTALL_CUDA=1 (.ci/run does, after the suite)")
    _check_install("cuda", tmp_path, CUDA_TIMEOUT_S)


def test_the_scripts_pin_torchvision_builds_that_match_their_torch():
    """Each torch the scripts install comes with the torchvision built for it (PyTorch's rule,
    readers.targets.matching_torchvision): a mismatched pair fails to import ('operator
    torchvision::nms does not exist')."""
    from readers.targets import matching_torchvision

    pairs = []
    for script in ("install.sh", "check_install.sh"):
        text = (REPO / "scripts" / script).read_text()
        pairs += re.findall(r"torch==([\w.+]+)\s+torchvision==([\w.+]+)", text)
    assert len(pairs) >= 3, pairs   # install.sh: CUDA and CPU; check_install.sh: cuda stage
    for torch_v, tv in pairs:
        assert matching_torchvision(torch_v) == tv.split("+")[0], (torch_v, tv)
        assert torch_v.partition("+")[2] == tv.partition("+")[2], (torch_v, tv)   # same flavour


def _target_message(python: str) -> str:
    r = subprocess.run(["bash", "-c", 'source scripts/python_env.sh && install_target_message'], cwd=REPO,
                       env={**os.environ, "PYTHON": python}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_install_says_which_python_and_site_packages_it_installs_into(tmp_path):
    import sysconfig

    msg = _target_message(sys.executable)
    assert msg.startswith(f"installing into the Python at {sys.executable} ")
    assert sysconfig.get_paths()["purelib"] in msg
    if sys.prefix == sys.base_prefix:   # pyenv, conda, a system Python that is not externally managed
        assert "not a virtualenv" in msg or "conda environment" in msg
        assert "python3 -m venv .venv" in msg
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    msg = _target_message(str(venv / "bin" / "python"))
    assert msg.endswith(", a virtualenv") and str(venv) in msg, msg


def _picked_python(tmp_path, *, in_venv: bool) -> str:
    """The $PY that scripts/python_env.sh picks when the python3 first on PATH reports an
    externally managed (PEP 668) standard library, from a virtualenv or not (no VIRTUAL_ENV)."""
    marked = tmp_path / ("venv-lib" if in_venv else "sys-lib")
    marked.mkdir()
    (marked / "EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    bindir = tmp_path / ("venv-bin" if in_venv else "sys-bin")
    bindir.mkdir()
    pretend = "sys.base_prefix = '/base'" if in_venv else "sys.base_prefix = sys.prefix"
    shim = bindir / "python3"     # the real interpreter, reporting the marked stdlib and prefixes
    shim.write_text(f"""#!/bin/sh
[ "$1" = "-c" ] || exec {sys.executable} "$@"
exec {sys.executable} -c "import sys, sysconfig; sysconfig.get_path = lambda name: '{marked}'; {pretend}
exec(sys.argv[1])" "$2"
""")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}:{env['PATH']}"
    r = subprocess.run(["bash", "-c", 'source scripts/python_env.sh && echo "$PY"'], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_virtualenv_python_on_path_is_used_though_its_base_is_externally_managed(tmp_path):
    """PEP 668's marker applies to the base interpreter only: a virtualenv's python3 first on PATH
    (not activated: no VIRTUAL_ENV, as in a container image) is used as it is, where a system
    python3 with the marker sends install.sh to the repo's .venv (the GPU machine's image had
    s3_server.sh looking for moto in a .venv that did not exist)."""
    if (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("this checkout has a .venv, which python_env.sh prefers to either python3")
    assert _picked_python(tmp_path, in_venv=True) == "python3"
    assert _picked_python(tmp_path, in_venv=False) == str(REPO / ".venv" / "bin" / "python")


def test_install_sh_says_where_before_it_installs_anything():
    text = (REPO / "scripts" / "install.sh").read_text()
    assert text.index('log "$(install_target_message)"') < text.index("apt-get")
