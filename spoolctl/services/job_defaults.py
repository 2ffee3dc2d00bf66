"""What `add` fills in that no flag gave: the queue's own defaults (the
`defaults` table of its config file, read by the rules of the flags they
stand for), the submitter's folder and environment (`--here`), and the
words a job's timeout is shown in, spoolctl's default named as such."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from spoolctl import validate
from spoolctl.config import ConfigFile, defaults_table
from spoolctl.errors import InvalidInput
from spoolctl.services.job_spec import DEFAULT_TIMEOUT_S, FLAGGED
from spoolctl.text import shown

DEFAULTABLE = tuple(f for f in FLAGGED if f.scheduled)
"""The attributes whose default a queue's config file may set (`defaults`):
every flag of `add` but --key, which names one job."""
HERE_KEY = "here"
"""The `defaults` key of `add --here` (a submit-time action, not a column)."""


class QueueDefaults(NamedTuple):
    """A queue's `defaults` table, read: JobSpec attribute -> value, and --here."""

    fields: dict[str, Any]
    here: bool = False


def queue_defaults(table: Any, source: str = "config file") -> QueueDefaults:
    """The `defaults` table of a config file, each key read by the rule of
    its flag (a key is spelled as in an `add --batch` line: `timeout`,
    `max_retries`, `queue`, `memory`, ...); a bad key or value is
    INVALID_INPUT naming it."""
    if table is None:
        return QueueDefaults({})
    if not isinstance(table, dict):
        raise InvalidInput(f"{source}: defaults must be an object of add's flags", field="defaults")
    by_key = {f.line_key: f for f in DEFAULTABLE}
    fields: dict[str, Any] = {}
    here = False
    for key, raw in table.items():
        where = f"{source}: defaults.{key}"
        if key == HERE_KEY:
            if not isinstance(raw, bool):
                raise InvalidInput(f"{where} must be true or false", field=f"defaults.{key}")
            here = raw
            continue
        field = by_key.get(key)
        if field is None:
            known = ", ".join(sorted([*by_key, HERE_KEY]))
            raise InvalidInput(
                f"{where} is not a default spoolctl knows (known: {known})",
                field=f"defaults.{key}",
            )
        try:
            fields[field.name] = field.value_of({key: raw})
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: {exc.message}", field=f"defaults.{key}") from None
    if fields.get("max_requeues") is not None and not fields.get("requeue_exits"):
        raise InvalidInput(
            f"{source}: defaults.max_requeues bounds the requeues of requeue_exits: "
            "set defaults.requeue_exits with it",
            field="defaults.max_requeues",
        )
    return QueueDefaults(fields, here)


def config_defaults(config: ConfigFile) -> QueueDefaults:
    """The `defaults` of a config file (none where it has no table), read."""
    return queue_defaults(defaults_table(config), str(config.path))


HERE_ENV = "SPOOLCTL_HERE"
"""Set (to 1) in the env of a job added with --here: the worker starts it
with its stored environment alone, not laid over the worker's own."""


def here_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The submitter's environment as `--here` stores it, and the names of
    the variables left out because a job's env cannot hold them (a name over
    ENV_KEY_MAX or a value over ENV_VALUE_MAX characters, or bytes that are
    not UTF-8)."""
    kept: dict[str, str] = {}
    skipped: list[str] = []
    for name, value in environ.items():
        try:
            validate.env_map({name: value})
        except InvalidInput:
            skipped.append(name)
            continue
        kept[name] = value
    kept[HERE_ENV] = "1"
    return kept, sorted(skipped)


def timeout_words(seconds: int) -> str:
    """A timeout as people read it: none, 45 s, 5 min, 1 h 30 min, 2 d."""
    if seconds == validate.NO_TIMEOUT:
        return "none"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
    return " ".join(parts)


def timeout_shown(stored: Any) -> str:
    """A job's timeout as `show` lists it: `none`, `300s (the default; ...)`, `90s`."""
    if stored == validate.NO_TIMEOUT:
        return "none"
    if stored == DEFAULT_TIMEOUT_S:
        return f"{stored}s (the default; --timeout none: no limit)"
    return f"{shown(stored)}s"
