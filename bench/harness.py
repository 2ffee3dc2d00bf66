"""The one drain / pickup / idle-worker harness, for either backend and either
implementation: every scenario that drains a queue (workers.py: ours against
the reference; slow.py: one slot against eight; pg.py: PostgreSQL beside
SQLite), keeps a loop-mode worker idle or picks jobs up from one comes here,
and says only which backend (bench/backends.py), which implementation and
what to run.

- drain_once: a fresh queue of N due jobs, `work --drain` processes started
  at once, timed from starting them to the last one exiting (process
  start-up included), with the first worker's peak memory; every job must
  end `done`.
- IdleWorker: a loop-mode `work` on a queue of its own, its first job run;
  next_sample adds `bash -c 'printf %s "$EPOCHREALTIME" > FILE'` and reads
  when the job started against the moment `add` exited.
- idle_cpu: the CPU of idle workers over one shared window.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil
from backends import Backend, Queue
from fixtures import BenchError, Impl, envelope_data, fresh_dir, percentile
from interleave import Arm, Records, Sample, run_blocks, spread
from plan import Plan

SETTLE_S = 2.0
"""Rest between an idle worker's first job and its idle window."""
PICKUP_DEADLINE_S = 15.0
STOP_DEADLINE_S = 15.0
DRAIN_DEADLINE_S = 600.0
START_STAMP = 'printf %s "$EPOCHREALTIME" > '
"""The job's command: bash's builtin clock, read as the job's first action."""


