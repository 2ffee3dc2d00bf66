"""Output chunks stored in the database; PostgreSQL's work notification

Revision ID: 0004_output_chunks
Revises: 0003_lanes_and_dependencies
Create Date: 2026-12-01 05:00:00

New table `output_chunks` (on both backends; only PostgreSQL queues fill it):
an attempt's stdout and stderr in bounded chunks, deleted with the attempt.
On PostgreSQL only, a trigger sends NOTIFY spoolctl_work (payload: the lane)
whenever a job becomes `queued`, so idle workers on any machine wake at the
commit that makes work claimable, whichever verb or worker made it so.
No existing table changes: the upgrade copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

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


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    op.create_table(
        "output_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("stream", sa.String(8), nullable=False),
        sa.Column("offset", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("truncated", sa.Integer(), server_default="0", nullable=False),
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
        op.execute(NOTIFY_FUNCTION)
        op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    if _postgres():
        op.execute("DROP TRIGGER IF EXISTS jobs_notify_work ON jobs")
        op.execute("DROP FUNCTION IF EXISTS spoolctl_notify_work()")
    op.drop_table("output_chunks")
