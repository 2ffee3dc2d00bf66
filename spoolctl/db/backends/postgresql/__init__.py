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
  `SPOOLCTL_PG_NOTIFY=0` it polls.
- Sessions hold nothing: each transaction sets what it needs for itself, so
  a transaction pooler (PgBouncer) may hand it any server session; with
  `SPOOLCTL_PG_TRANSACTION_POOLING=1` nothing is prepared and nothing LISTENs.
- Clock: liveness times come from the server (`clock_timestamp()`), sampled
  as an offset from the local clock and refreshed every few seconds.
- Ledger order: event ids come from a sequence, and concurrent transactions
  commit them out of order, so the ledger is read by `seq`, a position that
  readers give committed events under a lock only readers take (`ledger`);
  writers take no ledger lock and never wait for a reader.
- Migrations run in one transaction under a transaction-level advisory lock;
  there is no file to back up (use pg_dump; `docs/postgresql.md`).

- Output: the worker's files are the first copy; a copy goes into
  `output_chunks` (`postgresql/output.py`), so output reads the same from
  any machine. A lease guard (`spoolctl/runner/lease_guard.py`) kills a silent worker's
  jobs, since reapers on other machines cannot check its processes.

The package: this module (the driver, its engines, the statements that
differ), `begin` (how a transaction opens: its settings, the revision check
and, for a write engine, the BEGIN, in one round trip), `url` (parsing,
masking), `errors` (translation), `watch` (the
server's clock, LISTEN/NOTIFY), `output` (the stored copy), `health`
(doctor's checks), `ledger` (the readers' numbering), `limits` (time-outs
and planner settings, set per transaction). Nothing here is
imported unless `--db` names a PostgreSQL URL.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, Table, Text, bindparam, create_engine, event
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

from spoolctl.config import busy_timeout_s, local_clock
from spoolctl.db.backends.base import ChangeWatch, Check, HasTag, LeaseGuard, Synchronous
from spoolctl.db.backends.postgresql.begin import (
    Opening,
    check_revision,
    revision_with,
    send_openings_first,
)
from spoolctl.db.backends.postgresql.errors import display_of, translate_errors
from spoolctl.db.backends.postgresql.ledger import LEDGER_OPTION, ledger_lag, ledger_reader
from spoolctl.db.backends.postgresql.limits import (
    BOUNDS_OPTION,
    TRANSACTION_TIMEOUT_SINCE,
    network_bounds,
    plan_settings,
    setting_literals,
    setting_sql,
    transaction_bounds,
)
from spoolctl.db.backends.postgresql.pipeline import answer_in_pipelines, pipeline
from spoolctl.db.backends.postgresql.url import (
    driver_url,
    parse_conninfo,
    parse_url,
    require_driver,
)
from spoolctl.db.engine import LOCK_WAIT_OPTION, READ_ONLY_OPTION
from spoolctl.db.prepared import OPENING_INFO
from spoolctl.db.url import masked

if TYPE_CHECKING:
    from spoolctl.db.backends.postgresql.output import OutputCopier
    from spoolctl.db.backends.postgresql.stored import StoredOutput

__all__ = [
    "PostgresDriver",
    "display_of",
    "ledger_lag",
    "ledger_reader",
    "parse_conninfo",
    "parse_url",
    "pipeline",
    "translate_errors",
]

MIGRATE_BUSY_TIMEOUT_S = 60.0
"""A migrate waits at least this long for another migrate's lock and rows."""

MIGRATE_LOCK_KEY = 0x5C0_0111
"""pg_advisory_xact_lock key serializing schema changes."""
CAP_LOCK_BASE = 0x5C0_0000
"""Added to a hash of the lane's name: serializes counting against a lane's
cap (`--slots`), lane by lane."""


def make_engine(
    url: str,
    *,
    write: bool,
    busy_timeout_s: float,
    expected_revision: str | None,
    bounded: bool = True,
) -> Engine:
    """An engine on the database: READ COMMITTED writes whose lock waits end
    at the busy timeout (`lock_timeout`), REPEATABLE READ READ ONLY reads,
    and, with expected_revision, the revision re-read in every transaction
    (in the same round trip as the transaction's settings). `bounded`: a
    write engine's transactions end at `transaction_limit_ms` (PostgreSQL
    17+) and are planned by `limits.PLAN_SETTINGS`; migrate and copy-to run
    one long transaction, unbounded, with the server's planner defaults."""
    from spoolctl.db.backends.postgresql.watch import CLOCK_ONLY_OPTION, transaction_pooling

    require_driver()
    # psycopg prepares a statement a connection runs often (the fifth time):
    # not through a transaction pooler, where the next transaction may run on
    # another server session that never saw it.
    prepared = not transaction_pooling()
    prepare = {} if prepared else {"prepare_threshold": None}
    # A write engine that checks the revision opens its transactions itself
    # (`begin.begin_in_one_trip`): psycopg's own BEGIN would cost a round trip of
    # its own before the settings, so its connections are in autocommit mode
    # and every transaction is the begin hook's explicit one.
    one_trip = write and expected_revision is not None
    plans = plan_settings(prepared) if write and bounded else {}
    engine = create_engine(
        driver_url(url),
        pool_size=2,
        max_overflow=4,
        connect_args={**network_bounds(), "application_name": "spoolctl", **prepare},
        hide_parameters=True,
        **({"isolation_level": "AUTOCOMMIT"} if one_trip else {}),
    )
    engine.update_execution_options(spoolctl_display=masked(url))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        # No session state: every setting is the transaction's own (set_config
        # local, in the begin hook), so a pooler's server connection carries
        # nothing of ours to its next client.
        record.info[BOUNDS_OPTION] = transaction_bounds(
            write and bounded and dbapi_conn.info.server_version >= TRANSACTION_TIMEOUT_SINCE,
            busy_timeout_s,
        )

    send_openings_first(engine)
    answer_in_pipelines(engine)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get(CLOCK_ONLY_OPTION, False):
            return  # a clock reading touches no table: any schema (or none) will do
        # One round trip: the transaction's settings and the revision check.
        bounds: dict[str, str] = conn.connection.info[BOUNDS_OPTION]
        writable = write or options.get(LEDGER_OPTION, False)
        if writable and not options.get(READ_ONLY_OPTION, False):
            wait_s = min(busy_timeout_s, options.get(LOCK_WAIT_OPTION, busy_timeout_s))
            ms = f"{max(1, int(wait_s * 1000))}ms" if wait_s > 0 else "1ms"
            if one_trip and expected_revision is not None:
                # Sent with the first statement (`begin.Opening`): in the
                # round trip of a pipeline's statements where they go first.
                setting = setting_literals({"lock_timeout": ms, **bounds, **plans})
                conn.connection.info[OPENING_INFO] = Opening(setting, expected_revision)
                return
            settings = {"lock_timeout": ms, **bounds, **plans}
            setting = setting_sql(settings)
            params: dict[str, Any] | None = dict(settings)
        else:
            conn.exec_driver_sql(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                if one_trip
                else "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
            )
            setting = setting_sql(bounds)
            params = dict(bounds)
        if expected_revision is None:
            conn.exec_driver_sql(setting, params)
            return
        check_revision(revision_with(conn, setting, params), expected_revision)

    return engine


# psycopg logs what it ignores while an error unwinds (a pipeline left on a
# lost connection: "error ignored terminating"); with no handler of the
# program's, Python would print that on stderr beside the error spoolctl reports.
logging.getLogger("psycopg").addHandler(logging.NullHandler())


def lock_migrations(conn: Connection) -> None:
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": MIGRATE_LOCK_KEY})


def lock_lane_cap(conn: Connection, lane: str) -> None:
    conn.exec_driver_sql(
        "SELECT pg_advisory_xact_lock(%(k)s, hashtext(%(q)s))",
        {"k": CAP_LOCK_BASE, "q": lane},
    )


# -- the statements that differ (backends.statements(conn)) ---------------------


def event_position() -> ColumnElement[int]:
    """Events are read in the order readers numbered them (`ledger`)."""
    from spoolctl.db.tables import job_events

    return job_events.c.seq


def writes_in_with() -> bool:
    """A WITH may hold INSERT, UPDATE and DELETE: a claim is one round trip."""
    return True


def before_cap_count(conn: Connection, lane: str) -> None:
    """Claimants of one lane count its running jobs one at a time (their row
    locks alone would let two of them see the same count)."""
    lock_lane_cap(conn, lane)


def upsert(conn: Connection, table: Table, values: dict[str, Any], key: str) -> None:
    from sqlalchemy.dialects.postgresql import insert

    stmt = insert(table).values(**values)
    conn.execute(stmt.on_conflict_do_update(index_elements=[table.c[key]], set_=values))


def table_names(conn: Connection) -> set[str]:
    import sqlalchemy

    return set(sqlalchemy.inspect(conn).get_table_names())


def legacy_version(conn: Connection, tables: set[str]) -> int | None:
    """The original spoolctl only ever wrote SQLite: here such tables are foreign."""
    return None


def check_references(conn: Connection) -> None:
    """PostgreSQL checks every reference as it is written."""


@compiles(HasTag, "postgresql")
def _has_tag_postgresql(element: HasTag, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.tags, **kw)
    safe = (
        f"(CASE WHEN {column} IS JSON OBJECT THEN CAST({column} AS JSONB) ELSE '{{}}'::jsonb END)"
    )
    key = compiler.process(bindparam(None, element.key, type_=Text()), **kw)
    if element.value is None:
        return f"jsonb_exists({safe}, {key})"
    value = compiler.process(bindparam(None, element.value, type_=Text()), **kw)
    return f"(({safe} ->> {key}) = {value})"


# -- the driver ------------------------------------------------------------------


def local_spool(url: str) -> Path:
    """Where a worker of a PostgreSQL queue keeps its output files on this
    machine: `SPOOLCTL_SPOOL_DIR`, else a folder per database under
    `$XDG_STATE_HOME/spoolctl` (default `~/.local/state/spoolctl`). Output
    is also stored in the database, readable from any machine."""
    given = os.environ.get("SPOOLCTL_SPOOL_DIR")
    if given:
        return Path(given).expanduser().absolute()
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(masked(url).encode()).hexdigest()[:16]
    return state / "spoolctl" / f"pg-{digest}"


def located(location: str, base: Path, source: str) -> PostgresDriver:
    """The driver of a database's URL (`parse_url`'s or `parse_conninfo`'s)."""
    return PostgresDriver(location)


class PostgresDriver:
    """One database on a server, shared by workers on many machines."""

    name = "postgresql"
    kind_of_database = "a PostgreSQL database"
    backup_note = "none (PostgreSQL: take one with pg_dump before migrating)"
    shared = True

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def display(self) -> str:
        return masked(self.url)

    @property
    def spool(self) -> Path:
        return local_spool(self.url)

    @property
    def output_root(self) -> Path:
        return self.spool / "output"

    def redact(self, text: str) -> str:
        from spoolctl.db.backends.postgresql.url import scrub

        return scrub(text, self.url)

    def may_hold_a_queue(self) -> bool:
        return True  # only the server can tell (schema_status asks it)

    def ensure(self) -> None:
        return None  # the database exists or the login says so

    def engine(
        self,
        *,
        write: bool,
        expected_revision: str | None,
        synchronous: Synchronous = "NORMAL",
        lock_wait_s: float | None = None,
    ) -> Engine:
        timeout_s = busy_timeout_s() if lock_wait_s is None else lock_wait_s
        return make_engine(
            self.url, write=write, busy_timeout_s=timeout_s, expected_revision=expected_revision
        )

    def peek_engine(self) -> Engine:
        return self.engine(write=False, expected_revision=None)

    def migration_engine(self) -> Engine:
        wait_s = max(busy_timeout_s(), MIGRATE_BUSY_TIMEOUT_S)
        return make_engine(
            self.url, write=True, busy_timeout_s=wait_s, expected_revision=None, bounded=False
        )

    def translate_errors(self, engine: Engine) -> Any:
        return translate_errors(engine)

    def clock(self, engine: Engine) -> Callable[[], float]:
        from spoolctl.db.backends.postgresql.watch import ServerClock

        return ServerClock(engine, local_clock())

    def change_watch(self, engine: Engine) -> ChangeWatch:
        from spoolctl.db.backends.postgresql.watch import NotifyWatch

        return NotifyWatch(self.url)

    def lease_guard(self, fence_after_s: float) -> LeaseGuard | None:
        from spoolctl.runner.lease_guard import LeaseGuard as Guard

        return Guard(fence_after_s)

    def identity(self) -> object | None:
        return None  # a server, not a file: nothing can replace it underneath

    def output_writer(self) -> OutputCopier:
        from spoolctl.db.backends.postgresql.output import OutputCopier, cap_bytes

        return OutputCopier(cap_bytes())

    def output_reader(self) -> StoredOutput:
        from spoolctl.db.backends.postgresql.stored import StoredOutput

        return StoredOutput()

    def lock_for_migration(self, conn: Connection) -> None:
        lock_migrations(conn)

    def take_backup(self, label: str) -> Path | None:
        return None

    def after_migration(self, engine: Engine) -> None:
        return None

    def health_checks(self) -> list[Check]:
        from spoolctl.db.backends.postgresql.health import postgres_checks

        return postgres_checks(self)
