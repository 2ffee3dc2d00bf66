"""Which driver errors say the server was lost (UNREACHABLE, exit 4: a worker
keeps its loop and retries) rather than unusable (DB_UNUSABLE, exit 3)."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from spoolctl.db.backends.postgresql.errors import translate_errors
from spoolctl.errors import StorageFault, Unreachable

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
    worker exit (seen in test_pg_fleet's frozen-worker test)."""
    assert isinstance(told(raw), Unreachable)


def test_a_login_refused_stays_unusable() -> None:
    raw = psycopg.OperationalError('password authentication failed for user "spoolctl"')
    error = told(raw)
    assert isinstance(error, StorageFault) and error.detail["reason"] == "login_refused"
