"""Worker registration and heartbeats.

A heartbeat that matches zero rows for a job is proof that this worker no
longer owns it (canceled, reaped or force-retried): the caller must kill that
job's process group and record nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, exists, select, update

from spoolctl.db.backends import statements
from spoolctl.db.tables import attempts, jobs, workers
from spoolctl.resources import Inventory
from spoolctl.services import placement
from spoolctl.services.events import record_event
from spoolctl.states import AttemptState, EventKind, JobState, WorkerState


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    process_started_at: float | None
    boot_id: str
    lane: str
    cap: int | None
    """The lane's cap this worker declares (`--slots`; column `slots`)."""
    concurrency: int
    pid_space: str | None = None
    """Where `pid` names this worker (`procs.pid_space`): machine id, PID and
    cgroup namespace; None where it could not be read."""
    inventory: Inventory | None = None
    """What it has to place jobs on (its devices are registered with it)."""


def register_worker(conn: Connection, info: WorkerInfo, now: float) -> None:
    """Insert the worker row, or take over a row of a stopped or dead worker that
    used the same --worker-id (the caller checks that one is not alive)."""
    statements(conn).upsert(conn, workers, worker_row(info, now), "id")
    if info.inventory is not None:
        placement.register(conn, info.inventory, now)


def worker_row(info: WorkerInfo, now: float) -> dict[str, Any]:
    """The columns a registration writes."""
    return dict(
        id=info.id,
        hostname=info.hostname,
        pid=info.pid,
        process_started_at=info.process_started_at,
        boot_id=info.boot_id,
        pid_space=info.pid_space,
        queue=info.lane,
        slots=info.cap,
        concurrency=info.concurrency,
        inventory=None if info.inventory is None else info.inventory.as_json(),
        started_at=now,
        heartbeat_at=now,
        state=WorkerState.RUNNING.value,
        stopped_at=None,
    )


@dataclass(frozen=True)
class ServerWait:
    """How a worker's start waited for an unreachable database server."""

    waited_s: float
    failed_tries: int
    """Tries that failed before the one that got through."""
    error: str
    """The last failure's message."""


def record_server_wait(
    conn: Connection, worker_id: str, lane: str, wait: ServerWait, now: float
) -> None:
    """Put on the ledger, with the worker's registration, that it waited for
    the server: `workers` and `status` show it on the worker's row
    (`waited_for_server`), `events` as a lane event."""
    detail = {
        "queue": lane,
        "waited_s": round(wait.waited_s, 3),
        "failed_tries": wait.failed_tries,
        "error": wait.error,
    }
    record_event(conn, None, EventKind.WAITED_FOR_SERVER, now, worker_id=worker_id, detail=detail)


def get_worker(conn: Connection, worker_id: str) -> Any:
    return conn.execute(select(workers).where(workers.c.id == worker_id)).first()


def retire_worker(conn: Connection, worker_id: str, now: float, jobs_run: int) -> None:
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(
            state=WorkerState.STOPPED.value, stopped_at=now, heartbeat_at=now, jobs_run=jobs_run
        )
    )


def beat(
    conn: Connection,
    worker_id: str,
    running: Iterable[tuple[int, int]],
    now: float,
    jobs_run: int,
) -> list[int]:
    """Refresh the worker row (with its count of attempts run) and each
    (job_id, attempt_id) it runs. Returns the job ids whose ownership was lost.
    """
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(heartbeat_at=now, state=WorkerState.RUNNING.value, jobs_run=jobs_run)
    )
    lost = []
    for job_id, attempt_id in running:
        still_ours = exists().where(
            attempts.c.id == attempt_id, attempts.c.state == AttemptState.RUNNING.value
        )
        result = conn.execute(
            update(jobs)
            .where(
                jobs.c.id == job_id,
                jobs.c.state == JobState.RUNNING.value,
                jobs.c.locked_by == worker_id,
                still_ours,
            )
            .values(heartbeat_at=now)
        )
        if result.rowcount == 0:
            lost.append(job_id)
    return lost
