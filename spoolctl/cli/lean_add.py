"""The lean path of `spoolctl add` of one command on an SQLite queue, answered
without importing click or SQLAlchemy (about a third of the CPU of the
click verb; docs/performance.md).

It reads the command line by the same declaration as the click verb
(`services/job_spec.py`: each flag's rule), finds the queue by the same
precedence (`db/where.py`), submits by the same rules and statements
(`services/submission.py`, `db/lean_sql.py`) and answers through the same
envelope (`cli/reply.py`, `cli/add_reply.py`). It answers only what it can
answer exactly as the click verb would: a command line with anything else
(another verb, `--help`, `-c`, a run time, tags, an unknown or repeated
flag, a value click would refuse), a queue elsewhere than in a plain
SQLite file, or anything the queue itself says other than success
(`db/lean.py`'s `Unanswered`) goes the full way, before anything was
written. tests/unit/test_lean.py runs both paths on the same inputs and
compares the rows, the events and the envelopes."""

from __future__ import annotations

import sys
from typing import Any

from spoolctl import validate
from spoolctl.cli.add_reply import added_reply, defaulted
from spoolctl.cli.reply import emit
from spoolctl.config import auto_migrate, busy_timeout_s, local_clock
from spoolctl.db.lean import LeanQueue, Unanswered
from spoolctl.db.where import named_db
from spoolctl.errors import SpoolError
from spoolctl.services.job_defaults import config_defaults
from spoolctl.services.job_spec import (
    FLAGGED,
    Checked,
    JobField,
    JobSpec,
    LaneText,
    Several,
    Switch,
    Whole,
)
from spoolctl.services.submission import submit_alone

BY_FLAG: dict[str, JobField] = {
    f.flag: f for f in FLAGGED if not isinstance(f.reading, Switch | Several)
}
"""The job flags that take one value, by flag (a repeatable one goes the full way)."""
QUIET = {"-q", "--quiet"}
DB_TEXT_MAX: int = validate.LIMITS["db"]["max_length"]
"""The longest --db value (as the click verb's `db_option` reads it)."""


def answer(args: list[str]) -> int | None:
    """The exit code, once the lean path has answered; None: go the full way."""
    if not args or args[0] != "add":
        return None
    try:
        found = _read(args[1:])
        if found is None:
            return None
        values, argv, db, as_json, quiet = found
        auto_migrate()  # the knobs every verb that opens a queue checks first
        named = named_db(db)
        path = named.plain_file()
        if path is None:
            return None
        queue_wide = config_defaults(named.config)
        if queue_wide.here:
            return None  # the environment is captured by the full way
        given = set(values)
        spec = JobSpec(argv=argv, **{**queue_wide.fields, **values}).check()
        if spec.cwd is not None:
            validate.existing_dir(spec.cwd)
        queue = LeanQueue.open(path, busy_timeout_s())
        try:
            now = local_clock()()
            result = queue.write(lambda run: submit_alone(run, spec, now))
        finally:
            queue.close()
    except (SpoolError, Unanswered):
        return None  # the full way says it in the contract's words
    reply = added_reply(
        result,
        spec,
        quiet=quiet,
        terminal=sys.stdout.isatty(),
        defaulted=defaulted(given, queue_wide.fields),
    )
    try:
        return emit(reply, as_json)
    except BrokenPipeError:
        return 0


def _read(
    args: list[str],
) -> tuple[dict[str, Any], list[str], str | None, bool, bool] | None:
    """The job's flags (JobSpec attribute -> value), its command, --db,
    --json and --quiet of `add [FLAGS] -- PROGRAM ARGS...`; None for any
    other shape. A value a flag's rule refuses raises its InvalidInput."""
    if "--" not in args:
        return None
    boundary = args.index("--")
    flags, argv = args[:boundary], args[boundary + 1 :]
    if not argv:
        return None
    values: dict[str, Any] = {}
    db: str | None = None
    as_json = quiet = False
    seen: set[str] = set()
    i = 0
    while i < len(flags):
        flag, _, inline = flags[i].partition("=")
        if flag in seen:
            return None
        seen.add(flag)
        if flags[i] == "--json":
            as_json = True
            i += 1
            continue
        if flags[i] in QUIET:
            if QUIET & seen - {flags[i]}:
                return None
            quiet = True
            i += 1
            continue
        if flag != "--db" and flag not in BY_FLAG:
            return None
        if inline or "=" in flags[i]:
            text, i = inline, i + 1
        elif i + 1 < len(flags) and not flags[i + 1].startswith("-"):
            text, i = flags[i + 1], i + 2
        else:
            return None
        if flag == "--db":
            db = validate.bounded_text(text, "path", DB_TEXT_MAX)
            continue
        field = BY_FLAG[flag]
        values[field.name] = _value(field, text)
    return values, validate.argv(argv), db, as_json, quiet


def _value(field: JobField, text: str) -> Any:
    """The flag's value by its field's rule, as the click verb reads it."""
    reading = field.reading
    if isinstance(reading, Whole):
        low = validate.INT64_MIN if reading.low is None else reading.low
        high = validate.INT64_MAX if reading.high is None else reading.high
        return validate.int_in_range(text, "value", low, high)
    if isinstance(reading, Checked):
        return reading.rule(text)
    if isinstance(reading, LaneText):
        return validate.lane_name(text)
    raise AssertionError(f"{field.flag} takes no value")
