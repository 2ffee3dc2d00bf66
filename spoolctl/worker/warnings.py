"""The `warned` events of `add --signal-before-timeout`: the worker sends the
signal itself (`Execution._warn`, on the attempt's own timer) and writes the
event with its next write. A pass that records outcomes or claims writes
every unrecorded one first (so an attempt that ends right after its warning
has the event before its end); where no pass comes, `TimeoutWarnings`
writes them in a transaction of their own."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection

from spoolctl.db.engine import write_quietly
from spoolctl.runner import supervise
from spoolctl.services.events import record_warnings
from spoolctl.worker.shift import LOCK_SLICE_S, NEVER, Shift


def unrecorded(executions: Iterable[supervise.Execution]) -> list[supervise.Execution]:
    """The attempts warned whose `warned` event has not landed."""
    return [e for e in executions if e.warned_at is not None and not e.warning_recorded]


def record(conn: Connection, warned: list[supervise.Execution], worker_id: str) -> None:
    """Their `warned` events (`services/events.record_warnings`)."""
    record_warnings(
        conn,
        [
            (e.claim.job_id, e.claim.attempt_no, *e.claim.warning, e.warned_at)
            for e in warned
            if e.claim.warning is not None and e.warned_at is not None
        ],
        worker_id,
    )


def landed(warned: list[supervise.Execution]) -> None:
    for e in warned:
        e.warning_recorded = True


class TimeoutWarnings:
    """Write the `warned` events no pass took along, as soon as one is due
    (after the write backoff); retried until they land."""

    def __init__(self, shift: Shift) -> None:
        self.shift = shift

    def due_at(self) -> float:
        waiting = unrecorded(self.shift.running.values())
        if not waiting:
            return NEVER
        return self.shift.db_due(min(e.warned_at or 0.0 for e in waiting))

    def run(self, now: float) -> None:
        shift = self.shift
        warned = unrecorded(shift.running.values())
        if not warned or shift.backoff.blocks(now):
            return
        with shift.report.timings.db:
            wrote = write_quietly(
                shift.engine, lambda conn: record(conn, warned, shift.worker_id), LOCK_SLICE_S
            )
        if wrote:
            landed(warned)
        else:
            shift.backoff.failed(now)
