# Sourced by install.sh, demo.sh and test.sh: picks the Python that packer is installed into.
#   $PYTHON if set; else the repo's .venv if install.sh made one; else python3 — unless that
#   python is "externally managed" (PEP 668, e.g. Ubuntu 24.04's system python), in which case
#   install.sh makes .venv (with --system-site-packages, so an existing CUDA torch is reused).
#   A virtualenv's python3 first on PATH is used as it is, activated or not (PEP 668: the marker
#   of its base interpreter does not apply inside a virtualenv).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x "$REPO_ROOT/.venv/bin/python" ]; then
    PY="$REPO_ROOT/.venv/bin/python"
elif [ -z "${VIRTUAL_ENV:-}" ] && python3 -c 'import sys, sysconfig, os; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)' 2>/dev/null; then
    PY="$REPO_ROOT/.venv/bin/python"
    PACKER_NEEDS_VENV=1
else
    PY="python3"
fi

# One line saying where install.sh puts packages: a virtualenv, the .venv/ it is about to make, or
# (pyenv, conda, any Python that is neither externally managed nor a virtualenv) that interpreter's
# own site-packages, which a user should hear about before ~1.7 GB lands there.
install_target_message() {
    if [ -n "${PACKER_NEEDS_VENV:-}" ] && [ ! -x "$PY" ]; then
        echo "installing into $REPO_ROOT/.venv (made now: $(command -v python3) is externally managed, PEP 668)"
        return
    fi
    "$PY" - <<'PYEOF'
import os
import sys
import sysconfig

where = f"installing into the Python at {sys.executable} (packages: {sysconfig.get_paths()['purelib']})"
apart = "to keep them apart, make a virtualenv first (python3 -m venv .venv: install.sh then uses it)"
if sys.prefix != sys.base_prefix:
    print(f"{where}, a virtualenv")
elif os.environ.get("CONDA_PREFIX") == sys.prefix:
    print(f"{where}, the conda environment itself: torch and packer's dependencies (~1.7 GB with "
          f"the CPU torch, more with CUDA) go into it; {apart}")
else:
    print(f"{where}: not a virtualenv, so torch and packer's dependencies (~1.7 GB with the CPU torch, "
          f"more with CUDA) go into that interpreter's own site-packages; {apart}")
PYEOF
}
