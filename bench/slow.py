"""Slow jobs across slots: with `--concurrency 8`, one worker should finish 100
jobs of `sleep 0.1` in about an eighth of the time one slot takes (issue 14,
item 3). Ours only: the reference runs one job per worker. The two settings
run interleaved (A B B A) on one file system; the speedup is taken per pair.
"""

from __future__ import annotations

import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

from filesystems import Target
from fixtures import OURS, BenchError, clean_env, clone_queued, count_state, fresh_dir, run_cli
from fixtures import workdir as scratch_dir
from interleave import Arm, Sample, run_blocks, spread
from plan import Plan

JOBS = 100
SLEEP_S = 0.1
SLOTS = 8
ONE = "--concurrency 1"
MANY = f"--concurrency {SLOTS}"


def slow_jobs(plan: Plan, target: Target) -> dict[str, Any]:
    with scratch_dir(f"slow-{target.label}", target.root) as scratch:
        arms = [Arm(f"--concurrency {n}", partial(_drain, n, scratch)) for n in (1, SLOTS)]
        records = run_blocks(arms, plan.slow_reps, f"slow jobs on {target.describe()}")
    return {
        "filesystem": target.facts(),
        "jobs": JOBS,
        "argv": ["sleep", str(SLEEP_S)],
        "slots": SLOTS,
        "sleeping_s": JOBS * SLEEP_S,
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "speedup": spread(records.ratios(ONE, MANY)),
        "errors": records.errors,
        "samples": records.samples,
        "method": "N jobs of `sleep 0.1` queued (one made by `add`, the rest copied); "
        "one `work --drain --concurrency C` process timed from its start to its exit "
        "(start-up included); speedup = the one-slot time over the eight-slot time of "
        "the same half-block.",
    }


def _drain(slots: int, scratch: Path) -> Sample:
    d = fresh_dir(f"slow-c{slots}", scratch)
    db = d / "q.db"
    run_cli(OURS, "add", "--db", str(db), "--json", "--", "sleep", str(SLEEP_S), cwd=d)
    clone_queued(db, JOBS, time.time())
    argv = OURS.argv("work", "--db", str(db), "--drain", "--json", "--concurrency", str(slots))
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=d, env=clean_env(), capture_output=True, timeout=600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"--concurrency {slots}: exit {proc.returncode}: {proc.stderr[-300:]!r}")
    done = count_state(db, "done")
    if done != JOBS:
        raise BenchError(f"--concurrency {slots}: {JOBS - done} of {JOBS} jobs not done")
    return {"value": wall}
