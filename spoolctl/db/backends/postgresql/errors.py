"""PostgreSQL's errors in the contract's words: Locked, Unreachable,
StorageFault (DB_UNUSABLE with its reason), DiskFull, InvalidInput. Messages
never carry the password."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from spoolctl.db.backends.postgresql.url import scrub
from spoolctl.errors import (
    DiskFull,
    InvalidInput,
    Locked,
    SpoolError,
    StorageFault,
    Unreachable,
)


class ReadOnlyServer(StorageFault, Unreachable):
    """The server takes no writes: a hot standby (in recovery), a server or
    role with default_transaction_read_only on, or, with several hosts and
    target_session_attrs=read-write, none that takes writes now. A verb
    answers DB_UNUSABLE (reason read_only, exit 3), as for a read-only file;
    a worker waits for it as for an outage (it is an `Unreachable` too): a
    failover promotes a standby, and an operator turns the setting off,
    without anything changing on the worker's side."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message, reason="read_only", **detail)


LOST_STATES = ("57P01", "57P02", "57P03", "53300")
"""Terminated by an administrator, crash shutdown, cannot connect now, too
many connections: the server may well answer the next try."""


def display_of(engine: Engine) -> str:
    return str(engine.get_execution_options().get("spoolctl_display", "postgresql"))


@contextmanager
def translate_errors(engine: Engine) -> Iterator[None]:
    """A lock wait beyond the timeout, a deadlock or a serialization failure
    is `Locked` (retryable, exit 4); a server that did not answer or dropped
    the connection is `Unreachable` (exit 4); a server that answered but
    cannot be used (login refused, no such database, read-only, full, not a
    queue) is `StorageFault` (DB_UNUSABLE, exit 3) with its reason, a
    read-only one `ReadOnlyServer`, which workers wait out; a bad
    connection option in the URL is INVALID_INPUT. Messages never carry the
    password. Integrity violations (bugs) pass through."""
    import psycopg

    try:
        try:
            yield
        except psycopg.Error as driver_error:
            # Statements run on the driver cursor (`prepared.py`) raise psycopg's
            # own errors: judge them like SQLAlchemy's wrapped ones.
            raise DBAPIError(None, None, driver_error) from driver_error
    except DBAPIError as exc:
        state = getattr(exc.orig, "sqlstate", None) or ""
        if exc.connection_invalidated is False and state.startswith("23"):
            raise
        if state == "25006" or (not state and _refused_as_read_only(str(exc.orig))):
            # A ReadOnlyServer: every pooled session may be read-only (one on
            # a standby, or one opened while the database or role was set
            # read-only keeps that default for its life). The next transaction
            # opens a fresh one, which reads the setting again and lets libpq
            # choose a host again.
            engine.dispose()
        raise translated(exc, state, engine) from None


def translated(exc: DBAPIError, state: str, engine: Engine) -> SpoolError:
    """The public error for one driver error (see translate_errors)."""
    raw = exc.orig
    url = engine.url.render_as_string(hide_password=False)
    detail = scrub(str(raw).strip().splitlines()[0] if str(raw).strip() else repr(raw), url)
    where = display_of(engine)
    if state in ("55P03", "40001", "40P01"):
        return Locked(
            "the queue database stayed locked beyond the busy timeout; try again",
            database_error=detail,
        )
    if any(words in detail for words in BAD_OPTION_WORDS):
        return InvalidInput(
            f"the database URL {where} has a connection option the driver refuses: {detail}",
            db=where,
            database_error=detail,
        )
    standby = None if state else _refused_as_read_only(scrub(str(raw), url))
    if standby is not None or state == "25006":
        return ReadOnlyServer(
            f"the PostgreSQL server of {where} takes no writes (a hot standby, or "
            f"default_transaction_read_only is on): {standby or detail}",
            database=where,
            database_error=standby or detail,
        )
    if _connection_lost(exc, state, detail):
        return Unreachable(
            f"the PostgreSQL server of {where} did not answer or dropped the connection: {detail}",
            database=where,
            database_error=detail,
        )
    reason = unusable_reason(state, detail)
    if reason == "disk_full":
        return DiskFull(
            f"the PostgreSQL server of {where} is out of disk: {detail}", database_error=detail
        )
    return StorageFault(
        f"cannot use the queue database {where}: {detail}",
        reason=reason,
        database=where,
        database_error=detail,
    )


UNUSABLE_STATES = {
    "28P01": "login_refused",
    "28000": "login_refused",
    "3D000": "no_such_database",
    "42501": "unreadable",
    "25006": "read_only",
    "42P01": "not_a_queue",
    "53100": "disk_full",
}
"""SQLSTATE -> DB_UNUSABLE reason."""
UNUSABLE_WORDS = (
    ("password authentication failed", "login_refused"),
    ("no password supplied", "login_refused"),
    ("authentication failed", "login_refused"),
    ("pg_hba.conf", "login_refused"),
    ('role "', "login_refused"),
    ('database "', "no_such_database"),
    ("permission denied", "unreadable"),
    ("read-only transaction", "read_only"),
)
"""libpq's words for a connection refused for good (it gives no SQLSTATE then)."""
STANDBY_WORDS = ("session is read-only", "server is in hot standby mode")
"""libpq's words for a server it connected to and left, because it takes no
writes where target_session_attrs asks for one that does (read-write,
primary): with several hosts, a line for each, the last one first."""


def _refused_as_read_only(text: str) -> str | None:
    """The line of a failed connect that says a server takes no writes, if
    any: with several hosts, one that answered so is why no host would do,
    whatever the others (down, unreachable) said."""
    lines = (line.strip(" -") for line in text.splitlines())
    return next((line for line in lines if any(w in line for w in STANDBY_WORDS)), None)


BAD_OPTION_WORDS = ("invalid connection option", "invalid sslmode value", "invalid integer value")


def unusable_reason(state: str, detail: str) -> str:
    if state in UNUSABLE_STATES:
        return UNUSABLE_STATES[state]
    return next((reason for words, reason in UNUSABLE_WORDS if words in detail), "unusable")


def _connection_lost(exc: DBAPIError, state: str, detail: str) -> bool:
    """A connection that failed or died, not one refused for good (a wrong
    password, a database that does not exist, a bad option)."""
    refused_for_good = any(words in detail for words, _ in UNUSABLE_WORDS)
    if not state and refused_for_good:
        return False
    if exc.connection_invalidated or state.startswith("08") or state in LOST_STATES:
        return True
    # psycopg's own subclasses too: a connect attempt that ran out of time
    # (ConnectionTimeout, e.g. a process frozen while it connected) is lost
    import psycopg

    return not state and isinstance(exc.orig, psycopg.OperationalError)
