"""Worker scenarios: drain throughput (with peak memory), idle CPU and pickup
latency of a loop-mode worker, and the machine's bare process-spawn rate."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from fixtures import (
    IMPLS,
    BenchError,
    Impl,
    clean_env,
    clone_queued,
    count_state,
    envelope_data,
    median,
    percentile,
    run_cli,
    seed,
    workdir,
)
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


def drain(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for impl in IMPLS:
        results: dict[str, Any] = {}
        for label, workers, extra in DRAIN_SETUPS:
            if extra and not supports(impl, "work", extra[0]):
                results[label] = {"unsupported": f"{impl.name} has no {extra[0]}"}
                continue
            runs = [
                _drain_once(impl, plan.drain_jobs, workers, extra) for _ in range(plan.drain_reps)
            ]
            rates = [r["jobs_per_s"] for r in runs]
            results[label] = {"median_jobs_per_s": median(rates), "runs": runs}
        single = results["1 worker"]["runs"]
        results["peak_rss_mb"] = max(r["peak_rss_mb"] for r in single)
        out[impl.name] = results
    for label, _, _ in DRAIN_SETUPS:
        ours, ref = out["ours"].get(label, {}), out["ref"].get(label, {})
        if "median_jobs_per_s" in ours and "median_jobs_per_s" in ref:
            out.setdefault("ratios_ours_to_ref", {})[label] = (
                ours["median_jobs_per_s"] / ref["median_jobs_per_s"]
            )
    return out


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


def _drain_once(impl: Impl, jobs: int, workers: int, extra: tuple[str, ...]) -> dict[str, Any]:
    """Fill a queue with `jobs` due `true` jobs, start `workers` drain workers
    at once, and time until the last one exits."""
    with workdir(f"drain-{impl.name}") as d:
        db = d / "q.db"
        seed(impl, db, d)
        clone_queued(db, jobs, time.time())
        argv = impl.argv("work", "--db", str(db), "--drain", "--json", *extra)
        logs = [(d / f"out{i}", d / f"err{i}") for i in range(workers)]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                argv,
                cwd=d,
                env=clean_env(),
                stdin=subprocess.DEVNULL,
                stdout=out.open("w"),
                stderr=err.open("w"),
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
        "wall_s": wall,
        "jobs_per_s": jobs / wall,
        "executed": executed,
        "peak_rss_mb": max(sampler.max_rss, sampler.hwm) / 2**20,
    }


def pickup_and_idle(plan: Plan) -> dict[str, Any]:
    return {impl.name: _pickup_and_idle(impl, plan) for impl in IMPLS}


def _pickup_and_idle(impl: Impl, plan: Plan) -> dict[str, Any]:
    """One loop-mode worker with default settings: first its idle CPU, then
    the latency from `add` returning to the job's command starting."""
    with workdir(f"pickup-{impl.name}") as d:
        db = d / "q.db"
        seed(impl, db, d)
        worker = subprocess.Popen(
            impl.argv("work", "--db", str(db), "--json"),
            cwd=d,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=(d / "out").open("w"),
            stderr=(d / "err").open("w"),
        )
        try:
            _wait_for(lambda: count_state(db, "done") == 1, "the seed job to finish", worker)
            time.sleep(SETTLE_S)
            idle = idle_cpu(worker.pid, plan.idle_s)
            latencies = [_one_pickup(impl, db, d, i, worker) for i in range(plan.pickup_samples)]
        finally:
            stop_code = _stop(worker)
    ms = [x[0] * 1000 for x in latencies]
    from_submit_ms = [x[1] * 1000 for x in latencies]
    return {
        "idle_cpu_pct_of_core": idle,
        "idle_window_s": plan.idle_s,
        "pickup_p50_ms": percentile(ms, 50),
        "pickup_p95_ms": percentile(ms, 95),
        "pickup_max_ms": max(ms),
        "pickup_samples_ms": ms,
        "from_submit_p50_ms": percentile(from_submit_ms, 50),
        "from_submit_p95_ms": percentile(from_submit_ms, 95),
        "from_submit_samples_ms": from_submit_ms,
        "worker_exit_code_after_sigterm": stop_code,
        "method": "job runs bash -c 'printf %s \"$EPOCHREALTIME\" > FILE' (its first action); "
        "pickup = that stamp - time.time() taken right after the `add` process exited "
        "(negative: the job started before `add` finished exiting); from_submit = that stamp "
        "- the submit time `add` reported (data.next_run_at, stamped inside its transaction, "
        "before commit); nothing subtracted",
    }


def idle_cpu(pid: int, seconds: float) -> float:
    """CPU time (user + system) of the process over a wall window, in % of one core."""
    proc = psutil.Process(pid)
    before, t0 = proc.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, t1 = proc.cpu_times(), time.monotonic()
    used = (after.user + after.system) - (before.user + before.system)
    return 100.0 * used / (t1 - t0)


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


def spawn_baseline(plan: Plan) -> dict[str, Any]:
    """How fast this machine can merely fork/exec `true` from Python: the
    ceiling any one-process-per-job queue works under."""
    start = time.perf_counter()
    for _ in range(plan.spawn_reps):
        subprocess.run(["true"], check=True)
    wall = time.perf_counter() - start
    return {"spawns_per_s": plan.spawn_reps / wall, "reps": plan.spawn_reps}
