"""Schedules (recurring jobs): adding, pausing, resuming, removing, reading.

A schedule is a row of `schedules`; firing it at its fire times is
`services/firing.py`, computing them `services/fire_times.py`.
Every change writes its ledger event (job_id null, detail naming the
schedule) in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from spoolctl.db import codec
from spoolctl.db.tables import jobs, schedule_occurrences, schedules
from spoolctl.errors import Conflict, InvalidInput, NotFound
from spoolctl.services import readings
from spoolctl.services.events import record_event
from spoolctl.services.fire_times import Recurrence
from spoolctl.services.job_spec import SCHEDULED, JobSpec
from spoolctl.services.statements import reads
from spoolctl.states import CatchUp, EventKind, Overlap

UPCOMING = 3
"""Next fire times shown by list and show."""
RECENT = 10
"""Occurrences shown by show."""


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    recurrence: Recurrence
    job: JobSpec
    overlap: Overlap = Overlap.SKIP
    catch_up: CatchUp = CatchUp.LATEST


def job_json(spec: JobSpec) -> str:
    """The job a schedule keeps for its occurrences: the attributes declared
    `scheduled`, by column (`services/job_spec.py`)."""
    return codec.dumps(spec.scheduled())


def job_of(row: Any) -> JobSpec:
    """The job flags of a schedule's occurrences; INVALID_INPUT if the stored
    JSON is not what `add` wrote. A flag added to spoolctl after the schedule
    was stored is absent from it: its occurrences get the flag's default."""
    values = codec.load_detail(row.job)
    known = {f.key for f in SCHEDULED}
    if not isinstance(values, dict) or not set(values) <= known or "argv" not in values:
        raise InvalidInput(f"schedule {row.name!r}: job flags are damaged: {row.job!r:.80}")
    try:
        spec = JobSpec.of_scheduled(values)
        codec.dumps(spec.argv)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"schedule {row.name!r}: job flags are damaged: {exc}") from None
    if not isinstance(spec.argv, list) or not spec.argv:
        raise InvalidInput(f"schedule {row.name!r}: its command is damaged")
    if not all(isinstance(a, str) for a in spec.argv):
        raise InvalidInput(f"schedule {row.name!r}: its command is damaged")
    return spec


def recurrence_of(row: Any) -> Recurrence:
    return Recurrence(row.cron, row.every_s, row.timezone, row.anchor_at)


def add(conn: Connection, spec: ScheduleSpec, now: float, *, replace: bool) -> dict[str, Any]:
    """Insert the schedule (CONFLICT if the name is taken, unless `replace`:
    then its definition changes and its occurrences are kept)."""
    existing = _row(conn, spec.name)
    rec = spec.recurrence
    values = {
        "name": spec.name,
        "cron": rec.cron,
        "every_s": rec.every_s,
        "timezone": rec.timezone,
        "overlap": spec.overlap.value,
        "catch_up": spec.catch_up.value,
        "anchor_at": rec.anchor_at,
        "job": job_json(spec.job),
        "next_fire_at": rec.next_after(now - 1e-6)
        if rec.every_s is not None
        else rec.next_after(now),
    }
    if existing is not None and not replace:
        raise Conflict(
            f"a schedule named {spec.name!r} exists; give --replace to change it",
            name=spec.name,
        )
    if existing is None:
        conn.execute(insert(schedules).values(**values, created_at=now))
    else:
        conn.execute(update(schedules).where(schedules.c.id == existing.id).values(**values))
    record_event(
        conn,
        None,
        EventKind.SCHEDULE_ADDED,
        now,
        detail={"schedule": spec.name, "replaced": existing is not None},
    )
    return describe(conn, require(conn, spec.name), now)


def _row(conn: Connection, name: str) -> Any:
    return conn.execute(select(schedules).where(schedules.c.name == name)).first()


def require(conn: Connection, name: str) -> Any:
    row = _row(conn, name)
    if row is None:
        raise NotFound(f"no schedule named {name!r}", name=name)
    return row


def pause(conn: Connection, name: str, reason: str | None, now: float) -> dict[str, Any]:
    row = require(conn, name)
    changed = row.paused_at is None
    if changed:
        conn.execute(
            update(schedules)
            .where(schedules.c.id == row.id)
            .values(paused_at=now, paused_reason=reason)
        )
        record_event(
            conn, None, EventKind.SCHEDULE_PAUSED, now, detail={"schedule": name, "reason": reason}
        )
    return {**describe(conn, require(conn, name), now), "changed": changed}


