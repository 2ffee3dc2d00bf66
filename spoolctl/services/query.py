"""Read-only views of the queue: one job, lists, and the status summary.

Every query here is served by an index; none takes the write lock. Most
are named statements (`services/statements.py`) assembled by
`services/readings.py`, which the lean path shares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Select, select

from spoolctl.db.backends.base import HasTag
from spoolctl.db.tables import attempts, jobs
from spoolctl.services import job_reads, readings
from spoolctl.services.statements import reads
from spoolctl.states import AttemptState, JobState

JOB_JSON_FIELDS = ("argv", "tags", "env")


def get_job_row(conn: Connection, job_id: int) -> Row[Any] | None:
    return conn.execute(select(jobs).where(jobs.c.id == job_id)).first()


def running_attempt_id(conn: Connection, job_id: int) -> int | None:
    found = conn.execute(
        select(attempts.c.id)
        .where(attempts.c.job_id == job_id, attempts.c.state == AttemptState.RUNNING.value)
        .order_by(attempts.c.attempt_no.desc())
        .limit(1)
    ).scalar()
    return None if found is None else int(found)


def decode_job(row: Any) -> dict[str, Any]:
    """A job row as plain data; a damaged JSON column is reported in `damaged`."""
    return readings.decode_job(dict(row._mapping))


def job_detail(conn: Connection, job_id: int) -> dict[str, Any] | None:
    """The job with every column, its attempts and its events."""
    return job_reads.job_detail(reads(conn), job_id)


def lane_summary(conn: Connection, now: float) -> dict[str, dict[str, Any]]:
    """Every lane that holds a job, finished ones included: its count in each
    state and its scheduled count. Grouped in the claim index's own order
    (state, lane), which holds next_run_at too: one walk of that index, no
    table row read, no sort."""
    return readings.lane_summary(reads(conn), now)


def recent_dead(conn: Connection, limit: int) -> list[dict[str, Any]]:
    return readings.recent_dead(reads(conn), limit)


def live_workers(
    conn: Connection, now: float, *, include_all: bool = False
) -> list[dict[str, Any]]:
    return readings.live_workers(reads(conn), now, include_all=include_all)


def server_waits(conn: Connection, *, include_all: bool) -> dict[str, dict[str, Any]]:
    """Per worker id: how its start waited for an unreachable server
    (`waited_s`, `failed_tries`, `error`), from the event its registration wrote."""
    return readings.server_waits(reads(conn), include_all=include_all)


def status_summary(conn: Connection, now: float, *, dead_limit: int = 10) -> dict[str, Any]:
    """The totals are the sums of the per-lane counts: the jobs table is read
    once, through the claim index (see lane_summary)."""
    return readings.status_summary(reads(conn), now, dead_limit=dead_limit)


WAITING_FOR_LIMITS_SHOWN = readings.WAITING_FOR_LIMITS_SHOWN


def waiting_for_limits(conn: Connection, now: float) -> list[int]:
    """Due queued jobs that require their --memory/--cpus to be enforced
    (--require-limits): only a worker whose cgroups can limit them claims
    them. Oldest first, at most WAITING_FOR_LIMITS_SHOWN. Served by the
    partial index ix_jobs_needs_limits: it holds those jobs only."""
    return readings.waiting_for_limits(reads(conn), now)


event_detail = readings.event_detail
"""An event's detail as an object ({} when damaged or not an object)."""


def unconfirmed_orphans(conn: Connection) -> list[dict[str, Any]]:
    """Running jobs whose current attempt is flagged `orphan_unconfirmed`: their
    worker is gone, but a process of the attempt may still run, so the job is
    not requeued until it is confirmed gone. Oldest flag first; reads the
    running rows and their own events only."""
    return readings.unconfirmed_orphans(reads(conn))


LIST_FIELDS = readings.LIST_FIELDS
"""What `list` shows of a job: its record, then the attributes declared
`listed` (`services/job_spec.py`)."""


@dataclass(frozen=True)
class JobFilter:
    """The filters of `list`; each is served by an index on jobs."""

    state: str | tuple[str, ...] | None = None
    lane: str | None = None
    tags: tuple[tuple[str, str | None], ...] = ()  # value None: the key is present
    priority_min: int | None = None
    limit: int = 0
    before_id: int | None = None
    """Only jobs older than this id: the next page after a cursor (the dashboard)."""


