"""How a transaction of ours opens on PostgreSQL: its settings (set_config's
is_local, so a pooled server session keeps nothing of ours) and the schema
revision read in the same round trip; for a write engine that checks the
revision, the BEGIN in that round trip too."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from spoolctl.db.backends.postgresql.limits import setting_literals
from spoolctl.db.engine import RevisionMismatch


def check_revision(found: str | None, expected: str) -> None:
    if found != expected:
        raise RevisionMismatch(
            f"schema revision changed underneath: expected {expected}, found {found}",
            expected=expected,
            found=found,
        )


def begin_in_one_trip(conn: Connection, settings: dict[str, str], expected: str) -> None:
    """A write transaction opened in one round trip: the settings and the
    revision read, then BEGIN, as one simple query. PostgreSQL takes
    statements that a BEGIN follows in one query into the transaction it
    opens, so the settings (set_config's is_local) hold for the whole of it.
    When the revision read fails (no alembic_version) the BEGIN does not run
    and nothing is left open."""
    found = revision_with(
        conn, setting_literals(settings), None, then="; BEGIN ISOLATION LEVEL READ COMMITTED"
    )
    check_revision(found, expected)


def revision_with(
    conn: Connection, setting: str, params: dict[str, Any] | None, then: str = ""
) -> str | None:
    """Run the transaction's setting statement and read the revision in the
    same round trip (and `then`, the statements that follow in the same
    query); None when there is no alembic_version table (a failed
    transaction is rolled back when the connection returns to the pool)."""
    try:
        row = conn.exec_driver_sql(f"{setting}, ({_VERSION_SQL} LIMIT 1){then}", params).first()
        found = None if row is None else row[-1]
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == "42P01":  # undefined_table
            return None
        raise
    return None if found is None else str(found)


_VERSION_SQL = "SELECT version_num FROM alembic_version"
