"""Jobs started by os.posix_spawn (spoolctl/runner/spawn.py) get what Popen gave them.

Every test starts real jobs, most of them both ways (`posix`: the worker's
Spawner; `popen`: the same Spawner without close_range, so every job goes
through subprocess.Popen as before) and compares: only descriptors 0, 1 and
2, even while the worker holds inheritable ones; default signal dispositions
and an empty mask while the worker ignores and blocks some; the same
environment, bytes for bytes; the program found on the job's own PATH; the
same `spawn failed: ...` outcome for a program that cannot run; a session
of its own. Last, a real `spoolctl work` drains jobs through posix_spawn.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from spoolctl.runner import spawn
from spoolctl.runner.capacity import Place
from spoolctl.runner.supervise import Execution, job_environment
from spoolctl.runner.wakeup import counting_signals
from spoolctl.services.claim import Claim
from spoolctl.services.outcome import Outcome
from spoolctl.states import FailureReason
from tests.helpers import REPO, Db, add_job, attempts_of, child_env, job, pid_alive, wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.subprocess]

SHOW_FDS = (
    "import json, os\n"
    "found = {}\n"
    "for name in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        found[name] = os.readlink('/proc/self/fd/' + name)\n"
    "    except OSError:\n"
    "        pass  # the listing's own descriptor, closed by now\n"
    "print(json.dumps({'fds': found, 'pid': os.getpid(), 'sid': os.getsid(0),"
    " 'pgid': os.getpgid(0)}))\n"
)
"""A job that prints its open descriptors (and where they lead) and its ids."""
STATUS_FIELDS = ("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")
NAMEABLE = sum(1 << (number - 1) for number in signal.valid_signals())
"""The signals a program can set or name through its C library: all but
glibc's own two (kernel numbers 32 and 33), which glibc's posix_spawn leaves
ignored in the child (see spoolctl/runner/spawn.py) and glibc refuses to anyone else."""
POSIX_AND_POPEN = pytest.mark.parametrize("way", ["posix", "popen"])


def spawner_for(way: str) -> spawn.Spawner:
    cloexec = spawn.cloexec_from_3() if way == "posix" else None
    spawner = spawn.Spawner(cloexec)
    if way == "posix":
        assert spawner.uses_posix_spawn, "this machine has posix_spawn and close_range"
    return spawner


def claim_for(tmp_path: Path, argv: list[str], **fields: object) -> Claim:
    n = len(list(tmp_path.glob("*.stdout"))) + 1
    values: dict[str, object] = {
        "job_id": n,
        "attempt_id": n,
        "attempt_no": 1,
        "argv": argv,
        "cwd": None,
        "env": {},
        "timeout_seconds": 60,
        "queue": "default",
        "stdout_path": str(tmp_path / f"{n}.stdout"),
        "stderr_path": str(tmp_path / f"{n}.stderr"),
        "token": f"test/{n}/0.0",
    }
    values.update(fields)
    return Claim(**values)  # type: ignore[arg-type]  # (the tests are not type-checked)


def run(spawner: spawn.Spawner, claim: Claim) -> tuple[Execution, Outcome]:
    """Start the claim's job as the worker does and wait for its outcome."""
    execution = Execution(claim, Place((0,)))
    execution.start(dict(os.environb), "w-test", 0.0, spawner)
    if execution.proc is not None:
        execution.proc.wait()
    outcome = execution.poll(0.0)
    assert outcome is not None
    execution.wait_blocking()
    return execution, outcome


def stdout_of(execution: Execution) -> str:
    return Path(execution.claim.stdout_path).read_text()


@contextmanager
def inheritable_descriptors(tmp_path: Path) -> Iterator[list[int]]:
    """Descriptors the worker holds inheritable, as a C library might leave
    them: a file, a pipe, one numbered high; and its own stdin a pipe (not
    /dev/null, as it may be under pytest), so the job's must be made so."""
    handle = open(tmp_path / "held", "wb")  # noqa: SIM115 - closed below
    read_fd, write_fd = os.pipe()
    high = os.dup2(read_fd, 200)
    fds = [handle.fileno(), read_fd, write_fd, high]
    for fd in fds:
        os.set_inheritable(fd, True)
    stdin = os.dup(0)
    os.dup2(read_fd, 0)
    try:
        yield fds
    finally:
        os.dup2(stdin, 0)
        os.close(stdin)
        handle.close()
        for fd in (read_fd, write_fd, high):
            os.close(fd)


