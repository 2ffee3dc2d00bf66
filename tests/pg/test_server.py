"""The test PostgreSQL server (tests/pg_server.py, tests/pg_fixtures.py) does
what the PostgreSQL tests build on: it runs, listens on loopback only, checks
passwords, gives each test its own empty database, and supports LISTEN/NOTIFY
and terminating a session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.pg_server import ENV_URL, PgServer, libpq_url, reap_orphans, start_server

# The fixtures come from tests/pg_fixtures.py. Until tests/conftest.py registers it
# (pytest_plugins = ["tests.pg_fixtures"]) this module imports them itself; once it
# does, importing them here too would give this module its own session server.
if "tests.pg_fixtures" not in getattr(sys.modules.get("tests.conftest"), "pytest_plugins", ()):
    from tests.pg_fixtures import pg_databases, pg_server, pg_url

    _PG_FIXTURES = (pg_databases, pg_server, pg_url)


def _user_tables(url: str) -> list[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    return [row[0] for row in rows]


def test_the_server_runs(pg_server: PgServer) -> None:
    with pg_server.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_user").fetchone() == (pg_server.user,)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """A server this module starts itself, even when SPOOLCTL_TEST_PG_URL names
    one for the rest of the suite: these tests are about the harness's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ENV_URL, raising=False)
        server = start_server(tmp_path_factory.mktemp("own-pg"))
    assert server.owned
    yield server
    server.stop()


def test_the_server_listens_on_loopback_only(own_server: PgServer) -> None:
    pg_server = own_server
    assert pg_server.data_dir is not None
    with pg_server.connect() as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SELECT inet_server_addr()::text").fetchone() == ("127.0.0.1/32",)
        assert conn.execute("SHOW password_encryption").fetchone() == ("scram-sha-256",)
    postmaster = psutil.Process(int((pg_server.data_dir / "postmaster.pid").read_text().split()[0]))
    listening = [c.laddr for c in postmaster.net_connections("inet") if c.status == "LISTEN"]
    assert listening == [("127.0.0.1", pg_server.port)]
    assert pg_server.url("x") == (
        f"postgresql+psycopg://spoolctl:{pg_server.password}@127.0.0.1:{pg_server.port}/x"
    )


def test_the_server_does_not_run_as_root(own_server: PgServer) -> None:
    pg_server = own_server
    assert pg_server.data_dir is not None
    pid = int((pg_server.data_dir / "postmaster.pid").read_text().split()[0])
    assert os.stat(f"/proc/{pid}").st_uid != 0
    assert os.stat(f"/proc/{pid}").st_uid == os.stat(pg_server.data_dir).st_uid


def test_a_wrong_password_is_rejected(pg_server: PgServer) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host=pg_server.host,
            port=pg_server.port,
            user=pg_server.user,
            password=pg_server.password + "x",
            dbname="postgres",
            connect_timeout=10,
        )


def test_each_database_is_fresh_empty_and_its_own(
    pg_url: str, pg_databases: Callable[[], str]
) -> None:
    other = pg_databases()
    assert other != pg_url
    assert _user_tables(pg_url) == [] and _user_tables(other) == []
    with psycopg.connect(libpq_url(pg_url)) as conn:
        conn.execute("CREATE TABLE jobs (id int PRIMARY KEY)")
        conn.execute("INSERT INTO jobs VALUES (1)")
    assert _user_tables(pg_url) == ["public.jobs"]
    assert _user_tables(other) == []
    with (
        psycopg.connect(libpq_url(pg_url)) as one,
        psycopg.connect(libpq_url(other)) as two,
    ):
        names = {
            one.execute("SELECT current_database()").fetchone(),
            two.execute("SELECT current_database()").fetchone(),
        }
        assert len(names) == 2
        assert one.execute(
            "SELECT pg_encoding_to_char(encoding), datcollate FROM pg_database"
            " WHERE datname = current_database()"
        ).fetchone() == ("UTF8", "C")


