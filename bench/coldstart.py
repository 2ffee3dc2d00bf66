"""What one process costs (`coldstart` and `idle`).

`coldstart`: `add`, `status`, `list` and `show` of ours and the reference as
fresh processes, beside Python's own start (`python -S -c pass` and `python
-c pass` of each venv's interpreter), all interleaved A B B A. Each process's
CPU (user + system, from wait4: the process's and that of any process it
waited for, nothing else's) and wall time, and ours/ref per pair. `add`
goes to a queue that already exists; `status`, `list` and `show` read a
queue of plan.small_table jobs (the bigtable mix), `show` its first job
(added and run by the implementation's own CLI: one attempt, its events).

`idle`: an empty `work --drain` (a queue whose one job has run: the start
and the end check, nothing to claim), CPU and wall as above; and an idle
loop-mode worker's resident memory (`work` on that empty queue, read from
/proc/PID/status once its `workers` row exists, where the schema has one,
and its VmRSS has not changed for IDLE_STEADY_S), ours and the reference
A B B A.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bigtable
from filesystems import Target
from fixtures import IMPLS, BenchError, Impl, clean_env, envelope_data, run_cli, seed, workdir
from interleave import Arm, Records, Sample, run_blocks, spread
from plan import Plan

VERBS: dict[str, tuple[str, ...]] = {
    "add": ("add", "--json", "--", "true"),
    "status": ("status", "--json"),
    "list": ("list", "--json", "--limit", "50"),
    "show": ("show", "--json", "1"),
}
PYTHON_START: dict[str, tuple[str, ...]] = {
    "python -S -c pass": ("-S", "-c", "pass"),
    "python -c pass": ("-c", "pass"),
}
BASE = "python -c pass"
"""What each verb is shown above, per pair: its own interpreter's start."""
PROCESS_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Ran:
    """One finished process: wall seconds, CPU seconds (from wait4), output."""

    wall_s: float
    cpu_s: float
    code: int
    out: str
    err: str


