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
* ``user:password@host/...`` written without a scheme;
* query options that hold a secret (``tlsCertificateKeyFilePassword=...``).

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

__all__ = ["redact", "MASK"]

#: What a password is replaced with.
MASK = "***"

# "scheme://" not preceded by a scheme character (so "xmongodb://" is one scheme, not "mongodb://").
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://")
# "user:password@host/" with no scheme, at the start of a word: greedy up to the last "@"
# that is followed by a host and a "/".
_BARE = re.compile(r"(?:^|(?<=[\s'\"(\[=,]))([^\s'\"/:@]+):(?!//)\S*@(?=[^\s/@]+/)")
_WORD = re.compile(r"\S*")
# A query option whose name says it holds a secret.
_SECRET_OPTION = re.compile(r"(?i)([?&;][^=&;\s]*(?:password|secret|token)[^=&;\s]*=)[^&;\s]*")


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
    return text


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
