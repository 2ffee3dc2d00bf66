"""Deleting old terminal jobs: their rows in a short transaction, then their
output files once it has committed.

Prune owns only what it derives from the ids of the jobs whose rows it
deleted, in both layouts of `spoolctl.layout`: the files
`<spool>/output/<F>xxx/<job id>.<n>.stdout|stderr` (claimed since 0.5.1) and
`<spool>/output/<job id>/<n>/stdout|stderr` (claimed before, and adopted
legacy output, which adoption relocates only onto that shape), found by
listing those folders (real folders and regular files only, never a
symlink). What a row says is never followed: a stored path that is not one
of those files (another job's output, a file outside the spool, a legacy
path that stayed where it was) is reported in `skipped_paths`, never deleted.

No file is unlinked while the write lock is held, so workers never wait on the
disk for prune. Job ids are never reused (AUTOINCREMENT), so a file derived
from a deleted id can belong to no other job. A crash between the commit and
the deletes leaves output files without a job row: disk space, not data;
they may be deleted by hand.

A schedule's occurrence rows (`schedule_occurrences`) whose job is gone
(pruned now or before: the row's job_id is set to NULL with it) or that
never had one (a skipped fire time) are deleted too once they are older than
the cutoff, except each schedule's latest fire time's: the rows are history
for `schedule show`, and without this a schedule's table grows by a row a
fire time forever. Rows whose job is still there stay, whatever `--state` says.

A job an attempt of which still holds a device (`device_holds`: an orphan
of a canceled or reaped attempt not yet confirmed gone keeps its hold, see
`services/placement.py`) is left in place, with its attempts, events and
output, and named in `held_jobs`: its rows go with a later prune, once the
hold is released.

On a PostgreSQL queue the attempts' output stored in the database
(`output_chunks`) is deleted with the attempts, in the same transaction
(counted in `deleted_output_chunks` and `deleted_output_bytes`); the local
files prune finds are those of this machine's spool.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, and_, delete, func, or_, select

from spoolctl import layout
from spoolctl.db.tables import (
    attempts,
    device_holds,
    job_events,
    jobs,
    output_chunks,
    schedule_occurrences,
    schedules,
)
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
    deleted_output_chunks: int = 0
    deleted_output_bytes: int = 0
    """Output stored in the database (PostgreSQL queues; 0 on SQLite)."""
    deleted_occurrences: int = 0
    """Schedule occurrence rows without a job, older than the cutoff."""
    held_jobs: list[int] = field(default_factory=list)
    """Jobs that matched but were kept: an attempt of theirs still holds a
    device (an orphan not confirmed gone)."""


_HOLDING = select(attempts.c.job_id).select_from(
    device_holds.join(attempts, attempts.c.id == device_holds.c.attempt_id)
)
"""The jobs an attempt of which holds a device (a small table: holds are few)."""


def _finished(states: tuple[str, ...], cutoff: float) -> ColumnElement[bool]:
    return and_(jobs.c.state.in_(states), jobs.c.finished_at < cutoff)


def _prunable(states: tuple[str, ...], cutoff: float) -> Select[tuple[int]]:
    """Terminal jobs finished before cutoff (index: state, finished_at) that
    hold no device: deleting their attempts would leave a hold dangling."""
    return select(jobs.c.id).where(_finished(states, cutoff), jobs.c.id.not_in(_HOLDING))


def held(conn: Connection, states: tuple[str, ...], cutoff: float) -> list[int]:
    """The jobs prune would delete but for a device an attempt of theirs holds."""
    query = select(jobs.c.id).where(_finished(states, cutoff), jobs.c.id.in_(_HOLDING))
    return [int(r.id) for r in conn.execute(query.order_by(jobs.c.id))]


def candidates(
    conn: Connection, states: tuple[str, ...], cutoff: float, limit: int | None
) -> list[int]:
    """Ids of the jobs prune deletes (at most limit)."""
    query = _prunable(states, cutoff)
    return [int(r.id) for r in conn.execute(query if limit is None else query.limit(limit))]


def _past_occurrences(cutoff: float, jobless: ColumnElement[bool]) -> ColumnElement[bool]:
    """Occurrence rows older than cutoff, before their schedule's latest fire time,
    and without a job by `jobless`."""
    latest = (
        select(schedules.c.last_slot_at)
        .where(schedules.c.id == schedule_occurrences.c.schedule_id)
        .scalar_subquery()
    )
    return and_(
        schedule_occurrences.c.at < cutoff, schedule_occurrences.c.slot_at < latest, jobless
    )


def prune_occurrences(
    conn: Connection, cutoff: float, after_id: int, report: PruneReport
) -> int | None:
    """Delete one batch of past occurrence rows whose job is gone, the first
    with ids above after_id (the primary key walked once over all batches,
    never the rows of an earlier batch again); the last id it looked at, or
    None when no such row is left."""
    batch = (
        select(schedule_occurrences.c.id)
        .where(
            schedule_occurrences.c.id > after_id,
            _past_occurrences(cutoff, schedule_occurrences.c.job_id.is_(None)),
        )
        .order_by(schedule_occurrences.c.id)
        .limit(BATCH_SIZE)
    )
    found = [int(r.id) for r in conn.execute(batch)]
    if not found:
        return None
    conn.execute(delete(schedule_occurrences).where(schedule_occurrences.c.id.in_(found)))
    report.deleted_occurrences += len(found)
    return found[-1]


def count_occurrences(conn: Connection, states: tuple[str, ...], cutoff: float) -> int:
    """How many occurrence rows a prune would delete: those already without a
    job, and those of the jobs it deletes."""
    column = schedule_occurrences.c.job_id
    jobless = or_(column.is_(None), column.in_(_prunable(states, cutoff)))
    query = (
        select(func.count())
        .select_from(schedule_occurrences)
        .where(_past_occurrences(cutoff, jobless))
    )
    return int(conn.execute(query).scalar_one())


def stored_paths(conn: Connection, job_ids: list[int]) -> list[str]:
    """The output paths the jobs' attempt rows record (reported, never followed)."""
    rows = conn.execute(
        select(attempts.c.stdout_path, attempts.c.stderr_path).where(attempts.c.job_id.in_(job_ids))
    )
    return [p for row in rows for p in row if p]


