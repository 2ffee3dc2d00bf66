"""Output chunks stored in the database; PostgreSQL's work notification

Revision ID: 0004_output_chunks
Revises: 0003_lanes_and_dependencies
Create Date: 2026-12-01 05:00:00

New table `output_chunks` (on both backends; only PostgreSQL queues fill it):
an attempt's stdout and stderr in bounded chunks, deleted with the attempt.
On PostgreSQL only, a trigger sends NOTIFY spoolctl_work (payload: the lane)
whenever a job becomes `queued`, so idle workers on any machine wake at the
commit that makes work claimable, whichever verb or worker made it so.
On PostgreSQL only, every integer column becomes BIGINT (with its id
sequence): SQLite's INTEGER is 64-bit and the contract's limits (timeouts,
budgets) need that range. On SQLite no existing table changes: the upgrade
copies nothing.

Downgrade drops `output_chunks`, and with it every attempt's stored output,
the only copy other machines can read: it is refused (SAFETY_BLOCK, nothing
changed) while any chunk is stored, unless migrate was given
--delete-stored-output. On SQLite, whose queues keep output in files (which a
downgrade leaves alone) and store no chunks, it never bites. Rendered offline
for PostgreSQL (`migrate --sql`) it is a statement that aborts the script
while chunks are stored.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0004_output_chunks"
down_revision: str | None = "0003_lanes_and_dependencies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION spoolctl_notify_work() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('spoolctl_work', NEW.queue);
    RETURN NULL;
END
$$
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER jobs_notify_work AFTER INSERT OR UPDATE OF state ON jobs
FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION spoolctl_notify_work()
"""


WIDENED: dict[str, tuple[str, ...]] = {
    "jobs": (
        "id",
        "priority",
        "attempts",
        "crashes",
        "max_retries",
        "max_crashes",
        "timeout_seconds",
        "locked_pid",
        "last_exit_code",
    ),
    "attempts": ("id", "job_id", "attempt_no", "worker_pid", "exit_code", "job_pid", "job_pgid"),
    "workers": ("pid", "slots", "concurrency", "jobs_run"),
    "job_events": ("id", "job_id"),
    "job_dependencies": ("job_id", "after_job_id"),
}
"""PostgreSQL integer columns made BIGINT by this revision (INTEGER before)."""
SEQUENCES = ("jobs", "attempts", "job_events")
DEFAULTS = {
    "jobs": {
        "priority": "0",
        "attempts": "0",
        "crashes": "0",
        "max_retries": "3",
        "timeout_seconds": "300",
    },
    "workers": {"concurrency": "1", "jobs_run": "0"},
}
"""Server defaults, set again in the new type (as a fresh table states them)."""
OFFLINE_GUARD = """
DO $$
DECLARE n_attempts bigint; n_bytes bigint;
BEGIN
    SELECT count(DISTINCT attempt_id), coalesce(sum(length(data)), 0)
        INTO n_attempts, n_bytes FROM output_chunks;
    IF n_attempts > 0 THEN
        RAISE EXCEPTION 'spoolctl: {message}', n_attempts, n_bytes;
    END IF;
END
$$
"""
"""`migrate --sql`'s form of the refusal: aborts the script (and so its
transaction) while output is stored."""


def _int() -> sa.types.TypeEngine[int]:
    return sa.BigInteger() if _postgres() else sa.Integer()


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    op.create_table(
        "output_chunks",
        sa.Column("id", _int(), autoincrement=True, nullable=False),
        sa.Column("attempt_id", _int(), nullable=False),
        sa.Column("stream", sa.String(8), nullable=False),
        sa.Column("offset", _int(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("truncated", _int(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"],
            ["attempts.id"],
            name="fk_output_chunks_attempt_id_attempts",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_output_chunks"),
        sa.UniqueConstraint(
            "attempt_id", "stream", "offset", name="uq_output_chunks_attempt_id_stream_offset"
        ),
    )
    if _postgres():
        _widen("BIGINT")
        op.execute(NOTIFY_FUNCTION)
        op.execute(NOTIFY_TRIGGER)


def _refusal(attempts: object, size: object, *, sql: bool) -> str:
    """Why a downgrade that would drop stored output stops, and the command
    that goes ahead (for the online refusal and the offline guard)."""
    from spoolctl.db.revision import DELETE_STORED_OUTPUT_FLAG

    command = (
        f"spoolctl migrate{' --sql' if sql else ''} --downgrade "
        f"{context.get_revision_argument()}{'' if sql else ' --yes'} {DELETE_STORED_OUTPUT_FLAG}"
    )
    return (
        f"downgrading below {revision} deletes the stored output of {attempts} attempt(s) "
        f"({size} bytes in output_chunks), the only copy other machines can read; nothing "
        f"was changed. To delete it (after a pg_dump, if it may be needed again): {command}"
    )


def _refuse_to_delete_stored_output() -> None:
    """Stored output is deleted only when the caller said so."""
    from spoolctl.db.revision import DELETE_STORED_OUTPUT, DELETE_STORED_OUTPUT_FLAG

    if context.config.attributes.get(DELETE_STORED_OUTPUT):
        return
    if context.is_offline_mode():
        if _postgres():
            op.execute(OFFLINE_GUARD.format(message=_refusal("%", "%", sql=True)))
        return
    from spoolctl.errors import SafetyBlock

    attempts, size = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT count(DISTINCT attempt_id), coalesce(sum(length(data)), 0) FROM output_chunks"
        )
        .one()
    )
    if attempts:
        raise SafetyBlock(
            _refusal(attempts, size, sql=False),
            attempts=int(attempts),
            bytes=int(size),
            flag=DELETE_STORED_OUTPUT_FLAG,
        )


def downgrade() -> None:
    _refuse_to_delete_stored_output()
    if _postgres():
        op.execute("DROP TRIGGER IF EXISTS jobs_notify_work ON jobs")
        op.execute("DROP FUNCTION IF EXISTS spoolctl_notify_work()")
    op.drop_table("output_chunks")
    if _postgres():
        _widen("INTEGER")


def _widen(to: str) -> None:
    """Every listed column (and the id sequences) to `to`. A downgrade to
    INTEGER fails, changing nothing, if a value no longer fits."""
    for table, columns in WIDENED.items():
        changes = [f"ALTER COLUMN {c} TYPE {to}" for c in columns]
        changes += [
            f"ALTER COLUMN {c} SET DEFAULT '{v}'" for c, v in DEFAULTS.get(table, {}).items()
        ]
        op.execute(f"ALTER TABLE {table} {', '.join(changes)}")
    for table in SEQUENCES:
        op.execute(f"ALTER SEQUENCE {table}_id_seq AS {to}")