@POSIX_AND_POPEN
def test_the_job_gets_descriptors_0_1_2_only(way: str, tmp_path: Path) -> None:
    spawner = spawner_for(way)
    claim = claim_for(tmp_path, [sys.executable, "-c", SHOW_FDS])
    with inheritable_descriptors(tmp_path) as held:
        execution, outcome = run(spawner, claim)
        for fd in held:  # still the worker's: marked close-on-exec, not closed
            os.fstat(fd)
    assert outcome.reason is None, outcome
    seen = json.loads(stdout_of(execution))
    assert seen["fds"] == {
        "0": os.devnull,
        "1": claim.stdout_path,
        "2": claim.stderr_path,
    }
    assert (spawner.spawned_posix, spawner.spawned_popen) == ((1, 0) if way == "posix" else (0, 1))


@contextmanager
def worker_signals_disturbed() -> Iterator[None]:
    """The worker ignores some signals (Python ignores SIGPIPE and SIGXFSZ
    already), catches its stop signals, and blocks some."""
    blocked = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM}
    with counting_signals():  # restores SIGINT and SIGTERM as they were
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def signal_status(text: str) -> dict[str, int]:
    """The signal masks of /proc/PID/status, ignores of glibc's own two left out."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in STATUS_FIELDS:
            fields[name] = int(value.strip(), 16) & NAMEABLE
    assert set(fields) == set(STATUS_FIELDS), fields
    return fields


def test_the_job_starts_with_default_signals_and_an_empty_mask(tmp_path: Path) -> None:
    """cat reads its own status: what it inherited through the spawn."""
    claim = claim_for(tmp_path, ["cat", "/proc/self/status"])
    with worker_signals_disturbed():
        execution, outcome = run(spawner_for("posix"), claim)
        worker = Path("/proc/self/status").read_text()
    assert outcome.reason is None, outcome
    assert "SigBlk:\t0000000000000000" not in worker, "the worker did block signals"
    assert "SigIgn:\t0000000000000000" not in worker, "the worker did ignore signals"
    assert signal_status(stdout_of(execution)) == dict.fromkeys(STATUS_FIELDS, 0)


def test_signals_match_popens_for_a_worker_as_it_runs(tmp_path: Path) -> None:
    """With the worker's own handlers installed (and nothing blocked, as in a
    worker), the job sees exactly what a Popen child saw."""
    seen = {}
    with counting_signals():
        for way in ("posix", "popen"):
            execution, _ = run(spawner_for(way), claim_for(tmp_path, ["cat", "/proc/self/status"]))
            seen[way] = signal_status(stdout_of(execution))
    assert seen["posix"] == seen["popen"] == dict.fromkeys(STATUS_FIELDS, 0)


def test_the_environment_is_the_same_bytes_as_through_popen(tmp_path: Path) -> None:
    base = dict(os.environb)
    base[b"ODD_BYTES"] = b"\xff\xfe not UTF-8"
    base[b"EMPTY"] = b""
    env = {"WITH_EQUALS": "a=b=c", "SPACES": " x  y ", "PATH": os.environ["PATH"]}
    outputs = {}
    for way in ("posix", "popen"):
        claim = claim_for(tmp_path, ["env", "-0"], env=env, job_id=7, token="w-env/7/1.5")
        execution = Execution(claim, Place((3,)))
        execution.start(base, "w-env", 0.0, spawner_for(way))
        assert execution.proc is not None
        execution.proc.wait()
        execution.wait_blocking()
        outputs[way] = Path(claim.stdout_path).read_bytes()
    assert outputs["posix"] == outputs["popen"]
    got = dict(entry.split(b"=", 1) for entry in outputs["posix"].split(b"\0") if entry)
    assert got == job_environment(base, claim, "w-env", Place((3,)))


def program(folder: Path, name: str, says: str, *, mode: int = 0o755) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(mode)
    return path


@POSIX_AND_POPEN
def test_a_bare_name_is_found_on_the_jobs_own_path(way: str, tmp_path: Path) -> None:
    """The job's --env PATH is searched, not the worker's; a non-executable
    file earlier on it is passed over for an executable one later."""
    first, second = tmp_path / "first", tmp_path / "second"
    program(first, "greet", "not-me", mode=0o644)
    program(second, "greet", "from-second")
    path = f"{tmp_path / 'missing'}:{first}:{second}"
    execution, outcome = run(spawner_for(way), claim_for(tmp_path, ["greet"], env={"PATH": path}))
    assert outcome.reason is None, outcome
    assert stdout_of(execution) == "from-second\n"


def test_a_remembered_program_is_looked_up_again_when_it_moves(tmp_path: Path) -> None:
    """The PATH cache never runs a program Popen would not: one that went
    away is looked for again at once, one put earlier on PATH is found once
    the cache's second is up."""
    early, late = tmp_path / "early", tmp_path / "late"
    early.mkdir()
    path = f"{early}:{late}"
    spawner = spawner_for("posix")
    original = program(late, "greet", "late-1")

    def greet() -> str:
        execution, outcome = run(spawner, claim_for(tmp_path, ["greet"], env={"PATH": path}))
        assert outcome.reason is None, outcome
        return stdout_of(execution).strip()

    assert greet() == "late-1"
    original.rename(tmp_path / "late" / "moved")
    program(early, "greet", "early-1")
    assert greet() == "early-1", "the remembered path failed: looked up again"
    program(late, "greet", "late-2")
    (early / "greet").unlink()
    assert greet() == "late-2"
    program(early, "greet", "early-2")  # shadows late/greet, which still works
    assert greet() == "late-2", "within the cache's second the remembered one runs"
    real = spawn.time.monotonic
    clock = SimpleNamespace(monotonic=lambda: real() + spawn.PATH_CACHE_TTL_S)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spawn, "time", clock)
        assert greet() == "early-2", "past it, PATH is searched again"


