"""Submitting one job, as both paths run it: the idempotency-key lookup, the
comparison of a repeated submission with the job holding its key, the
insert and its `added` event. Light (no SQLAlchemy): the statements are
named here and run by whoever holds the transaction, `services/submit.py`
through SQLAlchemy's compiled statements (`services/statements.py`), the
lean path (`db/lean.py`) through the same SQL as generated for SQLite
(`db/lean_sql.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from spoolctl.db import codec
from spoolctl.errors import IdempotencyConflict
from spoolctl.services.event_row import event_row
from spoolctl.services.job_spec import IDENTITY, JobSpec
from spoolctl.states import EventKind


class Statements(Protocol):
    """Runs a named statement inside its holder's transaction."""

    def first(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """Its first row by column, or None."""
        ...


ACTIVE_WITH_KEY = "active_with_key"
"""The active job (queued, running, waiting) holding an idempotency key: binds `key`."""
INSERT_JOB = "insert_job"
"""A job's row (`JobSpec.row`'s columns), returning its id."""
INSERT_EVENT = "insert_event"
"""One ledger event (`event_row`'s binds)."""


class Submitted(NamedTuple):
    job_id: int
    state: str
    deduplicated: bool
    next_run_at: float
    priority: int
    lane: str
    cwd: str | None
    env_keys: list[str]
    metadata_differences: dict[str, dict[str, Any]] = {}  # noqa: RUF012 (shared, never changed)
    """Field -> {existing, submitted}: what a deduplicated submission did not change."""


def active_with_key(run: Statements, key: str) -> dict[str, Any] | None:
    return run.first(ACTIVE_WITH_KEY, {"key": key})


def add_row(run: Statements, row: Mapping[str, Any], now: float) -> int:
    """Insert a job's row and its `added` event; its id."""
    found = run.first(INSERT_JOB, row)
    assert found is not None  # RETURNING gives the row it inserted
    job_id = int(found["id"])
    run.first(INSERT_EVENT, event_row(job_id, EventKind.ADDED, now))
    return job_id


def submit_alone(run: Statements, spec: JobSpec, now: float) -> Submitted:
    """Add one job that waits for no other, or return the active job already
    holding its key (`services/submit.py` adds the jobs waited for)."""
    assert not (spec.after_jobs or spec.after_jobs_any)
    row = spec.row(now)
    if spec.idempotency_key is not None:
        existing = active_with_key(run, spec.idempotency_key)
        if existing is not None:
            return deduplicate(existing, row, spec)
    return added(add_row(run, row, now), row, spec)


def added(job_id: int, row: Mapping[str, Any], spec: JobSpec) -> Submitted:
    """What a new job's submission answers."""
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


def deduplicate(existing: dict[str, Any], row: dict[str, Any], spec: JobSpec) -> Submitted:
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
