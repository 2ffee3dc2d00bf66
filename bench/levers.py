"""One lever measured alone: two source trees of spoolctl, drained A B B A.

    .venv/bin/python bench/levers.py BEFORE_TREE AFTER_TREE [--jobs 5000] [--rounds 2]
        [--dir /dev/shm] [--workers 1] [--concurrency 1] [--command true]
        [--backend sqlite|postgresql] [--out FILE.json]

Each tree is a checkout of spoolctl (a `git worktree` of the commit before the
lever and of the commit with it); both run under this interpreter, from the
tree's folder and with it on PYTHONPATH, so nothing but the source differs
(`python -m` puts the working folder first on sys.path, before PYTHONPATH
and before the editable install's finder: each process is checked to have
imported its own tree). Every run adds JOBS
`true` jobs with the tree's own `add --batch` to a new queue in DIR (untimed),
then times `work --drain --json` (WORKERS processes at once) from the first
start to the last exit. The order is A B B A per round, so drift of the
machine's load hits both sides alike. Prints and writes, per side: each run's
jobs/s, the median, and per job (from the workers' own `timings`): wall, db,
spawn, and the rest; and the CPU per job of the workers with their jobs (and
on PostgreSQL the server's). Both trees are byte-compiled first.

With `--backend postgresql` each run's queue is a fresh database on the
benchmark's own server (`pgserve.py`: fsync on, its data on the repository's
disk), made with the tree's own `migrate`; `--dir` then holds only the
workers' spool folders. `--concurrency C` runs each worker with C slots and
`--command` is the jobs' command line (split on spaces): `sleep 0.05` with
8 slots is the fleet benchmark's job, where the database is not hidden
behind the spawn.
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import children_cpu_s

SERVER: Any = None
"""The benchmark's PostgreSQL server (`pgserve.BenchServer`) with --backend postgresql."""
_NAMES = itertools.count()


def _env(tree: Path, spool: Path | None = None) -> dict[str, str]:
    env = dict(os.environ) if SERVER is None else SERVER.client_env(dict(os.environ))
    env["PYTHONPATH"] = str(tree)
    if spool is not None:
        env["SPOOLCTL_SPOOL_DIR"] = str(spool)
    return env


def _spoolctl(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", *args],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        check=False,
    )


def check_source(tree: Path) -> None:
    """The tree's processes import the tree's spoolctl, not another checkout."""
    code = "import spoolctl, sys; sys.stdout.write(spoolctl.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if Path(found).resolve().parent.parent != tree:
        raise SystemExit(f"{tree}: its processes import {found}")


def _queue(tree: Path, tmp: Path) -> str:
    """A new queue for one run: a file in tmp, or a fresh migrated database."""
    if SERVER is None:
        return str(tmp / "queue.db")
    url = str(SERVER.create_database(f"lever{next(_NAMES)}"))
    migrated = _spoolctl(tree, "migrate", "--db", url, "--json")
    if migrated.returncode != 0:
        raise SystemExit(f"migrate failed in {tree}: {migrated.stderr}")
    return url


def one_drain(
    tree: Path,
    jobs: int,
    folder: Path,
    workers: int,
    concurrency: int = 1,
    command: tuple[str, ...] = ("true",),
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        db = _queue(tree, Path(tmp))
        batch = Path(tmp) / "jobs.ndjson"
        batch.write_text((json.dumps({"argv": list(command)}) + "\n") * jobs)
        added = _spoolctl(tree, "add", "--db", db, "--batch", str(batch), "--json")
        if added.returncode != 0:
            raise SystemExit(f"add failed in {tree}: {added.stderr}")
        argv = [
            sys.executable,
            "-m",
            "spoolctl",
            "work",
            "--db",
            db,
            "--drain",
            "--json",
            "--concurrency",
            str(concurrency),
        ]
        env = _env(tree, Path(tmp) / "spool")
        cpu_before = children_cpu_s()
        server_before = 0.0 if SERVER is None else SERVER.server_cpu_s()
        started = time.perf_counter()
        procs = [
            subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(workers)
        ]
        outs = [p.communicate()[0] for p in procs]
        wall = time.perf_counter() - started
        server_cpu = 0.0 if SERVER is None else SERVER.server_cpu_s() - server_before
        workers_cpu = children_cpu_s() - cpu_before
        if any(p.returncode != 0 for p in procs):
            raise SystemExit(f"work failed in {tree}")
    timings = [json.loads(out)["data"]["timings"] for out in outs]
    done = sum(t["jobs"] for t in timings)
    if done != jobs:
        raise SystemExit(f"{tree}: {done} jobs run, {jobs} added")
    per_job = {key: sum(t[key] for t in timings) / done * 1000 for key in ("db_s", "spawn_s")}
    worker_wall = sum(t["wall_s"] for t in timings) / done * 1000
    return {
        "jobs_per_s": jobs / wall,
        "wall_ms_per_job": wall / jobs * 1000,
        "worker_ms_per_job": worker_wall,
        "db_ms_per_job": per_job["db_s"],
        "spawn_ms_per_job": per_job["spawn_s"],
        "rest_ms_per_job": worker_wall - per_job["db_s"] - per_job["spawn_s"],
        "workers_cpu_ms_per_job": 1000 * workers_cpu / jobs,
        "server_cpu_ms_per_job": 1000 * server_cpu / jobs,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs_jobs_per_s": [round(r["jobs_per_s"], 1) for r in runs],
        **{key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--command", default="true")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    command = tuple(args.command.split())
    if args.backend == "postgresql":
        global SERVER
        import pgserve
        from fixtures import REPO

        SERVER = pgserve.start(REPO / "bench" / "results" / ".scratch")
    try:
        _measure(args, command)
    finally:
        if SERVER is not None:
            SERVER.stop()


def _measure(args: argparse.Namespace, command: tuple[str, ...]) -> None:
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        check_source(tree)
        compileall.compile_dir(tree / "spoolctl", quiet=1)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for side in ("before", "after", "after", "before"):
            runs[side].append(
                one_drain(trees[side], args.jobs, args.dir, args.workers, args.concurrency, command)
            )
            load.append(os.getloadavg()[0])
    result = {
        "jobs": args.jobs,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "command": list(command),
        "backend": args.backend,
        "server": None if SERVER is None else SERVER.facts,
        "dir": str(args.dir),
        "trees": {side: str(tree) for side, tree in trees.items()},
        "load_1min": [round(x, 2) for x in load],
        **{side: _summary(found) for side, found in runs.items()},
    }
    ratio = result["after"]["jobs_per_s"] / result["before"]["jobs_per_s"]
    result["after_over_before"] = round(ratio, 3)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
