"""Firing schedules: any running worker, no leader, exactly one job per fire
time.

`due_schedules` is the worker's check (one range scan of
ix_schedules_next_fire_at; this module's import of it loads no cron
library). `fire` runs in its own write transaction per schedule: it advances
the schedule's next fire time by compare-and-set (a worker that lost the
race changes nothing), then inserts each chosen fire time's occurrence row,
whose unique (schedule_id, slot_at) makes a second job for one fire time
impossible whatever process or machine tries, and its job; all of it
commits together. (The columns, and the ledger's event details, keep the
older word: `slot_at`, `last_slot_at`, `slot`, `slots`, `first_slot`.)

Catch-up, when a schedule is found with more than one fire time due (no
worker ran) or its one fire time late: `latest` fires the most recent one
only, `none` fires nothing then (only a fire time found on time fires),
`all` fires every missed one, at most CATCH_UP_ALL_MAX of the latest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from spoolctl.db.codec import DamagedValue
from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import jobs, schedule_occurrences, schedules
from spoolctl.errors import InvalidInput
from spoolctl.services.events import record_event
from spoolctl.states import ACTIVE_JOB_STATES, CatchUp, EventKind, OccurrenceOutcome, Overlap

CATCH_UP_ALL_MAX = 100
"""`--catch-up all` fires at most this many missed fire times (the latest ones)."""
ON_TIME_S = 60.0
"""With `--catch-up none`, a fire time found at most this late (and the only
one due) still fires: a worker's poll makes every fire time a little late."""
SCHEDULE_ENV = "SPOOLCTL_SCHEDULE"
SCHEDULED_FOR_ENV = "SPOOLCTL_SCHEDULED_FOR"
SCHEDULE_TAG = "schedule"

_DUE = Prepared(
    select(schedules.c.id)
    .where(schedules.c.next_fire_at <= bindparam("b_now"), schedules.c.paused_at.is_(None))
    .order_by(schedules.c.next_fire_at)
)


def due_schedules(conn: Connection, now: float) -> list[int]:
    """The schedules with a fire time due now (none paused)."""
    return [int(row.id) for row in _DUE.all(conn, {"b_now": now})]


@dataclass(frozen=True)
class Fired:
    name: str
    job_ids: list[int]
    skipped: list[float]


def fire(conn: Connection, schedule_id: int, now: float, worker_id: str | None) -> Fired | None:
    """Fire what is due of one schedule; None if nothing was (another worker
    fired it first, or it was paused or removed meanwhile)."""
    from spoolctl.services.fire_times import zone
    from spoolctl.services.schedules import job_of, recurrence_of

    row = conn.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
    if row is None or row.paused_at is not None or row.next_fire_at > now:
        return None
    try:
        job_of(row)
        zone(row.timezone)
        rec = recurrence_of(row)
        due = rec.latest_up_to(now, row.next_fire_at, CATCH_UP_ALL_MAX)
        following = rec.next_after(now)
    except (DamagedValue, InvalidInput, ValueError, TypeError) as exc:
        _quarantine(conn, row, now, worker_id, str(exc))
        return None
    advanced = conn.execute(
        update(schedules)
        .where(schedules.c.id == row.id, schedules.c.next_fire_at == row.next_fire_at)
        .values(next_fire_at=following)
    )
    if advanced.rowcount != 1:
        return None
    chosen = _chosen(row, due, now)
    result = Fired(row.name, [], [])
    previous = row.last_job_id
    for fire_at in chosen:
        if _occurred(conn, row.id, fire_at):  # a `schedule run` at that very instant
            continue
        if row.overlap == Overlap.SKIP and _active(conn, previous):
            _skip(conn, row, fire_at, now, worker_id, "overlap")
            result.skipped.append(fire_at)
            continue
        previous = occur(conn, row, fire_at, now, OccurrenceOutcome.FIRED, worker_id)
        result.job_ids.append(previous)
    missed = [at for at in due if at not in chosen]
    if missed:
        record_event(
            conn,
            None,
            EventKind.SCHEDULE_SKIPPED,
            now,
            worker_id=worker_id,
            detail={
                "schedule": row.name,
                "reason": "catch_up",
                "slots": len(missed),
                "first_slot": missed[0],
                "last_slot": missed[-1],
            },
        )
    return result


