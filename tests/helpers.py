"""Shared test helpers: run the CLI in-process or as a real process, read the
database directly, and poll for conditions with a deadline (never a bare sleep).

A queue (`Db`) is what `--db` takes: an SQLite file as a `Path` (or a `str`
path), or a PostgreSQL URL (`postgresql+psycopg://...`, a `str`). Every helper
takes either; `rows` and `execute` read and write the queue directly, with
sqlite3 on a file and psycopg on a URL, both with `?` placeholders."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import psutil

from spoolctl.cli import run as cli_run
from spoolctl.cli.database import open_write
from spoolctl.db.backends import locate
from spoolctl.db.backends.base import Driver
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests import forkserver

Db: TypeAlias = Path | str
"""A queue: an SQLite file's path, or a PostgreSQL URL (what `--db` takes)."""

REPO = Path(__file__).resolve().parents[1]


def _timeout_scale() -> float:
    raw = os.environ.get("SPOOLCTL_TEST_TIMEOUT_SCALE", "4")
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not 0 < scale <= 100:  # also NaN and inf
        raise ValueError(f"SPOOLCTL_TEST_TIMEOUT_SCALE must be a number in (0, 100], got {raw!r}")
    return scale


TIMEOUT_SCALE = _timeout_scale()
"""Every deadline of the tests is its written number of seconds times this
(env SPOOLCTL_TEST_TIMEOUT_SCALE, default 4): `wait_for`, `patience()`, and
each test's pytest-timeout limit (tests/conftest.py). A written number is
what a test needs on an idle machine, with a margin; on two cores saturated
by other work (./scripts/test's own three processes and their workers, or
SPOOLCTL_TEST_LOAD) a verb or a worker's loop can be many times slower.
A deadline only bounds how long a failure takes to show: a condition
that holds ends the wait at once, so a generous scale costs nothing."""

SOAK = float(os.environ.get("SPOOLCTL_TEST_SOAK") or 1)
"""How many times over the soak runs go (env SPOOLCTL_TEST_SOAK, default 1,
as CI runs them): the long chaos run's killing time and jobs
(tests/process/test_chaos.py) and the spawn window's rounds
(tests/process/test_spawn_window.py). A soak sets 3 or more."""


def patience(seconds: float) -> float:
    """A deadline for something that takes CPU (a process to start, exit, or
    get through its loop): `seconds` on an idle machine, scaled for a loaded
    one (TIMEOUT_SCALE). Not for durations a test sets up on purpose."""
    return seconds * TIMEOUT_SCALE


FAST_KNOBS = {
    "SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.2",
    "SPOOLCTL_TEST_REAP_THRESHOLD": "1.0",
}


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.stdout)

    @property
    def data(self) -> Any:
        return self.envelope["data"]


def cli(
    *args: str, db: Db | None = None, env: dict[str, str] | None = None, json: bool = False
) -> Result:
    """Run spoolctl in a real subprocess (python -m spoolctl, forked by
    tests/forkserver.py with SQLAlchemy and click already imported) and
    capture it.

    db and json insert `--db PATH` / `--json` right after the verb, where every
    verb accepts them (before any `--` or command argv)."""
    extra = (["--db", str(db)] if db is not None else []) + (["--json"] if json else [])
    argv = [*args[:1], *extra, *args[1:]]
    proc = forkserver.run(argv, child_env(env), timeout=120, base_env=child_env())
    return Result(proc.returncode, proc.stdout, proc.stderr)


def cli_json(*args: str, db: Db | None = None, env: dict[str, str] | None = None) -> Result:
    return cli(*args, db=db, env=env, json=True)


def inproc(*args: str, capsys: Any) -> Result:
    """Run spoolctl in this process (fast) with pytest's capsys."""
    code = cli_run(list(args))
    out, err = capsys.readouterr()
    return Result(code, out, err)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FAST_KNOBS)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SPOOLCTL_DB", None)
    if extra:
        env.update(extra)
    return env


STARTED_WORKERS: list[subprocess.Popen[str]] = []
"""Every worker start_worker() launched; tests/conftest.py kills leftovers."""


