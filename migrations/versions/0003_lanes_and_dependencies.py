"""Paused lanes, job dependencies, the `waiting` state, lane events

Revision ID: 0003_lanes_and_dependencies
Revises: 0002_state_checks
Create Date: 2026-12-01 01:30:00

New tables: `lanes` (a row means the queue is paused) and `job_dependencies`
(job_id waits until after_job_id is done; rows cascade with either job). jobs,
attempts and job_events are rebuilt in batch mode (SQLite cannot change a
CHECK or a NOT NULL in place): the job state `waiting` and the failure reason
`dependency_failed` join the CHECKs, the active-key index covers waiting jobs,
and job_events.job_id becomes nullable (a lane event names no job) with
`event` widened to 32 characters. Each rebuild is given the *target* shape as
`copy_from` and copies every row by column name with its id; AUTOINCREMENT
high-water marks are saved and restored around it, as in 0002.

Downgrade refuses (CONFLICT, nothing changed) while a lane is paused or a job
is waiting: 0002 can express neither. Otherwise it drops the new tables, turns
`dependency_failed` on canceled jobs into `canceled` (their last_error still
names the parent) and deletes the lane events (0002 requires a job id).

PostgreSQL changes the same things in place, with no rebuild and no
sqlite_sequence: it swaps the three CHECKs and the active-key index
(`postgresql_where`, the same predicate), and alters job_events.job_id's NOT
NULL and event's type. Going down it keeps `event` at 32 characters: event
names longer than 16 (`orphan_unconfirmed`, `dependency_failed`) stay as they
are, as they do in SQLite, which never enforced the 16.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0003_lanes_and_dependencies"
down_revision: str | None = "0002_state_checks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_JOB_STATES = ("queued", "running", "done", "failed", "dead", "canceled")
NEW_JOB_STATES = (*OLD_JOB_STATES, "waiting")
ATTEMPT_STATES = ("running", "succeeded", "failed", "timed_out", "abandoned", "canceled")
OLD_REASONS = ("process_exit", "timeout", "spawn_failed", "worker_crash", "canceled", "unknown")
NEW_REASONS = (*OLD_REASONS, "dependency_failed")
OLD_KEY_WHERE = "idempotency_key IS NOT NULL AND state IN ('queued', 'running')"
NEW_KEY_WHERE = "idempotency_key IS NOT NULL AND state IN ('queued', 'running', 'waiting')"
REBUILT = ("jobs", "attempts", "job_events")


def _jobs(metadata: sa.MetaData, *, new: bool) -> sa.Table:
    table = sa.Table(
        "jobs",
        metadata,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("argv", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(64), server_default="default", nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_run_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("crashes", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_retries", sa.Integer(), server_default="3", nullable=False),
        sa.Column("max_crashes", sa.Integer()),
        sa.Column("timeout_seconds", sa.Integer(), server_default="300", nullable=False),
        sa.Column("idempotency_key", sa.Text()),
        sa.Column("tags", sa.Text(), server_default="{}", nullable=False),
        sa.Column("note", sa.Text()),
        sa.Column("cwd", sa.Text()),
        sa.Column("env", sa.Text(), server_default="{}", nullable=False),
        sa.Column("locked_by", sa.Text()),
        sa.Column("locked_pid", sa.Integer()),
        sa.Column("locked_at", sa.Float()),
        sa.Column("heartbeat_at", sa.Float()),
        sa.Column("last_exit_code", sa.Integer()),
        sa.Column("last_error", sa.Text()),
        sa.Column("last_failure_reason", sa.String(32)),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.CheckConstraint(_in("state", NEW_JOB_STATES if new else OLD_JOB_STATES), name="state"),
        sa.CheckConstraint(
            _in("last_failure_reason", NEW_REASONS if new else OLD_REASONS, nullable=True),
            name="last_failure_reason",
        ),
        sqlite_autoincrement=True,
    )
    sa.Index(
        "ix_jobs_claim",
        table.c.state,
        table.c.queue,
        table.c.priority.desc(),
        table.c.next_run_at,
        table.c.id,
    )
    sa.Index("ix_jobs_state_heartbeat", table.c.state, table.c.heartbeat_at)
    sa.Index("ix_jobs_state_finished", table.c.state, table.c.finished_at)
    sa.Index("ix_jobs_state_id", table.c.state, table.c.id)
    sa.Index("ix_jobs_queue_id", table.c.queue, table.c.id)
    sa.Index(
        "uq_jobs_active_key",
        table.c.idempotency_key,
        unique=True,
        sqlite_where=sa.text(NEW_KEY_WHERE if new else OLD_KEY_WHERE),
        postgresql_where=sa.text(NEW_KEY_WHERE if new else OLD_KEY_WHERE),
    )
    return table


def _attempts(metadata: sa.MetaData, *, new: bool) -> sa.Table:
    return sa.Table(
        "attempts",
        metadata,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("worker_pid", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float()),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("error", sa.Text()),
        sa.Column("failure_reason", sa.String(32)),
        sa.Column("stdout_path", sa.Text(), nullable=False),
        sa.Column("stderr_path", sa.Text(), nullable=False),
        sa.Column("job_pid", sa.Integer()),
        sa.Column("job_pgid", sa.Integer()),
        sa.Column("job_started_at", sa.Float()),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_attempts_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        sa.UniqueConstraint("job_id", "attempt_no", name="uq_attempts_job_id_attempt_no"),
        sa.CheckConstraint(_in("state", ATTEMPT_STATES), name="state"),
        sa.CheckConstraint(
            _in("failure_reason", NEW_REASONS if new else OLD_REASONS, nullable=True),
            name="failure_reason",
        ),
        sqlite_autoincrement=True,
    )


def _job_events(metadata: sa.MetaData, *, new: bool) -> sa.Table:
    table = sa.Table(
        "job_events",
        metadata,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=new),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("event", sa.String(32 if new else 16), nullable=False),
        sa.Column("worker_id", sa.Text()),
        sa.Column("detail", sa.Text()),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
        sqlite_autoincrement=True,
    )
    sa.Index("ix_job_events_job_id", table.c.job_id, table.c.id)
    return table


def _in(column: str, values: tuple[str, ...], *, nullable: bool = False) -> str:
    listed = ", ".join(f"'{v}'" for v in values)
    check = f"{column} IN ({listed})"
    return f"{column} IS NULL OR {check}" if nullable else check


def _rebuilds() -> bool:
    """SQLite recreates a table to change it; PostgreSQL alters it in place.
    Read from the migration context, so it holds offline (`--sql`) too."""
    return op.get_context().dialect.name == "sqlite"


def _rebuild(*, new: bool) -> None:
    """Rebuild the three tables into the target shape, rows and ids kept."""
    if not _rebuilds():
        _alter_in_place(new=new)
        return
    metadata = sa.MetaData(naming_convention={"ck": "ck_%(table_name)s_%(constraint_name)s"})
    for shape in (_jobs, _attempts, _job_events):
        table = shape(metadata, new=new)
        with op.batch_alter_table(table.name, copy_from=table, recreate="always"):
            pass


def _alter_in_place(*, new: bool) -> None:
    """What the rebuild changes, as ALTERs: CHECKs, the active-key index,
    job_events' columns (PostgreSQL)."""
    reasons = NEW_REASONS if new else OLD_REASONS
    checks = (
        ("jobs", "state", _in("state", NEW_JOB_STATES if new else OLD_JOB_STATES)),
        ("jobs", "last_failure_reason", _in("last_failure_reason", reasons, nullable=True)),
        ("attempts", "failure_reason", _in("failure_reason", reasons, nullable=True)),
    )
    for table, column, sql in checks:
        op.drop_constraint(op.f(f"ck_{table}_{column}"), table, type_="check")
        op.create_check_constraint(op.f(f"ck_{table}_{column}"), table, sql)
    where = sa.text(NEW_KEY_WHERE if new else OLD_KEY_WHERE)
    op.drop_index("uq_jobs_active_key", table_name="jobs")
    op.create_index(
        "uq_jobs_active_key", "jobs", ["idempotency_key"], unique=True, postgresql_where=where
    )
    op.alter_column("job_events", "job_id", existing_type=sa.Integer(), nullable=new)
    if new:
        op.alter_column(
            "job_events",
            "event",
            existing_type=sa.String(16),
            type_=sa.String(32),
            existing_nullable=False,
        )


