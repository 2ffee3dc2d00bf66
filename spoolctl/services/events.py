"""The append-only event ledger: written in the transaction of its change.

Writers take no ledger lock on any backend: where concurrent writers commit
ids out of order (PostgreSQL), readers give events their positions
(`services/ledger.py`, the driver's `ledger_reader`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select

from spoolctl.db.prepared import Prepared, PreparedFor, item_bind, item_binds
from spoolctl.db.tables import job_events, jobs
from spoolctl.services.event_row import event_row
from spoolctl.states import EventKind

INSERT_EVENT_STATEMENT = Prepared(
    insert(job_events).values(
        job_id=bindparam("b_job"),
        at=bindparam("b_at"),
        event=bindparam("b_event"),
        worker_id=bindparam("b_worker"),
        detail=bindparam("b_detail"),
    )
)


def _insert_events(n: int) -> Any:
    """n events in one multi-row VALUES (their ids ascend in the order given)."""
    binds = {
        "job_id": "b_job",
        "at": "b_at",
        "event": "b_event",
        "worker_id": "b_worker",
        "detail": "b_detail",
    }
    rows: list[dict[str, Any]] = [
        {column: bindparam(item_bind(b, i)) for column, b in binds.items()} for i in range(n)
    ]
    return insert(job_events).values(rows)


_INSERT_EVENTS = PreparedFor(_insert_events)


def record_event(
    conn: Connection,
    job_id: int | None,
    event: EventKind,
    at: float,
    *,
    worker_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    INSERT_EVENT_STATEMENT.execute(
        conn, event_row(job_id, event, at, worker_id=worker_id, detail=detail)
    )


def record_events(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Several events (`event_row`s) in one statement, in the order given."""
    if rows:
        _INSERT_EVENTS.of(len(rows)).execute(conn, item_binds(rows))


def record_warnings(
    conn: Connection, warned: Sequence[tuple[int, int, str, int, float]], worker_id: str
) -> None:
    """`warned` events of `add --signal-before-timeout`, one per (job, attempt
    number, signal, seconds before the timeout, when it was sent), each at
    the time its signal went out; a job removed meanwhile gets none."""
    if not warned:
        return
    ids = [job_id for job_id, *_ in warned]
    present = set(conn.execute(select(jobs.c.id).where(jobs.c.id.in_(ids))).scalars())
    rows = [
        event_row(
            job_id,
            EventKind.WARNED,
            at,
            worker_id=worker_id,
            detail={"attempt": attempt_no, "signal": name, "before_s": before_s},
        )
        for job_id, attempt_no, name, before_s, at in warned
        if job_id in present
    ]
    record_events(conn, rows)
