"""`doctor`'s checks of a PostgreSQL queue: the server answers with a usable
version, the schema is current; this machine's spool folder (its workers'
output files) is writable with space. A probe that fails reports a failed
check, never an exception."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spoolctl.db.engine import read_tx
from spoolctl.db.health import Check, folder_check, guarded, schema_check, space_check

if TYPE_CHECKING:
    from spoolctl.db.backends.postgresql import PostgresDriver

MIN_POSTGRES_VERSION = 160000
"""PostgreSQL 16: `IS JSON` (tag filters on possibly damaged rows)."""


def postgres_checks(driver: PostgresDriver) -> list[Check]:
    checks = [folder_check(driver.spool), space_check(driver.spool)]
    reached = guarded("database_connect", lambda: connect_check(driver))
    checks.append(reached)
    if reached.status == "fail":
        checks.append(Check("schema_version", "skip", "cannot connect",
                            blocked_by="database_connect"))  # fmt: skip
    else:
        checks.append(guarded("schema_version", lambda: schema_check(driver)))
    return checks


def connect_check(driver: PostgresDriver) -> Check:
    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            number = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            shown = str(conn.exec_driver_sql("SHOW server_version").scalar_one())
    finally:
        engine.dispose()
    if number < MIN_POSTGRES_VERSION:
        return Check("database_connect", "fail", f"PostgreSQL {shown} is older than 16",
                     "use PostgreSQL 16 or newer")  # fmt: skip
    return Check("database_connect", "pass", f"PostgreSQL {shown}")
