"""Small helpers for ``scripts/mongo_server.sh`` (free port, readiness ping, PID check).

Runs under the server's own virtual environment (``.venv-mongo``), whose pymongo comes with
SecantusDB, so the host Python needs nothing. Never imports the server itself.

Usage:
    python mongo_server_helper.py free-port
    python mongo_server_helper.py launch SECANTUSD RUNDIR PORT      # prints the PID
    python mongo_server_helper.py wait-ready URI TIMEOUT_S PID
    python mongo_server_helper.py is-server PID STORAGE_DIR
"""
from __future__ import annotations

import os
import socket
import sys
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(exe: str, rundir: str, port: int) -> int:
    """Start the server detached (own session, stdin closed, output to RUNDIR/server.log).

    The PID printed is the server's own: ``start_new_session`` never forks twice, unlike
    ``setsid`` in a shell that happens to have job control on.
    """
    import subprocess

    with open(os.path.join(rundir, "server.log"), "ab") as out:
        proc = subprocess.Popen(
            [exe, "--config", os.path.join(rundir, "secantusd.toml"), "--standalone",
             "--host", "127.0.0.1", "--port", str(port),
             "--storage-path", os.path.join(rundir, "data"), "--cache-size", "512M"],
            cwd=rundir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
    return proc.pid


def wait_ready(uri: str, timeout_s: float, pid: int) -> int:
    """Ping ``uri`` until it answers (0), the process dies (1) or ``timeout_s`` passes (1)."""
    import pymongo
    from pymongo.errors import PyMongoError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            print(f"server process {pid} exited before answering a ping", file=sys.stderr)
            return 1
        client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500)
        try:
            client.admin.command("ping")
            return 0
        except PyMongoError:
            time.sleep(0.2)
        finally:
            client.close()
    print(f"server at {uri} did not answer a ping within {timeout_s:.0f} s", file=sys.stderr)
    return 1


def is_server(pid: int, storage_dir: str) -> bool:
    """True when ``pid`` is a secantusd-py process serving ``storage_dir`` (guards the kill)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    args = [a.decode(errors="replace") for a in argv]
    if not any(a.endswith("secantusd-py") for a in args):
        return False
    try:
        i = args.index("--storage-path")
    except ValueError:
        return False
    return i + 1 < len(args) and os.path.realpath(args[i + 1]) == os.path.realpath(storage_dir)


def main(argv: list[str]) -> int:
    if argv[:1] == ["free-port"]:
        print(free_port())
        return 0
    if argv[:1] == ["launch"] and len(argv) == 4:
        print(launch(argv[1], argv[2], int(argv[3])))
        return 0
    if argv[:1] == ["wait-ready"] and len(argv) == 4:
        return wait_ready(argv[1], float(argv[2]), int(argv[3]))
    if argv[:1] == ["is-server"] and len(argv) == 3:
        return 0 if is_server(int(argv[1]), argv[2]) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
