"""Workers in separate PID namespaces of one machine that share its host name
and boot, as `unshare --pid`, a container on the host's UTS namespace or a
Kubernetes pod on the host network have them. One worker's pid means nothing
to another there (the same number may be the other worker itself, or one of
its jobs), so each judges the others by the lease rule, as workers on
another machine, and never fences or kills itself or its own jobs.

Three "machines" (`unshare --pid --fork --mount-proc`; PID 1 of each runs
the worker, then stays, so a killed worker's jobs live on) share one queue:
an SQLite file (one filesystem) or a PostgreSQL database. Worker a is
SIGSTOPped while it runs two jobs, worker c is SIGKILLed while it runs two
(its worker, or its namespace's PID 1 with everything in it), worker b must
requeue their jobs only once their lease has run out, rerun them, and lose
none of its own. Variants: the three namespaces started within the same
second (every worker is pid 2 in its namespace, started within the start
time tolerance of the others: pid and start time alone cannot tell them
apart), and b started well before a and c.

Every job proves "never two copies at once" itself: it holds an exclusive
`flock` on its own lock file while it runs (a copy that cannot take it
writes a line to `violations`), and appends its start and end, stamped with
the machine's uptime, to its own log (O_APPEND).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from spoolctl.runner.procs import START_TIME_TOLERANCE_S
from tests.helpers import (
    FAST_KNOBS,
    NS_INIT,
    STARTED_WORKERS,
    UNSHARE,
    Db,
    add_job,
    child_env,
    cli,
    needs_namespaces,
    rows,
    wait_for,
    write_lock_free,
)

pytestmark = [
    pytest.mark.both_backends,
    pytest.mark.subprocess,
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("flock") is None, reason="needs util-linux flock"),
]

HANG_S = 6.0
"""The lease: others requeue a silent worker's jobs after HANG_S without a
heartbeat; the reap threshold (tests.helpers.FAST_KNOBS) is 1 s."""
LEASE_SLACK_S = 0.25
"""Each worker reads the database's clock its own way (on PostgreSQL, the
server's through its own estimate of the offset)."""
JOB_S = 3.5
"""Longer than the reap threshold plus the 2 s crash backoff (a requeue at
the reap threshold reruns a job while the copy that a frozen or killed
worker left still runs), shorter than the lease: the copy left running in
the victim's namespace, which nothing outside that namespace can see, has
ended on its own before the lease lets its job run again (a job that
outlives the lease is its guard's: the last test)."""

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


@dataclass
class Machine:
    """One worker alone in its PID namespace, with its own /proc."""

    name: str
    popen: subprocess.Popen[str]
    base: Path

    @property
    def worker_id(self) -> str:
        return f"w-{self.name}"

    def init(self) -> psutil.Process | None:
        """The namespace's PID 1 (the `sh` that runs the worker)."""
        with contextlib.suppress(psutil.Error):
            for kid in psutil.Process(self.popen.pid).children():
                return kid
        return None

    def worker_pid(self) -> int:
        """The worker's pid as seen from here."""
        return int(wait_for(self._worker, timeout=30, what=f"{self.name}'s worker"))

    def _worker(self) -> int | None:
        init = self.init()
        if init is None:
            return None
        with contextlib.suppress(psutil.Error):
            for kid in init.children():
                if "spoolctl" in " ".join(kid.cmdline()):
                    return kid.pid
        return None

    def exit_code(self, timeout: float = 30) -> int:
        rc = Path(f"{self.base}.rc")
        wait_for(
            lambda: rc.exists() and rc.read_text().strip(),
            timeout=timeout,
            what=f"{self.name} to exit",
        )
        return int(rc.read_text())

    def output(self) -> str:
        log = Path(f"{self.base}.log")
        return log.read_text() if log.exists() else ""

    def destroy(self) -> None:
        """Kill the namespace's PID 1, and with it everything in there."""
        init = self.init()
        if init is not None:
            with contextlib.suppress(psutil.Error):
                init.kill()
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


