"""Steering running jobs: control requests, suspension, the warning before a
timeout, requeue on a checkpoint's exit

Revision ID: 0009_steering
Revises: 0008_pid_space
Create Date: 2026-12-07 21:00:00

A new table on both backends, `control_requests`: one row per request to a
running attempt's worker (`signal`, `suspend`, `continue`), settled by the
worker that delivers it or by a requester that finds the attempt ended. On
PostgreSQL a trigger NOTIFYs `spoolctl_work` when one is inserted, so the
owning worker wakes at once wherever it runs.

New columns on jobs, added in place (no table is rebuilt): `suspended_at`
(when its running attempt was suspended), `signal_before_timeout` and
`signal_before_timeout_s` (`add --signal-before-timeout`), `requeue_exits`
(the JSON list of `--requeue-exit` codes), `max_requeues` and `requeues`
(0 for every row present). Rows present keep nulls: no job had them.

The attempt state `requeued` and the failure reason `requeue_exit` join the
CHECKs of attempts.state, attempts.failure_reason and
jobs.last_failure_reason, the way 0007 widened them: PostgreSQL swaps the
CHECKs; SQLite edits the CHECK text in sqlite_master (it only widens a list
every row satisfies) and bumps the schema version.

Downgrade refuses (CONFLICT, nothing changed) while an unfinished job uses
what 0008 cannot hold: a suspended running job (only a running job's
`suspended_at` counts: the claim clears it), a request to a running attempt
not yet settled, or a queued, waiting or running job with `--requeue-exit`
or `--signal-before-timeout`; let them end or cancel them. Then it turns
`requeued` attempts into `failed` and `requeue_exit` reasons into
`process_exit` (the exit code stays), narrows the CHECKs back, drops the
table and the columns: the requests and the settings of ended jobs go.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0009_steering"
down_revision: str | None = "0008_pid_space"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_REASONS = (
    "process_exit",
    "timeout",
    "spawn_failed",
    "worker_crash",
    "canceled",
    "unknown",
    "dependency_failed",
    "oom_killed",
)
NEW_REASONS = (*OLD_REASONS, "requeue_exit")
OLD_ATTEMPT_STATES = ("running", "succeeded", "failed", "timed_out", "abandoned", "canceled")
NEW_ATTEMPT_STATES = (*OLD_ATTEMPT_STATES, "requeued")
CHECKED = (
    ("jobs", "last_failure_reason", OLD_REASONS, NEW_REASONS, True),
    ("attempts", "failure_reason", OLD_REASONS, NEW_REASONS, True),
    ("attempts", "state", OLD_ATTEMPT_STATES, NEW_ATTEMPT_STATES, False),
)
"""(table, column, values before, values after, nullable) of each widened CHECK."""

NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION spoolctl_notify_control() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('spoolctl_work', '');
    RETURN NULL;
END $$
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER control_requests_notify AFTER INSERT ON control_requests
FOR EACH ROW EXECUTE FUNCTION spoolctl_notify_control()
"""


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def _int() -> sa.types.TypeEngine[int]:
    return sa.BigInteger() if _postgres() else sa.Integer()


def _job_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("suspended_at", sa.Float()),
        sa.Column("signal_before_timeout", sa.String(16)),
        sa.Column("signal_before_timeout_s", _int()),
        sa.Column("requeue_exits", sa.Text()),
        sa.Column("max_requeues", _int()),
        sa.Column("requeues", _int(), server_default="0", nullable=False),
    ]


def _in(column: str, values: tuple[str, ...], nullable: bool) -> str:
    listed = ", ".join(f"'{v}'" for v in values)
    return f"{column} IS NULL OR {column} IN ({listed})" if nullable else f"{column} IN ({listed})"


def _swap_checks(*, new: bool) -> None:
    if _postgres():
        for table, column, old, wider, nullable in CHECKED:
            values = wider if new else old
            op.drop_constraint(op.f(f"ck_{table}_{column}"), table, type_="check")
            op.create_check_constraint(
                op.f(f"ck_{table}_{column}"), table, _in(column, values, nullable)
            )
        return
    offline = context.is_offline_mode()
    edits = []
    for table, column, old, wider, _ in CHECKED:
        before, after = (old, wider) if new else (wider, old)
        edits.append((table, column, _listed(before), _listed(after)))
    if not offline:
        _refuse_unexpected(edits)
    version = None if offline else _schema_version()
    op.execute("PRAGMA writable_schema = ON")
    for table, _, before_list, after_list in edits:
        op.execute(
            f"UPDATE sqlite_master SET sql = replace(sql, '{_quoted(before_list)}', "
            f"'{_quoted(after_list)}') WHERE type = 'table' AND name = '{table}'"
        )
    if version is not None:
        op.execute(f"PRAGMA schema_version = {version + 1}")
    op.execute("PRAGMA writable_schema = OFF")


