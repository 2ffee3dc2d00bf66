"""A worker's row: registered when it starts (after waiting out a server
that could not be reached, with an event saying how long), marked stopped
when it ends."""

from __future__ import annotations

from spoolctl import outage, procs
from spoolctl.db.engine import write_tx
from spoolctl.errors import Conflict
from spoolctl.services import heartbeat
from spoolctl.worker.shift import Shift


def register(shift: Shift, waited: outage.Outage | None, tried_at: float) -> None:
    """The worker's row; a live process already running under the same
    worker id is a CONFLICT."""
    now = shift.clock()
    with write_tx(shift.engine) as conn:
        existing = heartbeat.get_worker(conn, shift.worker_id)
        if existing is not None and existing.state == "running":
            other = procs.ProcessIdentity(existing.pid, existing.process_started_at)
            alive = procs.is_same_process(other, procs.WORKER_MARKER)
            if existing.pid != shift.identity.pid and alive is not procs.Liveness.DEAD:
                raise Conflict(
                    f"worker id {shift.worker_id!r} is in use by live pid {existing.pid}",
                    worker_id=shift.worker_id,
                )
        heartbeat.register_worker(conn, info(shift), now)
        if waited is not None:
            wait = heartbeat.ServerWait(waited.waited_s(tried_at), waited.failures, waited.error)
            heartbeat.record_server_wait(conn, shift.worker_id, shift.options.queue, wait, now)
    shift.last_beat = now


def info(shift: Shift) -> heartbeat.WorkerInfo:
    return heartbeat.WorkerInfo(
        id=shift.worker_id,
        hostname=shift.hostname,
        pid=shift.identity.pid,
        process_started_at=shift.identity.started_at,
        boot_id=shift.boot_id,
        queue=shift.options.queue,
        slots=shift.options.slots,
        concurrency=shift.options.concurrency,
    )


def retire(shift: Shift) -> None:
    """Kill what still runs (only after a hard stop or a fatal error) and
    mark the worker stopped, best effort."""
    for execution in list(shift.running.values()):
        execution.kill_now()
        execution.wait_blocking()
    shift.running.clear()
    shift.cells.close()
    if shift.db_gone:
        return
    try:
        with write_tx(shift.engine) as conn:
            heartbeat.retire_worker(conn, shift.worker_id, shift.clock(), shift.report.executed)
    except Exception:
        pass  # the reaper buries a worker whose row says running after it is gone
