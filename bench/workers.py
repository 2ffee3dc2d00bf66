"""Worker scenarios, each on one file system (bench/filesystems.py): drain
throughput (with peak memory) against the machine's ceiling, and idle CPU and
pickup latency of a loop-mode worker; ours and the reference interleaved."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ceiling
import psutil
from ceiling import NO_FILES, Layout
from filesystems import Target
from fixtures import (
    IMPLS,
    OURS,
    BenchError,
    Impl,
    clean_env,
    clone_queued,
    count_state,
    envelope_data,
    fresh_dir,
    percentile,
    run_cli,
    seed,
    workdir,
)
from interleave import Arm, Records, Sample, run_blocks, spread
from plan import Plan

DRAIN_SETUPS = (
    ("1 worker", 1, ()),
    ("2 workers", 2, ()),
    ("1 worker --concurrency 4", 1, ("--concurrency", "4")),
)
SETTLE_S = 2.0
PICKUP_DEADLINE_S = 15.0
STOP_DEADLINE_S = 15.0
START_STAMP = 'printf %s "$EPOCHREALTIME" > '
"""The job's command: bash's builtin clock, read as the job's first action."""


class PeakRss(threading.Thread):
    """Samples a process's resident set every 10 ms, and its kernel-kept peak
    (VmHWM in /proc/PID/status), until the process exits."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.max_rss = 0
        self.hwm = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.max_rss = max(self.max_rss, self.proc.memory_info().rss)
                self.hwm = max(self.hwm, _vm_hwm(self.proc.pid))
            except (psutil.Error, OSError, ValueError):
                return
            time.sleep(0.01)


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def drain(plan: Plan, target: Target, layout: Layout) -> dict[str, Any]:
    """On one file system: ours and the reference draining with 1 and 2
    workers, ours with --concurrency 4, and the machine's ceilings (spawn
    alone; spawn + ours' per-attempt files, 1 and 2 loops), all interleaved.
    Every arm's folder stays until the end (see fixtures.fresh_dir)."""
    concurrency = supports(OURS, "work", "--concurrency")
    with workdir(f"drain-{target.label}", target.root) as scratch:
        arms = _drain_arms(plan, scratch, layout, concurrency)
        records = run_blocks(arms, plan.drain_reps, f"drain on {target.describe()}")
    return {
        "filesystem": target.facts(),
        "jobs": plan.drain_jobs,
        "ceiling_layout": layout.facts(),
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "ratios_ours_to_ref": _drain_ratios(records),
        "fraction_of_ceiling": _ceiling_fractions(records),
        "peak_rss_mb": _peak_rss(records),
        "errors": records.errors,
        "samples": records.samples,
    }


CEILING_SPAWN = "ceiling: spawn"
CEILING_FILES_1 = "ceiling: spawn + files, 1 loop"
CEILING_FILES_2 = "ceiling: spawn + files, 2 loops"
RELEVANT_CEILING = {"1 worker": CEILING_FILES_1, "2 workers": CEILING_FILES_2}
"""The ceiling a drain is compared with: as many loops as workers, with ours' files."""


def _drain_arms(plan: Plan, scratch: Path, layout: Layout, concurrency: bool) -> list[Arm]:
    arms = [
        Arm(f"{impl.name} {label}", _drain_arm(impl, plan.drain_jobs, n, extra, scratch))
        for label, n, extra in DRAIN_SETUPS
        for impl in IMPLS
        if not extra or (impl is OURS and concurrency)
    ]
    return arms + [
        Arm(name, _ceiling_arm(scratch, lay, loops, plan.ceiling_spawns))
        for name, lay, loops in (
            (CEILING_SPAWN, NO_FILES, 1),
            (CEILING_FILES_1, layout, 1),
            (CEILING_FILES_2, layout, 2),
        )
    ]


def _drain_arm(
    impl: Impl, jobs: int, workers: int, extra: tuple[str, ...], scratch: Path
) -> Callable[[], Sample]:
    return lambda: _drain_once(impl, jobs, workers, extra, scratch)


