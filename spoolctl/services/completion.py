"""What a shell's completion offers from the queue: job ids, lanes and
schedule names. Plain reads, each bounded, over the columns the views read."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Connection, String, cast, select

from spoolctl.db.tables import jobs, schedules
from spoolctl.services.lanes import known_lanes

LIMIT = 50
"""At most this many candidates: a shell shows a page, not the queue."""


def job_candidates(
    conn: Connection, prefix: str, states: Collection[str] | None = None
) -> list[tuple[int, str, str]]:
    """(id, state, stored argv) of the newest jobs whose id starts with
    `prefix` (and whose state is one of `states`, when given)."""
    found = select(jobs.c.id, jobs.c.state, jobs.c.argv).order_by(jobs.c.id.desc()).limit(LIMIT)
    if prefix:
        found = found.where(cast(jobs.c.id, String).like(f"{prefix}%"))
    if states is not None:
        found = found.where(jobs.c.state.in_(sorted(states)))
    return [(int(i), str(s), str(a)) for i, s, a in conn.execute(found)]


def lane_candidates(conn: Connection, prefix: str) -> list[str]:
    """The lanes the queue knows (a job, a live worker or a pause named them)."""
    return [lane for lane in known_lanes(conn) if lane.startswith(prefix)][:LIMIT]


def schedule_candidates(conn: Connection, prefix: str) -> list[str]:
    """The schedules' names."""
    names = conn.execute(select(schedules.c.name).order_by(schedules.c.name)).scalars()
    return [str(n) for n in names if str(n).startswith(prefix)][:LIMIT]
