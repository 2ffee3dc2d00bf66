"""A PostgreSQL queue worked by a fleet of workers posing as different machines
(SPOOLCTL_TEST_HOSTNAME, SPOOLCTL_TEST_BOOT_ID), with real SIGKILL, SIGSTOP,
connections cut by the server (`pg_terminate_backend`) and by a TCP proxy.

Every job proves "never two copies at once" itself, as in tests/process/test_chaos.py:
while it runs it holds an exclusive non-blocking `flock` on its own lock file
(inherited by its whole process group), and a copy that cannot take it writes
a line to `violations`. Each job also logs its start and end, stamped with the
machine's uptime (one monotonic clock shared by every process here).

Workers posing as other machines still share this machine's processes, so a
reaper's scan for an attempt's token finds (and kills) another "machine's"
orphans. A second variant runs each worker in its own PID namespace with its
own /proc (`unshare --pid --mount-proc`): there, as on real machines, nothing
of one worker's jobs is visible to another.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg.rows import dict_row

from spoolctl.cli.database import open_write
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests.helpers import NS_INIT, STARTED_WORKERS, UNSHARE, child_env, needs_namespaces, wait_for
from tests.pg_server import libpq_url

pytestmark = [pytest.mark.timeout(90), pytest.mark.subprocess]

HEARTBEAT_S = "0.5"
REAP_S = "1.5"
HANG_S = 4.0
"""The lease: a worker fences itself after HANG_S / 2 without a heartbeat;
others requeue the jobs of a worker on another machine after HANG_S."""

JOB = r"""
lock="$1/$SPOOLCTL_JOB_ID.lock"; log="$1/$SPOOLCTL_JOB_ID.log"
exec 9>>"$lock"
flock -n 9 || echo "$SPOOLCTL_JOB_ID $SPOOLCTL_ATTEMPT $SPOOLCTL_WORKER_ID" >> "$1/violations"
read up _ < /proc/uptime
echo "start $SPOOLCTL_ATTEMPT $SPOOLCTL_WORKER_ID $up" >> "$log"
sleep "$2"
read up _ < /proc/uptime
echo "end $SPOOLCTL_ATTEMPT $SPOOLCTL_WORKER_ID $up" >> "$log"
"""

SPOOLCTL = (sys.executable, "-m", "spoolctl")


# -- the database, read from outside --------------------------------------------


def sql(url: str, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Run one statement on a connection of its own (never named `spoolctl`)."""
    with psycopg.connect(
        libpq_url(url), autocommit=True, application_name="pytest", row_factory=dict_row
    ) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def server_epoch(url: str) -> float:
    return float(sql(url, "SELECT extract(epoch FROM clock_timestamp()) AS t")[0]["t"])


def terminate_workers_connections(url: str) -> int:
    """pg_terminate_backend every connection of spoolctl workers on this database."""
    found = sql(
        url,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM pg_stat_activity"
        " WHERE application_name IN ('spoolctl', 'spoolctl-listen')"
        " AND datname = current_database() AND pid <> pg_backend_pid()",
    )
    return int(found[0]["n"])


def submit_jobs(url: str, specs: list[JobSpec]) -> list[int]:
    queue = open_write(url)
    try:
        now = queue.now()
        return queue.write(lambda conn: [submit(conn, s, now).job_id for s in specs])
    finally:
        queue.engine.dispose()


def job_spec(runs: Path, sleep_s: float, **options: Any) -> JobSpec:
    argv = ["sh", "-c", JOB, "job", str(runs), str(sleep_s)]
    return JobSpec(argv=argv, timeout_seconds=120, **options)


