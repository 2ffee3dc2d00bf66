"""What `--db` names: a path (SQLite), a URL (PostgreSQL, or
`sqlite:///PATH`), or a libpq connection string (PostgreSQL).

This module tells them apart by their shape and masks their secrets; which
driver reads a value is the driver registry's to say (`db/backends`: its
table of schemes, `parse_db_url`), and each scheme's own rules are that
driver's (`parse_url`, and PostgreSQL's `parse_conninfo`).

A value that looks like a URL is parsed as one and never becomes a file name:
it has `://`, or it begins (after any spaces) with a scheme-like word and a
colon (`postgresql:`, `sqlite:`, `user:`), or with a known scheme and `//`.
A relative path with a colon in it stays usable as `./name:with:colon`.
Nor does a value that looks like a libpq connection string
(`host=db.example dbname=spool user=spool`): one that begins, after any
spaces, with a libpq keyword and `=`, or has one after a space, and is not
shaped like a URL (`looks_like_conninfo`). psycopg parses it (its
`conninfo_to_dict`, libpq's own parser): this module only recognizes it,
and never imports psycopg. A path of that shape is written `./host=x.db`.

URLs are parsed with SQLAlchemy's `make_url`, the parser of the library that
opens them. A password is never shown: every place that prints, logs or
records a URL uses `masked()`, which also masks a URL that cannot be parsed
(everything from the end of its scheme to its last `@`, and the values of
secret query options) and the secret values of a connection string.

The patterns are compiled on first use (re's cache): a plain path, the
lean path's everyday value, is told apart without compiling any.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from spoolctl.errors import InvalidInput

MASK = "***"
_SCHEME_WORD = r"^\s*([A-Za-z][A-Za-z0-9+.\-]*):"
_KNOWN_NO_COLON = r"(?i)^\s*(postgres(?:ql)?(?:\+\w+)?|sqlite)//"
SECRET_QUERY_KEYS = ("password", "passfile", "sslpassword")
_SECRET_VALUE = r"(?i)(?:^|[?&;])\s*(?:" + "|".join(SECRET_QUERY_KEYS) + r")\s*=([^&;#]*)"
ENCODE_HINT = (
    "percent-encode reserved characters in the user name and password "
    "(@ as %40, : as %3A, / as %2F, ? as %3F, # as %23, % as %25)"
)
LIBPQ_KEYWORDS = (
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "service",
    "options",
    "application_name",
    "fallback_application_name",
    "connect_timeout",
    "client_encoding",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "target_session_attrs",
    "load_balance_hosts",
    "sslmode",
    "sslnegotiation",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "require_auth",
    "channel_binding",
    "gssencmode",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "min_protocol_version",
    "max_protocol_version",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
)
"""libpq's connection keywords: one of them followed by `=` marks a
connection string (which keywords psycopg accepts is psycopg's to say)."""
_KEYWORD = "(?:" + "|".join(LIBPQ_KEYWORDS) + ")"
_CONNINFO_START = rf"(?i)^\s*{_KEYWORD}\s*="
_CONNINFO_KEY = rf"(?i)(?:^|\s){_KEYWORD}\s*="
_CONNINFO_SECRET = (
    r"(?i)(?:^|\s)(?:" + "|".join(SECRET_QUERY_KEYS) + r")\s*=\s*"
    r"('(?:\\[\s\S]|[^'\\])*(?:'|\\?\Z)"
    r"|(?:\\[\s\S]|[^\\])*?(?:\\?\Z|(?=\s+" + _KEYWORD + r"\s*=)|(?=\s*\Z)))"
)
"""A secret's value in a connection string: a quoted value to its closing
quote (or the end, if it has none); an unquoted one up to the next libpq
keyword and `=`, so a value holding an unquoted space is masked whole."""


def looks_like_url(text: str) -> bool:
    """True for anything shaped like a URL or a libpq connection string (see
    the module docstring): a location on a server or a URL, never a file."""
    return _url_shaped(text) or looks_like_conninfo(text)


def looks_like_conninfo(text: str) -> bool:
    """True for a libpq connection string: it begins with a libpq keyword and
    `=`, or is not shaped like a URL and has one after a space."""
    if "=" not in text:
        return False  # a plain path: its patterns need not even be compiled
    if re.match(_CONNINFO_START, text):
        return True
    return not _url_shaped(text) and bool(re.search(_CONNINFO_KEY, text))


def _url_shaped(text: str) -> bool:
    if ":" not in text and "//" not in text:
        return False  # a plain path
    return "://" in text or bool(re.match(_SCHEME_WORD, text) or re.match(_KNOWN_NO_COLON, text))


def scheme_of(text: str) -> str | None:
    """The scheme-like word a URL-like value starts with (lowercase)."""
    match = re.match(_SCHEME_WORD, text) or re.match(_KNOWN_NO_COLON, text)
    if match is None:
        return text.split("://", 1)[0].strip().lower() or None
    return match.group(1).lower()


def bad_url(message: str, shown: str, **detail: Any) -> InvalidInput:
    return InvalidInput(message, db=shown, **detail)


def masked(url: str) -> str:
    """The URL with its password (and any secret query option) replaced by
    ***; a URL that cannot be parsed unambiguously is masked roughly
    (`_masked_roughly`: from the end of its scheme to its last `@`, and every
    secret query option's value). A connection string's secret values are
    masked first (`key=value` after a space or at the start, as libpq reads
    them), whatever else the text is."""
    secret_keys = any(key in url.lower() for key in SECRET_QUERY_KEYS)
    if secret_keys:
        url = _masked_conninfo(url)
    if ("@" not in url and not secret_keys) or looks_like_conninfo(url):
        return url
    parsed = parsed_url(url)
    if parsed is None:
        return _masked_roughly(url)
    if any(key.lower() in SECRET_QUERY_KEYS for key in parsed.query):
        parsed = parsed.update_query_dict(
            {key: MASK for key in parsed.query if key.lower() in SECRET_QUERY_KEYS}
        )
    shown = str(parsed.render_as_string(hide_password=True))
    return shown.replace(quote(MASK, safe=""), MASK)


def parsed_url(url: str) -> Any:
    """SQLAlchemy's reading of url, or None where it cannot be trusted to
    find the password (unparseable, or more than one '@')."""
    if url.count("@") > 1 or "://" not in url:
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        return None


def _masked_conninfo(text: str) -> str:
    """text with the value of every secret `key=value` of a connection
    string (password, passfile, sslpassword) replaced by ***."""
    shown, last = [], 0
    for found in re.finditer(_CONNINFO_SECRET, text):
        begin, end = found.span(1)
        shown.append(text[last:begin] + MASK)
        last = end
    return "".join(shown) + text[last:]


def _masked_roughly(url: str) -> str:
    """Mask, in a URL no parser could read, everything that may be a secret:
    from the end of its scheme (and slashes) to its last '@', and the value
    of every secret query option to the next '&', ';' or '#'. Each is found
    in the text as written and the two are masked together, so a password
    holding '://', '@' or '?password=' leaks none of its characters."""
    secret: list[tuple[int, int]] = []
    at = url.rfind("@")
    if at >= 0:
        match = re.match(_SCHEME_WORD, url) or re.match(_KNOWN_NO_COLON, url)
        start = 0 if match is None else match.end()
        while start < at and url[start] == "/":
            start += 1
        secret.append((start, at))
    secret.extend(found.span(1) for found in re.finditer(_SECRET_VALUE, url))
    shown, last = [], 0
    for begin, end in sorted(secret):
        if begin > last:
            shown.append(url[last:begin])
        if end > last:
            shown.append(MASK if begin >= last else "")
            last = end
    return "".join(shown) + url[last:]
