"""PostgreSQL: what differs from the embedded SQLite file, in one place.

- Engine: psycopg 3 through SQLAlchemy, READ COMMITTED for writes (claims take
  their row with FOR UPDATE SKIP LOCKED, every hand-over is guarded by the
  attempt it expects), REPEATABLE READ READ ONLY for read snapshots. A write
  waits for a row lock at most the busy timeout (`lock_timeout`), then it is
  `Locked`, exactly as SQLite's busy lock is.
- Every transaction re-reads the schema revision, so a worker of another
  version stops at its next transaction.
- Change watch: LISTEN on a connection of its own; a trigger (revision 0004)
  NOTIFYs whenever a job becomes queued, delivered at commit. With
  `SPOOLCTL_PG_NOTIFY=0` (PgBouncer in transaction pooling) it polls.
- Clock: liveness times come from the server (`clock_timestamp()`), sampled
  as an offset from the local clock and refreshed every few seconds.
- Ledger order: event ids come from a sequence, and concurrent transactions
  could commit them out of order; inserting an event first takes a
  transaction-level advisory lock, so ids commit in the order they are drawn
  and `events --since-id` never skips one.
- Migrations run in one transaction under a transaction-level advisory lock;
  there is no file to back up (use pg_dump; `docs/postgresql.md`).

Nothing here is imported unless `--db` names a PostgreSQL URL.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError

from spoolctl.db.url import connect_kwargs, driver_url, masked, scrub
from spoolctl.errors import (
    DiskFull,
    ExtraMissing,
    InvalidInput,
    Locked,
    SpoolError,
    StorageFault,
    Unreachable,
)
from spoolctl.wakeup import readable

LOST_STATES = ("57P01", "57P02", "57P03", "53300")
"""Terminated by an administrator, crash shutdown, cannot connect now, too
many connections: the server may well answer the next try."""

LEDGER_LOCK_KEY = 0x5C0_01ED
"""pg_advisory_xact_lock key serializing event inserts (ids commit in order)."""
MIGRATE_LOCK_KEY = 0x5C0_0111
"""pg_advisory_xact_lock key serializing schema changes."""
SLOTS_LOCK_BASE = 0x5C0_0000
"""Added to a hash of the queue name: serializes `--slots` counting per lane."""
NOTIFY_CHANNEL = "spoolctl_work"
CLOCK_RESAMPLE_S = 5.0
CLOCK_ONLY_OPTION = "spoolctl_clock_only"
POLL_S = 0.5
"""Without notifications an idle worker looks for work this often."""
CONNECT_TIMEOUT_S = 10
IDLE_IN_TRANSACTION_MAX_S = 10.0
NETWORK_TIMEOUT_MAX_S = 10.0


def idle_limit_ms() -> int:
    """How long the server lets a session sit idle inside a transaction: a
    quarter of the lease (at least 1 s, at most 10 s), so a frozen worker's
    locks are released well before its jobs could be requeued."""
    from spoolctl.config import Timing

    hang = Timing.from_env().hang_threshold_s
    if hang <= 0:
        return int(IDLE_IN_TRANSACTION_MAX_S * 1000)
    return int(min(IDLE_IN_TRANSACTION_MAX_S, max(1.0, hang / 4)) * 1000)


def network_bounds() -> dict[str, Any]:
    """libpq settings that bound how long a call can hang on a dead network:
    unacknowledged data fails after `tcp_user_timeout`, an idle connection is
    probed by keepalives. Scaled to the lease (SPOOLCTL_HANG_THRESHOLD): a
    worker must notice a lost server well within half of it, when it fences
    itself, since others requeue its jobs after the whole of it."""
    from spoolctl.config import Timing

    hang = Timing.from_env().hang_threshold_s
    bound = NETWORK_TIMEOUT_MAX_S if hang <= 0 else min(NETWORK_TIMEOUT_MAX_S, max(0.5, hang / 8))
    return {
        "connect_timeout": max(2, min(CONNECT_TIMEOUT_S, int(bound))),
        "tcp_user_timeout": int(bound * 1000),
        "keepalives": 1,
        "keepalives_idle": max(1, int(bound / 2)),
        "keepalives_interval": 1,
        "keepalives_count": 2,
    }


RELISTEN_S = 5.0
"""A lost LISTEN connection is opened again this often (polling meanwhile)."""


def notifications_enabled() -> bool:
    return os.environ.get("SPOOLCTL_PG_NOTIFY", "1") != "0"


def make_engine(
    url: str,
    *,
    write: bool,
    busy_timeout_s: float,
    expected_revision: str | None,
    lock_wait_option: str,
    read_only_option: str,
    on_mismatch: type[SpoolError],
) -> Engine:
    require_driver()
    engine = create_engine(
        driver_url(url),
        pool_size=2,
        max_overflow=4,
        connect_args={**network_bounds(), "application_name": "spoolctl"},
        hide_parameters=True,
    )
    engine.update_execution_options(spoolctl_display=masked(url))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # A session left idle inside a transaction (its worker frozen or cut
        # off) would hold row and ledger locks for the whole fleet: the
        # server ends it. Ours last milliseconds; migrate and copy-to run
        # statements back to back.
        dbapi_conn.execute(f"SET idle_in_transaction_session_timeout = {idle_limit_ms()}")
        dbapi_conn.commit()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get(CLOCK_ONLY_OPTION, False):
            return  # a clock reading touches no table: any schema (or none) will do
        # One round trip: the transaction's settings and the revision check.
        if write and not options.get(read_only_option, False):
            wait_s = min(busy_timeout_s, options.get(lock_wait_option, busy_timeout_s))
            ms = f"{max(1, int(wait_s * 1000))}ms" if wait_s > 0 else "1ms"
            setting = "SELECT set_config('lock_timeout', %(ms)s, true)"
            params: dict[str, Any] | None = {"ms": ms}
        else:
            setting = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
            params = None
        if expected_revision is None:
            conn.exec_driver_sql(setting, params)
            return
        found = _revision_with(conn, setting, params)
        if found != expected_revision:
            raise on_mismatch(
                f"schema revision changed underneath: expected {expected_revision}, found {found}",
                expected=expected_revision,
                found=found,
            )

    return engine


def require_driver() -> None:
    """psycopg 3 is the optional `postgresql` extra: without it a PostgreSQL
    `--db` is EXTRA_MISSING, naming what to install."""
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        raise ExtraMissing(
            "--db names a PostgreSQL database, which needs psycopg 3 (the postgresql extra)",
            extra="postgresql",
        ) from None


def _revision_with(conn: Connection, setting: str, params: dict[str, Any] | None) -> str | None:
    """Run the transaction's setting statement and read the revision (one
    round trip for a write transaction); None when there is no
    alembic_version table (the failed transaction is rolled back when the
    connection returns to the pool)."""
    try:
        if params is None:  # SET TRANSACTION must come first, on its own
            conn.exec_driver_sql(setting)
            found = conn.exec_driver_sql(_VERSION_SQL).scalar()
        else:
            row = conn.exec_driver_sql(f"{setting}, ({_VERSION_SQL} LIMIT 1)", params).first()
            found = None if row is None else row[1]
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == "42P01":  # undefined_table
            return None
        raise
    return None if found is None else str(found)


_VERSION_SQL = "SELECT version_num FROM alembic_version"


def display_of(engine: Engine) -> str:
    return str(engine.get_execution_options().get("spoolctl_display", "postgresql"))


def lock_ledger(conn: Connection) -> None:
    """Once per transaction (a transaction often writes several events)."""
    transaction = conn.get_transaction()
    if transaction is not None and conn.info.get(_LEDGER_HELD_BY) is transaction:
        return
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": LEDGER_LOCK_KEY})
    conn.info[_LEDGER_HELD_BY] = transaction


_LEDGER_HELD_BY = "spoolctl_ledger_held_by"


def lock_migrations(conn: Connection) -> None:
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": MIGRATE_LOCK_KEY})


def lock_lane_slots(conn: Connection, queue: str) -> None:
    conn.exec_driver_sql(
        "SELECT pg_advisory_xact_lock(%(k)s, hashtext(%(q)s))",
        {"k": SLOTS_LOCK_BASE, "q": queue},
    )


def server_now(conn: Connection) -> float:
    found: Any = conn.exec_driver_sql("SELECT extract(epoch FROM clock_timestamp())").scalar_one()
    return float(found)


class ServerClock:
    """time.time() corrected to the database server's clock.

    The offset is measured at creation and again every CLOCK_RESAMPLE_S (a
    round trip of its own, timed: the midpoint is taken), so a worker whose
    own clock is minutes off still writes and judges times on the server's
    scale. If the server cannot be reached the last offset is kept."""

    def __init__(self, engine: Engine, local: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._local = local
        self._offset = 0.0
        self._sampled_at = -1e18
        self._lock = threading.Lock()
        self._sample()

    def _sample(self) -> None:
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**{CLOCK_ONLY_OPTION: True})
                before = self._local()
                server = server_now(conn)
                after = self._local()
                conn.rollback()
        except DBAPIError:
            return
        self._offset = server - (before + after) / 2
        self._sampled_at = after

    def __call__(self) -> float:
        now = self._local()
        if now - self._sampled_at > CLOCK_RESAMPLE_S or now < self._sampled_at:
            with self._lock:
                self._sample()
            now = self._local()
        return now + self._offset


class NotifyWatch:
    """An idle worker's ear: LISTEN on a dedicated connection (never pooled,
    never inside a transaction). `changed()` is True when a notification came
    since the last look, or, as a fallback, every POLL_S; `fileno()` lets the
    worker's select() wake the moment one arrives."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Any = None
        self._last_poll = 0.0
        self._last_connect = 0.0
        if notifications_enabled():
            self._listen()

    def _listen(self) -> None:
        """(Re)connect and LISTEN; on failure, poll until the next try."""
        self._last_connect = time.monotonic()
        try:
            import psycopg

            self._conn = psycopg.connect(
                **connect_kwargs(self._url),
                autocommit=True,
                application_name="spoolctl-listen",
                **network_bounds(),
            )
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except Exception:
            self.close()

    def fileno(self) -> int | None:
        return None if self._conn is None else int(self._conn.pgconn.socket)

    def changed(self) -> bool:
        now = time.monotonic()
        if self._conn is not None:
            try:
                ready = readable([self._conn.pgconn.socket], 0)
                got = False
                if ready:
                    self._conn.pgconn.consume_input()
                    while self._conn.pgconn.notifies() is not None:
                        got = True
                if got:
                    self._last_poll = now
                    return True
            except Exception:
                self.close()
                return True
            if now - self._last_poll >= POLL_S * 4:
                self._last_poll = now
                return True
            return False
        if notifications_enabled() and now - self._last_connect >= RELISTEN_S:
            self._listen()  # the connection was lost: listen again, and look now
            return True
        if now - self._last_poll >= POLL_S:
            self._last_poll = now
            return True
        return False

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


@contextmanager
def translate_errors(engine: Engine) -> Iterator[None]:
    """A lock wait beyond the timeout, a deadlock or a serialization failure
    is `Locked` (retryable, exit 4); a server that did not answer or dropped
    the connection is `Unreachable` (exit 4); a server that answered but
    cannot be used (login refused, no such database, read-only, full, not a
    queue) is `StorageFault` (DB_UNUSABLE, exit 3) with its reason; a bad
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
    return not state and type(exc.orig).__name__ == "OperationalError"
