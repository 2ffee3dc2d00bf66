"""Initial schema: jobs, attempts, workers, job_events

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30 15:33:56.691536

The batch blocks recreate nothing here (alembic's "auto" batch mode only
rebuilds SQLite tables, and only when a change needs it): on both backends
they are plain CREATE INDEX / DROP INDEX.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE_KEY_WHERE = "idempotency_key IS NOT NULL AND state IN ('queued', 'running')"
"""The unique index on idempotency_key covers unfinished jobs only (partial on both backends)."""


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("argv", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("queue", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_run_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("crashes", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_retries", sa.Integer(), server_default="3", nullable=False),
        sa.Column("max_crashes", sa.Integer(), nullable=True),
        sa.Column("timeout_seconds", sa.Integer(), server_default="300", nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("tags", sa.Text(), server_default="{}", nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("env", sa.Text(), server_default="{}", nullable=False),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("locked_pid", sa.Integer(), nullable=True),
        sa.Column("locked_at", sa.Float(), nullable=True),
        sa.Column("heartbeat_at", sa.Float(), nullable=True),
        sa.Column("last_exit_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_failure_reason", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_claim",
            ["state", "queue", sa.literal_column("priority DESC"), "next_run_at", "id"],
            unique=False,
        )
        batch_op.create_index("ix_jobs_state_finished", ["state", "finished_at"], unique=False)
        batch_op.create_index("ix_jobs_state_heartbeat", ["state", "heartbeat_at"], unique=False)
        batch_op.create_index(
            "uq_jobs_active_key",
            ["idempotency_key"],
            unique=True,
            sqlite_where=sa.text(ACTIVE_KEY_WHERE),
            postgresql_where=sa.text(ACTIVE_KEY_WHERE),
        )

    op.create_table(
        "workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("process_started_at", sa.Float(), nullable=True),
        sa.Column("boot_id", sa.Text(), nullable=True),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=True),
        sa.Column("concurrency", sa.Integer(), server_default="1", nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("stopped_at", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("jobs_run", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index("ix_workers_state_heartbeat", ["state", "heartbeat_at"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("worker_pid", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.String(length=32), nullable=True),
        sa.Column("stdout_path", sa.Text(), nullable=False),
        sa.Column("stderr_path", sa.Text(), nullable=False),
        sa.Column("job_pid", sa.Integer(), nullable=True),
        sa.Column("job_pgid", sa.Integer(), nullable=True),
        sa.Column("job_started_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_attempts_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("job_id", "attempt_no", name=op.f("uq_attempts_job_id_attempt_no")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index("ix_job_events_job_id", ["job_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index("ix_job_events_job_id")

    op.drop_table("job_events")
    op.drop_table("attempts")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index("ix_workers_state_heartbeat")

    op.drop_table("workers")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_jobs_active_key",
            sqlite_where=sa.text(ACTIVE_KEY_WHERE),
            postgresql_where=sa.text(ACTIVE_KEY_WHERE),
        )
        batch_op.drop_index("ix_jobs_state_heartbeat")
        batch_op.drop_index("ix_jobs_state_finished")
        batch_op.drop_index("ix_jobs_claim")

    op.drop_table("jobs")
