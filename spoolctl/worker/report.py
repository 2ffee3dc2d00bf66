"""What a worker is told to do, and what it reports when it stops."""

from __future__ import annotations

import os
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from spoolctl import procs

Mode = Literal["loop", "once", "drain"]


@dataclass(frozen=True)
class WorkerOptions:
    queue: str = "default"
    mode: Mode = "loop"
    slots: int | None = None
    worker_id: str | None = None
    poll_interval_s: float = 1.0
    concurrency: int = 1
    server_wait_s: float | None = None
    """How long a start waits for a server that cannot be reached (None:
    until it answers or a signal comes); then the server's error is raised."""


@dataclass
class AttemptResult:
    job_id: int
    attempt_no: int
    result: str
    job_state: str | None


@dataclass
class WorkReport:
    worker_id: str
    claimed: int = 0
    results: list[AttemptResult] = field(default_factory=list)
    drained: bool = False
    stopped_by_signal: bool = False
    paused: bool = False
    """A drain that stopped because its lane is paused (nothing of it running)."""
    tally: Counter[str] = field(default_factory=Counter)
    """How many results of each kind: kept as they come, so a progress line
    costs the same at the millionth job as at the first."""

    def add(self, result: AttemptResult) -> None:
        self.results.append(result)
        self.tally[result.result] += 1


def default_worker_id() -> str:
    return f"{procs.hostname()}-{os.getpid()}-{secrets.token_hex(3)}"
