"""What `--db` names: a path (SQLite) or a URL (PostgreSQL, or `sqlite:///PATH`).

A value that looks like a URL is parsed as one and never becomes a file name:
it has `://`, or it begins (after any spaces) with a scheme-like word and a
colon (`postgresql:`, `sqlite:`, `user:`), or with a known scheme and `//`.
A relative path with a colon in it stays usable as `./name:with:colon`.

URLs are parsed with SQLAlchemy's `make_url`, the parser of the library that
opens them. A password is never shown: every place that prints, logs or
records a URL uses `masked()`, which also masks a URL that cannot be parsed
(everything between `://` and the last `@`).
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import quote

from spoolctl.errors import InvalidInput

POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg", "postgres")
SQLITE_SCHEMES = ("sqlite",)
MASK = "***"
_SCHEME_WORD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.\-]*):")
_KNOWN_NO_COLON = re.compile(r"^\s*(postgres(?:ql)?(?:\+\w+)?|sqlite)//", re.IGNORECASE)
_SECRET_QUERY_KEYS = ("password", "passfile", "sslpassword")
ENCODE_HINT = (
    "percent-encode reserved characters in the user name and password "
    "(@ as %40, : as %3A, / as %2F, ? as %3F, # as %23, % as %25)"
)
Kind = Literal["postgresql", "sqlite"]


def looks_like_url(text: str) -> bool:
    """True for anything shaped like a URL (see the module docstring)."""
    return "://" in text or bool(_SCHEME_WORD.match(text) or _KNOWN_NO_COLON.match(text))


def scheme_of(text: str) -> str | None:
    """The scheme-like word a URL-like value starts with (lowercase)."""
    match = _SCHEME_WORD.match(text) or _KNOWN_NO_COLON.match(text)
    if match is None:
        return text.split("://", 1)[0].strip().lower() or None
    return match.group(1).lower()


def parse_db_url(text: str, source: str) -> tuple[Kind, str]:
    """A URL-like `--db` value: ("postgresql", the URL in canonical form) or
    ("sqlite", the file's path as written). Anything else is INVALID_INPUT
    naming what is wrong; nothing is created either way."""
    shown = masked(text)
    if text != text.strip():
        raise _bad(f"{source}: the database URL {shown!r} begins or ends with spaces", shown)
    scheme = scheme_of(text) or ""
    if scheme not in POSTGRES_SCHEMES + SQLITE_SCHEMES:
        raise _bad(
            f"{source}: {shown!r} looks like a URL with scheme {scheme!r}, which spoolctl does "
            "not open; use postgresql://user@host/dbname, or a file path (write a relative "
            "path with a colon as ./name:with:colon)",
            shown,
            scheme=scheme,
        )
    if not text.lower().startswith(f"{scheme}://"):
        raise _bad(f"{source}: {shown!r} is not a URL: write {scheme}://…", shown, scheme=scheme)
    if scheme in SQLITE_SCHEMES:
        return "sqlite", _sqlite_path(text, source, shown)
    return "postgresql", _postgres_url(text, source, shown)


def _postgres_url(text: str, source: str, shown: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if text.count("@") > 1:
        raise _bad(f"{source}: the URL {shown!r} has more than one '@'; {ENCODE_HINT}", shown)
    try:
        url = make_url(text)
    except (ArgumentError, ValueError) as exc:
        problem = "its port is not a number" if isinstance(exc, ValueError) else "it is malformed"
        raise _bad(f"{source}: the URL {shown!r} cannot be parsed: {problem}; {ENCODE_HINT}",
                   shown) from None  # fmt: skip
    if url.host is not None and not re.fullmatch(r"[A-Za-z0-9.\-_:%]+", url.host):
        raise _bad(f"{source}: the URL {shown!r} names no valid host; {ENCODE_HINT}", shown)
    if url.port is not None and not 1 <= url.port <= 65535:
        raise _bad(f"{source}: the URL {shown!r} has port {url.port}, not in 1..65535", shown)
    if not url.database:
        raise _bad(f"{source}: the PostgreSQL URL {shown!r} names no database", shown)
    return str(url.render_as_string(hide_password=False))


def _sqlite_path(text: str, source: str, shown: str) -> str:
    """`sqlite:///relative/path` or `sqlite:////absolute/path`, nothing else."""
    rest = text[len("sqlite://") :]
    if not rest.startswith("/") or "?" in rest or "#" in rest:
        raise _bad(
            f"{source}: {shown!r}: an SQLite URL is sqlite:///PATH (three slashes, then the "
            "file; four for an absolute path), with no host and no options",
            shown,
        )
    path = rest[1:]
    if not path or path == ":memory:":
        raise _bad(f"{source}: {shown!r} names no file: a queue lives in a file", shown)
    return path


def _bad(message: str, shown: str, **detail: Any) -> InvalidInput:
    return InvalidInput(message, db=shown, **detail)


def masked(url: str) -> str:
    """The URL with its password (and any secret query option) replaced by
    ***; a URL that cannot be parsed unambiguously has everything between
    `://` (or the scheme's colon) and its last `@` masked."""
    if "@" not in url and "password" not in url.lower():
        return url
    parsed = _parsed(url)
    if parsed is None:
        return _masked_roughly(url)
    if any(key.lower() in _SECRET_QUERY_KEYS for key in parsed.query):
        parsed = parsed.update_query_dict(
            {key: MASK for key in parsed.query if key.lower() in _SECRET_QUERY_KEYS}
        )
    shown = str(parsed.render_as_string(hide_password=True))
    return shown.replace(quote(MASK, safe=""), MASK)


def _parsed(url: str) -> Any:
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


def _masked_roughly(url: str) -> str:
    if "@" not in url:
        return url
    head, sep, _ = url.partition("://")
    if not sep:
        match = _SCHEME_WORD.match(url) or _KNOWN_NO_COLON.match(url)
        if match is None:
            return MASK + url[url.rindex("@") :]
        head, sep = url[: match.end()], ""
    return f"{head}{sep}{MASK}{url[url.rindex('@') :]}"


def driver_url(url: str) -> Any:
    """The SQLAlchemy URL object that opens the queue: always psycopg 3."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql+psycopg")


def connect_kwargs(url: str) -> dict[str, Any]:
    """psycopg.connect() keyword arguments for url (no string for libpq to
    parse again, so a password's reserved characters need no encoding)."""
    parsed = driver_url(url)
    given = {
        "user": parsed.username,
        "password": parsed.password,
        "host": parsed.host,
        "port": parsed.port,
        "dbname": parsed.database,
    }
    options = {key: value for key, value in parsed.query.items() if isinstance(value, str)}
    return {**{key: value for key, value in given.items() if value is not None}, **options}


def secrets_of(url: str) -> set[str]:
    """Every secret a URL holds (its password, secret query options), as
    written and decoded: what `scrub` removes from error texts."""
    parsed = _parsed(url)
    found: set[str] = set()
    if parsed is None:
        head, sep, _ = url.partition("://")
        if sep and "@" in url:
            found.add(url[len(head) + 3 : url.rindex("@")])
    else:
        found.add(str(parsed.password or ""))
        found |= {
            str(value) for key, value in parsed.query.items() if key.lower() in _SECRET_QUERY_KEYS
        }
    for secret in list(found):
        found.add(quote(secret, safe=""))
    return {secret for secret in found if secret}


def scrub(text: str, url: str) -> str:
    """text with the URL's secrets removed wherever they appear (driver errors
    may echo the connection string)."""
    text = text.replace(url, masked(url))
    for secret in sorted(secrets_of(url), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
