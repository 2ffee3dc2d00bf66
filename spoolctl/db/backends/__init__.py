"""The drivers, one per backend (`base.py` says what a driver is), and the
two ways in: `locate` chooses a queue's driver once, from the `--db` value;
`statements` gives the statements that differ for whatever backend a
connection belongs to (services hold only a Connection).

A driver module is imported only when it is chosen: `spoolctl add` on an
SQLite file never imports PostgreSQL's.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection, Engine

from spoolctl.db.url import looks_like_url, parse_db_url

if TYPE_CHECKING:
    from spoolctl.db.backends.base import Driver, Statements

MODULES = {
    "sqlite": "spoolctl.db.backends.sqlite",
    "postgresql": "spoolctl.db.backends.postgresql",
}
"""Backend name (SQLAlchemy's dialect name) -> its driver module."""
_loaded: dict[str, Statements] = {}


def locate(given: str, base: Path, source: str) -> Driver:
    """The driver of a `--db` value (flag, environment or config file): a
    value that looks like a URL is parsed as one and never becomes a file
    path (`spoolctl.db.url`); anything else is an SQLite file, relative to
    `base`."""
    if looks_like_url(given):
        kind, value = parse_db_url(given, source)
        if kind == "postgresql":
            from spoolctl.db.backends.postgresql import PostgresDriver

            return PostgresDriver(value)
        given = value
    from spoolctl.db.backends.sqlite import SqliteDriver

    return SqliteDriver.located(_absolute(Path(given), base), source)


def sqlite_at(path: Path) -> Driver:
    """The driver of an SQLite file named by a path (the default queue, tests)."""
    from spoolctl.db.backends.sqlite import SqliteDriver

    return SqliteDriver(path)


def _absolute(path: Path, base: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else base / path


def statements(bind: Connection | Engine) -> Statements:
    """The statements whose SQL differs, for bind's backend (one dict lookup
    once its module is loaded)."""
    name = bind.dialect.name
    found = _loaded.get(name)
    if found is None:
        found = _loaded[name] = cast("Statements", importlib.import_module(MODULES[name]))
    return found