def _save_sequences() -> None:
    if not _rebuilds():
        return
    listed = ", ".join(f"'{t}'" for t in REBUILT)
    op.execute("DROP TABLE IF EXISTS temp.spoolctl_saved_sequence")
    op.execute(
        "CREATE TEMP TABLE spoolctl_saved_sequence AS "
        f"SELECT name, seq FROM sqlite_sequence WHERE name IN ({listed})"
    )


def _restore_sequences() -> None:
    if not _rebuilds():
        return
    op.execute(
        "DELETE FROM sqlite_sequence WHERE name IN (SELECT name FROM spoolctl_saved_sequence)"
    )
    op.execute(
        "INSERT INTO sqlite_sequence (name, seq) SELECT name, seq FROM spoolctl_saved_sequence"
    )
    op.execute("DROP TABLE temp.spoolctl_saved_sequence")


def upgrade() -> None:
    op.create_table(
        "lanes",
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("paused_at", sa.Float(), nullable=False),
        sa.Column("paused_by", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.PrimaryKeyConstraint("queue", name="pk_lanes"),
    )
    op.create_table(
        "job_dependencies",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("after_job_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_dependencies_job_id_jobs", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["after_job_id"],
            ["jobs.id"],
            name="fk_job_dependencies_after_job_id_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "after_job_id", name="pk_job_dependencies"),
    )
    op.create_index("ix_job_dependencies_after_job_id", "job_dependencies", ["after_job_id"])
    _save_sequences()
    _rebuild(new=True)
    _restore_sequences()


def _refuse_what_0002_cannot_hold() -> None:
    """A paused lane or a waiting job has no form in 0002: refuse, change nothing."""
    if context.is_offline_mode():
        return
    from spoolctl.errors import Conflict

    conn = op.get_bind()
    paused = [r[0] for r in conn.exec_driver_sql("SELECT queue FROM lanes ORDER BY queue")]
    waiting = [
        r[0]
        for r in conn.exec_driver_sql("SELECT id FROM jobs WHERE state = 'waiting' ORDER BY id")
    ]
    if not paused and not waiting:
        return
    parts = []
    if paused:
        parts.append(f"paused lanes {', '.join(paused)} (spoolctl resume --all)")
    if waiting:
        shown = ", ".join(str(i) for i in waiting[:10]) + (" ..." if len(waiting) > 10 else "")
        parts.append(f"{len(waiting)} waiting job(s): {shown} (let them run, or cancel them)")
    raise Conflict(
        "cannot downgrade below 0003_lanes_and_dependencies while the queue holds "
        + " and ".join(parts)
        + "; nothing was changed",
        paused_lanes=paused,
        waiting_jobs=waiting,
    )


def downgrade() -> None:
    _refuse_what_0002_cannot_hold()
    op.execute(
        "UPDATE jobs SET last_failure_reason = 'canceled' "
        "WHERE last_failure_reason = 'dependency_failed'"
    )
    op.execute("DELETE FROM job_events WHERE job_id IS NULL")
    op.drop_index("ix_job_dependencies_after_job_id", table_name="job_dependencies")
    op.drop_table("job_dependencies")
    op.drop_table("lanes")
    _save_sequences()
    _rebuild(new=False)
    _restore_sequences()
