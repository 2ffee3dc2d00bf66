"""Where a worker's pid means it: workers.pid_space

Revision ID: 0008_pid_space
Revises: 0007_containment
Create Date: 2026-12-06 10:00:00

One new nullable column, added in place on both backends (no table is
rebuilt): workers.pid_space, what a worker's pid is only valid inside (its
machine id, PID namespace and cgroup namespace: `spoolctl/runner/procs.py`'s
`pid_space`). Host name and boot time, all a worker row told before, are
the same for workers in separate PID namespaces of one machine (`unshare
--pid`, containers sharing the host's UTS namespace or network), where one
worker's pid names an unrelated process, or no process, for another. A
worker probes another's pid only where both rows say the same pid space.
Rows present keep null: a worker registered before the upgrade is judged by
the lease rule, as a worker on another machine (it re-registers with its
pid space when it restarts). boot_id keeps its meaning.

Downgrade drops the column (SQLite 3.35+ drops an unindexed column in place,
so sqlite_sequence is untouched): every other column of every row stays;
the pid spaces recorded go, and a worker of this version still running then
finds the schema older than its own and stops.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_pid_space"
down_revision: str | None = "0007_containment"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("pid_space", sa.Text()))


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.drop_column("workers", "pid_space")
    else:
        op.execute("ALTER TABLE workers DROP COLUMN pid_space")
