"""Where a worker's own CPU goes per job, by step, without a profiler's
overhead: each step of the loop is wrapped to add up `time.process_time()`
(the CPU clock: a wait that blocks costs nothing), then the command runs
in-process.

    PYTHONPATH=TREE .venv/bin/python bench/passcost.py work --db Q --drain

Prints, per job started, the CPU of: the loop as a whole; a pass
(`Settler.settle_and_claim`: the write transaction, `services.settle.settle`'s
statements and the bookkeeping around them); starting a claimed job (its two
output files, its environment, the spawn, its pidfd); looking for ended jobs;
the periodic duties; the wait's own work. Fill the queue first (`add
--batch`); run it once over a fresh output folder and once over one that
already holds the files, to see what creating the files costs.
"""

from __future__ import annotations

import atexit
import collections
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any

from spoolctl.runner import spawn, supervise
from spoolctl.worker import duties, firing
from spoolctl.worker import settle as worker_settle
from spoolctl.worker.loop import Worker
from spoolctl.worker.settle import Settler
from spoolctl.worker.shift import Shift

SPENT: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()
START = "start: files, environment, spawn"


def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[label] += time.process_time() - began
            CALLS[label] += 1

    return wrapper


def wrap_method(cls: type, name: str, label: str) -> None:
    setattr(cls, name, timed(label, getattr(cls, name)))


wrap_method(Worker, "_loop", "the loop, all told")
wrap_method(Settler, "settle_and_claim", "pass: transaction, SQL, bookkeeping")
worker_settle.settle = timed("  of which settle(): the statements", worker_settle.settle)
wrap_method(Settler, "start", START)
supervise.open_output = timed("  of which the two output files", supervise.open_output)
wrap_method(spawn.Spawner, "start", "  of which the spawn")
supervise.job_environment = timed("  of which the environment", supervise.job_environment)
wrap_method(Shift, "ended", "looking for ended jobs")
wrap_method(Worker, "_wait", "the wait's own work")
for duty in (
    duties.Heartbeat,
    duties.LeaseFence,
    duties.ReapPass,
    duties.SpawnRecords,
    duties.OutputPass,
    firing.ScheduleFiring,
):
    wrap_method(duty, "run", "the periodic duties")


@atexit.register
def report() -> None:
    jobs = CALLS[START] or 1
    print(f"{CALLS[START]} jobs started; worker CPU per job:", file=sys.stderr)
    for label, spent in sorted(SPENT.items(), key=lambda item: -item[1]):
        print(f"{label:45s} {spent * 1e6 / jobs:8.0f} us", file=sys.stderr)


sys.argv = ["spoolctl", *sys.argv[1:]]
runpy.run_module("spoolctl", run_name="__main__", alter_sys=True)
