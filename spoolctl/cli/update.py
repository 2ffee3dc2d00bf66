"""The verb that changes jobs before they run: update. Its value flags are
`add`'s, read by the same rules (`services/job_spec.py`, `job_flags.py`)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable
from typing import Any

import click

from spoolctl import validate
from spoolctl.cli.database import no_job, open_existing_write
from spoolctl.cli.job_flags import CUSTOM, param_type
from spoolctl.cli.look import local_time
from spoolctl.cli.options import (
    JOB_ID,
    TAG_FILTER,
    TAG_PAIR,
    BoundedText,
    QueueName,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.reply import Reply, emit
from spoolctl.errors import InvalidInput
from spoolctl.services.job_spec import BY_NAME
from spoolctl.services.update import Change, Selection, Updated, update_jobs
from spoolctl.text import shown

VALUES = ("priority", "lane", "timeout_seconds", "max_retries", "memory_bytes", "cpus")
"""The attributes whose `add` flag `update` takes as it is (by field name)."""


def value_flags(fn: Any) -> Any:
    """`add`'s flags of VALUES, of the run time and of the limits' switch
    (which can be turned off too), with no default: a flag not given leaves
    its value as it is."""
    flags = [value_option(name) for name in VALUES]
    flags[4:4] = CUSTOM["run_at"]  # after --max-retries, before the limits
    flags.append(
        click.option(
            "--require-limits/--no-require-limits",
            "require_limits",
            default=None,
            help="Whether only a worker that can enforce --memory/--cpus claims the job.",
        )
    )
    for flag in reversed(flags):
        fn = flag(fn)
    return fn


def value_option(name: str) -> Any:
    field = BY_NAME[name]
    return click.option(field.flag, field.key, type=param_type(field), help=field.help)


@verb(
    "update",
    exclusive=(("after", "at"),),
    mutates=True,
    idempotent="without --at or --after",
    examples=(
        "spoolctl update 42 --priority 10",
        "spoolctl update 42 43 --queue gpu --timeout 2h --tag stage=retrain",
        "spoolctl update --in-queue nightly --with-tag owner=ana --at 2026-01-05T02:00",
        "spoolctl list --queue slow --json | jq '.data.jobs[].id' | spoolctl update --batch "
        "--priority -5",
    ),
)
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@value_flags
@click.option("--tag", "tags", type=TAG_PAIR, multiple=True, help="Set tag K=V (repeatable).")
@click.option(
    "--untag",
    "untag",
    type=BoundedText("tag key", validate.TAG_KEY_MAX),
    multiple=True,
    help="Remove tag K (repeatable).",
)
@click.option("--batch", is_flag=True, help="Also read job ids from stdin, one a line.")
@click.option(
    "--in-queue",
    "in_queue",
    type=QueueName(),
    default=None,
    help="Choose the queued and waiting jobs of this lane (a filter; --queue is a new value).",
)
@click.option(
    "--with-tag",
    "with_tags",
    type=TAG_FILTER,
    multiple=True,
    help="Choose the queued and waiting jobs with tag K=V, or K alone (repeatable; all match).",
)
@db_option
@json_option
def update(
    job_ids: tuple[int, ...],
    after: float | None,
    at: float | None,
    require_limits: bool | None,
    tags: tuple[tuple[str, str], ...],
    untag: tuple[str, ...],
    batch: bool,
    in_queue: str | None,
    with_tags: tuple[tuple[str, str | None], ...],
    db: str | None,
    as_json: bool,
    **values: Any,
) -> int:
    """Change queued or waiting jobs (before they run; all or none; ledgered).

    Takes `add`'s flags, read by the same rules: --priority, --queue (moves
    the job to that lane; a paused lane keeps it queued), --timeout (none: no
    timeout), --max-retries, --at/--after (its run time), --memory, --cpus
    and --require-limits/--no-require-limits. --tag K=V sets one tag and
    keeps the others (it merges); --untag K removes one.

    Choose the jobs by id (JOB_IDS, and with --batch more ids from stdin, one
    a line; blank lines and # comments are skipped), or by a filter over the
    queued and waiting jobs: --in-queue LANE and --with-tag K=V (K alone: any
    value). The filters are named apart from the new values: `--queue gpu`
    moves jobs to gpu, `--in-queue gpu` chooses the jobs of gpu. A filter
    that matches no job changes nothing and is not an error.

    Every chosen job changes in one transaction, or none does: a job that
    runs or ended is CONFLICT (exit 5), an unknown id NOT_FOUND, and a job a
    worker claims meanwhile makes the whole update CONFLICT, so a job runs
    with all its new values or none. Each changed job gets one `updated`
    event whose detail's `changes` maps each changed field to [old, new];
    values equal to the job's own are left out.
    """
    local = time.time()
    stdin = read_ids(sys.stdin) if batch else ()
    chosen = Selection(
        ids=(*job_ids, *stdin),
        lane=in_queue,
        tags=with_tags,
    )
    new = {BY_NAME[name].key: values[BY_NAME[name].key] for name in VALUES}
    given = {key: value for key, value in new.items() if value is not None}
    if require_limits is not None:
        given["require_limits"] = 1 if require_limits else None
    run_at = None if after is None and at is None else (at if at is not None else local + after)  # type: ignore[operator]
    change = Change(
        values=given,
        run_at=run_at,
        tags=validate.tag_map(dict(tags)),
        untag=untag,
    )
    queue = open_existing_write(db)
    if queue is None:
        if chosen.by_id:
            raise no_job(chosen.ids[0], db)
        return emit(answer([]), as_json)
    now = queue.now()  # the server's clock on PostgreSQL: --at/--after were read on this one's
    if change.run_at is not None:
        change = dataclasses.replace(change, run_at=change.run_at + (now - local))
    return emit(
        answer(queue.write(lambda conn: update_jobs(conn, chosen, change, now=now))), as_json
    )


def read_ids(lines: Iterable[str]) -> tuple[int, ...]:
    """Job ids one a line; blank lines and `#` comments skipped."""
    ids: list[int] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            ids.append(validate.int_in_range(text, "job id", 1, validate.INT64_MAX))
        except InvalidInput:
            raise InvalidInput(
                f"--batch line {number}: expected a job id, got {line.rstrip()!r:.80}",
                line=number,
            ) from None
    return tuple(ids)


def answer(done: list[Updated]) -> Reply:
    data = {
        "jobs": [{"job_id": u.job_id, "changes": u.changes} for u in done],
        "changed": sum(1 for u in done if u.changes),
    }
    lines = [line_of(u) for u in done] or ["No queued or waiting job matched; nothing changed"]
    return Reply(data, text="\n".join(lines))


def line_of(done: Updated) -> str:
    if not done.changes:
        return f"Job {done.job_id}: unchanged (it already has these values)"
    parts = [
        f"{name} {shown_value(name, old)} -> {shown_value(name, new)}"
        for name, (old, new) in done.changes.items()
    ]
    return f"Job {done.job_id}: " + ", ".join(parts)


def shown_value(name: str, value: Any) -> str:
    """One old or new value as a person reads it: a run time in local time,
    tags as K=V, text with its unprintable characters escaped."""
    if value is None:
        return "none"
    if name == "next_run_at":
        return local_time(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{shown(k)}={shown(v)}" for k, v in value.items()) + "}"
    return shown(value)
