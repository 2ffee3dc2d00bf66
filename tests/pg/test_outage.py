"""Workers and followers ride out a PostgreSQL outage: a server of this
module's own is shut down and started again (pg_ctl, same port, same data)
under a worker that starts or runs, under `events --follow --json` and under
`output --follow --json`. The session's shared server is never touched.

A test knows that a process is waiting because its stderr is a terminal
(a pseudo-terminal), where spoolctl says so once per change: "waiting for
the database server", then "connected to the database server". Nothing is
timed; every wait is a deadline-poll.

The waiting policy itself (backoff, bounds, signals) is tested without a
server at the top, with a fake clock."""

from __future__ import annotations

import json
import os
import pty
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.schemas import DATA_SCHEMAS
from spoolctl.config import Timing
from spoolctl.db.backends.sqlite import SqliteDriver
from spoolctl.db.outage import ONE_SHOT_WAIT_S, Reconnecting, retry_delay_s
from spoolctl.db.queue import Queue
from spoolctl.errors import StorageFault, Unreachable
from spoolctl.runner.wakeup import Signals, StopRequested, counting_signals
from spoolctl.worker import Worker, WorkerOptions
from tests.helpers import (
    STARTED_WORKERS,
    add,
    attempts_of,
    child_env,
    cli,
    cli_json,
    job,
    rows,
    stop_started_workers,
    wait_for,
)
from tests.pg_server import ENV_URL, PgServer, start_server
from tests.schema_check import errors as schema_errors

pytestmark = [pytest.mark.timeout(120), pytest.mark.subprocess]

WAITING = b"waiting for the database server"
CONNECTED = b"connected to the database server"


# -- the policy, without a server ----------------------------------------------------


