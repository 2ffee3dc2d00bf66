"""The claim's two values: who claims (`Claimant`, the same for every claim
of one worker) and what one claim gives a worker (`Claim`, everything an
attempt needs, fixed at claim time). Apart from the claim itself
(`services/claim.py`), so that what runs an attempt (`runner/`) needs only
the value, not the claim's statements."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from spoolctl.resources import PLAIN, Inventory, Request
from spoolctl.runner import procs
from spoolctl.runner.containment import NO_LIMITS, Limits
from spoolctl.services import claim_limits


@dataclass(frozen=True)
class Claim:
    """Everything a worker needs to run one attempt, fixed at claim time."""

    job_id: int
    attempt_id: int
    attempt_no: int
    argv: list[str]
    cwd: str | None
    env: dict[str, str]
    timeout_seconds: int
    queue: str
    stdout_path: str
    stderr_path: str
    token: str = ""
    """SPOOLCTL_ATTEMPT_TOKEN: set in the job's environment before it is spawned."""
    limits: Limits = NO_LIMITS
    """The job's --memory and --cpus (enforced where the worker's cgroups can)."""
    warning: tuple[str, int] | None = None
    """`add --signal-before-timeout`: the signal's name and how many seconds
    before the timeout it is sent."""
    requeues: int = 0
    """How many times a `--requeue-exit` code requeued the job so far."""
    request: Request = PLAIN
    """What the job asked for (its weight, GPUs, memory)."""
    devices: tuple[str, ...] = ()
    """The UUIDs of the GPUs the claim gave the attempt (held in the database)."""


def steering_of(row: Any) -> dict[str, Any]:
    """The warning and the requeues a claimed row carries (a row read
    without their columns: none; a warning this platform cannot send, or a
    duration below 1 s, which only a damaged row holds: none)."""
    name = getattr(row, "signal_before_timeout", None)
    before_s = getattr(row, "signal_before_timeout_s", None)
    sendable = isinstance(getattr(signal.Signals, str(name), None), signal.Signals)
    fits = isinstance(before_s, int) and before_s > 0
    warning = (str(name), before_s) if sendable and fits else None
    requeues = getattr(row, "requeues", None)
    return {"warning": warning, "requeues": requeues if isinstance(requeues, int) else 0}


class LaneCap(Protocol):
    """A lane's cap (`work --slots`) as a claimant applies it: a worker's
    `runner.capacity.Capacity`."""

    @property
    def lane_cap(self) -> int | None:
        """At most this many of the lane's jobs running fleet-wide (None: no cap)."""
        ...

    def within_lane_cap(self, wanted: int, running: int) -> int:
        """How many of `wanted` the cap lets start while `running` run."""
        ...


@dataclass(frozen=True)
class Claimant:
    """Who claims, the same for every claim of one worker."""

    worker_id: str
    worker_pid: int
    lane: str
    """The lane it claims from."""
    output_root: Path
    """Where its attempts write their output files (`layout.attempt_paths`)."""
    cap: LaneCap | None = None
    """The lane's cap it claims within (None: none)."""
    enforces: tuple[bool, bool] = (False, False)
    """The limits (memory, cpu) its cgroups can enforce: a job that requires
    one it cannot is left to another worker."""
    inventory: Inventory | None = None
    """What it has to place jobs on (None: its slots only)."""
    live_within_s: float = 30.0
    """A worker heartbeating within this long is alive (the reap threshold):
    who may reserve for a big job."""

    @property
    def host(self) -> str:
        return self.inventory.host if self.inventory is not None else procs.hostname()

    @cached_property
    def binds(self) -> dict[str, Any]:
        """The claim statement's values that stay the same from claim to claim."""
        return {
            "b_queue": self.lane,
            "b_worker": self.worker_id,
            "b_pid": self.worker_pid,
            "b_root": str(self.output_root),
            "b_host": self.host,
            **claim_limits.binds(self.enforces),
        }
