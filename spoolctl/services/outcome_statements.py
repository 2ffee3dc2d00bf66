"""The statements that record attempts' ends, built once (the hot path binds
values).

A pass's successes are one statement, `mark_done(conn, n)` says which form:
`MARK_DONE` marks the jobs done, and the attempts and events follow in a
statement each (`FINISH_ATTEMPT`, `FINISH_CONTAINED`, the events); where the
backend runs writes inside a WITH (PostgreSQL), `MARK_DONE_AND_FINISH` does
all three in one statement, one round trip for a pass's successes. Both
bind each success's `b_job_id_i` and `b_attempt_id_i`. `services/outcome.py`
runs them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    Text,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    insert,
    literal,
    null,
    select,
    update,
    values,
)

from spoolctl.db.backends import statements
from spoolctl.db.prepared import Prepared, PreparedFor, item_bind
from spoolctl.db.tables import Int, attempts, job_events, jobs
from spoolctl.services import dependencies
from spoolctl.services.deadletter import RELEASE_LOCK
from spoolctl.states import AttemptState, EventKind, JobState


def _finished(state: Any, exit_code: Any, error: Any, reason: Any, pid: Any) -> dict[str, Any]:
    """What an attempt's end writes: its state and outcome, and its process
    (leader of its own group) where the spawn record had not stored it yet."""
    return {
        "state": state,
        "finished_at": bindparam("b_now"),
        "exit_code": exit_code,
        "error": error,
        "failure_reason": reason,
        "job_pid": func.coalesce(attempts.c.job_pid, pid),
        "job_pgid": func.coalesce(attempts.c.job_pgid, pid),
    }


_PID = bindparam("b_job_pid", type_=Integer)
_FINISHED = _finished(
    bindparam("b_state"), bindparam("b_exit"), bindparam("b_error"), bindparam("b_reason"), _PID
)
_RUNNING_ATTEMPT = (
    attempts.c.id == bindparam("b_id"),
    attempts.c.state == AttemptState.RUNNING.value,
)
FINISH_ATTEMPT = Prepared(update(attempts).where(*_RUNNING_ATTEMPT).values(**_FINISHED))
"""The attempt's end, and its process (leader of its own group) if the
spawn record had not stored it yet."""
FINISH_CONTAINED = Prepared(
    update(attempts)
    .where(*_RUNNING_ATTEMPT)
    .values(
        **_FINISHED,
        cgroup=func.coalesce(attempts.c.cgroup, bindparam("b_cgroup", type_=Text)),
        peak_memory_bytes=bindparam("b_peak", type_=Integer),
        cpu_time_s=bindparam("b_cpu", type_=Float),
    )
)
"""The same for an attempt its worker contained: its cgroup and usage too."""
_ATTEMPT_STILL_RUNS = exists().where(
    attempts.c.id == bindparam("b_attempt"), attempts.c.state == AttemptState.RUNNING.value
)
_OWNED = (
    jobs.c.id == bindparam("b_id"),
    jobs.c.state == JobState.RUNNING.value,
    jobs.c.locked_by == bindparam("b_worker"),
    _ATTEMPT_STILL_RUNS,
)
"""The job is running, owned by this worker, and its attempt is still the one
running: checked first, so the attempt update that follows cannot miss."""
OWNED_JOB = Prepared(select(jobs).where(*_OWNED).with_for_update())
"""FOR UPDATE (PostgreSQL; SQLite's write lock already covers it): the row stays
as read until the failure is recorded, whoever else wants to change it."""


def _among(attempt_ids: Any) -> tuple[Any, ...]:
    """One of these attempts is the job being changed's, and still runs."""
    return (
        attempts.c.job_id == jobs.c.id,
        attempts.c.id.in_(attempt_ids),
        attempts.c.state == AttemptState.RUNNING.value,
    )


def _running_among(attempt_ids: Any) -> Any:
    """The job being changed has one of these attempts still running."""
    return exists().where(*_among(attempt_ids))


def _still_running(attempt_ids: Any) -> Any:
    """`_running_among` as a count (0 or 1: an attempt is one job's), for
    PostgreSQL: it turns an EXISTS into a join, and chose to scan every
    attempt for it whenever it believed the table small; a count is asked
    of each job, by its key. SQLite runs the EXISTS as written, and stops at
    the first row."""
    return select(func.count()).where(*_among(attempt_ids)).scalar_subquery() > 0


def _done(job_ids: Any, running: Any) -> Any:
    """These jobs done, those this worker still owns whose attempt still runs
    (`running`: `_running_among` or `_still_running`); returning each one's
    id and whether any job awaits it."""
    return (
        update(jobs)
        .where(
            jobs.c.id.in_(job_ids),
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.locked_by == bindparam("b_worker"),
            running,
        )
        .values(
            **RELEASE_LOCK,
            state=JobState.DONE.value,
            finished_at=bindparam("b_now"),
            last_exit_code=0,
            last_error=None,
            last_failure_reason=None,
        )
        .returning(jobs.c.id, dependencies.AWAITED)
    )


def _mark_done(n: int) -> Any:
    """n jobs done (`_done`), named by binds b_job_id_i and b_attempt_id_i."""
    job_ids: list[Any] = [bindparam(item_bind("b_job_id", i)) for i in range(n)]
    attempt_ids: list[Any] = [bindparam(item_bind("b_attempt_id", i)) for i in range(n)]
    return _done(job_ids, _running_among(attempt_ids))


MARK_DONE = PreparedFor(_mark_done)
"""Built once per batch size: recording outcomes binds values instead of
rebuilding statements."""

_ENDED_COLUMNS: dict[str, Any] = {
    "ord": Int,
    "job_id": Int,
    "attempt_id": Int,
    "pid": Int,
    "contained": Int,
    "cgroup": Text,
    "peak": Int,
    "cpu": Float,
}
"""One success as `MARK_DONE_AND_FINISH` binds it (`b_<name>_i`): its place in
the pass, job, attempt, process, and what its cgroup measured (contained 1)."""


def _mark_done_and_finish(n: int) -> Any:
    """`_mark_done`, the attempts' ends (as `FINISH_ATTEMPT`, or
    `FINISH_CONTAINED` where contained) and the `succeeded` events in the
    order given, of n successes, as one statement: writes inside a WITH,
    all seeing one snapshot, the attempts and events only of the jobs the
    first one marked. Returns what `MARK_DONE` returns.

    The jobs and attempts changed are named by their bound ids, not by a
    join with `ended`: PostgreSQL then finds each by its key whatever its
    statistics say (joined, it walked every running job's index entries, or
    every attempt, when they made the tables look small)."""
    rows = values(*(column(name, kind) for name, kind in _ENDED_COLUMNS.items()), name="rows")
    ended = select(
        rows.data(
            [
                tuple(
                    cast(bindparam(item_bind(f"b_{name}", i)), kind)
                    for name, kind in _ENDED_COLUMNS.items()
                )
                for i in range(n)
            ]
        )
    ).cte("ended")
    attempt_ids: list[Any] = [bindparam(item_bind("b_attempt_id", i)) for i in range(n)]
    job_ids: list[Any] = [bindparam(item_bind("b_job_id", i)) for i in range(n)]
    marked = _done(job_ids, _still_running(attempt_ids)).cte("marked")
    ours = ended.c.job_id.in_(select(marked.c.id))
    contained = ended.c.contained == 1
    finished = (
        update(attempts)
        .where(attempts.c.id == ended.c.attempt_id, attempts.c.id.in_(attempt_ids))
        .where(attempts.c.state == AttemptState.RUNNING.value, ours)
        .values(
            **_finished(AttemptState.SUCCEEDED.value, 0, None, None, ended.c.pid),
            cgroup=case(
                (contained, func.coalesce(attempts.c.cgroup, ended.c.cgroup)),
                else_=attempts.c.cgroup,
            ),
            peak_memory_bytes=case((contained, ended.c.peak), else_=attempts.c.peak_memory_bytes),
            cpu_time_s=case((contained, ended.c.cpu), else_=attempts.c.cpu_time_s),
        )
        .cte("finished")
    )
    event: tuple[Any, ...] = (
        ended.c.job_id,
        bindparam("b_now"),
        literal(EventKind.SUCCEEDED.value),
        bindparam("b_worker"),
        null(),
    )
    noted = insert(job_events).from_select(
        ["job_id", "at", "event", "worker_id", "detail"],
        select(*event).where(ours).order_by(ended.c.ord),
    )
    return select(marked.c.id, marked.c.awaited).add_cte(finished).add_cte(noted.cte("noted"))


MARK_DONE_AND_FINISH = PreparedFor(_mark_done_and_finish)
"""A pass's successes in one round trip, where the backend runs writes inside
a WITH (`Statements.writes_in_with`)."""


def mark_done(conn: Connection, n: int) -> tuple[Prepared, bool]:
    """The statement that records n successes in the form conn's backend
    runs, and whether it also finishes their attempts and writes their events
    (`MARK_DONE_AND_FINISH`) or those follow (`MARK_DONE`)."""
    finishes = statements(conn).writes_in_with()
    return (MARK_DONE_AND_FINISH if finishes else MARK_DONE).of(n), finishes
