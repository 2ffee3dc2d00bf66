"""Which value names the queue, by the documented precedence: the `--db`
flag, else `SPOOLCTL_DB`, else `db_path` in `.spoolctl/config.json` of the
current directory, else `./.spoolctl/queue.db`. Light (no driver is
loaded): `db/location.py` makes the value a driver, and the lean path
(`db/lean.py`) takes a plain file path as it is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from spoolctl.config import CONFIG_RELPATH, DEFAULT_DB_RELPATH, ConfigFile, read_config
from spoolctl.db.url import looks_like_conninfo, looks_like_url
from spoolctl.errors import InvalidInput


class Named(NamedTuple):
    """The value that names the queue, and where it came from."""

    given: str | None
    """As written (a path or a URL); None: the default file."""
    base: Path
    """What a relative path is relative to."""
    source: str
    """flag, env, config or default."""
    named: str
    """How messages name the source (`--db`, `SPOOLCTL_DB`, `db_path in FILE`)."""
    config: ConfigFile

    def plain_file(self) -> Path | None:
        """The file a path names, taken as written (`~` expanded, relative to
        `base`); None for a URL or a libpq connection string."""
        if self.given is None:
            return self.base / DEFAULT_DB_RELPATH
        if looks_like_url(self.given) or looks_like_conninfo(self.given):
            return None
        path = Path(self.given).expanduser()
        return path if path.is_absolute() else self.base / path


def named_db(flag: str | None, cwd: Path | None = None) -> Named:
    """The value by the precedence; an invalid config file, or a bad
    SPOOLCTL_DB, is INVALID_INPUT (reported even when --db decides)."""
    base = cwd or Path.cwd()
    config = read_config(base / CONFIG_RELPATH)
    if config.exists and not config.valid:
        raise InvalidInput(
            f"config file {config.path} is invalid: {'; '.join(config.problems)}",
            config_path=str(config.path),
        )
    if flag is not None:
        return Named(flag, base, "flag", "--db", config)
    env = os.environ.get("SPOOLCTL_DB")
    if env is not None:
        if not 1 <= len(env) <= 4096 or "\0" in env:
            raise InvalidInput("SPOOLCTL_DB must be a path of 1 to 4096 characters; unset it")
        return Named(env, base, "env", "SPOOLCTL_DB", config)
    if config.exists and "db_path" in config.data:
        return config_named(config)
    return Named(None, base, "default", "default", config)


def config_named(config: ConfigFile) -> Named:
    """The value a valid config file's db_path gives (relative to its folder)."""
    given = config.data["db_path"]
    return Named(given, config.path.parent, "config", f"db_path in {config.path}", config)
