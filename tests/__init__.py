"""The test suite, one folder per package it tests: ``packer/<area>/`` (core, stores, jobs, sources,
labels, interchange, remote, cli), ``readers/`` (the GPU loader too), ``gpu_ops/``, and
``project/`` for whole-project checks (architecture, docs, install). The modules at this root
are what the tests share: fixtures (conftest.py), generated data, the test servers' helpers."""
from pathlib import Path

#: The repository's root, the checkout the tests run from (scripts/, docs/, setup.cfg, the packages).
REPO = Path(__file__).resolve().parent.parent
