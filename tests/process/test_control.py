"""`signal`, `suspend` and `continue`: a request written by any process that
reaches the queue, delivered by the worker that runs the job. Real workers,
real signals, real cgroups where the machine has them; every wait is for a
condition, and no timing is asserted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spoolctl.runner import containment
from tests.helpers import (
    NS_INIT,
    STARTED_WORKERS,
    UNSHARE,
    Db,
    Strays,
    add_job,
    attempts_of,
    child_env,
    cli_json,
    events_of,
    job,
    kill_worker_and_guard,
    needs_namespaces,
    patience,
    pid_alive,
    rows,
    run_as_worker,
    signal_taken,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.both_backends, pytest.mark.subprocess]

COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > "$D/count"; sleep 0.05; done'
"""A job that counts, one step every 50 ms, into $D/count."""


@pytest.fixture
def strays() -> Iterator[Strays]:
    kept = Strays()
    yield kept
    kept.kill()


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=patience(30))


def steer(db: Db, *args: str) -> dict[str, Any]:
    """A verb's envelope (any exit code)."""
    result = cli_json(*args, db=db)
    envelope: dict[str, Any] = json.loads(result.stdout)
    return envelope


def ok(db: Db, *args: str) -> dict[str, Any]:
    envelope = steer(db, *args)
    assert envelope["ok"], envelope["errors"]
    data: dict[str, Any] = envelope["data"]
    return data


def code(db: Db, *args: str) -> str:
    envelope = steer(db, *args)
    assert not envelope["ok"]
    return str(envelope["errors"][0]["code"])


def count(folder: Path) -> int:
    text = (folder / "count").read_text().strip() if (folder / "count").exists() else ""
    return int(text) if text.isdigit() else 0


def counting(db: Db, folder: Path, **spec: Any) -> int:
    """A counting job, once it has counted a few steps."""
    job_id = add_job(db, "sh", "-c", COUNTER, env={"D": str(folder)}, max_retries=0, **spec)
    wait_for(lambda: count(folder) >= 3, what="the job to count")
    return job_id


def beats(db: Db, times: int) -> None:
    """Wait until the job's worker has heartbeaten `times` more times: time
    passes, measured by the worker itself, with no fixed sleep."""
    sql = "SELECT heartbeat_at FROM workers ORDER BY heartbeat_at DESC"
    first = rows(db, sql)[0]["heartbeat_at"]
    seen = [first]

    def advanced() -> bool:
        now = rows(db, sql)[0]["heartbeat_at"]
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > times

    wait_for(advanced, what=f"{times} heartbeats")


def detail(db: Db, job_id: int, event: str) -> dict[str, Any]:
    sql = "SELECT detail FROM job_events WHERE job_id = ? AND event = ? ORDER BY id"
    found: dict[str, Any] = json.loads(rows(db, sql, (job_id, event))[-1]["detail"])
    return found


LEAVER = r"""
trap 'echo got >> "$D/leader"' USR1
setsid sh -c 'trap "echo got >> \"$D/grandchild\"" USR1; echo $$ > "$D/gpid";
  while :; do sleep 0.05; done' &
while :; do sleep 0.05; done
"""
"""A leader that starts a grandchild in a session of its own (out of its
process group); each records each USR1 it gets."""


