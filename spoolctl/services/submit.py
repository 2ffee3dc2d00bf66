"""Submitting jobs: one, or a batch in one all-or-nothing transaction.

Values arrive validated (by the rules `services/job_spec.py` declares); this
module decides what the queue does with them: idempotency-key deduplication
and insertion.
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
from spoolctl.services.job_spec import IDENTITY, JobSpec
from spoolctl.states import ACTIVE_JOB_STATES, EventKind


@dataclass(frozen=True)
class Submitted:
    job_id: int
    state: str
    deduplicated: bool
    next_run_at: float
    priority: int
    lane: str
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
        lane=spec.lane,
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
    differing = [f for f in IDENTITY if existing[f] != row[f]]
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
        lane=existing["queue"],
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