@pytest.fixture
def unrunnable(tmp_path: Path) -> dict[str, list[str]]:
    """Programs that cannot be started, each a different way."""
    plain = tmp_path / "plain.txt"
    plain.write_text("echo hi\n")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02 not a program\n")
    garbage.chmod(0o755)
    bad_interpreter = tmp_path / "bad-interpreter"
    bad_interpreter.write_text("#!/no/such/interpreter\n")
    bad_interpreter.chmod(0o755)
    (tmp_path / "folder").mkdir()
    return {
        "missing by name": ["no-such-program-spoolctl"],
        "missing by path": [str(tmp_path / "no-such-program")],
        "not executable": [str(plain)],
        "a directory": [str(tmp_path / "folder")],
        "not a format the kernel runs": [str(garbage)],
        "missing interpreter": [str(bad_interpreter)],
        "an empty argument": [""],
    }


def test_a_program_that_cannot_start_fails_as_it_did_through_popen(
    tmp_path: Path, unrunnable: dict[str, list[str]]
) -> None:
    outcomes = {}
    for way in ("posix", "popen"):
        spawner = spawner_for(way)
        for what, argv in unrunnable.items():
            execution, outcome = run(spawner, claim_for(tmp_path, argv))
            assert execution.proc is None, what
            assert outcome.reason is FailureReason.SPAWN_FAILED, what
            assert outcome.exit_code is None, what
            assert outcome.error is not None and outcome.error.startswith("spawn failed: ["), what
            outcomes[way, what] = outcome.error
    for what in unrunnable:
        assert outcomes["posix", what] == outcomes["popen", what], what
    assert len({outcomes["posix", what] for what in unrunnable}) == len(unrunnable)
    assert outcomes["posix", "missing by name"] == (
        "spawn failed: [Errno 2] No such file or directory: 'no-such-program-spoolctl'"
    )
    assert "[Errno 13] Permission denied" in outcomes["posix", "not executable"]
    assert "[Errno 8] Exec format error" in outcomes["posix", "not a format the kernel runs"]
    children = psutil.Process().children()
    assert [c.pid for c in children if c.status() == psutil.STATUS_ZOMBIE] == [], "not reaped"


