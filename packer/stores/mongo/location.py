"""Where a MongoDB store is: ``mongodb://[user:pass@]host[,host...]/DB/COLLECTION[?options]``
parsed (and checked) into a connection string, a database and a collection, with the password
kept out of every name, message and ``repr()``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from packer.core.errors import UsageError
from packer.core.uri import redact, redact_location

SCHEMES = ("mongodb://", "mongodb+srv://")
_DB_FORBIDDEN = set('/\\. "$\0')


@dataclass(frozen=True)
class MongoLocation:
    """A parsed store location. ``client_uri`` may hold a password; ``server``, ``name`` and
    ``repr()`` never do."""

    client_uri: str
    db: str
    collection: str

    @property
    def server(self) -> str:
        return redact(self.client_uri)

    @property
    def name(self) -> str:
        base = self.client_uri.split("?")[0].rstrip("/")
        return redact(f"{base}/{self.db}/{self.collection}")

    def __repr__(self) -> str:
        return f"MongoLocation({self.name!r})"


_ESCAPE_HINT = ("hint: percent-escape / @ : ? # % and spaces in the user name and password, "
                "e.g. with urllib.parse.quote_plus")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/?#@\[\],]+)(:\d{1,5})?")


def mongo_scheme(text: str) -> str | None:
    """The MongoDB scheme ``text`` starts with, lower-cased (a scheme is case-insensitive)."""
    head = text[:len("mongodb+srv://")].lower()
    return next((s for s in SCHEMES if head.startswith(s)), None)


def _check_netloc(netloc: str, shown: str) -> None:
    """UsageError unless ``netloc`` is ``[user[:password]@]host[:port][,host[:port]...]`` with the
    user name and password escaped: pymongo's own errors about a malformed one (a port that is
    not a number...) would repeat pieces of the password."""
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ("@" in userinfo or userinfo.count(":") > 1 or re.search(r"[\s/?#]|%(?![0-9A-Fa-f]{2})", userinfo)):
        raise UsageError(f"{shown}: the user name or password holds a character that must be escaped "
                         f"({_ESCAPE_HINT})")
    if hosts and not all(_HOST.fullmatch(h) for h in hosts.split(",")):
        raise UsageError(f"{shown}: cannot read the server list (expected host[:port][,host[:port]...]; "
                         f"{_ESCAPE_HINT})")


def parse_location(location: str, uri: str | None = None) -> MongoLocation:
    """Split ``mongodb://host/DB/COLLECTION[?opts]`` into a connection string, db and collection.

    ``uri`` (else ``$MONGODB_URI``) replaces the location's host, credentials and options. The
    scheme may be written in any case (``MongoDB://``). Messages show the location with its
    password masked (:func:`packer.core.uri.redact_location`), whatever their shape.

    Raises:
        UsageError: not a ``mongodb://`` URL, no ``/DB/COLLECTION``, no host anywhere, or a user
            name or password with an unescaped ``/ @ : ? #``, ``%`` or space.
    """
    location = str(location)
    shown = redact_location(location)
    scheme = mongo_scheme(location)
    if scheme is None:
        raise UsageError(f"{shown}: a MongoDB store location starts with mongodb:// or mongodb+srv://")
    rest = location[len(scheme):]
    netloc, slash, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    parts = [p for p in path.split("/") if p]
    if not slash or len(parts) != 2:
        hint = f"; {_ESCAPE_HINT}" if "@" in path else ""
        raise UsageError(f"{shown}: expected {scheme}host/DATABASE/COLLECTION "
                         f"(e.g. mongodb://127.0.0.1:27017/datasets/train{hint})")
    db, coll = parts
    if "@" in db:  # not shown: it is most likely the end of a password holding a "/"
        raise UsageError(f"{shown}: the database name holds '@' ({_ESCAPE_HINT})")
    if _DB_FORBIDDEN & set(db):
        raise UsageError(f"{shown}: database name {db!r} may not contain / \\ . space \" $")
    if "$" in coll or coll.startswith("system."):
        raise UsageError(f"{shown}: {coll!r} is not a usable collection name")
    _check_netloc(netloc, shown)
    uri = uri or os.environ.get("MONGODB_URI") or None
    if uri:
        uri_scheme = mongo_scheme(uri)
        if uri_scheme is None:
            raise UsageError(f"{redact_location(uri)}: a MongoDB connection string starts with mongodb:// "
                             f"or mongodb+srv:// (did you mean mongodb://{redact_location(uri)} ?)")
        uri_rest = uri[len(uri_scheme):]
        _check_netloc(re.split(r"[/?]", uri_rest, maxsplit=1)[0], redact_location(uri))
        client_uri = uri_scheme + uri_rest
    elif not netloc:
        raise UsageError(f"{shown}: no server given (put one in the location, or pass "
                         f"--uri / set MONGODB_URI)")
    else:
        client_uri = f"{scheme}{netloc}/" + (f"?{query}" if query else "")
    return MongoLocation(client_uri, db, coll)
