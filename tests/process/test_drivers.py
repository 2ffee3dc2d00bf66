"""The driver test suite (as riverdrivertest is River's): every method of the
protocol in spoolctl/db/backends/base.py, run against each driver through one
parametrised fixture. A new backend is one driver module plus a green run of
this file. Tests of what only one backend has say so in their name."""

from __future__ import annotations

import io
import os
import select as io_select
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import Connection, select

from spoolctl.db import revision
from spoolctl.db.backends import statements
from spoolctl.db.backends.base import Driver
from spoolctl.db.engine import RevisionMismatch, read_tx, write_tx
from spoolctl.db.migration import migrate_file
from spoolctl.db.queue import Queue, open_for_write
from spoolctl.db.revision import schema_status
from spoolctl.db.tables import workers
from spoolctl.errors import Locked
from spoolctl.services.attempt_output import find_attempt
from spoolctl.services.events import record_event
from spoolctl.states import EventKind
from tests.helpers import Db, WriteLock, add, driver_of, is_postgres, patience, rows

pytestmark = pytest.mark.both_backends


@pytest.fixture
def driver(db: Db) -> Driver:
    return driver_of(db)


@pytest.fixture
def queue(driver: Driver) -> Queue:
    opened = open_for_write(driver)
    opened.write(lambda conn: None)  # a queue at head
    return opened


def test_display_names_the_queue_without_its_secrets(driver: Driver, db: Db) -> None:
    if is_postgres(db):
        password = str(db).split(":")[2].split("@")[0]
        assert password not in driver.display and "***" in driver.display
        assert password not in driver.redact(f"FATAL: {password} was wrong")
    else:
        assert driver.display == str(db) and driver.redact("x") == "x"
    assert driver.output_root == driver.spool / "output"


def test_a_queue_that_is_not_there_yet_is_told_apart(driver: Driver, db: Db) -> None:
    """No file (SQLite), or an empty database (PostgreSQL): no schema, and
    looking created nothing."""
    assert schema_status(driver) is None
    if not is_postgres(db):
        assert not driver.may_hold_a_queue() and not Path(db).exists()


def test_ensure_makes_what_a_writer_needs_sqlite_a_private_file(driver: Driver, db: Db) -> None:
    driver.ensure()
    driver.ensure()  # twice is harmless
    if is_postgres(db):
        return
    path = Path(db)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_an_engine_re_checks_the_revision_in_every_transaction(driver: Driver) -> None:
    migrate_file(driver)
    engine = driver.engine(write=True, expected_revision="0001_initial")
    try:
        with pytest.raises(RevisionMismatch), write_tx(engine):
            pass
        with pytest.raises(RevisionMismatch), read_tx(engine):
            pass
    finally:
        engine.dispose()
    good = driver.engine(write=False, expected_revision=revision.HEAD_REVISION)
    try:
        with read_tx(good) as conn:
            assert conn.execute(select(workers.c.id)).all() == []
    finally:
        good.dispose()


def test_a_write_waits_for_the_lock_at_most_its_bound_then_is_locked(
    driver: Driver, queue: Queue, db: Db
) -> None:
    engine = driver.engine(write=True, expected_revision=None, lock_wait_s=0.3)
    holder = WriteLock(db)
    try:
        started = time.monotonic()
        with pytest.raises(Locked), write_tx(engine) as conn:
            statements(conn).upsert(conn, workers, worker_row("w1"), "id")
        assert time.monotonic() - started < 5
        with read_tx(engine) as conn:  # reads never wait for the write lock
            assert conn.execute(select(workers.c.id)).all() == []
    finally:
        holder.release()
        engine.dispose()


def test_the_peek_engine_reads_and_changes_nothing(driver: Driver, queue: Queue, db: Db) -> None:
    before = files_of(db)
    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            assert revision.inspect_schema(conn).is_head
    finally:
        engine.dispose()
    assert files_of(db) == before


