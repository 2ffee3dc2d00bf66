"""What containment costs a whole drain: ours with a cgroup per attempt
(`SPOOLCTL_CGROUP=auto`, the default where the worker can make cgroups)
against ours with process groups only (`SPOOLCTL_CGROUP=off`), same build,
interleaved A B B A.

    .venv/bin/python bench/containdrain.py [--jobs 5000] [--blocks 2] [--dir /dev/shm]

Each sample: a fresh queue in a fresh folder under --dir (tmpfs by default,
so the disk does not hide the difference) holding --jobs due `true` jobs,
drained by one `spoolctl work --drain`; jobs/s = jobs / the drain's wall
time. Prints one JSON object: jobs/s per arm (median and samples), the
per-pair ratio auto/off, and ms per job added. Run as root (or where the
worker can make cgroups): otherwise both arms run uncontained.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from fixtures import OURS, clean_env, clone_queued

ARMS = ("off", "auto")


def drain(mode: str, jobs: int, parent: Path) -> float:
    folder = Path(tempfile.mkdtemp(prefix=f"containdrain-{mode}-", dir=parent))
    try:
        db = folder / "q.db"
        env = {**clean_env(), "SPOOLCTL_CGROUP": mode}
        add = [str(OURS.cli), "add", "--db", str(db), "--", "true"]
        subprocess.run(add, env=env, check=True, capture_output=True)
        clone_queued(db, jobs, time.time())
        start = time.perf_counter()
        work = [str(OURS.cli), "work", "--db", str(db), "--drain", "--json"]
        subprocess.run(work, env=env, check=True, capture_output=True)
        return jobs / (time.perf_counter() - start)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    args = parser.parse_args()
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    ratios = []
    for block in range(args.blocks):
        order = ARMS if block % 2 == 0 else tuple(reversed(ARMS))
        for half in (order, tuple(reversed(order))):
            pair = {arm: drain(arm, args.jobs, args.dir) for arm in half}
            for arm, rate in pair.items():
                samples[arm].append(rate)
            ratios.append(pair["auto"] / pair["off"])
    medians = {arm: statistics.median(v) for arm, v in samples.items()}
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "dir": str(args.dir),
                "jobs_per_s": {a: {"median": medians[a], "samples": samples[a]} for a in ARMS},
                "ratio_auto_to_off": {"median": statistics.median(ratios), "pairs": ratios},
                "ms_per_job_added": 1000 / medians["auto"] - 1000 / medians["off"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
