"""Submitting jobs: one, or a batch in one all-or-nothing transaction.

Values arrive validated (spoolctl.validate); this module decides what the
queue does with them: idempotency-key deduplication and insertion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection, insert, select

from spoolctl.db import codec
from spoolctl.db.tables import job_events, jobs
from spoolctl.errors import IdempotencyConflict
from spoolctl.services.dependencies import failure_values, judge_parents, link
from spoolctl.services.events import record_event
from spoolctl.states import ACTIVE_JOB_STATES, EventKind, JobState

DEFAULT_TIMEOUT_S = 300
DEFAULT_MAX_RETRIES = 3
DEFAULT_QUEUE = "default"

IDENTITY_FIELDS = (
    "argv",
    "cwd",
    "env",
    "timeout_seconds",
    "max_retries",
    "max_crashes",
    "queue",
    "priority",
)
"""Fields that make two submissions under one key the same job."""


@dataclass(frozen=True)
class JobSpec:
    argv: list[str]
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    timeout_seconds: int = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    max_crashes: int | None = None
    run_at: float | None = None
    idempotency_key: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    after_jobs: tuple[int, ...] = ()
    """Jobs that must be done before this one is claimable (--after-job)."""
    after_lines: tuple[int, ...] = ()
    """In a batch: positions of earlier specs this one waits for, resolved to
    their ids at insert time."""
    after_jobs_any: tuple[int, ...] = ()
    """Jobs that must have ended, in any way, before this one is claimable
    (--after-job-any)."""
    after_lines_any: tuple[int, ...] = ()
    """In a batch: the same, as positions of earlier specs."""
    memory_bytes: int | None = None
    cpus: float | None = None
    """The job's limits (--memory, --cpus), set through its attempt's cgroup."""
    require_limits: bool = False
    """Only a worker that can enforce the limits claims the job."""

    def row(self, now: float) -> dict[str, Any]:
        return {
            "argv": codec.dumps(self.argv),
            "state": JobState.QUEUED.value,
            "queue": self.queue,
            "priority": self.priority,
            "next_run_at": now if self.run_at is None else max(self.run_at, now),
            "created_at": now,
            "timeout_seconds": self.timeout_seconds,
            "max_retries": self.max_retries,
            "max_crashes": self.max_crashes,
            "idempotency_key": self.idempotency_key,
            "tags": codec.dumps(self.tags),
            "note": self.note,
            "cwd": self.cwd,
            "env": codec.dumps(self.env),
            **self.limit_columns(),
        }

    def limit_columns(self) -> dict[str, Any]:
        """The limit columns a job with limits sets (one without writes none)."""
        found: dict[str, Any] = {}
        if self.memory_bytes is not None:
            found["memory_bytes"] = self.memory_bytes
        if self.cpus is not None:
            found["cpus"] = self.cpus
        if self.require_limits:
            found["require_limits"] = 1
        return found


@dataclass(frozen=True)
class Submitted:
    job_id: int
    state: str
    deduplicated: bool
    next_run_at: float
    priority: int
    queue: str
    cwd: str | None
    env_keys: list[str]
    metadata_differences: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Field -> {existing, submitted}: what a deduplicated submission did not change."""


def submit(conn: Connection, spec: JobSpec, now: float) -> Submitted:
    """Add one job, or return the active job already holding its key."""
    row = spec.row(now)
    if spec.idempotency_key is not None:
        existing = _active_with_key(conn, spec.idempotency_key)
        if existing is not None:
            return _deduplicate(existing, row, spec)
    waits = spec.after_jobs or spec.after_jobs_any
    verdict = judge_parents(conn, spec.after_jobs, spec.after_jobs_any) if waits else None
    if verdict is not None:
        row["state"] = verdict.state.value
        if verdict.failed is not None:
            row.update(failure_values(*verdict.failed, now))
    job_id = _insert(conn, row, now)
    if verdict is not None:
        link(conn, job_id, spec.after_jobs, verdict, now, spec.after_jobs_any)
    return Submitted(
        job_id=job_id,
        state=row["state"],
        deduplicated=False,
        next_run_at=row["next_run_at"],
        priority=spec.priority,
        queue=spec.queue,
        cwd=spec.cwd,
        env_keys=sorted(spec.env),
    )