def files_of(db: Db) -> dict[str, bytes]:
    if is_postgres(db):
        return {}
    folder = Path(db).parent
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.subprocess
def test_migration_engine_lock_backup_and_after(driver: Driver, queue: Queue, db: Db) -> None:
    """A migration's engine holds the lock for the change; the backup is a
    readable copy where the driver takes one (None where the operator does)."""
    add(db, "true")
    engine = driver.migration_engine()
    try:
        with write_tx(engine) as conn:
            driver.lock_for_migration(conn)
            assert revision.inspect_schema(conn).is_head
            statements(conn).check_references(conn)
    finally:
        engine.dispose()
    saved = driver.take_backup("test")
    if is_postgres(db):
        assert saved is None and "pg_dump" in driver.backup_note
    else:
        assert saved is not None and saved.parent == Path(db).parent
        assert rows(saved, "SELECT count(*) FROM jobs")[0][0] == 1
    driver.after_migration(queue.engine)
    assert queue.read(lambda conn: revision.inspect_schema(conn).is_head)


def test_the_clock_is_the_time_liveness_is_judged_by(queue: Queue) -> None:
    assert abs(queue.now() - time.time()) < 5


@pytest.mark.subprocess
def test_the_change_watch_sees_another_process_commit(queue: Queue, db: Db) -> None:
    """The counter or notification says "look" after another process
    commits, and the descriptor (SQLite's inotify watch on its log, or
    PostgreSQL's LISTEN connection) turns readable for that commit, so an
    idle worker asleep on it wakes."""
    watch = queue.driver.change_watch(queue.engine)
    try:
        watch.changed()  # the first look
        deadline = time.monotonic() + 5
        while (watch.changed() or watch.fileno() is None) and time.monotonic() < deadline:
            time.sleep(0.05)  # a fallback poll may say "look" a few times first
        fd = watch.fileno()
        assert fd is not None and fd >= 0, "a quiet queue leaves no descriptor to sleep on"
        assert io_select.select([fd], [], [], 0)[0] == [], "readable before anything was written"
        add(db, "true")
        assert io_select.select([fd], [], [], 10)[0] == [fd], "the commit woke nothing"
        assert poll(watch.changed), "a commit elsewhere was not seen"
    finally:
        watch.close()


