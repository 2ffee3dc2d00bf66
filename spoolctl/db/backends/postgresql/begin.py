"""How a transaction of ours opens on PostgreSQL: its settings (set_config's
is_local, so a pooled server session keeps nothing of ours) and the schema
revision read in the same round trip; for a write engine that checks the
revision, the BEGIN in that round trip too, sent with the transaction's
first statement (`Opening`): inside a pipeline it costs no wait of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError

from spoolctl.db.engine import RevisionMismatch
from spoolctl.db.prepared import OPENING_INFO, opened


def check_revision(found: str | None, expected: str) -> None:
    if found != expected:
        raise RevisionMismatch(
            f"schema revision changed underneath: expected {expected}, found {found}",
            expected=expected,
            found=found,
        )


def revision_with(conn: Connection, setting: str, params: dict[str, Any] | None) -> str | None:
    """Run the transaction's setting statement and read the revision in the
    same round trip; None when there is no alembic_version table (a failed
    transaction is rolled back when the connection returns to the pool)."""
    try:
        row = conn.exec_driver_sql(f"{setting}, ({_VERSION_SQL} LIMIT 1)", params).first()
        found = None if row is None else row[-1]
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == "42P01":  # undefined_table
            return None
        raise
    return None if found is None else str(found)


_VERSION_SQL = "SELECT version_num FROM alembic_version"


_BEGIN_SQL = "BEGIN ISOLATION LEVEL READ COMMITTED"


@dataclass(frozen=True)
class Opening:
    """A write transaction's opening, due until its first statement: the
    begin hook leaves it in the connection's info (`prepared.OPENING_INFO`)
    and whatever runs first sends it, so a transaction whose statements go
    out in one pipeline opens in that pipeline's round trip. Nothing of the
    transaction runs before it: its settings and revision check hold for
    every statement, and a transaction that runs none opens none."""

    setting: str
    """The settings as literals (`limits.setting_literals`)."""
    expected: str

    def now(self, conn: Connection) -> None:
        """On its own, in one round trip: the settings and the revision read,
        then BEGIN, as one simple query. PostgreSQL takes statements that a
        BEGIN follows in one query into the transaction it opens, so the
        settings (set_config's is_local) hold for the whole of it; when the
        revision read fails (no alembic_version) the BEGIN does not run and
        nothing is left open. On the driver cursor: this runs while
        SQLAlchemy is about to run a statement of its own."""
        import psycopg

        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(f"{self.setting}, ({_VERSION_SQL} LIMIT 1); {_BEGIN_SQL}")
            row = cursor.fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate != "42P01":  # undefined_table: no BEGIN ran, nothing is open
                raise
            row = None
        check_revision(None if row is None else str(row[-1]), self.expected)

    def queue(self, driver: Any) -> Any:
        """Inside the driver connection's pipeline: BEGIN, then the settings
        with the revision read, sent without waiting; `check` reads the
        answer once the pipeline has it."""
        driver.cursor().execute(_BEGIN_SQL)
        cursor = driver.cursor()
        cursor.execute(f"{self.setting}, ({_VERSION_SQL} LIMIT 1)")
        return cursor

    def check(self, cursor: Any, failed: BaseException | None = None) -> None:
        """The revision the queued opening read must be ours. After the
        pipeline failed (`failed`), a revision that is not ours, or no
        alembic_version at all, is the reason to tell; otherwise the failure
        itself is."""
        import psycopg

        if failed is None:
            row = cursor.fetchone()
        else:
            try:
                row = cursor.fetchone()
            except psycopg.Error:  # the opening itself failed
                if getattr(failed, "sqlstate", None) == "42P01":
                    check_revision(None, self.expected)
                return
        check_revision(None if row is None else str(row[-1]), self.expected)


def send_openings_first(engine: Engine) -> None:
    """engine's hooks for a due `Opening`: sent before the transaction's first
    statement SQLAlchemy runs (`Prepared` sends it itself), at commit where
    nothing ran, and dropped at a rollback."""

    @event.listens_for(engine, "before_cursor_execute")
    def _open_first(conn: Connection, *_: Any) -> None:
        opened(conn)

    @event.listens_for(engine, "commit")
    def _opened_to_commit(conn: Connection) -> None:
        if not conn.invalidated:
            opened(conn)  # a transaction that ran nothing still checks the revision

    @event.listens_for(engine, "rollback")
    def _never_opened(conn: Connection) -> None:
        # nothing ran: nothing to undo (a connection lost meanwhile is dropped
        # with its info, and touching it would raise)
        if not conn.invalidated:
            conn.connection.info.pop(OPENING_INFO, None)
