"""Read-only views of the queue: one job, lists, and the status summary.

Every query here is served by an index; none takes the write lock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Select, func, select

from spoolctl.db import codec
from spoolctl.db.backends.base import HasTag
from spoolctl.db.tables import attempts, job_events, jobs, workers
from spoolctl.services import claim_limits, job_spec
from spoolctl.states import AttemptState, EventKind, JobState, WorkerState

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
    job = dict(row._mapping)
    damaged: list[str] = []
    loaders = {"argv": codec.load_argv, "tags": codec.load_str_map, "env": codec.load_str_map}
    for name, loader in loaders.items():
        try:
            job[name] = loader(job[name])
        except codec.DamagedValue as exc:
            damaged.append(f"{name}: {exc}")
            job[name] = None
    if job["state"] not in {s.value for s in JobState}:
        damaged.append(f"state: unknown value {job['state']!r}")
    if damaged:
        job["damaged"] = damaged
    return job


def job_detail(conn: Connection, job_id: int) -> dict[str, Any] | None:
    """The job with every column, its attempts and its events."""
    row = get_job_row(conn, job_id)
    if row is None:
        return None
    attempt_rows = conn.execute(
        select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.attempt_no)
    ).mappings()
    shown = [c for c in job_events.c if c.name != "seq"]  # seq: the ledger's, not the job's
    event_rows = conn.execute(
        select(*shown).where(job_events.c.job_id == job_id).order_by(job_events.c.id)
    ).mappings()
    events = [{**dict(e), "detail": codec.load_detail(e["detail"])} for e in event_rows]
    signals = attempt_signals(events)
    return {
        "job": decode_job(row),
        "attempts": [{**dict(a), "signal": signals.get(a["attempt_no"])} for a in attempt_rows],
        "events": events,
    }


ENDING_EVENTS = (EventKind.FAILED.value, EventKind.TIMED_OUT.value)


def attempt_signals(events: list[dict[str, Any]]) -> dict[int, int]:
    """attempt number -> the signal that ended it, read from the ledger: the
    `failed`/`timed_out` event's detail is the one place it is kept (a timed-out
    attempt's exit_code is null). Events written before it was kept, or damaged
    ones, name no signal."""
    found: dict[int, int] = {}
    for event in events:
        detail = event["detail"]
        if event["event"] in ENDING_EVENTS and isinstance(detail, dict):
            number, signal = detail.get("attempt"), detail.get("signal")
            if type(number) is int and type(signal) is int:
                found[number] = signal
    return found


def lane_summary(conn: Connection, now: float) -> dict[str, dict[str, Any]]:
    """Every lane that holds a job, finished ones included: its count in each
    state and its scheduled count. Grouped in the claim index's own order
    (state, lane), which holds next_run_at too: one walk of that index, no
    table row read, no sort."""
    summary: dict[str, dict[str, Any]] = {}
    rows = conn.execute(
        select(
            jobs.c.state, jobs.c.queue, func.count(), func.count().filter(jobs.c.next_run_at > now)
        ).group_by(jobs.c.state, jobs.c.queue)
    )
    for state, lane, count, future in rows:
        entry = summary.setdefault(lane, {"counts": {s.value: 0 for s in JobState}, "scheduled": 0})
        entry["counts"][state] = count
        if state == JobState.QUEUED.value:
            entry["scheduled"] = int(future or 0)
    return summary


def recent_dead(conn: Connection, limit: int) -> list[dict[str, Any]]:
    query = (
        select(jobs).where(jobs.c.state == JobState.DEAD.value).order_by(jobs.c.finished_at.desc())
    )
    if limit:
        query = query.limit(limit)
    result = []
    for row in conn.execute(query):
        last = conn.execute(
            select(attempts.c.stdout_path, attempts.c.stderr_path)
            .where(attempts.c.job_id == row.id)
            .order_by(attempts.c.attempt_no.desc())
            .limit(1)
        ).first()
        job = decode_job(row)
        result.append(
            {
                "id": row.id,
                "command": None if job["argv"] is None else " ".join(job["argv"]),
                "argv": job["argv"],
                "attempts": row.attempts,
                "crashes": row.crashes,
                "last_error": row.last_error,
                "finished_at": row.finished_at,
                "stdout_path": last.stdout_path if last else None,
                "stderr_path": last.stderr_path if last else None,
            }
        )
    return result


def live_workers(
    conn: Connection, now: float, *, include_all: bool = False
) -> list[dict[str, Any]]:
    query = select(workers).order_by(workers.c.started_at)
    if not include_all:
        query = query.where(workers.c.state == WorkerState.RUNNING.value)
    result = []
    waits = server_waits(conn, include_all=include_all)
    for row in conn.execute(query).mappings():
        running = conn.execute(
            select(jobs.c.id).where(
                jobs.c.state == JobState.RUNNING.value, jobs.c.locked_by == row["id"]
            )
        ).scalars()
        entry = {**dict(row), "heartbeat_age_s": None, "running_jobs": list(running)}
        entry["waited_for_server"] = waits.get(row["id"])
        if isinstance(row["heartbeat_at"], int | float):
            entry["heartbeat_age_s"] = round(max(0.0, now - row["heartbeat_at"]), 3)
        else:
            entry["damaged"] = [f"heartbeat_at: not a number {row['heartbeat_at']!r:.80}"]
        result.append(entry)
    return result


def server_waits(conn: Connection, *, include_all: bool) -> dict[str, dict[str, Any]]:
    """Per worker id: how its start waited for an unreachable server
    (`waited_s`, `failed_tries`, `error`), from the event its registration wrote
    (at its started_at, so a later worker reusing the id does not inherit
    it). Lane events are few: read through the job_id index (job_id null)."""
    query = (
        select(job_events.c.worker_id, job_events.c.detail)
        .join(
            workers,
            (workers.c.id == job_events.c.worker_id) & (job_events.c.at >= workers.c.started_at),
        )
        .where(
            job_events.c.job_id.is_(None),
            job_events.c.event == EventKind.WAITED_FOR_SERVER.value,
        )
        .order_by(job_events.c.id)
    )
    if not include_all:
        query = query.where(workers.c.state == WorkerState.RUNNING.value)
    found = {}
    for worker_id, raw in conn.execute(query):
        detail = event_detail(raw)
        found[worker_id] = {k: detail.get(k) for k in ("waited_s", "failed_tries", "error")}
    return found


def status_summary(conn: Connection, now: float, *, dead_limit: int = 10) -> dict[str, Any]:
    """The totals are the sums of the per-lane counts: the jobs table is read
    once, through the claim index (see lane_summary)."""
    by_lane = lane_summary(conn, now)
    counts = {s.value: 0 for s in JobState}
    for entry in by_lane.values():
        for state, count in entry["counts"].items():
            counts[state] = counts.get(state, 0) + count
    return {
        "counts": counts,
        "scheduled": sum(entry["scheduled"] for entry in by_lane.values()),
        "queues": by_lane,
        "recent_dead": recent_dead(conn, dead_limit),
        "workers": live_workers(conn, now),
        "orphans_unconfirmed": unconfirmed_orphans(conn),
    }


WAITING_FOR_LIMITS_SHOWN = 20


def waiting_for_limits(conn: Connection, now: float) -> list[int]:
    """Due queued jobs that require their --memory/--cpus to be enforced
    (--require-limits): only a worker whose cgroups can limit them claims
    them. Oldest first, at most WAITING_FOR_LIMITS_SHOWN. Served by the
    partial index ix_jobs_needs_limits: it holds those jobs only."""
    rows = conn.execute(
        select(jobs.c.id)
        .where(claim_limits.needs_limits(jobs), jobs.c.next_run_at <= now)
        .order_by(jobs.c.id)
        .limit(WAITING_FOR_LIMITS_SHOWN)
    )
    return [int(r.id) for r in rows]


def event_detail(raw: str | None) -> dict[str, Any]:
    """An event's detail as an object ({} when damaged or not an object)."""
    value = codec.load_detail(raw)
    return value if isinstance(value, dict) else {}


