"""claim_next: the atomic hand-over of one queued job to one worker.

Runs inside the caller's write transaction. On SQLite that is BEGIN
IMMEDIATE, so the select, the update to running and the attempt insert happen
under the write lock; on PostgreSQL the select takes the job's row with FOR
UPDATE SKIP LOCKED (claimants skip each other's rows instead of waiting), and
the update is still guarded by `state = 'queued'`. Either way two workers can
never both take one job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal_column,
    select,
    update,
)

from spoolctl import layout
from spoolctl.containment import NO_LIMITS, Limits
from spoolctl.db import codec
from spoolctl.db.backends import statements
from spoolctl.db.prepared import Prepared, PreparedFor, item_bind, item_binds
from spoolctl.db.tables import attempts, jobs, lanes
from spoolctl.services import claim_limits, lingering
from spoolctl.services.deadletter import RELEASE_LOCK
from spoolctl.services.dependencies import cancel_dependents
from spoolctl.services.events import event_row, record_event, record_events
from spoolctl.services.lanes import is_paused
from spoolctl.services.lingering import attempt_token
from spoolctl.states import AttemptState, EventKind, JobState


@dataclass(frozen=True)
class Claim:
    """Everything a worker needs to run one attempt, fixed at claim time."""

    job_id: int
    attempt_id: int
    attempt_no: int
    argv: list[str]
    cwd: str | None
    env: dict[str, str]
    timeout_seconds: int
    queue: str
    stdout_path: str
    stderr_path: str
    token: str = ""
    """SPOOLCTL_ATTEMPT_TOKEN: set in the job's environment before it is spawned."""
    limits: Limits = NO_LIMITS
    """The job's --memory and --cpus (enforced where the worker's cgroups can)."""


_LIMIT_COLUMNS = (jobs.c.memory_bytes, jobs.c.cpus)
_CLAIMABLE_QUERY = (
    select(jobs.c.id, jobs.c.argv, jobs.c.cwd, jobs.c.env, jobs.c.timeout_seconds, *_LIMIT_COLUMNS)
    .where(
        jobs.c.state == JobState.QUEUED.value,
        jobs.c.queue == bindparam("queue"),
        jobs.c.next_run_at <= bindparam("now"),
        claim_limits.enforceable(jobs, ""),
    )
    .order_by(jobs.c.priority.desc(), jobs.c.next_run_at, jobs.c.id)
    .limit(1)
    .with_for_update(skip_locked=True)
)
_CLAIMABLE = Prepared(_CLAIMABLE_QUERY)
"""Built once: the hot path binds values instead of rebuilding statements."""

_TAKEN: dict[str, Any] = {
    "state": JobState.RUNNING.value,
    "locked_by": bindparam("b_worker"),
    "locked_pid": bindparam("b_pid"),
    "locked_at": bindparam("b_now"),
    "heartbeat_at": bindparam("b_now"),
    "started_at": bindparam("b_now"),
    "finished_at": None,
}
"""What a claimed job's row becomes, by either claim path."""

_TAKE = Prepared(
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
                }
                for i in range(n)
            ]
        )
        .returning(attempts.c.id, attempts.c.job_id)
    )


_INSERT_ATTEMPTS = PreparedFor(_insert_attempts)
"""The attempts of everything one pass claimed: one statement."""


_PICK = jobs.alias("pick")
_FIRST_DUE = (
    select(_PICK.c.id)
    .where(
        _PICK.c.state == JobState.QUEUED.value,
        _PICK.c.queue == bindparam("b_queue"),
        _PICK.c.next_run_at <= bindparam("b_now"),
        claim_limits.enforceable(_PICK),
    )
    .order_by(_PICK.c.priority.desc(), _PICK.c.next_run_at, _PICK.c.id)
    .limit(bindparam("b_limit"))
    .with_for_update(skip_locked=True)
    .cte("picked")
    .prefix_with("MATERIALIZED", dialect="postgresql")
)
"""The lane's first `b_limit` due jobs in claim order (an alias: the UPDATE's
own `jobs` is the row it changes), picked once: PostgreSQL may run a plain
`IN (subquery)` again for each row it joins, and each run with SKIP LOCKED
can pick other rows, taking more than the limit. A materialized CTE runs
once, on both backends."""


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
_NEWEST_START = _newest_attempts(attempts.c.started_at)
"""What a job's started_at was before `_TAKE_NEXT` set it: its newest attempt's."""
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
_TAKE_NEXT = Prepared(
    update(jobs)
    .where(
        jobs.c.id.in_(select(_FIRST_DUE.c.id)),
        jobs.c.state == JobState.QUEUED.value,
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
        *_LIMIT_COLUMNS,
        _LAST_NO,
    )
)
"""The common claim in one statement: the lane's first `b_limit` due jobs in
claim order become running, except any whose newest attempt was ended by
someone else (its process may linger), and none from a paused lane. When it
takes fewer than asked, the slow path (`_claim_slowly`) looks again in claim
order, one job at a time, so a job it passed over is still taken before any
that comes after it. Rows come back in no particular order: sorted after."""


