"""Where a measured queue lives: an SQLite file or a PostgreSQL database.
bench/harness.py drains them and picks jobs up from them without knowing
which; this module is the only one that does.

A queue is made the way a user makes one (its first job added by the
implementation's own `spoolctl add`), then grown with plain SQL to as many
identical due jobs as a scenario needs: the rows are exactly what `add`
writes, at a fraction of the cost.

- SQLite (SqliteBackend): a fresh file `q.db` in the measurement's folder,
  for ours or the reference; the jobs' output goes in the file's spool folder.
- PostgreSQL (PgBackend): ours only (the reference has no PostgreSQL
  backend). A fresh database copied from a template made once per server by
  `spoolctl migrate` (CREATE DATABASE ... STRATEGY FILE_COPY, which
  checkpoints before and after), ANALYZEd once filled, dropped when the queue
  is closed. Its processes get the server's passfile and a fresh
  SPOOLCTL_SPOOL_DIR in the measurement's folder (on the measured disk).
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fixtures import OURS, BenchError, Impl, clean_env, clone_queued, count_state, run_cli

if TYPE_CHECKING:  # imported by pg.py, which starts the server: SQLite alone needs none
    from pgserve import BenchServer

CLAIM_SQL = "SELECT started_at FROM attempts WHERE job_id = {p} ORDER BY attempt_no LIMIT 1"
"""The first attempt's claim time as stored (same schema on both backends)."""


class Queue(Protocol):
    """One queue ready for spoolctl processes: what `--db` gets, and the
    environment they run with."""

    db: str
    env: dict[str, str]

    def fill(self, total: int, due_at: float) -> None:
        """Grow the one queued job to `total` identical jobs, all due at due_at."""

    def count(self, state: str) -> int:
        """How many jobs are in state."""

    def claimed_at(self, job_id: int) -> float:
        """The stored claim time of the job's first attempt (the server's clock
        on PostgreSQL, as spoolctl samples it; this machine's on SQLite)."""

    def server_counters(self) -> dict[str, float]:
        """Work done by a database server so far (empty: no server)."""

    def connections(self) -> dict[str, int]:
        """Server connections on this queue, by application_name (empty: no server)."""

    def close(self) -> None:
        """Release what the queue holds (a PostgreSQL database is dropped)."""


class Backend(Protocol):
    name: str

    def queue(
        self, impl: Impl, d: Path, job: Sequence[str] = ("true",), env: dict[str, str] | None = None
    ) -> Queue:
        """A fresh queue for impl in folder d holding one queued job (argv job),
        added by impl's `spoolctl add`; env: variables added to its processes'."""


# -- SQLite --------------------------------------------------------------------------------


