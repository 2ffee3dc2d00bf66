"""Removing jobs that have not run: `spoolctl remove ID...`.

A queued job (due, delayed with --after, or in a paused lane) or a waiting
one (`add --after-job`) that never had an attempt is deleted: its row, its
events and its links to other jobs go, so that no view (`list`, `status`,
`show`, the dashboard) and no reader of the job states sees it, and no state
is added to the contract for it. The ledger keeps one `removed` event per
job, with a null job_id (the job row is gone) and the job in its detail:
`{job_id, from, queue, created_at, argv}`.

Every id is checked before anything changes: an id that names no job is
NOT_FOUND, a job that runs or ended, or one that already had an attempt (a
queued job waiting for its retry: its output stays), is CONFLICT, and then
nothing is removed. A job an attempt of which still holds a device (an
orphan not confirmed gone keeps its hold) is CONFLICT naming the devices,
before anything else is said of it.

Jobs that waited for a removed job (`--after-job`) are canceled with
`dependency_failed`, as `cancel` does for its dependents (its parent will
never be done), each with a `dependency_failed` event naming the removed
job with parent_state `removed`; jobs that waited for it with
`--after-job-any` count it as ended (canceled) and may become queued. A job
both removed and waiting for another removed job is removed, not canceled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, func, or_, select, update

from spoolctl.db import codec
from spoolctl.db.tables import (
    attempts,
    device_holds,
    job_dependencies,
    job_events,
    jobs,
    schedule_occurrences,
)
from spoolctl.errors import Conflict, NotFound
from spoolctl.services.dependencies import cancel_dependents
from spoolctl.services.events import record_event
from spoolctl.states import EventKind, JobState

REMOVABLE = frozenset({JobState.QUEUED, JobState.WAITING})
REMOVED_PARENT_STATE = "removed"
"""What a dependent's `dependency_failed` event and last_error call its parent."""


@dataclass(frozen=True)
class Removed:
    removed: list[int]
    dependents_canceled: list[int] = field(default_factory=list)


def remove(conn: Connection, job_ids: Sequence[int], *, now: float) -> Removed:
    """Delete the named jobs (each queued or waiting, never run) in one
    transaction, or none of them."""
    wanted = sorted(set(job_ids))
    found = {row.id: row for row in conn.execute(select(jobs).where(jobs.c.id.in_(wanted)))}
    missing = [i for i in wanted if i not in found]
    if missing:
        listed = ", ".join(map(str, missing))
        raise NotFound(f"no job {listed}; nothing was removed", job_id=missing[0], job_ids=missing)
    for job_id in wanted:
        _check_removable(job_id, found[job_id].state)
    _refuse_holding(conn, wanted)
    ran = conn.execute(
        select(attempts.c.job_id, func.count())
        .where(attempts.c.job_id.in_(wanted))
        .group_by(attempts.c.job_id)
        .order_by(attempts.c.job_id)
    ).first()
    if ran is not None:
        job_id, count = int(ran[0]), int(ran[1])
        raise Conflict(
            f"job {job_id} has run {count} time(s) and waits for its retry; remove takes only "
            f"jobs that never ran (its output stays): cancel it with: spoolctl cancel {job_id}",
            job_id=job_id,
            state=str(found[job_id].state),
            attempts=count,
        )
    # Ended first (so that --after-job-any children count them as met), then
    # their dependents judged, then the rows deleted.
    for job_id in wanted:
        ended = conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == found[job_id].state)
            .values(state=JobState.CANCELED.value, finished_at=now)
        )
        if ended.rowcount != 1:  # a worker claimed it meanwhile (PostgreSQL): nothing is kept
            raise Conflict(
                f"job {job_id} changed while it was being removed (a worker claimed it?); "
                "nothing was removed",
                job_id=job_id,
            )
    canceled: list[int] = []
    for job_id in wanted:
        canceled += cancel_dependents(conn, job_id, REMOVED_PARENT_STATE, now)
    links = or_(job_dependencies.c.job_id.in_(wanted), job_dependencies.c.after_job_id.in_(wanted))
    conn.execute(delete(job_dependencies).where(links))
    conn.execute(
        update(schedule_occurrences)
        .where(schedule_occurrences.c.job_id.in_(wanted))
        .values(job_id=None)
    )
    conn.execute(delete(job_events).where(job_events.c.job_id.in_(wanted)))
    conn.execute(delete(jobs).where(jobs.c.id.in_(wanted)))
    for job_id in wanted:
        record_event(conn, None, EventKind.REMOVED, now, detail=_detail(found[job_id]))
    return Removed(removed=wanted, dependents_canceled=sorted(set(canceled)))


def _refuse_holding(conn: Connection, job_ids: list[int]) -> None:
    """CONFLICT if an attempt of one of the jobs still holds a device: its
    rows must stay while its process may still run on it."""
    query = (
        select(attempts.c.job_id, attempts.c.attempt_no, device_holds.c.device_uuid)
        .select_from(device_holds.join(attempts, attempts.c.id == device_holds.c.attempt_id))
        .where(attempts.c.job_id.in_(job_ids))
        .order_by(attempts.c.job_id, device_holds.c.id)
    )
    found = conn.execute(query).all()
    if not found:
        return
    job_id, attempt_no = int(found[0].job_id), int(found[0].attempt_no)
    devices = [str(r.device_uuid) for r in found if r.job_id == job_id]
    raise Conflict(
        f"job {job_id}'s attempt {attempt_no} still holds device(s) {', '.join(devices)} "
        "(its process may still run on them: the hold goes once it is confirmed gone); "
        f"remove takes only jobs that never ran: cancel it with: spoolctl cancel {job_id}; "
        "nothing was removed",
        job_id=job_id,
        attempt_no=attempt_no,
        devices=devices,
    )


def _check_removable(job_id: int, state: str) -> None:
    if state in REMOVABLE:
        return
    if state == JobState.RUNNING:
        how = f"stop it with: spoolctl cancel {job_id} --running --yes"
    else:
        how = "it has ended: prune deletes ended jobs"
    raise Conflict(
        f"job {job_id} is {state}; remove takes only queued or waiting jobs ({how}); "
        "nothing was removed",
        job_id=job_id,
        state=state,
    )


def _detail(row: Any) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "job_id": int(row.id),
        "from": str(row.state),
        "queue": row.queue,
        "created_at": row.created_at,
    }
    with contextlib.suppress(codec.DamagedValue):
        detail["argv"] = codec.load_argv(row.argv)
    return detail
