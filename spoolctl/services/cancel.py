"""Cancelling jobs: queued ones at once, running ones through their worker.

A running job is stopped by its worker, which learns of the cancel at its
next heartbeat (the heartbeat matches nothing). The first signal it sends
the job's process group is carried by the `canceled` event's detail
(`signal`, a name such as `SIGTERM`): SIGTERM unless the canceller chose
another (`--signal`) or SIGKILL (`--now`). After any signal but SIGKILL the
worker waits the grace period a timeout waits (`TERM_GRACE_S` in
runner/stopping.py), then SIGKILLs the group. A `canceled` event without
the key (written before it existed) means SIGKILL."""

from __future__ import annotations

import json
import signal as signals
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, select, update

from spoolctl.db.tables import attempts, job_events, jobs
from spoolctl.errors import Conflict, NotFound, SafetyBlock
from spoolctl.services.deadletter import RELEASE_LOCK
from spoolctl.services.dependencies import cancel_dependents
from spoolctl.services.events import record_event
from spoolctl.services.query import get_job_row, running_attempt_id
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState
from spoolctl.validate import signal_number as signal_number  # where steer.py reads it


@dataclass(frozen=True)
class Canceled:
    job_id: int
    state: str
    was_running: bool


GRACEFUL = signals.SIGTERM
"""The first signal a canceled running job gets unless the canceller chose."""


def cancel(
    conn: Connection,
    job_id: int,
    *,
    running_ok: bool,
    now: float,
    actor: str | None = None,
    first_signal: int = GRACEFUL,
) -> Canceled:
    """Cancel a queued or waiting job; a running one only with running_ok (the
    owning worker sees its heartbeat match nothing and sends `first_signal`
    to the job's process group, then SIGKILL after the grace period unless
    that was SIGKILL already). Jobs waiting for it are canceled with
    `dependency_failed`. `actor` (who asked, when not the CLI: the web
    dashboard) is written into the `canceled` event's detail as `by`; a
    running job's first signal as `signal`."""
    job = get_job_row(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    was_running = job.state == JobState.RUNNING
    if was_running and not running_ok:
        raise SafetyBlock(f"job {job_id} is running; cancel it with --running --yes", job_id=job_id)
    if job.state not in (JobState.QUEUED, JobState.RUNNING, JobState.WAITING):
        raise Conflict(f"job {job_id} is already {job.state}", job_id=job_id, state=job.state)
    if was_running:
        attempt_id = running_attempt_id(conn, job_id)
        if attempt_id is not None:
            conn.execute(
                update(attempts)
                .where(attempts.c.id == attempt_id)
                .values(
                    state=AttemptState.CANCELED.value,
                    failure_reason=FailureReason.CANCELED.value,
                    finished_at=now,
                    error="canceled while running",
                )
            )
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == job.state)
        .values(
            **RELEASE_LOCK,
            state=JobState.CANCELED.value,
            finished_at=now,
            last_failure_reason=FailureReason.CANCELED.value if was_running else None,
        )
    )
    detail: dict[str, object] = {"was_running": was_running}
    if was_running:
        detail["signal"] = signals.Signals(first_signal).name
    if actor is not None:
        detail["by"] = actor
    record_event(conn, job_id, EventKind.CANCELED, now, detail=detail)
    cancel_dependents(conn, job_id, JobState.CANCELED.value, now)
    return Canceled(job_id=job_id, state=JobState.CANCELED.value, was_running=was_running)


def first_signals(conn: Connection, job_ids: Iterable[int]) -> dict[int, int]:
    """For the jobs a worker lost that were canceled while running, the
    first signal the canceller chose (the newest `canceled` event's
    `signal`; SIGKILL where it names none). Jobs lost otherwise (reaped,
    force-retried) are not in the answer: their worker kills them at once."""
    found: dict[int, int] = {}
    for job_id in job_ids:
        state = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar()
        if state != JobState.CANCELED.value:
            continue
        detail = conn.execute(
            select(job_events.c.detail)
            .where(job_events.c.job_id == job_id, job_events.c.event == EventKind.CANCELED.value)
            .order_by(job_events.c.id.desc())
            .limit(1)
        ).scalar()
        found[job_id] = _signal_of(detail)
    return found


def _signal_of(detail: str | None) -> int:
    try:
        name = json.loads(detail or "{}").get("signal")
        return signals.Signals[name].value
    except (ValueError, KeyError, TypeError, AttributeError):
        return signals.SIGKILL.value
