"""Jobs that wait for other jobs (`add --after-job`).

A job submitted after other jobs is `waiting` until every one of them is
`done`, then `queued` (keeping its own next_run_at). Waiting is a state of its
own so that the claim query (state = 'queued', served by ix_jobs_claim) never
sees such a job: a waiting job costs nothing per claim. When a job ends `dead`
or `canceled`, every job waiting for it is canceled with the failure reason
`dependency_failed` and a `dependency_failed` event naming that parent, and so
on down the chain. Only existing jobs can be named, so there are no cycles.

`add --after-job-any` links with any_end 1: such a parent counts as met once
it ended, done, dead or canceled, and its failure never cancels the child;
when a job with such parents becomes queued its env gets SPOOLCTL_PARENTS
(`12:dead,13:done`: every parent and how it ended).

Every function runs inside the caller's transaction: the transition functions
(record_outcomes, requeue_or_dead, dead_letter, cancel, the claim's
quarantine, requeue) call these so a state change and its consequences for
dependents commit together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from spoolctl.db import codec
from spoolctl.db.prepared import Prepared, PreparedFor, item_bind
from spoolctl.db.tables import job_dependencies, jobs
from spoolctl.errors import Conflict, NotFound
from spoolctl.services.events import record_event
from spoolctl.states import (
    ACTIVE_JOB_STATES,
    TERMINAL_JOB_STATES,
    EventKind,
    FailureReason,
    JobState,
)

FAILED_PARENT_STATES = frozenset({JobState.DEAD, JobState.CANCELED, JobState.FAILED})
"""A parent in one of these will never be done: its dependents are canceled."""
ENDED = [s.value for s in TERMINAL_JOB_STATES]
"""What an --after-job-any parent must be in."""
PARENTS_ENV = "SPOOLCTL_PARENTS"


@dataclass(frozen=True)
class Verdict:
    """What a job's parents allow: pending ones to wait for, or one that failed."""

    pending: list[int]
    failed: tuple[int, str] | None

    @property
    def state(self) -> JobState:
        if self.failed is not None:
            return JobState.CANCELED
        return JobState.WAITING if self.pending else JobState.QUEUED


def judge_parents(
    conn: Connection, parent_ids: Iterable[int], any_ids: Iterable[int] = ()
) -> Verdict:
    """The states of the named jobs (`any_ids`: parents of any end); NOT_FOUND
    (nothing written) if one does not exist."""
    wanted = sorted(set(parent_ids))
    wanted_any = sorted(set(any_ids) - set(wanted))
    found = {
        int(job_id): state
        for job_id, state in conn.execute(
            select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(wanted + wanted_any))
        )
    }
    missing = sorted(i for i in {*wanted, *wanted_any} if i not in found)
    if missing:
        raise NotFound(
            f"--after-job names no such job: {', '.join(map(str, missing))}", job_ids=missing
        )
    failed = next(((i, str(found[i])) for i in wanted if found[i] in FAILED_PARENT_STATES), None)
    pending = [i for i in wanted if found[i] != JobState.DONE]
    pending += [i for i in wanted_any if found[i] not in ENDED]
    return Verdict(sorted(pending), failed)


def link(
    conn: Connection,
    job_id: int,
    parent_ids: Iterable[int],
    verdict: Verdict,
    now: float,
    any_ids: Iterable[int] = (),
) -> None:
    """Record what a new job waits for; if a parent already failed, the job
    (created canceled) gets its `dependency_failed` event now."""
    strict = sorted(set(parent_ids))
    rows = [{"job_id": job_id, "after_job_id": p, "any_end": 0} for p in strict]
    rows += [
        {"job_id": job_id, "after_job_id": p, "any_end": 1}
        for p in sorted(set(any_ids) - set(strict))
    ]
    if rows:
        conn.execute(insert(job_dependencies), rows)
    if verdict.failed is not None:
        parent, parent_state = verdict.failed
        _ledger_failure(conn, job_id, parent, parent_state, now)
    elif verdict.state == JobState.QUEUED and any(r["any_end"] for r in rows):
        stamp_parents(conn, job_id)


def stamp_parents(conn: Connection, job_id: int) -> None:
    """SPOOLCTL_PARENTS into the env of a job released from its parents."""
    ends = conn.execute(
        select(job_dependencies.c.after_job_id, jobs.c.state)
        .join(jobs, jobs.c.id == job_dependencies.c.after_job_id)
        .where(job_dependencies.c.job_id == job_id)
        .order_by(job_dependencies.c.after_job_id)
    ).all()
    raw = conn.execute(select(jobs.c.env).where(jobs.c.id == job_id)).scalar()
    env = codec.load_str_map(raw or "{}")
    env[PARENTS_ENV] = ",".join(f"{parent}:{state}" for parent, state in ends)
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(env=codec.dumps(env)))


