"""Ledger positions given by readers (PostgreSQL's writers take no ledger lock)

Revision ID: 0005_ledger_positions
Revises: 0004_output_chunks
Create Date: 2026-12-02 09:00:00

New nullable column job_events.seq on both backends.

On PostgreSQL it is the event's place in the ledger, the cursor `events`
reads by: writers leave it null (they no longer serialize on a ledger lock),
and a reader, under a lock only readers take, numbers every committed event
that has none from the new sequence job_events_seq_seq before it reads
(`spoolctl/db/backends/postgresql/ledger.py`). The rows present now get
seq = id, so a cursor handed out before the upgrade stays valid, and the
sequence starts past every id the id sequence ever gave out (pruned newest
events included), so no new position is one a follower already passed. A
unique index of the positioned events serves the reads; a partial index
finds the events still without a position (a writer's insert adds an entry
to the second only).

On SQLite nothing is backfilled and nothing is indexed: its single writer
commits ids in order, `id` stays the cursor and seq stays null (the column
is added in place; the table is not rebuilt).

Downgrade drops the column, the sequence and the indexes: the cursor is the
id again, so a follower of a PostgreSQL queue should start again from
`events --follow` (its old cursor counted positions, not ids).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_ledger_positions"
down_revision: str | None = "0004_output_chunks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEQUENCE = "job_events_seq_seq"
BACKFILL = "UPDATE job_events SET seq = id"
START_PAST_EVERY_ID = f"""
SELECT setval('{SEQUENCE}', top) FROM (
    SELECT GREATEST(
        (SELECT max(id) FROM job_events),
        pg_sequence_last_value(CAST(pg_get_serial_sequence('job_events', 'id') AS regclass))
    ) AS top
) AS highest WHERE top IS NOT NULL AND top > 0
"""
"""The positions continue after the highest id ever given out (none given: the
sequence starts at 1)."""


def _postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    if not _postgres():
        op.add_column("job_events", sa.Column("seq", sa.Integer()))
        return
    op.add_column("job_events", sa.Column("seq", sa.BigInteger()))
    op.execute(BACKFILL)
    op.execute(f"CREATE SEQUENCE {SEQUENCE}")
    op.execute(START_PAST_EVERY_ID)
    op.create_index(
        "uq_job_events_seq",
        "job_events",
        ["seq"],
        unique=True,
        postgresql_where=sa.text("seq IS NOT NULL"),
    )
    op.create_index(
        "ix_job_events_unsequenced",
        "job_events",
        ["id"],
        postgresql_where=sa.text("seq IS NULL"),
    )


def downgrade() -> None:
    if not _postgres():
        # SQLite 3.35+ drops an unindexed column in place: no rebuild, so
        # sqlite_sequence (the highest id ever given out) is untouched.
        op.execute("ALTER TABLE job_events DROP COLUMN seq")
        return
    op.drop_index("ix_job_events_unsequenced", table_name="job_events")
    op.drop_index("uq_job_events_seq", table_name="job_events")
    op.execute(f"DROP SEQUENCE {SEQUENCE}")
    op.drop_column("job_events", "seq")
