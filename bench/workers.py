"""Worker scenarios, each on one file system (bench/filesystems.py): drain
throughput (with peak memory) against the machine's ceiling, and idle CPU and
pickup latency of a loop-mode worker; ours and the reference interleaved."""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ceiling
import harness
from backends import SQLITE
from ceiling import NO_FILES, Layout
from filesystems import Target
from fixtures import IMPLS, OURS, Impl, clean_env, workdir
from interleave import Arm, Records, Sample, run_blocks, spread
from plan import Plan

DRAIN_SETUPS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("1 worker", 1, ()),
    ("2 workers", 2, ()),
    ("1 worker --concurrency 4", 1, ("--concurrency", "4")),
)


def drain(plan: Plan, target: Target, layout: Layout) -> dict[str, Any]:
    """On one file system: ours and the reference draining with 1 and 2
    workers, ours with --concurrency 4, and the machine's ceilings (spawn
    alone; spawn + ours' per-attempt files, 1 and 2 loops), all interleaved;
    then, in blocks of their own, the same drains of plan.long_drain_jobs
    beside their ceilings at that job count (`long`), where start-up weighs
    little and the per-job cost shows. Every arm's folder stays until the
    end of its set (see fixtures.fresh_dir)."""
    concurrency = supports(OURS, "work", "--concurrency")
    with workdir(f"drain-{target.label}", target.root) as scratch:
        arms = _drain_arms(plan, scratch, layout, concurrency)
        records = run_blocks(arms, plan.drain_reps, f"drain on {target.describe()}")
    long = _long_drains(plan, target, layout)
    errors = {f"{long['jobs']:,} jobs: {arm}": text for arm, text in long["errors"].items()}
    return {
        "filesystem": target.facts(),
        "jobs": plan.drain_jobs,
        "ceiling_layout": layout.facts(),
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "ratios_ours_to_ref": _drain_ratios(records),
        "fraction_of_ceiling": _ceiling_fractions(records),
        "per_job_ms": _per_job(records, DRAIN_SETUPS),
        "peak_rss_mb": _peak_rss(records),
        "errors": {**records.errors, **errors},
        "samples": records.samples,
        "long": long,
    }


LONG_SETUPS = DRAIN_SETUPS[:2]
"""The drains compared with the reference at plan.long_drain_jobs: 1 and 2 workers."""


def _long_drains(plan: Plan, target: Target, layout: Layout) -> dict[str, Any]:
    """Ours and the reference draining plan.long_drain_jobs with 1 and 2
    workers, interleaved A B B A with the spawn + files ceiling (1 and 2
    loops) over the same number of jobs; in a scratch folder of its own, so
    the short drains' files are gone first."""
    jobs = plan.long_drain_jobs
    with workdir(f"drain{jobs}-{target.label}", target.root) as scratch:
        ceilings = [
            Arm(name, _ceiling_arm(scratch, layout, loops, jobs))
            for name, loops in ((CEILING_FILES_1, 1), (CEILING_FILES_2, 2))
        ]
        drains = [
            Arm(f"{impl.name} {label}", _drain_arm(impl, jobs, n, extra, scratch))
            for label, n, extra in LONG_SETUPS
            for impl in IMPLS
        ]
        arms = [ceilings[0], *drains, ceilings[1]]  # each ceiling beside its drains
        label = f"{jobs:,}-job drains on {target.describe()}"
        records = run_blocks(arms, plan.long_drain_reps, label)
    return {
        "jobs": jobs,
        "ceiling_spawns": jobs,
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "ratios_ours_to_ref": _drain_ratios(records),
        "fraction_of_ceiling": _ceiling_fractions(records),
        "per_job_ms": _per_job(records, LONG_SETUPS),
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
    return lambda: harness.drain_once(
        SQLITE, impl, scratch, jobs=jobs, workers=workers, extra=extra
    )


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


def _per_job(records: Records, setups: Sequence[tuple[str, int, tuple[str, ...]]]) -> Any:
    """Ours' drains per job (harness.per_job_ms, from the workers' own
    timings; absent for a build of ours from before them): the spread of
    each part over the drains of a setup."""
    out: dict[str, Any] = {}
    for label, _, _ in setups:
        ours = [s for s in records.samples if s["arm"] == f"ours {label}"]
        if ours and all("per_job_ms" in s for s in ours):
            taken = [s["per_job_ms"] for s in ours]
            out[label] = {key: spread([t[key] for t in taken]) for key in harness.PER_JOB_KEYS}
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
        env=impl.environ(clean_env()),
        timeout=60,
        check=False,
    )
    return flag in proc.stdout


def pickup_and_idle(plan: Plan, target: Target) -> dict[str, Any]:
    """On one file system: a loop-mode worker of ours and one of the reference
    (default settings, each on its own queue) run side by side. First the idle
    CPU of both over the same window, then pickup latency samples, ours and
    the reference interleaved A B B A."""
    with contextlib.ExitStack() as stack:
        running = {
            impl.name: harness.start_idle_worker(
                stack,
                SQLITE,
                impl,
                stack.enter_context(workdir(f"pickup-{impl.name}", target.root)),
                _gap,
            )
            for impl in IMPLS
        }
        time.sleep(harness.SETTLE_S)
        idle = harness.idle_cpu({name: w.proc.pid for name, w in running.items()}, plan.idle_s)
        records = harness.pickup_blocks(running, plan, f"pickup on {target.describe()}")
    return {
        "filesystem": target.facts(),
        "idle_cpu_pct_of_core": idle,
        "idle_window_s": plan.idle_s,
        "arms": {name: harness.latency_summary(records, name) for name in running},
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


_gap = random.Random(6)
"""The pauses between pickup samples: random, and the same sequence every run."""
