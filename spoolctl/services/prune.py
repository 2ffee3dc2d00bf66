"""Deleting old terminal jobs: their output files first, then their rows.

Files go first so that a crash in between leaves rows pointing at missing
files (reported as missing) rather than files nobody can find. A path is
deleted only if its real location (symlinks resolved) is a regular file inside
the spool's output folder: whatever a row says, nothing else is ever touched.
Deletion is done in batches, each in its own short write transaction, so
workers are never kept waiting for long.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, func, select

from spoolctl.db.tables import attempts, job_events, jobs
from spoolctl.states import JobState

PRUNABLE = (JobState.DONE, JobState.FAILED, JobState.DEAD, JobState.CANCELED)
BATCH_SIZE = 500


@dataclass
class PruneReport:
    matched: int = 0
    deleted_jobs: int = 0
    deleted_attempts: int = 0
    deleted_events: int = 0
    freed_bytes: int = 0
    skipped_paths: list[str] = field(default_factory=list)


def candidates(
    conn: Connection, states: tuple[str, ...], cutoff: float, limit: int | None
) -> list[int]:
    """Ids of terminal jobs finished before cutoff (index: state, finished_at)."""
    query = select(jobs.c.id).where(jobs.c.state.in_(states), jobs.c.finished_at < cutoff)
    return [int(r.id) for r in conn.execute(query if limit is None else query.limit(limit))]


def output_paths(conn: Connection, job_ids: list[int]) -> list[str]:
    rows = conn.execute(
        select(attempts.c.stdout_path, attempts.c.stderr_path).where(attempts.c.job_id.in_(job_ids))
    )
    return [p for row in rows for p in row if p]


def contained_file(path: str, output_root: Path) -> str | None:
    """The real path if it is a regular file strictly inside output_root."""
    root = os.path.realpath(output_root)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root or real == root:
        return None
    return real if os.path.isfile(real) else None


def remove_files(
    paths: list[str], output_root: Path, report: PruneReport, *, dry_run: bool
) -> None:
    for path in paths:
        real = contained_file(path, output_root)
        if real is None:
            if os.path.lexists(path):
                report.skipped_paths.append(path)
            continue
        size = os.path.getsize(real)
        if not dry_run:
            try:
                os.unlink(real)
            except OSError:
                report.skipped_paths.append(path)
                continue
            remove_empty_parents(Path(real).parent, Path(os.path.realpath(output_root)))
        report.freed_bytes += size


def remove_empty_parents(folder: Path, root: Path) -> None:
    """The attempt folder and the job folder, once empty; never the root."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def count_children(conn: Connection, job_ids: list[int]) -> tuple[int, int]:
    n_attempts = conn.execute(
        select(func.count()).select_from(attempts).where(attempts.c.job_id.in_(job_ids))
    ).scalar_one()
    n_events = conn.execute(
        select(func.count()).select_from(job_events).where(job_events.c.job_id.in_(job_ids))
    ).scalar_one()
    return int(n_attempts), int(n_events)


def prune_batch(
    conn: Connection,
    states: tuple[str, ...],
    cutoff: float,
    output_root: Path,
    report: PruneReport,
) -> bool:
    """Delete one batch inside the caller's transaction; False when none is left."""
    ids = candidates(conn, states, cutoff, BATCH_SIZE)
    if not ids:
        return False
    report.matched += len(ids)
    remove_files(output_paths(conn, ids), output_root, report, dry_run=False)
    report.deleted_events += _deleted(conn, delete(job_events).where(job_events.c.job_id.in_(ids)))
    report.deleted_attempts += _deleted(conn, delete(attempts).where(attempts.c.job_id.in_(ids)))
    report.deleted_jobs += _deleted(conn, delete(jobs).where(jobs.c.id.in_(ids)))
    return True


def survey(
    conn: Connection,
    states: tuple[str, ...],
    cutoff: float,
    output_root: Path,
    report: PruneReport,
) -> None:
    """What prune_batch would delete, counted in one read snapshot (dry run)."""
    ids = candidates(conn, states, cutoff, None)
    report.matched = report.deleted_jobs = len(ids)
    for start in range(0, len(ids), BATCH_SIZE):
        chunk = ids[start : start + BATCH_SIZE]
        remove_files(output_paths(conn, chunk), output_root, report, dry_run=True)
        n_attempts, n_events = count_children(conn, chunk)
        report.deleted_attempts += n_attempts
        report.deleted_events += n_events


def _deleted(conn: Connection, statement: Any) -> int:
    return int(conn.execute(statement).rowcount or 0)
