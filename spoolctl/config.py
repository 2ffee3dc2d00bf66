"""The config file and the tunables read from the environment: plain
values, read and checked here; which queue they name is `db/location.py`'s.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from spoolctl.errors import InvalidInput
from spoolctl.validate import bounded_text

CONFIG_RELPATH = Path(".spoolctl") / "config.json"
DEFAULT_DB_RELPATH = Path(".spoolctl") / "queue.db"
CONFIG_VERSION = 1
CONFIG_KEYS = ("version", "db_path", "defaults")
PRECEDENCE = ("flag --db", "env SPOOLCTL_DB", "config file db_path", "default")

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
MIN_REAP_THRESHOLD_S = 30.0
DEFAULT_HANG_THRESHOLD_S = 600.0
DEFAULT_BUSY_TIMEOUT_S = 5.0
MAX_KNOB_S = 86_400.0


class ConfigFile(NamedTuple):
    """What a config file says, and what is wrong with it."""

    path: Path
    exists: bool
    valid: bool
    data: dict[str, Any] = {}  # noqa: RUF012 (shared, never changed)
    problems: tuple[str, ...] = ()

    @property
    def unknown_keys(self) -> list[str]:
        return sorted(k for k in self.data if k not in CONFIG_KEYS)


CONFIG_UNKNOWN_KEY = "CONFIG_UNKNOWN_KEY"


def unknown_keys_message(path: Path, keys: list[str]) -> str:
    """The warning of a verb that read a config file with keys it does not
    know: it answers as without them (0.4.11 ignored them silently)."""
    return (
        f"{path}: unknown config key(s) {', '.join(keys)} ignored (`spoolctl config-validate` "
        f"refuses them); supported keys are {', '.join(CONFIG_KEYS)}"
    )


def read_config(path: Path) -> ConfigFile:
    """Parse a config file without raising: problems are reported, not thrown."""
    if not path.exists():
        return ConfigFile(path, exists=False, valid=True)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return ConfigFile(path, exists=True, valid=False, problems=(f"unreadable: {exc}",))
    if not isinstance(data, dict):
        return ConfigFile(path, exists=True, valid=False, problems=("not a JSON object",))
    problems = []
    if "version" in data and data["version"] != CONFIG_VERSION:
        problems.append(f"version must be {CONFIG_VERSION}")
    db_path = data.get("db_path")
    if "db_path" in data and not isinstance(db_path, str):
        problems.append("db_path must be a string of 1 to 4096 characters")
    elif isinstance(db_path, str):
        try:  # the rule of --db: a NUL or a lone surrogate (a \u escape) names no file
            bounded_text(db_path, "db_path", 4096)
        except InvalidInput as exc:
            problems.append(exc.message)
    return ConfigFile(path, exists=True, valid=not problems, data=data, problems=tuple(problems))


AUTO_MIGRATE_ENV = "SPOOLCTL_AUTO_MIGRATE"
AUTO_MIGRATE_VALUES = ("0", "1")


def auto_migrate() -> bool:
    """SPOOLCTL_AUTO_MIGRATE: 1 upgrades an outdated queue on open; 0, empty
    or unset refuses it; any other value (true, yes, on) is INVALID_INPUT,
    never a silent 0."""
    raw = os.environ.get(AUTO_MIGRATE_ENV)
    if raw is None or raw == "":
        return False
    if raw not in AUTO_MIGRATE_VALUES:
        raise InvalidInput(
            f"{AUTO_MIGRATE_ENV} must be 1 (upgrade an outdated queue on open) or 0, got "
            f"{raw!r}; fix or unset it",
            name=AUTO_MIGRATE_ENV,
        )
    return raw == "1"


def _ascii(raw: str) -> str:
    """A number as the environment may give it: ASCII digits only (float()
    also takes other scripts' digits and underscores); anything else is
    made a text float() refuses."""
    return raw if raw.isascii() and "_" not in raw else "not a number"


def env_seconds(name: str, default: float, *, allow_zero: bool = False) -> float:
    """A duration from the environment: finite, > 0 (or 0 where it means 'never')."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(_ascii(raw))
    except ValueError:
        raise InvalidInput(f"{name} must be a number of seconds, got {raw!r}", name=name) from None
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_KNOB_S):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidInput(
            f"{name} must be finite, {bound} and <= {MAX_KNOB_S:g}, got {raw!r}", name=name
        )
    return value


class Timing(NamedTuple):
    """Heartbeat, reap and hang thresholds in seconds."""

    heartbeat_interval_s: float
    reap_threshold_s: float
    hang_threshold_s: float

    @classmethod
    def from_env(cls) -> Timing:
        beat = env_seconds("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", DEFAULT_HEARTBEAT_INTERVAL_S)
        reap = env_seconds("SPOOLCTL_TEST_REAP_THRESHOLD", max(4 * beat, MIN_REAP_THRESHOLD_S))
        hang = env_seconds("SPOOLCTL_HANG_THRESHOLD", DEFAULT_HANG_THRESHOLD_S, allow_zero=True)
        return cls(beat, reap, hang)


def local_clock() -> Callable[[], float]:
    """This machine's clock, shifted by SPOOLCTL_TEST_CLOCK_SKEW seconds (a test
    knob posing as a machine whose clock is wrong)."""
    raw = os.environ.get("SPOOLCTL_TEST_CLOCK_SKEW")
    if not raw:
        return time.time
    try:
        skew = float(_ascii(raw))
    except ValueError:
        raise InvalidInput(f"SPOOLCTL_TEST_CLOCK_SKEW must be a number, got {raw!r}") from None
    if not (math.isfinite(skew) and abs(skew) <= MAX_KNOB_S):
        raise InvalidInput(f"SPOOLCTL_TEST_CLOCK_SKEW must be within ±{MAX_KNOB_S:g}")
    return lambda: time.time() + skew


