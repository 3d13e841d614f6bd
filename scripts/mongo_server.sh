#!/usr/bin/env bash
# Start and stop the MongoDB-compatible test server (SecantusDB) used by the Mongo tests.
#
#   bash scripts/mongo_server.sh [--dir DIR] install        # .venv-mongo with secantusdb (idempotent)
#   bash scripts/mongo_server.sh [--dir DIR] start [PORT]   # prints the URI as its only stdout line
#   bash scripts/mongo_server.sh [--dir DIR] stop           # kills the recorded PID, removes its data
#   bash scripts/mongo_server.sh [--dir DIR] status         # prints the URI if it is running
#
# DIR (default: .mongo in the repo root, or $PACKER_MONGO_DIR) holds server.pid, server.uri and
# one fresh run-*/ directory per start (data, log, config). Use another DIR for a second,
# independent server (the tests do, for the "server goes away" case).
#
# Why SecantusDB: no official mongod can be installed here; SecantusDB (GPL-2.0) speaks the
# MongoDB wire protocol over WiredTiger. It runs as a separate process from its own venv and
# is never imported or shipped by packer. --standalone keeps it from writing every change a
# second time into an oplog.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELPER="$REPO/scripts/mongo_server_helper.py"
VENV="$REPO/.venv-mongo"
PIN="secantusdb==0.7.0b3"
STATE_DIR="${PACKER_MONGO_DIR:-$REPO/.mongo}"
READY_TIMEOUT_S="${PACKER_MONGO_READY_TIMEOUT:-30}"

log() { echo "mongo_server: $*" >&2; }
die() { log "$*"; exit 1; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) STATE_DIR="$2"; shift 2 ;;
        --dir=*) STATE_DIR="${1#--dir=}"; shift ;;
        *) break ;;
    esac
done
CMD="${1:-}"; shift || true
mkdir -p "$STATE_DIR"
STATE_DIR="$(cd "$STATE_DIR" && pwd)"
PID_FILE="$STATE_DIR/server.pid"
URI_FILE="$STATE_DIR/server.uri"
RUN_FILE="$STATE_DIR/server.rundir"

installed() {
    [[ -x "$VENV/bin/secantusd-py" ]] &&
        "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('secantusdb') != '${PIN#*==}')" 2>/dev/null
}

do_install() {
    if installed; then
        return 0
    fi
    log "installing $PIN into $VENV"
    python3 -m venv "$VENV" >&2
    # --pre is implied by the exact pin; the server's own deps (pymongo, wiredtiger) come with it.
    "$VENV/bin/pip" install --quiet "$PIN" >&2 || die "pip install $PIN failed"
    installed || die "$PIN installed but secantusd-py is missing from $VENV/bin"
}

# Is the recorded PID alive and really our server on the recorded data dir?
recorded_server_alive() {
    [[ -f "$PID_FILE" && -f "$RUN_FILE" ]] || return 1
    python3 "$HELPER" is-server "$(cat "$PID_FILE")" "$(cat "$RUN_FILE")/data"
}

forget_run() {
    local rundir=""
    [[ -f "$RUN_FILE" ]] && rundir="$(cat "$RUN_FILE")"
    # Only ever delete a run directory this script made inside STATE_DIR.
    if [[ -n "$rundir" && "$rundir" == "$STATE_DIR"/run-* && -d "$rundir" ]]; then
        rm -rf -- "$rundir"
    fi
    rm -f -- "$PID_FILE" "$URI_FILE" "$RUN_FILE"
}

do_start() {
    local port="${1:-}"
    do_install
    if recorded_server_alive; then
        die "a server is already running at $(cat "$URI_FILE") (pid $(cat "$PID_FILE")); run 'stop' first or use --dir for another instance"
    fi
    [[ -f "$PID_FILE" ]] && { log "removing stale state of a server that is gone"; forget_run; }

    local attempts=1
    [[ -z "$port" ]] && attempts=3   # a picked free port can be taken before the server binds it
    local i rundir pid uri
    for ((i = 1; i <= attempts; i++)); do
        local p="$port"
        [[ -z "$p" ]] && p="$(python3 "$HELPER" free-port)"
        rundir="$STATE_DIR/run-$(date -u +%Y%m%dT%H%M%S)-$$-$i"
        mkdir -p "$rundir/data"
        : > "$rundir/secantusd.toml"   # explicit empty config: no ~/.secantus or /etc/secantus surprises
        uri="mongodb://127.0.0.1:$p"
        pid="$(python3 "$HELPER" launch "$VENV/bin/secantusd-py" "$rundir" "$p")"
        echo "$pid" > "$PID_FILE"
        echo "$uri" > "$URI_FILE"
        echo "$rundir" > "$RUN_FILE"
        if "$VENV/bin/python" "$HELPER" wait-ready "$uri" "$READY_TIMEOUT_S" "$pid"; then
            log "SecantusDB ${PIN#*==} pid $pid at $uri, data in $rundir"
            echo "$uri"
            return 0
        fi
        log "server did not start (attempt $i/$attempts); last lines of $rundir/server.log:"
        tail -n 20 "$rundir/server.log" >&2 || true
        if python3 "$HELPER" is-server "$pid" "$rundir/data"; then
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" 10 || true
        fi
        forget_run
    done
    die "could not start SecantusDB (see the log above)"
}

alive() {  # a zombie (exited, not yet reaped by init) counts as gone
    [[ -e "/proc/$1" ]] && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != "Z" ]]
}

wait_gone() {  # wait_gone PID SECONDS
    local pid="$1" n=$(( $2 * 10 ))
    while alive "$pid" && [[ $n -gt 0 ]]; do
        sleep 0.1; n=$((n - 1))
    done
    ! alive "$pid"
}

do_stop() {
    if [[ ! -f "$PID_FILE" ]]; then
        log "no server recorded in $STATE_DIR"
        return 0
    fi
    local pid; pid="$(cat "$PID_FILE")"
    if recorded_server_alive; then
        # SIGTERM lets WiredTiger write its final checkpoint; the data dir is removed only
        # after the process has exited (deleting it earlier panics the storage engine).
        kill -TERM "$pid"
        if ! wait_gone "$pid" 20; then
            log "pid $pid ignored SIGTERM for 20 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" 10 || die "pid $pid is still alive; leaving $STATE_DIR as it is"
        fi
        log "stopped pid $pid"
    else
        log "recorded pid $pid is not a running SecantusDB on this data dir; cleaning up only"
    fi
    forget_run
}

case "$CMD" in
    install) do_install ;;
    start) do_start "${1:-}" ;;
    stop) do_stop ;;
    status)
        if recorded_server_alive; then cat "$URI_FILE"; else log "not running"; exit 1; fi ;;
    *) sed -n '2,12p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
