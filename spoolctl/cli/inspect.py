"""`show` and `list`: one job in full (every column, its attempts, its events
and what it waits for), or a page of jobs; the job's state colours and
command text are `cli/read_text.py`'s, shared with `status` and the lean
path. Read-only: they never take the write
lock and never create a queue."""

from __future__ import annotations

from typing import Any

import click

from spoolctl import validate
from spoolctl.cli.database import no_job, open_read, warn_no_queue
from spoolctl.cli.events import event_line
from spoolctl.cli.look import line_width, local_time, style, table
from spoolctl.cli.options import (
    JOB_ID,
    TAG_FILTER,
    BoundedInt,
    QueueName,
    StateList,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.read_text import STATE_COLORS, command_text, list_text
from spoolctl.cli.render import wide_option
from spoolctl.cli.reply import Reply, emit
from spoolctl.config import Timing
from spoolctl.errors import NotFound
from spoolctl.services import job_defaults, job_reads, job_spec, query
from spoolctl.services.outcome import exit_label
from spoolctl.services.readings import SUSPENDED, shown_state
from spoolctl.services.statements import reads
from spoolctl.states import JobState
from spoolctl.text import shown, size_text


@verb("show", examples=("spoolctl show 42", "spoolctl show 42 --json"))
@click.argument("job_id", type=JOB_ID)
@db_option
@json_option
def show(job_id: int, db: str | None, as_json: bool) -> int:
    """One job: every column, its attempts and its events."""
    queue = open_read(db)
    now = 0.0 if queue is None else queue.now()
    detail = (
        None
        if queue is None
        else queue.read(lambda conn: detail_with_dependencies(conn, job_id, now))
    )
    if detail is None:
        raise no_job(job_id, db) if queue is None else NotFound(f"no job {job_id}", job_id=job_id)
    return emit(Reply(detail, text=lambda: show_text(detail)), as_json)


def detail_with_dependencies(conn: Any, job_id: int, now: float) -> dict[str, Any] | None:
    """`show`'s data plus what the job waits for and what waits for it, and
    why no live worker could hold it."""
    live = Timing.from_env().reap_threshold_s
    return job_reads.show_data(reads(conn), job_id, now, live)


def show_text(detail: dict[str, Any]) -> str:
    """The job's columns that are set and mean something in its state, the
    attempts (how many, and apart the failures) and the events, each value
    shown escaped."""
    job = detail["job"]
    state = shown(shown_state(job))
    lines = [
        f"job {job['id']}  {style(state, fg=STATE_COLORS.get(state), bold=True)}"
        f"  queue {shown(job['queue'])}  priority {shown(job['priority'])}",
        f"  command   {command_text(job['argv'])}",
        f"  created   {local_time(job['created_at'])}",
        *when_text(job),
        f"  attempts  {len(detail['attempts'])}, failures {shown(job['attempts'])}"
        f" (crashes {shown(job['crashes'])}) of max_retries {shown(job['max_retries'])}"
        + ("" if job["max_crashes"] is None else f", max_crashes {shown(job['max_crashes'])}"),
        f"  timeout   {job_defaults.timeout_shown(job['timeout_seconds'])}",
        *job_facts(job),
        *links_text(detail),
    ]
    if detail.get("unplaceable"):
        lines.append(style(f"  unplaceable: {shown(detail['unplaceable'])}", fg="yellow"))
    if detail["attempts"]:
        lines += ["", attempts_table(detail["attempts"]), *devices_text(detail["attempts"])]
    if detail.get("events"):
        lines += ["", style("events:", bold=True)]
        lines += [f"  {event_line(e)}" for e in detail["events"]]
    return "\n".join(lines)


WAITS_TO_RUN = frozenset({"queued", "waiting"})
"""The states in which a job's next run time is when it may run next."""


def when_text(job: dict[str, Any]) -> list[str]:
    """The time that matters in the job's state: when it may run next
    (queued or waiting), when it started (running, and since when it is
    suspended), when it ended (done, dead, canceled); a column not set is
    left out."""
    if job["state"] in WAITS_TO_RUN:
        label, at = "next run", job.get("next_run_at")
    elif job["state"] == "running":
        label, at = "started", job.get("started_at")
    else:
        label, at = "finished", job.get("finished_at")
    lines = [] if at is None else [f"  {label:<9} {local_time(at)}"]
    if job.get("suspended"):
        lines.append(
            f"  suspended since {local_time(job['suspended_at'])}: its processes are stopped"
            f" and its timeout with them (spoolctl continue {job['id']})"
        )
    return lines


def job_facts(job: dict[str, Any]) -> list[str]:
    """The optional columns, the labelled attributes (`services/job_spec.py`),
    env and tags as K=V, and what is damaged."""
    lines = [
        f"  {label:<9} {shown(job[label])}"
        for label in ("cwd", "idempotency_key", "note", "last_error")
        if job.get(label)
    ]
    lines += [
        f"  {label:<9} {shown(size_text(value) if label == 'memory' else value)}"
        for label, value in job_spec.labelled(job)
    ]
    for label in ("env", "tags"):
        if job.get(label):
            pairs = " ".join(f"{shown(k)}={shown(v)}" for k, v in job[label].items())
            lines.append(f"  {label:<9} {pairs}")
    for problem in job.get("damaged", []):
        lines.append(style(f"  damaged   {shown(problem)}", fg="red"))
    return lines


def links_text(detail: dict[str, Any]) -> list[str]:
    """The jobs this one waits for, and those that wait for it."""
    lines = []
    if detail.get("after_jobs"):
        waits = ", ".join(f"{p['job_id']} ({shown(p['state'])})" for p in detail["after_jobs"])
        lines.append(f"  after     {waits}")
    if detail.get("dependents"):
        lines.append("  before    " + ", ".join(map(str, detail["dependents"])))
    return lines


def attempts_table(attempts: list[dict[str, Any]]) -> str:
    rows = [
        [
            str(a["attempt_no"]),
            shown(a["state"]),
            shown(a["failure_reason"] or "-"),
            shown(exit_label(a["exit_code"], a.get("signal")) or "-"),
            local_time(a["started_at"]),
            shown(a["worker_id"]),
            shown(a.get("host") or "-"),
        ]
        for a in attempts
    ]
    return table(["#", "STATE", "REASON", "EXIT", "STARTED", "WORKER", "HOST"], rows)


def devices_text(attempts: list[dict[str, Any]]) -> list[str]:
    """The devices each attempt was given, and whether it still holds them
    (an ended attempt whose orphan may still run on them keeps its hold)."""
    lines = []
    for a in attempts:
        if not a.get("devices") and not a.get("holds"):
            continue
        given = ", ".join(shown(u) for u in a.get("devices") or a["holds"])
        if not a.get("holds"):
            held = "released"
        elif a["state"] == "running":
            held = "held"
        else:
            held = style("still held: orphan not confirmed gone", fg="red")
        lines.append(f"  attempt {a['attempt_no']} devices {given} ({held})")
    return lines


@verb(
    "list",
    for_people=("wide",),
    examples=(
        "spoolctl list --state dead",
        "spoolctl list --queue gpu --tag team=ml --json",
        "spoolctl list --wide | grep backup",
    ),
)
@click.option(
    "--state",
    type=StateList([*(s.value for s in JobState), SUSPENDED]),
    default=None,
    help="Only jobs in these states (comma-separated; suspended: running ones suspended).",
)
@click.option(
    "--waiting", is_flag=True, help="Only jobs waiting for other jobs (same as --state waiting)."
)
@click.option("--queue", type=QueueName(), default=None, help="Only jobs of this lane.")
@click.option(
    "--tag",
    "tags",
    type=TAG_FILTER,
    multiple=True,
    help="Only jobs with tag K=V, or K alone (any value); all must match.",
)
@click.option(
    "--schedule",
    type=QueueName(),
    default=None,
    help="Only jobs this schedule made (the tag schedule=NAME).",
)
@click.option(
    "--priority-min",
    type=BoundedInt(validate.INT32_MIN, validate.INT32_MAX),
    default=None,
    help="Only jobs with at least this priority.",
)
@click.option(
    "--limit",
    type=BoundedInt(0, 1000),
    default=100,
    show_default=True,
    help="Most jobs shown (0: all).",
)
@wide_option
@db_option
@json_option
def list_jobs(
    state: tuple[str, ...] | None,
    waiting: bool,
    queue: str | None,
    tags: tuple[tuple[str, str | None], ...],
    schedule: str | None,
    priority_min: int | None,
    limit: int,
    wide: bool,
    db: str | None,
    as_json: bool,
) -> int:
    """Jobs, newest first; env values are never shown here (see `show`).

    The text fits the terminal (COLUMNS, else its width; a pipe or a file:
    no limit): the command (and a long lane name) is cut with an ellipsis
    (…); --wide shows it whole.
    """
    if waiting:
        state = (JobState.WAITING.value,)
    if schedule is not None:
        tags = (*tags, ("schedule", schedule))
    where = query.JobFilter(state, queue, tags, priority_min, limit)
    found = open_read(db)
    empty = {"cursor": 0, "first_id": None, "limit": limit, "truncated": False}
    jobs, pagination = (
        ([], empty) if found is None else found.read(lambda conn: page_with_waits(conn, where))
    )
    data = {"count": len(jobs), "jobs": jobs}
    width = line_width(wide)
    reply = Reply(data, text=lambda: list_text(jobs, width), meta={"pagination": pagination})
    return emit(reply if found is not None else warn_no_queue(reply, db), as_json)


def page_with_waits(
    conn: Any, where: query.JobFilter
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A page of `list`, each job with the ids it waits for and its number of
    attempts (`attempts_total`; `attempts` counts failures, as in 0.4.11): one
    indexed query each for the page."""
    jobs, pagination = query.list_page(conn, where)
    return job_reads.with_waits(reads(conn), jobs), pagination
