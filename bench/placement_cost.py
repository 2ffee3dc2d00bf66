"""The claim's cost with and without requests, in the same run.

    .venv/bin/python bench/placement_cost.py [--jobs 400] [--blocks 3] [--out FILE.json]

On each file system (the repository's disk, under bench/results/.scratch,
and /dev/shm when it is a tmpfs), arms run interleaved A B C D D C B A per
block, each on a fresh SQLite queue of JOBS due `true` jobs drained by one
in-process worker (`placement_hosts.Host`) that claims eight jobs at a time
(`claim_up_to`, one write transaction) and records their ends
(`record_outcomes`, another), as a worker's pass does; no process is
spawned, so what is measured is the database work alone:

- plain: plain jobs, a worker of 8 slots without devices (today's claim);
- plain_gpu_worker: the same jobs on a worker of 8 slots and 8 declared
  devices (a GPU box running CPU jobs);
- weight: jobs of `--weight 2` on a worker of 16 slots (8 per claim);
- gpus: jobs of `--gpus 1` on a worker of 8 slots and 8 declared devices
  (each claim places 8 jobs, one device each, held in the database).

Per claimed job: the CPU of this process (`time.process_time`) and the wall
time spent in the two transactions, over the whole drain. Ratios are each
arm over plain per pair (the two arms' runs next to each other in one half
block), as the median and min..max. The target: a claim with requests costs
at most 1.1 x the plain claim. Prints and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from filesystems import DISK_SCRATCH, SHM, mount_of
from placement_hosts import Host, add_jobs, open_queue

ARMS: dict[str, tuple[dict[str, Any], int, int]] = {
    "plain": ({}, 8, 0),
    "plain_gpu_worker": ({}, 8, 8),
    "weight": ({"weight": 2}, 16, 0),
    "gpus": ({"gpus": 1, "gpu_share": 1}, 8, 8),
}
"""Arm -> (each job's request columns, the worker's slots, its devices)."""
TARGET = 1.1


def drain(folder: Path, arm: str, count: int) -> dict[str, float]:
    """One arm's drain on a fresh queue: CPU and wall per claimed job."""
    request, slots, gpus = ARMS[arm]
    queue = open_queue(folder)
    try:
        now = time.time()
        add_jobs(queue, [request] * count, now - 1)
        host = Host(queue, "h", slots=slots, gpus=gpus, now=now)
        claimed = claims = 0
        wall = 0.0
        cpu0 = time.process_time()
        while claimed < count:
            t0 = time.perf_counter()
            got = host.claim(now)
            t1 = time.perf_counter()
            if not got:
                raise RuntimeError(f"{arm}: nothing claimed with {count - claimed} left")
            host.end([c.attempt_id for c in got], now)
            wall += time.perf_counter() - t1 + (t1 - t0)
            claimed += len(got)
            claims += 1
        cpu = time.process_time() - cpu0
        return {
            "cpu_ms_per_job": cpu * 1000 / claimed,
            "wall_ms_per_job": wall * 1000 / claimed,
            "jobs_per_claim": claimed / claims,
        }
    finally:
        queue.engine.dispose()
        shutil.rmtree(folder, ignore_errors=True)


def order(block: int) -> list[str]:
    names = list(ARMS)
    half = names if block % 2 == 0 else names[::-1]
    return half + half[::-1]


def measure(root: Path, count: int, blocks: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    ratios: dict[str, dict[str, list[float]]] = {
        arm: {"cpu": [], "wall": []} for arm in ARMS if arm != "plain"
    }
    for block in range(blocks):
        arms = order(block)
        for half in (arms[: len(ARMS)], arms[len(ARMS) :]):
            run = {}
            for arm in half:
                folder = Path(tempfile.mkdtemp(prefix=f"place-{arm}-", dir=root))
                run[arm] = drain(folder, arm, count)
                samples[arm].append(run[arm])
            for arm, ratio in ratios.items():
                ratio["cpu"].append(run[arm]["cpu_ms_per_job"] / run["plain"]["cpu_ms_per_job"])
                ratio["wall"].append(run[arm]["wall_ms_per_job"] / run["plain"]["wall_ms_per_job"])
    fstype, mount, device = mount_of(root)
    return {
        "file_system": {"fstype": fstype, "mount_point": mount, "device": device},
        "per_job_ms": {
            arm: {
                key: statistics.median(s[key] for s in runs)
                for key in ("cpu_ms_per_job", "wall_ms_per_job", "jobs_per_claim")
            }
            for arm, runs in samples.items()
        },
        "ratio_to_plain": {
            arm: {
                kind: {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "verdict": "met" if statistics.median(values) <= TARGET else "MISSED",
                }
                for kind, values in ratio.items()
            }
            for arm, ratio in ratios.items()
        },
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    roots = [DISK_SCRATCH]
    if mount_of(SHM)[0] == "tmpfs":
        roots.append(SHM)
    result: dict[str, Any] = {
        "scenario": "placement_cost",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "jobs": args.jobs,
        "blocks": args.blocks,
        "target": f"each arm <= {TARGET} x plain (CPU and wall per claimed job)",
        "runs": {},
    }
    for root in roots:
        root.mkdir(parents=True, exist_ok=True)
        label = "tmpfs" if root == SHM else "disk"
        result["runs"][label] = measure(root, args.jobs, args.blocks)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    summary = {
        label: {"per_job_ms": run["per_job_ms"], "ratio_to_plain": run["ratio_to_plain"]}
        for label, run in result["runs"].items()
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
