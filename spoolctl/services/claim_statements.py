"""The claim's statements, built once (the hot path binds values).

The claim is one statement, `take(conn)` says which form: `TAKE_NEXT` takes
the lane's first due jobs; where the backend runs writes inside a WITH
(PostgreSQL), `TAKE_AND_BEGIN` also creates their attempts and writes their
`claimed` events in the same statement, one round trip for the whole claim
(elsewhere `INSERT_ATTEMPTS` and the events follow). `CLAIMABLE` and `TAKE`
look again one job at a time where the claim came up short.
`services/claim.py` runs them and handles what they cannot (damaged rows,
attempts ended elsewhere).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Text,
    bindparam,
    exists,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)

from spoolctl import layout
from spoolctl.db.backends import statements
from spoolctl.db.backends.base import STREAMS
from spoolctl.db.prepared import Prepared, PreparedFor, item_bind
from spoolctl.db.tables import asks_for_resources, attempts, job_events, jobs, lanes
from spoolctl.services import claim_limits, lingering
from spoolctl.states import AttemptState, EventKind, JobState

LIMIT_COLUMNS = (jobs.c.memory_bytes, jobs.c.cpus)
STEERING_COLUMNS = (jobs.c.signal_before_timeout, jobs.c.signal_before_timeout_s, jobs.c.requeues)
"""What an attempt needs of `add --signal-before-timeout` and `--requeue-exit`:
the warning it gets, and the requeues so far (SPOOLCTL_REQUEUES)."""
REQUEST_COLUMNS = (
    jobs.c.weight,
    jobs.c.gpus,
    jobs.c.gpu_share,
    jobs.c.gpu_memory_bytes,
    jobs.c.gpu_model,
)
"""What the one-at-a-time claim places a job by (`resources.Request`)."""
CLAIMABLE_QUERY = (
    select(
        jobs.c.id,
        jobs.c.argv,
        jobs.c.cwd,
        jobs.c.env,
        jobs.c.timeout_seconds,
        *LIMIT_COLUMNS,
        *STEERING_COLUMNS,
        *REQUEST_COLUMNS,
    )
    .where(
        jobs.c.state == JobState.QUEUED.value,
        jobs.c.queue == bindparam("queue"),
        jobs.c.next_run_at <= bindparam("now"),
        claim_limits.enforceable(jobs, ""),
        func.coalesce(jobs.c.weight, 1) <= bindparam("w_slots"),
        func.coalesce(jobs.c.gpus, 0) <= bindparam("w_gpus"),
        func.coalesce(jobs.c.memory_bytes, 0) <= bindparam("w_memory"),
    )
    .order_by(jobs.c.priority.desc(), jobs.c.next_run_at, jobs.c.id)
    .limit(1)
    .with_for_update(skip_locked=True)
)
"""The lane's first due job in claim order that this worker could hold: it
passes over jobs the worker could never hold (`w_slots`, `w_gpus`,
`w_memory`: all it has), so a worker without GPUs in a lane of GPU jobs
still reaches the plain jobs behind them."""


def _claimable_skipping(n: int) -> Any:
    """`CLAIMABLE_QUERY` passing over n jobs already looked at (binds s_0 …)."""
    if n == 0:
        return CLAIMABLE_QUERY
    return CLAIMABLE_QUERY.where(jobs.c.id.not_in([bindparam(item_bind("s", i)) for i in range(n)]))


CLAIMABLE = PreparedFor(_claimable_skipping)
"""Built and compiled once per number of jobs passed over (the hot path
binds values instead of rebuilding statements)."""
UNBOUNDED = 1 << 62
"""`w_memory` of a worker without a memory budget."""

_TAKEN: dict[str, Any] = {
    "state": JobState.RUNNING.value,
    "locked_by": bindparam("b_worker"),
    "locked_pid": bindparam("b_pid"),
    "locked_at": bindparam("b_now"),
    "heartbeat_at": bindparam("b_now"),
    "started_at": bindparam("b_now"),
    "finished_at": None,
    "suspended_at": None,
}
"""What a claimed job's row becomes, by either claim path (an attempt starts
running: an earlier one's suspension is over)."""

TAKE = Prepared(
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"), jobs.c.state == JobState.QUEUED.value)
    .values(**_TAKEN)
)


