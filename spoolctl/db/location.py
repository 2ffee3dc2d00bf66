"""Where the queue is: the value `db/where.py` finds by the documented
precedence, made its driver by the registry (`backends.locate`). Opens
nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spoolctl.config import DEFAULT_DB_RELPATH, ConfigFile, auto_migrate
from spoolctl.db.backends import locate, sqlite_at
from spoolctl.db.backends.base import Driver
from spoolctl.db.where import Named, config_named, named_db


@dataclass(frozen=True)
class DbLocation:
    """Where the queue is (its driver: an SQLite file or a PostgreSQL
    database), and which source said so."""

    driver: Driver
    source: str
    config: ConfigFile
    rule: str = "new_here"
    """Which rule chose it (`db/where.py`'s RULES)."""
    project: Path | None = None
    """The folder whose `.spoolctl/` was found; None: none was found."""

    @property
    def display(self) -> str:
        """How output names it: the path, or the URL with its password masked."""
        return self.driver.display


def resolve_db(flag: str | None, cwd: Path | None = None) -> DbLocation:
    """Find the database path by the documented precedence, once the
    environment every verb that opens a queue reads is valid (a bad value is
    refused before anything is opened); opens nothing."""
    auto_migrate()
    return locate_db(flag, cwd)


def locate_db(flag: str | None, cwd: Path | None = None) -> DbLocation:
    """The database path by the documented precedence, the environment's
    knobs unchecked (`doctor` reports those as a check of their own)."""
    return _located(named_db(flag, cwd))


def config_location(config: ConfigFile) -> DbLocation | None:
    """The queue a valid config file's db_path names, by the same rules as
    --db (a URL is parsed as one, relative paths are relative to the file's
    folder); None when it names none. Every verb and `config-validate` use it."""
    if not config.exists or "db_path" not in config.data:
        return None
    return _located(config_named(config))


def _located(named: Named) -> DbLocation:
    """The driver the value names (`backends.locate`: a URL is never taken
    for a file name); a relative path is relative to its base."""
    if named.given is None:
        driver = sqlite_at(named.base / DEFAULT_DB_RELPATH)
    else:
        driver = locate(named.given, named.base, named.named)
    return DbLocation(driver, named.source, named.config, named.rule, named.project)


def unnamed_new_queue(flag: str | None) -> Path | None:
    """The file `add` is about to create where nothing named the queue (no
    --db, SPOOLCTL_DB or db_path: a found or a new `.spoolctl/`), so that it
    can say where; None where the queue exists or was named."""
    named = named_db(flag)
    path = named.plain_file()
    if named.source != "default" or path is None or path.exists():
        return None
    return path
