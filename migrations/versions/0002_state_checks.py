"""CHECK constraints on job/attempt states and failure reasons; list indexes

Revision ID: 0002_state_checks
Revises: 0001_initial
Create Date: 2026-11-30 15:50:00

SQLite cannot add a CHECK constraint in place, so jobs and attempts are
rebuilt with alembic's batch mode. The rebuild copies every row with its id;
the caller runs it with foreign keys off (a referenced table is dropped and
renamed) and checks `PRAGMA foreign_key_check` before committing. The
AUTOINCREMENT high-water marks are saved and restored around the rebuild, so
an id deleted by `prune` is never handed out again. The table shapes below are
frozen copies (`copy_from`): no reflection, so `spoolctl migrate --sql` can
render the rebuild offline too.

PostgreSQL changes a table in place: the same batch blocks run with
recreate="never", so they become ALTER TABLE ... ADD/DROP CONSTRAINT and
CREATE/DROP INDEX on the existing tables (ids and sequences untouched), and
there is no sqlite_sequence to save.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import sqlalchemy as sa
from alembic import op

revision: str = "0002_state_checks"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_STATES = ("queued", "running", "done", "failed", "dead", "canceled")
ATTEMPT_STATES = ("running", "succeeded", "failed", "timed_out", "abandoned", "canceled")
FAILURE_REASONS = ("process_exit", "timeout", "spawn_failed", "worker_crash", "canceled", "unknown")
REBUILT = ("jobs", "attempts")


def _one_of(column: str, values: tuple[str, ...], *, nullable: bool = False) -> str:
    listed = ", ".join(f"'{v}'" for v in values)
    check = f"{column} IN ({listed})"
    return f"{column} IS NULL OR {check}" if nullable else check


CHECKS: dict[str, tuple[tuple[str, str], ...]] = {
    "jobs": (
        ("ck_jobs_state", _one_of("state", JOB_STATES)),
        (
            "ck_jobs_last_failure_reason",
            _one_of("last_failure_reason", FAILURE_REASONS, nullable=True),
        ),
    ),
    "attempts": (
        ("ck_attempts_state", _one_of("state", ATTEMPT_STATES)),
        ("ck_attempts_failure_reason", _one_of("failure_reason", FAILURE_REASONS, nullable=True)),
    ),
}
ACTIVE_KEY_WHERE = "idempotency_key IS NOT NULL AND state IN ('queued', 'running')"
LIST_INDEXES = (("ix_jobs_state_id", ["state", "id"]), ("ix_jobs_queue_id", ["queue", "id"]))


def _jobs(metadata: sa.MetaData, *, checked: bool) -> sa.Table:
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
        *_checks("jobs", checked),
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
    sa.Index(
        "uq_jobs_active_key",
        table.c.idempotency_key,
        unique=True,
        sqlite_where=sa.text(ACTIVE_KEY_WHERE),
        postgresql_where=sa.text(ACTIVE_KEY_WHERE),
    )
    if checked:
        for name, columns in LIST_INDEXES:
            sa.Index(name, *(table.c[c] for c in columns))
    return table


def _attempts(metadata: sa.MetaData, *, checked: bool) -> sa.Table:
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
        *_checks("attempts", checked),
        sqlite_autoincrement=True,
    )


def _rebuilds() -> bool:
    """SQLite recreates a table to change a CHECK; PostgreSQL alters it in place.
    Read from the migration context, so it holds offline (`--sql`) too."""
    return op.get_context().dialect.name == "sqlite"


def _recreate() -> Literal["always", "never"]:
    return "always" if _rebuilds() else "never"


def _checks(table: str, checked: bool) -> list[sa.CheckConstraint]:
    if not checked:
        return []
    return [sa.CheckConstraint(sql, name=name) for name, sql in CHECKS[table]]


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
    old = sa.MetaData()
    _save_sequences()
    with op.batch_alter_table(
        "jobs", copy_from=_jobs(old, checked=False), recreate=_recreate()
    ) as batch:
        for name, sql in CHECKS["jobs"]:
            batch.create_check_constraint(op.f(name), sql)
        for name, columns in LIST_INDEXES:
            batch.create_index(name, columns)
    with op.batch_alter_table(
        "attempts", copy_from=_attempts(old, checked=False), recreate=_recreate()
    ) as batch:
        for name, sql in CHECKS["attempts"]:
            batch.create_check_constraint(op.f(name), sql)
    _restore_sequences()


def downgrade() -> None:
    new = sa.MetaData()
    _save_sequences()
    with op.batch_alter_table(
        "jobs", copy_from=_jobs(new, checked=True), recreate=_recreate()
    ) as batch:
        for name, _sql in CHECKS["jobs"]:
            batch.drop_constraint(op.f(name), type_="check")
        for name, _columns in LIST_INDEXES:
            batch.drop_index(name)
    with op.batch_alter_table(
        "attempts", copy_from=_attempts(new, checked=True), recreate=_recreate()
    ) as batch:
        for name, _sql in CHECKS["attempts"]:
            batch.drop_constraint(op.f(name), type_="check")
    _restore_sequences()