@POSIX_AND_POPEN
def test_the_job_leads_its_own_session_and_a_group_kill_ends_it(way: str, tmp_path: Path) -> None:
    spawner = spawner_for(way)
    execution, _ = run(spawner, claim_for(tmp_path, [sys.executable, "-c", SHOW_FDS]))
    seen = json.loads(stdout_of(execution))
    assert seen["sid"] == seen["pgid"] == seen["pid"] == execution.pid
    assert seen["sid"] != os.getsid(0)

    claim = claim_for(tmp_path, ["sh", "-c", "sleep 60 & echo $!; wait"])
    execution = Execution(claim, Place((0,)))
    execution.start(dict(os.environb), "w-test", 0.0, spawner)
    assert execution.proc is not None and execution.proc.poll() is None
    grandchild = int(wait_for(lambda: Path(claim.stdout_path).read_text().strip()))
    execution.kill_now()
    assert execution.proc.wait() == -signal.SIGKILL
    execution.wait_blocking()
    outcome = execution.poll(0.0)
    assert outcome is not None and outcome.signal == signal.SIGKILL
    assert not pid_alive(grandchild), "the group kill reached the job's child"


def test_a_job_with_a_working_directory_goes_through_popen(tmp_path: Path) -> None:
    folder = tmp_path / "jobdir"
    folder.mkdir()
    spawner = spawner_for("posix")
    execution, outcome = run(spawner, claim_for(tmp_path, ["pwd"], cwd=str(folder)))
    assert outcome.reason is None, outcome
    assert stdout_of(execution) == f"{folder}\n"
    assert (spawner.spawned_posix, spawner.spawned_popen) == (0, 1)
    _, missing = run(spawner, claim_for(tmp_path, ["pwd"], cwd=str(tmp_path / "gone")))
    assert missing.reason is FailureReason.SPAWN_FAILED


def test_a_worker_without_descriptor_0_goes_through_popen(tmp_path: Path) -> None:
    """With 0 free, the first output file lands on it: the file actions would
    clobber it, Popen copes."""
    spawner = spawner_for("posix")
    saved = os.dup(0)
    os.close(0)
    try:
        execution, outcome = run(spawner, claim_for(tmp_path, [sys.executable, "-c", SHOW_FDS]))
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert outcome.reason is None, outcome
    assert (spawner.spawned_posix, spawner.spawned_popen) == (0, 1)
    fds = json.loads(stdout_of(execution))["fds"]
    assert fds == {
        "0": os.devnull,
        "1": execution.claim.stdout_path,
        "2": execution.claim.stderr_path,
    }


@pytest.mark.both_backends
def test_a_real_worker_spawns_its_jobs_through_posix_spawn(db: Db, tmp_path: Path) -> None:
    """`spoolctl work --drain`, started with SIGUSR2 blocked and an
    inheritable descriptor of its parent's: its jobs see neither, nor the
    worker's database files or server connection. Through Popen the blocked
    signal would show in every job's mask (Popen passes the worker's on), so
    this fails if the worker stopped using posix_spawn."""
    status_jobs = [add_job(db, "cat", "/proc/self/status") for _ in range(5)]
    fd_jobs = [add_job(db, sys.executable, "-c", SHOW_FDS) for _ in range(5)]
    folder = tmp_path / "jobdir"
    folder.mkdir()
    cwd_job = add_job(db, "pwd", cwd=str(folder))
    inherited = open(tmp_path / "inherited", "wb")  # noqa: SIM115 - closed below
    work = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--drain", "--json"]
    blocked_then_work = (
        "import os, signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
        f"os.execv(sys.executable, {work!r})\n"
    )
    try:
        worker = subprocess.run(
            [sys.executable, "-c", blocked_then_work],
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=REPO,
            pass_fds=[inherited.fileno()],
            timeout=60,
        )
    finally:
        inherited.close()
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout)["data"]["executed"] == 11
    for job_id in [*status_jobs, *fd_jobs, cwd_job]:
        assert job(db, job_id)["state"] == "done", job_id
    for job_id in status_jobs:
        status = Path(attempts_of(db, job_id)[0]["stdout_path"]).read_text()
        assert signal_status(status) == dict.fromkeys(STATUS_FIELDS, 0), status
    for job_id in fd_jobs:
        (attempt,) = attempts_of(db, job_id)
        seen = json.loads(Path(attempt["stdout_path"]).read_text())
        assert seen["fds"] == {
            "0": os.devnull,
            "1": attempt["stdout_path"],
            "2": attempt["stderr_path"],
        }
        assert seen["sid"] == seen["pid"] == attempt["job_pid"]
    assert Path(attempts_of(db, cwd_job)[0]["stdout_path"]).read_text() == f"{folder}\n"
