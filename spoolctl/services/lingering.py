"""Attempts ended by someone other than their worker (canceled, abandoned),
whose processes may still be running: how they are named, and whether one
still lives. A job whose previous attempt is such stays queued until it is
gone, so two copies of one job never run at once (services/claim.py asks)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, bindparam, select

from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts
from spoolctl.runner import procs
from spoolctl.states import AttemptState

ENDED_ELSEWHERE = frozenset({AttemptState.CANCELED.value, AttemptState.ABANDONED.value})
"""Attempts ended by someone other than their worker, whose process may linger."""


def attempt_token(worker_id: str, attempt_id: int, started_at: float) -> str:
    """Names one attempt's processes across every queue on the machine: the
    worker id (random by default), the attempt row and its claim time (to the
    microsecond, as stored) together. Rebuilt by the reaper from the attempt row."""
    return f"{worker_id}/{attempt_id}/{started_at:.6f}"


PROCESS_COLUMNS = (
    attempts.c.id,
    attempts.c.attempt_no,
    attempts.c.state,
    attempts.c.job_pid,
    attempts.c.job_started_at,
    attempts.c.worker_id,
    attempts.c.started_at,
)
"""What `still_running` reads of an attempt."""

_LATEST_ATTEMPT = Prepared(
    select(*PROCESS_COLUMNS)
    .where(attempts.c.job_id == bindparam("job_id"))
    .order_by(attempts.c.attempt_no.desc())
    .limit(1)
)


def latest_attempt(conn: Connection, job_id: int) -> Any:
    """The job's newest attempt: the next number follows it (monotonic per job,
    so a manual retry never reuses a number or its output)."""
    return _LATEST_ATTEMPT.first(conn, {"job_id": job_id})


def still_running(previous: Any, now: float) -> bool:
    """Whether a canceled or abandoned previous attempt's process still lives.

    Those processes are killed asynchronously (a force-retried job's owner kills
    it at its next heartbeat), so the job waits in the queue until the old
    process is gone: two copies of one job never run at once. A recorded pid
    with its start time is checked; without one (the attempt ended in its first
    milliseconds), the attempt's token is looked for among living processes.
    """
    if previous is None or previous.state not in ENDED_ELSEWHERE:
        return False
    if previous.job_pid is not None and previous.job_started_at is not None:
        identity = procs.ProcessIdentity(previous.job_pid, previous.job_started_at)
        return procs.is_same_process(identity) is procs.Liveness.ALIVE
    if previous.worker_id is None or previous.started_at is None:
        return False
    token = attempt_token(previous.worker_id, previous.id, previous.started_at)
    local_start = previous.started_at - (now - time.time())  # database clock -> this machine's
    return bool(procs.find_token(token, local_start).found)
