"""Slow jobs across slots: with `--concurrency 8`, one worker should finish 100
jobs of `sleep 0.1` in about an eighth of the time one slot takes. Ours
only: the reference runs one job per worker. The two settings
run interleaved (A B B A) on one file system; the speedup is taken per pair.
Each drain is bench/harness.py's, on an SQLite file.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import harness
from backends import SQLITE
from filesystems import Target
from fixtures import OURS
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
    """One worker with `slots` slots drains the queue; value: its wall seconds."""
    sample = harness.drain_once(
        SQLITE,
        OURS,
        scratch,
        jobs=JOBS,
        workers=1,
        extra=("--concurrency", str(slots)),
        job=("sleep", str(SLEEP_S)),
    )
    return {**sample, "value": sample["wall_s"]}