@pytest.mark.parametrize("cells", ["auto", "off"])
def test_a_signal_reaches_a_grandchild_that_left_the_group(
    db: Db, tmp_path: Path, strays: Strays, cells: str
) -> None:
    """In a cgroup (`auto`, where the machine lets the worker make them) and
    without (`off`: the process group and the attempt token's holders)."""
    worker = start_worker(db, env={"SPOOLCTL_CGROUP": cells})
    try:
        job_id = add_job(db, "sh", "-c", LEAVER, env={"D": str(tmp_path)}, max_retries=0)
        gpid = tmp_path / "gpid"
        wait_for(lambda: gpid.exists() and gpid.read_text().strip(), what="the grandchild")
        strays.keep(int(gpid.read_text()))
        wait_for(lambda: attempts_of(db, job_id)[0]["job_pid"] is not None, what="the spawn")
        contained = attempts_of(db, job_id)[0]["cgroup"] is not None
        # where the machine gives no cgroup, `auto` too reaches the grandchild by its token
        assert contained == (cells == "auto" and containment.report().contained)
        data = ok(db, "signal", str(job_id), "--signal", "usr1")
        assert data["signal"] == "SIGUSR1" and data["delivered_at"] is not None
        assert data["attempt_id"] == attempts_of(db, job_id)[0]["id"]
        for who in ("leader", "grandchild"):
            wait_for(lambda w=who: (tmp_path / w).exists(), what=f"the {who}'s handler")
        assert "signaled" in events_of(db, job_id)
        assert detail(db, job_id, "signaled")["signal"] == "SIGUSR1"
        ok(db, "signal", str(job_id))  # TERM: the leader's group ends
        wait_for(lambda: job(db, job_id)["state"] == "dead", what="the job to end")
        for who in ("leader", "grandchild"):  # each process got it once
            assert (tmp_path / who).read_text() == "got\n"
    finally:
        stop(worker)