def run_measured(
    argv: Sequence[str], cwd: Path, env: dict[str, str], timeout: float = PROCESS_TIMEOUT_S
) -> Ran:
    """Start argv and wait for it with wait4, which returns that process's
    rusage (its own CPU and that of the processes it waited for); wall time
    from just before the spawn to its reaping. Output goes to files, so no
    pipe is read while it runs. Killed after timeout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return Ran(
            wall_s=wall,
            cpu_s=usage.ru_utime + usage.ru_stime,
            code=proc.returncode,
            out=out.read().decode(errors="replace"),
            err=err.read().decode(errors="replace"),
        )


def cli_sample(impl: Impl, args: Sequence[str], cwd: Path) -> Sample:
    """One CLI process of impl; value: its CPU seconds. BenchError unless its
    envelope is ok."""
    ran = run_measured(impl.argv(*args), cwd, impl.environ(clean_env()))
    envelope_data(impl, tuple(args), ran.code, ran.out, ran.err)
    return {"value": ran.cpu_s, "wall_s": ran.wall_s}


def _python_sample(impl: Impl, flags: Sequence[str], cwd: Path) -> Sample:
    ran = run_measured([str(impl.python), *flags], cwd, impl.environ(clean_env()))
    if ran.code != 0:
        raise BenchError(f"{impl.name}: python {' '.join(flags)} exit {ran.code}: {ran.err[-300:]}")
    return {"value": ran.cpu_s, "wall_s": ran.wall_s}


def cold_start(plan: Plan, target: Target) -> dict[str, Any]:
    """The four verbs and Python's start, both sides, interleaved A B B A."""
    with workdir("coldstart", target.root) as d:
        arms: list[Arm] = []
        for impl in IMPLS:
            queues = _queues(impl, d, plan.small_table)
            arms += [
                Arm(f"{impl.name} {name}", _bind_python(impl, flags, d))
                for name, flags in PYTHON_START.items()
            ]
            arms += [
                Arm(f"{impl.name} {verb}", _bind_cli(impl, _with_db(args, queues[verb]), d))
                for verb, args in VERBS.items()
            ]
        arms.sort(key=lambda a: a.name.split(" ", 1)[1])  # each verb's two sides side by side
        blocks = -(-plan.coldstart_samples // 2)
        records = run_blocks(arms, blocks, f"cold starts on {target.describe()}")
    names = [*PYTHON_START, *VERBS]
    return {
        "filesystem": target.facts(),
        "read_queue_jobs": plan.small_table,
        "commands": {verb: list(args) for verb, args in VERBS.items()},
        "arms": {
            a.name: {"cpu_s": spread(records.values(a.name)), "wall_s": _wall(records, a.name)}
            for a in arms
        },
        "ratios_ours_to_ref": {
            name: {
                "cpu": spread(records.ratios(f"ours {name}", f"ref {name}")),
                "wall": spread(records.ratios(f"ours {name}", f"ref {name}", "wall_s")),
            }
            for name in names
        },
        "over_python_start_cpu_s": {
            f"{impl.name} {verb}": spread(
                records.differences(f"{impl.name} {verb}", f"{impl.name} {BASE}")
            )
            for verb in VERBS
            for impl in IMPLS
        },
        "errors": records.errors,
        "samples": records.samples,
        "method": "each process started alone and reaped with wait4: cpu = its ru_utime + "
        "ru_stime (with those of any process it waited for), wall = from the spawn to "
        "the reaping; every verb's envelope must be ok. "
        "over_python_start: the verb's CPU minus its own interpreter's `python -c pass` of "
        "the same half-block.",
    }


def _queues(impl: Impl, d: Path, read_jobs: int) -> dict[str, Path]:
    """The add queue (made by one `add`) and the read queue (bigtable mix,
    its first job added and run by impl's own CLI: `show 1` reads it)."""
    add_db, read_dir = d / f"{impl.name}-add.db", d / f"{impl.name}-read"
    seed(impl, add_db, d)
    read_dir.mkdir()
    bigtable.build(impl, read_dir / "q.db", read_dir, read_jobs)
    read_db = read_dir / "q.db"
    return {"add": add_db, "status": read_db, "list": read_db, "show": read_db}


def _with_db(args: tuple[str, ...], db: Path) -> tuple[str, ...]:
    return (args[0], "--db", str(db), *args[1:])


def _bind_cli(impl: Impl, args: tuple[str, ...], d: Path) -> Callable[[], Sample]:
    return lambda: cli_sample(impl, args, d)


def _bind_python(impl: Impl, flags: tuple[str, ...], d: Path) -> Callable[[], Sample]:
    return lambda: _python_sample(impl, flags, d)


def _wall(records: Records, arm: str) -> dict[str, Any]:
    return spread(records.values(arm, "wall_s"))


# -- idle: an empty drain, an idle worker's memory -------------------------------------------

IDLE_STEADY_S = 1.0
"""An idle worker's VmRSS is read once it has not changed for this long."""
IDLE_POLL_S = 0.05
IDLE_DEADLINE_S = 20.0
EMPTY_DRAIN = ("work", "--json", "--drain")
IDLE_WORK = ("work", "--json")


def idle(plan: Plan, target: Target) -> dict[str, Any]:
    """An empty `work --drain` (CPU, wall) and an idle worker's VmRSS, ours
    and the reference interleaved A B B A, each on its own emptied queue."""
    with workdir("idle", target.root) as d:
        queues = {impl.name: _empty_queue(impl, d) for impl in IMPLS}
        drains = [Arm(f"{i.name} empty drain", _bind_drain(i, queues[i.name], d)) for i in IMPLS]
        workers = [Arm(f"{i.name} idle worker", _bind_idle(i, queues[i.name], d)) for i in IMPLS]
        blocks = -(-plan.idle_samples // 2)
        records = run_blocks([*drains, *workers], blocks, f"empty queues on {target.describe()}")
    return {
        "filesystem": target.facts(),
        "commands": {"empty drain": list(EMPTY_DRAIN), "idle worker": list(IDLE_WORK)},
        "empty_drain": {
            "arms": {
                a.name: {"cpu_s": spread(records.values(a.name)), "wall_s": _wall(records, a.name)}
                for a in drains
            },
            "ratios_ours_to_ref": {
                "cpu": spread(records.ratios("ours empty drain", "ref empty drain")),
                "wall": spread(records.ratios("ours empty drain", "ref empty drain", "wall_s")),
            },
        },
        "idle_worker": {
            "arms": {
                a.name: {
                    "rss_mb": spread(records.values(a.name)),
                    "hwm_mb": spread(records.values(a.name, "hwm_mb")),
                    "settled_s": spread(records.values(a.name, "settled_s")),
                }
                for a in workers
            },
            "ratios_ours_to_ref": spread(records.ratios("ours idle worker", "ref idle worker")),
            "unsettled": [s for s in records.samples if s.get("settled") is False],
        },
        "errors": records.errors,
        "samples": records.samples,
        "method": "empty drain: `work --drain --json` on a queue whose one job a first "
        "drain ran (untimed), reaped with wait4 (its CPU; it has no job to run). "
        "idle worker: `work --json` on the same queue, its VmRSS (and VmHWM) from "
        f"/proc/PID/status once it has registered (a `workers` row with its pid, where the "
        f"schema has that table) and its VmRSS has not changed for {IDLE_STEADY_S} s, "
        f"polled every {IDLE_POLL_S} s (settled false: read at the {IDLE_DEADLINE_S} s "
        "deadline instead); then SIGTERM.",
    }


def _empty_queue(impl: Impl, d: Path) -> Path:
    """A queue whose one job has run: made by `add`, drained once."""
    db = d / f"{impl.name}-empty.db"
    seed(impl, db, d)
    run_cli(impl, "work", "--db", str(db), "--drain", "--json", cwd=d)
    return db


def _bind_drain(impl: Impl, db: Path, d: Path) -> Callable[[], Sample]:
    return lambda: cli_sample(impl, _with_db(EMPTY_DRAIN, db), d)


def _bind_idle(impl: Impl, db: Path, d: Path) -> Callable[[], Sample]:
    return lambda: _idle_rss(impl, db, d)


def _idle_rss(impl: Impl, db: Path, d: Path) -> Sample:
    """Start a loop-mode worker, wait until it has registered and its RSS is
    steady, read VmRSS and VmHWM, stop it with SIGTERM."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            impl.argv(*_with_db(IDLE_WORK, db)),
            cwd=d,
            env=impl.environ(clean_env()),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        try:
            settled = _wait_steady(proc, db)
            status = _proc_status(proc.pid)
            took = time.monotonic() - start
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return {
            "value": status["VmRSS"] / 1024,
            "hwm_mb": status["VmHWM"] / 1024,
            "settled": settled,
            "settled_s": took,
        }


def _wait_steady(proc: subprocess.Popen[bytes], db: Path) -> bool:
    """Until the worker has registered (where the schema says how) and its
    VmRSS has been the same for IDLE_STEADY_S: True; at the deadline: False."""
    deadline = time.monotonic() + IDLE_DEADLINE_S
    registered = False
    rss, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the idle worker exited with {proc.returncode}")
        now_rss = _proc_status(proc.pid)["VmRSS"]
        now = time.monotonic()
        if now_rss != rss:
            rss, since = now_rss, now
        registered = registered or _registered(db, proc.pid)
        if registered and now - since >= IDLE_STEADY_S:
            return True
        time.sleep(IDLE_POLL_S)
    return False


def _registered(db: Path, pid: int) -> bool:
    """A `workers` row with this pid; True where the schema has no such table
    (0.4.11 keeps no worker rows: its memory steadying is all there is)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
            has = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'workers'"
            ).fetchone()
            if has is None:
                return True
            return (
                conn.execute("SELECT 1 FROM workers WHERE pid = ?", (pid,)).fetchone() is not None
            )
    except sqlite3.Error:
        return False


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of pid, kB."""
    found = {"VmRSS": 0, "VmHWM": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in found:
            found[key] = int(line.split()[1])
    return found