def start_worker(
    db: Db, *args: str, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[str]:
    """A real `spoolctl work` process (loop mode unless args say otherwise)."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--json", *args],
        stdout=subprocess.PIPE if log is None else out,
        stderr=subprocess.PIPE if log is None else subprocess.STDOUT,
        text=True,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
    )
    STARTED_WORKERS.append(proc)
    return proc


def stop_started_workers() -> None:
    """Kill every worker start_worker() launched that is still running."""
    while STARTED_WORKERS:
        proc = STARTED_WORKERS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def wait_for(
    condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll until condition() is truthy; fail with `what` after the deadline:
    `timeout` seconds on an idle machine, scaled by TIMEOUT_SCALE (never a
    proof that something does not happen: that is waited for otherwise)."""
    limit = patience(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {limit:g}s ({timeout:g}s x SPOOLCTL_TEST_TIMEOUT_SCALE"
                f" {TIMEOUT_SCALE:g}) waiting for {what or condition}"
            )
        time.sleep(interval)


def signal_taken(proc: subprocess.Popen[Any], sig: int, what: str = "") -> None:
    """Send `sig` to proc and wait until the process has taken it: no longer
    pending, and asleep again (woken by it, it handled it and went back to
    waiting), or ended. Standard signals do not queue: a second one sent
    before the first was taken (at once, or while a loaded machine gives the
    process no CPU: a fixed pause is no proof) would reach it as one."""
    bit = 1 << (sig - 1)
    proc.send_signal(sig)

    def taken() -> bool:
        try:
            with open(f"/proc/{proc.pid}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            return True  # gone
        pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
        return fields["State"].strip()[0] in "SZX" and not pending & bit

    wait_for(taken, interval=0.01, what=what or f"pid {proc.pid} to take signal {sig}")


def is_postgres(db: Db) -> bool:
    """db is a PostgreSQL URL (anything shaped `scheme://`), not a file."""
    return isinstance(db, str) and "://" in db


def spool_dir(db: Db) -> Path:
    """Where the queue's workers keep their output folder: beside an SQLite
    file; for PostgreSQL the local spool the CLI derives from the URL (under
    XDG_STATE_HOME, which the db fixture points into tmp_path)."""
    return driver_of(db).spool


def driver_of(db: Db) -> Driver:
    """The driver of a queue as `--db` would name it."""
    return locate(str(db), Path.cwd(), "--db")


class Row(tuple[Any, ...]):
    """A PostgreSQL result row read like sqlite3.Row: by index or column name."""

    _names: tuple[str, ...] = ()

    @classmethod
    def build(cls, names: tuple[str, ...], values: tuple[Any, ...]) -> Row:
        row = cls(values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return super().__getitem__(self._names.index(key))
        return super().__getitem__(key)

    def keys(self) -> list[str]:
        return list(self._names)


def _pg_sql(sql: str) -> str:
    """sqlite3's `?` placeholders as psycopg's `%s`."""
    return sql.replace("%", "%%").replace("?", "%s")


def _pg_connect(url: str) -> Any:
    import psycopg

    from tests.pg_server import libpq_url

    return psycopg.connect(
        libpq_url(url), autocommit=True, connect_timeout=10, application_name="spoolctl-test"
    )


def rows(db: Db, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Read the queue directly (a plain reader: never takes the write lock).
    Rows are sqlite3.Row on SQLite, Row on PostgreSQL: both by index or name."""
    if is_postgres(db):
        with _pg_connect(str(db)) as conn:
            cur = conn.execute(_pg_sql(sql), params)
            if cur.description is None:
                return []
            names = tuple(c.name for c in cur.description)
            return [Row.build(names, tuple(r)) for r in cur.fetchall()]
    conn = sqlite3.connect(db, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def execute(db: Db, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Write to the queue behind spoolctl's back (as a crash or an operator
    would), committed at once; returns the changed row count."""
    if is_postgres(db):
        with _pg_connect(str(db)) as conn:
            return int(conn.execute(_pg_sql(sql), params).rowcount)
    conn = sqlite3.connect(db, timeout=10)
    try:
        with conn:
            return conn.execute(sql, params).rowcount
    finally:
        conn.close()


QUEUE_TABLES = (
    "jobs",
    "attempts",
    "job_events",
    "workers",
    "lanes",
    "job_dependencies",
    "output_chunks",
)


class WriteLock:
    """Another connection holding the queue's write lock until release():
    SQLite's (BEGIN IMMEDIATE); on PostgreSQL an EXCLUSIVE lock on every
    queue table, which lets plain reads through and makes every writer wait,
    as SQLite's does."""

    def __init__(self, db: Db) -> None:
        self._conn: Any
        if is_postgres(db):
            self._conn = _pg_connect(str(db))
            self._conn.autocommit = False
            self._conn.execute(f"LOCK TABLE {', '.join(QUEUE_TABLES)} IN EXCLUSIVE MODE")
        else:
            self._conn = sqlite3.connect(db, isolation_level=None)
            self._conn.execute("BEGIN IMMEDIATE")
        self._held = True

    def release(self) -> None:
        """Roll back and close; safe to call twice."""
        if not self._held:
            return
        self._held = False
        if isinstance(self._conn, sqlite3.Connection):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        else:
            self._conn.rollback()
        self._conn.close()


def execute_all(db: Db, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Like execute(), several statements in one transaction."""
    if is_postgres(db):
        with _pg_connect(str(db)) as conn, conn.transaction():
            for sql, params in statements:
                conn.execute(_pg_sql(sql), params)
        return
    conn = sqlite3.connect(db, timeout=10)
    try:
        with conn:
            for sql, params in statements:
                conn.execute(sql, params)
    finally:
        conn.close()


def write_lock_free(db: Db) -> bool:
    """Another connection could take the write lock at once: no transaction
    holds it (on PostgreSQL: none holds a lock that conflicts with an
    EXCLUSIVE lock on the queue tables, as every writing transaction does)."""
    if is_postgres(db):
        import psycopg

        with _pg_connect(str(db)) as conn:
            try:
                with conn.transaction():
                    tables = ", ".join(QUEUE_TABLES)
                    conn.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE NOWAIT")
            except psycopg.errors.LockNotAvailable:
                return False
            return True
    probe = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def has_queue(db: Db) -> bool:
    """A queue exists there: the SQLite file, or the jobs table in the database."""
    if is_postgres(db):
        return rows(db, "SELECT to_regclass('jobs') IS NOT NULL")[0][0] is True
    return Path(db).exists()


def job(db: Db, job_id: int) -> Any:
    return rows(db, "SELECT * FROM jobs WHERE id = ?", (job_id,))[0]


def attempts_of(db: Db, job_id: int) -> list[Any]:
    return rows(db, "SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt_no", (job_id,))


def events_of(db: Db, job_id: int) -> list[str]:
    found = rows(db, "SELECT event FROM job_events WHERE job_id = ? ORDER BY id", (job_id,))
    return [r["event"] for r in found]


def add(db: Db, *argv: str, opts: tuple[str, ...] = ()) -> int:
    """Submit through the real CLI and return the new job id."""
    result = cli("add", *opts, "--", *argv, db=db, json=True)
    assert result.exit_code == 0, result.stderr + result.stdout
    return int(result.data["job_id"])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


class Strays:
    """Processes a test saw leave its job, killed at its end whatever the
    outcome. Each is held as the process it was when seen, and killed only
    while its pid still names it: a pid that died during the test may be
    another test's job by the end (pids wrap within one run of the suite)."""

    def __init__(self) -> None:
        self._seen: list[psutil.Process] = []

    def keep(self, pid: int) -> int:
        with contextlib.suppress(psutil.NoSuchProcess):
            self._seen.append(psutil.Process(pid))
        return pid

    def kill(self) -> None:
        for proc in self._seen:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # psutil refuses a recycled pid


def add_job(db: Db, *argv: str, **spec: Any) -> int:
    """Submit in-process through the submit service: fast, no subprocess (the
    CLI's own checks of `add` are in tests/unit/test_add.py)."""
    queue = open_write(str(db))
    try:
        spec_obj = JobSpec(argv=list(argv), **spec)
        return queue.write(lambda conn: submit(conn, spec_obj, time.time())).job_id
    finally:
        queue.engine.dispose()


def kill_worker_and_guard(worker: subprocess.Popen[str], timeout: float = 10) -> None:
    """SIGKILL a worker and its lease guard (its child in its own process
    group; jobs have sessions of their own): the whole worker gone at once,
    as the OOM killer or `kill -9` of its group would, so that its jobs live
    on for a reaper to find. SIGKILL of the worker alone would let the guard
    end them the moment its pipe closes."""
    import psutil

    try:
        group = os.getpgid(worker.pid)
        children = psutil.Process(worker.pid).children()
    except (ProcessLookupError, psutil.NoSuchProcess):
        children = []
        group = -1
    for child in children:
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(child.pid) == group:
                child.kill()
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=patience(timeout))


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
"""A PID namespace with its own /proc: a "machine" of one host (a container
sharing the host name and boot), for tests of workers that cannot see each
other's processes."""
NS_INIT = '"$@" > "$0.log" 2>&1; echo $? > "$0.rc"; exec sleep 100000'
"""PID 1 of such a namespace: runs the worker, records its exit code, then
stays, so a killed worker's jobs live on as on a real machine whose worker
was killed (the namespace dies only when its PID 1 does)."""


def needs_namespaces() -> None:
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30)
    assert probe.returncode == 0, (
        "workers in PID namespaces need `unshare --pid --mount-proc` (root, as in CI): "
        + probe.stderr.decode()
    )


SUSPENDED_AT = 1_700_000_000.0
"""When `run_as_worker` says a suspended job was suspended."""


def run_as_worker(db: Db, job_id: int, *, suspended: bool) -> None:
    """Make the job running under worker `w1`, with a running attempt, as a
    claim leaves it; suspended as a delivered suspend leaves it."""
    now = time.time()
    execute(
        db,
        "UPDATE jobs SET state = 'running', locked_by = 'w1', locked_pid = 1, "
        "started_at = ?, heartbeat_at = ?, suspended_at = ? WHERE id = ?",
        (now, now, SUSPENDED_AT if suspended else None, job_id),
    )
    execute(
        db,
        "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, started_at, "
        "stdout_path, stderr_path) VALUES (?, 1, 'w1', 1, 'running', ?, 'o', 'e')",
        (job_id, now),
    )
