#!/usr/bin/env bash
# The whole test suite: starts the MongoDB test servers (mongod 6.0.5: a standalone server and a
# one-member replica set), runs pytest with the servers, the compiled gpu_ops extension, the
# Dask cluster and a headless chromium required (tests fail, not skip, without them), stops the
# servers.
# Extra arguments go to pytest. GPU tests skip without a GPU (scripts/gpu_check.sh runs them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/python_env.sh
# Servers of this run only (free ports, their own folders): two runs on one machine (two
# checkouts, a CI box) neither collide nor stop each other's servers.
servers="$(mktemp -d "${TMPDIR:-/tmp}/packer-test-mongo.XXXXXX")"
stop_servers() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then   # what the servers logged, for a failure that involved them
        bash scripts/mongo_server.sh --dir "$servers/standalone" problems || true
        bash scripts/mongo_server.sh --dir "$servers/rs" problems || true
    fi
    bash scripts/mongo_server.sh --dir "$servers/standalone" stop || true
    bash scripts/mongo_server.sh --dir "$servers/rs" stop || true
    bash scripts/s3_server.sh --dir "$servers/s3" stop || true
    rm -rf "$servers"
}
trap stop_servers EXIT
uri="$(bash scripts/mongo_server.sh --dir "$servers/standalone" start)"
rs_uri="$(bash scripts/mongo_server.sh --dir "$servers/rs" start --replset 1)"
# The S3-compatible server of the object-storage tests (moto, on loopback; scripts/s3_server.sh).
s3_url="$(bash scripts/s3_server.sh --dir "$servers/s3" start)"
export PACKER_TEST_S3_ENDPOINT="$s3_url" PACKER_REQUIRE_S3=1
export PACKER_TEST_MONGO_URI="$uri" PACKER_REQUIRE_MONGO=1 \
       PACKER_TEST_MONGO_RS_URI="$rs_uri" PACKER_REQUIRE_MONGO_RS=1 \
       PACKER_REQUIRE_DASK=1 PACKER_GPU_OPS_STRICT=1
# packer's administrative MongoDB calls wait 60 s for a server instead of 10 (the product's
# default stays): a loaded 2-core machine once had the test server answer nothing for longer.
export PACKER_MONGO_TIMEOUT_MS="${PACKER_MONGO_TIMEOUT_MS:-60000}"
export PACKER_REQUIRE_BROWSER=1   # scripts/install.sh installs chromium
export PACKER_REQUIRE_INTERCHANGE=1   # webdataset, datasets, tfrecord: the [dev] extra
# mosaicml-streaming: installed where torchvision is (scripts/install.sh); it cannot import without
"$PY" -c 'import torchvision' 2>/dev/null && export PACKER_REQUIRE_MDS=1
# tests/packer/cli/test_full_disk.py mounts a 20 MiB tmpfs: required where that is allowed (root)
if [ "$(id -u)" -eq 0 ]; then export PACKER_REQUIRE_SMALLFS=1; fi
"$PY" -m pytest "$@"