# -- drain ---------------------------------------------------------------------------------


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

    @property
    def peak_mb(self) -> float:
        return max(self.max_rss, self.hwm) / 2**20


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def drain_once(
    backend: Backend,
    impl: Impl,
    scratch: Path,
    *,
    jobs: int,
    workers: int,
    extra: Sequence[str] = (),
    job: Sequence[str] = ("true",),
    during: contextlib.AbstractContextManager[Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Sample:
    """Fill a fresh queue (in a fresh folder under scratch, left in place:
    see fixtures.fresh_dir) with `jobs` due jobs running `job`, start
    `workers` `work --drain --json *extra` processes at once, and time until
    the last one exits. value: jobs/s. `during` (a context) is entered just
    before the workers start and left once they have all exited. A server's
    work (backends.Queue.server_counters) is reported per job, and so is the
    workers' own account of their time where they give one (per_job_ms).
    env: variables added to the queue's processes' (as backends.Backend.queue).
    The workers' CPU per job is given twice: with the jobs they ran and
    reaped (workers_cpu_ms_per_job), and their own alone
    (worker_own_cpu_ms_per_job, read from /proc as each exits)."""
    d = fresh_dir(f"drain-{backend.name}-{impl.name}", scratch)
    queue = backend.queue(impl, d, job, env=dict(env) if env else None)
    try:
        queue.fill(jobs, time.time())
        before = queue.server_counters()
        cpu_before = children_cpu_s()
        wall, datas, peak_mb, own_cpu_s = _run_drain(impl, queue, d, workers, extra, during)
        workers_cpu_s = children_cpu_s() - cpu_before
        done = queue.count("done")
        after = queue.server_counters()
    finally:
        queue.close()
    if done != jobs:
        raise BenchError(
            f"{impl.name} on {backend.name}: drain left {jobs - done} of {jobs} jobs not done"
        )
    sample: Sample = {
        "value": jobs / wall,
        "wall_s": wall,
        "workers": workers,
        "executed": sum(data["executed"] for data in datas),
        "peak_rss_mb": peak_mb,
        "workers_cpu_ms_per_job": 1000 * workers_cpu_s / jobs,
        "worker_own_cpu_ms_per_job": None if own_cpu_s is None else 1000 * own_cpu_s / jobs,
        **{f"{k}_per_job": (after[k] - before[k]) / jobs for k in before},
    }
    if all("timings" in data for data in datas):  # ours reports them; the reference never
        timings = {k: sum(data["timings"][k] for data in datas) for k in TIMING_KEYS}
        sample["timings"] = timings
        sample["per_job_ms"] = per_job_ms(timings, wall, workers, jobs)
    return sample


def children_cpu_s() -> float:
    """CPU of this process's reaped children so far: a drain's workers, and
    their jobs (each worker reaps its own)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


TIMING_KEYS = ("db_s", "spawn_s", "wall_s", "jobs")
PER_JOB_KEYS = ("wall", "worker", "db", "spawn", "rest", "outside_run")


def per_job_ms(timings: dict[str, float], wall: float, workers: int, jobs: int) -> dict[str, float]:
    """A drain's time per job, from the workers' own `timings` (summed over
    them): wall, the drain's elapsed time per job (1000 / jobs/s); worker,
    the workers' time per job (wall x workers, what db + spawn + rest add up
    to); db and spawn as the workers measured them; rest, everything else
    of the worker time, which includes outside_run, the workers' time
    outside Worker.run (start-up, imports, exit and, with several workers,
    one's time exited while another still drains)."""
    ms = 1000.0 / jobs
    worker = wall * workers * ms
    db, spawn = timings["db_s"] * ms, timings["spawn_s"] * ms
    return {
        "wall": wall * ms,
        "worker": worker,
        "db": db,
        "spawn": spawn,
        "rest": worker - db - spawn,
        "outside_run": worker - timings["wall_s"] * ms,
    }


def _run_drain(
    impl: Impl,
    queue: Queue,
    d: Path,
    workers: int,
    extra: Sequence[str],
    during: contextlib.AbstractContextManager[Any] | None,
) -> tuple[float, list[dict[str, Any]], float, float | None]:
    """(wall seconds, each worker's JSON data, first worker's peak MB, the
    workers' own CPU seconds, without their jobs': None where /proc did not
    say)."""
    argv = impl.argv("work", "--db", queue.db, "--drain", "--json", *extra)
    logs = [(d / f"out{i}", d / f"err{i}") for i in range(workers)]
    with contextlib.ExitStack() as files:
        if during is not None:
            files.enter_context(during)
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                argv,
                cwd=d,
                env=impl.environ(queue.env),
                stdin=subprocess.DEVNULL,
                stdout=files.enter_context(out.open("w")),
                stderr=files.enter_context(err.open("w")),
            )
            for out, err in logs
        ]
        sampler = PeakRss(procs[0].pid)
        sampler.start()
        watchdog = threading.Timer(DRAIN_DEADLINE_S, _kill_all, (procs,))
        watchdog.start()
        try:
            own = [exited_own_cpu_s(p.pid) for p in procs]
            codes = [p.wait() for p in procs]
        finally:
            watchdog.cancel()
        wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    datas = [
        envelope_data(impl, tuple(argv[1:]), code, out.read_text(), err.read_text())
        for code, (out, err) in zip(codes, logs, strict=True)
    ]
    own_total = None if None in own else sum(c for c in own if c is not None)
    return wall, datas, sampler.peak_mb, own_total


def _kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """The drain's deadline has passed: its workers are killed, so the waits end."""
    for proc in procs:
        proc.kill()