def describe(url: str) -> str:
    """The jobs, their attempts and the workers, for a failure message."""
    jobs = sql(
        url, "SELECT id, state, locked_by, heartbeat_at FROM jobs WHERE state <> 'done' ORDER BY id"
    )
    tries = sql(
        url,
        "SELECT job_id, attempt_no, worker_id, state, job_pid FROM attempts"
        " WHERE state NOT IN ('succeeded', 'abandoned')",
    )
    crew = sql(url, "SELECT id, state, heartbeat_at FROM workers")
    locks = sql(
        url,
        "SELECT a.client_port, a.state, l.locktype, l.objid, l.granted FROM pg_locks l"
        " JOIN pg_stat_activity a USING (pid) WHERE a.datname = current_database()"
        " AND (l.locktype = 'advisory' OR NOT l.granted)",
    )
    now = server_epoch(url)
    return f"at {now:.1f}: jobs {jobs}; attempts {tries}; workers {crew}; locks {locks}"


def until(url: str, condition: Any, timeout: float, what: str) -> None:
    """wait_for, failing with the state of the queue."""
    try:
        wait_for(condition, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(url)}") from None


def until_all_done(url: str, runs: Path, count: int, timeout: float) -> None:
    """Wait for `count` jobs to be done; stop early once two copies overlapped."""

    def settled() -> bool:
        return (runs / "violations").exists() or states(url) == {"done": count}

    until(url, settled, timeout=timeout, what=f"all {count} jobs done")
    assert_no_overlap(runs)


def assert_no_overlap(runs: Path) -> None:
    violations = runs / "violations"
    assert not violations.exists(), "two copies ran at once: " + violations.read_text()


def states(url: str) -> Counter[str]:
    return Counter(r["state"] for r in sql(url, "SELECT state FROM jobs"))


def running_of(url: str, worker_id: str) -> list[dict[str, Any]]:
    """Running jobs of a worker whose process has started (pid recorded)."""
    return sql(
        url,
        "SELECT j.id, a.job_pid FROM jobs j JOIN attempts a ON a.job_id = j.id"
        " AND a.state = 'running' WHERE j.state = 'running' AND j.locked_by = %s"
        " AND a.job_pid IS NOT NULL",
        (worker_id,),
    )


# -- machines ---------------------------------------------------------------------


def machine_env(name: str, root: Path, **extra: str) -> dict[str, str]:
    """Environment of a worker posing as machine `name`."""
    return {
        "SPOOLCTL_TEST_HOSTNAME": f"host-{name}",
        "SPOOLCTL_TEST_BOOT_ID": f"boot-{name}",
        "SPOOLCTL_SPOOL_DIR": str(root / f"spool-{name}"),
        "SPOOLCTL_TEST_HEARTBEAT_INTERVAL": HEARTBEAT_S,
        "SPOOLCTL_TEST_REAP_THRESHOLD": REAP_S,
        "SPOOLCTL_HANG_THRESHOLD": str(HANG_S),
        **extra,
    }


@dataclass
class Member:
    """One worker (optionally alone in its PID namespace, with its own /proc)."""

    name: str
    worker_id: str
    popen: subprocess.Popen[str]
    log: Path
    init_file: Path | None = None

    @property
    def isolated(self) -> bool:
        return self.init_file is not None

    @property
    def pid(self) -> int:
        """The worker's pid as seen from here."""
        if not self.isolated:
            return self.popen.pid
        return int(wait_for(self._worker_in_namespace, timeout=20, what=f"{self.name}'s pid"))

    def _worker_in_namespace(self) -> int | None:
        try:
            kids = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        for kid in kids:
            try:
                if "spoolctl" in kid.cmdline() and kid.name() != "sh":
                    return kid.pid
            except psutil.Error:
                continue
        return None

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def exit_code(self, timeout: float = 30) -> int:
        if not self.isolated:
            return self.popen.wait(timeout=timeout)
        assert self.init_file is not None
        rc = Path(f"{self.init_file}.rc")
        wait_for(rc.exists, timeout=timeout, what=f"{self.name} to exit")
        wait_for(lambda: rc.read_text().strip(), timeout=5, what="its exit code")
        return int(rc.read_text())

    def output(self) -> str:
        path = self.log if not self.isolated else Path(f"{self.init_file}.log")
        return path.read_text() if path.exists() else ""

    def destroy(self) -> None:
        """Kill the worker (and, isolated, its whole namespace with its jobs)."""
        if self.isolated and self.popen.poll() is None:
            with contextlib.suppress(psutil.Error):
                for init in psutil.Process(self.popen.pid).children():  # PID 1 in there
                    init.kill()
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