def list_query(where: JobFilter) -> Select[Any]:
    """Newest first; tags are matched on the decoded JSON object."""
    query = select(*(c for c in jobs.c if c.name in readings.LIST_COLUMNS))
    query = query.order_by(jobs.c.id.desc())
    if where.before_id is not None:
        query = query.where(jobs.c.id < where.before_id)
    states = (where.state,) if isinstance(where.state, str) else where.state
    if states is not None:
        query = query.where(*state_filter(states))
    if where.lane is not None:
        query = query.where(jobs.c.queue == where.lane)
    if where.priority_min is not None:
        query = query.where(jobs.c.priority >= where.priority_min)
    for key, value in where.tags:
        query = query.where(has_tag(key, value))
    if where.limit:
        query = query.limit(where.limit)
    return query


def state_filter(states: tuple[str, ...]) -> list[ColumnElement[bool]]:
    """Jobs in these states; `suspended` names the running jobs that are
    suspended (all of them when `running` is named too). One range of an
    index on state either way: a suspended job is found among the running."""
    wanted = list(dict.fromkeys(s for s in states if s != readings.SUSPENDED))
    only_suspended = readings.SUSPENDED in states and JobState.RUNNING.value not in wanted
    if only_suspended:
        wanted.append(JobState.RUNNING.value)
    found = [jobs.c.state == wanted[0] if len(wanted) == 1 else jobs.c.state.in_(wanted)]
    if only_suspended:
        found.append((jobs.c.state != JobState.RUNNING.value) | jobs.c.suspended_at.is_not(None))
    return found


def has_tag(key: str, value: str | None) -> ColumnElement[bool]:
    """Matches key=value (or just the key, value None) in the tags object; a
    damaged tags value matches nothing."""
    return HasTag(jobs.c.tags, key, value)


def list_page(conn: Connection, where: JobFilter) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One page of `list` and its pagination: `cursor` is the oldest id shown
    (0 when none), `first_id` the oldest id in the queue, `truncated` whether
    more jobs matched than `limit` let through (one extra row tells). A page
    a named statement serves (no tag, one state at most, no cursor) is read
    by it, as the lean path reads it; any other by `list_query`."""
    run = reads(conn)
    named = named_filter(where)
    if named is not None:
        return job_reads.list_page(run, *named)
    probe = dataclasses.replace(where, limit=where.limit + 1 if where.limit else 0)
    found = list_jobs(conn, probe)
    return job_reads.paginated(found, where.limit, job_reads.first_job_id(run))


def named_filter(where: JobFilter) -> tuple[str | None, str | None, int | None, int] | None:
    """(state, lane, priority_min, limit) where a named statement serves the filter."""
    states = (where.state,) if isinstance(where.state, str) else where.state
    if where.tags or where.before_id is not None or (states is not None and len(states) != 1):
        return None
    if states == (readings.SUSPENDED,):
        return None  # no named statement: `list_query` finds them among the running
    return (None if states is None else states[0], where.lane, where.priority_min, where.limit)


def list_jobs(conn: Connection, where: JobFilter) -> list[dict[str, Any]]:
    """Jobs as `list` shows them: env values are left out (only key names)."""
    return [job_reads.list_entry(dict(row._mapping)) for row in conn.execute(list_query(where))]


def wait_summary(conn: Connection, job_ids: list[int]) -> dict[int, dict[str, Any]]:
    """State, attempts, last exit code and last error of each known job."""
    rows = conn.execute(
        select(
            jobs.c.id, jobs.c.state, jobs.c.attempts, jobs.c.last_exit_code, jobs.c.last_error
        ).where(jobs.c.id.in_(job_ids))
    ).mappings()
    return {row["id"]: {k: row[k] for k in row if k != "id"} for row in rows}


def attempt_counts(conn: Connection, job_ids: list[int]) -> dict[int, int]:
    """How many attempts (rows in attempts) each of these jobs has had; a job
    with none is absent. One statement per `readings.CHUNK` jobs, served by
    the (job_id, attempt_no) unique index alone: what it costs grows with
    the page, not the queue."""
    return job_reads.attempt_counts(reads(conn), job_ids)
