"""Totals of ended attempts by outcome and failure reason: what `metrics`
exports as counters, counted from the attempts table (the ledger of every
attempt's end), so every scrape of every process gives the same figure.

Counting the whole table is one scan (tens of milliseconds at 100,000
attempts). An ended attempt never changes again, so a long-lived scraper
(the web's `/metrics`) keeps what it counted up to an id and reads only what
came after, by the primary key, plus the few attempts that were running
then. It is a memo of the same query, not a counter of its own: each scrape
checks it against the table's row count (a `prune` that deleted counted
rows sends it back to a full count), and it is counted afresh at least every
RECOUNT_S.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, select

from spoolctl.db.tables import attempts, jobs
from spoolctl.states import AttemptState, JobState

RECOUNT_S = 300.0
"""A memo is counted afresh at least this often."""

Key = tuple[str, str]
"""(outcome: the attempt's state, failure reason or "")."""


@dataclass
class _Counted:
    through_id: int
    rows: int
    """Attempts with id <= through_id that existed when counted."""
    ended: Counter[Key]
    running: set[int]
    """Ids <= through_id of attempts that were running (not in `ended` yet)."""
    at: float = field(default_factory=time.monotonic)


class EndedTotals:
    """The ended attempts' totals, counted once and then kept up."""

    def __init__(self) -> None:
        self._counted: _Counted | None = None
        self._lock = threading.Lock()

    def read(self, conn: Connection) -> dict[Key, int]:
        with self._lock:
            counted = self._counted
            stale = counted is None or time.monotonic() - counted.at > RECOUNT_S
            if counted is None or stale or not caught_up(conn, counted):
                counted = full_count(conn)
            self._counted = counted
            return dict(counted.ended)


def full_count(conn: Connection) -> _Counted:
    """Every attempt, by state and reason, in one scan; the running ones' ids
    found through the running jobs (the claim index), whose attempt they are."""
    through = int(conn.execute(select(func.coalesce(func.max(attempts.c.id), 0))).scalar_one())
    rows = conn.execute(
        select(attempts.c.state, attempts.c.failure_reason, func.count())
        .where(attempts.c.id <= through)
        .group_by(attempts.c.state, attempts.c.failure_reason)
    ).all()
    ended: Counter[Key] = Counter()
    total = 0
    for state, reason, count in rows:
        total += int(count)
        if state != AttemptState.RUNNING.value:
            ended[(str(state), str(reason or ""))] += int(count)
    running = {
        attempt_id
        for attempt_id in conn.execute(
            select(attempts.c.id)
            .join(jobs, jobs.c.id == attempts.c.job_id)
            .where(
                jobs.c.state == JobState.RUNNING.value,
                attempts.c.state == AttemptState.RUNNING.value,
            )
        ).scalars()
        if attempt_id <= through
    }
    return _Counted(through, total, ended, running)


def caught_up(conn: Connection, counted: _Counted) -> bool:
    """Add what ended since: attempts after through_id (a primary key range)
    and the ones that were running. False when rows counted before are gone
    (pruned): then only a full count is right."""
    columns = (attempts.c.id, attempts.c.state, attempts.c.failure_reason)
    fresh = conn.execute(select(*columns).where(attempts.c.id > counted.through_id)).all()
    total = int(conn.execute(select(func.count()).select_from(attempts)).scalar_one())
    if total != counted.rows + len(fresh):
        return False
    then_running: list[Any] = []
    if counted.running:
        then_running = list(
            conn.execute(select(*columns).where(attempts.c.id.in_(sorted(counted.running))))
        )
        if len(then_running) != len(counted.running):
            return False
    still_running = set()
    for attempt_id, state, reason in [*then_running, *fresh]:
        if state == AttemptState.RUNNING.value:
            still_running.add(int(attempt_id))
        else:
            counted.ended[(str(state), str(reason or ""))] += 1
    counted.running = still_running
    counted.rows += len(fresh)
    if fresh:
        counted.through_id = max(int(row[0]) for row in fresh)
    return True
