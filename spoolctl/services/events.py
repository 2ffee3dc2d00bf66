"""The append-only event ledger: written in the transaction of its change."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert

from spoolctl.db import codec
from spoolctl.db.tables import job_events
from spoolctl.states import EventKind

_INSERT_EVENT = insert(job_events)


def record_event(
    conn: Connection,
    job_id: int,
    event: EventKind,
    at: float,
    *,
    worker_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        _INSERT_EVENT,
        {
            "job_id": job_id,
            "at": at,
            "event": event.value,
            "worker_id": worker_id,
            "detail": None if detail is None else codec.dumps(detail),
        },
    )
