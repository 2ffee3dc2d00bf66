"""The drivers, one per backend (`base.py` says what a driver is), and the
registry that reaches them: `locate` chooses a queue's driver once, from the
`--db` value; `statements` gives the statements that differ for whatever
backend a connection belongs to (services hold only a Connection).

A driver is a plug-in. It builds on `db/` (the schema, prepared
statements, transactions, doctor's probes), and nothing below it depends on
one: this registry names each driver by its module, in the tables below, and
loads it only once it is chosen (`spoolctl add` on an SQLite file never
imports PostgreSQL's). Adding a backend is one driver module and its lines
in these tables.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection, Engine

from spoolctl.db.url import bad_url, looks_like_conninfo, looks_like_url, masked, scheme_of

if TYPE_CHECKING:
    from spoolctl.db.backends.base import Backend, ConninfoBackend, Driver, FileBackend, Statements

DRIVERS = {
    "sqlite": "spoolctl.db.backends.sqlite",
    "postgresql": "spoolctl.db.backends.postgresql",
}
"""Backend name (SQLAlchemy's dialect name) -> its driver module."""
SCHEMES = {
    "postgresql": "postgresql",
    "postgresql+psycopg": "postgresql",
    "postgres": "postgresql",
    "sqlite": "sqlite",
}
"""A URL's scheme -> the backend whose driver reads the URL and opens it."""
CONNINFO_BACKEND = "postgresql"
"""The backend of a libpq connection string (`host=h dbname=q`)."""
FILE_BACKEND = "sqlite"
"""The backend of a path: anything that does not look like a URL."""
_loaded: dict[str, Statements] = {}


def _driver_module(backend: str) -> object:
    return importlib.import_module(DRIVERS[backend])


def parse_db_url(text: str, source: str) -> tuple[str, str]:
    """A URL-like `--db` value (`db/url.py`'s `looks_like_url`): its backend
    and the location its driver reads from it (PostgreSQL: the URL in
    canonical form; SQLite: the file's path as written). Anything else is
    INVALID_INPUT naming what is wrong; nothing is created either way."""
    shown = masked(text)
    if looks_like_conninfo(text):
        reader = cast("ConninfoBackend", _driver_module(CONNINFO_BACKEND))
        return CONNINFO_BACKEND, reader.parse_conninfo(text, source, shown)
    if text != text.strip():
        raise bad_url(f"{source}: the database URL {shown!r} begins or ends with spaces", shown)
    scheme = scheme_of(text) or ""
    if scheme not in SCHEMES:
        raise bad_url(
            f"{source}: {shown!r} looks like a URL with scheme {scheme!r}, which spoolctl does "
            "not open; use postgresql://user@host/dbname, or a file path (write a relative "
            "path with a colon as ./name:with:colon)",
            shown,
            scheme=scheme,
        )
    if not text.lower().startswith(f"{scheme}://"):
        raise bad_url(f"{source}: {shown!r} is not a URL: write {scheme}://…", shown, scheme=scheme)
    backend = SCHEMES[scheme]
    return backend, cast("Backend", _driver_module(backend)).parse_url(text, source, shown)


def locate(given: str, base: Path, source: str) -> Driver:
    """The driver of a `--db` value (flag, environment or config file): a
    value that looks like a URL is parsed as one and never becomes a file
    path (`spoolctl.db.url`); anything else is an SQLite file, relative to
    `base`."""
    backend, location = FILE_BACKEND, given
    if looks_like_url(given):
        backend, location = parse_db_url(given, source)
    return cast("Backend", _driver_module(backend)).located(location, base, source)


def sqlite_at(path: Path) -> Driver:
    """The driver of an SQLite file named by a path (the default queue, tests)."""
    return cast("FileBackend", _driver_module(FILE_BACKEND)).at(path)


def statements(bind: Connection | Engine) -> Statements:
    """The statements whose SQL differs, for bind's backend (one dict lookup
    once its module is loaded)."""
    name = bind.dialect.name
    found = _loaded.get(name)
    if found is None:
        found = _loaded[name] = cast("Statements", _driver_module(name))
    return found
