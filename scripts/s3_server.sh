#!/usr/bin/env bash
# Start and stop an S3-compatible server on loopback for the object-storage tests and benchmarks:
# moto's standalone server (moto[server], from PyPI; installed by the [dev] extra), in memory.
#
#   bash scripts/s3_server.sh [--dir DIR] start [PORT]   # prints the endpoint URL as its only stdout line
#   bash scripts/s3_server.sh [--dir DIR] stop           # stops it
#   bash scripts/s3_server.sh [--dir DIR] status         # prints the endpoint if it is running
#
# DIR (default: .s3 in the repo root, or $PACKER_S3_DIR) holds server.pid, server.url and the log.
# Clients reach it the usual way: AWS_ENDPOINT_URL=<printed URL> with any AWS_ACCESS_KEY_ID /
# AWS_SECRET_ACCESS_KEY (moto accepts every key).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/python_env.sh"
STATE_DIR="${PACKER_S3_DIR:-$REPO/.s3}"
if [[ "${1:-}" == "--dir" ]]; then STATE_DIR="$2"; shift 2; fi
CMD="${1:-}"; shift || true
PID_FILE="$STATE_DIR/server.pid"; URL_FILE="$STATE_DIR/server.url"; LOG="$STATE_DIR/server.log"
log() { echo "s3_server: $*" >&2; }
die() { log "$*"; exit 1; }
alive() { [[ -f "$PID_FILE" ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }

do_start() {
    alive && die "already running at $(cat "$URL_FILE") (pid $(cat "$PID_FILE")); 'stop' first or use --dir"
    mkdir -p "$STATE_DIR"
    "$PY" -c 'import moto.server' 2>/dev/null || die "moto's server is not installed: pip install 'moto[server]' (the [dev] extra)"
    local port="${1:-}"
    [[ -n "$port" ]] || port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # setsid: the server is no child of the calling shell's job control; stop kills it by pid.
    setsid "$PY" -m moto.server -H 127.0.0.1 -p "$port" >"$LOG" 2>&1 < /dev/null &
    echo $! > "$PID_FILE"
    local url="http://127.0.0.1:$port" n=150
    until "$PY" - "$url" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1)
PY
    do
        alive || { cat "$LOG" >&2; die "moto server exited at start"; }
        n=$((n - 1)); [[ $n -gt 0 ]] || { do_stop; die "moto server did not answer within 30 s"; }
        sleep 0.2
    done
    echo "$url" > "$URL_FILE"
    log "moto S3 server pid $(cat "$PID_FILE") at $url"
    echo "$url"
}

do_stop() {
    if alive; then
        local pid; pid="$(cat "$PID_FILE")"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        log "stopped pid $pid"
    fi
    rm -f "$PID_FILE" "$URL_FILE"
}

case "$CMD" in
    start) do_start "$@" ;;
    stop) do_stop ;;
    status) alive && cat "$URL_FILE" || { log "not running"; exit 1; } ;;
    *) sed -n '2,12p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