def _insert_attempts(n: int) -> Any:
    """n attempts' rows, each returning its id with its job's."""
    return (
        insert(attempts)
        .values(
            [
                {
                    "job_id": bindparam(item_bind("b_job", i)),
                    "attempt_no": bindparam(item_bind("b_no", i)),
                    "worker_id": bindparam("b_worker"),
                    "worker_pid": bindparam("b_pid"),
                    "state": AttemptState.RUNNING.value,
                    "started_at": bindparam("b_now"),
                    "stdout_path": bindparam(item_bind("b_stdout", i)),
                    "stderr_path": bindparam(item_bind("b_stderr", i)),
                    "host": bindparam("b_host"),
                    "devices": bindparam(item_bind("b_devices", i)),
                }
                for i in range(n)
            ]
        )
        .returning(attempts.c.id, attempts.c.job_id)
    )


INSERT_ATTEMPTS = PreparedFor(_insert_attempts)
"""The attempts of everything one pass claimed: one statement."""


_PICK = jobs.alias("pick")
_ASKING = jobs.alias("asking")
NO_REQUEST_DUE = ~exists().where(
    _ASKING.c.state == literal_column(f"'{JobState.QUEUED.value}'"),
    asks_for_resources(_ASKING),
    _ASKING.c.queue == bindparam("b_queue"),
    _ASKING.c.next_run_at <= bindparam("b_now"),
)
"""No due job of the lane asks for resources (`tables.REQUESTS_WHERE`, read
from the partial index ix_jobs_requests alone): the claim's one statement
takes jobs only then, so each job that does is placed by the walk
(`services/placement.py`) in its place in claim order."""


def _first_due(allowed: ColumnElement[bool]) -> Any:
    """The lane's first `b_limit` due jobs in claim order that `allowed` lets
    this worker take (an alias: the UPDATE's own `jobs` is the row it
    changes), picked once: PostgreSQL may run a plain `IN (subquery)` again
    for each row it joins, and each run with SKIP LOCKED can pick other rows,
    taking more than the limit. A materialized CTE runs once, on both
    backends."""
    return (
        select(_PICK.c.id)
        .where(
            _PICK.c.state == JobState.QUEUED.value,
            _PICK.c.queue == bindparam("b_queue"),
            _PICK.c.next_run_at <= bindparam("b_now"),
            allowed,
            NO_REQUEST_DUE,
        )
        .order_by(_PICK.c.priority.desc(), _PICK.c.next_run_at, _PICK.c.id)
        .limit(bindparam("b_limit"))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )


