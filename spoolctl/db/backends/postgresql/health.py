"""`doctor`'s checks of a PostgreSQL queue: the server answers with a usable
version and takes writes (not a standby, not read-only), the schema is
current, the ledger's readers keep up; this machine's
spool folder (its workers' output files) is writable with space. A probe
that fails reports a failed check, never an exception."""

from __future__ import annotations

from spoolctl.db.backends.base import Check, Driver
from spoolctl.db.engine import read_tx
from spoolctl.db.health import folder_check, guarded, schema_check, space_check

MIN_POSTGRES_VERSION = 160000
"""PostgreSQL 16: `IS JSON` (tag filters on possibly damaged rows)."""


def postgres_checks(driver: Driver) -> list[Check]:
    checks = [folder_check(driver.spool), space_check(driver.spool)]
    reached = guarded("database_connect", lambda: connect_check(driver))
    checks.append(reached)
    if reached.status == "fail":
        checks += [
            Check(name, "skip", "cannot connect", blocked_by="database_connect")
            for name in ("database_writable", "schema_version")
        ]
    else:
        checks.append(guarded("database_writable", lambda: writable_check(driver)))
        checks.append(guarded("schema_version", lambda: schema_check(driver)))
    if checks[-1].status != "pass":
        checks.append(Check("ledger_lag", "skip", "queue not readable", blocked_by=checks[-1].id))
    else:
        checks.append(guarded("ledger_lag", lambda: ledger_check(driver)))
    return checks


def connect_check(driver: Driver) -> Check:
    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            number = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            shown = str(conn.exec_driver_sql("SHOW server_version").scalar_one())
    finally:
        engine.dispose()
    if number < MIN_POSTGRES_VERSION:
        return Check(
            "database_connect",
            "fail",
            f"PostgreSQL {shown} is older than 16",
            "use PostgreSQL 16 or newer",
        )
    return Check("database_connect", "pass", f"PostgreSQL {shown}")


READ_ONLY = "DB_UNUSABLE (reason read_only)"
"""How a failed database_writable check begins: what every write would answer."""


def writable_check(driver: Driver) -> Check:
    """The server takes writes: not a hot standby (pg_is_in_recovery), and
    default_transaction_read_only off for this login (set on the server, the
    database or the role). Readers work either way."""
    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            standby, read_only = conn.exec_driver_sql(
                "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')"
            ).one()
    finally:
        engine.dispose()
    if standby:
        return Check(
            "database_writable",
            "fail",
            f"{READ_ONLY}: the server is a hot standby (in recovery): add, work and "
            "every other write are refused; reads work",
            "point --db at the primary, or name every server in one URL with "
            "target_session_attrs=read-write (docs/postgresql.md)",
        )
    if read_only == "on":
        return Check(
            "database_writable",
            "fail",
            f"{READ_ONLY}: default_transaction_read_only is on for this login: add, "
            "work and every other write are refused; reads work",
            "turn it off where it is set (postgresql.conf, ALTER DATABASE or ALTER "
            "ROLE … SET default_transaction_read_only = off)",
        )
    return Check("database_writable", "pass", "the server takes writes (a primary, not read-only)")


TRANSACTION_STALE_S = 60.0
"""A writing transaction open longer than this holds its events (and row
locks) back beyond what the driver's settings let ours last."""


def ledger_check(driver: Driver) -> Check:
    """How far the ledger's positions are behind the writers: events committed
    but not numbered yet (the next `events` read numbers them), and the
    longest-open writing transaction, whose events appear when it commits.
    Warns when such a transaction has been open beyond what the driver's
    server settings let ours last (another program's, or a session without
    them)."""
    from spoolctl.db.backends.postgresql.ledger import ledger_lag
    from spoolctl.db.backends.postgresql.limits import idle_limit_ms

    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            lag = ledger_lag(conn)
    finally:
        engine.dispose()
    waiting, behind, writer_s = lag["unnumbered"], lag["behind_s"], lag["oldest_writer_s"]
    parts = [
        f"{waiting} event(s) committed without a position yet"
        + (f" (the oldest {behind:.0f} s old)" if waiting else "")
    ]
    if writer_s is not None:
        app, state = lag["oldest_writer_app"], lag["oldest_writer_state"]
        shown = f"{app or 'unnamed'}, {state}"
        parts.append(f"oldest writing transaction open {writer_s:.1f} s ({shown})")
    message = "; ".join(parts)
    if writer_s is not None and float(writer_s) > max(TRANSACTION_STALE_S, idle_limit_ms() / 1000):
        return Check(
            "ledger_lag",
            "warn",
            message,
            "end that transaction (pg_terminate_backend); its events and row locks wait for it",
        )
    return Check("ledger_lag", "pass", message)