def _ceiling_arm(scratch: Path, lay: Layout, loops: int, spawns: int) -> Callable[[], Sample]:
    return lambda: ceiling.sample(scratch, lay, spawns, loops)


def _drain_ratios(records: Records) -> dict[str, Any]:
    return {
        label: spread(records.ratios(f"ours {label}", f"ref {label}"))
        for label, _, extra in DRAIN_SETUPS
        if not extra
    }


def _ceiling_fractions(records: Records) -> dict[str, Any]:
    """Each drain's jobs/s over the ceiling measured in the same half-block."""
    out: dict[str, Any] = {}
    for label, ceiling_arm in RELEVANT_CEILING.items():
        for impl in IMPLS:
            out[f"{impl.name} {label}"] = {
                "of": ceiling_arm,
                **spread(records.ratios(f"{impl.name} {label}", ceiling_arm)),
            }
    return out


def _peak_rss(records: Records) -> dict[str, float]:
    return {
        impl.name: max(records.values(f"{impl.name} 1 worker", "peak_rss_mb"), default=0.0)
        for impl in IMPLS
    }


def supports(impl: Impl, verb: str, flag: str) -> bool:
    proc = subprocess.run(
        impl.argv(verb, "--help"),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    return flag in proc.stdout


def _drain_once(
    impl: Impl, jobs: int, workers: int, extra: tuple[str, ...], scratch: Path
) -> Sample:
    """Fill a queue with `jobs` due `true` jobs, start `workers` drain workers
    at once, and time until the last one exits."""
    d = fresh_dir(f"drain-{impl.name}", scratch)
    db = d / "q.db"
    seed(impl, db, d)
    clone_queued(db, jobs, time.time())
    argv = impl.argv("work", "--db", str(db), "--drain", "--json", *extra)
    logs = [(d / f"out{i}", d / f"err{i}") for i in range(workers)]
    with contextlib.ExitStack() as files:
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                argv,
                cwd=d,
                env=clean_env(),
                stdin=subprocess.DEVNULL,
                stdout=files.enter_context(out.open("w")),
                stderr=files.enter_context(err.open("w")),
            )
            for out, err in logs
        ]
        sampler = PeakRss(procs[0].pid)
        sampler.start()
        codes = [p.wait(timeout=600) for p in procs]
        wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    executed = sum(
        envelope_data(impl, tuple(argv[1:]), code, out.read_text(), err.read_text())["executed"]
        for code, (out, err) in zip(codes, logs, strict=True)
    )
    done = count_state(db, "done")
    if done != jobs:
        raise BenchError(f"{impl.name}: drain left {jobs - done} of {jobs} jobs not done")
    return {
        "value": jobs / wall,
        "wall_s": wall,
        "executed": executed,
        "peak_rss_mb": max(sampler.max_rss, sampler.hwm) / 2**20,
    }