@dataclass
class PgFleet:
    url: str
    root: Path
    members: list[Member] = field(default_factory=list)

    def start(
        self,
        name: str,
        *args: str,
        isolated: bool = False,
        url: str | None = None,
        launcher: tuple[str, ...] = SPOOLCTL,
        **env: str,
    ) -> Member:
        """A `spoolctl work` process posing as machine `name` (worker id
        w-<name>); `launcher` is the command that runs spoolctl."""
        worker_id = f"w-{name}"
        log = self.root / f"worker-{name}.log"
        command = [*launcher, "work", "--db", url or self.url, "--json"]
        command += ["--worker-id", worker_id, "--poll-interval", "0.2", *args]
        init_file = None
        if isolated:
            init_file = self.root / f"ns-{name}"
            command = [*UNSHARE, "sh", "-c", NS_INIT, str(init_file), *command]
        with open(log, "w") as out:
            popen = subprocess.Popen(
                command,
                env=child_env(machine_env(name, self.root, **env)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=isolated,
            )
        STARTED_WORKERS.append(popen)
        member = Member(name, worker_id, popen, log, init_file)
        self.members.append(member)
        return member

    def in_loop(self, member: Member) -> bool:
        found = sql(
            self.url,
            "SELECT started_at, heartbeat_at FROM workers WHERE id = %s",
            (member.worker_id,),
        )
        return bool(found) and found[0]["heartbeat_at"] > found[0]["started_at"]

    def stop(self, member: Member) -> int:
        """SIGTERM once the worker is in its loop; its exit code."""
        wait_for(lambda: self.in_loop(member), timeout=30, what=f"{member.name} in its loop")
        member.signal(signal.SIGTERM)
        return member.exit_code()

    def cleanup(self) -> None:
        for member in self.members:
            member.destroy()


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[PgFleet]:
    crew = PgFleet(pg_url, tmp_path)
    yield crew
    crew.cleanup()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


# -- freezing a worker where it holds nothing --------------------------------------


def backend_states(url: str, pid: int) -> list[str]:
    """States of the server sessions of process `pid` (matched by its local ports)."""
    try:
        ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")}
    except psutil.Error:
        return []
    found = sql(
        url,
        "SELECT client_port, state FROM pg_stat_activity WHERE datname = current_database()",
    )
    return [r["state"] for r in found if r["client_port"] in ports]


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def what_it_is_doing(url: str, member: Member) -> str:
    """For a failure's message: the worker's process state, its sessions'
    states and the end of its output."""
    status: str
    try:
        status = psutil.Process(member.pid).status()
    except psutil.Error as gone:
        status = f"gone ({gone})"
    sessions = backend_states(url, member.pid)
    tail = member.output()[-2000:]
    return f"{member.name}: process {status}, sessions {sessions}, output:\n{tail}"


def freeze_between_transactions(url: str, member: Member) -> None:
    """SIGSTOP the worker at a moment when none of its sessions is inside a
    transaction (a worker frozen mid-transaction is another test's subject)."""
    rng = random.Random(7)
    for _ in range(200):
        member.signal(signal.SIGSTOP)
        wait_for(lambda: stopped(member.pid), timeout=5, what="the worker to stop")
        if all(state == "idle" for state in backend_states(url, member.pid)):
            return
        member.signal(signal.SIGCONT)
        time.sleep(rng.uniform(0.01, 0.08))
    raise AssertionError("could not freeze the worker between two transactions")


# -- what the records say ---------------------------------------------------------


def run_log(runs: Path, job_id: int) -> list[tuple[str, int, str, float]]:
    path = runs / f"{job_id}.log"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(kind, int(attempt), worker, float(up)) for kind, attempt, worker, up in lines]


