"""Recurring jobs (schedules) and dependencies on any end (`--after-job-any`)

Revision ID: 0006_schedules
Revises: 0005_ledger_positions
Create Date: 2026-12-02 13:00:00

New tables on both backends: `schedules` (one row per recurring job: its
cron expression and zone or its interval, overlap and catch-up policy, the
job flags as JSON, and the next slot, indexed so a worker finds what is due
with one range scan) and `schedule_occurrences` (one row per slot a schedule
reached, with its job or the record that it was skipped). The unique
(schedule_id, slot_at) of the second table is the rule that makes a second
job for one slot impossible across processes and machines.

job_dependencies gains `any_end` (0: the parent must be done, as before; 1:
the parent must have ended in any way, `add --after-job-any`), added in place
with a default: existing rows keep their meaning and no table is rebuilt.

Downgrade refuses (SAFETY_BLOCK, nothing changed) while any schedule exists,
unless migrate was given --drop-schedules (which deletes them and their
occurrences; the jobs they made stay), and refuses (CONFLICT) while a waiting
job waits for a parent's any end (0005 would read that as "until done").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0006_schedules"
down_revision: str | None = "0005_ledger_positions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def _int() -> sa.types.TypeEngine[int]:
    return sa.BigInteger() if _postgres() else sa.Integer()


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", _int(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("cron", sa.Text()),
        sa.Column("every_s", sa.Float()),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("overlap", sa.String(8), nullable=False),
        sa.Column("catch_up", sa.String(8), nullable=False),
        sa.Column("anchor_at", sa.Float(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("next_fire_at", sa.Float(), nullable=False),
        sa.Column("paused_at", sa.Float()),
        sa.Column("paused_reason", sa.Text()),
        sa.Column("last_job_id", _int()),
        sa.Column("last_slot_at", sa.Float()),
        sa.PrimaryKeyConstraint("id", name="pk_schedules"),
        sa.UniqueConstraint("name", name="uq_schedules_name"),
        sa.CheckConstraint("overlap IN ('skip', 'allow')", name="overlap"),
        sa.CheckConstraint("catch_up IN ('latest', 'none', 'all')", name="catch_up"),
        sa.CheckConstraint("(cron IS NULL) <> (every_s IS NULL)", name="cron_or_every"),
    )
    op.create_index("ix_schedules_next_fire_at", "schedules", ["next_fire_at"])
    op.create_table(
        "schedule_occurrences",
        sa.Column("id", _int(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", _int(), nullable=False),
        sa.Column("slot_at", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("job_id", _int()),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name="fk_schedule_occurrences_schedule_id_schedules",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name="fk_schedule_occurrences_job_id_jobs",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_schedule_occurrences"),
        sa.UniqueConstraint(
            "schedule_id", "slot_at", name="uq_schedule_occurrences_schedule_id_slot_at"
        ),
        sa.CheckConstraint("outcome IN ('fired', 'skipped', 'run')", name="outcome"),
    )
    op.add_column(
        "job_dependencies",
        sa.Column("any_end", _int(), server_default="0", nullable=False),
    )


def _refuse_what_0005_cannot_hold() -> None:
    if context.is_offline_mode():
        return
    from spoolctl.db.revision import DROP_SCHEDULES, DROP_SCHEDULES_FLAG
    from spoolctl.errors import Conflict, SafetyBlock

    conn = op.get_bind()
    names = [r[0] for r in conn.exec_driver_sql("SELECT name FROM schedules ORDER BY name")]
    if names and not context.config.attributes.get(DROP_SCHEDULES):
        target = context.get_revision_argument()
        raise SafetyBlock(
            f"downgrading below {revision} deletes {len(names)} schedule(s) "
            f"({', '.join(names[:10])}{' ...' if len(names) > 10 else ''}); nothing was "
            f"changed. To delete them (the jobs they made stay): spoolctl migrate "
            f"--downgrade {target} --yes {DROP_SCHEDULES_FLAG}",
            schedules=names,
            flag=DROP_SCHEDULES_FLAG,
        )
    waiting = [
        int(r[0])
        for r in conn.exec_driver_sql(
            "SELECT DISTINCT d.job_id FROM job_dependencies d JOIN jobs j ON j.id = d.job_id "
            "WHERE d.any_end = 1 AND j.state = 'waiting' ORDER BY d.job_id"
        )
    ]
    if waiting:
        raise Conflict(
            f"cannot downgrade below {revision} while {len(waiting)} job(s) wait for a "
            f"parent's end (--after-job-any): {', '.join(map(str, waiting[:10]))}; let them "
            "run, or cancel them; nothing was changed",
            waiting_jobs=waiting,
        )


def downgrade() -> None:
    _refuse_what_0005_cannot_hold()
    op.drop_table("schedule_occurrences")
    op.drop_index("ix_schedules_next_fire_at", table_name="schedules")
    op.drop_table("schedules")
    # Edges of finished jobs only (a waiting one refused above): what they
    # meant is over, and 0005 could only read them as "until done".
    op.execute("DELETE FROM job_dependencies WHERE any_end = 1")
    if _postgres():
        op.drop_column("job_dependencies", "any_end")
    else:
        # SQLite 3.35+ drops an unindexed column in place (no rebuild).
        op.execute("ALTER TABLE job_dependencies DROP COLUMN any_end")
