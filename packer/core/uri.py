"""Passwords in connection strings, masked before anything is shown, logged, raised or written.

A server store's location may carry credentials (``mongodb://carol:S3cret@host/db/train``).
:func:`redact` is the one place that masks them: every message, log line, report and file that
names a location goes through it (:class:`packer.core.errors.PackerError` applies it to its own
arguments). The user name stays, the password becomes ``***``: ``mongodb://carol:***@host/db/train``.

It works on any text, not only on a well-formed URL, because what must be masked is most often
what failed to parse:

* a URL of any scheme, in any case (``MongoDB://``), anywhere in the text;
* a password holding an unescaped ``/``, ``@``, ``:`` or space: everything between ``//`` and the
  last ``@`` before the host is user information;
* ``user:password@host/...``, ``user:password@host:port`` or ``user:password@host`` written
  without a scheme, alone or followed by a query, a quote or trailing text (``...:27017: bad``);
* a URL percent-encoded inside another (``mongodb%3A%2F%2Fcarol%3APASSWORD%40host``);
* query options that hold a secret (``tlsCertificateKeyFilePassword=...``, ``X-Amz-Signature=``,
  ``sig=``, ``...token=``) and MongoDB's ``AWS_SESSION_TOKEN:...`` property.

:func:`redact_location` masks a text known to be one location (a password holding a space
included); :func:`redact_values` masks every string inside a report's lists and dicts.

When in doubt it masks too much rather than too little (a collection name holding ``@`` on a
server named with a port may come out shortened); it never leaves a password in clear.

Example:
    >>> redact("mongodb://carol:S3cret@db1:27017/data/train?authSource=admin")
    'mongodb://carol:***@db1:27017/data/train?authSource=admin'
    >>> redact("error: mongodb://carol:S3c/ret@db1/data/train: expected host/DATABASE/COLLECTION")
    'error: mongodb://carol:***@db1/data/train: expected host/DATABASE/COLLECTION'
    >>> redact("carol:S3cret@db1:27017/data/train: no such file or folder")
    'carol:***@db1:27017/data/train: no such file or folder'
"""
from __future__ import annotations

import re

__all__ = ["redact", "redact_location", "redact_values", "MASK"]

#: What a password is replaced with.
MASK = "***"

# "scheme://" not preceded by a scheme character (so "xmongodb://" is one scheme, not "mongodb://").
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://")
# A host after "@": a name or an address ([IPv6] too), an optional port, then the end of the
# text, a path, a query, a list separator, a quote, a bracket, whitespace or trailing ": ...".
_HOST = r"(?:\[[0-9A-Fa-f:.]*\]|[A-Za-z0-9_.%\-]+)(?::\d*)?(?:[/?,;:'\")\]>\s]|$)"
# "user:password@host..." with no scheme, at the start of a word: greedy up to the last "@"
# that is followed by a host (with or without a "/db/collection" after it).
_BARE = re.compile(r"(?:^|(?<=[\s'\"(\[=,<]))([^\s'\"/:@]+):(?!//)\S*@(?=[^\s/@]+/|" + _HOST + ")")
_WORD = re.compile(r"\S*")
_HOST_AFTER = re.compile(_HOST)
# A query option whose name says it holds a secret (a password, a token, a signed URL's signature).
_SECRET_OPTION = re.compile(r"(?i)([?&;](?:[^=&;\s]*(?:password|passwd|pwd|secret|token|signature|credential|"
                            r"api_?key|access_?key)[^=&;\s]*|sig)=)[^&;\s]*")
# MongoDB's AWS authentication carries its session token inside authMechanismProperties.
_SESSION_TOKEN = re.compile(r"(?i)(AWS_SESSION_TOKEN:)[^&,;\s]*")
# A whole URL percent-encoded inside another one (a redirect, a query value):
# "mongodb%3A%2F%2Fcarol%3APASSWORD%40host".
_ENCODED_USERINFO = re.compile(r"(?i)(%2F%2F[^\s%:@/]+%3A)\S*?(?=%40)")


def redact(text) -> str:
    """``text`` (or ``str(text)``) with every password in it replaced by :data:`MASK`.

    Args:
        text: a location, a connection string, or any message that may contain one.

    Returns:
        The same text with each ``user:password@`` written ``user:***@``; text without
        credentials comes back unchanged.
    """
    text = text if isinstance(text, str) else str(text)
    if "@" in text:
        text = _BARE.sub(lambda m: f"{m.group(1)}:{MASK}@", _mask_urls(text))
    if "=" in text:
        text = _SECRET_OPTION.sub(lambda m: m.group(1) + MASK, text)
    if ":" in text:
        text = _SESSION_TOKEN.sub(lambda m: m.group(1) + MASK, text)
    if "%" in text:
        text = _ENCODED_USERINFO.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact_location(location) -> str:
    """``location``, a text known to be one location or connection string and nothing else,
    with everything between its user name and the ``@`` before its host masked.

    Stricter than :func:`redact`, which must find a password inside any message: here the
    whole text is the location, so a password holding a space (``carol:S3 cret@db1``), with or
    without a scheme, is masked whole. Text with no user information goes through :func:`redact`.

    Example:
        >>> redact_location("carol:S3 cret@db1:27017")
        'carol:***@db1:27017'
    """
    text = location if isinstance(location, str) else str(location)
    m = _SCHEME.match(text)
    start = m.end() if m else 0
    ats = [i for i in range(len(text) - 1, start - 1, -1) if text[i] == "@" and _HOST_AFTER.match(text, i + 1)]
    if not ats or ":" not in text[start:ats[0]]:
        return redact(text)
    user = text[start:ats[0]].split(":", 1)[0]
    return text[:start] + user + ":" + MASK + redact(text[ats[0]:])


def redact_values(value):
    """``value`` with :func:`redact` applied to every string in it, through lists, tuples and
    dicts (keys too); anything else comes back as it is. What a report is made of.

    Example:
        >>> redact_values({"shards": ["mongodb://carol:S3cret@db1/d/a"], "records": 3})
        {'shards': ['mongodb://carol:***@db1/d/a'], 'records': 3}
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_values(k): redact_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_values(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(redact_values(v) for v in value)
    return value


def _mask_urls(text: str) -> str:
    out, done = [], 0
    for m in _SCHEME.finditer(text):
        start = m.end()
        if m.start() < done:
            continue  # inside user information already masked
        at = _userinfo_end(text, start)
        if at < 0:
            continue
        userinfo = text[start:at]
        if ":" not in userinfo:
            continue  # a user name alone (X.509, Kerberos): no password
        out.append(text[done:start] + userinfo.split(":", 1)[0] + ":" + MASK)
        done = at
    out.append(text[done:])
    return "".join(out)


def _userinfo_end(text: str, start: int) -> int:
    """Index of the ``@`` that ends the user information of the URL whose authority starts at
    ``start``, or -1 when there is none.

    Within the URL (up to the next whitespace): the last ``@`` that still has a ``/`` after it
    (``/db/collection`` follows the host), else the last ``@``. A password with an unescaped
    space cuts that word short: ``user:pass word@host`` is recognised by the ``@`` after it.
    """
    end = _WORD.match(text, start).end()
    word = text[start:end]
    at = word.rfind("@", 0, max(word.rfind("/"), 0))
    if at < 0:
        at = word.rfind("@")
    if at >= 0:
        return start + at
    if ":" in word and "/" not in word:
        line_end = text.find("\n", end)
        at = text.find("@", end, len(text) if line_end < 0 else line_end)
        if at >= 0 and "/" not in text[end:at]:
            return at
    return -1
