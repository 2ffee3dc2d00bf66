"""The worker's schedule duty: every running worker fires due schedules (no
leader, no daemon; `services/firing.py` makes each fire time one job whichever
worker wins). At most one check per poll interval, one indexed query; only
when something is due does the firing path (and its cron library) load."""

from __future__ import annotations

from sqlalchemy import Connection

from spoolctl.db.engine import read_tx, write_quietly
from spoolctl.services.firing import due_schedules
from spoolctl.worker.shift import LOCK_SLICE_S, TRANSIENT, Shift


class ScheduleFiring:
    def __init__(self, shift: Shift) -> None:
        self.shift = shift
        self.next_at = 0.0

    def due_at(self) -> float:
        return self.shift.db_due(self.next_at)

    def run(self, now: float) -> None:
        shift = self.shift
        if now < self.next_at or shift.db_gone:
            return
        self.next_at = now + shift.options.poll_interval_s
        try:
            with shift.report.timings.db, read_tx(shift.engine) as conn:
                due = due_schedules(conn, now)
        except TRANSIENT:
            shift.backoff.failed(now)
            return
        if not due:
            return
        from spoolctl.services.firing import fire

        for schedule_id in due:

            def one(conn: Connection, s: int = schedule_id) -> None:
                fire(conn, s, now, shift.worker_id)

            with shift.report.timings.db:
                landed = write_quietly(shift.engine, one, LOCK_SLICE_S)
            if not landed:
                self.next_at = now  # try again after the backoff
                shift.backoff.failed(now)
                return
