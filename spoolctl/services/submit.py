"""Submitting jobs: one, or a batch in one all-or-nothing transaction.

Values arrive validated (by the rules `services/job_spec.py` declares); this
module decides what the queue does with them: idempotency-key deduplication
and insertion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert

from spoolctl.db.tables import job_events, jobs
from spoolctl.services.dependencies import failure_values, judge_parents, link
from spoolctl.services.events import record_event
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.statements import PreparedStatements
from spoolctl.services.submission import (
    Submitted,
    active_with_key,
    added,
    deduplicate,
    submit_alone,
)
from spoolctl.states import EventKind


def submit(conn: Connection, spec: JobSpec, now: float) -> Submitted:
    """Add one job, or return the active job already holding its key."""
    run = PreparedStatements(conn)
    waits = spec.after_jobs or spec.after_jobs_any
    if not waits:
        return submit_alone(run, spec, now)
    row = spec.row(now)
    if spec.idempotency_key is not None:
        existing = active_with_key(run, spec.idempotency_key)
        if existing is not None:
            return deduplicate(existing, row, spec)
    verdict = judge_parents(conn, spec.after_jobs, spec.after_jobs_any)
    row["state"] = verdict.state.value
    if verdict.failed is not None:
        row.update(failure_values(*verdict.failed, now))  # columns beyond INSERT_JOB's
    job_id = _insert(conn, row, now)
    link(conn, job_id, spec.after_jobs, verdict, now, spec.after_jobs_any)
    return added(job_id, row, spec)


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
        resolved = spec._replace(
            after_jobs=after, after_lines=(), after_jobs_any=after_any, after_lines_any=()
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