def _listed(values: tuple[str, ...]) -> str:
    """A CHECK's list as SQLAlchemy writes it, closed: unique in its table."""
    return ", ".join(f"'{v}'" for v in values) + ")"


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def _schema_version() -> int:
    return int(op.get_bind().exec_driver_sql("PRAGMA schema_version").scalar_one())


def _refuse_unexpected(edits: list[tuple[str, str, str, str]]) -> None:
    """Each CHECK must hold its list exactly once, as this code made it."""
    from spoolctl.errors import Conflict

    conn = op.get_bind()
    for table, column, before_list, _ in edits:
        sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).scalar_one()
        if sql.count(before_list) != 1:
            raise Conflict(
                f"the {table} table's {column} CHECK is not the one this revision "
                "expects; nothing was changed",
                table=table,
            )


def upgrade() -> None:
    op.create_table(
        "control_requests",
        sa.Column("id", _int(), autoincrement=True, nullable=False),
        sa.Column("job_id", _int(), nullable=False),
        sa.Column("attempt_id", _int(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("signal", sa.String(16)),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("requested_by", sa.Text()),
        sa.Column("settled_at", sa.Float()),
        sa.Column("result", sa.String(16)),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_control_requests_job_id_jobs", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["attempt_id"],
            ["attempts.id"],
            name="fk_control_requests_attempt_id_attempts",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_control_requests"),
        sa.CheckConstraint("action IN ('signal', 'suspend', 'continue')", name="action"),
        sa.CheckConstraint(
            "result IS NULL OR result IN ('delivered', 'attempt_ended')", name="result"
        ),
    )
    op.create_index("ix_control_requests_attempt_id", "control_requests", ["attempt_id", "id"])
    op.create_index("ix_control_requests_job_id", "control_requests", ["job_id"])
    for column in _job_columns():
        op.add_column("jobs", column)
    _swap_checks(new=True)
    if _postgres():
        op.execute(NOTIFY_FUNCTION)
        op.execute(NOTIFY_TRIGGER)


def _refuse_what_0008_cannot_hold() -> None:
    if context.is_offline_mode():
        return
    from spoolctl.errors import Conflict

    conn = op.get_bind()
    blocking = [
        int(r[0])
        for r in conn.exec_driver_sql(
            "SELECT id FROM jobs WHERE (state = 'running' AND suspended_at IS NOT NULL) "
            "OR (state IN ('queued', 'waiting', 'running') AND (requeue_exits IS NOT NULL "
            "OR signal_before_timeout IS NOT NULL)) "
            "UNION SELECT c.job_id FROM control_requests c JOIN attempts a "
            "ON a.id = c.attempt_id WHERE c.settled_at IS NULL AND a.state = 'running' "
            "ORDER BY 1"
        )
    ]
    if blocking:
        raise Conflict(
            f"cannot downgrade below {revision} while {len(blocking)} unfinished job(s) "
            "are suspended, have a request not yet settled, or use --requeue-exit or "
            f"--signal-before-timeout: {', '.join(map(str, blocking[:10]))}; let them end, "
            "or cancel them; nothing was changed",
            jobs=blocking,
        )


def downgrade() -> None:
    _refuse_what_0008_cannot_hold()
    if _postgres():
        op.execute("DROP TRIGGER IF EXISTS control_requests_notify ON control_requests")
        op.execute("DROP FUNCTION IF EXISTS spoolctl_notify_control()")
    op.execute("UPDATE attempts SET state = 'failed' WHERE state = 'requeued'")
    op.execute(
        "UPDATE attempts SET failure_reason = 'process_exit' WHERE failure_reason = 'requeue_exit'"
    )
    op.execute(
        "UPDATE jobs SET last_failure_reason = 'process_exit' "
        "WHERE last_failure_reason = 'requeue_exit'"
    )
    _swap_checks(new=False)
    for column in reversed(_job_columns()):
        if _postgres():
            op.drop_column("jobs", column.name)
        else:  # SQLite 3.35+ drops an unindexed column in place (no rebuild)
            op.execute(f"ALTER TABLE jobs DROP COLUMN {column.name}")
    op.drop_index("ix_control_requests_job_id", table_name="control_requests")
    op.drop_index("ix_control_requests_attempt_id", table_name="control_requests")
    op.drop_table("control_requests")
