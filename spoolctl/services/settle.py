"""A worker's pass: the ends of its attempts recorded and the next jobs
claimed, in the caller's write transaction, answered together where the
backend can (`Statements.pipeline`: on PostgreSQL the pass's statements go
out in one round trip, with the transaction's opening first).

`settle` is the pass's one call. `worker/settle.py` says when a pass runs,
what ended and how many it wants, and starts what was claimed; it never
sees a statement or the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from sqlalchemy import Connection

from spoolctl.db.backends import statements
from spoolctl.db.backends.base import OutputWriter
from spoolctl.resources import Free
from spoolctl.services import due
from spoolctl.services.claim import Claim, Claimant, Claiming
from spoolctl.services.outcome import Ending, Recording
from spoolctl.states import JobState


class Settled(NamedTuple):
    """What a pass did."""

    states: list[JobState | None]
    """Each ending's job state after it, in order (None: the attempt was no
    longer this worker's: canceled, reaped or force-retried meanwhile)."""
    claims: list[Claim]
    """The jobs claimed, in claim order."""
    claimed: bool
    """Whether the pass claimed (False: `beside` said not to)."""
    next_due_at: float | None
    """Where fewer were claimed than wanted: when the lane's next queued job
    is due (None: none is queued, or the claim was not short)."""


def settle(
    conn: Connection,
    claimant: Claimant,
    endings: Sequence[Ending],
    wanted: int,
    now: float,
    *,
    output: OutputWriter | None = None,
    beside: Callable[[Connection], bool] | None = None,
    first: Callable[[Connection], None] | None = None,
    room: Free | None = None,
) -> Settled:
    """Record `endings` (their attempts' remaining output stored first by
    `output`, so whoever sees an attempt ended finds all of its output in the
    database), then claim up to `wanted` jobs for the claimant.

    beside: what the caller runs in the same round trip once the outcomes
    are sent (a worker's due spawn records, its scan for stale jobs);
    returns whether to claim. The outcomes are read before the claim: where
    the claim sent beside them came up short, its next look sees the jobs
    their successes released.

    first: what the caller writes before the outcomes (a worker's `warned`
    events, which come before the ends they warned of).

    room: what the worker has free once these attempts ended (None:
    `wanted` slots), which jobs that ask for resources must fit."""
    with statements(conn).pipeline(conn) as gathered:  # its end: one wait for all
        if first is not None:
            first(conn)
        if endings and output is not None:
            output.copy(conn, [e.attempt_id for e in endings], final=True)
        worker_id = claimant.worker_id
        recording = Recording(conn, endings, worker_id=worker_id, now=now, answer_now=not gathered)
        claims_now = beside is None or beside(conn)
        claiming = Claiming(conn, claimant, wanted, now, room) if claims_now else None
    states = recording.states()
    if claiming is None:
        return Settled(states, [], False, None)
    claims = claiming.claims()
    next_due_at = due.next_due_at(conn, claimant.lane) if len(claims) < wanted else None
    return Settled(states, claims, True, next_due_at)
