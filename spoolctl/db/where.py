"""Which value names the queue, by the documented precedence: the `--db`
flag, else `SPOOLCTL_DB`, else `db_path` in the project's
`.spoolctl/config.json`, else the project's `.spoolctl/queue.db`. The
project is found as git finds its repository: the nearest folder, the
current one or one above it, that holds a `.spoolctl/` folder, never
crossing the file system's root or a mount point; where there is none, the
current folder (where `add` then creates the queue). Light (stdlib only, no
driver is loaded): `db/location.py` makes the value a driver, and the lean
path (`db/lean.py`) takes a plain file path as it is."""

from __future__ import annotations

import os
import stat as mode
from collections.abc import Callable
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
    rule: str = "new_here"
    """Which rule chose it (RULES): flag, env, config, found_here,
    found_above or new_here."""
    project: Path | None = None
    """The folder whose `.spoolctl/` was found; None: none was found."""

    def plain_file(self) -> Path | None:
        """The file a path names, taken as written (`~` expanded, relative to
        `base`); None for a URL or a libpq connection string."""
        if self.given is None:
            return self.base / DEFAULT_DB_RELPATH
        if looks_like_url(self.given) or looks_like_conninfo(self.given):
            return None
        path = Path(self.given).expanduser()
        return path if path.is_absolute() else self.base / path


RULES: dict[str, str] = {
    "flag": "the --db flag",
    "env": "SPOOLCTL_DB",
    "config": "db_path in the config file",
    "found_here": "the .spoolctl folder in the current folder",
    "found_above": "the nearest .spoolctl folder above the current folder",
    "new_here": "no .spoolctl folder here or above: a new queue in the current folder",
}
"""Which rule chose the queue, by name, in the order they are tried."""

PROJECT_DIR = ".spoolctl"

CEILING_ENV = "SPOOLCTL_CEILING_DIRECTORIES"
"""Absolute folders, `:`-separated, the search never climbs into (as git's
GIT_CEILING_DIRECTORIES): the tests keep a stray `/tmp/.spoolctl` out."""

Stat = Callable[[str], os.stat_result]


def ceilings() -> frozenset[str]:
    """SPOOLCTL_CEILING_DIRECTORIES' folders; a relative entry is ignored, as git does."""
    raw = os.environ.get(CEILING_ENV, "")
    return frozenset(os.path.normpath(p) for p in raw.split(":") if os.path.isabs(p))


def find_project(start: Path, stat: Stat = os.stat) -> Path | None:
    """The nearest folder, `start` or one above it, that holds a `.spoolctl`
    folder; None where none does. The search stops at the file system's
    root and never crosses a mount point: a parent on another device
    (`st_dev`) is not looked in, as git does without
    GIT_DISCOVERY_ACROSS_FILESYSTEM; nor is a parent named in
    SPOOLCTL_CEILING_DIRECTORIES. `stat` is injectable for tests. (Plain
    strings, not pathlib: it runs on every verb, the lean path's too.)"""
    here = str(start)
    stop = ceilings()
    try:
        device = stat(here).st_dev
    except OSError:
        return None
    while True:
        try:
            if mode.S_ISDIR(stat(os.path.join(here, PROJECT_DIR)).st_mode):
                return Path(here)
        except OSError:
            pass
        parent = os.path.dirname(here)
        if parent == here or parent in stop:
            return None
        try:
            if stat(parent).st_dev != device:
                return None
        except OSError:
            return None
        here = parent


def current_folder() -> Path:
    """The current folder; one deleted under the process (a shell still in
    it) is INVALID_INPUT: neither a project nor a relative path can be
    found from it."""
    try:
        return Path.cwd()
    except FileNotFoundError:
        raise InvalidInput(
            "the current folder no longer exists (deleted after the shell entered it): "
            "cd to a folder that exists",
            field="cwd",
        ) from None


def project_config(cwd: Path | None = None) -> ConfigFile:
    """The config file every verb reads: the one in the project's `.spoolctl/`
    (found as `find_project` finds it), else the current folder's."""
    base = cwd or current_folder()
    return read_config((find_project(base) or base) / CONFIG_RELPATH)


UNKNOWN_KEYS_SEEN: dict[Path, list[str]] = {}
"""The valid config files read by this process that hold keys spoolctl does
not know, with those keys: `config-validate` refuses such a file, and every
other verb answers as it would without them, with the warning
CONFIG_UNKNOWN_KEY (`cli/reply.py` takes them into the answer)."""


def take_unknown_keys() -> list[tuple[Path, list[str]]]:
    """The config files with unknown keys read since the last call, once."""
    seen = list(UNKNOWN_KEYS_SEEN.items())
    UNKNOWN_KEYS_SEEN.clear()
    return seen


def named_db(flag: str | None, cwd: Path | None = None) -> Named:
    """The value by the precedence; an invalid config file, or a bad
    SPOOLCTL_DB, is INVALID_INPUT (reported even when --db decides). A
    relative --db or SPOOLCTL_DB is relative to the current folder."""
    base = cwd or current_folder()
    project = find_project(base)
    config = read_config((project or base) / CONFIG_RELPATH)
    if config.exists and not config.valid:
        raise InvalidInput(
            f"config file {config.path} is invalid: {'; '.join(config.problems)}",
            config_path=str(config.path),
        )
    if config.unknown_keys:
        UNKNOWN_KEYS_SEEN[config.path] = config.unknown_keys
    if flag is not None:
        return Named(flag, base, "flag", "--db", config, "flag", project)
    env = os.environ.get("SPOOLCTL_DB")
    if env is not None:
        if not 1 <= len(env) <= 4096 or "\0" in env:
            raise InvalidInput("SPOOLCTL_DB must be a path of 1 to 4096 characters; unset it")
        return Named(env, base, "env", "SPOOLCTL_DB", config, "env", project)
    if config.exists and "db_path" in config.data:
        return config_named(config)._replace(project=project)
    if project is None:
        return Named(None, base, "default", "default", config, "new_here", None)
    rule = "found_here" if project == base else "found_above"
    return Named(None, project, "default", "default", config, rule, project)


def config_named(config: ConfigFile) -> Named:
    """The value a valid config file's db_path gives (relative to its folder)."""
    given = config.data["db_path"]
    named = f"db_path in {config.path}"
    return Named(given, config.path.parent, "config", named, config, "config", None)