def _claimable_skipping(skip: list[int]) -> Select[Any]:
    return _CLAIMABLE_QUERY.where(jobs.c.id.not_in(skip))


def running_in_queue(conn: Connection, queue: str) -> int:
    return int(
        conn.execute(
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.state == JobState.RUNNING.value, jobs.c.queue == queue)
        ).scalar_one()
    )


def claim_next(
    conn: Connection,
    *,
    worker_id: str,
    worker_pid: int,
    queue: str,
    slots: int | None,
    output_root: Path,
    now: float,
) -> Claim | None:
    """Claim the highest-priority due job of `queue`, or None (`claim_up_to`
    for one)."""
    found = claim_up_to(conn, 1, worker_id=worker_id, worker_pid=worker_pid, queue=queue,
                        slots=slots, output_root=output_root, now=now)  # fmt: skip
    return found[0] if found else None


def claim_up_to(
    conn: Connection,
    wanted: int,
    *,
    worker_id: str,
    worker_pid: int,
    queue: str,
    slots: int | None,
    output_root: Path,
    now: float,
    enforces: tuple[bool, bool] = (False, False),
) -> list[Claim]:
    """Claim up to `wanted` due jobs of `queue` (a worker's free slots), in
    claim order: priority (high first), then next_run_at, then id.

    With `slots`, no more are claimed than leave that many jobs of the queue
    running fleet-wide. A job whose stored row is damaged (argv, env, timeout
    or cwd that are not what the schema promises) is sent to dead unexecuted,
    with the reason in its last_error, and the next job is tried. A job whose
    previous attempt was canceled or abandoned while its process still lives
    stays queued until that process is gone. Nothing is claimed from a paused
    lane. A job that requires its limits is claimed only when `enforces`
    (memory, cpu: what this worker's cgroups can limit) covers them.

    The common case is one statement for all of them (`_TAKE_NEXT`, which
    returns what each attempt needs), then each attempt's row and event.
    """
    if slots is not None:
        statements(conn).before_slot_count(conn, queue)
        wanted = min(wanted, slots - running_in_queue(conn, queue))
    by = (worker_id, worker_pid, queue, output_root, now, enforces)
    taken = {"b_queue": queue, "b_now": now, "b_worker": worker_id, "b_pid": worker_pid,
             **claim_limits.binds(enforces)}  # fmt: skip
    claims: list[Claim] = []
    while len(claims) < wanted:
        asked = wanted - len(claims)
        rows = _TAKE_NEXT.all(conn, {**taken, "b_limit": asked})
        rows.sort(key=lambda row: (-row.priority, row.next_run_at, row.id))
        sound: list[_Taken] = []
        for row in rows:
            try:
                decoded = _decode(row)
            except codec.DamagedValue as exc:
                _quarantine(conn, row.id, str(exc), now)
                continue
            sound.append((row, 1 if row.last_no is None else row.last_no + 1, decoded))
        claims += _begin_attempts(conn, sound, by)
        if len(rows) < asked:
            break
    while len(claims) < wanted:
        claim = _claim_slowly(conn, by)
        if claim is None:
            break
        claims.append(claim)
    return claims


_Decoded = tuple[list[str], dict[str, str], int, str | None]
_By = tuple[str, int, str, Path, float, tuple[bool, bool]]
"""Who claims and when: worker id, worker pid, queue, output root, now, and
the limits (memory, cpu) the worker can enforce."""


def _decode(row: Any) -> _Decoded:
    """argv, env, timeout and cwd as the schema promises them (DamagedValue if not)."""
    return (
        codec.load_argv(row.argv),
        codec.load_str_map(row.env),
        codec.load_timeout(row.timeout_seconds),
        codec.load_cwd(row.cwd),
    )


