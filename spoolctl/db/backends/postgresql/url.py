"""A PostgreSQL URL: checked with SQLAlchemy's `make_url` (the parser of the
library that opens it), handed to psycopg as keyword arguments (so no
reserved character of a password is read again by libpq), and scrubbed of
its secrets wherever a driver error could echo them.

Two forms SQLAlchemy cannot read are read by libpq's own parser (psycopg's
`conninfo_to_dict`) and rewritten as the URL SQLAlchemy opens the same way:
a connection string (`host=h dbname=q user=u`) and a URL listing several
hosts (`postgresql://u@h1:5432,h2:5432/q`). Several hosts go in the query,
`?host=h1,h2&port=5432,5432`, which SQLAlchemy's psycopg dialect hands to
libpq as they are; so does every other option (`target_session_attrs`)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from spoolctl.db.url import ENCODE_HINT, MASK, SECRET_QUERY_KEYS, bad_url, masked, parsed_url
from spoolctl.errors import ExtraMissing

PLAIN_HOST = re.compile(r"[A-Za-z0-9.\-_]+")
"""A host name or IPv4 address, which the URL's host field holds as it is."""
LIBPQ_FAULTS = (
    (
        "invalid connection option",
        "it names an option libpq does not know, or a value "
        "holding a space is not quoted (key='a b')",
    ),
    ("invalid URI query parameter", "its query names an option libpq does not know"),
    ("missing", "a word has no '=' after it (quote a value holding a space: key='a b')"),
    ("unterminated quoted string", "a quoted value is not closed"),
)
"""libpq's reason for a connection string it cannot parse -> ours. Its own
words quote fragments of the text, which may be pieces of a password."""


def parse_url(text: str, source: str, shown: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if text.count("@") > 1:
        raise bad_url(f"{source}: the URL {shown!r} has more than one '@'; {ENCODE_HINT}", shown)
    scheme, _, rest = text.partition("://")
    if "," in re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]:
        return _rewritten(
            _libpq_parse(f"postgresql://{rest}", source, shown), scheme, source, shown
        )
    try:
        url = make_url(text)
    except (ArgumentError, ValueError) as exc:
        problem = "its port is not a number" if isinstance(exc, ValueError) else "it is malformed"
        raise bad_url(
            f"{source}: the URL {shown!r} cannot be parsed: {problem}; {ENCODE_HINT}", shown
        ) from None
    if url.host is not None and not re.fullmatch(r"[A-Za-z0-9.\-_:%]+", url.host):
        raise bad_url(f"{source}: the URL {shown!r} names no valid host; {ENCODE_HINT}", shown)
    if url.port is not None and not 1 <= url.port <= 65535:
        raise bad_url(f"{source}: the URL {shown!r} has port {url.port}, not in 1..65535", shown)
    if not url.database:
        raise bad_url(f"{source}: the PostgreSQL URL {shown!r} names no database", shown)
    return str(url.render_as_string(hide_password=False))


def parse_conninfo(text: str, source: str, shown: str) -> str:
    """A libpq connection string (`host=h port=5432 dbname=q user=u`) as the
    PostgreSQL URL that connects the same way; INVALID_INPUT when libpq
    cannot parse it or it names no database, EXTRA_MISSING without psycopg."""
    return _rewritten(_libpq_parse(text, source, shown), "postgresql", source, shown)


def require_driver() -> None:
    """psycopg 3 is the optional `postgresql` extra: without it a PostgreSQL
    `--db` is EXTRA_MISSING, naming what to install."""
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        raise ExtraMissing(
            "--db names a PostgreSQL database, which needs psycopg 3 (the postgresql extra)",
            extra="postgresql",
        ) from None


def _libpq_parse(text: str, source: str, shown: str) -> dict[str, str]:
    require_driver()
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        found = conninfo_to_dict(text)
    except psycopg.Error as exc:
        words = str(exc)
        problem = next((ours for theirs, ours in LIBPQ_FAULTS if theirs in words), "malformed")
        raise bad_url(f"{source}: {shown!r} cannot be parsed by libpq: {problem}", shown) from None
    return {key: str(value) for key, value in found.items() if value is not None}


def _rewritten(params: dict[str, str], scheme: str, source: str, shown: str) -> str:
    """libpq's parameters as a URL SQLAlchemy opens with the same ones: one
    plain host in the URL's host and port; several (or a socket folder, an
    IPv6 address) in the query, with one port each."""
    from sqlalchemy.engine import URL

    options = dict(params)
    user, password = options.pop("user", None), options.pop("password", None)
    database = options.pop("dbname", None)
    if not database:
        raise bad_url(f"{source}: {shown!r} names no database: add dbname=NAME", shown)
    hosts = options.pop("host", "").split(",") if "host" in options else []
    ports = options.pop("port", "").split(",") if "port" in options else []
    ports = ports if any(ports) else []  # libpq's "," for two hosts without ports
    for port in ports:
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise bad_url(
                f"{source}: {shown!r} has port {port!r}, not a number in 1..65535", shown, port=port
            )
    if len(ports) > 1 and len(ports) != max(len(hosts), 1):
        raise bad_url(
            f"{source}: {shown!r} lists {len(hosts)} host(s) but {len(ports)} ports: "
            "give one port, or one per host",
            shown,
        )
    if len(ports) == 1 and len(hosts) > 1:
        ports = ports * len(hosts)
    host = port_number = None
    if len(hosts) == 1 and PLAIN_HOST.fullmatch(hosts[0]) and len(ports) <= 1:
        host, port_number = hosts[0], int(ports[0]) if ports and ports[0] else None
    else:
        options.update({"host": ",".join(hosts)} if hosts else {})
        options.update({"port": ",".join(ports)} if ports else {})
    url = URL.create(
        scheme,
        username=user,
        password=password,
        host=host,
        port=port_number,
        database=database,
        query=options,
    )
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