def check_never_two_copies(url: str, runs: Path, job_ids: list[int]) -> None:
    """No copy of a job ever found its lock taken, no two attempts of a job
    overlap by their own stamps, and the attempts table agrees."""
    assert_no_overlap(runs)
    for job_id in job_ids:
        spans: dict[int, list[float]] = {}
        for _, attempt, _, up in run_log(runs, job_id):
            spans.setdefault(attempt, []).append(up)
            assert len(spans[attempt]) <= 2, f"job {job_id} attempt {attempt} ran twice"
        for (a, first), (b, second) in itertools.pairwise(sorted(spans.items())):
            if len(first) == 2:
                assert first[1] <= second[0], f"job {job_id}: attempts {a} and {b} overlapped"
        tries = sql(
            url,
            "SELECT attempt_no, started_at, finished_at FROM attempts WHERE job_id = %s"
            " ORDER BY attempt_no",
            (job_id,),
        )
        for one, two in itertools.pairwise(tries):
            assert one["finished_at"] is not None
            assert one["finished_at"] <= two["started_at"], f"job {job_id}: attempts overlap"


def check_ledger(url: str, runs: Path, job_ids: list[int]) -> int:
    """Every job is done by exactly one succeeded attempt, every earlier one
    was abandoned as a worker crash, the ledger tells the same story, and the
    succeeded attempt ran to its end exactly once. Returns the crashes."""
    jobs = {r["id"]: r for r in sql(url, "SELECT * FROM jobs")}
    assert sorted(jobs) == sorted(job_ids)
    assert Counter(r["state"] for r in jobs.values()) == {"done": len(job_ids)}
    crashes = 0
    for job_id, row in jobs.items():
        tries = sql(
            url,
            "SELECT attempt_no, state, failure_reason FROM attempts WHERE job_id = %s"
            " ORDER BY attempt_no",
            (job_id,),
        )
        *failed, last = tries
        assert (last["state"], last["failure_reason"]) == ("succeeded", None), f"job {job_id}"
        assert all(
            (t["state"], t["failure_reason"]) == ("abandoned", "worker_crash") for t in failed
        ), f"job {job_id}: {tries}"
        assert row["crashes"] == len(failed) == row["attempts"]
        events = Counter(
            r["event"]
            for r in sql(url, "SELECT event FROM job_events WHERE job_id = %s", (job_id,))
        )
        assert events["added"] == 1 and events["succeeded"] == 1, f"job {job_id}: {events}"
        assert events["claimed"] == len(tries)
        assert events["reaped"] + events["failed"] == len(failed), f"job {job_id}: {events}"
        log = run_log(runs, job_id)
        ends = [attempt for kind, attempt, _, _ in log if kind == "end"]
        assert ends.count(last["attempt_no"]) == 1, f"job {job_id}: {log}"
        crashes += len(failed)
    return crashes


# -- (a) three machines, one SIGKILLed, one SIGSTOPped ----------------------------

LONG_S = 8.0
"""Longer than the lease plus the crash backoff (6 s): a victim's orphan would
still run when its job is started again elsewhere."""
LONGER_S = 14.0
"""The same with room to spare, where an overlap is expected to show (the test
stops at the first one)."""


