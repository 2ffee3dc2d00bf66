"""On PostgreSQL, the times that decide liveness come from the database server's
clock, never the machine's: workers and a submitter whose clocks are ten
minutes off, either way, on machines of their own.

A machine's clock is skewed in two ways here: with the test knob
SPOOLCTL_TEST_CLOCK_SKEW (which shifts spoolctl's own local clock), and for
real, by starting spoolctl with `time.time` itself shifted, as it is on a
machine whose clock is wrong (what the knob cannot reach shows there).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import child_env
from tests.pg.test_fleet import (
    HANG_S,
    SPOOLCTL,
    PgFleet,
    check_ledger,
    check_never_two_copies,
    job_spec,
    running_of,
    server_epoch,
    sql,
    states,
    submit_jobs,
    until,
    until_all_done,
)

pytestmark = [pytest.mark.timeout(90), pytest.mark.subprocess]

SKEW_S = 600.0
WITHIN_S = 2.0
"""How far a stored time may be from the server's clock when it was written."""

SKEWED_PYTHON = (
    "import sys, time; real = time.time; skew = float(sys.argv.pop(1));"
    " time.time = lambda: real() + skew; from spoolctl.cli import main; main()"
)
"""spoolctl on a machine whose clock is `skew` seconds off."""


def skewed(how: str, skew: float) -> dict[str, Any]:
    """PgFleet.start keywords for a machine whose clock is `skew` seconds off."""
    if how == "knob":
        return {"SPOOLCTL_TEST_CLOCK_SKEW": f"{skew:+g}"}
    return {"launcher": (sys.executable, "-c", SKEWED_PYTHON, f"{skew:+g}")}


HOW = pytest.mark.parametrize("how", ["knob", "clock"])


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Any:
    crew = PgFleet(pg_url, tmp_path)
    yield crew
    crew.cleanup()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


TIMES = {
    "jobs": ("created_at", "next_run_at", "started_at", "finished_at", "locked_at", "heartbeat_at"),
    "attempts": ("started_at", "finished_at", "job_started_at"),
    "workers": ("started_at", "heartbeat_at", "stopped_at"),
    "job_events": ("at",),
}


def stored_times(url: str) -> list[tuple[str, float]]:
    found = []
    for table, columns in TIMES.items():
        for row in sql(url, f"SELECT {', '.join(columns)} FROM {table}"):
            found += [(f"{table}.{c}", row[c]) for c in columns if row[c] is not None]
    return found


def live_beats_on_server_time(url: str, worker_ids: list[str]) -> bool:
    """Each worker's newest heartbeat, and each running job's, as stored, is
    close to the server's clock (they beat every half second)."""
    now = server_epoch(url)
    beats = sql(url, "SELECT id, heartbeat_at FROM workers WHERE id = ANY(%s)", (worker_ids,))
    jobs = sql(url, "SELECT locked_by, heartbeat_at FROM jobs WHERE state = 'running'")
    assert len(beats) == len(worker_ids)
    for row in beats + jobs:
        assert abs(row["heartbeat_at"] - now) < WITHIN_S, (row, now)
    return {j["locked_by"] for j in jobs} == set(worker_ids)


@HOW
def test_workers_with_skewed_clocks_write_server_time_and_are_never_reaped(
    fleet: PgFleet, runs: Path, how: str
) -> None:
    """A healthy machine and two ten minutes off, either way, each run two jobs
    that outlast several reap passes: the times they store are the server's,
    nobody reaps or fences anybody, and every job runs exactly once."""
    url = fleet.url
    started = server_epoch(url)
    submit_jobs(url, [])  # creates the queue
    members = [
        fleet.start("h", "--concurrency", "2"),
        fleet.start("m", "--concurrency", "2", **skewed(how, -SKEW_S)),
        fleet.start("p", "--concurrency", "2", **skewed(how, +SKEW_S)),
    ]
    for member in members:
        until(url, lambda m=member: fleet.in_loop(m), timeout=30, what=f"{member.name} in loop")
    job_ids = submit_jobs(url, [job_spec(runs, 3.5) for _ in range(6)])
    ids = [m.worker_id for m in members]

    until(url, lambda: live_beats_on_server_time(url, ids), timeout=30, what="all running")
    time.sleep(1.0)
    assert live_beats_on_server_time(url, ids)
    until_all_done(url, runs, len(job_ids), timeout=40)
    for member in members:
        assert fleet.stop(member) == 0, member.output()
    ended = server_epoch(url)

    check_never_two_copies(url, runs, job_ids)
    assert check_ledger(url, runs, job_ids) == 0, "a job was reaped or fenced"
    ran = Counter(r["worker_id"] for r in sql(url, "SELECT worker_id FROM attempts"))
    assert ran == dict.fromkeys(ids, 2), ran
    for column, value in stored_times(url):
        assert started - WITHIN_S < value < ended + WITHIN_S, f"{column} is off the server clock"


