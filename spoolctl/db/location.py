"""Where the queue is: the `--db` flag, else `SPOOLCTL_DB`, else `db_path`
in `.spoolctl/config.json` of the current directory, else
`./.spoolctl/queue.db`; each value made its driver by the registry
(`backends.locate`). Opens nothing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spoolctl.config import (
    CONFIG_RELPATH,
    DEFAULT_DB_RELPATH,
    ConfigFile,
    auto_migrate,
    read_config,
)
from spoolctl.db.backends import locate, sqlite_at
from spoolctl.db.backends.base import Driver
from spoolctl.errors import InvalidInput


@dataclass(frozen=True)
class DbLocation:
    """Where the queue is (its driver: an SQLite file or a PostgreSQL
    database), and which source said so."""

    driver: Driver
    source: str
    config: ConfigFile

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
    base = cwd or Path.cwd()
    config = read_config(base / CONFIG_RELPATH)
    if config.exists and not config.valid:  # reported even when --db or the env decides
        raise InvalidInput(
            f"config file {config.path} is invalid: {'; '.join(config.problems)}",
            config_path=str(config.path),
        )
    if flag is not None:
        return _located(flag, base, "flag", config, "--db")
    env = os.environ.get("SPOOLCTL_DB")
    if env is not None:
        if not 1 <= len(env) <= 4096 or "\0" in env:
            raise InvalidInput("SPOOLCTL_DB must be a path of 1 to 4096 characters; unset it")
        return _located(env, base, "env", config, "SPOOLCTL_DB")
    named = config_location(config)
    if named is not None:
        return named
    return DbLocation(sqlite_at(base / DEFAULT_DB_RELPATH), "default", config)


def config_location(config: ConfigFile) -> DbLocation | None:
    """The queue a valid config file's db_path names, by the same rules as
    --db (a URL is parsed as one, relative paths are relative to the file's
    folder); None when it names none. Every verb and `config-validate` use it."""
    if not config.exists or "db_path" not in config.data:
        return None
    given = config.data["db_path"]
    return _located(given, config.path.parent, "config", config, f"db_path in {config.path}")


def _located(given: str, base: Path, source: str, config: ConfigFile, named: str) -> DbLocation:
    """The driver the value names (`backends.locate`: a URL is never taken
    for a file name); a relative path is relative to `base`."""
    return DbLocation(locate(given, base, named), source, config)