def poll(condition: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.subprocess
def test_every_driver_guards_a_workers_jobs_where_others_may_not_see_them(
    driver: Driver,
) -> None:
    """Machines on PostgreSQL, and PID namespaces of one host on either
    backend, cannot see each other's processes: each worker's lease guard
    ends the groups it was told of once the worker is gone."""
    guard = driver.lease_guard(60.0)
    assert guard is not None
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        guard.track({job.pid})
        guard.renewed()
        guard.close()  # as the pipe closes when the worker dies
        assert job.wait(timeout=patience(10)) == -signal.SIGKILL
    finally:
        job.kill()
        job.wait()


def test_identity_changes_when_an_sqlite_file_is_replaced(
    driver: Driver, queue: Queue, db: Db
) -> None:
    first = driver.identity()
    if is_postgres(db):
        assert first is None  # a server, not a file: nothing replaces it underneath
        return
    assert first is not None and driver.identity() == first
    path = Path(db)
    os.replace(path, path.with_name("moved.db"))
    path.write_bytes(b"")
    assert driver.identity() != first


@pytest.mark.subprocess
def test_output_written_is_read_back_through_the_reader(queue: Queue, db: Db) -> None:
    """The writer stores what the job's files hold (beyond them where the
    backend stores a copy); the reader reads the same bytes either way."""
    job = add(db, "sh", "-c", "printf 'hello world'; printf 'oops' >&2")
    from tests.helpers import cli_json

    assert cli_json("work", "--drain", db=db).data["executed"] == 1
    ref = queue.read(lambda conn: find_attempt(conn, job, None))
    reader = queue.output()
    preview = queue.read(lambda conn: reader.preview(conn, ref, "stdout"))
    assert (preview["preview"], preview["size_bytes"], preview["missing"]) == (
        "hello world",
        11,
        False,
    )
    tail = queue.read(lambda conn: reader.tail(conn, ref, "stderr", 3))
    assert (tail["tail"], tail["truncated"]) == ("ops", True)
    assert queue.read(lambda conn: reader.read(conn, ref, "stdout", 6, 100)) == b"world"
    data, start, missing = queue.read(lambda conn: reader.span(conn, ref, "stdout", -5, 5))
    assert (data, start, missing) == (b"world", 6, False)
    sink = io.BytesIO()
    queue.read(lambda conn: reader.copy_to(conn, ref, "stdout", sink))
    assert sink.getvalue() == b"hello world"
    assert not queue.read(lambda conn: reader.cut_at_cap(conn, ref, "stdout"))


def test_the_writer_copies_a_running_attempts_new_output(queue: Queue, tmp_path: Path) -> None:
    """A pass copies what was appended since the last (nothing where the
    files are the store: no pass is asked for)."""
    writer = queue.driver.output_writer()
    if writer.pass_every_s is None:
        assert writer.behind() == []
        return
    out, err = tmp_path / "out", tmp_path / "err"
    out.write_bytes(b"abc")
    err.write_bytes(b"")
    writer.track(1, {"stdout": str(out), "stderr": str(err)})
    assert writer.behind() == [1]
    writer.forget(1)
    assert writer.behind() == []


def test_health_checks_name_the_database_and_its_folder(driver: Driver, queue: Queue) -> None:
    checks = {check.id: check for check in driver.health_checks()}
    assert {"spool_directory_writable", "disk_space", "schema_version"} <= set(checks)
    assert checks["schema_version"].status == "pass", checks["schema_version"]
    assert all(check.status in ("pass", "warn", "skip") for check in checks.values()), checks


def test_the_statements_that_differ(queue: Queue) -> None:
    """upsert inserts then updates; the slot hook runs inside a write
    transaction; the ledger reader sees a committed event at a position; the
    table list is the queue's; no legacy layout where the original never wrote."""

    def work(conn: object) -> None:
        backend = statements(conn)  # type: ignore[arg-type]
        backend.before_cap_count(conn, "default")  # type: ignore[arg-type]
        record_event(conn, None, EventKind.PAUSED, time.time(), detail={"queue": "x"})  # type: ignore[arg-type]
        backend.upsert(conn, workers, worker_row("w1"), "id")  # type: ignore[arg-type]
        backend.upsert(conn, workers, {**worker_row("w1"), "pid": 7}, "id")  # type: ignore[arg-type]

    queue.write(work)
    assert queue.read(lambda conn: conn.execute(select(workers.c.pid)).scalars().all()) == [7]

    def positions(conn: Connection) -> list[int]:
        backend = statements(conn)
        with backend.ledger_reader(conn) as reader:
            position = backend.event_position()
            return list(reader.execute(select(position).where(position.is_not(None))).scalars())

    assert queue.read(positions) == [1]
    tables = queue.read(lambda conn: statements(conn).table_names(conn))
    assert {"jobs", "attempts", "workers", "job_events", "alembic_version"} <= tables
    legacy = queue.read(lambda conn: statements(conn).legacy_version(conn, tables))
    assert legacy is None


def worker_row(worker_id: str) -> dict[str, object]:
    now = time.time()
    return {
        "id": worker_id,
        "hostname": "h",
        "pid": 1,
        "queue": "default",
        "state": "running",
        "started_at": now,
        "heartbeat_at": now,
    }


def test_writes_in_with_says_what_the_backend_runs(queue: Queue) -> None:
    """Where the driver says one statement may write inside a WITH (the
    one-statement claim relies on it), such a statement writes and returns
    its rows; where it says not, the backend refuses it and nothing is written."""
    written = (
        "WITH made AS (INSERT INTO lanes (queue, paused_at, paused_by) "
        "VALUES ('x', 1, 't') RETURNING queue) SELECT queue FROM made"
    )

    def attempt(conn: Connection) -> list[str]:
        return list(conn.exec_driver_sql(written).scalars())

    if queue.read(lambda conn: statements(conn).writes_in_with()):
        assert queue.write(attempt) == ["x"]
        assert queue.read(
            lambda conn: list(conn.exec_driver_sql("SELECT queue FROM lanes").scalars())
        ) == ["x"]
    else:
        with pytest.raises(Exception, match="syntax error"):
            queue.write(attempt)
        assert (
            queue.read(lambda conn: list(conn.exec_driver_sql("SELECT queue FROM lanes").scalars()))
            == []
        )