def _quarantine(conn: Connection, row: Any, now: float, worker_id: str | None, why: str) -> None:
    """A schedule whose stored row cannot be fired (damaged by hand, or an
    expression this cronsim rejects) is paused with the reason, so that no
    worker stops on it or tries again each poll."""
    reason = f"damaged: {why}"[:1000]
    conn.execute(
        update(schedules)
        .where(schedules.c.id == row.id, schedules.c.paused_at.is_(None))
        .values(paused_at=now, paused_reason=reason)
    )
    record_event(
        conn,
        None,
        EventKind.SCHEDULE_PAUSED,
        now,
        worker_id=worker_id,
        detail={"schedule": row.name, "reason": reason},
    )


def _chosen(row: Any, due: list[float], now: float) -> list[float]:
    if not due:
        return []
    if row.catch_up == CatchUp.ALL:
        return due
    if row.catch_up == CatchUp.NONE:
        on_time = len(due) == 1 and due[0] == row.next_fire_at and now - due[0] <= ON_TIME_S
        return due if on_time else []
    return due[-1:]


def _occurred(conn: Connection, schedule_id: int, fire_at: float) -> bool:
    """Whether the fire time has its occurrence already: the unique index would
    refuse a second one (the guarantee); this look keeps the worker from
    failing its transaction on it."""
    found = conn.execute(
        select(schedule_occurrences.c.id).where(
            schedule_occurrences.c.schedule_id == schedule_id,
            schedule_occurrences.c.slot_at == fire_at,
        )
    ).first()
    return found is not None


def _active(conn: Connection, job_id: int | None) -> bool:
    """Whether the previous occurrence's job (the schedule's last_job_id) is
    still queued, waiting or running: one primary key lookup."""
    if job_id is None:
        return False
    state = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
    return state in {s.value for s in ACTIVE_JOB_STATES}


def _skip(
    conn: Connection, row: Any, fire_at: float, now: float, worker_id: str | None, why: str
) -> None:
    conn.execute(
        insert(schedule_occurrences).values(
            schedule_id=row.id, slot_at=fire_at, at=now, outcome=OccurrenceOutcome.SKIPPED.value
        )
    )
    conn.execute(update(schedules).where(schedules.c.id == row.id).values(last_slot_at=fire_at))
    record_event(
        conn,
        None,
        EventKind.SCHEDULE_SKIPPED,
        now,
        worker_id=worker_id,
        detail={"schedule": row.name, "reason": why, "slot": fire_at},
    )


def occur(
    conn: Connection,
    row: Any,
    fire_at: float,
    now: float,
    outcome: OccurrenceOutcome,
    worker_id: str | None,
) -> int:
    """One occurrence: its row (unique per fire time), its job, its event."""
    from spoolctl.services.fire_times import iso
    from spoolctl.services.schedules import job_of
    from spoolctl.services.submit import submit

    occurrence = conn.execute(
        insert(schedule_occurrences).values(
            schedule_id=row.id, slot_at=fire_at, at=now, outcome=outcome.value
        )
    ).inserted_primary_key[0]  # type: ignore[index]
    spec = job_of(row)
    spec = spec._replace(
        env={**spec.env, SCHEDULE_ENV: row.name, SCHEDULED_FOR_ENV: iso(fire_at, row.timezone)},
        tags={**spec.tags, SCHEDULE_TAG: row.name},
    )
    job_id = submit(conn, spec, now).job_id
    conn.execute(
        update(schedule_occurrences)
        .where(schedule_occurrences.c.id == occurrence)
        .values(job_id=job_id)
    )
    conn.execute(
        update(schedules)
        .where(schedules.c.id == row.id)
        .values(last_job_id=job_id, last_slot_at=fire_at)
    )
    record_event(
        conn,
        job_id,
        EventKind.SCHEDULE_FIRED,
        now,
        worker_id=worker_id,
        detail={"schedule": row.name, "slot": fire_at, "outcome": outcome.value},
    )
    return job_id


def run_now(conn: Connection, name: str, now: float) -> dict[str, Any]:
    """`schedule run`: one occurrence now, outside its fire times (its next
    fire time and the overlap rule are left alone)."""
    from spoolctl.services.schedules import require

    row = require(conn, name)
    job_id = occur(conn, row, now, now, OccurrenceOutcome.RUN, None)
    return {"name": name, "job_id": job_id, "slot_at": now}
