#!/usr/bin/env bash
# The whole test suite: starts the MongoDB-compatible test server, runs pytest with the server,
# the compiled gpu_ops extension and a headless chromium required (tests fail, not skip, without
# them), stops it.
# Extra arguments go to pytest. GPU tests skip without a GPU (scripts/gpu_check.sh runs them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python_env.sh
uri="$(bash scripts/mongo_server.sh start)"
trap 'bash scripts/mongo_server.sh stop' EXIT
export PACKER_TEST_MONGO_URI="$uri" PACKER_REQUIRE_MONGO=1 PACKER_GPU_OPS_STRICT=1
export PACKER_REQUIRE_BROWSER=1   # scripts/install.sh installs chromium
"$PY" -m pytest "$@"
