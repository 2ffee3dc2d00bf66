"""A primary with a streaming standby (docs/postgresql.md, "A standby and
failover"): servers of this module's own, from the binaries the tests
install (devtools/pg_server.py's start_replica: pg_basebackup -R, loopback
replication, synchronous commit), never the session's shared server.

- On a standby, and on a database set read-only, every write answers
  DB_UNUSABLE with reason read_only (no traceback, no INTERNAL), doctor's
  `database_writable` check fails, and the reading verbs read.
- A worker whose server stops taking writes waits, as for an outage, and
  goes on when it takes them again.
- A primary crashed under a running fleet and its standby promoted: every
  job whose `add` was acknowledged is run on the new primary, no two runs of
  one job overlap, and the workers (one URL naming both servers,
  target_session_attrs=read-write) carry on; an `add` while only the
  standby answers is refused, never acknowledged.

Nothing is timed: every wait is a deadline-poll on what the servers, the
jobs' own log or the workers' terminal say."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    STARTED_WORKERS,
    Result,
    add,
    child_env,
    cli,
    cli_json,
    job,
    rows,
    start_worker,
    stop_started_workers,
    wait_for,
)
from tests.pg_server import FAST, PgServer, start_private_server, start_replica

pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(300)]

WAITING = b"waiting for the database server"
CONNECTED = b"connected to the database server"
JOB = """\
import fcntl, os, sys, time
tag, log, locks = sys.argv[1:4]
lock = os.open(os.path.join(locks, tag), os.O_CREAT | os.O_RDWR, 0o600)
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    note = "ran"
except BlockingIOError:
    note = "overlap"
with open(log, "a") as out:
    out.write(f"{note} {tag}\\n")