def busy_timeout_s() -> float:
    return env_seconds("SPOOLCTL_BUSY_TIMEOUT", DEFAULT_BUSY_TIMEOUT_S, allow_zero=True)


OUTPUT_CAP_ENV = "SPOOLCTL_PG_OUTPUT_CAP"
"""Bytes of each attempt's stream a PostgreSQL queue stores in the database."""
ENV_VARS: dict[str, dict[str, Any]] = {
    "SPOOLCTL_DB": {
        "description": "database path, or postgresql:// URL (after --db, before the config file)",
        "type": "path",
        "default": str(DEFAULT_DB_RELPATH),
        "min": 1,
        "max": 4096,
    },
    "SPOOLCTL_CEILING_DIRECTORIES": {
        "description": "absolute folders, colon-separated, that the search for the nearest "
        ".spoolctl folder never climbs into (as GIT_CEILING_DIRECTORIES)",
        "type": "text",
    },
    "SPOOLCTL_BUSY_TIMEOUT": {
        "description": "seconds to wait for SQLite's write lock before LOCKED",
        "type": "seconds",
        "default": DEFAULT_BUSY_TIMEOUT_S,
        "min": 0,
        "max": MAX_KNOB_S,
    },
    AUTO_MIGRATE_ENV: {
        "description": "1 upgrades an outdated database on open instead of refusing; 0 (or "
        "unset) refuses; any other value is INVALID_INPUT",
        "type": "flag",
        "choices": list(AUTO_MIGRATE_VALUES),
        "default": "0",
    },
    "SPOOLCTL_HANG_THRESHOLD": {
        "description": "seconds of silence after which a live worker is fenced (0 = never)",
        "type": "seconds",
        "default": DEFAULT_HANG_THRESHOLD_S,
        "min": 0,
        "max": MAX_KNOB_S,
    },
    "SPOOLCTL_TEST_HEARTBEAT_INTERVAL": {
        "description": "test knob: heartbeat interval in seconds",
        "type": "seconds",
        "default": DEFAULT_HEARTBEAT_INTERVAL_S,
        "min_exclusive": 0,
        "max": MAX_KNOB_S,
        "test_knob": True,
    },
    "SPOOLCTL_TEST_REAP_THRESHOLD": {
        "description": "test knob: reap threshold in seconds (default max(4 * heartbeat, 30))",
        "type": "seconds",
        "default": MIN_REAP_THRESHOLD_S,
        "min_exclusive": 0,
        "max": MAX_KNOB_S,
        "test_knob": True,
    },
    "SPOOLCTL_SPOOL_DIR": {
        "description": "PostgreSQL queues: where this machine's workers keep output files",
        "type": "path",
        "every_queue_verb": True,
        "default": "$XDG_STATE_HOME/spoolctl/pg-<hash of the URL>",
    },
    OUTPUT_CAP_ENV: {
        "description": "PostgreSQL: bytes of each attempt's stdout and of its stderr stored "
        "in the database (past it: truncated)",
        "type": "integer",
        "read_by": ["work", "copy-to"],
        "default": 8 * 1024 * 1024,
        "min": 1,
        "max": 1 << 30,
    },
    "SPOOLCTL_PG_NOTIFY": {
        "description": "PostgreSQL: 0 turns LISTEN/NOTIFY off (workers poll)",
        "type": "flag",
        "default": "1",
    },
    "SPOOLCTL_PG_TRANSACTION_POOLING": {
        "description": "PostgreSQL: 1 when --db is a transaction pooler (PgBouncer "
        "pool_mode=transaction): no prepared statements, no LISTEN (workers poll)",
        "type": "flag",
        "default": "0",
    },
    "SPOOLCTL_CGROUP": {
        "description": "off keeps jobs in process groups; an absolute path names the cgroup "
        "subtree (a delegated one) to make each attempt's cgroup in; auto (default) uses "
        "the worker's own cgroup where it can",
        "type": "text",
        "read_by": ["work", "doctor", "capabilities"],
        "default": "auto",
    },
    "SPOOLCTL_TEST_CLOCK_SKEW": {
        "description": "test knob: seconds added to this machine's clock",
        "type": "seconds",
        "every_queue_verb": True,
        "default": 0,
        "test_knob": True,
    },
    "SPOOLCTL_TEST_HOSTNAME": {
        "description": "test knob: the host name a worker reports (posing as another machine)",
        "type": "text",
        "test_knob": True,
    },
    "SPOOLCTL_TEST_BOOT_ID": {
        "description": "test knob: the boot id a worker reports (posing as another machine)",
        "type": "text",
        "test_knob": True,
    },
    "SPOOLCTL_TEST_GPUS": {
        "description": "test knob: the GPUs `work --gpus` finds instead of asking NVML, a JSON "
        'list of {"uuid", "index", "model", "memory"} (memory in bytes or a size like 80G)',
        "type": "json",
        "test_knob": True,
    },
    "NO_COLOR": {"description": "disables colour in text output", "type": "flag"},
}


# The queue's own defaults of `add`'s flags: the `defaults` table of the
# config file. Its values are read by the rules of the flags they stand for
# (`services/job_spec.py`, `queue_defaults`) where a job is submitted.
DEFAULTS_KEY = "defaults"


def defaults_table(config: ConfigFile) -> Any:
    """The config file's `defaults` table as written (None where it has none)."""
    return config.data.get(DEFAULTS_KEY) if config.exists and config.valid else None