def _newest_attempts(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """`column` of the newest attempt of the job being changed (correlated)."""
    return (
        select(column)
        .where(attempts.c.job_id == jobs.c.id)
        .order_by(attempts.c.attempt_no.desc())
        .limit(1)
        .scalar_subquery()
    )


_NEWEST_STATE = _newest_attempts(attempts.c.state)
NEWEST_START = _newest_attempts(attempts.c.started_at)
"""What a job's started_at was before `TAKE_NEXT` set it: its newest attempt's."""
_ENDED_ELSEWHERE_LIST: ColumnElement[Any] = literal_column(
    "(" + ", ".join(f"'{state}'" for state in sorted(lingering.ENDED_ELSEWHERE)) + ")"
)
"""The states as literals (constants of ours): a prepared statement has no
expanding parameters."""
_LAST_NO: ColumnElement[Any] = literal_column(
    "(SELECT max(attempts.attempt_no) FROM attempts WHERE attempts.job_id = jobs.id)"
).label("last_no")
"""The taken job's newest attempt number, written out: SQLAlchemy renders a
RETURNING clause's columns unqualified on SQLite, and an unqualified `id`
inside this subquery would be the attempt's own."""


def _take_next(allowed: ColumnElement[bool]) -> Any:
    """The common claim in one statement: the lane's first `b_limit` due jobs
    in claim order become running, except any whose newest attempt was ended
    by someone else (its process may linger), and none from a paused lane.
    When it takes fewer than asked, the claim (`claim._look_again`)
    looks again in claim order, one job at a time, so a job it passed over is
    still taken before any that comes after it. Rows come back in no
    particular order: sorted after.

    The jobs changed are found by id alone: `picked` read them queued (and,
    on PostgreSQL, locked them; SQLite's write lock covers the statement). A
    second `state` test here would let PostgreSQL's planner walk every queued
    job's index entries instead, which it chose whenever its statistics made
    `queued` look rare: a claim's cost then grew with the backlog."""
    return (
        update(jobs)
        .where(
            jobs.c.id.in_(select(_first_due(allowed).c.id)),
            ~exists().where(lanes.c.queue == bindparam("b_queue")),
            func.coalesce(_NEWEST_STATE, "").op("NOT IN")(_ENDED_ELSEWHERE_LIST),
        )
        .values(**_TAKEN)
        .returning(
            jobs.c.id,
            jobs.c.argv,
            jobs.c.cwd,
            jobs.c.env,
            jobs.c.timeout_seconds,
            jobs.c.priority,
            jobs.c.next_run_at,
            *LIMIT_COLUMNS,
            *STEERING_COLUMNS,
            _LAST_NO,
        )
    )


TAKE_NEXT = Prepared(_take_next(claim_limits.enforceable(_PICK)))
"""The claim where writes cannot go inside a WITH (SQLite): the attempts follow."""


def _attempt_path(job_id: ColumnElement[Any], attempt_no: ColumnElement[Any], stream: str) -> Any:
    """`layout.attempt_paths` in SQL, under the output root `b_root`."""
    folder = job_id // layout.JOBS_PER_FOLDER
    return func.concat(
        bindparam("b_root", type_=Text), "/", folder, "xxx/", job_id, ".", attempt_no, f".{stream}"
    )


def _take_and_begin() -> Any:
    """`TAKE_NEXT`, the attempts of the jobs it takes and their `claimed`
    events (in claim order, as `record_events` would write them), as one
    statement: writes inside a WITH (PostgreSQL), all seeing one snapshot,
    so each insert reads the rows the one before it returned."""
    taken = _take_next(claim_limits.allowed(_PICK)).cte("taken")
    number = func.coalesce(taken.c.last_no, 0) + 1
    made = (
        insert(attempts)
        .from_select(
            [
                "job_id",
                "attempt_no",
                "worker_id",
                "worker_pid",
                "state",
                "started_at",
                "host",
                *(f"{stream}_path" for stream in STREAMS),
            ],
            select(
                taken.c.id,
                number,
                bindparam("b_worker"),
                bindparam("b_pid"),
                literal(AttemptState.RUNNING.value),
                bindparam("b_now"),
                bindparam("b_host", type_=Text),
                *(_attempt_path(taken.c.id, number, stream) for stream in STREAMS),
            ),
        )
        .returning(
            attempts.c.id,
            attempts.c.job_id,
            attempts.c.attempt_no,
            attempts.c.stdout_path,
            attempts.c.stderr_path,
        )
        .cte("made")
    )
    noted = (
        insert(job_events)
        .from_select(
            ["job_id", "at", "event", "worker_id", "detail"],
            select(
                made.c.job_id,
                bindparam("b_now"),
                literal(EventKind.CLAIMED.value),
                bindparam("b_worker"),
                func.concat('{"attempt":', made.c.attempt_no, "}"),
            )
            .select_from(made.join(taken, taken.c.id == made.c.job_id))
            .order_by(taken.c.priority.desc(), taken.c.next_run_at, taken.c.id),
        )
        .returning(job_events.c.id, job_events.c.job_id)
        .cte("noted")
    )
    return select(
        *taken.c,
        made.c.id.label("attempt_id"),
        made.c.attempt_no,
        made.c.stdout_path,
        made.c.stderr_path,
        noted.c.id.label("event_id"),
    ).select_from(
        taken.join(made, made.c.job_id == taken.c.id).join(noted, noted.c.job_id == taken.c.id)
    )


TAKE_AND_BEGIN = Prepared(_take_and_begin())
"""The whole claim of `b_limit` jobs in one round trip, where the backend
runs writes inside a WITH (`Statements.writes_in_with`): each row is a taken
job with its new attempt's id, number and output paths, and the id of its
`claimed` event (a damaged row's claim is undone by them)."""


def take(conn: Connection) -> tuple[Prepared, bool]:
    """The claim's statement in the form conn's backend runs, and whether it
    also begins the attempts (`TAKE_AND_BEGIN`) or they follow (`TAKE_NEXT`)."""
    begins = statements(conn).writes_in_with()
    return (TAKE_AND_BEGIN if begins else TAKE_NEXT), begins
