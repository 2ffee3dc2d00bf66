"""Pausing and resuming lanes: a paused lane keeps accepting jobs, but no
worker claims from it until it is resumed.

A lane is paused while it has a row in `lanes`; the claim looks that row up
by primary key inside its own transaction, so a pause committed before a
claim's BEGIN IMMEDIATE is always seen. Jobs already running finish normally.
Each change is ledgered as a `paused`/`resumed` event (job_id null, the lane
in detail's `queue`) in the transaction that makes it. The `lanes` table
keys a lane by its name in the column `queue`.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, union

from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import jobs, lanes, workers
from spoolctl.services import readings
from spoolctl.services.events import record_event
from spoolctl.services.statements import reads
from spoolctl.states import EventKind, WorkerState


@dataclass(frozen=True)
class LaneChange:
    """What a pause or resume asked for, and which lanes it actually changed."""

    named: list[str]
    paused: bool
    changed: list[str]


_PAUSED = Prepared(select(lanes.c.queue).where(lanes.c.queue == bindparam("b_queue")))


def is_paused(conn: Connection, lane: str) -> bool:
    """One primary-key lookup: cheap enough for every claim."""
    return _PAUSED.first(conn, {"b_queue": lane}) is not None


def operator_identity() -> str:
    """Who pauses a lane: user@host (pid N)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} (pid {os.getpid()})"


def known_lanes(conn: Connection) -> list[str]:
    """Every lane that holds a job, has a live worker, or is paused."""
    found = union(
        select(jobs.c.queue).distinct(),
        select(workers.c.queue).where(workers.c.state == WorkerState.RUNNING.value),
        select(lanes.c.queue),
    )
    return sorted(str(q) for q in conn.execute(found).scalars())


def pause_lanes(
    conn: Connection, names: list[str] | None, *, by: str, reason: str | None, now: float
) -> LaneChange:
    """Pause the given lanes (None: every known lane); pausing a paused lane
    changes nothing and is reported as unchanged."""
    wanted = known_lanes(conn) if names is None else sorted(set(names))
    changed = [name for name in wanted if not is_paused(conn, name)]
    for name in changed:
        conn.execute(insert(lanes).values(queue=name, paused_at=now, paused_by=by, reason=reason))
        record_event(
            conn, None, EventKind.PAUSED, now, detail={"queue": name, "by": by, "reason": reason}
        )
    return LaneChange(wanted, True, changed)


def resume_lanes(conn: Connection, names: list[str] | None, *, by: str, now: float) -> LaneChange:
    """Resume the given lanes (None: every paused lane); resuming a lane that
    is not paused changes nothing and is reported as unchanged."""
    paused = {p["queue"] for p in paused_lanes(conn)}
    wanted = sorted(paused) if names is None else sorted(set(names))
    changed = [name for name in wanted if name in paused]
    for name in changed:
        conn.execute(delete(lanes).where(lanes.c.queue == name))
        record_event(conn, None, EventKind.RESUMED, now, detail={"queue": name, "by": by})
    return LaneChange(wanted, False, changed)


def paused_lanes(conn: Connection) -> list[dict[str, Any]]:
    """Every paused lane: queue (its name), paused_at, paused_by, reason (a
    named statement: `services/readings.py`)."""
    return readings.paused_lanes(reads(conn))
