"""What the parts of one worker share for as long as it runs: its queue and
identity, the attempts running now (by job id) and its capacity, the report,
the lease guard, and the backoff that holds back every write after one failed."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from spoolctl.config import Timing
from spoolctl.db.backends.base import LeaseGuard, OutputWriter
from spoolctl.db.engine import HeldConnection
from spoolctl.db.queue import Queue
from spoolctl.errors import DiskFull, Locked, Unreachable
from spoolctl.runner import containment, procs, supervise
from spoolctl.runner.capacity import Capacity
from spoolctl.services.outcome import Outcome
from spoolctl.states import JobState
from spoolctl.worker.report import AttemptResult, LogSink, WorkerOptions, WorkReport

LOCK_SLICE_S = 0.25
"""The longest one write waits for the lock before the loop runs again."""
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
"""Backoff between writes that found the lock busy, the disk full or the
server unreachable."""
TRANSIENT = (Locked, Unreachable, DiskFull)
"""What a running worker retries instead of stopping (Unreachable named on
its own: it need not stay a kind of Locked)."""


@dataclass
class Backoff:
    """After a write that could not land, every write waits: RETRY_FIRST_S,
    doubling to RETRY_MAX_S (the loop keeps enforcing timeouts and handling
    signals meanwhile)."""

    retry_s: float = 0.0
    blocked_until: float = 0.0

    def failed(self, now: float) -> None:
        self.retry_s = min(max(self.retry_s * 2, RETRY_FIRST_S), RETRY_MAX_S)
        self.blocked_until = now + self.retry_s

    def ok(self) -> None:
        self.retry_s = 0.0
        self.blocked_until = 0.0

    def blocks(self, now: float) -> bool:
        return now < self.blocked_until


@dataclass(frozen=True)
class Predecessor:
    """A dead process that held a worker id before the one holding it now."""

    identity: procs.ProcessIdentity
    boot_id: str | None


@dataclass
class Shift:
    queue: Queue
    options: WorkerOptions
    timing: Timing
    worker_id: str
    report: WorkReport
    output: OutputWriter
    """Where running attempts' output is stored beyond their files."""
    clock: Callable[[], float]
    identity: procs.ProcessIdentity = field(default_factory=procs.self_identity)
    hostname: str = field(default_factory=procs.hostname)
    boot_id: str = field(default_factory=procs.boot_id)
    pid_space: str | None = field(default_factory=procs.pid_space)
    """Where this worker's pid means it (machine, PID and cgroup namespace)."""
    predecessor: Predecessor | None = None
    """The process that held this worker id before, on this machine and in
    this pid space, found gone when this one registered: the jobs it claimed
    are judged by it, the row that told of it being this worker's now."""
    running: dict[int, supervise.Execution] = field(default_factory=dict)
    backoff: Backoff = field(default_factory=Backoff)
    guard: LeaseGuard | None = None
    on_result: Callable[[WorkReport], None] | None = None
    log: LogSink | None = None
    last_beat: float = 0.0
    """When the last heartbeat landed (the lease is counted from it)."""
    last_reap_pass: float = 0.0
    fenced: bool = False
    """No heartbeat landed for half the hang threshold: claim nothing."""
    db_gone: bool = False
    """The queue file was deleted or replaced: write nothing more."""
    held: HeldConnection = field(init=False)
    """The connection of the claim-and-record transactions, one per job."""
    capacity: Capacity = field(init=False)
    """Its slots (`--concurrency`), the place of each running attempt, and
    its lane's cap (`--slots`)."""
    cells: containment.Containment = field(default_factory=containment.Containment.none)
    """Where this worker contains its attempts (a cgroup each, where it can):
    probed when it starts to serve (`Worker.run`), process groups until then."""

    def __post_init__(self) -> None:
        self.held = HeldConnection(self.queue.engine)
        options = self.options
        self.capacity = Capacity(
            options.concurrency,
            options.cap,
            memory_bytes=options.memory_bytes,
            devices=options.gpus,
            host=self.hostname,
            manages_gpus=options.manages_gpus,
        )

    @property
    def engine(self) -> Engine:
        return self.queue.engine

    @property
    def beat_every(self) -> float:
        """The heartbeat interval, at most a quarter of the hang threshold."""
        hang = self.timing.hang_threshold_s
        beat = self.timing.heartbeat_interval_s
        return min(beat, hang / 4) if hang > 0 else beat

    def forget_running(self) -> None:
        """The worker stops: what still ran is over or left to the reaper,
        and every place is free."""
        self.running.clear()
        self.capacity.release_all()

    def spared(self) -> frozenset[int]:
        """What a reap must never kill: this worker and its jobs' leaders
        (whose groups and sessions are theirs: `procs.belongs_to`)."""
        leaders = {e.proc.pid for e in self.running.values() if e.proc is not None}
        return frozenset({self.identity.pid, *leaders})

    def guard_groups(self) -> None:
        """Tell the lease guard which process groups run now."""
        if self.guard is not None:
            self.guard.track({e.proc.pid for e in self.running.values() if e.proc is not None})

    def ended(self, now: float) -> list[tuple[supervise.Execution, Outcome]]:
        """Attempts whose process group is over, with their outcome (still in
        `running` until the outcome is recorded)."""
        found = []
        for execution in self.running.values():
            outcome = execution.poll(now)
            if outcome is not None:
                found.append((execution, outcome))
        return found

    def spawns_unrecorded(self, now: float, after_s: float) -> list[supervise.Execution]:
        """Running jobs spawned at least `after_s` ago whose spawn record has
        not landed, and whose leader has not been waited for (one that has is
        gone: its pid goes with its outcome, while the write of that lags)."""
        return [
            e
            for e in self.running.values()
            if e.proc is not None
            and e.returncode is None
            and not e.spawn_recorded
            and now >= e.started_at + after_s
        ]

    def finished_one(
        self, execution: supervise.Execution, outcome: Outcome | None, state: JobState | None
    ) -> None:
        """The attempt's end is recorded (outcome None or state None: this
        worker lost it to a cancel, a reap or a forced retry)."""
        del self.running[execution.claim.job_id]
        self.capacity.release(execution.place)
        self.output.forget(execution.claim.attempt_id)
        label = "lost_ownership" if outcome is None or state is None else outcome.label
        self.report.add(
            AttemptResult(
                execution.claim.job_id,
                execution.claim.attempt_no,
                label,
                None if state is None else state.value,
            )
        )
        if self.on_result is not None and outcome is not None:
            self.on_result(self.report)
        if self.log is not None:
            self.log(ended_record(self, execution, outcome, state, label))

    def db_due(self, due_at: float) -> float:
        """When a database duty due at `due_at` can run (after the backoff)."""
        return max(due_at, self.backoff.blocked_until)


NEVER = math.inf


def ended_record(
    shift: Shift,
    execution: supervise.Execution,
    outcome: Outcome | None,
    state: JobState | None,
    label: str,
) -> dict[str, Any]:
    """The log record of an attempt's recorded end."""
    claim = execution.claim
    return {
        "event": "attempt_ended",
        "at": time.time(),
        "worker_id": shift.worker_id,
        "queue": claim.queue,
        "job_id": claim.job_id,
        "attempt_id": claim.attempt_id,
        "attempt_no": claim.attempt_no,
        "result": label,
        "exit_code": None if outcome is None else outcome.exit_code,
        "signal": None if outcome is None else outcome.signal,
        "failure_reason": None
        if outcome is None or outcome.reason is None
        else outcome.reason.value,
        "error": None if outcome is None else outcome.error,
        "duration_s": round(max(0.0, shift.clock() - execution.started_at), 6)
        if execution.started_at
        else None,
        "job_state": None if state is None else state.value,
    }