def pickup_and_idle(plan: Plan, target: Target) -> dict[str, Any]:
    """On one file system: a loop-mode worker of ours and one of the reference
    (default settings, each on its own queue) run side by side. First the idle
    CPU of both over the same window, then pickup latency samples, ours and
    the reference interleaved A B B A."""
    with contextlib.ExitStack() as stack:
        running = {
            impl.name: _start_idle_worker(
                impl, stack.enter_context(workdir(f"pickup-{impl.name}", target.root)), stack
            )
            for impl in IMPLS
        }
        time.sleep(SETTLE_S)
        idle = idle_cpu({name: w.proc.pid for name, w in running.items()}, plan.idle_s)
        arms = [Arm(name, w.next_sample) for name, w in running.items()]
        records = run_blocks(arms, -(-plan.pickup_samples // 2), f"pickup on {target.describe()}")
    return {
        "filesystem": target.facts(),
        "idle_cpu_pct_of_core": idle,
        "idle_window_s": plan.idle_s,
        "arms": {name: _latency_summary(records, name) for name in running},
        "ratios_ours_to_ref": spread(records.ratios("ours", "ref")),
        "errors": records.errors,
        "worker_exit_code_after_sigterm": {n: w.stop_code for n, w in running.items()},
        "samples": records.samples,
        "method": "job runs bash -c 'printf %s \"$EPOCHREALTIME\" > FILE' (its first action); "
        "pickup = that stamp - time.time() taken right after the `add` process exited "
        "(negative: the job started before `add` finished exiting); from_submit = that stamp "
        "- the submit time `add` reported (data.next_run_at, stamped inside its transaction, "
        "before commit); nothing subtracted. Both workers run all along, each idle while "
        "the other's job is picked up.",
    }


def _latency_summary(records: Records, arm: str) -> dict[str, Any]:
    ms = records.values(arm)
    from_submit = records.values(arm, "from_submit_ms")
    if not ms:
        return {"n": 0}
    return {
        **spread(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "from_submit_p50_ms": percentile(from_submit, 50),
        "from_submit_p95_ms": percentile(from_submit, 95),
    }


class IdleWorker:
    """A loop-mode worker on its own queue, and the pickup samples taken from it."""

    def __init__(self, impl: Impl, d: Path) -> None:
        self.impl, self.d, self.db = impl, d, d / "q.db"
        seed(impl, self.db, d)
        self.proc = subprocess.Popen(
            impl.argv("work", "--db", str(self.db), "--json"),
            cwd=d,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=(d / "out").open("w"),
            stderr=(d / "err").open("w"),
        )
        self.taken = 0
        self.stop_code: int | None = None

    def next_sample(self) -> Sample:
        self.taken += 1
        latency, from_submit = _one_pickup(self.impl, self.db, self.d, self.taken, self.proc)
        return {"value": latency * 1000, "from_submit_ms": from_submit * 1000}

    def stop(self) -> None:
        self.stop_code = _stop(self.proc)


def _start_idle_worker(impl: Impl, d: Path, stack: contextlib.ExitStack) -> IdleWorker:
    worker = IdleWorker(impl, d)
    stack.callback(worker.stop)
    _wait_for(lambda: count_state(worker.db, "done") == 1, "the seed job to finish", worker.proc)
    return worker


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU time (user + system) of each process over the same wall window,
    in % of one core."""
    procs = {name: psutil.Process(pid) for name, pid in pids.items()}
    before = {name: p.cpu_times() for name, p in procs.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {name: p.cpu_times() for name, p in procs.items()}
    wall = time.monotonic() - t0
    return {
        name: 100.0
        * ((after[name].user + after[name].system) - (before[name].user + before[name].system))
        / wall
        for name in procs
    }


_gap = random.Random(6)


def _one_pickup(
    impl: Impl, db: Path, d: Path, i: int, worker: subprocess.Popen[bytes]
) -> tuple[float, float]:
    """(start - `add` returned, start - the job's submit time stamped by `add`)."""
    marker = d / f"started-{i}"
    _, data = run_cli(
        impl, "add", "--db", str(db), "--json", "--", "bash", "-c", START_STAMP + str(marker), cwd=d
    )
    returned = time.time()
    _wait_for(lambda: _stamp(marker) is not None, f"job {i} to start", worker)
    started = _stamp(marker)
    assert started is not None
    time.sleep(_gap.uniform(0.05, 0.3))  # random phase against any poll period
    return started - returned, started - float(data["next_run_at"])


def _stamp(marker: Path) -> float | None:
    try:
        text = marker.read_text().strip().replace(",", ".")
        return float(text) if text else None
    except (OSError, ValueError):
        return None


def _wait_for(cond: Any, what: str, worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + PICKUP_DEADLINE_S
    while not cond():
        if worker.poll() is not None:
            raise BenchError(f"worker exited with {worker.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise BenchError(f"gave up after {PICKUP_DEADLINE_S}s waiting for {what}")
        time.sleep(0.001)


def _stop(worker: subprocess.Popen[bytes]) -> int | None:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        return None
