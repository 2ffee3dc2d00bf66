"""Requests to a running attempt's worker: send a signal, suspend, continue.

A request is a row of `control_requests` and a `requested` event, written by
whoever asks, from any machine that reaches the queue. The worker that owns
the attempt finds it (its change watch wakes it; its heartbeat looks too),
settles it `delivered` and acts. A requester that finds the attempt ended
before that settles it `attempt_ended` (nothing was delivered: CONFLICT).
Both settle by one conditional update of a null `settled_at`, so exactly one
of them decides, and a request is acted on at most once.

The worker records the delivery before it acts (`deliver`, in its write
transaction; it signals once that commits): a worker that dies between the
two never sends it, and its attempt is reaped anyway.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select, update

from spoolctl.db.tables import attempts, control_requests, jobs
from spoolctl.errors import Conflict, InvalidInput, NotFound
from spoolctl.services.events import record_event
from spoolctl.services.query import get_job_row, running_attempt_id
from spoolctl.states import AttemptState, ControlAction, ControlResult, EventKind, JobState

NOT_SIGNALS = frozenset({signals.SIGSTOP, signals.SIGCONT})
"""Signals `signal` refuses: they would stop or continue a job behind its
worker's back (its timeout would go on counting); `suspend` and `continue`
do that and keep the books."""

DELIVERY_EVENTS = {
    ControlAction.SIGNAL: EventKind.SIGNALED,
    ControlAction.SUSPEND: EventKind.SUSPENDED,
    ControlAction.CONTINUE: EventKind.CONTINUED,
}


@dataclass(frozen=True)
class Request:
    id: int
    job_id: int
    attempt_id: int
    action: ControlAction
    signal: int | None
    """The signal number of a `signal` request (None for the others)."""


@dataclass(frozen=True)
class Settled:
    result: ControlResult
    at: float


def request(
    conn: Connection,
    job_id: int,
    action: ControlAction,
    *,
    now: float,
    signal: int | None = None,
    actor: str | None = None,
) -> Request:
    """Ask the worker that runs job_id's attempt to act on it. NotFound for
    no such job; Conflict (nothing written) unless it is running, or when a
    suspend finds it suspended or a continue finds it running on."""
    if action is ControlAction.SIGNAL:
        if signal is None or signal in NOT_SIGNALS:
            name = "none" if signal is None else signals.Signals(signal).name
            raise InvalidInput(
                f"signal {name} cannot be sent with `signal`: use `spoolctl suspend` and "
                "`spoolctl continue`, which keep the job's timeout stopped while it is",
                value=name,
            )
    elif signal is not None:
        raise InvalidInput(f"{action.value} takes no signal", value=signal)
    job = get_job_row(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    attempt_id = running_attempt_id(conn, job_id) if job.state == JobState.RUNNING else None
    if attempt_id is None:
        raise Conflict(
            f"job {job_id} is {job.state}, not running: nothing was sent",
            job_id=job_id,
            state=job.state,
        )
    if action is ControlAction.SUSPEND and job.suspended_at is not None:
        raise Conflict(f"job {job_id} is already suspended", job_id=job_id, state="suspended")
    if action is ControlAction.CONTINUE and job.suspended_at is None:
        raise Conflict(f"job {job_id} is not suspended", job_id=job_id, state=job.state)
    signal_name = None if signal is None else signals.Signals(signal).name
    request_id = conn.execute(
        insert(control_requests)
        .values(
            job_id=job_id,
            attempt_id=attempt_id,
            action=action.value,
            signal=signal_name,
            requested_at=now,
            requested_by=actor,
        )
        .returning(control_requests.c.id)
    ).scalar_one()
    detail: dict[str, Any] = {
        "request_id": int(request_id),
        "action": action.value,
        "attempt_id": attempt_id,
    }
    if signal_name is not None:
        detail["signal"] = signal_name
    if actor is not None:
        detail["by"] = actor
    record_event(conn, job_id, EventKind.REQUESTED, now, detail=detail)
    return Request(int(request_id), job_id, attempt_id, action, signal)


def settled(conn: Connection, request_id: int) -> Settled | None:
    """How the request was settled; None while it waits for its worker."""
    row = conn.execute(
        select(control_requests.c.result, control_requests.c.settled_at).where(
            control_requests.c.id == request_id
        )
    ).first()
    if row is None or row.settled_at is None:
        return None
    return Settled(ControlResult(row.result), float(row.settled_at))


def awaited(conn: Connection, request_id: int) -> Settled | None:
    """What a requester waiting on its request sees in one read: how it was
    settled; else, when its attempt is no longer running, a provisional
    `attempt_ended` (settle it with `drop_if_ended`, which may find it
    delivered after all); None while it waits for its worker."""
    found = settled(conn, request_id)
    if found is not None:
        return found
    running = conn.execute(
        select(attempts.c.id)
        .join(control_requests, control_requests.c.attempt_id == attempts.c.id)
        .where(
            control_requests.c.id == request_id,
            attempts.c.state == AttemptState.RUNNING.value,
        )
    ).first()
    return None if running is not None else Settled(ControlResult.ATTEMPT_ENDED, 0.0)


def drop_if_ended(conn: Connection, request_id: int, now: float) -> bool:
    """Settle the request `attempt_ended` if its attempt is no longer running
    and its worker has not delivered it; True when this call settled it so
    (the requester answers CONFLICT), False when it waits on or was
    delivered."""
    running = (
        select(attempts.c.id)
        .where(
            attempts.c.id == control_requests.c.attempt_id,
            attempts.c.state == AttemptState.RUNNING.value,
        )
        .exists()
    )
    done = conn.execute(
        update(control_requests)
        .where(
            control_requests.c.id == request_id,
            control_requests.c.settled_at.is_(None),
            ~running,
        )
        .values(settled_at=now, result=ControlResult.ATTEMPT_ENDED.value)
    )
    return done.rowcount == 1


def pending(conn: Connection, attempt_ids: Collection[int]) -> list[Request]:
    """The unsettled requests for these attempts, oldest first."""
    if not attempt_ids:
        return []
    found = conn.execute(
        select(
            control_requests.c.id,
            control_requests.c.job_id,
            control_requests.c.attempt_id,
            control_requests.c.action,
            control_requests.c.signal,
        )
        .where(
            control_requests.c.attempt_id.in_(list(attempt_ids)),
            control_requests.c.settled_at.is_(None),
        )
        .order_by(control_requests.c.id)
    )
    return [
        Request(
            int(r.id),
            int(r.job_id),
            int(r.attempt_id),
            ControlAction(r.action),
            None if r.signal is None else signals.Signals[r.signal].value,
        )
        for r in found
    ]


def deliver(
    conn: Connection,
    req: Request,
    now: float,
    worker_id: str,
    detail: dict[str, Any] | None = None,
) -> bool:
    """Settle the request `delivered` (the worker acts once this commits),
    write its event and keep the job's `suspended_at`. False when someone
    settled it first: then the worker must not act."""
    done = conn.execute(
        update(control_requests)
        .where(control_requests.c.id == req.id, control_requests.c.settled_at.is_(None))
        .values(settled_at=now, result=ControlResult.DELIVERED.value)
    )
    if done.rowcount != 1:
        return False
    if req.action is ControlAction.SUSPEND:
        conn.execute(update(jobs).where(jobs.c.id == req.job_id).values(suspended_at=now))
    elif req.action is ControlAction.CONTINUE:
        conn.execute(update(jobs).where(jobs.c.id == req.job_id).values(suspended_at=None))
    full: dict[str, Any] = {"request_id": req.id, **(detail or {})}
    if req.signal is not None:
        full["signal"] = signals.Signals(req.signal).name
    event = DELIVERY_EVENTS[req.action]
    record_event(conn, req.job_id, event, now, worker_id=worker_id, detail=full)
    return True
