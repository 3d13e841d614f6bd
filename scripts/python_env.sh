# Sourced by install.sh, demo.sh and test.sh: picks the Python that packer is installed into.
#   $PYTHON if set; else the repo's .venv if install.sh made one; else python3 — unless that
#   python is "externally managed" (PEP 668, e.g. Ubuntu 24.04's system python), in which case
#   install.sh makes .venv (with --system-site-packages, so an existing CUDA torch is reused).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x "$REPO_ROOT/.venv/bin/python" ]; then
    PY="$REPO_ROOT/.venv/bin/python"
elif [ -z "${VIRTUAL_ENV:-}" ] && python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)' 2>/dev/null; then
    PY="$REPO_ROOT/.venv/bin/python"
    PACKER_NEEDS_VENV=1
else
    PY="python3"
fi
