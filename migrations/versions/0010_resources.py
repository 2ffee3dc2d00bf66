"""Placing jobs by what they need: weights, GPUs and memory

Revision ID: 0010_resources
Revises: 0009_steering
Create Date: 2026-12-07 23:30:00

New columns on jobs, added in place: `weight`, `gpus`, `gpu_share`,
`gpu_memory_bytes`, `gpu_model` (what `add --weight/--gpus/--gpu-memory/
--gpu-model` ask for; rows present keep nulls: no request). A partial index,
`ix_jobs_requests`, lists the queued jobs the claim places (any of those, or
`--memory`). On attempts, `host` and `devices` (where it ran, which GPUs it
was given); on workers, `inventory` (what it has, as JSON).

Two new tables: `devices` (every GPU a worker registered, by UUID, with
`held`, its units held, under a CHECK that makes an over-hold impossible) and
`device_holds` (which attempt holds how much of which device).

Downgrade refuses (SAFETY_BLOCK, nothing changed) while a device is held or
a queued, waiting or running job carries a request that 0009 cannot express
(`--weight`, `--gpus`, `--gpu-memory`, `--gpu-model`), unless told with
`migrate --downgrade REV --yes --drop-resources`: then the holds go (the
processes holding them are not touched) and those jobs run as plain jobs.
`--memory` stays, as the limit it was before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0010_resources"
down_revision: str | None = "0009_steering"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEVICE_UNITS = 720720
REQUESTS_WHERE = "weight IS NOT NULL OR gpus IS NOT NULL OR memory_bytes IS NOT NULL"


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def _int() -> sa.types.TypeEngine[int]:
    return sa.BigInteger() if _postgres() else sa.Integer()


def _added() -> list[tuple[str, sa.Column[object]]]:
    return [
        ("jobs", sa.Column("weight", _int())),
        ("jobs", sa.Column("gpus", _int())),
        ("jobs", sa.Column("gpu_share", _int())),
        ("jobs", sa.Column("gpu_memory_bytes", _int())),
        ("jobs", sa.Column("gpu_model", sa.Text())),
        ("attempts", sa.Column("host", sa.Text())),
        ("attempts", sa.Column("devices", sa.Text())),
        ("workers", sa.Column("inventory", sa.Text())),
    ]


def upgrade() -> None:
    for table, column in _added():
        op.add_column(table, column)
    op.create_table(
        "devices",
        sa.Column("uuid", sa.String(96), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("idx", _int(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("memory_bytes", _int()),
        sa.Column("held", _int(), server_default="0", nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("uuid", name="pk_devices"),
        sa.CheckConstraint(f"held >= 0 AND held <= {DEVICE_UNITS}", name="held"),
    )
    op.create_table(
        "device_holds",
        sa.Column("id", _int(), autoincrement=True, nullable=False),
        sa.Column("device_uuid", sa.String(96), nullable=False),
        sa.Column("attempt_id", _int(), nullable=False),
        sa.Column("job_id", _int(), nullable=False),
        sa.Column("units", _int(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("held_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_uuid"], ["devices.uuid"], name="fk_device_holds_device_uuid_devices"
        ),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name="fk_device_holds_attempt_id_attempts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_device_holds"),
        sa.UniqueConstraint(
            "device_uuid", "attempt_id", name="uq_device_holds_device_uuid_attempt_id"
        ),
        sa.CheckConstraint(f"units > 0 AND units <= {DEVICE_UNITS}", name="units"),
    )
    op.create_index("ix_device_holds_attempt_id", "device_holds", ["attempt_id"])
    op.create_index(
        "ix_jobs_requests",
        "jobs",
        ["state", "queue", "next_run_at"],
        sqlite_where=sa.text(f"state = 'queued' AND ({REQUESTS_WHERE})"),
        postgresql_where=sa.text(f"state = 'queued' AND ({REQUESTS_WHERE})"),
    )


def _refuse_what_0009_cannot_hold() -> None:
    if context.is_offline_mode():
        return
    from spoolctl.db.revision import DROP_RESOURCES
    from spoolctl.db.revision import DROP_RESOURCES_FLAG as FLAG
    from spoolctl.errors import SafetyBlock

    conn = op.get_bind()
    held = [r[0] for r in conn.exec_driver_sql("SELECT DISTINCT job_id FROM device_holds")]
    asking = [
        int(r[0])
        for r in conn.exec_driver_sql(
            "SELECT id FROM jobs WHERE state IN ('queued', 'waiting', 'running') AND "
            "(weight IS NOT NULL OR gpus IS NOT NULL) ORDER BY id"
        )
    ]
    if (held or asking) and not context.config.attributes.get(DROP_RESOURCES):
        target = context.get_revision_argument()
        jobs = sorted({*map(int, held), *asking})
        raise SafetyBlock(
            f"downgrading below {revision} forgets the GPUs held by {len(held)} job(s) and "
            f"the requests of {len(asking)} unfinished job(s) "
            f"({', '.join(map(str, jobs[:10]))}{' ...' if len(jobs) > 10 else ''}); nothing "
            "was changed. Let them end, or cancel them; or, to drop them (queued jobs then "
            f"run as plain jobs): spoolctl migrate --downgrade {target} --yes {FLAG}",
            jobs=jobs,
            flag=FLAG,
        )


def downgrade() -> None:
    _refuse_what_0009_cannot_hold()
    # Told to (or none held): the holds go before the tables, children
    # first, so no reference dangles at any step (the processes holding the
    # devices are not touched).
    op.execute("DELETE FROM device_holds")
    op.drop_index("ix_jobs_requests", table_name="jobs")
    op.drop_index("ix_device_holds_attempt_id", table_name="device_holds")
    op.drop_table("device_holds")
    op.drop_table("devices")
    for table, column in reversed(_added()):
        if _postgres():
            op.drop_column(table, column.name)
        else:  # SQLite 3.35+ drops an unindexed column in place (no rebuild)
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