def three_machines_one_killed_one_frozen(
    fleet: PgFleet, runs: Path, *, isolated: bool, long_s: float = LONG_S
) -> None:
    """a and b run two long jobs each; c (six at once) takes the rest. a is
    SIGKILLed, b SIGSTOPped until its jobs run again on c, then SIGCONTed."""
    url = fleet.url
    long_jobs = submit_jobs(url, [job_spec(runs, long_s, priority=5) for _ in range(6)])
    short_jobs = submit_jobs(url, [job_spec(runs, 0.3) for _ in range(18)])
    job_ids = long_jobs + short_jobs
    a, b = (fleet.start(n, "--concurrency", "2", isolated=isolated) for n in "ab")
    for member in (a, b):
        wait_for(
            lambda m=member: len(running_of(url, m.worker_id)) == 2,
            timeout=30,
            what=f"{member.name} to run two long jobs",
        )
    c = fleet.start("c", "--concurrency", "6", isolated=isolated)

    a.signal(signal.SIGKILL)
    freeze_between_transactions(url, b)
    frozen = [r["id"] for r in running_of(url, b.worker_id)]
    assert len(frozen) == 2

    def running_again(job_id: int) -> bool:
        found = sql(
            url, "SELECT locked_by FROM jobs WHERE id = %s AND state = 'running'", (job_id,)
        )
        return bool(found) and found[0]["locked_by"] == c.worker_id

    wait_for(
        lambda: all(running_again(j) for j in frozen), timeout=40, what="b's jobs to run again on c"
    )
    b.signal(signal.SIGCONT)
    until_all_done(url, runs, len(job_ids), timeout=60)

    assert fleet.stop(b) == 0, b.output()
    assert fleet.stop(c) == 0, c.output()
    check_never_two_copies(url, runs, job_ids)
    crashes = check_ledger(url, runs, job_ids)
    assert crashes >= 4, "the killed and the frozen worker each held two jobs"
    dead = sql(url, "SELECT state FROM workers WHERE id = %s", (a.worker_id,))
    assert dead == [{"state": "dead"}]


def test_three_machines_drain_while_one_is_killed_and_one_frozen(
    fleet: PgFleet, runs: Path
) -> None:
    three_machines_one_killed_one_frozen(fleet, runs, isolated=False)


def test_three_isolated_machines_drain_while_one_is_killed_and_one_frozen(
    fleet: PgFleet, runs: Path
) -> None:
    needs_namespaces()
    three_machines_one_killed_one_frozen(fleet, runs, isolated=True, long_s=LONGER_S)


# -- (b) connections terminated by the server, again and again ---------------------


def test_workers_whose_connections_are_terminated_again_and_again_finish_every_job(
    fleet: PgFleet, runs: Path
) -> None:
    url = fleet.url
    job_ids = submit_jobs(url, [job_spec(runs, 0.8) for _ in range(24)])
    x, y = (fleet.start(n, "--concurrency", "2") for n in "xy")
    wait_for(lambda: fleet.in_loop(x) and fleet.in_loop(y), timeout=30, what="both in loop")

    rng = random.Random(11)
    cuts = 0
    deadline = time.monotonic() + 60
    while states(url)["done"] < len(job_ids):
        assert time.monotonic() < deadline, f"not finished: {states(url)}"
        cuts += terminate_workers_connections(url) > 0
        time.sleep(rng.uniform(0.1, 0.3))

    assert cuts >= 8, f"the connections were cut {cuts} times only"
    for member in (x, y):
        assert member.popen.poll() is None, f"{member.name} died: {member.output()}"
        assert fleet.stop(member) == 0, member.output()
    check_never_two_copies(url, runs, job_ids)
    check_ledger(url, runs, job_ids)
    by_worker = Counter(
        r["worker_id"] for r in sql(url, "SELECT worker_id FROM attempts WHERE state = 'succeeded'")
    )
    assert by_worker[x.worker_id] > 0 and by_worker[y.worker_id] > 0, by_worker


# -- a connection cut at the worst moments, by a proxy -----------------------------