@dataclass(frozen=True)
class PrunedBatch:
    """Jobs whose rows one transaction deleted, and the paths their rows held."""

    job_ids: list[int]
    stored_paths: list[str]


def owned_files(output_root: Path, job_ids: list[int]) -> tuple[list[Path], list[Path]]:
    """(regular files prune may delete, other entries it leaves) of the jobs,
    in both layouts (`spoolctl.layout`): the files named `<job>.<n>.<stream>`
    in the jobs' shared folders, each folder listed once, and whatever is in
    a job's own folder `<job>/<n>/<stream>`. Symlinks are never followed."""
    owned: list[Path] = []
    other: list[Path] = []
    wanted = set(job_ids)
    for name in sorted({layout.folder_name(job_id) for job_id in wanted}):
        folder = output_root / name
        for entry in _listing(folder):
            if layout.job_of(entry) in wanted:
                _sort_entry(folder / entry, owned, other)
    for job_id in job_ids:
        for attempt_dir in _real_subdirs(output_root / str(job_id)):
            for stream in layout.STREAMS:
                _sort_entry(attempt_dir / stream, owned, other)
    return owned, other


def _sort_entry(path: Path, owned: list[Path], other: list[Path]) -> None:
    if _is(path, stat.S_ISREG):
        owned.append(path)
    elif os.path.lexists(path):
        other.append(path)


def _listing(folder: Path) -> list[str]:
    """The names in a real folder; nothing when it is a symlink or missing."""
    if not _is(folder, stat.S_ISDIR):
        return []
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _real_subdirs(folder: Path) -> list[Path]:
    """Numbered attempt folders of a job folder; nothing when either is a symlink."""
    names = _listing(folder)
    return [folder / n for n in names if n.isdigit() and _is(folder / n, stat.S_ISDIR)]