def unconfirmed_orphans(conn: Connection) -> list[dict[str, Any]]:
    """Running jobs whose current attempt is flagged `orphan_unconfirmed`: their
    worker is gone, but a process of the attempt may still run, so the job is
    not requeued until it is confirmed gone. Oldest flag first; reads the
    running rows and their own events only."""
    rows = conn.execute(
        select(job_events.c.job_id, job_events.c.at, job_events.c.detail, attempts.c.id)
        .join(jobs, jobs.c.id == job_events.c.job_id)
        .join(
            attempts,
            (attempts.c.job_id == jobs.c.id) & (attempts.c.state == AttemptState.RUNNING.value),
        )
        .where(
            jobs.c.state == JobState.RUNNING.value,
            job_events.c.event == EventKind.ORPHAN_UNCONFIRMED.value,
        )
        .order_by(job_events.c.id)
    ).all()
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        detail = event_detail(row.detail)
        if detail.get("attempt_id") != row.id:
            continue  # a flag of an earlier attempt
        since = found[row.job_id]["since"] if row.job_id in found else row.at
        found[row.job_id] = {
            "job_id": row.job_id,
            "attempt_id": row.id,
            "pid": _int_or_none(detail.get("pid")),
            "reason": _str_or_none(detail.get("reason")),
            "dead_worker": _str_or_none(detail.get("dead_worker")),
            "since": since,
        }
    return list(found.values())


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


