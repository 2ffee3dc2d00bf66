"""Verbs that steer a running job through its worker: signal, suspend, continue.

Each writes a request (`services/control.py`) that the worker owning the
attempt delivers, from wherever it runs, then waits until it is settled:
delivered (ok), or the attempt ended first (CONFLICT, nothing was done).
"""

from __future__ import annotations

import functools
import signal as signals
import time
from typing import Any

import click

from spoolctl.cli.options import JOB_ID, db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.cli.steer import SignalName, existing_queue
from spoolctl.config import Timing
from spoolctl.db.queue import Queue
from spoolctl.errors import Conflict, WaitTimeout
from spoolctl.services import control
from spoolctl.states import ControlAction, ControlResult

POLL_FIRST_S = 0.005
POLL_MAX_S = 0.05
"""A waiting requester reads its request's row this often: soon at first
(an idle worker delivers within milliseconds), then less often."""
PATIENCE_MIN_S = 10.0
"""A requester waits at least this long (a loaded machine's worker, or one
riding out a busy lock, may take seconds to look)."""


def steer(
    db: str | None,
    job_id: int,
    action: ControlAction,
    *,
    wait: bool,
    as_json: bool,
    signal: int | None = None,
) -> int:
    """Write the request and, with wait, answer once it is settled."""
    queue = existing_queue(db, job_id)
    now = queue.now()
    req = queue.write(lambda conn: control.request(conn, job_id, action, now=now, signal=signal))
    data: dict[str, Any] = {
        "job_id": job_id,
        "attempt_id": req.attempt_id,
        "request_id": req.id,
        "action": action.value,
        "delivered_at": None,
    }
    if signal is not None:
        data["signal"] = signals.Signals(signal).name
    what = data.get("signal", action.value)
    if not wait:
        return emit(Reply(data, text=f"Job {job_id}: {what} requested ({req.id})"), as_json)
    data["delivered_at"] = delivered(queue, req)
    return emit(Reply(data, text=f"Job {job_id}: {what} delivered"), as_json)


def patience_s() -> float:
    """How long a requester waits for its worker: a live worker looks for
    requests at every heartbeat, and a dead one's attempt is ended by any
    other worker once it is silent for the reap threshold; past both, no
    worker is there to settle it (TIMEOUT; the request stays, for a worker
    that comes back)."""
    timing = Timing.from_env()
    return max(PATIENCE_MIN_S, timing.reap_threshold_s + 2 * timing.heartbeat_interval_s)


def delivered(queue: Queue, req: control.Request) -> float:
    """When the request's worker delivered it; Conflict once its attempt
    ended first (this requester then settles it so: nothing is done);
    WaitTimeout when nothing settled it within `patience_s`."""
    pause = POLL_FIRST_S
    give_up_at = time.monotonic() + patience_s()
    while True:
        found = queue.read(lambda conn: control.awaited(conn, req.id))
        if found is not None and found.result is ControlResult.ATTEMPT_ENDED:
            drop = functools.partial(control.drop_if_ended, request_id=req.id, now=queue.now())
            if queue.write(drop):
                break
            found = queue.read(lambda conn: control.settled(conn, req.id))
        if found is not None and found.result is ControlResult.DELIVERED:
            return found.at
        if found is not None:
            break
        if time.monotonic() >= give_up_at:
            raise WaitTimeout(
                f"job {req.job_id}'s worker did not deliver the {req.action.value} within "
                f"{patience_s():g}s and no worker ended its attempt: its worker may have "
                "died with no other worker running to reap it; the request stays, and is "
                "delivered if that worker beats again",
                job_id=req.job_id,
                request_id=req.id,
            )
        time.sleep(pause)
        pause = min(POLL_MAX_S, pause * 2)
    raise Conflict(
        f"job {req.job_id}'s attempt ended before its worker delivered the "
        f"{req.action.value}: nothing was done",
        job_id=req.job_id,
        attempt_id=req.attempt_id,
        request_id=req.id,
    )


def no_wait_option(fn: Any) -> Any:
    return click.option(
        "--no-wait",
        is_flag=True,
        help="Answer once the request is written, not once its worker delivered it.",
    )(fn)


@verb(
    "signal",
    mutates=True,
    idempotent=False,
    examples=("spoolctl signal 42", "spoolctl signal 42 --signal USR1"),
)
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--signal",
    "signal_name",
    type=SignalName(),
    default=None,
    help="The signal, by name or number (default TERM).",
)
@no_wait_option
@db_option
@json_option
def signal(
    job_id: int, signal_name: int | None, no_wait: bool, db: str | None, as_json: bool
) -> int:
    """Steer a running job: send it a signal (see also suspend, continue).

    Every process of the job gets the signal, through its worker.

    The job's cgroup gets it where it has one (children that called setsid()
    included), else its process group and every process carrying its attempt
    token. STOP and CONT are refused: use suspend and continue. Waits until
    the worker delivered it; CONFLICT if the job is not running or its
    attempt ended first (nothing sent).
    """
    sig = signals.SIGTERM if signal_name is None else signal_name
    return steer(db, job_id, ControlAction.SIGNAL, wait=not no_wait, as_json=as_json, signal=sig)


@verb("suspend", mutates=True, idempotent=False, examples=("spoolctl suspend 42",))
@click.argument("job_id", type=JOB_ID)
@no_wait_option
@db_option
@json_option
def suspend(job_id: int, no_wait: bool, db: str | None, as_json: bool) -> int:
    """Stop a running job in place: all its processes, until `continue`.

    Its worker freezes the job's cgroup, else SIGSTOPs its process group. The
    time it stands still does not count against its --timeout. CONFLICT if
    it is not running or already suspended.
    """
    return steer(db, job_id, ControlAction.SUSPEND, wait=not no_wait, as_json=as_json)


@verb("continue", mutates=True, idempotent=False, examples=("spoolctl continue 42",))
@click.argument("job_id", type=JOB_ID)
@no_wait_option
@db_option
@json_option
def continue_(job_id: int, no_wait: bool, db: str | None, as_json: bool) -> int:
    """Run a suspended job on: its timeout moves on by the time it stood still.

    CONFLICT if the job is not suspended.
    """
    return steer(db, job_id, ControlAction.CONTINUE, wait=not no_wait, as_json=as_json)
