"""One ledger event's values as its insert binds them: light, shared by the
ledger's writers (`services/events.py`) and the lean path's submission
(`services/submission.py`)."""

from __future__ import annotations

from typing import Any

from spoolctl.db import codec
from spoolctl.states import EventKind


def event_row(
    job_id: int | None,
    event: EventKind,
    at: float,
    *,
    worker_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One event's values, as `record_event` and `record_events` bind them."""
    return {
        "b_job": job_id,
        "b_at": at,
        "b_event": event.value,
        "b_worker": worker_id,
        "b_detail": None if detail is None else codec.dumps(detail),
    }
