"""What a worker is told to do, and what it reports when it stops."""

from __future__ import annotations

import os
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from spoolctl.resources import Device
from spoolctl.runner import procs
from spoolctl.services.outcome import SUCCEEDED

Mode = Literal["loop", "once", "drain"]
LogSink = Callable[[dict[str, Any]], None]
"""Told one record per attempt start, attempt end and reap (`work
--log-format json` writes each as a JSON line; keys in docs/monitoring.md)."""


@dataclass(frozen=True)
class WorkerOptions:
    lane: str = "default"
    """The one lane this worker serves (`--queue`)."""
    mode: Mode = "loop"
    cap: int | None = None
    """The lane's cap on its running jobs across every worker (`--slots`)."""
    worker_id: str | None = None
    poll_interval_s: float = 1.0
    concurrency: int = 1
    gpus: tuple[Device, ...] = ()
    """The GPUs it places jobs on (`work --gpus`, found by `runner/gpus.py`)."""
    manages_gpus: bool = False
    """`work --gpus` was given (`none` or finding none included): every job's
    environment names its GPUs, and one without a GPU request sees none."""
    memory_bytes: int | None = None
    """Its memory budget (`work --memory`): jobs' --memory is reserved against it."""
    server_wait_s: float | None = None
    """How long a start waits for a server that cannot be reached (None:
    until it answers or a signal comes); then the server's error is raised."""


@dataclass
class AttemptResult:
    job_id: int
    attempt_no: int
    result: str
    job_state: str | None


class Span:
    """Seconds spent inside `with span:` blocks, added up (a block entered
    inside another of the same span counts once). Two clock reads per block:
    cheap enough to leave on in every worker, so a benchmark or an operator
    can see where a worker's time goes without a profiler's overhead."""

    __slots__ = ("_depth", "_entered", "total_s")

    def __init__(self) -> None:
        self.total_s = 0.0
        self._depth = 0
        self._entered = 0.0

    def __enter__(self) -> None:
        if self._depth == 0:
            self._entered = time.perf_counter()
        self._depth += 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.total_s += time.perf_counter() - self._entered


@dataclass
class WorkTimings:
    """Where a worker's time went (`work --json`'s `timings`): `db`, the
    loop's database work (each claim-and-record transaction from its begin
    to its commit, heartbeats, spawn records, output passes, reap passes,
    the drain's end check; not registering or retiring); `spawn`, starting
    jobs (`Execution.start`: the files, the spawn); `wall`, the whole of
    `Worker.run`. The rest of wall is the loop itself and its waits."""

    db: Span = field(default_factory=Span)
    spawn: Span = field(default_factory=Span)
    wall: Span = field(default_factory=Span)


UNSUCCESSFUL_KEPT = 1000
"""How many attempts that did not succeed a report lists (the newest): a
worker that lives for months keeps a bounded report, and its text stays
readable."""


@dataclass
class WorkReport:
    """What a worker did: counts kept as attempts end, the last result, and
    the newest attempts that did not succeed. Nothing in it grows with the
    number of jobs, so a long-lived worker's memory and per-job cost stay flat."""

    worker_id: str
    claimed: int = 0
    executed: int = 0
    """Attempts whose end this worker recorded (or lost to someone else)."""
    last: AttemptResult | None = None
    unsuccessful: deque[AttemptResult] = field(
        default_factory=lambda: deque(maxlen=UNSUCCESSFUL_KEPT)
    )
    drained: bool = False
    stopped_by_signal: bool = False
    paused: bool = False
    """A drain that stopped because its lane is paused (nothing of it running)."""
    tally: Counter[str] = field(default_factory=Counter)
    """How many results of each kind: kept as they come, so a progress line
    costs the same at the millionth job as at the first."""
    timings: WorkTimings = field(default_factory=WorkTimings)

    def add(self, result: AttemptResult) -> None:
        self.executed += 1
        self.last = result
        self.tally[result.result] += 1
        if result.result != SUCCEEDED:
            self.unsuccessful.append(result)

    @property
    def succeeded(self) -> int:
        return self.tally[SUCCEEDED]

    @property
    def unlisted(self) -> int:
        """Attempts that did not succeed, older than those `unsuccessful` keeps."""
        return self.executed - self.succeeded - len(self.unsuccessful)


def default_worker_id() -> str:
    return f"{procs.hostname()}-{os.getpid()}-{secrets.token_hex(3)}"