@dataclass
class Machines:
    db: Db
    root: Path
    started: list[Machine] = field(default_factory=list)

    def start(self, name: str) -> Machine:
        """`spoolctl work --concurrency 2` as worker w-<name> in a PID namespace
        of its own, with this machine's host name and boot (no test knob
        poses as another machine)."""
        base = self.root / f"ns-{name}"
        work = [
            sys.executable,
            "-m",
            "spoolctl",
            "work",
            "--db",
            str(self.db),
            "--json",
            "--worker-id",
            f"w-{name}",
            "--concurrency",
            "2",
            "--poll-interval",
            "0.2",
        ]
        env = child_env({**FAST_KNOBS, "SPOOLCTL_HANG_THRESHOLD": str(HANG_S)})
        for knob in ("SPOOLCTL_TEST_HOSTNAME", "SPOOLCTL_TEST_BOOT_ID"):
            env.pop(knob, None)
        popen = subprocess.Popen(
            [*UNSHARE, "sh", "-c", NS_INIT, str(base), *work],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        STARTED_WORKERS.append(popen)
        machine = Machine(name, popen, base)
        self.started.append(machine)
        return machine

    def registered(self, machine: Machine) -> Any:
        found = rows(self.db, "SELECT * FROM workers WHERE id = ?", (machine.worker_id,))
        return found[0] if found else None

    def in_loop(self, machine: Machine) -> bool:
        row = self.registered(machine)
        return row is not None and row["heartbeat_at"] > row["started_at"]

    def cleanup(self) -> None:
        for machine in self.started:
            machine.destroy()


@pytest.fixture
def machines(db: Db, tmp_path: Path) -> Iterator[Machines]:
    needs_namespaces()
    made = cli("migrate", db=db, json=True)  # the queue exists before three workers race for it
    assert made.exit_code == 0, made.stdout + made.stderr
    crew = Machines(db, tmp_path)
    yield crew
    crew.cleanup()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


def running_of(db: Db, worker_id: str) -> list[int]:
    """Running jobs of a worker whose process has started (pid recorded)."""
    found = rows(
        db,
        "SELECT j.id FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.state = 'running'"
        " WHERE j.state = 'running' AND j.locked_by = ? AND a.job_pid IS NOT NULL",
        (worker_id,),
    )
    return [r["id"] for r in found]


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def freeze_outside_a_write(db: Db, pid: int) -> None:
    """SIGSTOP the worker at a moment when it holds no write lock (a worker
    frozen inside a write is another test's subject)."""
    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: stopped(pid), timeout=10, what="the worker to stop")
        if write_lock_free(db):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.03)
    raise AssertionError("could not freeze the worker outside a write")


def three_machines(machines: Machines, *, same_second: bool) -> tuple[Machine, ...]:
    """Machines a, b and c, each in its loop. same_second: started together,
    and restarted until every worker is pid 2 in its namespace, started
    within the start time tolerance of the others; else b well before a and c."""
    if not same_second:
        b = machines.start("b")
        wait_for(lambda: machines.in_loop(b), timeout=60, what="b in its loop")
        began = machines.registered(b)["process_started_at"]
        wait_for(lambda: time.time() > began + 2 * START_TIME_TOLERANCE_S, what="a later second")
        a, c = machines.start("a"), machines.start("c")
        trio = (a, b, c)
        for m in (a, c):
            wait_for(lambda m=m: machines.in_loop(m), timeout=60, what=f"{m.name} in its loop")
        assert {machines.registered(m)["pid"] for m in trio} == {2}
        return trio
    for _ in range(5):
        trio = tuple(machines.start(n) for n in "abc")
        for m in trio:
            wait_for(lambda m=m: machines.in_loop(m), timeout=60, what=f"{m.name} in its loop")
        found = [machines.registered(m) for m in trio]
        starts = [r["process_started_at"] for r in found]
        if {r["pid"] for r in found} == {2} and max(starts) - min(starts) <= 0.9:
            return trio
        for m in trio:  # a loaded machine spread them out: again (they hold no job yet)
            m.destroy()
    raise AssertionError("could not start three namespaces within one second")


def run_log(runs: Path, job_id: int) -> list[tuple[str, int, str, float]]:
    path = runs / f"{job_id}.log"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(kind, int(attempt), worker, float(up)) for kind, attempt, worker, up in lines]


def check_never_two_copies(runs: Path, job_ids: list[int]) -> None:
    violations = runs / "violations"
    assert not violations.exists(), "two copies ran at once: " + violations.read_text()
    for job_id in job_ids:
        spans: dict[int, list[float]] = {}
        for _, attempt, _, up in run_log(runs, job_id):
            spans.setdefault(attempt, []).append(up)
        for (one, first), (two, second) in itertools.pairwise(sorted(spans.items())):
            if len(first) == 2:
                assert first[1] <= second[0], f"job {job_id}: attempts {one} and {two} overlapped"


def reaped_at(db: Db, job_id: int) -> list[float]:
    found = rows(db, "SELECT at FROM job_events WHERE job_id = ? AND event = 'reaped'", (job_id,))
    return [r["at"] for r in found]


def describe(db: Db, trio: tuple[Machine, ...]) -> str:
    jobs = rows(db, "SELECT id, state, locked_by, heartbeat_at FROM jobs ORDER BY id")
    tries = rows(db, "SELECT job_id, attempt_no, worker_id, state, failure_reason FROM attempts")
    crew = rows(db, "SELECT id, pid, process_started_at, heartbeat_at, state FROM workers")
    outputs = "\n".join(f"{m.name}: {m.output()[-1500:]}" for m in trio)
    return (
        f"jobs {[tuple(r) for r in jobs]}\nattempts {[tuple(r) for r in tries]}\n"
        f"workers {[tuple(r) for r in crew]}\n{outputs}"
    )


def until(db: Db, trio: tuple[Machine, ...], condition: Any, timeout: float, what: str) -> None:
    try:
        wait_for(condition, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(db, trio)}") from None


