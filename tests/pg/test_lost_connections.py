"""Which driver errors say the server was lost (UNREACHABLE, exit 4: a worker
keeps its loop and retries) rather than unusable (DB_UNUSABLE, exit 3)."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.exc import DBAPIError

from spoolctl.db.backends.postgresql.errors import translate_errors
from spoolctl.errors import StorageFault, Unreachable
from tests.helpers import child_env

URL = "postgresql+psycopg://spoolctl@127.0.0.1:1/queue"


def told(raw: Exception) -> Exception:
    engine = create_engine(URL)
    try:
        with translate_errors(engine):
            raise DBAPIError(None, None, raw)
    except Exception as exc:  # the translated error
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.parametrize(
    "raw",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.ConnectionTimeout("connection timeout expired"),
    ],
)
def test_a_connection_that_failed_or_ran_out_of_time_is_unreachable(raw: Exception) -> None:
    """A frozen worker woken after its connect deadline gets ConnectionTimeout
    (a subclass): transient, as a dropped connection is; DB_UNUSABLE made the
    worker exit (seen in tests/pg/test_fleet.py's frozen-worker test)."""
    assert isinstance(told(raw), Unreachable)


def test_a_login_refused_stays_unusable() -> None:
    raw = psycopg.OperationalError('password authentication failed for user "spoolctl"')
    error = told(raw)
    assert isinstance(error, StorageFault) and error.detail["reason"] == "login_refused"


CHECK_IN_AFTER_A_TERMINATION = """
import sys
from sqlalchemy import create_engine
import spoolctl.db.engine  # what every spoolctl process with an engine imports
engine = create_engine(sys.argv[1])
admin = create_engine(sys.argv[1], isolation_level="AUTOCOMMIT")
raw = engine.raw_connection()
cursor = raw.cursor()
cursor.execute("SELECT pg_backend_pid()")
pid = cursor.fetchone()[0]
with admin.connect() as conn:
    conn.exec_driver_sql("SELECT pg_terminate_backend(%(p)s, 10000)", {"p": pid})
raw.close()  # back to the pool: its rollback meets the terminated connection
print("checked in")
"""


@pytest.mark.pg
@pytest.mark.subprocess
def test_a_connection_lost_mid_transaction_prints_no_traceback(pg_url: str) -> None:
    """The pool's rollback of a connection the server ended mid-transaction
    fails, and SQLAlchemy logs that with a traceback: a worker printed it raw
    on stderr (once in ~830 terminations), breaking `--log-format json`."""
    url = make_url(pg_url).set(drivername="postgresql+psycopg")
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_IN_AFTER_A_TERMINATION, url.render_as_string(False)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "checked in"
    assert proc.stderr == ""