def resume(conn: Connection, name: str, now: float) -> dict[str, Any]:
    """Unpause: the next fire time is the first after now (fire times that
    passed while paused are not caught up)."""
    row = require(conn, name)
    changed = row.paused_at is not None
    if changed:
        conn.execute(
            update(schedules)
            .where(schedules.c.id == row.id)
            .values(
                paused_at=None, paused_reason=None, next_fire_at=recurrence_of(row).next_after(now)
            )
        )
        record_event(conn, None, EventKind.SCHEDULE_RESUMED, now, detail={"schedule": name})
    return {**describe(conn, require(conn, name), now), "changed": changed}


def remove(conn: Connection, name: str, now: float) -> dict[str, Any]:
    """Delete the schedule and its occurrence records; its jobs stay (a
    running one finishes) and no new one fires."""
    row = require(conn, name)
    conn.execute(delete(schedule_occurrences).where(schedule_occurrences.c.schedule_id == row.id))
    conn.execute(delete(schedules).where(schedules.c.id == row.id))
    record_event(conn, None, EventKind.SCHEDULE_REMOVED, now, detail={"schedule": name})
    return {"name": name, "removed": True}


def listing(conn: Connection, now: float) -> list[dict[str, Any]]:
    rows = conn.execute(select(schedules).order_by(schedules.c.name)).all()
    return [describe(conn, row, now) for row in rows]


def describe(conn: Connection, row: Any, now: float) -> dict[str, Any]:
    rec = recurrence_of(row)
    last = None
    if row.last_slot_at is not None:
        state = None
        if row.last_job_id is not None:
            state = conn.execute(select(jobs.c.state).where(jobs.c.id == row.last_job_id)).scalar()
        last = {"slot_at": row.last_slot_at, "job_id": row.last_job_id, "state": state}
    return {
        "name": row.name,
        "cron": row.cron,
        "every_s": row.every_s,
        "expression": row.cron if row.cron is not None else f"every {row.every_s:g}s",
        "timezone": row.timezone,
        "overlap": row.overlap,
        "catch_up": row.catch_up,
        "anchor_at": row.anchor_at,
        "created_at": row.created_at,
        "next_fire_at": None if row.paused_at is not None else row.next_fire_at,
        "upcoming": []
        if row.paused_at is not None
        else [row.next_fire_at, *rec.upcoming(row.next_fire_at, UPCOMING - 1)],
        "paused": row.paused_at is not None,
        "paused_at": row.paused_at,
        "paused_reason": row.paused_reason,
        "last": last,
        "job": codec.load_detail(row.job),
    }


def occurrences(conn: Connection, schedule_id: int, limit: int = RECENT) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(
            schedule_occurrences.c.slot_at,
            schedule_occurrences.c.at,
            schedule_occurrences.c.outcome,
            schedule_occurrences.c.job_id,
            jobs.c.state,
        )
        .outerjoin(jobs, jobs.c.id == schedule_occurrences.c.job_id)
        .where(schedule_occurrences.c.schedule_id == schedule_id)
        .order_by(schedule_occurrences.c.slot_at.desc())
        .limit(limit)
    ).all()
    return [
        {
            "slot_at": r.slot_at,
            "at": r.at,
            "outcome": r.outcome,
            "job_id": r.job_id,
            "state": r.state,
        }
        for r in rows
    ]


def fire_times(conn: Connection) -> list[tuple[str, float, bool]]:
    """(name, next fire time, paused) of every schedule, by name: what
    `metrics` exports (one scan of a table of a few rows)."""
    rows = conn.execute(
        select(schedules.c.name, schedules.c.next_fire_at, schedules.c.paused_at).order_by(
            schedules.c.name
        )
    ).all()
    return [(str(r.name), float(r.next_fire_at), r.paused_at is not None) for r in rows]


def summary(conn: Connection) -> dict[str, Any]:
    """For `status`: how many schedules, and the next one due (named
    statements: `services/readings.py`)."""
    return readings.schedule_summary(reads(conn))