LIST_FIELDS = (
    "id",
    "state",
    "attempts",
    "crashes",
    "created_at",
    "started_at",
    "finished_at",
    "next_run_at",
    "last_exit_code",
    "last_error",
    *job_spec.LISTED,
)
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
    query = select(jobs).order_by(jobs.c.id.desc())
    if where.before_id is not None:
        query = query.where(jobs.c.id < where.before_id)
    states = (where.state,) if isinstance(where.state, str) else where.state
    if states is not None and len(states) == 1:
        query = query.where(jobs.c.state == states[0])
    elif states is not None:
        query = query.where(jobs.c.state.in_(states))
    if where.lane is not None:
        query = query.where(jobs.c.queue == where.lane)
    if where.priority_min is not None:
        query = query.where(jobs.c.priority >= where.priority_min)
    for key, value in where.tags:
        query = query.where(has_tag(key, value))
    if where.limit:
        query = query.limit(where.limit)
    return query


def has_tag(key: str, value: str | None) -> ColumnElement[bool]:
    """Matches key=value (or just the key, value None) in the tags object; a
    damaged tags value matches nothing."""
    return HasTag(jobs.c.tags, key, value)


def list_page(conn: Connection, where: JobFilter) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One page of `list` and its pagination: `cursor` is the oldest id shown
    (0 when none), `first_id` the oldest id in the queue, `truncated` whether
    more jobs matched than `limit` let through (one extra row tells)."""
    probe = dataclasses.replace(where, limit=where.limit + 1 if where.limit else 0)
    found = list_jobs(conn, probe)
    page = found[: where.limit] if where.limit else found
    first_id = conn.execute(select(func.min(jobs.c.id))).scalar()
    pagination = {
        "cursor": page[-1]["id"] if page else 0,
        "first_id": first_id,
        "limit": where.limit,
        "truncated": len(found) > len(page),
    }
    return page, pagination


def list_jobs(conn: Connection, where: JobFilter) -> list[dict[str, Any]]:
    """Jobs as `list` shows them: env values are left out (only key names)."""
    result = []
    for row in conn.execute(list_query(where)):
        job = decode_job(row)
        entry = {name: job[name] for name in LIST_FIELDS}
        entry["env_keys"] = sorted(job["env"] or {})
        if "damaged" in job:
            entry["damaged"] = job["damaged"]
        result.append(entry)
    return result


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
    with none is absent. One statement, served by the (job_id, attempt_no)
    unique index alone: what it costs grows with the page, not the queue."""
    if not job_ids:
        return {}
    found = conn.execute(
        select(attempts.c.job_id, func.count())
        .where(attempts.c.job_id.in_(job_ids))
        .group_by(attempts.c.job_id)
    )
    return {int(job_id): int(count) for job_id, count in found}