def test_sqlalchemy_connects_with_the_url(pg_url: str) -> None:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_user")).scalar() == make_url(pg_url).username
    finally:
        engine.dispose()


def test_a_dropped_database_is_gone_even_with_open_sessions(pg_server: PgServer) -> None:
    name = "t_dropped_with_open_session"
    pg_server.drop_database(name)
    pg_server.create_database(name)
    held = pg_server.connect(name)
    try:
        pg_server.drop_database(name)  # WITH (FORCE) ends the held session
    finally:
        held.close()
    with pg_server.connect() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", [name]
        ).fetchone() == (0,)


def test_listen_notify_between_two_connections(pg_url: str) -> None:
    with (
        psycopg.connect(libpq_url(pg_url), autocommit=True) as listener,
        psycopg.connect(libpq_url(pg_url), autocommit=True) as notifier,
    ):
        listener.execute("LISTEN spool_jobs")
        notifier.execute("SELECT pg_notify('spool_jobs', 'job 7')")
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload, n.pid) for n in got] == [
            ("spool_jobs", "job 7", notifier.info.backend_pid)
        ]
        # nothing more arrives, and a notification in a rolled-back transaction never does
        with notifier.transaction(force_rollback=True):
            notifier.execute("NOTIFY spool_jobs, 'rolled back'")
        assert list(listener.notifies(timeout=0.2)) == []


def test_terminating_a_backend_breaks_its_connection(pg_url: str) -> None:
    with (
        psycopg.connect(libpq_url(pg_url), autocommit=True) as victim,
        psycopg.connect(libpq_url(pg_url), autocommit=True) as killer,
    ):
        pid = victim.info.backend_pid
        # pg_terminate_backend(pid, timeout ms) waits until the backend is gone
        assert killer.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone() == (True,)
        assert killer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone() == (0,)
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        assert victim.broken
        # the killer's own session is unharmed
        assert killer.execute("SELECT 1").fetchone() == (1,)


def test_the_fixtures_survive_a_test_that_terminates_their_session(
    pg_url: str, pg_databases: Callable[[], str]
) -> None:
    """A test may end sessions it does not own (pg_terminate_backend of every
    other backend): the fixtures' kept admin session reconnects."""
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as conn:
        terminated = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))"
            " FROM pg_stat_activity"
            " WHERE application_name = 'spoolctl-test-admin' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert terminated is not None and terminated[0] >= 1
    assert _user_tables(pg_databases()) == []


def test_stop_ends_the_server_and_removes_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    server = start_server(tmp_path)
    assert server.owned and server.root is not None and server.data_dir is not None
    postmaster = psutil.Process(int((server.data_dir / "postmaster.pid").read_text().split()[0]))
    server.stop()
    assert not server.root.exists()
    assert _gone(postmaster)


ORPHAN_SCRIPT = """
import pathlib, sys, time
from tests.pg_server import start_server
server = start_server(pathlib.Path(sys.argv[1]))
print(server.data_dir, flush=True)
time.sleep(600)
"""


@pytest.mark.subprocess
def test_a_server_whose_test_process_was_killed_is_stopped_by_the_next_start(
    tmp_path: Path,
) -> None:
    """A test process killed outright (SIGKILL, a CI timeout) cannot stop its
    server: the next start_server stops it and removes its folder."""
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT, str(tmp_path)],
        cwd=repo,
        env={k: v for k, v in os.environ.items() if k != ENV_URL},  # its own server
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        data_dir = Path(child.stdout.readline().strip())
        postmaster = psutil.Process(int((data_dir / "postmaster.pid").read_text().split()[0]))
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    assert postmaster.is_running() and data_dir.exists()  # orphaned, still running
    reap_orphans()
    assert not data_dir.parent.exists()
    assert _gone(postmaster)


def _gone(proc: psutil.Process) -> bool:
    """proc has exited (a zombie not yet reaped by its new parent counts)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