def submit_batch(conn: Connection, specs: Sequence[JobSpec], now: float) -> list[int]:
    """Insert every spec in the caller's one transaction, ids in input order.

    Runs of specs without a key go in with one multi-row INSERT ... RETURNING
    (and one for their `added` events); a keyed spec deduplicates as in submit,
    and a spec that waits for other jobs (earlier lines included) goes in as
    in submit once those have their ids.
    """
    ids: list[int] = []
    plain: list[dict[str, Any]] = []
    for spec in specs:
        waits = spec.after_jobs or spec.after_lines or spec.after_jobs_any or spec.after_lines_any
        if spec.idempotency_key is None and not waits:
            plain.append(spec.row(now))
            continue
        ids.extend(_insert_many(conn, plain, now))
        plain = []
        after = (*spec.after_jobs, *(ids[i] for i in spec.after_lines))
        after_any = (*spec.after_jobs_any, *(ids[i] for i in spec.after_lines_any))
        resolved = replace(
            spec, after_jobs=after, after_lines=(), after_jobs_any=after_any, after_lines_any=()
        )
        ids.append(submit(conn, resolved, now).job_id)
    ids.extend(_insert_many(conn, plain, now))
    return ids


def _insert_many(conn: Connection, rows: list[dict[str, Any]], now: float) -> list[int]:
    if not rows:
        return []
    keys = set().union(*rows)  # a batch where some jobs have limits: every row names them
    rows = [row if len(row) == len(keys) else {k: row.get(k) for k in keys} for row in rows]
    result = conn.execute(insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True), rows)
    ids = [int(job_id) for job_id in result.scalars()]
    conn.execute(
        insert(job_events),
        [{"job_id": i, "at": now, "event": EventKind.ADDED.value} for i in ids],
    )
    return ids


def _insert(conn: Connection, row: dict[str, Any], now: float) -> int:
    job_id = conn.execute(insert(jobs).values(**row)).inserted_primary_key[0]  # type: ignore[index]
    record_event(conn, int(job_id), EventKind.ADDED, now)
    return int(job_id)


def _active_with_key(conn: Connection, key: str) -> dict[str, Any] | None:
    found = (
        conn.execute(
            select(jobs).where(
                jobs.c.idempotency_key == key,
                jobs.c.state.in_([s.value for s in ACTIVE_JOB_STATES]),
            )
        )
        .mappings()
        .first()
    )
    return dict(found) if found is not None else None


def _deduplicate(existing: dict[str, Any], row: dict[str, Any], spec: JobSpec) -> Submitted:
    key = spec.idempotency_key
    differing = [f for f in IDENTITY_FIELDS if existing[f] != row[f]]
    if differing:
        raise IdempotencyConflict(
            f"job {existing['id']} is active under key {key!r} with a different "
            f"{', '.join(differing)}",
            job_id=existing["id"],
            key=key,
            differences=differing,
        )
    meta_diff = {
        f: {"existing": _shown(f, existing[f]), "submitted": _shown(f, row[f])}
        for f in ("tags", "note")
        if existing[f] != row[f]
    }
    if spec.run_at is not None and row["next_run_at"] != existing["next_run_at"]:
        meta_diff["next_run_at"] = {
            "existing": existing["next_run_at"],
            "submitted": row["next_run_at"],
        }
    return Submitted(
        job_id=existing["id"],
        state=existing["state"],
        deduplicated=True,
        next_run_at=existing["next_run_at"],
        priority=existing["priority"],
        queue=existing["queue"],
        cwd=existing["cwd"],
        env_keys=sorted(codec.load_str_map(existing["env"])),
        metadata_differences=meta_diff,
    )


def _shown(name: str, value: Any) -> Any:
    """A stored column as a person submitted it: tags decoded, a damaged value as is."""
    if name != "tags" or not isinstance(value, str):
        return value
    try:
        return codec.load_str_map(value)
    except codec.DamagedValue:
        return value
