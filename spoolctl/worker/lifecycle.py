"""A worker's row: registered when it starts (after waiting out a server
that could not be reached, with an event saying how long), marked stopped
when it ends."""

from __future__ import annotations

from typing import Any

from spoolctl.db import outage
from spoolctl.db.engine import write_tx
from spoolctl.errors import Conflict
from spoolctl.runner import liveness, procs
from spoolctl.services import heartbeat
from spoolctl.worker.shift import Predecessor, Shift


def register(shift: Shift, waited: outage.Outage | None, tried_at: float) -> None:
    """The worker's row; a live process already running under the same
    worker id (on this machine, where its pid can be checked) is a CONFLICT.
    A process found gone there is remembered as this worker's predecessor."""
    now = shift.clock()
    with write_tx(shift.engine) as conn:
        existing = heartbeat.get_worker(conn, shift.worker_id)
        predecessor = None if existing is None else _predecessor(shift, existing)
        if existing is not None and predecessor is None and _in_use(shift, existing):
            raise Conflict(
                f"worker id {shift.worker_id!r} is in use by live pid {existing.pid}",
                worker_id=shift.worker_id,
            )
        heartbeat.register_worker(conn, info(shift), now)
        if waited is not None:
            wait = heartbeat.ServerWait(waited.waited_s(tried_at), waited.failures, waited.error)
            heartbeat.record_server_wait(conn, shift.worker_id, shift.options.lane, wait, now)
    shift.last_beat = now
    shift.predecessor = predecessor


def _in_use(shift: Shift, row: Any) -> bool:
    """Whether a row of this worker id, not found gone, says another process
    on this machine runs under it."""
    return row.state == "running" and row.pid != shift.identity.pid and _here(shift, row)


def _here(shift: Shift, row: Any) -> bool:
    """Whether a worker row's pid can be checked from this worker: the same
    host and pid space (`liveness.probeable`); elsewhere it means nothing here."""
    return liveness.probeable(
        row.hostname, row.pid_space, hostname=shift.hostname, pid_space=shift.pid_space
    )


def _predecessor(shift: Shift, row: Any) -> Predecessor | None:
    """The process a worker row of this worker id names, where it can be
    checked from here and is gone (another boot, or no such living process)."""
    identity = procs.ProcessIdentity(row.pid, row.process_started_at)
    if identity == shift.identity or not _here(shift, row):
        return None
    if not liveness.worker_is_dead(
        row, boot_id=shift.boot_id, hostname=shift.hostname, pid_space=shift.pid_space
    ):
        return None
    return Predecessor(identity, row.boot_id)


def info(shift: Shift) -> heartbeat.WorkerInfo:
    return heartbeat.WorkerInfo(
        id=shift.worker_id,
        hostname=shift.hostname,
        pid=shift.identity.pid,
        process_started_at=shift.identity.started_at,
        boot_id=shift.boot_id,
        pid_space=shift.pid_space,
        lane=shift.options.lane,
        cap=shift.options.cap,
        concurrency=shift.options.concurrency,
        inventory=shift.capacity.inventory,
    )


def retire(shift: Shift) -> None:
    """Kill what still runs (only after a hard stop or a fatal error) and
    mark the worker stopped, best effort."""
    for execution in list(shift.running.values()):
        execution.kill_now()
        execution.wait_blocking()
    shift.forget_running()
    shift.cells.close()
    if shift.db_gone:
        return
    try:
        with write_tx(shift.engine) as conn:
            heartbeat.retire_worker(conn, shift.worker_id, shift.clock(), shift.report.executed)
    except Exception:
        pass  # the reaper buries a worker whose row says running after it is gone
