"""`add --batch`: many jobs from NDJSON, one object a line, every line
validated by the same rules as `add`'s flags before any is inserted (all or
none); the flags given beside --batch are every line's defaults. A line's
keys and their rules are the declared attributes' (`services/job_spec.py`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import click
from click.core import ParameterSource

from spoolctl import validate
from spoolctl.errors import InvalidInput, MissingRequired
from spoolctl.services.job_spec import BY_NAME, FLAGGED, JobSpec, text

BY_HAND = {"argv", "cmd", "after", "at", "tags", "env", "after_jobs", "after_jobs_any"}
"""A line's keys read by hand here (the command, the run time, tags, env and
the jobs it waits for); every other key is a declared attribute's."""
BATCH_FIELDS = BY_HAND | {f.line_key for f in FLAGGED}
DEFAULTS_OF_LINES = tuple(f for f in FLAGGED if f.scheduled)
"""The attributes whose flags, given beside --batch, are every line's
defaults (not --key: it names one job)."""


def after_refs(
    value: Any, positions: dict[int, int], key: str = "after_jobs"
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A batch line's after_jobs (or after_jobs_any): job ids, and positions
    of earlier specs ("@N": the job of earlier line N)."""
    if not isinstance(value, list):
        raise InvalidInput(f'{key} must be a list of job ids or "@LINE" references')
    ids: list[int] = []
    lines: list[int] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            ids.append(validate.int_in_range(item, f"{key} id", 1, validate.INT64_MAX))
        elif isinstance(item, str) and validate.LINE_REF_RE.fullmatch(item):
            if int(item[1:]) not in positions:
                raise InvalidInput(f"{key} {item!r} names no earlier line holding a job")
            lines.append(positions[int(item[1:])])
        else:
            raise InvalidInput(f'{key} items are job ids or "@LINE", got {item!r:.40}')
    return tuple(ids), tuple(lines)


@dataclass(frozen=True)
class BatchDefaults:
    """The per-job flags given with --batch: the default of every line (a
    line's own key wins; tags and env merge, a line's own tag or variable
    winning)."""

    fields: dict[str, Any]
    """JobSpec attribute -> the value its flag gave."""
    run_at: float | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    after_jobs: tuple[int, ...] = ()
    after_jobs_any: tuple[int, ...] = ()


BATCH_LINE_MAX = 1 << 20
"""Bytes in one batch line: far above any valid job (a note is at most
10,000 characters, env values 4,096)."""


def batch_defaults(
    options: dict[str, Any],
    run_at: float | None,
    tags: tuple[tuple[str, str], ...],
    env: tuple[tuple[str, str], ...],
) -> BatchDefaults:
    """The flags given on the command line beside --batch (`options`: add's
    parameters); --key, which names one job, cannot be the default of many:
    INVALID_INPUT."""
    ctx = click.get_current_context()

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE

    for one in (f for f in FLAGGED if not f.scheduled and given(f.key)):
        raise InvalidInput(
            f"{one.flag} names one job and cannot apply to a batch: "
            f'give each line its own "{one.line_key}"',
            flag=one.flag,
        )
    return BatchDefaults(
        fields={f.name: options[f.key] for f in DEFAULTS_OF_LINES if given(f.key)},
        run_at=run_at,
        tags=validate.tag_map(dict(tags)),
        env=validate.env_map(dict(env)),
        after_jobs=tuple(options.get("after_jobs") or ()),
        after_jobs_any=tuple(options.get("after_jobs_any") or ()),
    )


def with_defaults(spec: JobSpec, line: dict[str, Any], defaults: BatchDefaults) -> JobSpec:
    """One line's spec with the batch's flags filled in where the line is silent."""
    changes: dict[str, Any] = {
        name: value for name, value in defaults.fields.items() if BY_NAME[name].line_key not in line
    }
    if defaults.run_at is not None and "after" not in line and "at" not in line:
        changes["run_at"] = defaults.run_at
    if defaults.tags:
        changes["tags"] = validate.tag_map({**defaults.tags, **spec.tags})
    if defaults.env:
        changes["env"] = validate.env_map({**defaults.env, **spec.env})
    if defaults.after_jobs and "after_jobs" not in line:
        changes["after_jobs"] = defaults.after_jobs
    if defaults.after_jobs_any and "after_jobs_any" not in line:
        changes["after_jobs_any"] = defaults.after_jobs_any
    return spec._replace(**changes) if changes else spec


def read_batch(source: str, now: float, defaults: BatchDefaults | None = None) -> list[JobSpec]:
    """Every line validated before anything is inserted."""
    defaults = defaults or BatchDefaults(fields={})
    try:
        if source == "-":
            return specs_of(sys.stdin, now, defaults)
        with open(source, encoding="utf-8") as handle:
            return specs_of(handle, now, defaults)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read batch {source!r}: {exc}") from None


def batch_lines(stream: TextIO) -> Iterator[tuple[int, str]]:
    """The stream's lines with their numbers, read one at a time and never
    more than BATCH_LINE_MAX + 1 characters of one: a longer line (input
    without a newline: /dev/zero) is refused as soon as it is seen, without
    holding it or reading on."""
    for number in itertools.count(1):
        line = stream.readline(BATCH_LINE_MAX + 1)
        if not line:
            return
        body = line[:-1] if line.endswith("\n") else line
        if len(body) > BATCH_LINE_MAX:
            raise InvalidInput(
                f"batch line {number}: the line is longer than {BATCH_LINE_MAX} characters",
                line=number,
            )
        yield number, body


def specs_of(stream: TextIO, now: float, defaults: BatchDefaults) -> list[JobSpec]:
    specs: list[JobSpec] = []
    positions: dict[int, int] = {}
    for number, line in batch_lines(stream):
        if not line.strip():
            continue
        try:
            obj = parse_line(line)
            spec = with_defaults(spec_from_object(obj, now), obj, defaults)
            if "after_jobs" in obj:
                ids, earlier = after_refs(obj["after_jobs"], positions)
                spec = spec._replace(after_jobs=ids, after_lines=earlier)
            if "after_jobs_any" in obj:
                ids, earlier = after_refs(obj["after_jobs_any"], positions, "after_jobs_any")
                spec = spec._replace(after_jobs_any=ids, after_lines_any=earlier)
            positions[number] = len(specs)
            specs.append(spec.check())
        except (ValueError, InvalidInput, MissingRequired) as exc:
            message = getattr(exc, "message", str(exc))
            raise InvalidInput(f"batch line {number}: {message}", line=number) from None
    return specs


def parse_line(line: str) -> Any:
    """One line's JSON, with plain words for what the parser cannot take."""
    if len(line) > BATCH_LINE_MAX:
        raise InvalidInput(f"the line is longer than {BATCH_LINE_MAX} characters")
    try:
        return json.loads(line)
    except RecursionError:
        raise InvalidInput("the line's JSON is nested too deeply") from None
    except ValueError as exc:
        if "digits" in str(exc) and "integer" in str(exc):
            raise InvalidInput("the line holds a number of more than 4300 digits") from None
        raise InvalidInput(f"the line is not valid JSON: {exc}") from None


def spec_from_object(obj: Any, now: float) -> JobSpec:
    """One NDJSON line: the same fields and rules as the flags of `add`."""
    if not isinstance(obj, dict):
        raise InvalidInput("each line must be a JSON object")
    unknown = set(obj) - BATCH_FIELDS
    if unknown:
        raise InvalidInput(f"unknown fields {sorted(unknown)}")
    if ("argv" in obj) == ("cmd" in obj):
        raise InvalidInput("give exactly one of argv or cmd")
    if "after" in obj and "at" in obj:
        raise InvalidInput("after and at cannot be used together")
    argv = validate.argv(obj["argv"]) if "argv" in obj else validate.shell_string(text(obj["cmd"]))
    run_at = None
    if "after" in obj:
        run_at = now + validate.duration(str(obj["after"]))
    elif "at" in obj:
        run_at = validate.timestamp(str(obj["at"]), now=now)
    return JobSpec(
        argv=argv,
        run_at=run_at,
        tags=validate.tag_map(_str_map(obj.get("tags", {}), "tags")),
        env=validate.env_map(_str_map(obj.get("env", {}), "env")),
        **{f.name: f.value_of(obj) for f in FLAGGED},
    )


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidInput(f"{what} must be an object of strings")
    return value
