"""The contained drain (`contained`), on each file system: one worker of
ours draining plan.contained_jobs due `true` jobs with a cgroup per attempt
(SPOOLCTL_CGROUP=auto, the default: as root, wherever the worker can make
one), the same worker uncontained (SPOOLCTL_CGROUP=off), the reference's one
worker, and ours with two slots (`--concurrency 2`, contained), interleaved
A B B A. On the disk also the CPU drains: ours (contained) and the reference
over plan.cpu_drain_jobs, in the same blocks, for the workers' CPU per job.

Every drain is bench/harness.py's `drain_once` (a fresh SQLite queue of due
jobs, the worker timed from its start to its exit, every job must end
`done`), so each sample also holds the workers' CPU per job: their own
(worker_own_cpu_ms_per_job) and with the jobs they ran
(workers_cpu_ms_per_job). Whether the contained arm was contained is read
from `spoolctl doctor --json` under the same environment and kept beside the
numbers.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
from backends import SQLITE
from filesystems import Target
from fixtures import OURS, REF, Impl, clean_env, workdir
from interleave import Arm, Records, Sample, run_blocks, spread
from plan import Plan
from workers import supports

ON = "ours cgroups on"
OFF = "ours cgroups off"
REF_ARM = "ref"
TWO_SLOTS = "ours --concurrency 2"
CPU_OURS = "ours, CPU drain"
CPU_REF = "ref, CPU drain"
ENV_ON = {"SPOOLCTL_CGROUP": "auto"}
"""The default, named: a BENCH_KEEP_ENV=SPOOLCTL_CGROUP run does not turn it off."""
ENV_OFF = {"SPOOLCTL_CGROUP": "off"}
PER_JOB = ("worker_own_cpu_ms_per_job", "workers_cpu_ms_per_job")


def contained_drain(plan: Plan, target: Target) -> dict[str, Any]:
    jobs, cpu_jobs = plan.contained_jobs, plan.cpu_drain_jobs
    two_slots = supports(OURS, "work", "--concurrency")
    on_disk = target.label == "disk"
    with workdir(f"contained-{target.label}", target.root) as scratch:
        setups: list[tuple[str, Impl, int, tuple[str, ...], dict[str, str]]] = [
            (ON, OURS, jobs, (), ENV_ON),
            (OFF, OURS, jobs, (), ENV_OFF),
            (REF_ARM, REF, jobs, (), {}),
        ]
        if two_slots:
            setups.append((TWO_SLOTS, OURS, jobs, ("--concurrency", "2"), ENV_ON))
        if on_disk:
            setups += [(CPU_OURS, OURS, cpu_jobs, (), ENV_ON), (CPU_REF, REF, cpu_jobs, (), {})]
        arms = [
            Arm(name, _drain(impl, n, extra, env, scratch)) for name, impl, n, extra, env in setups
        ]
        containment = _containment(scratch)
        label = f"{jobs:,}-job drains, contained and not, on {target.describe()}"
        records = run_blocks(arms, plan.contained_reps, label)
    return {
        "filesystem": target.facts(),
        "jobs": jobs,
        "cpu_drain_jobs": cpu_jobs if on_disk else None,
        "containment": containment,
        "arms": {a.name: _summary(records, a.name) for a in arms},
        "ratios": {
            "on_to_ref": spread(records.ratios(ON, REF_ARM)),
            "on_to_off": spread(records.ratios(ON, OFF)),
            "two_slots_to_one": spread(records.ratios(TWO_SLOTS, ON)),
            "cpu_own_ours_to_ref": spread(records.ratios(CPU_OURS, CPU_REF, PER_JOB[0])),
            "cpu_with_jobs_ours_to_ref": spread(records.ratios(CPU_OURS, CPU_REF, PER_JOB[1])),
            "cpu_own_on_to_ref": spread(records.ratios(ON, REF_ARM, PER_JOB[0])),
        },
        "errors": records.errors,
        "samples": records.samples,
        "method": "each arm: harness.drain_once, one `work --drain --json` (plus the "
        "arm's flags) over a fresh queue of due `true` jobs; value = jobs / wall. "
        "worker_own_cpu_ms_per_job: the worker's user + system CPU read from "
        "/proc/PID/stat as it exits (before it is reaped), over the jobs; "
        "workers_cpu_ms_per_job: getrusage of the reaped children around the drain "
        "(the worker and the jobs it reaped). Ratios per pair (same half-block).",
    }


def _drain(
    impl: Impl, jobs: int, extra: tuple[str, ...], env: dict[str, str], scratch: Path
) -> Callable[[], Sample]:
    return lambda: harness.drain_once(
        SQLITE, impl, scratch, jobs=jobs, workers=1, extra=extra, env=env
    )


def _summary(records: Records, arm: str) -> dict[str, Any]:
    return {
        "jobs_per_s": spread(records.values(arm)),
        **{key: spread(records.values(arm, key)) for key in PER_JOB},
        "peak_rss_mb": spread(records.values(arm, "peak_rss_mb")),
    }


def _containment(d: Path) -> dict[str, Any]:
    """What ours' doctor says of containment with each arm's environment."""
    out: dict[str, Any] = {}
    for name, env in ((ON, ENV_ON), (OFF, ENV_OFF)):
        proc = subprocess.run(
            OURS.argv("doctor", "--json", "--db", str(d / "doctor.db")),
            cwd=d,
            env=OURS.environ({**clean_env(), **env}),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        try:
            checks = json.loads(proc.stdout)["data"]["checks"]
            found = next(c for c in checks if c["id"] == "containment")
            out[name] = {"status": found["status"], "message": found["message"]}
        except (ValueError, KeyError, TypeError, StopIteration):
            out[name] = {"status": "unknown", "message": (proc.stdout + proc.stderr)[-300:]}
    return out


def contained(facts: dict[str, Any]) -> bool:
    """Whether the contained arm ran with a cgroup per attempt, as doctor said."""
    on = facts.get("containment", {}).get(ON, {})
    return on.get("status") == "pass" and "cgroup per attempt" in on.get("message", "")