def _is(path: Path, kind: Callable[[int], bool]) -> bool:
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_output(
    batch: PrunedBatch, output_root: Path, report: PruneReport, *, dry_run: bool
) -> None:
    """Delete (or, dry, count) the batch's derived files; report the rest."""
    owned, other = owned_files(output_root, batch.job_ids)
    report.skipped_paths += [str(p) for p in other]
    accounted = {os.path.realpath(p) for p in (*owned, *other)}
    for path in owned:
        _remove(path, output_root, report, dry_run=dry_run)
    for stored in batch.stored_paths:
        if os.path.realpath(stored) not in accounted and os.path.lexists(stored):
            report.skipped_paths.append(stored)


def _remove(path: Path, output_root: Path, report: PruneReport, *, dry_run: bool) -> None:
    try:
        size = os.lstat(path).st_size
        if not dry_run:
            os.unlink(path)
    except OSError:
        report.skipped_paths.append(str(path))
        return
    report.freed_bytes += size
    if not dry_run:
        remove_empty_parents(path.parent, output_root)


def remove_empty_parents(folder: Path, root: Path) -> None:
    """The attempt folder and the job folder, or the shared folder, once
    empty; never the root. (A worker about to open a file in a shared folder
    removed here makes it again: `runner/supervise.open_output`.)"""
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
    conn: Connection, states: tuple[str, ...], cutoff: float, report: PruneReport
) -> PrunedBatch | None:
    """Delete one batch of rows inside the caller's transaction; None when none
    is left. The caller removes the batch's output after the commit."""
    ids = candidates(conn, states, cutoff, BATCH_SIZE)
    report.held_jobs = held(conn, states, cutoff)  # as the last batch found them
    if not ids:
        return None
    report.matched += len(ids)
    batch = PrunedBatch(ids, stored_paths(conn, ids))
    report.deleted_events += _deleted(conn, delete(job_events).where(job_events.c.job_id.in_(ids)))
    count_chunks(conn, ids, report)  # output stored in the database (none on SQLite)
    chunks = output_chunks.c.attempt_id.in_(_attempt_ids(ids))
    conn.execute(delete(output_chunks).where(chunks))
    report.deleted_attempts += _deleted(conn, delete(attempts).where(attempts.c.job_id.in_(ids)))
    report.deleted_jobs += _deleted(conn, delete(jobs).where(jobs.c.id.in_(ids)))
    return batch


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
    report.held_jobs = held(conn, states, cutoff)
    for start in range(0, len(ids), BATCH_SIZE):
        chunk = ids[start : start + BATCH_SIZE]
        batch = PrunedBatch(chunk, stored_paths(conn, chunk))
        remove_output(batch, output_root, report, dry_run=True)
        n_attempts, n_events = count_children(conn, chunk)
        report.deleted_attempts += n_attempts
        report.deleted_events += n_events
        count_chunks(conn, chunk, report)
    report.deleted_occurrences = count_occurrences(conn, states, cutoff)


def _attempt_ids(job_ids: list[int]) -> Select[tuple[int]]:
    return select(attempts.c.id).where(attempts.c.job_id.in_(job_ids))


def count_chunks(conn: Connection, job_ids: list[int], report: PruneReport) -> None:
    """Add the jobs' output stored in the database to the report."""
    found = conn.execute(
        select(func.count(), func.coalesce(func.sum(func.length(output_chunks.c.data)), 0)).where(
            output_chunks.c.attempt_id.in_(_attempt_ids(job_ids))
        )
    ).one()
    report.deleted_output_chunks += int(found[0])
    report.deleted_output_bytes += int(found[1])


def _deleted(conn: Connection, statement: Any) -> int:
    return int(conn.execute(statement).rowcount or 0)
