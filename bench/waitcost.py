"""What a worker's sleep between short jobs costs the work that follows it.

    .venv/bin/python bench/waitcost.py [--passes 3000] [--spawns 2500] [--root /dev/shm]

Two measurements, each arm in blocks A B C, C B A so drift falls on all alike:

- `pass`: the worker's claim-and-record pass in-process (the held
  connection's write transaction, `record_outcomes` of the previous job's
  success, `claim_up_to` one job, commit) over a queue of due `true` jobs,
  back to back (`none`), after sleeping GAP in poll() between passes
  (`sleep`), and after spinning GAP between them (`spin`: poll without a
  timeout and sched_yield, as `wakeup.readable` does). Only the pass is timed.
- `spawn`: a spawn of `true` as the worker does it (`spawn.Spawner`, the two
  output files) and the wait for its exit, with a busy GAP before each
  spawn (`gap`) against none (`none`): how much the spawn itself costs once
  the other CPU has had time to go idle.

Prints one JSON object: microseconds per pass (and its parts) and per spawn,
median over the blocks, every sample per arm. GAP is --gap-us (600: about a
`true` job's life after its spawn).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fixtures import OURS, clone_queued, seed

from spoolctl import spawn
from spoolctl.db.backends import sqlite_at
from spoolctl.db.engine import HeldConnection
from spoolctl.db.queue import open_for_write
from spoolctl.services.claim import Claimant, claim_up_to
from spoolctl.services.execute import open_output
from spoolctl.services.outcome import Ending, Outcome, record_outcomes
from spoolctl.wakeup import readable

SUCCESS = Outcome(exit_code=0, reason=None)


def _between(how: str, gap_s: float) -> None:
    if how == "sleep":
        select.select([], [], [], gap_s)
    elif how == "spin":
        readable([], gap_s, spin_s=gap_s)
    elif how == "gap":
        end = time.perf_counter() + gap_s
        while time.perf_counter() < end:
            pass


def passes(root: Path, count: int, how: str, gap_s: float) -> dict[str, float]:
    """Microseconds per pass, and per part (begin, record, claim, commit)."""
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        db = Path(tmp) / "q.db"
        seed(OURS, db, Path(tmp))
        clone_queued(db, count + 1, time.time())
        queue = open_for_write(sqlite_at(db))
        held = HeldConnection(queue.engine)
        parts = [0.0, 0.0, 0.0, 0.0]
        previous = None
        try:
            for _ in range(count):
                now = time.time()
                t0 = time.perf_counter()
                with held.write_tx(0.25) as conn:
                    t1 = time.perf_counter()
                    if previous is not None:
                        ending = Ending(
                            previous.job_id, previous.attempt_id, previous.attempt_no, SUCCESS, None
                        )
                        record_outcomes(conn, [ending], worker_id="bench", now=now)
                    t2 = time.perf_counter()
                    claimant = Claimant("bench", os.getpid(), "default", queue.output_root)
                    (previous,) = claim_up_to(conn, claimant, 1, now)
                    t3 = time.perf_counter()
                t4 = time.perf_counter()
                for i, span in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    parts[i] += span
                _between(how, gap_s)
        finally:
            held.close()
            queue.engine.dispose()
    us = [1e6 * p / count for p in parts]
    return {"pass": sum(us), "begin": us[0], "record": us[1], "claim": us[2], "commit": us[3]}


def spawns(root: Path, count: int, how: str, gap_s: float) -> dict[str, float]:
    """Microseconds per spawn call, and per spawn-and-wait."""
    spawner = spawn.Spawner(spawn.cloexec_from_3())
    env = dict(os.environb)
    spent = total = 0.0
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        for n in range(count):
            _between(how, gap_s)
            t0 = time.perf_counter()
            out, err = open_output(f"{tmp}/{n}.out", f"{tmp}/{n}.err")
            with out, err:
                t1 = time.perf_counter()
                proc = spawner.start(["true"], cwd=None, env=env, stdout=out, stderr=err)
                spent += time.perf_counter() - t1
            proc.wait()
            total += time.perf_counter() - t0
    return {"spawn": 1e6 * spent / count, "spawn_and_wait": 1e6 * total / count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3000)
    parser.add_argument("--spawns", type=int, default=2500)
    parser.add_argument("--gap-us", type=float, default=600.0)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path("/dev/shm"))
    args = parser.parse_args()
    gap_s = args.gap_us / 1e6
    samples: dict[str, list[dict[str, float]]] = {}
    for block in range(args.blocks):
        order = ["none", "sleep", "spin"]
        for how in order if block % 2 == 0 else order[::-1]:
            run = passes(args.root, args.passes, how, gap_s)
            samples.setdefault(f"pass:{how}", []).append(run)
        for how in ["none", "gap"] if block % 2 == 0 else ["gap", "none"]:
            run = spawns(args.root, args.spawns, how, gap_s)
            samples.setdefault(f"spawn:{how}", []).append(run)
    result: dict[str, Any] = {"gap_us": args.gap_us, "root": str(args.root), "blocks": args.blocks}
    for arm, runs in samples.items():
        result[arm] = {
            key: round(statistics.median(run[key] for run in runs), 1) for key in runs[0]
        } | {"samples": runs}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
