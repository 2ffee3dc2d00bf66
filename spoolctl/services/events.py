"""The append-only event ledger: written in the transaction of its change.

Writers take no ledger lock on any backend: where concurrent writers commit
ids out of order (PostgreSQL), readers give events their positions
(`services/ledger.py`, the driver's `ledger_reader`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, insert

from spoolctl.db import codec
from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import job_events
from spoolctl.states import EventKind

_INSERT_EVENT = Prepared(
    insert(job_events).values(
        job_id=bindparam("b_job"),
        at=bindparam("b_at"),
        event=bindparam("b_event"),
        worker_id=bindparam("b_worker"),
        detail=bindparam("b_detail"),
    )
)


def record_event(
    conn: Connection,
    job_id: int | None,
    event: EventKind,
    at: float,
    *,
    worker_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    _INSERT_EVENT.execute(
        conn,
        {
            "b_job": job_id,
            "b_at": at,
            "b_event": event.value,
            "b_worker": worker_id,
            "b_detail": None if detail is None else codec.dumps(detail),
        },
    )
