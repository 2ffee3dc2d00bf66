"""A worker's CPU per job, from the kernel's accounting: ours against 0.4.11.

    .venv/bin/python bench/workercpu.py [--jobs 2000] [--dir /dev/shm]
        [--order ref,ours,ours,ref] [--empty N] [--tree .]

Each run fills a new queue in DIR with JOBS `true` jobs (ours: `add
--batch`; 0.4.11, which has no batch: one `add`, then its row copied with
plain SQL), then runs one `work --drain` and reads, while the worker is a
zombie (waitid WNOWAIT) and before it is reaped, its own CPU and the CPU of
the children it reaped (its jobs, its lease guard) from /proc/PID/stat. A
loaded machine stretches the wall time but not these. Per run it prints
jobs/s and, per job: cpu (the worker and its jobs), own (the worker alone),
own_sys (its system share) and jobs.

A side named `ours2` runs ours with `--concurrency 2` (`ref2` likewise is
refused by 0.4.11, which has one slot). `--empty N` measures instead the
median CPU of N `work --drain` runs over an empty queue (a worker's start)
and the resident memory of a loop-mode worker idle for 3 s. Ours runs from
TREE (PYTHONPATH) with SPOOLCTL_CGROUP=off: containment's cost is not part
of this measure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REF = Path(os.environ.get("BENCH_REF_SPOOLCTL", BENCH / ".venv-ref" / "bin" / "spoolctl"))
"""BENCH_REF_SPOOLCTL: 0.4.11's command where bench/.venv-ref is not (a worktree)."""
TICK = os.sysconf("SC_CLK_TCK")


def _env(side: str, tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLCTL")}
    env["SPOOLCTL_CGROUP"] = "off"
    if side == "ours":
        env["PYTHONPATH"] = str(tree)
    return env


def _argv(side: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "spoolctl", *args] if side == "ours" else [str(REF), *args]


def fill(side: str, tree: Path, db: Path, jobs: int) -> None:
    env, folder = _env(side, tree), db.parent
    if side == "ours":
        lines = folder / "jobs.ndjson"
        lines.write_text('{"argv": ["true"]}\n' * jobs)
        add = _argv(side, "add", "--db", str(db), "--batch", str(lines))
        subprocess.run(add, env=env, cwd=folder, check=True, capture_output=True)
        return
    add = _argv(side, "add", "--db", str(db), "--", "true")
    subprocess.run(add, env=env, cwd=folder, check=True, capture_output=True)
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    first = dict(conn.execute("SELECT * FROM jobs ORDER BY id LIMIT 1").fetchone())
    events = [
        dict(r) for r in conn.execute("SELECT * FROM job_events WHERE job_id = ?", (first["id"],))
    ]
    ids = [first["id"] + i for i in range(1, jobs)]
    cols = list(first)
    conn.executemany(
        f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
        ([job_id if c == "id" else first[c] for c in cols] for job_id in ids),
    )
    for event in events:
        ecols = [c for c in event if c != "id"]
        conn.executemany(
            f"INSERT INTO job_events ({', '.join(ecols)}) VALUES ({', '.join('?' * len(ecols))})",
            ([job_id if c == "job_id" else event[c] for c in ecols] for job_id in ids),
        )
    conn.commit()
    conn.close()


def measured(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Run argv: wall time, its own CPU and its reaped children's (read while it is a zombie)."""
    start = time.perf_counter()
    with open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - start
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        utime, stime, cutime, cstime = (int(x) / TICK for x in stat[11:15])
        proc.wait()
    if proc.returncode != 0:
        raise SystemExit(
            f"{argv} exit {proc.returncode}: {(cwd / 'stderr.txt').read_text()[-500:]}"
        )
    return {"wall": wall, "own": utime + stime, "sys": stime, "jobs": cutime + cstime}


def drain(side: str, tree: Path, jobs: int, root: Path, slots: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix=f"workercpu-{side}-", dir=root))
    try:
        db = folder / "q.db"
        fill(side, tree, db, jobs)
        extra = ["--concurrency", str(slots)] if slots > 1 else []
        run = measured(
            _argv(side, "work", "--drain", "--db", str(db), *extra), _env(side, tree), folder
        )
        with sqlite3.connect(db) as conn:
            (left,) = conn.execute(
                "SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'done')"
            ).fetchone()
        if left:
            raise SystemExit(f"{side}: {left} jobs not succeeded")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    per = 1000 / jobs
    return {
        "jobs_s": jobs / run["wall"],
        "cpu_ms": (run["own"] + run["jobs"]) * per,
        "own_ms": run["own"] * per,
        "own_sys_ms": run["sys"] * per,
        "jobs_ms": run["jobs"] * per,
    }


def start_and_idle(side: str, tree: Path, root: Path, runs: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix=f"workercpu-{side}-", dir=root))
    env = _env(side, tree)
    try:
        db = folder / "q.db"
        fill(side, tree, db, 1)
        drain_argv = _argv(side, "work", "--drain", "--db", str(db))
        subprocess.run(drain_argv, env=env, cwd=folder, check=True, capture_output=True)
        cpu = sorted(
            sum(measured(drain_argv, env, folder)[k] for k in ("own", "jobs")) for _ in range(runs)
        )
        idle = subprocess.Popen(
            _argv(side, "work", "--db", str(db)),
            env=env,
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(3)
        status = Path(f"/proc/{idle.pid}/status").read_text().splitlines()
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
        idle.send_signal(signal.SIGTERM)
        idle.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"start_cpu_ms": 1000 * cpu[len(cpu) // 2], "idle_rss_mb": rss_kb / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=BENCH.parent)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--order", default="ref,ours,ours,ref")
    parser.add_argument("--empty", type=int, default=0)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    print("load", os.getloadavg(), "dir", args.dir, flush=True)
    results: dict[str, list[dict[str, float]]] = {}
    for side in args.order.split(","):
        name = side.rstrip("0123456789")
        slots = int(side[len(name) :] or 1)
        if args.empty:
            found = start_and_idle(name, args.tree.resolve(), args.dir, args.empty)
        else:
            found = drain(name, args.tree.resolve(), args.jobs, args.dir, slots)
        results.setdefault(side, []).append(found)
        shown = {k: round(v, 3) for k, v in found.items()}
        print(side, shown, "load", round(os.getloadavg()[0], 2), flush=True)
    first, second = list(results)[:2]
    for key in results[first][0]:
        a = sum(r[key] for r in results[first]) / len(results[first])
        b = sum(r[key] for r in results[second]) / len(results[second])
        print(f"{key}: {second} {b:.3f} / {first} {a:.3f} = {b / a:.3f}")
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