def add_on_a_skewed_machine(url: str, runs: Path, how: str, skew: float) -> int:
    """`spoolctl add` from a machine whose clock is `skew` seconds off."""
    knobs = skewed(how, skew)
    launcher = knobs.pop("launcher", SPOOLCTL)
    script = f"echo ran >> {runs}/skewed.log"
    result = subprocess.run(
        [*launcher, "add", "--db", url, "--json", "-c", script],
        env=child_env(knobs),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return int(json.loads(result.stdout)["data"]["job_id"])


@pytest.mark.parametrize(
    ("how", "skew"),
    [("clock", +SKEW_S), ("knob", -SKEW_S)],
)
def test_a_job_added_on_a_skewed_machine_is_claimed_at_once(
    fleet: PgFleet, runs: Path, how: str, skew: float
) -> None:
    url = fleet.url
    submit_jobs(url, [])  # creates the queue
    worker = fleet.start("h")
    until(url, lambda: fleet.in_loop(worker), timeout=30, what="the worker in its loop")
    before = server_epoch(url)

    job_id = add_on_a_skewed_machine(url, runs, how, skew)

    row = sql(url, "SELECT created_at, next_run_at FROM jobs WHERE id = %s", (job_id,))[0]
    until(url, lambda: states(url) == {"done": 1}, timeout=10, what="the skewed job to run")
    after = server_epoch(url)
    assert before - WITHIN_S < row["created_at"] < after + WITHIN_S, (row, before)
    assert row["next_run_at"] < after, (row, after)
    assert (runs / "skewed.log").read_text() == "ran\n"
    assert fleet.stop(worker) == 0, worker.output()


@pytest.mark.parametrize(("how", "skew"), [("clock", -SKEW_S), ("knob", +SKEW_S)])
def test_a_skewed_worker_reaps_a_dead_machines_job_when_its_lease_ends(
    fleet: PgFleet, runs: Path, how: str, skew: float
) -> None:
    """Worker h dies (SIGKILL) running a job; worker m, whose clock is ten
    minutes off, requeues it neither before h's lease is over (as a clock ahead
    would) nor long after (as a clock behind would), then runs it."""
    url = fleet.url
    # attempt 1 runs until h's death ends it: m's start may take longer than a
    # short job on a loaded machine, and the job must still be running at the kill
    spec = job_spec(runs, 2.0)
    first_waits = 'if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then set -- "$1" 600; fi\n'
    spec = spec._replace(argv=[*spec.argv[:2], first_waits + spec.argv[2], *spec.argv[3:]])
    (job_id,) = submit_jobs(url, [spec])
    h = fleet.start("h")
    until(url, lambda: running_of(url, h.worker_id), timeout=30, what="h to run the job")
    m = fleet.start("m", **skewed(how, skew))
    until(url, lambda: fleet.in_loop(m), timeout=30, what="m in its loop")
    h.signal(signal.SIGKILL)

    until_all_done(url, runs, 1, timeout=30)
    assert fleet.stop(m) == 0, m.output()

    (last_beat,) = sql(url, "SELECT heartbeat_at FROM workers WHERE id = %s", (h.worker_id,))
    (reaped,) = sql(url, "SELECT at, worker_id FROM job_events WHERE event = 'reaped'")
    assert reaped["worker_id"] == m.worker_id
    silence = reaped["at"] - last_beat["heartbeat_at"]
    assert HANG_S < silence < HANG_S + 3.0, f"reaped after {silence:.1f}s of silence"
    check_never_two_copies(url, runs, [job_id])
    assert check_ledger(url, runs, [job_id]) == 1
