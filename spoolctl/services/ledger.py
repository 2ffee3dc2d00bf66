"""Reading the event ledger with a cursor.

Each event has a position that only grows: no event committing later gets a
smaller one than an event a reader already saw, so `position > cursor` never
skips or repeats an event, whatever was pruned in between. The driver says
what the position is (`event_position`: the id on SQLite, whose single
writer commits ids in order; on PostgreSQL `seq`, which readers give the
events committed so far before they read, see `ledger_reader`) and the
output calls it `id`, the cursor to pass back. Reads are served by the
position's index, or by the (job_id, id) index for one job's events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, func, select

from spoolctl.db import codec
from spoolctl.db.backends import statements
from spoolctl.db.tables import job_events


@dataclass(frozen=True)
class Page:
    """Events after a cursor, and the cursor to pass next time."""

    events: list[dict[str, Any]]
    cursor: int

    @property
    def first_id(self) -> int | None:
        return self.events[0]["id"] if self.events else None


def _events(position: Any) -> Select[Any]:
    """An event as the output shows it: its position is its `id`."""
    c = job_events.c
    return select(position.label("id"), c.job_id, c.at, c.event, c.worker_id, c.detail)


def _decoded(conn: Connection, query: Select[Any]) -> list[dict[str, Any]]:
    return [
        {**dict(row), "detail": codec.load_detail(row["detail"])}
        for row in conn.execute(query).mappings()
    ]


def read_events(
    conn: Connection, *, since_id: int, job_id: int | None = None, limit: int = 0
) -> Page:
    """Events with a position after since_id, oldest first; limit 0 means all."""
    backend = statements(conn)
    position = backend.event_position()
    query = _events(position).where(position > since_id).order_by(position)
    if job_id is not None:
        query = query.where(job_events.c.job_id == job_id)
    if limit:
        query = query.limit(limit)
    with backend.ledger_reader(conn) as reader:
        events = _decoded(reader, query)
    return Page(events, events[-1]["id"] if events else since_id)


def ledger_end(conn: Connection) -> int:
    """The newest event's position (0 on an empty ledger): a cursor after
    which only events yet to come are read (one look at its index)."""
    backend = statements(conn)
    with backend.ledger_reader(conn) as reader:
        found = reader.execute(select(func.max(backend.event_position()))).scalar()
    return 0 if found is None else int(found)


def recent_events(
    conn: Connection, *, limit: int, before_id: int | None = None, job_id: int | None = None
) -> list[dict[str, Any]]:
    """The newest `limit` events (older than the position before_id when
    given), newest first: a page of the ledger read backwards, by the
    position's index or by the (job_id, id) index."""
    backend = statements(conn)
    position = backend.event_position()
    query = _events(position).where(position.is_not(None)).order_by(position.desc()).limit(limit)
    if before_id is not None:
        query = query.where(position < before_id)
    if job_id is not None:
        query = query.where(job_events.c.job_id == job_id)
    with backend.ledger_reader(conn) as reader:
        return _decoded(reader, query)