class SqliteQueue:
    def __init__(self, impl: Impl, d: Path, job: Sequence[str], env: dict[str, str]) -> None:
        self.path = d / "q.db"
        self.db = str(self.path)
        self.env = {**clean_env(), **env}
        run_cli(impl, "add", "--db", self.db, "--json", "--", *job, cwd=d, env=self.env)

    def fill(self, total: int, due_at: float) -> None:
        clone_queued(self.path, total, due_at)

    def count(self, state: str) -> int:
        return count_state(self.path, state)

    def claimed_at(self, job_id: int) -> float:
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
            return float(conn.execute(CLAIM_SQL.format(p="?"), (job_id,)).fetchone()[0])

    def server_counters(self) -> dict[str, float]:
        return {}

    def connections(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


class SqliteBackend:
    name = "sqlite"

    def queue(
        self, impl: Impl, d: Path, job: Sequence[str] = ("true",), env: dict[str, str] | None = None
    ) -> SqliteQueue:
        return SqliteQueue(impl, d, job, env or {})


SQLITE = SqliteBackend()


# -- PostgreSQL ----------------------------------------------------------------------------


def _db_name(kind: str) -> str:
    return f"bench_{kind}_{secrets.token_hex(4)}"


class PgBackend:
    """Queues as databases on one server (bench/pgserve.py)."""

    name = "pg"

    def __init__(self, srv: BenchServer) -> None:
        self.srv = srv
        self._template: str | None = None

    def env(self, spool: Path) -> dict[str, str]:
        """What a spoolctl process on PostgreSQL gets: no SPOOLCTL_* knob but the
        output folder (on the measured disk), and the passfile."""
        env = self.srv.client_env(clean_env())
        env["SPOOLCTL_SPOOL_DIR"] = str(spool)
        return env

    def template(self, d: Path) -> str:
        """A database at head with no rows, made once by `spoolctl migrate` (as
        docs/postgresql.md says), that each queue is copied from."""
        if self._template is None:
            name = _db_name("template")
            url = self.srv.create_database(name)
            run_cli(OURS, "migrate", "--db", url, "--json", cwd=d, env=self.env(d / "spool"))
            self._template = name
        return self._template

    def queue(
        self, impl: Impl, d: Path, job: Sequence[str] = ("true",), env: dict[str, str] | None = None
    ) -> PgQueue:
        if impl is not OURS:
            raise BenchError(f"{impl.name} has no PostgreSQL backend")
        return PgQueue(self, d, job, env or {})


class PgQueue:
    def __init__(
        self, backend: PgBackend, d: Path, job: Sequence[str], env: dict[str, str]
    ) -> None:
        self.srv = backend.srv
        self.name = _db_name("q")
        self.db = self.srv.create_database(self.name, template=backend.template(d))
        self.env = {**backend.env(d / "spool"), **env}
        self._conn: Any = None
        try:
            run_cli(OURS, "add", "--db", self.db, "--json", "--", *job, cwd=d, env=self.env)
        except BaseException:
            self.srv.drop_database(self.name)
            raise

    def _session(self) -> Any:
        """A connection kept open for repeated reads (an idle worker's seed job,
        its claim times), opened on first use: never during a timed drain."""
        if self._conn is None:
            self._conn = self.srv.connect(self.name, autocommit=True)
        return self._conn

    def fill(self, total: int, due_at: float) -> None:
        """As fixtures.clone_queued does for SQLite, in SQL (each row inserted
        once, with its due time), then ANALYZE (a queue in use has statistics;
        autovacuum would otherwise gather them at a random moment of the
        drain)."""
        with self.srv.connect(self.name, autocommit=True) as conn:
            cols = _columns(conn, "jobs")
            ev_cols = _columns(conn, "job_events")
            first = conn.execute("SELECT min(id) FROM jobs").fetchone()[0]
            listed = ", ".join(f'"{c}"' for c in cols)
            ev_listed = ", ".join(f'"{c}"' for c in ev_cols)
            ev_values = ", ".join("j.id" if c == "job_id" else f'e."{c}"' for c in ev_cols)
            due = {"created_at", "next_run_at"}
            chosen = ", ".join("%(due)s" if c in due else f'"{c}"' for c in cols)
            with conn.transaction():
                # each row written once, as `add` writes it: an UPDATE of the
                # copies would leave a dead version of every queued job behind
                conn.execute(
                    f"INSERT INTO jobs ({listed}) SELECT {chosen} FROM jobs, "
                    "generate_series(1, %(copies)s) AS g WHERE id = %(first)s ORDER BY g",
                    {"due": due_at, "copies": total - 1, "first": first},
                )
                conn.execute(
                    f"INSERT INTO job_events ({ev_listed}) SELECT {ev_values} "
                    "FROM job_events e JOIN jobs j ON j.id <> e.job_id "
                    "WHERE e.job_id = %s ORDER BY j.id, e.id",
                    (first,),
                )
                conn.execute(
                    "UPDATE jobs SET next_run_at = %s, created_at = %s WHERE id = %s",
                    (due_at, due_at, first),
                )
            conn.execute("ANALYZE")

    def count(self, state: str) -> int:
        row = self._session().execute("SELECT count(*) FROM jobs WHERE state = %s", (state,))
        return int(row.fetchone()[0])

    def claimed_at(self, job_id: int) -> float:
        row = self._session().execute(CLAIM_SQL.format(p="%s"), (job_id,)).fetchone()
        return float(row[0])

    def server_counters(self) -> dict[str, float]:
        """Commits, rollbacks and WAL bytes so far (the database's, the server's
        WAL) and the server's CPU (all its processes: the server is the
        benchmark's own), to tell how much work a drain asked of the server. The counts of
        backends that have exited are complete; they include the few statements
        of this query's own connection."""
        with self.srv.connect(autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, xact_rollback, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 "
                "FROM pg_stat_database WHERE datname = %s",
                (self.name,),
            ).fetchone()
        return {
            "commits": float(row[0]),
            "rollbacks": float(row[1]),
            "wal_bytes": float(row[2]),
            "server_cpu_ms": 1000 * self.srv.server_cpu_s(),
        }

    def connections(self) -> dict[str, int]:
        rows = (
            self._session()
            .execute(
                "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND pid <> pg_backend_pid() GROUP BY 1",
                (self.name,),
            )
            .fetchall()
        )
        return {str(app): int(n) for app, n in rows}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.srv.drop_database(self.name)


def _columns(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND column_name NOT IN ('id', 'seq') ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]
