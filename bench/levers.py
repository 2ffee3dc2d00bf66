"""One lever measured alone: two source trees of spoolctl, drained A B B A.

    .venv/bin/python bench/levers.py BEFORE_TREE AFTER_TREE [--jobs 5000] [--rounds 2]
        [--dir /dev/shm] [--workers 1] [--out FILE.json]

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
spawn, and the rest. Both trees are byte-compiled first.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
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
    found = subprocess.run([sys.executable, "-c", code], cwd=tree, env=_env(tree),
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    if Path(found).resolve().parent.parent != tree:
        raise SystemExit(f"{tree}: its processes import {found}")


def one_drain(tree: Path, jobs: int, folder: Path, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        db = Path(tmp) / "queue.db"
        batch = Path(tmp) / "jobs.ndjson"
        batch.write_text('{"argv": ["true"]}\n' * jobs)
        added = _spoolctl(tree, "add", "--db", str(db), "--batch", str(batch), "--json")
        if added.returncode != 0:
            raise SystemExit(f"add failed in {tree}: {added.stderr}")
        argv = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--drain", "--json"]
        started = time.perf_counter()
        procs = [
            subprocess.Popen(argv, cwd=tree, env=_env(tree), stdout=subprocess.PIPE, text=True)
            for _ in range(workers)
        ]
        outs = [p.communicate()[0] for p in procs]
        wall = time.perf_counter() - started
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
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        check_source(tree)
        compileall.compile_dir(tree / "spoolctl", quiet=1)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for side in ("before", "after", "after", "before"):
            runs[side].append(one_drain(trees[side], args.jobs, args.dir, args.workers))
            load.append(os.getloadavg()[0])
    result = {
        "jobs": args.jobs,
        "workers": args.workers,
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
