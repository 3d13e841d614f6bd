"""The remote benchmark's kit on the GPU machine: scripts/remote_wheels.sh pins one version of each
package, and scripts/gpu_check.sh installs a kit carried in pieces only once every piece is there
and the joined pieces match SHA256SUMS (a kit of one tiny wheel here, in a checkout of its own, so
nothing lands in /tmp/packer_carry or /tmp/rkit_site); its remote stage is skipped without it."""
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import zipfile

import pytest

from tests import REPO

SCRIPT = REPO / "scripts" / "remote_wheels.sh"
CHECK = REPO / "scripts" / "gpu_check.sh"


def test_remote_wheels_pins_one_version_of_each_package():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    body = SCRIPT.read_text().split("PINS=(", 1)[1].split("\n)", 1)[0]
    pins = [w for line in body.splitlines() if not line.strip().startswith("#") for w in line.split()]
    names = [p.split("==")[0].lower().replace("_", "-") for p in pins]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.]*", p) for p in pins), pins
    assert len(names) == len(set(names)) == 33
    assert {"moto", "boto3", "s3fs", "fsspec", "awscli", "webdataset", "mosaicml-streaming", "litdata"} <= set(names)


def _wheel(path):
    """A pure-Python wheel of one module, ``rkit_probe``."""
    files = {"rkit_probe.py": "VALUE = 42\n",
             "rkit_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: rkit_probe\nVersion: 1.0\n",
             "rkit_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + "rkit_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in {**files, "rkit_probe-1.0.dist-info/RECORD": record}.items():
            z.writestr(n, text)


@pytest.fixture
def checkout(tmp_path):
    """A checkout holding gpu_check.sh and a kit as remote_wheels.sh packs it, in two pieces."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(CHECK, root / "scripts" / "gpu_check.sh")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels / "rkit_probe-1.0-py3-none-any.whl")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(wheels, arcname="wheels")
    data = buf.getvalue()
    kit = root / ".rkit"
    kit.mkdir()
    half = len(data) // 2
    (kit / "piece.00").write_bytes(data[:half])
    (kit / "piece.01").write_bytes(data[half:])
    (kit / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  rkit.tar\npieces 2\npython 3\n")
    return root


def _check(root, tmp_path, stages, **env):
    e = dict(os.environ, OUT=str(tmp_path / "out"), PACKER_CARRY=str(tmp_path / "carry"),
             RKIT_SITE=str(tmp_path / "site"), **env)
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), stages], env=e, cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.timeout(300)
def test_the_kit_is_installed_once_whole_and_hash_checked(checkout, tmp_path):
    piece = (checkout / ".rkit" / "piece.01").read_bytes()
    (checkout / ".rkit" / "piece.01").unlink()            # the first call: one piece of two
    out = _check(checkout, tmp_path, "carry")
    assert "remote kit: 1 of 2 pieces here" in out and not (tmp_path / "site").exists()

    (checkout / ".rkit" / "piece.01").write_bytes(piece[:-1] + bytes([piece[-1] ^ 1]))
    out = _check(checkout, tmp_path, "carry")            # a damaged piece
    assert "remote kit: the joined pieces failed their hash; not installed" in out
    assert not (tmp_path / "site").exists()

    (checkout / ".rkit" / "piece.01").write_bytes(piece)
    out = _check(checkout, tmp_path, "carry")
    assert "remote kit: 1 wheels installed into" in out
    site = tmp_path / "site"
    assert (site / "rkit_probe.py").read_text() == "VALUE = 42\n"
    assert (site / ".packer_rkit").read_text().strip() == hashlib.sha256(
        b"".join((tmp_path / "carry" / "rkit" / f"piece.0{i}").read_bytes() for i in (0, 1))).hexdigest()
    assert not (tmp_path / "carry" / "rkit" / "wheels").exists()   # the pieces only, never .rkit/wheels

    out = _check(checkout, tmp_path, "carry")            # a later call: installed already
    assert "remote kit:" not in out


def test_the_remote_stage_is_skipped_without_the_kit(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(CHECK, root / "scripts" / "gpu_check.sh")
    out = _check(root, tmp_path, "remote")
    assert "=== remote skipped: the remote kit is not installed here (scripts/remote_wheels.sh" in out
    assert "remote" not in re.search(r"^STAGES=\$\{1:-([^}]*)\}", CHECK.read_text(), re.M).group(1)


@pytest.mark.timeout(300)
def test_dali_pieces_are_checked_by_the_same_rule(tmp_path):
    """DALI's pieces go through the same check as the remote kit's (gpu_check.sh's pieces_whole):
    a missing piece and a damaged one each say so, and nothing is unpacked."""
    if os.path.exists("/tmp/dali_site"):
        pytest.skip("/tmp/dali_site exists here: gpu_check.sh would skip DALI's pieces")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(CHECK, root / "scripts" / "gpu_check.sh")
    data = os.urandom(4096)
    dali = root / ".dali"
    dali.mkdir()
    (dali / "piece.00").write_bytes(data[:2048])
    (dali / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  dali.tar.xz\npieces 2\npython 3\n")
    assert "DALI: 1 of 2 pieces here (carry the rest, one a call); not installed" in _check(root, tmp_path, "carry")
    (dali / "piece.01").write_bytes(data[2048:-1] + bytes([data[-1] ^ 1]))
    assert "DALI: the joined pieces failed their hash; not installed" in _check(root, tmp_path, "carry")
    assert not os.path.exists("/tmp/dali_site") and not os.path.exists("/tmp/dali_site.part")