time.sleep(0.2)
"""
"""A job that notes each run in a log, and notes `overlap` instead when
another run of it holds its lock (a run holds it until its process ends)."""


@dataclass
class Pair:
    primary: PgServer
    standby: PgServer

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            server.stop()


def start_pair(base: Path) -> Pair:
    primary = start_private_server(base, FAST)
    try:
        return Pair(primary, start_replica(primary, base))
    except BaseException:
        primary.stop()
        raise


def several_hosts(pair: Pair, database: str) -> str:
    """One URL naming both servers, that connects to whichever takes writes."""
    server = pair.primary
    hosts = f"{server.host}:{pair.primary.port},{server.host}:{pair.standby.port}"
    return (
        f"postgresql://{server.user}:{server.password}@{hosts}/{database}"
        "?target_session_attrs=read-write"
    )


def read_only(result: Result, password: str) -> dict[str, Any]:
    """The error of a write refused because the server takes no writes."""
    assert password not in result.stdout + result.stderr
    (error,) = result.envelope["errors"]
    assert (result.exit_code, error["code"]) == (3, "DB_UNUSABLE"), error
    assert error["detail"]["reason"] == "read_only" and "takes no writes" in error["message"]
    assert "target_session_attrs=read-write" in error["remediation"], error
    return dict(error)


def writable_check(doctor: Result) -> dict[str, Any]:
    assert doctor.exit_code == 3 and doctor.data["ready"] is False, doctor.stdout
    found = {c["id"]: c for c in doctor.data["checks"]}
    assert found["database_connect"]["status"] == "pass"
    check = found["database_writable"]
    assert check["status"] == "fail" and check["message"].startswith("DB_UNUSABLE"), check
    return dict(check)


def server_log(server: PgServer) -> str:
    assert server.root is not None
    return (server.root / "server.log").read_text(errors="replace")


def spool(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"SPOOLCTL_SPOOL_DIR": str(tmp_path / "spool"), **more}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """A primary and its synchronous standby, left running for the module."""
    started = start_pair(tmp_path_factory.mktemp("replica-pg"))
    yield started
    started.stop()


@pytest.fixture(autouse=True)
def _no_worker_left() -> Iterator[None]:
    yield
    stop_started_workers()


# -- a standby, a read-only database ------------------------------------------------------


def test_on_a_standby_writes_are_refused_as_read_only_and_reads_work(
    pair: Pair, tmp_path: Path
) -> None:
    name = "on_standby"
    primary_url = pair.primary.create_database(name)
    job_id = add(primary_url, "echo", "kept")
    standby_url = pair.standby.url(name)
    env = spool(tmp_path)

    def replayed() -> bool:
        return cli_json("show", str(job_id), db=standby_url, env=env).exit_code == 0

    wait_for(replayed, timeout=60, what="the standby to replay the job")
    for verb in (["status"], ["list"], ["show", str(job_id)], ["events"], ["workers"]):
        shown = cli_json(*verb, db=standby_url, env=env)
        assert shown.exit_code == 0, (verb, shown.stdout, shown.stderr)
    assert cli_json("list", db=standby_url, env=env).data["count"] == 1

    password = pair.primary.password
    read_only(cli_json("add", "--", "true", db=standby_url, env=env), password)
    read_only(cli_json("cancel", str(job_id), db=standby_url, env=env), password)
    text = cli("add", "--", "true", db=standby_url, env=env)
    assert text.exit_code == 3 and "DB_UNUSABLE" in text.stderr and "Traceback" not in text.stderr
    check = writable_check(cli_json("doctor", db=standby_url, env=env))
    assert "hot standby" in check["message"] and "target_session_attrs" in check["remediation"]
    assert [tuple(r) for r in rows(primary_url, "SELECT id, state FROM jobs")] == [
        (job_id, "queued")
    ], "nothing was written"


def test_a_read_only_database_refuses_writes_and_a_running_worker_waits_it_out(
    pair: Pair, tmp_path: Path
) -> None:
    """default_transaction_read_only set on the database under a running
    worker (its sessions cut, as a failover would): `add` and doctor refuse,
    the worker waits instead of exiting, and it records the job's end once
    the database takes writes again."""
    name = "read_only"
    url = pair.primary.create_database(name)
    gate = tmp_path / "gate"
    job_id = add(url, "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    worker = start_worker(
        url, "--poll-interval", "0.2", env=spool(tmp_path), log=tmp_path / "worker.log"
    )

    def started() -> bool:
        return bool(rows(url, "SELECT 1 FROM attempts WHERE job_pid IS NOT NULL"))

    wait_for(started, timeout=60, what="the job to start")
    seen = len(server_log(pair.primary))
    with pair.primary.connect(autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
    gate.touch()  # the job ends: its outcome is a write the database refuses

    def refused_a_write() -> bool:
        return "in a read-only transaction" in server_log(pair.primary)[seen:]

    wait_for(refused_a_write, timeout=60, what="the worker to meet the read-only database")
    env = spool(tmp_path)
    read_only(cli_json("add", "--", "true", db=url, env=env), pair.primary.password)
    check = writable_check(cli_json("doctor", db=url, env=env))
    assert "default_transaction_read_only" in check["message"]
    assert worker.poll() is None, "the worker waits instead of exiting"

    with pair.primary.connect(autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")
    wait_for(lambda: job(url, job_id)["state"] == "done", timeout=60, what="the end recorded")
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    assert "Traceback" not in (tmp_path / "worker.log").read_text()


# -- failover ---------------------------------------------------------------------------


class Terminal:
    """A pseudo-terminal for a worker's stderr (where it says that it waits);
    a thread collects what is written."""

    def __init__(self) -> None:
        self.leader, self.follower = pty.openpty()
        self.seen = b""
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        while True:
            try:
                chunk = os.read(self.leader, 4096)
            except OSError:  # EIO: every process holding the other end is gone
                return
            if not chunk:
                return
            self.seen += chunk

    def close(self) -> None:
        os.close(self.follower)
        self._reader.join(timeout=10)
        os.close(self.leader)


def test_a_failover_keeps_every_acknowledged_job_and_the_fleet_carries_on(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    failover = start_pair(tmp_path_factory.mktemp("failover-pg"))
    terminal = Terminal()
    try:
        run_through_a_failover(failover, tmp_path, terminal)
    finally:
        stop_started_workers()
        terminal.close()
        failover.stop()


def run_through_a_failover(pair: Pair, tmp_path: Path, terminal: Terminal) -> None:
    name = "failover"
    pair.primary.create_database(name)
    url = several_hosts(pair, name)
    log, locks = tmp_path / "ran.log", tmp_path / "locks"
    locks.mkdir()
    log.touch()
    env = spool(tmp_path, SPOOLCTL_HANG_THRESHOLD="10")
    acknowledged: dict[str, int] = {}

    def submit(tag: str) -> Result:
        argv = [sys.executable, "-c", JOB, tag, str(log), str(locks)]
        result = cli_json("add", "--", *argv, db=url, env=env)
        if result.exit_code == 0:
            acknowledged[tag] = result.data["job_id"]
        return result

    for n in range(4):
        assert submit(f"before-{n}").exit_code == 0
    options = ("--concurrency", "2", "--poll-interval", "0.2")
    workers = [
        start_worker(
            url, "--worker-id", worker_id, *options, env=env, log=tmp_path / f"{worker_id}.log"
        )
        for worker_id in ("w0", "w1")
    ]
    wait_for(lambda: "ran before-" in log.read_text(), timeout=60, what="the fleet to run a job")
    for n in range(4, 6):
        assert submit(f"before-{n}").exit_code == 0

    pair.primary.crash()
    refused = read_only(submit("while-only-the-standby-answers"), pair.primary.password)
    assert "session is read-only" in refused["detail"]["database_error"]
    assert "while-only-the-standby-answers" not in acknowledged
    late = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spoolctl",
            "work",
            "--db",
            url,
            "--json",
            "--worker-id",
            "late",
            "--poll-interval",
            "0.2",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal.follower,
        env=child_env(env),
    )
    STARTED_WORKERS.append(late)
    wait_for(
        lambda: WAITING in terminal.seen and b"takes no writes" in terminal.seen,
        timeout=60,
        what="a worker started now to wait for a server that takes writes",
    )

    pair.standby.promote()
    promoted = pair.standby.url(name)
    (promoted_at,) = rows(promoted, "SELECT extract(epoch FROM clock_timestamp())")[0]
    for n in range(4):
        assert submit(f"after-{n}").exit_code == 0

    def settled() -> bool:
        found = rows(promoted, "SELECT id, state FROM jobs")
        states = {job_id: state for job_id, state in found}
        return all(states.get(i) in ("done", "dead") for i in acknowledged.values())

    wait_for(settled, timeout=120, what="every acknowledged job to end on the new primary")
    wait_for(lambda: CONNECTED in terminal.seen, timeout=60, what="the late worker to connect")

    def beating(worker_id: str) -> bool:
        found = rows(promoted, "SELECT heartbeat_at FROM workers WHERE id = ?", (worker_id,))
        return bool(found) and float(found[0][0]) > float(promoted_at)

    for worker_id in ("w0", "w1", "late"):
        wait_for(lambda w=worker_id: beating(w), timeout=60, what=f"{worker_id} to carry on")
    runs = log.read_text().split()
    assert "overlap" not in runs, log.read_text()
    states = dict(rows(promoted, "SELECT id, state FROM jobs"))
    for tag, job_id in acknowledged.items():
        assert states[job_id] == "dead" or f"ran {tag}" in log.read_text(), tag
    for worker in [*workers, late]:
        assert worker.poll() is None, "no worker exited"
        worker.send_signal(signal.SIGTERM)
    for worker in [*workers, late]:
        assert worker.wait(timeout=60) == 0
