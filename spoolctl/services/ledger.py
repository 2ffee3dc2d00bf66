"""Reading the event ledger with a cursor.

Event ids only grow (AUTOINCREMENT), so `id > cursor` never skips or repeats
an event, whatever was pruned in between. Reads are served by the primary key
or by the (job_id, id) index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select

from spoolctl.db import codec
from spoolctl.db.tables import job_events


@dataclass(frozen=True)
class Page:
    """Events after a cursor, and the cursor to pass next time."""

    events: list[dict[str, Any]]
    cursor: int

    @property
    def first_id(self) -> int | None:
        return self.events[0]["id"] if self.events else None


def read_events(
    conn: Connection, *, since_id: int, job_id: int | None = None, limit: int = 0
) -> Page:
    """Events with id > since_id, oldest first; limit 0 means all of them."""
    query = select(job_events).where(job_events.c.id > since_id).order_by(job_events.c.id)
    if job_id is not None:
        query = query.where(job_events.c.job_id == job_id)
    if limit:
        query = query.limit(limit)
    events = [
        {**dict(row), "detail": codec.load_detail(row["detail"])}
        for row in conn.execute(query).mappings()
    ]
    return Page(events, events[-1]["id"] if events else since_id)


def ledger_end(conn: Connection) -> int:
    """The id of the newest event (0 on an empty ledger): a cursor after
    which only events yet to come are read (one look at the primary key)."""
    found = conn.execute(select(func.max(job_events.c.id))).scalar()
    return 0 if found is None else int(found)


def recent_events(
    conn: Connection, *, limit: int, before_id: int | None = None, job_id: int | None = None
) -> list[dict[str, Any]]:
    """The newest `limit` events (older than before_id when given), newest
    first: a page of the ledger read backwards, by the primary key or by the
    (job_id, id) index."""
    query = select(job_events).order_by(job_events.c.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(job_events.c.id < before_id)
    if job_id is not None:
        query = query.where(job_events.c.job_id == job_id)
    return [
        {**dict(row), "detail": codec.load_detail(row["detail"])}
        for row in conn.execute(query).mappings()
    ]