def test_the_wait_between_tries_doubles_from_half_a_second_to_ten() -> None:
    assert [retry_delay_s(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert retry_delay_s(10_000) == 10.0


class FakeTime:
    """A clock that a sleep moves forward."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def down(message: str = "the server did not answer") -> Any:
    def fail() -> None:
        raise Unreachable(message)

    return fail


def test_a_bounded_wait_gives_up_with_the_last_error() -> None:
    time = FakeTime()
    heard: list[tuple[int, bool]] = []
    server = Reconnecting(
        Signals(),
        lambda o: heard.append((o.failures, o.ended is not None)),
        clock=lambda: time.now,
        sleep=time.sleep,
    )
    with pytest.raises(Unreachable, match="did not answer"):
        server.call(down(), patience_s=ONE_SHOT_WAIT_S)
    assert time.now - 100.0 == pytest.approx(ONE_SHOT_WAIT_S)
    assert time.sleeps[:5] == [0.5, 1.0, 2.0, 4.0, 8.0] and max(time.sleeps) == 10.0
    assert heard == [(1, False)], "one word when the wait began, none per try"


def test_a_listener_hears_once_when_the_wait_begins_and_once_when_it_ends() -> None:
    time = FakeTime()
    heard: list[tuple[int, bool]] = []
    server = Reconnecting(
        Signals(),
        lambda o: heard.append((o.failures, o.ended is not None)),
        clock=lambda: time.now,
        sleep=time.sleep,
    )
    assert server.call(lambda: "first") == "first" and heard == []
    tries = iter([down(), down(), lambda: "rows"])
    assert server.call(lambda: next(tries)()) == "rows"
    assert heard == [(1, False), (2, True)]
    assert server.outages == 1 and server.outage is None
    assert server.last is not None and server.last.waited_s(0) == pytest.approx(1.5)


def test_only_an_unreachable_server_is_waited_for() -> None:
    def refused() -> None:
        raise StorageFault("password authentication failed", reason="login_refused")

    time = FakeTime()
    server = Reconnecting(Signals(), clock=lambda: time.now, sleep=time.sleep)
    with pytest.raises(StorageFault):
        server.call(refused)
    assert time.sleeps == [] and server.outage is None


def test_a_stop_signal_ends_an_unbounded_wait() -> None:
    signals = Signals()
    time = FakeTime()

    def sleep(seconds: float) -> None:
        time.sleep(seconds)
        if len(time.sleeps) == 3:
            signals.count += 1  # as the handler does

    server = Reconnecting(signals, clock=lambda: time.now, sleep=sleep)
    with pytest.raises(StopRequested):
        server.call(down())
    assert len(time.sleeps) == 3


def test_a_one_shot_worker_gives_up_after_its_bound_and_a_signal_ends_a_looping_ones_wait(
    tmp_path: Path,
) -> None:
    """The worker's own start (in this process, the server stood in for by a
    `prepare` that finds it unreachable): --once and --drain give up after
    their bound; a worker in loop mode waits until a stop signal."""
    unused = SqliteDriver(tmp_path / "unused.db")
    queue = Queue(unused, unused.engine(write=True, expected_revision=None))
    tries: list[int] = []

    def unreachable() -> None:
        tries.append(1)
        raise Unreachable("the PostgreSQL server did not answer")

    once = WorkerOptions(mode="once", server_wait_s=0.6)
    worker = Worker(queue, once, Timing.from_env(), prepare=unreachable)
    with pytest.raises(Unreachable):
        worker.run()
    assert len(tries) >= 2, "it tried again before giving up"
    assert not (tmp_path / "unused.db").exists(), "nothing was registered"

    def stopped_on_the_third_try() -> None:
        tries.append(1)
        if len(tries) == 3:  # a try during the outage: the signal cuts it short
            os.kill(os.getpid(), signal.SIGTERM)
        raise Unreachable("the PostgreSQL server did not answer")

    tries.clear()
    looping = Worker(queue, WorkerOptions(), Timing.from_env(), prepare=stopped_on_the_third_try)
    report = looping.run()
    assert report.stopped_by_signal and report.claimed == 0 and len(tries) == 3
    assert not (tmp_path / "unused.db").exists()


def test_a_signal_cuts_short_an_interruptible_call_only() -> None:
    with counting_signals() as signals:
        with pytest.raises(StopRequested), signals.interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            wait_for(lambda: False, timeout=10, what="the signal to interrupt")
        os.kill(os.getpid(), signal.SIGINT)  # outside: only counted
        assert signals.count == 2
        with pytest.raises(StopRequested), signals.interruptible():
            pass  # a signal that already came raises on entry


# -- a server of our own that we can stop ----------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """Started here even when SPOOLCTL_TEST_PG_URL names a server: only a
    server of our own may be shut down."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ENV_URL, raising=False)
        started = start_server(tmp_path_factory.mktemp("outage-pg"))
    assert started.owned
    yield started
    started.stop()


@pytest.fixture
def url(server: PgServer) -> Iterator[str]:
    """A fresh database on the module's server, which is up when the test
    starts (a failed test may have left it down)."""
    if not server.running:
        server.start_again()
    name = f"t_outage_{secrets.token_hex(4)}"
    yield server.create_database(name)
    stop_started_workers()
    if not server.running:
        server.start_again()
    server.drop_database(name)


class Terminal:
    """A pseudo-terminal for a child's stderr; a thread collects what it draws."""

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

    def wait_for(self, text: bytes, timeout: float = 60) -> None:
        wait_for(lambda: text in self.seen, timeout=timeout, what=f"{text!r} on the terminal")

    def close(self) -> None:
        os.close(self.follower)
        self._reader.join(timeout=10)
        os.close(self.leader)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    opened = Terminal()
    yield opened
    stop_started_workers()
    opened.close()


def spawn(
    args: list[str], out: Path, terminal: Terminal, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`spoolctl ARGS` with stdout to a file and stderr to the terminal."""
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spoolctl", *args],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=terminal.follower,
            env=child_env(env),
            text=True,
        )
    STARTED_WORKERS.append(proc)  # killed after the test whatever happens
    return proc


def frames(out: Path) -> list[dict[str, Any]]:
    """The complete NDJSON lines written so far."""
    text = out.read_text()
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def spool(tmp_path: Path) -> dict[str, str]:
    return {"SPOOLCTL_SPOOL_DIR": str(tmp_path / "spool")}


def worker_args(url: str, worker_id: str, *more: str) -> list[str]:
    args = ["work", "--db", url, "--json", "--worker-id", worker_id, "--poll-interval", "0.2"]
    return [*args, *more]


# -- workers -------------------------------------------------------------------------


def test_a_worker_started_while_the_server_is_down_waits_and_then_runs_the_queue(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    job_id = add(url, "echo", "ran")
    server.shut_down()
    worker = spawn(worker_args(url, "w-late"), tmp_path / "worker.out", terminal, spool(tmp_path))
    terminal.wait_for(WAITING)
    assert worker.poll() is None, "it waits instead of exiting 4"
    server.start_again()
    wait_for(lambda: job(url, job_id)["state"] == "done", timeout=60, what="the job to run")
    terminal.wait_for(CONNECTED)

    listed = cli_json("workers", db=url).data
    assert schema_errors(listed, DATA_SCHEMAS["workers"]) == []
    row = next(w for w in listed["workers"] if w["id"] == "w-late")
    waited = row["waited_for_server"]
    assert waited["failed_tries"] >= 1 and waited["waited_s"] > 0
    assert "did not answer" in waited["error"] and server.password not in waited["error"]
    assert "worker w-late waited" in cli("workers", db=url).stdout
    lane_events = rows(url, "SELECT event, worker_id FROM job_events WHERE job_id IS NULL")
    assert [tuple(e) for e in lane_events] == [("waited_for_server", "w-late")]

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    said = terminal.seen
    assert said.count(WAITING) == 1 and said.count(CONNECTED) == 1, said
    assert server.password.encode() not in said


def test_a_stop_signal_ends_the_wait_with_exit_0_and_registers_nothing(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    job_id = add(url, "true")
    server.shut_down()
    out = tmp_path / "worker.out"
    worker = spawn(worker_args(url, "w-stopped"), out, terminal, spool(tmp_path))
    terminal.wait_for(WAITING)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    report = json.loads(out.read_text())["data"]
    assert report["executed"] == 0 and report["stopped_by_signal"] is True
    server.start_again()
    assert rows(url, "SELECT id FROM workers") == []
    assert job(url, job_id)["state"] == "queued"


def test_work_once_waits_for_the_server_then_runs_one_job(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    job_id = add(url, "echo", "once")
    server.shut_down()
    out = tmp_path / "once.out"
    worker = spawn(worker_args(url, "w-once", "--once"), out, terminal, spool(tmp_path))
    terminal.wait_for(WAITING)
    server.start_again()
    assert worker.wait(timeout=60) == 0
    report = json.loads(out.read_text())["data"]
    assert (report["claimed"], report["job_id"], report["job_state"]) == (True, job_id, "done")


@pytest.mark.parametrize("wrong", ["password", "database"])
def test_a_refused_login_or_a_missing_database_is_not_waited_for(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path, wrong: str
) -> None:
    bad = (
        url.replace(f":{server.password}@", f":{server.password}x@")
        if wrong == "password"
        else url.rsplit("/", 1)[0] + "/no_such_database"
    )
    out = tmp_path / "worker.out"
    worker = spawn(worker_args(bad, "w-refused"), out, terminal, spool(tmp_path))
    assert worker.wait(timeout=60) == 3
    error = json.loads(out.read_text())["errors"][0]
    reason = "login_refused" if wrong == "password" else "no_such_database"
    assert (error["code"], error["detail"]["reason"]) == ("DB_UNUSABLE", reason)
    assert WAITING not in terminal.seen


def test_a_running_worker_rides_out_a_restart_with_its_job_running(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = f"echo before; while [ ! -e {gate} ]; do sleep 0.05; done; echo after"
    job_id = add(url, "sh", "-c", script)
    worker = spawn(worker_args(url, "w-steady"), tmp_path / "worker.out", terminal, spool(tmp_path))

    def started() -> bool:
        return any(a["job_pid"] is not None for a in attempts_of(url, job_id))

    wait_for(started, timeout=30, what="the job to start")
    server.shut_down()
    server.start_again()
    gate.touch()
    wait_for(lambda: job(url, job_id)["state"] == "done", timeout=60, what="the job recorded")
    assert [a["state"] for a in attempts_of(url, job_id)] == ["succeeded"]
    assert cli("output", str(job_id), "--raw", db=url).stdout == "before\nafter\n"
    after = add(url, "true")
    wait_for(lambda: job(url, after)["state"] == "done", timeout=60, what="a job added after")
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


# -- followers -----------------------------------------------------------------------


def follow_events(url: str, out: Path, terminal: Terminal, *more: str) -> subprocess.Popen[str]:
    args = ["events", "--db", url, "--follow", "--json", "--idle-timeout", "120", *more]
    return spawn(args, out, terminal)


def event_ids(found: list[dict[str, Any]]) -> list[int]:
    return [f["id"] for f in found if "id" in f]


def test_events_follow_started_while_the_server_is_down_starts_at_the_end_once_it_is_up(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    add(url, "true")
    add(url, "true")
    server.shut_down()
    out = tmp_path / "events.out"
    follower = follow_events(url, out, terminal)
    terminal.wait_for(WAITING)
    server.start_again()
    terminal.wait_for(CONNECTED)  # it has read where the ledger ends
    add(url, "true")
    wait_for(lambda: event_ids(frames(out)) == [3], what="the new event only")
    follower.send_signal(signal.SIGTERM)
    assert follower.wait(timeout=30) == 0
    assert frames(out)[-1] == {"control": {"type": "end", "reason": "interrupted", "cursor": 3}}


def test_events_follow_reconnects_after_a_restart_and_resumes_from_its_cursor(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    add(url, "true")
    add(url, "true")
    out = tmp_path / "events.out"
    follower = follow_events(url, out, terminal, "--since-id", "0")
    wait_for(lambda: event_ids(frames(out)) == [1, 2], what="the ledger replayed")
    server.shut_down()
    terminal.wait_for(WAITING)
    server.start_again()
    terminal.wait_for(CONNECTED)
    add(url, "true")
    wait_for(lambda: event_ids(frames(out)) == [1, 2, 3], what="the event added after")
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=30) == 0
    assert event_ids(frames(out)) == [1, 2, 3], "nothing skipped, nothing twice"
    assert frames(out)[-1]["control"] == {"type": "end", "reason": "interrupted", "cursor": 3}


def test_output_follow_reconnects_after_a_restart_and_goes_on_from_its_offset(
    server: PgServer, url: str, terminal: Terminal, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second"
    job_id = add(url, "sh", "-c", script)
    worker_terminal = Terminal()
    try:
        spawn(worker_args(url, "w-out"), tmp_path / "worker.out", worker_terminal, spool(tmp_path))
        out = tmp_path / "output.out"
        # the follower judges the owner silent after the reap threshold: after
        # an outage it counts from the moment it got through again
        patient = {"SPOOLCTL_TEST_REAP_THRESHOLD": "30"}
        args = ["output", str(job_id), "--db", url, "--follow", "--json", "--idle-timeout", "120"]
        follower = spawn(args, out, terminal, patient)
        wait_for(
            lambda: frames(out)[:1] == [{"stream": "stdout", "offset": 0, "text": "first\n"}],
            what="the first line",
        )
        server.shut_down()
        terminal.wait_for(WAITING)
        server.start_again()
        gate.touch()
        assert follower.wait(timeout=60) == 0
    finally:
        stop_started_workers()
        worker_terminal.close()
    assert frames(out) == [
        {"stream": "stdout", "offset": 0, "text": "first\n"},
        {"stream": "stdout", "offset": 6, "text": "second\n"},
        {"control": {"type": "end", "reason": "attempt_ended", "attempt_state": "succeeded"}},
    ]
    assert terminal.seen.count(CONNECTED) == 1