def _claim_slowly(conn: Connection, by: _By) -> Claim | None:
    """The claim when the first due job could not be taken in one statement:
    the lane is paused, it has nothing due, or its first job's previous
    attempt was ended elsewhere (checked here for a lingering process, in
    claim order, skipping such jobs one by one)."""
    worker_id, worker_pid, queue, _, now, enforces = by
    if is_paused(conn, queue):
        return None
    skip: list[int] = []
    while True:
        params = {"queue": queue, "now": now, **claim_limits.binds(enforces, "")}
        if skip:
            row = conn.execute(_claimable_skipping(skip), params).first()
        else:
            row = _CLAIMABLE.first(conn, params)
        if row is None:
            return None
        previous = lingering.latest_attempt(conn, row.id)
        if lingering.still_running(previous, now):
            skip.append(row.id)
            continue
        try:
            decoded = _decode(row)
        except codec.DamagedValue as exc:
            _quarantine(conn, row.id, str(exc), now)
            continue
        taken = {"b_id": row.id, "b_worker": worker_id, "b_pid": worker_pid, "b_now": now}
        _TAKE.execute(conn, taken)
        attempt_no = 1 if previous is None else previous.attempt_no + 1
        return _begin_attempts(conn, [(row, attempt_no, decoded)], by)[0]


_Taken = tuple[Any, int, _Decoded]
"""A taken job: its row, its new attempt's number, its decoded command."""


def _begin_attempts(conn: Connection, taken: list[_Taken], by: _By) -> list[Claim]:
    """The taken jobs' attempt rows and their `claimed` events (a statement
    each for all of them), in the order given; and for a job with limits this
    worker cannot enforce, `limits_not_enforced`. by: who claims, and when."""
    if not taken:
        return []
    worker_id, worker_pid, queue, output_root, now, enforces = by
    paths = [layout.attempt_paths(output_root, row.id, no) for row, no, _ in taken]
    items = [
        {"b_job": row.id, "b_no": no, "b_stdout": stdout, "b_stderr": stderr}
        for (row, no, _), (stdout, stderr) in zip(taken, paths, strict=True)
    ]
    params = {**item_binds(items), "b_worker": worker_id, "b_pid": worker_pid, "b_now": now}
    made = {r.job_id: int(r.id) for r in _INSERT_ATTEMPTS.of(len(taken)).all(conn, params)}
    record_events(conn, [
        event_row(row.id, EventKind.CLAIMED, now, worker_id=worker_id, detail={"attempt": no})
        for row, no, _ in taken
    ])  # fmt: skip
    claims = []
    for (row, attempt_no, decoded), (stdout_path, stderr_path) in zip(taken, paths, strict=True):
        argv, env, timeout_seconds, cwd = decoded
        attempt_id = made[row.id]
        limits = claim_limits.limits_of(row)
        if limits.any:
            who = (worker_id, now)
            claim_limits.note_unenforced(conn, row.id, attempt_no, limits, enforces, who)
        claims.append(Claim(
            job_id=row.id, attempt_id=attempt_id, attempt_no=attempt_no, argv=argv, cwd=cwd,
            env=env, timeout_seconds=timeout_seconds, queue=queue, stdout_path=stdout_path,
            stderr_path=stderr_path, token=attempt_token(worker_id, attempt_id, now),
            limits=limits,
        ))  # fmt: skip
    return claims


def _quarantine(conn: Connection, job_id: int, problem: str, now: float) -> None:
    """A job whose stored command cannot be trusted goes to dead, unexecuted:
    from queued (the slow path), or from the running state `_TAKE_NEXT` has
    just given it in this transaction (no attempt exists for that claim)."""
    conn.execute(
        update(jobs)
        .where(
            jobs.c.id == job_id,
            jobs.c.state.in_([JobState.QUEUED.value, JobState.RUNNING.value]),
        )
        .values(
            **RELEASE_LOCK,
            state=JobState.DEAD.value,
            started_at=case(
                (jobs.c.state == JobState.RUNNING.value, _NEWEST_START), else_=jobs.c.started_at
            ),
            finished_at=now,
            last_error=f"damaged row, not executed: {problem}",
        )
    )
    record_event(conn, job_id, EventKind.DEAD, now, detail={"reason": "damaged_row"})
    cancel_dependents(conn, job_id, JobState.DEAD.value, now)
