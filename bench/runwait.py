"""Where a fleet's time goes on a small machine: a fleet drain on PostgreSQL
beside the same drain on SQLite (A B B A), with the time each process spent
runnable but waiting for a CPU (issue 22).

    .venv/bin/python bench/runwait.py [--workers 4] [--slots 8] [--jobs 2000]
        [--blocks 2] [--command "sleep 0.05"] [--backends sqlite,pg]
        [--dir FOLDER] [--out FILE.json]

Each sample is `harness.drain_once` (the fleet benchmark's drain: K `work
--drain --concurrency C` processes over due `sleep 0.05` jobs), with a
sampler beside it that reads, every 10 ms, the kernel's scheduler account
(`/proc/PID/schedstat`: time on a CPU, time runnable and waiting for one) of
the drain's workers and, on PostgreSQL, of the server's backends. It keeps
each process's last reading, so a process that exits between two readings
loses at most 10 ms of its account; the jobs themselves (`sleep`) are not
followed. The machine's busy cores come from /proc/stat over the same drain.
`--backends sqlite --workers 2 --slots 1 --command true --dir /dev/shm` asks
the same of two SQLite workers draining `true` (issue 23): how much of the
two cores the workers themselves use, and how much is left to their jobs.

Reported per job, median of each arm: jobs/s; the workers' time in the
database by their own `timings`; the CPU the whole machine used (all
processes: the jobs, the benchmark itself), the workers and the backends;
and the time the workers and the backends spent waiting for a CPU. Time a worker spends in the
database is its CPU there, its wait for the server (whose backend in turn
runs or waits for a CPU), and its own wait for a CPU once the answer came:
where the waits are a large part of it, the cores are what bounds the drain,
and a machine with more of them (or the server on its own) moves it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

import harness
import pg
import psutil
from backends import SQLITE
from filesystems import DISK_SCRATCH, _target
from fixtures import OURS, workdir
from interleave import Arm, Sample, run_blocks

PERIOD_S = 0.01


def _schedstat(pid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable and waiting for one) of a process, or None."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu), int(waiting)


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


class RunWait:
    """While in use, the scheduler accounts of this process's `work` children
    and of the server's backends (the postmaster's children), each process's
    first and last reading kept."""

    def __init__(self, postmaster: int | None) -> None:
        self.postmaster = postmaster
        self.first: dict[tuple[str, int], tuple[int, int]] = {}
        self.last: dict[tuple[str, int], tuple[int, int]] = {}
        self.busy: tuple[int, int] = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RunWait:
        self._busy_before = _busy_jiffies()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        after = _busy_jiffies()
        self.busy = (after[0] - self._busy_before[0], after[1] - self._busy_before[1])

    def _pids(self) -> list[tuple[str, int]]:
        found = [("workers", p.pid) for p in psutil.Process().children()]
        if self.postmaster is not None:
            try:
                master = psutil.Process(self.postmaster)
                found += [("server", p.pid) for p in master.children()]
            except psutil.Error:
                pass
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            for key in self._pids():
                reading = _schedstat(key[1])
                if reading is not None:
                    self.first.setdefault(key, reading)
                    self.last[key] = reading
            self._stop.wait(PERIOD_S)

    def totals_s(self, group: str) -> tuple[float, float]:
        """(CPU s, waiting-for-a-CPU s) of a group over the drain."""
        on_cpu = waiting = 0
        for key, (cpu1, wait1) in self.last.items():
            if key[0] == group:
                cpu0, wait0 = self.first[key] if group == "server" else (0, 0)
                on_cpu, waiting = on_cpu + cpu1 - cpu0, waiting + wait1 - wait0
        return on_cpu / 1e9, waiting / 1e9


def _arm(backend: Any, postmaster: int | None, args: argparse.Namespace, scratch: Path) -> Any:
    def run() -> Sample:
        sampler = RunWait(postmaster)
        sample = harness.drain_once(
            backend,
            OURS,
            scratch,
            jobs=args.jobs,
            workers=args.workers,
            extra=("--concurrency", str(args.slots)),
            job=tuple(args.command.split()),
            during=sampler,
        )
        jobs = args.jobs
        for group in ("workers", "server"):
            cpu_s, wait_s = sampler.totals_s(group)
            sample[f"{group}_cpu_ms_per_job"] = 1000 * cpu_s / jobs
            sample[f"{group}_runwait_ms_per_job"] = 1000 * wait_s / jobs
        busy, total = sampler.busy
        sample["cores_busy"] = (os.cpu_count() or 1) * busy / max(1, total)
        sample["machine_cpu_ms_per_job"] = 1000 * sample["cores_busy"] * sample["wall_s"] / jobs
        return sample

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--command", default="sleep 0.05", help="the jobs' command line")
    parser.add_argument("--backends", default=",".join(pg.BACKENDS))
    parser.add_argument(
        "--dir",
        type=Path,
        default=DISK_SCRATCH,
        help="where queues and spools live (PostgreSQL's data stays on disk)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    names = [name for name in args.backends.split(",") if name]
    if not names or set(names) - set(pg.BACKENDS):
        parser.error(f"--backends: a comma-separated subset of {','.join(pg.BACKENDS)}")
    DISK_SCRATCH.mkdir(parents=True, exist_ok=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    disk, where = _target("disk", DISK_SCRATCH), _target("run", args.dir)
    try:  # the server, once started, is stopped whatever happens after
        postmaster = pg.server(disk).facts.get("postmaster_pid") if "pg" in names else None
        with workdir("runwait", where.root) as scratch:
            backends = {SQLITE.name: SQLITE} if postmaster is None else pg._backends(disk)
            arms = [
                Arm(name, _arm(backends[name], postmaster if name == "pg" else None, args, scratch))
                for name in names
            ]
            records = run_blocks(arms, args.blocks, f"run-queue waits on {where.describe()}")
    finally:
        pg.stop_server()
    keys = (
        "value",
        "cores_busy",
        "machine_cpu_ms_per_job",
        "workers_cpu_ms_per_job",
        "workers_runwait_ms_per_job",
        "server_cpu_ms_per_job",
        "server_runwait_ms_per_job",
    )
    summary: dict[str, Any] = {
        "drain": f"{args.workers} workers x {args.slots} slots of {args.command}",
        "jobs": args.jobs,
        "filesystem": where.facts(),
        "errors": records.errors,
    }
    for arm in arms:
        samples = [s for s in records.samples if s.get("arm") == arm.name and "value" in s]
        if not samples:
            continue
        row = {k: statistics.median(s[k] for s in samples) for k in keys}
        row["db_ms_per_job"] = statistics.median(s["per_job_ms"]["db"] for s in samples)
        row["runs_jobs_per_s"] = [round(s["value"], 1) for s in samples]
        summary[arm.name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    if records.errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