def failure_values(parent: int, parent_state: str, now: float) -> dict[str, Any]:
    """The job columns of a job canceled because `parent` failed."""
    return {
        "state": JobState.CANCELED.value,
        "finished_at": now,
        "last_failure_reason": FailureReason.DEPENDENCY_FAILED.value,
        "last_error": f"dependency failed: job {parent} is {parent_state}",
    }


AWAITED: ColumnElement[Any] = literal_column(
    "(EXISTS (SELECT 1 FROM job_dependencies WHERE job_dependencies.after_job_id = jobs.id))"
).label("awaited")
"""For a RETURNING clause over jobs: whether any job depends on this one (by
the after_job_id index), so that a pass looks for dependents to release only
where there are some. Written out: SQLAlchemy renders RETURNING columns
unqualified on SQLite."""


def _waiting_children_of(n: int) -> Any:
    """The waiting jobs that depend on any of n parents."""
    return (
        select(job_dependencies.c.job_id, job_dependencies.c.any_end)
        .join(jobs, jobs.c.id == job_dependencies.c.job_id)
        .where(
            job_dependencies.c.after_job_id.in_(
                [bindparam(item_bind("b_parent", i)) for i in range(n)]
            ),
            jobs.c.state == JobState.WAITING.value,
        )
        .order_by(job_dependencies.c.job_id)
    )


_WAITING_CHILDREN = PreparedFor(_waiting_children_of)
_UNMET_PARENT = Prepared(
    select(job_dependencies.c.after_job_id)
    .join(jobs, jobs.c.id == job_dependencies.c.after_job_id)
    .where(
        job_dependencies.c.job_id == bindparam("b_child"),
        or_(
            and_(job_dependencies.c.any_end == 0, jobs.c.state != JobState.DONE.value),
            and_(
                job_dependencies.c.any_end == 1,
                or_(*(jobs.c.state == s.value for s in sorted(ACTIVE_JOB_STATES))),
            ),
        ),
    )
    .limit(1)
)
_HAS_ANY_PARENT = Prepared(
    select(job_dependencies.c.after_job_id)
    .where(job_dependencies.c.job_id == bindparam("b_child"), job_dependencies.c.any_end == 1)
    .limit(1)
)
_RELEASE = Prepared(
    update(jobs)
    .where(jobs.c.id == bindparam("b_child"), jobs.c.state == JobState.WAITING.value)
    .values(state=JobState.QUEUED.value)
)


def _waiting_children(conn: Connection, parent: int, *, any_end: bool = False) -> list[int]:
    """Children waiting for `parent` to be done (any_end: to end at all)."""
    rows = _WAITING_CHILDREN.of(1).all(conn, {item_bind("b_parent", 0): parent})
    return [row.job_id for row in rows if bool(row.any_end) == any_end]


def release_dependents(conn: Connection, parent: int, *, any_end_only: bool = False) -> list[int]:
    """`parent` is done (any_end_only: ended otherwise): its waiting dependents
    whose parents are now all met become queued. One indexed lookup when
    nothing waits for it."""
    return release_dependents_of(conn, [parent], any_end_only=any_end_only)


def release_dependents_of(
    conn: Connection, parents: Sequence[int], *, any_end_only: bool = False
) -> list[int]:
    """`release_dependents` for several parents: one lookup for all of them."""
    if not parents:
        return []
    lookup = {item_bind("b_parent", i): parent for i, parent in enumerate(parents)}
    released: list[int] = []
    for row in _WAITING_CHILDREN.of(len(parents)).all(conn, lookup):
        child = row.job_id
        if (any_end_only and not row.any_end) or child in released:
            continue
        if _UNMET_PARENT.first(conn, {"b_child": child}) is None:
            _RELEASE.execute(conn, {"b_child": child})
            if _HAS_ANY_PARENT.first(conn, {"b_child": child}) is not None:
                stamp_parents(conn, child)
            released.append(child)
    return released


def cancel_dependents(conn: Connection, parent: int, parent_state: str, now: float) -> list[int]:
    """`parent` ended dead or canceled: every job waiting for it, and every job
    waiting for those, is canceled with `dependency_failed`, each with an event
    naming its own parent."""
    canceled: list[int] = []
    frontier = deque([(parent, parent_state)])
    while frontier:
        current, current_state = frontier.popleft()
        for child in _waiting_children(conn, current):
            conn.execute(
                update(jobs)
                .where(jobs.c.id == child, jobs.c.state == JobState.WAITING.value)
                .values(**failure_values(current, current_state, now))
            )
            _ledger_failure(conn, child, current, current_state, now)
            canceled.append(child)
            frontier.append((child, JobState.CANCELED.value))
        release_dependents(conn, current, any_end_only=True)  # ended: enough for these
    return canceled


