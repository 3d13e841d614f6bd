"""Test helpers for object storage: the S3 test server, fresh buckets, and a fault-injecting proxy.

The server comes from ``scripts/s3_server.sh start`` (moto's standalone S3 server on loopback);
its URL is passed in ``PACKER_TEST_S3_ENDPOINT``. Without it, S3 tests skip, unless
``PACKER_REQUIRE_S3=1`` (CI, scripts/test.sh), where they fail.

:class:`FaultProxy` sits between the client and the server on another loopback port and, on
request, answers 503 SlowDown, resets the connection, cuts a body short, delays, or plays dead;
it also counts requests by kind (GET, PUT, LIST, HEAD...) for the cost figures.

Example (the ``s3`` fixture in tests/conftest.py)::

    def test_x(s3):
        s3.url("train/x.bin")          # s3://<fresh bucket>/train/x.bin, AWS_ENDPOINT_URL set
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import os
import socket
import threading
import uuid

import pytest

URL_ENV = "PACKER_TEST_S3_ENDPOINT"
REQUIRE_ENV = "PACKER_REQUIRE_S3"
_counter = itertools.count()
_RUN = uuid.uuid4().hex[:8]


def endpoint() -> str:
    """The test server's URL, or skip (fail where ``PACKER_REQUIRE_S3=1``) without one."""
    url = os.environ.get(URL_ENV)
    why = None
    if not url:
        why = f"{URL_ENV} is not set (start one with `export {URL_ENV}=$(bash scripts/s3_server.sh start)`)"
    else:
        try:
            import s3fs  # noqa: F401
        except ImportError:
            why = "s3fs is not installed (pip install 'packer-vision[s3]')"
    if why:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"S3 test server required ({REQUIRE_ENV}=1) but {why}", pytrace=False)
        pytest.skip(f"no S3 test server: {why}")
    return url


def new_bucket(endpoint_url: str) -> str:
    """A fresh, empty bucket on the server (a unique name per test)."""
    import boto3

    name = f"pk-{_RUN}-{next(_counter)}"
    boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=name)
    return name


class S3Bucket:
    """A fresh bucket for one test, reached through ``AWS_ENDPOINT_URL`` (the standard variable)."""

    def __init__(self, endpoint_url: str, bucket: str):
        self.endpoint = endpoint_url
        self.bucket = bucket

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def keys(self) -> list:
        out = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def get(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)


def s3_env(monkeypatch, endpoint_url: str) -> None:
    """Point every AWS client of this process (and its children) at ``endpoint_url``."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    _clear_fs_cache()


def options_from_env() -> dict:
    """fsspec ``storage_options`` that reach the test server as the environment does (a test
    then removes the environment, so only these options can)."""
    return {"endpoint_url": os.environ["AWS_ENDPOINT_URL"], "key": os.environ["AWS_ACCESS_KEY_ID"],
            "secret": os.environ["AWS_SECRET_ACCESS_KEY"]}


def spy_read_options(monkeypatch) -> list:
    """Record the ``storage_options`` of every ``packer.core.remote.read`` from now on."""
    from packer.core import remote

    seen, real = [], remote.read

    def spying(url, *a, **kw):
        seen.append(kw.get("storage_options"))
        return real(url, *a, **kw)
    monkeypatch.setattr(remote, "read", spying)
    return seen


def _clear_fs_cache() -> None:
    """Forget cached fsspec filesystems, so the next one reads the environment anew."""
    try:
        import s3fs
        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    """An HTTP proxy on loopback in front of the S3 server that can misbehave on request.

    ``fail(n, status=503)`` answers the next ``n`` requests with an S3 error (SlowDown);
    ``reset(n)`` closes the next ``n`` connections without an answer; ``cut(n)`` sends the next
    ``n`` GET bodies half long; ``delay(s)`` waits before each answer; ``down()``/``up()`` refuse
    every request (connection closed) until ``up()``. ``only`` limits a fault to one method
    (``"GET"``). ``counts`` counts requests by kind: GET, HEAD, PUT, POST, LIST, DELETE.
    """

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.counts = collections.Counter()
        self.bytes_out = 0
        self._faults = []          # [kind, remaining, method or None, arg]
        self._delay = 0.0
        self._down = False
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")

    # ---- faults
    def _add(self, kind, n, only, arg=None):
        with self._lock:
            self._faults.append([kind, n, only, arg])

    def fail(self, n: int = 1, status: int = 503, code: str = "SlowDown", only: str | None = None):
        self._add("fail", n, only, (status, code))

    def reset(self, n: int = 1, only: str | None = None):
        self._add("reset", n, only)

    def cut(self, n: int = 1, only: str | None = "GET"):
        self._add("cut", n, only)

    def delay(self, seconds: float):
        self._delay = seconds

    def down(self):
        self._down = True

    def up(self):
        self._down = False

    def _take(self, method: str):
        with self._lock:
            for f in self._faults:
                if f[1] > 0 and (f[2] is None or f[2] == method):
                    f[1] -= 1
                    return f[0], f[3]
        return None, None

    # ---- server
    def _run(self):
        from aiohttp import ClientSession, web

        asyncio.set_event_loop(self._loop)

        async def handle(request):
            kind = request.method
            if kind == "GET" and "/" not in request.path.strip("/"):
                kind = "LIST"      # path-style: GET /bucket?list-type=2&prefix=...
            self.counts[kind] += 1
            if self._down:
                request.transport.abort()
                raise web.HTTPServiceUnavailable     # never sent: the connection is gone
            fault, arg = self._take(request.method)
            if self._delay:
                await asyncio.sleep(self._delay)
            if fault == "reset":
                request.transport.abort()
                raise web.HTTPServiceUnavailable
            if fault == "fail":
                status, code = arg
                body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f'<Message>injected</Message></Error>')
                return web.Response(status=status, body=body.encode(), content_type="application/xml")
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with ClientSession(auto_decompress=False) as session:
                async with session.request(request.method, self.upstream + request.path_qs,
                                           headers=headers, data=body, allow_redirects=False) as up:
                    data = await up.read()
                    drop = ("transfer-encoding", "connection", "content-encoding")
                    if request.method != "HEAD":
                        drop += ("content-length",)
                    out_headers = {k: v for k, v in up.headers.items() if k.lower() not in drop}
                    if fault == "cut" and len(data) > 1:
                        resp = web.StreamResponse(status=up.status, headers=out_headers)
                        resp.content_length = len(data)
                        await resp.prepare(request)
                        await resp.write(data[: len(data) // 2])
                        request.transport.abort()
                        return resp
                    self.bytes_out += len(data)
                    return web.Response(status=up.status, body=data, headers=out_headers)

        app = web.Application(client_max_size=2**31)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()

    def close(self):
        async def stop():
            await self._runner.cleanup()
        fut = asyncio.run_coroutine_threadsafe(stop(), self._loop)
        try:
            fut.result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
