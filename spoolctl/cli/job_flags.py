"""The job flags of `add` and `schedule add`, built from the one declaration
of a job's attributes (`services/job_spec.py`): a flag, its type, default and
help come from its JobField; the few attributes read by hand (`Custom`) have
their flags here, in their field's place."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import click

from spoolctl.cli.options import (
    ENV_PAIR,
    JOB_ID,
    TAG_PAIR,
    BoundedInt,
    Duration,
    QueueName,
    Rule,
    Timestamp,
)
from spoolctl.services.job_spec import (
    FIELDS,
    Checked,
    Custom,
    JobField,
    LaneText,
    Part,
    Several,
    Switch,
    Whole,
)

F = TypeVar("F", bound=Callable[..., Any])
Decorator = Callable[[F], F]

CUSTOM: dict[str, tuple[Decorator[Any], ...]] = {
    "argv": (),  # each verb places its command (after `--`, or -c) itself
    "run_at": (
        click.option(
            "--after", type=Duration(), default=None, help="Run no sooner than this from now."
        ),
        click.option("--at", type=Timestamp(), default=None, help="Run no sooner than this time."),
    ),
    "tags": (
        click.option("--tag", "tags", type=TAG_PAIR, multiple=True, help="K=V label (repeatable)."),
    ),
    "env": (
        click.option(
            "--env",
            "env",
            type=ENV_PAIR,
            multiple=True,
            help="K=V added to the job's environment (repeatable).",
        ),
    ),
    "after_jobs": (
        click.option(
            "--after-job",
            "after_jobs",
            type=JOB_ID,
            multiple=True,
            help="Claimable only once this job is done (repeatable); canceled if it fails.",
        ),
    ),
    "after_jobs_any": (
        click.option(
            "--after-job-any",
            "after_jobs_any",
            type=JOB_ID,
            multiple=True,
            help="Claimable only once this job ended, done, dead or canceled (repeatable); "
            "its failure never cancels this one.",
        ),
    ),
}
"""The flags of the attributes read by hand, by field name."""


def param_type(field: JobField) -> click.ParamType[Any, Any] | None:
    """The click type that reads the field's flag (None: a flag without a value)."""
    reading = field.reading
    if isinstance(reading, Whole):
        return BoundedInt(reading.low, reading.high)
    if isinstance(reading, Checked):
        return Rule(reading.kind, reading.rule, dict(reading.bounds))
    if isinstance(reading, LaneText):
        return QueueName()
    if isinstance(reading, Several):
        return BoundedInt(reading.low, reading.high)
    return None


def field_option(field: JobField) -> Decorator[Any]:
    """The flag of one declared attribute; its parameter is named by its column."""
    if isinstance(field.reading, Switch):
        return click.option(field.flag, field.key, is_flag=True, default=False, help=field.help)
    if isinstance(field.reading, Custom | Part):
        raise AssertionError(f"{field.name} has its flags in CUSTOM, or is another's part")
    if isinstance(field.reading, Several):
        several = field.reading
        return click.option(
            field.flag,
            field.key,
            type=param_type(field),
            multiple=True,
            callback=lambda _ctx, _param, values: several.collect(values, field.key),
            help=field.help,
        )
    shown = field.default is not None
    default = str(field.default) if shown and isinstance(field.reading, Checked) else field.default
    return click.option(
        field.flag,
        field.key,
        type=param_type(field),
        default=default,
        show_default=shown,
        help=field.help,
    )


def flags_of(fields: Iterable[JobField]) -> tuple[Decorator[Any], ...]:
    """The flags of these attributes, in their order."""
    found: list[Decorator[Any]] = []
    for field in fields:
        if isinstance(field.reading, Part):
            continue  # read by the flag of the field before it
        custom = isinstance(field.reading, Custom)
        found.extend(CUSTOM[field.name] if custom else [field_option(field)])
    return tuple(found)


class job_flags:
    """Apply the flags of these attributes (default: all) to a command, in their order."""

    def __init__(self, fields: Iterable[JobField] = FIELDS) -> None:
        self.flags = flags_of(fields)

    def __call__(self, fn: F) -> F:
        for flag in reversed(self.flags):
            fn = flag(fn)
        return fn


def spec_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSpec arguments among a verb's parameters (named by column)."""
    return {f.name: options[f.key] for f in FIELDS if f.key in options}
