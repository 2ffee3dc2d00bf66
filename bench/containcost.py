"""What a cgroup per attempt adds to one job's spawn: posix_spawn alone
against the same spawn in a cgroup of its own.

    .venv/bin/python bench/containcost.py [--spawns 500] [--blocks 3]

The `contained` arm does what a contained worker does per job: make the
attempt's cgroup in each site (`containment.Containment.cell`), move the
worker in for the spawn and back (`Cell.joined`), wait for the exit, read
the usage and remove the cgroup (`Cell.close`). `plain` is the spawn alone.
Both start `true` on output files in a fresh tmpfs folder; blocks run
A B B A, then B A A B, so drift falls on both. Prints one JSON object: ms
per spawn per arm (median and samples), the per-pair difference, and which
containment was in force (it must be `cgroup`: run as root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from spoolctl.runner import containment, spawn
from spoolctl.runner.supervise import open_output

Arm = Callable[[Path, int], None]


def arms(cells: containment.Containment) -> dict[str, Arm]:
    spawner = spawn.Spawner(spawn.cloexec_from_3())
    env = dict(os.environb)

    def plain(folder: Path, n: int) -> None:
        out, err = open_output(str(folder / f"{n}.out"), str(folder / f"{n}.err"))
        with out, err:
            proc = spawner.start(["true"], cwd=None, env=env, stdout=out, stderr=err)
        proc.wait()

    def contained(folder: Path, n: int) -> None:
        cell = cells.cell(n, containment.NO_LIMITS)
        assert cell is not None
        out, err = open_output(str(folder / f"{n}.out"), str(folder / f"{n}.err"))
        with out, err, cell.joined() as inside:
            assert inside
            proc = spawner.start(["true"], cwd=None, env=env, stdout=out, stderr=err)
        proc.wait()
        cell.usage()
        cell.close(1.0)

    return {"plain": plain, "contained": contained}


def timed(arm: Arm, root: Path, spawns: int) -> float:
    folder = Path(tempfile.mkdtemp(prefix="containcost-", dir=root))
    try:
        start = time.perf_counter()
        for n in range(spawns):
            arm(folder, n)
        return (time.perf_counter() - start) * 1000 / spawns
    finally:
        shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawns", type=int, default=500)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--root", type=Path, default=Path("/dev/shm"))
    args = parser.parse_args()
    cells = containment.Containment.for_worker(f"containcost-{os.getpid()}")
    if not cells.contained:
        raise SystemExit(f"containcost: no cgroups here ({cells.status.reason})")
    try:
        found = arms(cells)
        for arm in found.values():
            timed(arm, args.root, 30)
        samples: dict[str, list[float]] = {name: [] for name in found}
        diffs: list[float] = []
        for block in range(args.blocks):
            order = ["plain", "contained"] if block % 2 == 0 else ["contained", "plain"]
            for half in (order, order[::-1]):
                got = {name: timed(found[name], args.root, args.spawns) for name in half}
                for name, ms in got.items():
                    samples[name].append(round(ms, 4))
                diffs.append(round(got["contained"] - got["plain"], 4))
    finally:
        cells.close()
    print(
        json.dumps(
            {
                "containment": cells.status.as_dict(),
                "spawns_per_sample": args.spawns,
                "ms_per_spawn": {
                    n: {"median": statistics.median(s), "samples": s} for n, s in samples.items()
                },
                "extra_ms_per_job": {"median": statistics.median(diffs), "samples": diffs},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
