"""What one job's spawn costs the worker: subprocess.Popen against os.posix_spawn.

    .venv/bin/python bench/spawncost.py [--spawns 1000] [--blocks 3] [--root /dev/shm]

Each arm starts `true` --spawns times as the worker does (open the attempt's
two output files for append, start the job as a new session's leader on
them with the job's environment, close the files, wait for the exit), in a
fresh folder under --root (a tmpfs by default: the disk's own cost is not
what is compared). `popen` is `procs.spawn_group` (what every job went
through before), `posix` is `spawn.Spawner` (posix_spawn, its close_range
and its PATH lookup). The arms run in blocks A B B A, the next block B A A B,
so drift from other load falls on both alike; per block half, the ratio of
the two adjacent runs. Also timed alone: the close_range call, a PATH search
and a remembered lookup. Prints one JSON object: ms per spawn, wall and the
worker's own CPU (median and every sample per arm), the per-pair ratios, and
the parts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from spoolctl.runner import procs, spawn
from spoolctl.runner.supervise import open_output

Starter = Callable[[list[str], dict[bytes, bytes], Path, int], None]


def popen_arm() -> Starter:
    def one(argv: list[str], env: dict[bytes, bytes], folder: Path, n: int) -> None:
        out, err = open_output(str(folder / f"{n}.stdout"), str(folder / f"{n}.stderr"))
        with out, err:
            proc = procs.spawn_group(argv, cwd=None, env=env, stdout=out, stderr=err)
        proc.wait()

    return one


def posix_arm() -> Starter:
    spawner = spawn.Spawner(spawn.cloexec_from_3())
    if not spawner.uses_posix_spawn:
        raise SystemExit("spawncost: no posix_spawn with close_range here")

    def one(argv: list[str], env: dict[bytes, bytes], folder: Path, n: int) -> None:
        out, err = open_output(str(folder / f"{n}.stdout"), str(folder / f"{n}.stderr"))
        with out, err:
            proc = spawner.start(argv, cwd=None, env=env, stdout=out, stderr=err)
        proc.wait()

    return one


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def timed_run(
    one: Starter, env: dict[bytes, bytes], root: Path, spawns: int
) -> tuple[float, float]:
    """Milliseconds per spawn over `spawns` jobs in a fresh folder: wall
    time, and the worker's own CPU time (user + system, this process only:
    what a busy machine's other load inflates least)."""
    folder = Path(tempfile.mkdtemp(prefix="spawncost-", dir=root))
    try:
        cpu, start = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
        for n in range(spawns):
            one(["true"], env, folder, n)
        wall = time.perf_counter() - start
        return wall * 1000 / spawns, (cpu_s(resource.RUSAGE_SELF) - cpu) * 1000 / spawns
    finally:
        shutil.rmtree(folder)


def part_us(fn: Callable[[], object], reps: int = 20000) -> float:
    """Microseconds per call of fn (median of 5 rounds)."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        rounds.append((time.perf_counter() - start) * 1e6 / reps)
    return statistics.median(rounds)


def parts(env: dict[bytes, bytes]) -> dict[str, float]:
    mark = spawn.cloexec_from_3()
    searched = spawn.Spawner(mark)
    path_key = (env.get(b"PATH"), b"true")

    def search() -> object:
        for folder in os.get_exec_path(env):  # type: ignore[arg-type]
            candidate = os.path.join(os.fsencode(folder), b"true")
            if not spawn._missing(candidate):
                return candidate
        return None

    def remembered() -> object:
        found = searched._paths.get(path_key)
        return found is not None and time.monotonic() - found[1] < spawn.PATH_CACHE_TTL_S

    return {
        "close_range_us": part_us(mark) if mark is not None else float("nan"),
        "path_search_us": part_us(search),
        "path_remembered_us": part_us(remembered),
        "fds_open": len(os.listdir("/proc/self/fd")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawns", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--root", type=Path, default=Path("/dev/shm"))
    args = parser.parse_args()
    env = dict(os.environb)
    env.update({b"SPOOLCTL_JOB_ID": b"1", b"SPOOLCTL_ATTEMPT_TOKEN": b"bench/1/0.0"})
    arms = {"popen": popen_arm(), "posix": posix_arm()}
    for one in arms.values():  # warm-up: imports, caches, the page cache
        timed_run(one, env, args.root, 50)
    walls: dict[str, list[float]] = {name: [] for name in arms}
    cpus: dict[str, list[float]] = {name: [] for name in arms}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for block in range(args.blocks):
        order = ["popen", "posix"] if block % 2 == 0 else ["posix", "popen"]
        for half in (order, order[::-1]):
            got = {name: timed_run(arms[name], env, args.root, args.spawns) for name in half}
            for name, (wall, cpu) in got.items():
                walls[name].append(wall)
                cpus[name].append(cpu)
            ratios["wall"].append(got["posix"][0] / got["popen"][0])
            ratios["cpu"].append(got["posix"][1] / got["popen"][1])
    wall_ms = {name: statistics.median(values) for name, values in walls.items()}
    cpu_ms = {name: statistics.median(values) for name, values in cpus.items()}
    result = {
        "spawns_per_run": args.spawns,
        "runs_per_arm": 2 * args.blocks,
        "root": str(args.root),
        "python": sys.version.split()[0],
        "wall_ms_per_spawn": wall_ms,
        "worker_cpu_ms_per_spawn": cpu_ms,
        "saved_ms_per_spawn": {
            "wall": wall_ms["popen"] - wall_ms["posix"],
            "worker_cpu": cpu_ms["popen"] - cpu_ms["posix"],
        },
        "posix_over_popen": {
            kind: {"median": statistics.median(r), "min": min(r), "max": max(r)}
            for kind, r in ratios.items()
        },
        "samples_wall_ms": walls,
        "samples_worker_cpu_ms": cpus,
        "parts": parts(env),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