def test_the_requester_and_the_worker_in_different_pid_namespaces(db: Db, tmp_path: Path) -> None:
    """The worker runs in a PID namespace of its own: the requester (here)
    cannot see its processes, only the queue."""
    needs_namespaces()
    base = tmp_path / "ns"
    work = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--json"]
    popen = subprocess.Popen(
        [*UNSHARE, "sh", "-c", NS_INIT, str(base), *work],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    STARTED_WORKERS.append(popen)  # type: ignore[arg-type]
    try:
        script = 'trap \'echo "$$" > "$D/got"; exit 0\' USR1; echo $$ > "$D/pid"; '
        script += "while :; do sleep 0.05; done"
        job_id = add_job(db, "sh", "-c", script, env={"D": str(tmp_path)})
        wait_for(lambda: (tmp_path / "pid").exists(), what="the job to start")
        data = ok(db, "signal", str(job_id), "--signal", "USR1")
        assert data["delivered_at"] is not None
        wait_for(lambda: job(db, job_id)["state"] == "done", what="the job to end on USR1")
        assert (tmp_path / "got").read_text() == (tmp_path / "pid").read_text()
    finally:
        popen.kill()
        popen.wait(timeout=patience(10))


@pytest.mark.parametrize("cells", ["auto", "off"])
def test_suspend_stops_a_counting_job_and_continue_lets_it_go_on(
    db: Db, tmp_path: Path, cells: str
) -> None:
    """Frozen in its cgroup where it has one; SIGSTOPped with `off`."""
    worker = start_worker(db, env={"SPOOLCTL_CGROUP": cells})
    try:
        job_id = counting(db, tmp_path)
        data = ok(db, "suspend", str(job_id))
        assert data["action"] == "suspend" and data["delivered_at"] is not None
        assert job(db, job_id)["suspended_at"] is not None
        stood = count(tmp_path)
        beats(db, 3)
        assert count(tmp_path) == stood  # frozen, or stopped: not a step more
        assert job(db, job_id)["state"] == "running"  # and not reaped: its worker beats
        assert code(db, "suspend", str(job_id)) == "CONFLICT"
        ok(db, "continue", str(job_id))
        assert job(db, job_id)["suspended_at"] is None
        wait_for(lambda: count(tmp_path) > stood, what="the job to count again")
        assert detail(db, job_id, "continued")["suspended_s"] > 0
        assert code(db, "continue", str(job_id)) == "CONFLICT"
        ok(db, "signal", str(job_id))
        wait_for(lambda: job(db, job_id)["state"] == "dead", what="the job to end")
    finally:
        stop(worker)


def test_the_timeout_does_not_run_while_the_job_is_suspended(db: Db, tmp_path: Path) -> None:
    """A job that runs until it finds a file, suspended for longer than its
    10 s timeout, given the file and continued, ends done: its attempt lasted
    longer than the timeout on the wall clock, less its suspension. (10 s:
    what it runs before the suspend and after the continue, a CLI call each,
    stays well inside it on a loaded machine.)"""
    worker = start_worker(db)
    try:
        steps = 'until [ -e "$D/release" ]; do echo x >> "$D/steps"; sleep 0.05; done'
        job_id = add_job(db, "sh", "-c", steps, env={"D": str(tmp_path)}, timeout_seconds=10)
        wait_for(lambda: (tmp_path / "steps").exists(), what="the job to start")
        ok(db, "suspend", str(job_id))
        started = attempts_of(db, job_id)[0]["started_at"]
        sql = "SELECT heartbeat_at FROM workers ORDER BY heartbeat_at DESC"
        wait_for(lambda: rows(db, sql)[0]["heartbeat_at"] > started + 11, what="11 s suspended")
        assert job(db, job_id)["state"] == "running"
        (tmp_path / "release").touch()
        ok(db, "continue", str(job_id))
        wait_for(lambda: job(db, job_id)["state"] != "running", what="the job to end")
        (attempt,) = attempts_of(db, job_id)
        assert job(db, job_id)["state"] == "done", attempt["error"]
        suspended_s = detail(db, job_id, "continued")["suspended_s"]
        lasted = attempt["finished_at"] - attempt["started_at"]
        assert lasted > 10 and lasted - suspended_s < 10
    finally:
        stop(worker)


@pytest.mark.parametrize("cells", ["auto", "off"])
def test_a_suspended_job_whose_worker_is_killed_is_reaped_and_rerun_once(
    db: Db, tmp_path: Path, strays: Strays, cells: str
) -> None:
    env = {"SPOOLCTL_CGROUP": cells}
    first = start_worker(db, "--worker-id", "first", env=env)
    script = f'[ "$SPOOLCTL_ATTEMPT" = 1 ] || exit 0; echo $$ > "$D/pid"; {COUNTER}'
    job_id = add_job(db, "sh", "-c", script, env={"D": str(tmp_path)})
    wait_for(lambda: count(tmp_path) >= 3, what="the job to count")
    leader = strays.keep(int((tmp_path / "pid").read_text()))
    ok(db, "suspend", str(job_id))
    kill_worker_and_guard(first)
    second = start_worker(db, "--worker-id", "second", env=env)
    try:
        wait_for(lambda: job(db, job_id)["state"] == "done", what="the rerun")
        assert not pid_alive(leader)  # thawed and killed before the rerun
        ran = attempts_of(db, job_id)
        assert len(ran) == 2 and ran[1]["worker_id"] == "second"
        assert ran[0]["state"] != "succeeded" and ran[1]["state"] == "succeeded"
    finally:
        stop(second)


def test_a_workers_hard_stop_ends_a_suspended_job(db: Db, tmp_path: Path, strays: Strays) -> None:
    """A worker's second signal kills its suspended job as any (a frozen
    cgroup's, a stopped group's) and records a worker crash."""
    worker = start_worker(db)
    script = f'echo $$ > "$D/pid"; {COUNTER}'
    job_id = add_job(db, "sh", "-c", script, env={"D": str(tmp_path)}, max_crashes=0)
    wait_for(lambda: count(tmp_path) >= 3, what="the job to count")
    leader = strays.keep(int((tmp_path / "pid").read_text()))
    ok(db, "suspend", str(job_id))
    signal_taken(worker, signal.SIGTERM, "the worker's first stop signal")
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=patience(30))
    wait_for(lambda: not pid_alive(leader), what="the suspended job killed")
    (attempt,) = attempts_of(db, job_id)
    assert attempt["failure_reason"] == "worker_crash"


