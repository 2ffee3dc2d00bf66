"""Delivering control requests (`signal`, `suspend`, `continue`) to the
attempts this worker runs (`services/control.py` holds the rows).

The worker looks for them whenever its change watch says the queue changed
while it runs jobs: inside the write transaction of its pass when it
records or claims anyway (a busy worker: no transaction of its own), else
with one read of the pending requests for its attempts; and at every
heartbeat, inside the heartbeat's own transaction, as a fallback for a
missed wake-up. A request is settled `delivered`, with its event, in
a write transaction; the worker acts only once that commits, in the order
the requests were made, so a request is acted on at most once, and one its
requester settled first (the attempt ended) is never acted on.

A request for an attempt whose leader has exited, or that is being stopped
(canceled, timed out), is left alone: its attempt ends soon, and its
requester then settles it `attempt_ended` (CONFLICT).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection

from spoolctl.db.engine import read_tx, write_quietly
from spoolctl.errors import Locked, Unreachable
from spoolctl.runner.supervise import Execution
from spoolctl.services import control
from spoolctl.states import ControlAction
from spoolctl.worker.shift import LOCK_SLICE_S, Shift


class Steering:
    """Finds, settles and carries out the control requests for this
    worker's running attempts."""

    def __init__(self, shift: Shift) -> None:
        self.shift = shift

    def _targets(self, skip: Collection[int] = ()) -> dict[int, Execution]:
        """The attempts a request can reach now, by attempt id."""
        return {
            e.claim.attempt_id: e
            for job_id, e in self.shift.running.items()
            if job_id not in skip and e.leader_running and not e.lost and not e.escalation.started
        }

    def look(self, now: float) -> None:
        """The queue changed: one read for requests to this worker's
        attempts; those found are delivered."""
        targets = self._targets()
        if not targets:
            return
        shift = self.shift
        try:
            with shift.report.timings.db, read_tx(shift.engine) as conn:
                found = control.pending(conn, targets)
        except (Locked, Unreachable):
            return  # the heartbeat looks again
        if not found:
            return
        settled: list[control.Request] = []
        with shift.report.timings.db:
            landed = write_quietly(
                shift.engine,
                lambda conn: settled.extend(self.settle(conn, now, found)),
                LOCK_SLICE_S,
            )
        if landed:
            self.act(now, settled)
        else:
            shift.backoff.failed(now)

    def within(
        self, conn: Connection, now: float, lost: Collection[int] = ()
    ) -> list[control.Request]:
        """Within a write transaction the worker makes anyway (its heartbeat,
        a pass that records and claims): settle every request waiting for
        this worker's attempts (not those just `lost`); the caller acts on
        the answer once the transaction commits (`act`)."""
        targets = self._targets(skip=lost)
        if not targets:
            return []
        return self.settle(conn, now, control.pending(conn, targets))

    def settle(
        self, conn: Connection, now: float, found: list[control.Request]
    ) -> list[control.Request]:
        """Settle each request `delivered` with its event (`control.deliver`);
        the ones this call settled, to act on after the commit."""
        targets = self._targets()
        since = {
            a: e.timers.suspended.since
            for a, e in targets.items()
            if e.timers.suspended is not None
        }
        settled = []
        for req in found:
            if req.attempt_id not in targets:
                continue
            detail: dict[str, Any] = {"attempt_id": req.attempt_id}
            if req.action is ControlAction.SUSPEND:
                since.setdefault(req.attempt_id, now)
            elif req.action is ControlAction.CONTINUE:
                began = since.pop(req.attempt_id, now)
                detail["suspended_s"] = round(max(0.0, now - began), 3)
            if control.deliver(conn, req, now, self.shift.worker_id, detail):
                settled.append(req)
        return settled

    def act(self, now: float, settled: list[control.Request]) -> None:
        """Carry out the requests settled (their transaction committed)."""
        targets = self._targets()
        for req in settled:
            execution = targets.get(req.attempt_id)
            if execution is None:
                continue
            if req.action is ControlAction.SIGNAL:
                assert req.signal is not None
                execution.send(req.signal)
            elif req.action is ControlAction.SUSPEND:
                execution.suspend(now)
            else:
                execution.resume(now)
