"""The submission loop (`submit`): N one-call submissions of `true`, one
process each, in a shell loop, the way a script hands a queue its work:

    i=0; while [ "$i" -lt N ]; do spoolctl add --db Q -- true >/dev/null || exit 1; ...; done

Ours and the reference interleaved A B B A, each loop on a fresh queue that
already exists (made by one `add`, untimed); task-spooler (`tsp`, or `ts`
where that is task-spooler) and nq beside them where installed, as context:
they keep no database, and task-spooler's server runs each job as it comes.
Per loop: its wall time, and the CPU of every process it started (the shell
and each call; getrusage of the reaped children), per call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
from filesystems import Target
from fixtures import IMPLS, BenchError, Impl, clean_env, count_state, fresh_dir, seed, workdir
from interleave import Arm, Sample, run_blocks, spread
from plan import Plan

SHELL = "/bin/sh"
LOOP = 'i=0; while [ "$i" -lt "$CALLS" ]; do "$@" >/dev/null || exit 1; i=$((i + 1)); done'
"""The loop: `sh -c LOOP sh COMMAND...` runs COMMAND $CALLS times and stops at
the first failure."""
TASK_SPOOLER = ("tsp", "ts")
"""Debian installs task-spooler as `tsp` (moreutils' `ts` is another program)."""
TS_BANNER = "Task Spooler"
LOOP_TIMEOUT_S = 900.0


def submission_loop(plan: Plan, target: Target) -> dict[str, Any]:
    """plan.submit_calls submissions per loop, ours, the reference and the
    context tools interleaved A B B A, plan.submit_reps blocks."""
    calls = plan.submit_calls
    context, skipped = _context_tools()
    with workdir("submit", target.root) as scratch:
        arms = [Arm(impl.name, _spoolctl_arm(impl, calls, scratch)) for impl in IMPLS]
        arms += [Arm(name, _tool_arm(name, argv, calls, scratch)) for name, argv in context]
        records = run_blocks(arms, plan.submit_reps, f"{calls} submissions on {target.describe()}")
    return {
        "filesystem": target.facts(),
        "calls": calls,
        "loop": [SHELL, "-c", LOOP, "sh", "COMMAND..."],
        "commands": {
            **{impl.name: [str(impl.cli), "add", "--db", "Q", "--", "true"] for impl in IMPLS},
            **{name: [*argv, "true"] for name, argv in context},
        },
        "skipped": skipped,
        "arms": {
            a.name: {
                "loop_s": spread(records.values(a.name)),
                "wall_ms_per_call": spread(records.values(a.name, "wall_ms_per_call")),
                "cpu_ms_per_call": spread(records.values(a.name, "cpu_ms_per_call")),
            }
            for a in arms
        },
        "ratios_ours_to_ref": {
            "loop_s": spread(records.ratios("ours", "ref")),
            "cpu_ms_per_call": spread(records.ratios("ours", "ref", "cpu_ms_per_call")),
        },
        "errors": records.errors,
        "samples": records.samples,
        "method": "one `sh -c` loop of CALLS submissions, stopping at the first failure; "
        "loop_s: from starting the shell to its exit; cpu_ms_per_call: the CPU (user + "
        "system) of the shell and every process it waited for, from getrusage of the "
        "benchmark's reaped children, over CALLS. spoolctl: a fresh queue per loop, made "
        "by one untimed `add`, must hold CALLS + 1 queued jobs after it. task-spooler: "
        "its own TS_SOCKET (in a fresh folder of the system's temp folder: a socket's "
        "path is short) and TMPDIR (its output files: in the measured folder), its "
        "server started before the loop (untimed), waited for until its last job has "
        "run (`-w`) and killed after; the CPU of its server and of the processes each "
        "call leaves to run its job (reaped by the benchmark as their subreaper) is "
        "background_cpu_ms_per_call, not in cpu_ms_per_call. nq: its own NQDIR; each "
        "call forks its job and returns; the jobs, reaped the same way, are its "
        "background_cpu_ms_per_call.",
    }


def _context_tools() -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """The context arms found on PATH, and why the others are left out."""
    found: list[tuple[str, list[str]]] = []
    skipped: dict[str, str] = {}
    spooler = _task_spooler()
    if spooler is None:
        skipped["task-spooler"] = (
            f"not installed: none of {', '.join(TASK_SPOOLER)} on PATH is task-spooler"
        )
    else:
        found.append(("task-spooler", [spooler]))
    nq = shutil.which("nq")
    if nq is None:
        skipped["nq"] = "not installed: no `nq` on PATH"
    else:
        found.append(("nq", [nq]))
    return found, skipped


def _task_spooler() -> str | None:
    """The path of task-spooler's client, told apart from moreutils' `ts` by
    its version banner (`-V`; moreutils' `ts` would read its standard input,
    which is empty here)."""
    for name in TASK_SPOOLER:
        path = shutil.which(name)
        if path is None:
            continue
        try:
            proc = subprocess.run(
                [path, "-V"],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if TS_BANNER in proc.stdout + proc.stderr:
            return path
    return None


def _spoolctl_arm(impl: Impl, calls: int, scratch: Path) -> Callable[[], Sample]:
    def run() -> Sample:
        d = fresh_dir(f"submit-{impl.name}", scratch)
        db = d / "q.db"
        seed(impl, db, d)
        env = impl.environ(clean_env())
        sample = timed_loop([str(impl.cli), "add", "--db", str(db), "--", "true"], calls, d, env)
        queued = count_state(db, "queued")
        if queued != calls + 1:
            raise BenchError(f"{impl.name}: {queued} jobs queued after {calls} + 1 submissions")
        return sample

    return run


def _tool_arm(name: str, argv: Sequence[str], calls: int, scratch: Path) -> Callable[[], Sample]:
    def run() -> Sample:
        d = fresh_dir(f"submit-{name}", scratch)
        if name == "task-spooler":
            return _task_spooler_loop(argv, calls, d)
        return _nq_loop(argv, calls, d)

    return run


def _task_spooler_loop(argv: Sequence[str], calls: int, d: Path) -> Sample:
    """The loop against a server of its own, started first (untimed) and
    killed after. Each call's client forks a process that stays to run the
    job once the server says so; the benchmark is their subreaper while the
    arm runs, so those processes and the server are reaped here, and their
    CPU (the server's, running the jobs) is counted apart."""
    with tempfile.TemporaryDirectory(prefix="bench-ts-") as short, _subreaper():
        # a socket's path has at most 107 bytes: the scratch folder's may be longer
        env = {**clean_env(), "TS_SOCKET": str(Path(short) / "socket"), "TMPDIR": str(d)}

        def tsp(*args: str) -> None:
            run = [*argv, *args]
            subprocess.run(run, cwd=d, env=env, capture_output=True, timeout=60, check=False)

        try:
            tsp("-S", "1")
            sample = timed_loop([*argv, "true"], calls, d, env)
            before = _children_cpu_s()
            tsp("-w")  # the last job: one slot, so every job has run
        finally:
            tsp("-K")
            _reap_orphans()
    sample["background_cpu_ms_per_call"] = 1000 * (_children_cpu_s() - before) / calls
    return sample


def _nq_loop(argv: Sequence[str], calls: int, d: Path) -> Sample:
    """The loop with a queue folder of its own; each call forks its job and
    returns: the jobs are reaped here, their CPU counted apart."""
    env = {**clean_env(), "NQDIR": str(d / "nq")}
    (d / "nq").mkdir()
    with _subreaper():
        try:
            sample = timed_loop([*argv, "true"], calls, d, env)
            before = _children_cpu_s()
        finally:
            _reap_orphans()
    sample["background_cpu_ms_per_call"] = 1000 * (_children_cpu_s() - before) / calls
    return sample


PR_SET_CHILD_SUBREAPER = 36
REAP_DEADLINE_S = 30.0


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """Orphans of the processes started inside (task-spooler's server and job
    runners) become this process's children, for _reap_orphans to reap."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise BenchError(f"prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _reap_orphans() -> None:
    """Reap every child left (none is a Popen's: they have all been waited
    for); those still alive at the deadline are killed first."""
    deadline = time.monotonic() + REAP_DEADLINE_S
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in psutil.Process().children():
                child.kill()
            deadline = float("inf")
        time.sleep(0.01)


def timed_loop(command: Sequence[str], calls: int, d: Path, env: dict[str, str]) -> Sample:
    """One loop of `calls` runs of command under /bin/sh; value: wall seconds."""
    before = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(
        [SHELL, "-c", LOOP, "sh", *command],
        cwd=d,
        env={**env, "CALLS": str(calls)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=LOOP_TIMEOUT_S,
        check=False,
    )
    wall = time.perf_counter() - start
    cpu = _children_cpu_s() - before
    if proc.returncode != 0:
        raise BenchError(
            f"`{os.path.basename(command[0])}` failed in the loop: exit {proc.returncode}, "
            f"stderr {proc.stderr[-400:]!r}"
        )
    return {
        "value": wall,
        "wall_ms_per_call": 1000 * wall / calls,
        "cpu_ms_per_call": 1000 * cpu / calls,
    }


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime
