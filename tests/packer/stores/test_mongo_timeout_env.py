"""``PACKER_MONGO_TIMEOUT_MS``: how long packer's administrative MongoDB calls wait for a server.

The product waits 10 s (``packer.stores.mongo.ASK_TIMEOUT_MS``); scripts/test.sh sets 60 s, so a
test server that a loaded machine stalls for longer does not turn a test red. Checked on the
clients packer makes (``connect=False``: no server needed); reads keep their own budget and a URI
that sets a timeout keeps it.
"""
from __future__ import annotations

import time

import pytest

pytest.importorskip("pymongo")

import packer.stores.mongo as mongo_store  # noqa: E402
from packer.core.errors import StoreError, UsageError  # noqa: E402
from packer.stores.mongo.connection import TIMEOUT_ENV, admin_timeout_ms  # noqa: E402
from packer.stores.mongo.location import parse_location  # noqa: E402
from packer.stores.mongo.reader import MongoReader  # noqa: E402
from tests import REPO, mongo_support  # noqa: E402

LOCATION = "mongodb://127.0.0.1:1/pk_timeout/coll"   # never contacted


def _ask_client(location: str = LOCATION):
    """The client ``_ask`` makes for an administrative call (the question hands it back)."""
    return mongo_store._ask(parse_location(location), "testing", lambda db, names: db.client)


def test_administrative_calls_wait_10_s_by_default(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    client = _ask_client()
    assert client.options.server_selection_timeout == mongo_store.ASK_TIMEOUT_MS / 1000 == 10.0
    assert client.options.pool_options.connect_timeout == 10.0


def test_the_variable_sets_their_server_selection_and_connect_timeout(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "45000")
    client = _ask_client()
    assert client.options.server_selection_timeout == 45.0
    assert client.options.pool_options.connect_timeout == 45.0
    assert mongo_support.client_for(LOCATION).options.server_selection_timeout == 45.0   # the tests' own


def test_a_timeout_in_the_uri_still_wins(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "45000")
    client = _ask_client(LOCATION + "?serverSelectionTimeoutMS=1500")
    assert client.options.server_selection_timeout == 1.5


@pytest.mark.timeout(60)
def test_reads_keep_their_own_budget(monkeypatch):
    """A read's server selection is its share of the read timeout, whatever the variable says: a
    dead server still fails a read within ``timeout``."""
    monkeypatch.setenv(TIMEOUT_ENV, "45000")
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"unreachable .*Timeout: 2\.0s"):
        MongoReader(parse_location(LOCATION), timeout_s=2.0, retries=0)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("value", ["soon", "0", "-5", "1.5"])
def test_a_bad_value_is_a_usage_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=f"{TIMEOUT_ENV} must be a positive number of milliseconds"):
        admin_timeout_ms(10_000)


def test_test_sh_sets_it():

    text = (REPO / "scripts" / "test.sh").read_text()
    assert f'export {TIMEOUT_ENV}="${{{TIMEOUT_ENV}:-60000}}"' in text
