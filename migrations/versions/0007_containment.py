"""Each attempt in its own cgroup: its path and what it measured; job limits

Revision ID: 0007_containment
Revises: 0006_schedules
Create Date: 2026-12-02 13:00:00

New nullable columns, added in place on both backends (no table is rebuilt):
attempts.cgroup (the attempt's cgroup directories, one a line, where its
worker contained it), attempts.peak_memory_bytes and attempts.cpu_time_s
(what the cgroup measured); jobs.memory_bytes and jobs.cpus (the job's
--memory and --cpus) and jobs.require_limits (1: only a worker that can
enforce them claims the job; null counts as 0), with the partial index
ix_jobs_needs_limits (require_limits, state) of the jobs that require them (`status` lists
them; empty unless some job requires its limits). Rows present keep nulls: an
attempt that ran before the upgrade had no cgroup, a job no limits.

The failure reason `oom_killed` (an attempt the kernel's OOM killer ended
in its cgroup) joins the CHECKs of jobs.last_failure_reason and
attempts.failure_reason. PostgreSQL swaps the two CHECKs. SQLite cannot
alter a CHECK; the change only widens a list of allowed values, which every
row already satisfies, so instead of rebuilding the tables (which would
have to restate every column, another revision's included) the CHECK text
is edited in sqlite_master under `writable_schema` and the schema version
bumped, the procedure SQLite documents for loosening a constraint
(sqlite.org/lang_altertable.html, "other kinds of table schema changes").
Nothing else in either table changes: columns, indexes, ids, sqlite_sequence.

Downgrade turns `oom_killed` into `process_exit` (the error text still says
out of memory), narrows the CHECKs back the same way, and drops the six
columns (SQLite 3.35+ drops an unindexed column in place, so sqlite_sequence
is untouched): recorded paths and measurements go, and so do the jobs'
limits (a queued job then runs without them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0007_containment"
down_revision: str | None = "0006_schedules"
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


OLD_REASONS = (
    "process_exit",
    "timeout",
    "spawn_failed",
    "worker_crash",
    "canceled",
    "unknown",
    "dependency_failed",
)
NEW_REASONS = (*OLD_REASONS, "oom_killed")
CHECKED = (("jobs", "last_failure_reason"), ("attempts", "failure_reason"))


def _in(column: str, values: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{v}'" for v in values)
    return f"{column} IS NULL OR {column} IN ({listed})"


def _swap_checks(*, new: bool) -> None:
    old_values, new_values = (OLD_REASONS, NEW_REASONS) if new else (NEW_REASONS, OLD_REASONS)
    if op.get_context().dialect.name == "postgresql":
        for table, column in CHECKED:
            op.drop_constraint(op.f(f"ck_{table}_{column}"), table, type_="check")
            op.create_check_constraint(op.f(f"ck_{table}_{column}"), table, _in(column, new_values))
        return
    old_list = ", ".join(f"'{v}'" for v in old_values) + ")"
    new_list = ", ".join(f"'{v}'" for v in new_values) + ")"
    if not context.is_offline_mode():
        _refuse_unexpected(old_list)
    version = None if context.is_offline_mode() else _schema_version()
    op.execute("PRAGMA writable_schema = ON")
    for table, _ in CHECKED:
        op.execute(
            f"UPDATE sqlite_master SET sql = replace(sql, '{_quoted(old_list)}', "
            f"'{_quoted(new_list)}') WHERE type = 'table' AND name = '{table}'"
        )
    if version is not None:
        op.execute(f"PRAGMA schema_version = {version + 1}")
    op.execute("PRAGMA writable_schema = OFF")


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def _schema_version() -> int:
    return int(op.get_bind().exec_driver_sql("PRAGMA schema_version").scalar_one())


def _refuse_unexpected(old_list: str) -> None:
    """Each table's CHECK must hold the list exactly once, as this code made it."""
    from spoolctl.errors import Conflict

    conn = op.get_bind()
    for table, _ in CHECKED:
        sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).scalar_one()
        if sql.count(old_list) != 1:
            raise Conflict(
                f"the {table} table's failure-reason CHECK is not the one this revision "
                "expects; nothing was changed",
                table=table,
            )


NEEDS_LIMITS_WHERE = "require_limits = 1"


def upgrade() -> None:
    for table, column in _columns():
        op.add_column(table, column)
    where = sa.text(NEEDS_LIMITS_WHERE)
    op.create_index(
        "ix_jobs_needs_limits",
        "jobs",
        ["require_limits", "state"],
        sqlite_where=where,
        postgresql_where=where,
    )
    _swap_checks(new=True)


def downgrade() -> None:
    postgres = op.get_context().dialect.name == "postgresql"
    op.execute(
        "UPDATE attempts SET failure_reason = 'process_exit' WHERE failure_reason = 'oom_killed'"
    )
    op.execute(
        "UPDATE jobs SET last_failure_reason = 'process_exit' "
        "WHERE last_failure_reason = 'oom_killed'"
    )
    _swap_checks(new=False)
    op.drop_index("ix_jobs_needs_limits", table_name="jobs")
    for table, column in reversed(_columns()):
        if postgres:
            op.drop_column(table, column.name)
        else:
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column.name}")
