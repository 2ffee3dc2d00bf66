"""What `--db` names: a path (SQLite) or a `postgresql://` URL (PostgreSQL).

Imports nothing heavy: `add` resolves its database through here. A password
in a URL is never shown: every place that prints, logs or records a URL uses
`masked()`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

from spoolctl.errors import InvalidInput

POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg", "postgres")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
MASK = "***"


def is_url(text: str) -> bool:
    """Anything shaped `scheme://…` is a URL, never a file path."""
    return bool(_SCHEME.match(text))


def checked_postgres_url(text: str, source: str) -> str:
    """The URL if it names PostgreSQL; any other scheme is INVALID_INPUT."""
    scheme = text.split("://", 1)[0].lower()
    if scheme not in POSTGRES_SCHEMES:
        raise InvalidInput(
            f"{source}: unsupported database URL scheme {scheme!r}; use a file path (SQLite) "
            "or postgresql://user@host/dbname",
            db=masked(text),
            scheme=scheme,
        )
    parts = urlsplit(text)
    if not parts.path.strip("/"):
        raise InvalidInput(
            f"{source}: the PostgreSQL URL names no database: {masked(text)}", db=masked(text)
        )
    return text


def masked(url: str) -> str:
    """The URL with its password (if any) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    if parts.password is None and "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    netloc = f"{user}:{MASK}@{hostport}" if ":" in userinfo else f"{user}@{hostport}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def driver_url(url: str) -> str:
    """The SQLAlchemy URL: always the psycopg 3 driver."""
    _, rest = url.split("://", 1)
    return f"postgresql+psycopg://{rest}"


def scrub(text: str, url: str) -> str:
    """text with the URL's password removed wherever it appears (driver errors
    may echo the connection string)."""
    text = text.replace(url, masked(url))
    password = urlsplit(url).password
    for secret in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(str(secret), MASK)
    return text