def one_frozen_one_killed(
    machines: Machines, runs: Path, *, same_second: bool, kill_namespace: bool
) -> None:
    db = machines.db
    trio = a, b, c = three_machines(machines, same_second=same_second)
    job_ids = [add_job(db, "sh", "-c", JOB, "job", str(runs), str(JOB_S)) for _ in range(6)]
    for m in (a, c):
        until(
            db,
            trio,
            lambda m=m: len(running_of(db, m.worker_id)) == 2,
            60,
            f"{m.name} to run two jobs",
        )
    victims = {m.worker_id: running_of(db, m.worker_id) for m in (a, c)}

    frozen = a.worker_pid()
    freeze_outside_a_write(db, frozen)
    if kill_namespace:
        init = c.init()
        assert init is not None
        init.kill()
    else:
        os.kill(c.worker_pid(), signal.SIGKILL)
    try:
        lost = victims[a.worker_id] + victims[c.worker_id]
        until(
            db,
            trio,
            lambda: all(reaped_at(db, j) for j in lost),
            60,
            "b to requeue the frozen and the killed worker's jobs",
        )
        beats = {
            r["id"]: r["heartbeat_at"] for r in rows(db, "SELECT id, heartbeat_at FROM workers")
        }
    finally:
        os.kill(frozen, signal.SIGCONT)

    for worker_id, jobs in victims.items():
        for job_id in jobs:
            silent = min(reaped_at(db, job_id)) - beats[worker_id]
            assert silent >= HANG_S - LEASE_SLACK_S, (
                f"job {job_id} of {worker_id} was requeued {silent:.2f}s after its worker's last"
                f" heartbeat, before its {HANG_S}s lease ran out\n{describe(db, trio)}"
            )
    until(
        db,
        trio,
        lambda: rows(db, "SELECT count(*) FROM jobs WHERE state = 'done'")[0][0] == 6,
        60,
        "every job done",
    )
    check_never_two_copies(runs, job_ids)

    for m in (a, b):
        os.kill(m.worker_pid(), signal.SIGTERM)
        assert m.exit_code() == 0, m.output()
    mine = rows(
        db, "SELECT job_id, state, failure_reason FROM attempts WHERE worker_id = ?", (b.worker_id,)
    )
    assert mine and all(r["state"] == "succeeded" for r in mine), (
        f"b lost one of its own jobs: {[tuple(r) for r in mine]}\n{describe(db, trio)}"
    )
    for job_id in victims[a.worker_id] + victims[c.worker_id]:
        tries = rows(
            db,
            "SELECT state, failure_reason FROM attempts WHERE job_id = ? ORDER BY attempt_no",
            (job_id,),
        )
        assert tries[0]["failure_reason"] == "worker_crash", tries
        assert tries[-1]["state"] == "succeeded", tries


def test_workers_started_in_the_same_second_in_separate_namespaces_wait_for_the_lease(
    machines: Machines, runs: Path
) -> None:
    one_frozen_one_killed(machines, runs, same_second=True, kill_namespace=False)


def test_workers_in_separate_namespaces_wait_for_the_lease_of_a_frozen_and_a_lost_one(
    machines: Machines, runs: Path
) -> None:
    one_frozen_one_killed(machines, runs, same_second=False, kill_namespace=True)


LONG_FIRST = JOB.replace('sleep "$2"', '[ "$SPOOLCTL_ATTEMPT" = 1 ] && sleep "$2" || sleep 0.2')
"""JOB, whose first attempt outlives the lease (the rerun is short)."""


def test_a_frozen_workers_job_that_outlives_the_lease_ends_before_its_rerun(
    machines: Machines, runs: Path
) -> None:
    """Nothing outside a frozen worker's namespace can see or end its job, and
    the frozen worker cannot fence itself: its lease guard ends the job at
    three quarters of the lease, before another namespace's worker reruns it
    (on SQLite too, where one file is shared by containers of one host)."""
    db = machines.db
    a = machines.start("a")
    wait_for(lambda: machines.in_loop(a), timeout=60, what="a in its loop")
    job_id = add_job(db, "sh", "-c", LONG_FIRST, "job", str(runs), str(10 * HANG_S))
    wait_for(lambda: running_of(db, a.worker_id) == [job_id], timeout=60, what="a to run it")
    b = machines.start("b")
    wait_for(lambda: machines.in_loop(b), timeout=60, what="b in its loop")
    frozen = a.worker_pid()
    freeze_outside_a_write(db, frozen)
    try:
        until(db, (a, b), lambda: db_state(db, job_id) == "done", 60, "b to rerun the job")
    finally:
        os.kill(frozen, signal.SIGCONT)
    check_never_two_copies(runs, [job_id])
    first = [kind for kind, attempt, _, _ in run_log(runs, job_id) if attempt == 1]
    assert first == ["start"], f"the first copy was not ended by its guard: {first}"
    tries = rows(db, "SELECT worker_id, failure_reason FROM attempts WHERE job_id = ?", (job_id,))
    assert [tuple(t) for t in tries] == [(a.worker_id, "worker_crash"), (b.worker_id, None)]


def db_state(db: Db, job_id: int) -> str:
    return str(rows(db, "SELECT state FROM jobs WHERE id = ?", (job_id,))[0]["state"])
