"""A PostgreSQL URL: checked with SQLAlchemy's `make_url` (the parser of the
library that opens it), handed to psycopg as keyword arguments (so no
reserved character of a password is read again by libpq), and scrubbed of
its secrets wherever a driver error could echo them."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from spoolctl.db.url import ENCODE_HINT, MASK, SECRET_QUERY_KEYS, bad_url, masked, parsed_url


def parse_url(text: str, source: str, shown: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if text.count("@") > 1:
        raise bad_url(f"{source}: the URL {shown!r} has more than one '@'; {ENCODE_HINT}", shown)
    try:
        url = make_url(text)
    except (ArgumentError, ValueError) as exc:
        problem = "its port is not a number" if isinstance(exc, ValueError) else "it is malformed"
        raise bad_url(f"{source}: the URL {shown!r} cannot be parsed: {problem}; {ENCODE_HINT}",
                   shown) from None  # fmt: skip
    if url.host is not None and not re.fullmatch(r"[A-Za-z0-9.\-_:%]+", url.host):
        raise bad_url(f"{source}: the URL {shown!r} names no valid host; {ENCODE_HINT}", shown)
    if url.port is not None and not 1 <= url.port <= 65535:
        raise bad_url(f"{source}: the URL {shown!r} has port {url.port}, not in 1..65535", shown)
    if not url.database:
        raise bad_url(f"{source}: the PostgreSQL URL {shown!r} names no database", shown)
    return str(url.render_as_string(hide_password=False))


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
    parsed = parsed_url(url)
    found: set[str] = set()
    if parsed is None:
        head, sep, _ = url.partition("://")
        if sep and "@" in url:
            found.add(url[len(head) + 3 : url.rindex("@")])
    else:
        found.add(str(parsed.password or ""))
        found |= {
            str(value) for key, value in parsed.query.items() if key.lower() in SECRET_QUERY_KEYS
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