def _ledger_failure(
    conn: Connection, child: int, parent: int, parent_state: str, now: float
) -> None:
    record_event(
        conn,
        child,
        EventKind.DEPENDENCY_FAILED,
        now,
        detail={"parent": parent, "parent_state": parent_state},
    )


def parents_of(conn: Connection, job_id: int, *, any_end: bool = False) -> list[int]:
    """The jobs it must wait to be done (any_end: to have ended)."""
    return [
        int(i)
        for i in conn.execute(
            select(job_dependencies.c.after_job_id)
            .where(
                job_dependencies.c.job_id == job_id,
                job_dependencies.c.any_end == (1 if any_end else 0),
            )
            .order_by(job_dependencies.c.after_job_id)
        ).scalars()
    ]


def retried_state(conn: Connection, job_id: int) -> JobState:
    """Where a manual retry puts a job: queued, or waiting while a parent is
    not done yet. CONFLICT while a parent is dead or canceled (retry that one,
    with --with-dependents)."""
    parents = parents_of(conn, job_id)
    any_parents = parents_of(conn, job_id, any_end=True)
    if not parents and not any_parents:
        return JobState.QUEUED
    verdict = judge_parents(conn, parents, any_parents)
    if verdict.failed is not None:
        parent, parent_state = verdict.failed
        raise Conflict(
            f"job {job_id} waits for job {parent}, which is {parent_state}; "
            f"retry that one with: spoolctl retry {parent} --with-dependents",
            job_id=job_id,
            parent=parent,
            parent_state=parent_state,
        )
    return JobState.WAITING if verdict.pending else JobState.QUEUED


_CANCELED_CHILDREN = (
    select(job_dependencies.c.job_id)
    .join(jobs, jobs.c.id == job_dependencies.c.job_id)
    .where(
        job_dependencies.c.after_job_id == bindparam("b_parent"),
        job_dependencies.c.any_end == 0,
        jobs.c.state == JobState.CANCELED.value,
        jobs.c.last_failure_reason == FailureReason.DEPENDENCY_FAILED.value,
    )
)


def restore_dependents(conn: Connection, parent: int, now: float) -> list[int]:
    """`retry --with-dependents`: the jobs canceled because `parent` (or, down
    the chain, one of them) failed go back to waiting (queued if every parent
    is done), unless another of their parents still failed. Each gets a
    `retried` event naming the job it was restored with."""
    restored: list[int] = []
    frontier = deque([parent])
    while frontier:
        current = frontier.popleft()
        for child in conn.execute(_CANCELED_CHILDREN, {"b_parent": current}).scalars():
            verdict = judge_parents(
                conn, parents_of(conn, child), parents_of(conn, child, any_end=True)
            )
            if verdict.failed is not None:
                continue
            conn.execute(
                update(jobs)
                .where(jobs.c.id == child, jobs.c.state == JobState.CANCELED.value)
                .values(
                    state=verdict.state.value,
                    finished_at=None,
                    last_failure_reason=None,
                    last_error=None,
                    attempts=0,
                    crashes=0,
                )
            )
            record_event(
                conn,
                int(child),
                EventKind.RETRIED,
                now,
                detail={"from": JobState.CANCELED.value, "with_parent": current},
            )
            restored.append(int(child))
            frontier.append(int(child))
    return restored


WAITS_FOR_CHUNK = 500
"""Ids per query: well under SQLite's limit on bound parameters, whatever
`list --limit 0` returns."""


def waits_for(conn: Connection, job_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """For each job, the jobs it was submitted after, with their states (one
    query per 500 jobs over the dependency primary key)."""
    found: dict[int, list[dict[str, Any]]] = {}
    ids = list(job_ids)
    for start in range(0, len(ids), WAITS_FOR_CHUNK):
        rows = conn.execute(
            select(job_dependencies.c.job_id, job_dependencies.c.after_job_id, jobs.c.state)
            .join(jobs, jobs.c.id == job_dependencies.c.after_job_id)
            .where(job_dependencies.c.job_id.in_(ids[start : start + WAITS_FOR_CHUNK]))
            .order_by(job_dependencies.c.job_id, job_dependencies.c.after_job_id)
        )
        for child, parent, state in rows:
            found.setdefault(int(child), []).append({"job_id": int(parent), "state": state})
    return found


def dependents_of(conn: Connection, job_id: int) -> list[int]:
    """The jobs submitted after this one (served by ix_job_dependencies_after_job_id)."""
    return [
        int(i)
        for i in conn.execute(
            select(job_dependencies.c.job_id)
            .where(job_dependencies.c.after_job_id == job_id)
            .order_by(job_dependencies.c.job_id)
        ).scalars()
    ]
