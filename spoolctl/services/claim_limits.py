"""A job's --memory/--cpus at claim time: which workers may take a job that
requires them, what the attempt is to enforce, and the event a worker that
cannot enforce them writes (the job then runs without them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Integer, and_, bindparam, func, literal_column, not_, or_, select
from sqlalchemy.sql.elements import ColumnElement

from spoolctl.db.tables import jobs
from spoolctl.runner.containment import NO_LIMITS, Limits
from spoolctl.states import EventKind, JobState

_NEEDING = jobs.alias("needing")


def _cannot_enforce(table: Any, prefix: str) -> ColumnElement[bool]:
    """The row has a limit this worker cannot enforce (binds
    `<prefix>can_memory`, `<prefix>can_cpu`: 1 or 0)."""
    can_memory = bindparam(f"{prefix}can_memory", type_=Integer)
    can_cpu = bindparam(f"{prefix}can_cpu", type_=Integer)
    return or_(
        and_(table.c.memory_bytes.is_not(None), can_memory == 0),
        and_(table.c.cpus.is_not(None), can_cpu == 0),
    )


def enforceable(table: Any, prefix: str = "b_") -> ColumnElement[bool]:
    """The job is not one that requires a limit this worker cannot enforce
    (binds `<prefix>can_memory`, `<prefix>can_cpu`: 1 or 0). Asked of the
    partial index ix_jobs_needs_limits (the queued jobs that require their
    limits, none in the common case), so the claim's own walk of the claim
    index reads no table row for it (SQLite's)."""
    refused = select(_NEEDING.c.id).where(needs_limits(_NEEDING), _cannot_enforce(_NEEDING, prefix))
    result: ColumnElement[bool] = table.c.id.not_in(refused)
    return result


def allowed(table: Any, prefix: str = "b_") -> ColumnElement[bool]:
    """`enforceable` asked of the row itself, for a claim that reads each row
    it passes anyway (PostgreSQL's locks it). The subquery would offer
    PostgreSQL's planner a walk of every queued job's index entries
    (`state = 'queued'`), which it took whenever its statistics made queued
    jobs look rare."""
    required = func.coalesce(table.c.require_limits, 0) == 1
    return not_(and_(required, _cannot_enforce(table, prefix)))


def needs_limits(table: Any) -> ColumnElement[bool]:
    """Queued and requiring its limits, as literals: a bound value would not
    tell the planner that the partial index ix_jobs_needs_limits covers it."""
    return and_(
        table.c.state == literal_column(f"'{JobState.QUEUED.value}'"),
        table.c.require_limits == literal_column("1"),
    )


def binds(enforces: tuple[bool, bool], prefix: str = "b_") -> dict[str, int]:
    """enforces: (memory, cpu) this worker can enforce."""
    return {f"{prefix}can_memory": int(enforces[0]), f"{prefix}can_cpu": int(enforces[1])}


def limits_of(row: Any) -> Limits:
    """The limits a claimed row carries (a row read without the columns: none)."""
    memory, cpus = getattr(row, "memory_bytes", None), getattr(row, "cpus", None)
    if memory is None and cpus is None:
        return NO_LIMITS
    return Limits(None if memory is None else int(memory), None if cpus is None else float(cpus))


def note_unenforced(
    conn: Connection,
    job_id: int,
    attempt_no: int,
    limits: Limits,
    enforces: tuple[bool, bool],
    by: tuple[str, float],
) -> None:
    """The `limits_not_enforced` event, when the job has a limit this worker
    cannot enforce. by: (worker id, now)."""
    missing = []
    if limits.memory_bytes is not None and not enforces[0]:
        missing.append("memory")
    if limits.cpus is not None and not enforces[1]:
        missing.append("cpus")
    if not missing:
        return
    from spoolctl.services.events import record_event  # the claim's: status need not load it

    worker_id, now = by
    detail = {
        "attempt": attempt_no,
        "memory_bytes": limits.memory_bytes,
        "cpus": limits.cpus,
        "not_enforced": missing,
    }
    record_event(
        conn, job_id, EventKind.LIMITS_NOT_ENFORCED, now, worker_id=worker_id, detail=detail
    )