class CuttingProxy:
    """A TCP proxy between workers and the server, to break the network.

    - mode "lose_answer": at the COMMIT of the first transaction that claimed
      a job (inserted an attempt), the COMMIT reaches the server (the claim is
      made) but its answer never reaches the worker, and the connection is
      closed: the worker cannot know that it owns the job.
    - mode "pass": nothing is cut, but `partition()` silently drops all traffic
      from then on, both ways, on every connection, old and new (the network
      between the worker and the server is gone; no connection is closed).
    """

    def __init__(self, url: str, mode: str) -> None:
        from sqlalchemy.engine import make_url

        self.target = make_url(url)
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts_left = 0 if mode == "pass" else 1
        self.silent = threading.Event()
        self.cut = threading.Event()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        proxied = self.target.set(host="127.0.0.1", port=self.port)
        proxied = proxied.update_query_dict({"sslmode": "disable"})
        return proxied.render_as_string(hide_password=False)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection((self.target.host, self.target.port))
            with self.lock:
                self.sockets += [client, server]
            state = {"armed": False, "blackhole": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def partition(self) -> None:
        self.silent.set()

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        while data := _recv(client):
            if self.silent.is_set():
                continue
            if b"INSERT INTO attempts" in data:
                state["armed"] = True
            if b"COMMIT" in data and state["armed"] and self._take_cut():
                state["blackhole"] = True  # before the server can answer
                server.sendall(data)
                time.sleep(0.3)
                self.cut.set()
                _close(client, server)
                return
            if b"COMMIT" in data:
                state["armed"] = False
            try:
                server.sendall(data)
            except OSError:
                break
        _close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        while data := _recv(server):
            if state["blackhole"] or self.silent.is_set():
                continue
            try:
                client.sendall(data)
            except OSError:
                break
        _close(client, server)

    def _take_cut(self) -> bool:
        with self.lock:
            if self.cuts_left <= 0:
                return False
            self.cuts_left -= 1
            return True

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            _close(*self.sockets)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


@pytest.fixture
def proxies() -> Iterator[list[CuttingProxy]]:
    made: list[CuttingProxy] = []
    yield made
    for proxy in made:
        proxy.close()


def test_a_claim_whose_commit_answer_is_lost_still_runs(
    fleet: PgFleet, runs: Path, proxies: list[CuttingProxy]
) -> None:
    url = fleet.url
    (job_id,) = submit_jobs(url, [job_spec(runs, 0.2)])
    proxy = CuttingProxy(url, "lose_answer")
    proxies.append(proxy)
    owner = fleet.start("p", url=proxy.url)
    wait_for(proxy.cut.is_set, timeout=30, what="the claim's COMMIT")
    fleet.start("q")

    until(url, lambda: states(url) == {"done": 1}, timeout=10, what="the job to be done")

    check_never_two_copies(url, runs, [job_id])
    check_ledger(url, runs, [job_id])
    assert owner.popen.poll() is None


def in_a_write(url: str, pid: int) -> bool:
    """Whether the worker's session is inside a transaction that has recorded
    an event (it holds its lock for writing job_events: the rows it changed
    stay locked until it ends, and so would any lock an event insert took)."""
    try:
        ports = [c.laddr.port for c in psutil.Process(pid).net_connections("tcp")]
    except psutil.Error:
        return False
    found = sql(
        url,
        "SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
        " WHERE l.relation = 'job_events'::regclass AND l.mode = 'RowExclusiveLock'"
        " AND l.granted AND a.backend_xid IS NOT NULL AND a.client_port = ANY(%s)",
        (ports,),
    )
    return bool(found)


def freeze_inside_a_write(url: str, member: Member) -> int:
    """SIGSTOP the worker at a moment when it is inside a transaction that
    has recorded an event (a claim or an outcome); returns the tries it took.
    Until 0.5.1 every event insert took a ledger lock that every writer
    waited for: a worker frozen there stalled the whole fleet."""
    rng = random.Random(3)
    for tries in range(1, 2000):
        member.signal(signal.SIGSTOP)
        wait_for(lambda: stopped(member.pid), timeout=5, what="the worker to stop")
        if in_a_write(url, member.pid):
            return tries
        member.signal(signal.SIGCONT)
        time.sleep(rng.uniform(0.0, 0.01))
    raise AssertionError("never caught the worker inside a transaction")


def test_a_worker_frozen_inside_a_transaction_does_not_stall_the_fleet(
    fleet: PgFleet, runs: Path
) -> None:
    url = fleet.url
    submit_jobs(url, [JobSpec(argv=["true"], lane="busy") for _ in range(400)])
    others = submit_jobs(url, [job_spec(runs, 0.2) for _ in range(6)])
    p = fleet.start("p", "--queue", "busy", "--concurrency", "4")
    until(url, lambda: states(url)["done"] > 5, timeout=30, what="p to get busy")
    tries = freeze_inside_a_write(url, p)
    fleet.start("q", "--concurrency", "2")

    def others_done() -> bool:
        found = sql(url, "SELECT count(*) AS n FROM jobs WHERE state = 'done' AND queue <> 'busy'")
        return int(found[0]["n"]) == len(others)

    try:
        until(url, others_done, timeout=8, what=f"q to go on (frozen after {tries} tries)")
    finally:
        p.signal(signal.SIGCONT)


def test_a_worker_cut_off_from_the_server_fences_its_jobs_before_they_run_again(
    fleet: PgFleet, runs: Path, proxies: list[CuttingProxy]
) -> None:
    """The network between worker p and the server goes silent while p runs a
    long job. p cannot heartbeat, so it must kill the job within half the hang
    threshold: another machine starts the job again once the whole threshold
    has passed. (Isolated machines: no reaper can see p's processes.)"""
    needs_namespaces()
    url = fleet.url
    (job_id,) = submit_jobs(url, [job_spec(runs, LONGER_S)])
    proxy = CuttingProxy(url, "pass")
    proxies.append(proxy)
    p = fleet.start("p", url=proxy.url, isolated=True)
    until(url, lambda: running_of(url, p.worker_id), timeout=30, what="p to run the job")
    proxy.partition()
    fleet.start("q", isolated=True)

    until_all_done(url, runs, 1, timeout=40)
    check_never_two_copies(url, runs, [job_id])


# -- (c) --slots across machines ---------------------------------------------------

COUNTED = r"""
exec 8>>"$1/count.lock"
flock 8; n=$(($(cat "$1/count" 2>/dev/null || echo 0) + 1)); echo $n > "$1/count"
echo $n >> "$1/peaks"; flock -u 8
sleep "$2"
flock 8; echo $(($(cat "$1/count") - 1)) > "$1/count"; flock -u 8
"""


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = level = 0
    for _, step in edges:  # an end sorts before a start at the same moment
        level += step
        peak = max(peak, level)
    return peak


def test_slots_are_never_exceeded_across_machines(fleet: PgFleet, runs: Path) -> None:
    """Three machines may run two jobs each, the lane two in all. Midway the
    worker holding the slots is stopped (SIGTERM: its jobs finish first) and
    the others take over; at no moment do more than two jobs run."""
    url = fleet.url
    spec = JobSpec(argv=["sh", "-c", COUNTED, "job", str(runs), "0.5"], timeout_seconds=60)
    job_ids = submit_jobs(url, [spec] * 16)
    members = {
        m.worker_id: m
        for m in (fleet.start(n, "--concurrency", "2", "--slots", "2") for n in "uvw")
    }
    until(url, lambda: states(url)["done"] >= 4, timeout=30, what="four jobs done")
    holders = {
        r["locked_by"] for r in sql(url, "SELECT locked_by FROM jobs WHERE state = 'running'")
    }
    for holder in holders - {None}:
        assert fleet.stop(members.pop(holder)) == 0

    until(url, lambda: states(url) == {"done": len(job_ids)}, timeout=60, what="every job done")

    for member in members.values():
        assert fleet.stop(member) == 0, member.output()
    peaks = [int(n) for n in (runs / "peaks").read_text().split()]
    assert len(peaks) == len(job_ids) and max(peaks) == 2, peaks
    tries = sql(url, "SELECT worker_id, started_at, finished_at FROM attempts")
    assert len(tries) == len(job_ids)
    assert len({t["worker_id"] for t in tries}) >= 2, "the slots never changed hands"
    # claim and finish times are each worker's reading of the server clock, taken
    # just before its transaction: shave a little off each span
    spans = [(t["started_at"] + 0.1, t["finished_at"]) for t in tries]
    assert most_at_once(spans) <= 2


# -- (d) a stale worker's late write changes nothing ------------------------------

TWICE = r"""
lock="$1/lock"; exec 9>>"$lock"
flock -n 9 || echo "$SPOOLCTL_ATTEMPT" >> "$1/violations"
echo "start $SPOOLCTL_ATTEMPT" >> "$1/log"
if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then sleep 0.3; else sleep 3; fi
echo "end $SPOOLCTL_ATTEMPT" >> "$1/log"
"""


JOB_SAVE_HEARTBEAT = (
    "SELECT state, locked_by, locked_pid, locked_at, started_at, finished_at, attempts,"
    " crashes, next_run_at, last_exit_code, last_error, last_failure_reason FROM jobs"
)
"""The job row but its heartbeat (which the new owner keeps refreshing)."""


def test_a_frozen_workers_late_outcome_changes_nothing(fleet: PgFleet, runs: Path) -> None:
    """s runs attempt 1, which ends while s is frozen (its success unrecorded);
    r requeues the job once s's lease is over and runs attempt 2; s is woken
    while attempt 2 runs. Its late outcome must change nothing."""
    url = fleet.url
    spec = JobSpec(argv=["sh", "-c", TWICE, "job", str(runs)], timeout_seconds=60)
    submit_jobs(url, [spec])
    log = runs / "log"
    stale = fleet.start("s")
    wait_for(lambda: log.exists() and "start 1" in log.read_text(), timeout=30, what="attempt 1")
    freeze_between_transactions(url, stale)
    wait_for(lambda: "end 1" in log.read_text(), timeout=10, what="attempt 1 to end")
    fresh = fleet.start("r")
    wait_for(lambda: "start 2" in log.read_text(), timeout=30, what="attempt 2 on r")

    first = sql(url, "SELECT * FROM attempts WHERE attempt_no = 1")
    job_row = sql(url, JOB_SAVE_HEARTBEAT)
    events = sql(url, "SELECT * FROM job_events ORDER BY id")

    def beat() -> float:
        found = sql(url, "SELECT heartbeat_at FROM workers WHERE id = %s", (stale.worker_id,))
        return float(found[0]["heartbeat_at"])

    stale.signal(signal.SIGCONT)
    for _ in range(3):  # s runs several loops (heartbeat, settle, claim)
        last = beat()
        try:  # s's loop is not what this test times: a loaded suite may be slow
            wait_for(lambda last=last: beat() != last, timeout=30, what="s to heartbeat")
        except AssertionError as late:
            raise AssertionError(f"{late}\n{what_it_is_doing(url, stale)}") from None

    assert sql(url, "SELECT * FROM attempts WHERE attempt_no = 1") == first
    assert sql(url, JOB_SAVE_HEARTBEAT) == job_row
    assert sql(url, "SELECT * FROM job_events ORDER BY id") == events
    wait_for(lambda: states(url) == {"done": 1}, timeout=20, what="attempt 2 to finish")

    (one,) = first
    assert (one["state"], one["failure_reason"], one["worker_id"]) == (
        "abandoned",
        "worker_crash",
        stale.worker_id,
    )
    two = sql(url, "SELECT * FROM attempts WHERE attempt_no = 2")[0]
    assert (two["state"], two["worker_id"]) == ("succeeded", fresh.worker_id)
    trail = [(e["event"], e["worker_id"]) for e in sql(url, "SELECT * FROM job_events ORDER BY id")]
    assert trail == [
        ("added", None),
        ("claimed", stale.worker_id),
        ("reaped", fresh.worker_id),
        ("claimed", fresh.worker_id),
        ("succeeded", fresh.worker_id),
    ]
    row = sql(url, "SELECT * FROM jobs")[0]
    assert (row["state"], row["crashes"], row["last_exit_code"]) == ("done", 1, 0)
    assert not (runs / "violations").exists()
    for member in (stale, fresh):
        assert fleet.stop(member) == 0, member.output()