def test_cancel_running_ends_a_suspended_job(db: Db, tmp_path: Path) -> None:
    """Its first signal is seen: the worker lets the job go after sending it."""
    worker = start_worker(db)
    try:
        script = f"trap 'echo term > \"$D/term\"; exit 0' TERM; {COUNTER}"
        job_id = add_job(db, "sh", "-c", script, env={"D": str(tmp_path)})
        wait_for(lambda: count(tmp_path) >= 3, what="the job to count")
        ok(db, "suspend", str(job_id))
        ok(db, "cancel", str(job_id), "--running", "--yes")
        wait_for(lambda: (tmp_path / "term").exists(), what="the job's TERM handler")
        wait_for(lambda: attempts_of(db, job_id)[0]["finished_at"] is not None, what="the attempt")
        assert job(db, job_id)["state"] == "canceled"
    finally:
        stop(worker)


def test_bad_requests_get_their_code_and_change_nothing(db: Db, tmp_path: Path) -> None:
    queued = add_job(db, "true")
    before = rows(db, "SELECT COUNT(*) AS n FROM job_events")[0]["n"]
    assert code(db, "signal", str(queued), "--signal", "NOPE") == "INVALID_INPUT"
    assert code(db, "signal", str(queued), "--signal", "STOP") == "INVALID_INPUT"
    assert code(db, "signal", str(queued), "--signal", "CONT") == "INVALID_INPUT"
    assert code(db, "signal", str(queued)) == "CONFLICT"
    assert code(db, "suspend", str(queued)) == "CONFLICT"
    assert code(db, "continue", str(queued)) == "CONFLICT"
    assert code(db, "signal", "999") == "NOT_FOUND"
    assert code(db, "suspend", "999") == "NOT_FOUND"
    ok(db, "cancel", str(queued))
    assert code(db, "signal", str(queued)) == "CONFLICT"
    assert rows(db, "SELECT COUNT(*) AS n FROM control_requests")[0]["n"] == 0
    after = rows(db, "SELECT COUNT(*) AS n FROM job_events")[0]["n"]
    assert after == before + 1  # the cancel's event alone


def test_a_request_whose_attempt_ends_first_is_a_conflict(
    db: Db, tmp_path: Path, strays: Strays
) -> None:
    """No worker delivers it (none runs): the attempt ends under it (a
    forced retry), and the waiting requester answers CONFLICT."""
    worker = start_worker(db)
    script = f'echo $$ > "$D/pid"; {COUNTER}'
    job_id = add_job(db, "sh", "-c", script, env={"D": str(tmp_path)})
    wait_for(lambda: count(tmp_path) >= 3, what="the job to count")
    strays.keep(int((tmp_path / "pid").read_text()))
    kill_worker_and_guard(worker)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "signal", str(job_id), "--db", str(db), "--json"],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: rows(db, "SELECT COUNT(*) AS n FROM control_requests")[0]["n"] == 1)
    ok(db, "retry", str(job_id), "--force")
    out, _ = waiting.communicate(timeout=patience(30))
    envelope = json.loads(out)
    assert envelope["errors"][0]["code"] == "CONFLICT"
    (req,) = rows(db, "SELECT result FROM control_requests")
    assert req["result"] == "attempt_ended"
    assert "signaled" not in events_of(db, job_id)
    ok(db, "cancel", str(job_id))


def test_a_request_no_worker_settles_is_a_timeout_and_stays(db: Db) -> None:
    """The job's worker died and no other worker runs to reap it: the
    requester gives up after its patience (TIMEOUT, exit 4) and says so;
    the request stays unsettled, for the worker should it beat again."""
    job_id = add_job(db, "sleep", "100")
    run_as_worker(db, job_id, suspended=False)
    result = cli_json("signal", str(job_id), db=db)
    assert result.exit_code == 4, result.stdout + result.stderr
    error = json.loads(result.stdout)["errors"][0]
    assert error["code"] == "TIMEOUT"
    assert error["detail"]["job_id"] == job_id
    assert "spoolctl workers" in error["remediation"]
    (req,) = rows(db, "SELECT settled_at, result FROM control_requests")
    assert (req["settled_at"], req["result"]) == (None, None)
    assert job(db, job_id)["state"] == "running"