def exited_own_cpu_s(pid: int) -> float | None:
    """Wait for child pid to exit without reaping it, and read its own CPU
    (user + system, not its reaped children's) from /proc/PID/stat while it
    is a zombie; None where that could not be read. The caller reaps it."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


# -- idle worker and pickup ----------------------------------------------------------------


class IdleWorker:
    """A loop-mode `spoolctl work` (default settings) on a queue of its own,
    and the pickup samples taken from it. Start it with start_idle_worker."""

    def __init__(
        self,
        backend: Backend,
        impl: Impl,
        d: Path,
        gap: random.Random,
        env: dict[str, str] | None = None,
        read_claim: bool = False,
    ) -> None:
        self.impl, self.d, self.gap, self.read_claim = impl, d, gap, read_claim
        self.label = f"{impl.name} on {backend.name}"
        self.queue = backend.queue(impl, d, env=env)
        self.taken = 0
        self.stop_code: int | None = None
        self._logs: list[IO[str]] = [(d / "out").open("w"), (d / "err").open("w")]
        self.proc = subprocess.Popen(
            impl.argv("work", "--db", self.queue.db, "--json"),
            cwd=d,
            env=impl.environ(self.queue.env),
            stdin=subprocess.DEVNULL,
            stdout=self._logs[0],
            stderr=self._logs[1],
        )

    def next_sample(self) -> Sample:
        """value: ms from `add` exiting to the job's first action; from_submit_ms:
        from the submit time `add` stamped; claim_ms (read_claim): the stored
        claim time - `add` exiting. Then a random 50-300 ms pause, against
        locking onto any poll period."""
        self.taken += 1
        marker = self.d / f"started-{self.taken}"
        args = (
            "add",
            "--db",
            self.queue.db,
            "--json",
            "--",
            "bash",
            "-c",
            START_STAMP + str(marker),
        )
        proc = subprocess.run(
            self.impl.argv(*args),
            cwd=self.d,
            env=self.impl.environ(self.queue.env),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        returned = time.time()
        data = envelope_data(self.impl, args, proc.returncode, proc.stdout, proc.stderr)
        wait_for(lambda: _stamp(marker) is not None, f"job {self.taken} to start", self.proc)
        started = _stamp(marker)
        assert started is not None
        sample = {
            "value": (started - returned) * 1000,
            "from_submit_ms": (started - float(data["next_run_at"])) * 1000,
        }
        if self.read_claim:
            sample["claim_ms"] = (self.queue.claimed_at(int(data["job_id"])) - returned) * 1000
        time.sleep(self.gap.uniform(0.05, 0.3))
        return sample

    def stop(self) -> None:
        """SIGTERM, its exit code kept (None: it had to be killed); the queue released."""
        try:
            self.stop_code = stop(self.proc)
        finally:
            for log in self._logs:
                log.close()
            self.queue.close()


def start_idle_worker(
    stack: contextlib.ExitStack,
    backend: Backend,
    impl: Impl,
    d: Path,
    gap: random.Random,
    env: dict[str, str] | None = None,
    read_claim: bool = False,
) -> IdleWorker:
    """An IdleWorker stopped when stack closes, once it has run its first job."""
    worker = IdleWorker(backend, impl, d, gap, env, read_claim)
    stack.callback(worker.stop)
    wait_for(lambda: worker.queue.count("done") == 1, f"{worker.label}: the seed job", worker.proc)
    return worker


def idle_cpu(pids: Mapping[str, int], seconds: float) -> dict[str, float]:
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


def pickup_blocks(running: Mapping[str, IdleWorker], plan: Plan, label: str) -> Records:
    """plan.pickup_samples per worker, the workers interleaved A B B A (each
    idle while another's job is picked up)."""
    arms = [Arm(name, w.next_sample) for name, w in running.items()]
    return run_blocks(arms, -(-plan.pickup_samples // 2), label)


def latency_summary(records: Records, arm: str) -> dict[str, Any]:
    """Spread, p50 and p95 of an arm's pickup latencies, and of its
    from_submit (and claim, where taken) times."""
    ms = records.values(arm)
    if not ms:
        return {"n": 0}
    out = {**spread(ms), "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95)}
    taken = [s for s in records.samples if s["arm"] == arm]
    for key in ("from_submit_ms", "claim_ms"):
        if all(key in s for s in taken):
            values = records.values(arm, key)
            stem = key.removesuffix("_ms")
            out[f"{stem}_p50_ms"] = percentile(values, 50)
            out[f"{stem}_p95_ms"] = percentile(values, 95)
    return out


def _stamp(marker: Path) -> float | None:
    try:
        text = marker.read_text().strip().replace(",", ".")
        return float(text) if text else None
    except (OSError, ValueError):
        return None


def wait_for(cond: Callable[[], bool], what: str, worker: subprocess.Popen[bytes]) -> None:
    """Poll cond every millisecond; BenchError if the worker exits first or
    PICKUP_DEADLINE_S passes."""
    deadline = time.monotonic() + PICKUP_DEADLINE_S
    while not cond():
        if worker.poll() is not None:
            raise BenchError(f"worker exited with {worker.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise BenchError(f"gave up after {PICKUP_DEADLINE_S}s waiting for {what}")
        time.sleep(0.001)


def stop(worker: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM and wait; its exit code, or None if it had to be killed."""
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        return None
