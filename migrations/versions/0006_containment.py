"""Each attempt in its own cgroup: its path and what it measured; job limits

Revision ID: 0006_containment
Revises: 0005_ledger_positions
Create Date: 2026-12-02 13:00:00

New nullable columns, added in place on both backends (no table is rebuilt):
attempts.cgroup (the attempt's cgroup directories, one a line, where its
worker contained it), attempts.peak_memory_bytes and attempts.cpu_time_s
(what the cgroup measured); jobs.memory_bytes and jobs.cpus (the job's
--memory and --cpus) and jobs.require_limits (1: only a worker that can
enforce them claims the job; null counts as 0). Rows present keep nulls: an
attempt that ran before the upgrade had no cgroup, a job no limits.

Downgrade drops the six columns (SQLite 3.35+ drops an unindexed column in
place, so sqlite_sequence is untouched): recorded paths and measurements
go, and so do the jobs' limits (a queued job then runs without them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_containment"
down_revision: str | None = "0005_ledger_positions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _int() -> sa.types.TypeEngine[int]:
    postgres = op.get_context().dialect.name == "postgresql"
    return sa.BigInteger() if postgres else sa.Integer()


def _columns() -> list[tuple[str, sa.Column[object]]]:
    return [
        ("attempts", sa.Column("cgroup", sa.Text())),
        ("attempts", sa.Column("peak_memory_bytes", _int())),
        ("attempts", sa.Column("cpu_time_s", sa.Float())),
        ("jobs", sa.Column("memory_bytes", _int())),
        ("jobs", sa.Column("cpus", sa.Float())),
        ("jobs", sa.Column("require_limits", _int())),
    ]


def upgrade() -> None:
    for table, column in _columns():
        op.add_column(table, column)


def downgrade() -> None:
    postgres = op.get_context().dialect.name == "postgresql"
    for table, column in reversed(_columns()):
        if postgres:
            op.drop_column(table, column.name)
        else:
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
