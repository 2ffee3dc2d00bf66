"""The worker: reap -> claim -> execute -> record, for one queue.

One process runs up to `concurrency` attempts at once from a single-threaded
loop: children are watched through pidfds, new work is noticed through the
queue's change watch (its driver's: SQLite's `PRAGMA data_version`,
PostgreSQL's LISTEN/NOTIFY), and heartbeats, timeouts and signals are handled
between waits. No transaction is open while a child runs; every transaction
is short, and takes the backend's write lock as it opens.

The loop never stalls: a write that cannot get the lock within a short slice,
or that finds the disk full, is retried with bounded backoff while timeouts,
signals and group kills go on. A worker whose heartbeats have not landed for
half the hang threshold kills its jobs and claims nothing (`lease.py`).

Where the driver's output writer stores output beyond the files (PostgreSQL:
a copy in the database) the worker gives it its running jobs' new output
every pass it asks for, and what is left in the transaction that records
the outcome; where the driver has a lease guard (workers on other machines
cannot check this one's processes) it keeps it informed. A worker
started while the server cannot be reached waits for it before it registers
(`outage.py`), and one that loses it later keeps its loop and retries.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import Connection

from spoolctl import outage, procs
from spoolctl.config import Timing
from spoolctl.db.backends.base import ChangeWatch, LeaseGuard
from spoolctl.db.engine import HeldConnection, read_tx, write_quietly, write_tx
from spoolctl.db.queue import Queue
from spoolctl.errors import Conflict, DiskFull, Locked, StorageFault, Unreachable
from spoolctl.outage import Reconnecting
from spoolctl.reaping import Reaping
from spoolctl.services import claim as claiming
from spoolctl.services import execute, heartbeat, lanes, lease, reaper
from spoolctl.services.outcome import Outcome, record_outcome
from spoolctl.states import FailureReason, JobState
from spoolctl.wakeup import Signals, StopRequested, counting_signals, wait_readable

Mode = Literal["loop", "once", "drain"]
WATCH_TICK_S = 0.03
GUARD_FENCE_SHARE = 0.75
"""The lease guard kills a silent worker's jobs at this share of the hang
threshold: a live worker has fenced itself at half of it already."""
LISTEN_TICK_S = 0.5
"""With a LISTEN connection a NOTIFY wakes the worker; the watch's own
polling fallback runs at this tick."""
"""How often an idle worker looks at the database's change counter."""
NO_PIDFD_TICK_S = 0.005
LOCK_SLICE_S = 0.25
"""The longest one write waits for the lock before the loop runs again."""
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
"""Backoff between writes that found the lock busy, the disk full or the
server unreachable."""
TRANSIENT = (Locked, Unreachable, DiskFull)
"""What a running worker retries instead of stopping (Unreachable named on
its own: it need not stay a kind of Locked)."""
HARD_STOP_RECORD_S = 5.0
"""After a second signal, how long the worker tries to record its killed jobs."""


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


class Worker:
    """Runs jobs of one lane of a queue until its mode says stop."""

    def __init__(
        self,
        queue: Queue,
        options: WorkerOptions,
        timing: Timing,
        on_result: Callable[[WorkReport], None] | None = None,
        prepare: Callable[[], None] = lambda: None,
        on_wait: outage.OutageListener | None = None,
    ) -> None:
        self.queue = queue
        self.engine = engine = queue.engine
        self.prepare = prepare
        """Makes the schema usable (run before registering; may need the server)."""
        self.on_wait = on_wait
        """Told when the worker starts waiting for the server, and when it got through."""
        self.held = HeldConnection(engine)
        """The connection of the claim-and-record transactions, one per job."""
        self._job_env = execute.encoded_environment()
        """This process's environment, encoded once: the base of every job's."""
        self.output_root = queue.output_root
        self.options = options
        self.timing = timing
        self.clock = queue.clock()
        self.on_result = on_result
        self.worker_id = options.worker_id or default_worker_id()
        self._db_identity: object | None = None
        self._db_gone = False
        self.identity = procs.self_identity()
        self.hostname = procs.hostname()
        self.boot_id = procs.boot_id()
        self.running: dict[int, execute.Execution] = {}
        self.report = WorkReport(self.worker_id)
        self.signals = Signals()
        self.reaping = Reaping(
            engine, timing, self.worker_id, self.boot_id, self.hostname, self.clock, LOCK_SLICE_S
        )
        self._last_beat = 0.0
        self._next_claim_at = 0.0
        self._claim_exhausted = False
        self._blocked_until = 0.0
        self._retry_s = 0.0
        self._fenced = False
        self._last_reap_pass = 0.0
        self._watch: ChangeWatch | None = None
        self._guard: LeaseGuard | None = None
        self.output = queue.driver.output_writer()
        self._next_output_copy = 0.0
        hang = timing.hang_threshold_s
        self._beat_every = (
            min(timing.heartbeat_interval_s, hang / 4)
            if hang > 0
            else (timing.heartbeat_interval_s)
        )

    # -- lifecycle -------------------------------------------------------

    def run(self) -> WorkReport:
        with counting_signals() as self.signals:
            if self._connect():
                self._serve()
        self.report.stopped_by_signal = self.signals.count > 0
        return self.report

    def _serve(self) -> None:
        watch = self.queue.driver.change_watch(self.engine)
        self._watch = watch
        hang = self.timing.hang_threshold_s
        if hang > 0:
            # After the worker's own fence (half the threshold), which records
            # its jobs as worker crashes; before others may requeue (the whole).
            self._guard = self.queue.driver.lease_guard(hang * GUARD_FENCE_SHARE)
        try:
            try:
                self._loop(watch)
            finally:
                self._shutdown()
        finally:
            self.held.close()
            watch.close()
            if self._guard is not None:
                self._guard.close()

    # -- connecting ------------------------------------------------------

    def _connect(self) -> bool:
        """Make the schema usable and register, waiting out a server that
        cannot be reached (`outage.py`) for up to options.server_wait_s
        (then `Unreachable`). False when a stop signal ended the wait:
        nothing was registered."""
        server = Reconnecting(self.signals, self.on_wait)

        def attempt() -> None:
            if server.outage is None:
                self.prepare()
            else:  # a try that hangs on a silent server is abandoned on a signal
                with self.signals.interruptible():
                    self.prepare()
            self._db_identity = self.queue.driver.identity()
            self._register(server.outage, server.try_began)

        try:
            server.call(attempt, patience_s=self.options.server_wait_s)
        except StopRequested:
            return False
        return True

    def _guard_groups(self) -> None:
        """Tell the lease guard which process groups run now (PostgreSQL)."""
        if self._guard is not None:
            self._guard.track({e.proc.pid for e in self.running.values() if e.proc is not None})

    def _register(self, waited: outage.Outage | None, tried_at: float) -> None:
        """The worker's row; after an outage, with an event saying how long
        the worker waited for the server (`workers` shows it)."""
        now = self.clock()
        with write_tx(self.engine) as conn:
            existing = heartbeat.get_worker(conn, self.worker_id)
            if existing is not None and existing.state == "running":
                other = procs.ProcessIdentity(existing.pid, existing.process_started_at)
                alive = procs.is_same_process(other, procs.WORKER_MARKER)
                if existing.pid != self.identity.pid and alive is not procs.Liveness.DEAD:
                    raise Conflict(
                        f"worker id {self.worker_id!r} is in use by live pid {existing.pid}",
                        worker_id=self.worker_id,
                    )
            heartbeat.register_worker(
                conn,
                heartbeat.WorkerInfo(
                    id=self.worker_id,
                    hostname=self.hostname,
                    pid=self.identity.pid,
                    process_started_at=self.identity.started_at,
                    boot_id=self.boot_id,
                    queue=self.options.queue,
                    slots=self.options.slots,
                    concurrency=self.options.concurrency,
                ),
                now,
            )
            if waited is not None:
                heartbeat.record_server_wait(
                    conn,
                    self.worker_id,
                    self.options.queue,
                    heartbeat.ServerWait(waited.waited_s(tried_at), waited.failures, waited.error),
                    now,
                )
        self._last_beat = now

    def _shutdown(self) -> None:
        """Kill what still runs (only after a hard stop or a fatal error) and
        mark the worker stopped, best effort."""
        for execution in list(self.running.values()):
            execution.kill_now()
            execution.wait_blocking()
        self.running.clear()
        if self._db_gone:
            return
        try:
            with write_tx(self.engine) as conn:
                heartbeat.retire_worker(
                    conn, self.worker_id, self.clock(), len(self.report.results)
                )
        except Exception:
            pass

    # -- the loop --------------------------------------------------------

    def _loop(self, watch: ChangeWatch) -> None:
        while True:
            now = self.clock()
            if self.signals.count >= 2:
                self._hard_stop(now)
                return
            if now >= self._blocked_until:
                self._beat_if_due(now)
            self._fence_if_lease_lost(now)
            finished = self._ended(now)
            if now >= self._blocked_until:
                wanted = self._wanted(now, watch, len(finished))
                if finished or wanted:
                    for claim in self._settle_and_claim(now, finished, wanted):
                        self._start(claim, now)
                    self._guard_groups()
                self._record_spawns_due(now)
                self._copy_output_if_due(now)
                self._reap_if_due(now)
            if self._finished(now):
                return
            self._wait(now)

    def _ended(self, now: float) -> list[tuple[execute.Execution, Outcome]]:
        """Attempts whose process group is over, with their outcome (still in
        `running` until the outcome is recorded)."""
        ended = []
        for execution in self.running.values():
            outcome = execution.poll(now)
            if outcome is not None:
                ended.append((execution, outcome))
        return ended

    def _write_failed(self, now: float) -> None:
        """The lock stayed busy or the disk is full: try again after a backoff
        (the loop keeps enforcing timeouts and handling signals meanwhile)."""
        self._retry_s = min(max(self._retry_s * 2, RETRY_FIRST_S), RETRY_MAX_S)
        self._blocked_until = now + self._retry_s

    def _write_ok(self) -> None:
        self._retry_s = 0.0
        self._blocked_until = 0.0

    def _wanted(self, now: float, watch: ChangeWatch, ended: int) -> int:
        """How many jobs to try to claim now (0: none); `ended` attempts are
        about to free their slots."""
        if (
            self.signals.count
            or self._fenced
            or (self.options.mode == "once" and self.report.claimed)
        ):
            return 0
        free = self.options.concurrency - len(self.running) + ended
        if free <= 0:
            return 0
        something_ended = ended > 0
        changed = watch.changed()
        if not (
            changed or something_ended or not self._claim_exhausted or now >= self._next_claim_at
        ):
            return 0
        return 1 if self.options.mode == "once" else free

    def _settle_and_claim(
        self, now: float, ended: list[tuple[execute.Execution, Outcome]], wanted: int
    ) -> list[claiming.Claim]:
        """Record ended attempts and claim up to `wanted` (plus the slots they
        free) in one BEGIN IMMEDIATE transaction. The reap pass comes first: if
        a stale job is due for judging, nothing is claimed until it has been.
        Nothing is lost when the write fails: ended attempts stay in `running`
        and are recorded on a later pass."""
        try:
            with self.held.write_tx(LOCK_SLICE_S) as conn:
                self._copy_last_output(conn, ended)
                states = [self._settle(conn, e, o, now) for e, o in ended]
                stale = self.reaping.stale(conn, now, self.running) if wanted else []
                claims = [] if stale else self._claim_in(conn, now, wanted)
        except TRANSIENT:
            self.output.failed()
            self._write_failed(now)
            return []
        self._write_ok()
        self.output.landed()
        for (execution, outcome), state in zip(ended, states, strict=True):
            del self.running[execution.claim.job_id]
            self._forget_output(execution)
            self._report(execution, outcome, state)
        if wanted:
            self._last_reap_pass = now
        if stale:
            self.reaping.reap(stale, now)
            claims = self._claim_only(now, wanted)
        return claims

    def _copy_last_output(
        self, conn: Connection, ended: list[tuple[execute.Execution, Outcome]]
    ) -> None:
        """An ended attempt's remaining output is stored (where the writer
        stores any) in the transaction that records its outcome, so whoever
        sees it ended finds all of its output in the database."""
        if ended:
            ids = [execution.claim.attempt_id for execution, _ in ended]
            self.output.copy(conn, ids, final=True)

    def _settle(
        self, conn: Connection, execution: execute.Execution, outcome: Outcome, now: float
    ) -> JobState | None:
        if execution.proc is not None and not execution.spawn_recorded:
            execute.record_spawn(conn, execution, None)
        return record_outcome(
            conn,
            job_id=execution.claim.job_id,
            attempt_id=execution.claim.attempt_id,
            attempt_no=execution.claim.attempt_no,
            worker_id=self.worker_id,
            outcome=outcome,
            now=now,
        )

    def _claim_in(self, conn: Connection, now: float, wanted: int) -> list[claiming.Claim]:
        claims = []
        for _ in range(wanted):
            claim = claiming.claim_next(
                conn,
                worker_id=self.worker_id,
                worker_pid=self.identity.pid,
                queue=self.options.queue,
                slots=self.options.slots,
                output_root=self.output_root,
                now=now,
            )
            if claim is None:
                break
            claims.append(claim)
        self._claim_exhausted = len(claims) < wanted
        if self._claim_exhausted:
            self._next_claim_at = self._next_claim_time(conn, now)
        return claims

    def _claim_only(self, now: float, wanted: int) -> list[claiming.Claim]:
        try:
            with self.held.write_tx(LOCK_SLICE_S) as conn:
                return self._claim_in(conn, now, wanted)
        except TRANSIENT:
            self._write_failed(now)
            return []

    def _next_claim_time(self, conn: Connection, now: float) -> float:
        due = claiming.next_due_at(conn, self.options.queue)
        fallback = now + self.options.poll_interval_s
        return fallback if due is None or due <= now else min(due, fallback)

    def _start(self, claim: claiming.Claim, now: float) -> None:
        self.report.claimed += 1
        slot = self._free_slot()
        execution = execute.Execution(claim, slot)
        execution.start(self._job_env, self.worker_id, now)
        self.running[claim.job_id] = execution
        self.output.track(claim.attempt_id, {"stdout": claim.stdout_path,
                                              "stderr": claim.stderr_path})  # fmt: skip

    def _record_spawns_due(self, now: float) -> None:
        """Store the pid and start time of jobs that outlived the short delay.
        Retried on every pass until it lands: without it a reaper could not
        kill the job's group should this worker die, and the job could run
        twice at once."""
        due = [
            e
            for e in self.running.values()
            if e.proc is not None and not e.spawn_recorded and now >= e.record_spawn_at
        ]
        if not due:
            return

        def record(conn: Connection) -> None:
            for execution in due:
                pid = execution.pid
                started = None if pid is None else procs.process_start_time(pid)
                execute.record_spawn(conn, execution, started)

        if write_quietly(self.engine, record, LOCK_SLICE_S):
            for execution in due:
                execution.spawn_recorded = True
        else:
            self._write_failed(now)

    def _copy_output_if_due(self, now: float) -> None:
        """Store what running jobs appended to their output files since the
        last pass, where the writer stores output beyond them (a stat per file
        when nothing was). A pass that cannot write is retried after the write
        backoff, from where the database stands (see its writer)."""
        copier = self.output
        if copier.pass_every_s is None or now < self._next_output_copy:
            return
        self._next_output_copy = now + copier.pass_every_s
        behind = copier.behind()
        if not behind:
            return
        if write_quietly(self.engine, lambda conn: copier.copy(conn, behind), LOCK_SLICE_S):
            copier.landed()
        else:
            copier.failed()
            self._write_failed(now)

    def _forget_output(self, execution: execute.Execution) -> None:
        self.output.forget(execution.claim.attempt_id)

    def _reap_if_due(self, now: float) -> None:
        """Claims run a reap pass first; a worker whose slots are all busy (so
        it claims nothing) runs one of its own every heartbeat interval, so
        crash recovery never waits for some worker to be idle."""
        if now - self._last_reap_pass < self._beat_every:
            return
        self._last_reap_pass = now
        self.reaping.pass_now(now, self.running)

    def _free_slot(self) -> int:
        used = {e.slot for e in self.running.values()}
        return next(i for i in range(self.options.concurrency) if i not in used)

    def _report(
        self, execution: execute.Execution, outcome: Outcome, state: JobState | None
    ) -> None:
        self.report.add(
            AttemptResult(
                execution.claim.job_id,
                execution.claim.attempt_no,
                outcome.label if state is not None else "lost_ownership",
                None if state is None else state.value,
            )
        )
        if self.on_result is not None:
            self.on_result(self.report)

    def _finished(self, now: float) -> bool:
        mode = self.options.mode
        if self.signals.count:
            return not self.running
        if mode == "once":
            return not self.running and (self.report.claimed > 0 or self._claim_exhausted)
        if mode == "drain" and not self.running and self._claim_exhausted:
            try:
                with read_tx(self.engine) as conn:
                    settled = claiming.lane_settled(conn, self.options.queue, now)
                    paused = lanes.is_paused(conn, self.options.queue)
            except (Locked, Unreachable):
                return False
            self.report.drained = settled
            self.report.paused = paused
            return settled or paused
        return False

    # -- heartbeats and reaping ------------------------------------------

    def _check_database_file(self) -> None:
        """A queue file deleted or replaced underneath would have this worker
        write into an unlinked inode nobody else sees: stop instead."""
        if self.queue.driver.identity() != self._db_identity:
            self._db_gone = True
            raise StorageFault(
                f"the queue database {self.queue.display} was deleted or replaced while this "
                "worker ran; it stopped (its running jobs were killed)",
                path=self.queue.display,
                reason="replaced",
            )

    def _beat_if_due(self, now: float) -> None:
        if now - self._last_beat < self._beat_every:
            return
        self._check_database_file()
        pairs = [(job_id, e.claim.attempt_id) for job_id, e in self.running.items()]
        try:
            with write_tx(self.engine, LOCK_SLICE_S) as conn:
                lost = heartbeat.beat(conn, self.worker_id, pairs, now, len(self.report.results))
                reaper.release_forgotten(
                    conn, self.worker_id, self.identity.pid, set(self.running), now
                )
        except TRANSIENT:
            self._write_failed(now)
            return
        self._write_ok()
        self._last_beat = now
        self._fenced = False
        if self._guard is not None:
            self._guard.renewed()
        self.reaping.bury_dead_workers(now)
        for job_id in lost:
            execution = self.running.pop(job_id)
            self._forget_output(execution)
            execution.kill_now()
            execution.wait_blocking()
            self.report.add(
                AttemptResult(job_id, execution.claim.attempt_no, "lost_ownership", None)
            )

    def _fence_if_lease_lost(self, now: float) -> None:
        """No heartbeat has landed for half the hang threshold: others may
        requeue this worker's jobs once it is silent for the whole threshold,
        so kill them now (their outcome is recorded as a worker crash when the
        database lets it) and claim nothing until a heartbeat lands."""
        silent = now - self._last_beat
        if self._fenced or not lease.self_fence_due(
            now, self._last_beat, self.timing.hang_threshold_s
        ):
            return
        self._fenced = True
        error = f"worker could not heartbeat for {silent:.1f}s (half the hang threshold): fenced"
        for execution in self.running.values():
            if execution.outcome is None and execution.forced is None:
                execution.force_end(FailureReason.WORKER_CRASH, error)

    # -- stopping ----------------------------------------------------------

    def _hard_stop(self, now: float) -> None:
        for execution in self.running.values():
            execution.force_end(FailureReason.CANCELED, "worker stopped by a second signal")
        for execution in self.running.values():
            execution.wait_blocking()
        give_up_at = now + HARD_STOP_RECORD_S
        while self.running and self.clock() < give_up_at:  # best effort: else the reaper
            self._settle_and_claim(self.clock(), self._ended(self.clock()), 0)
            if self.running:
                time.sleep(max(self._retry_s, RETRY_FIRST_S))
        self.running.clear()

    # -- waiting -----------------------------------------------------------

    def _wait(self, now: float) -> None:
        """Sleep until a job ends, a signal comes, or the next thing is due.
        What needs the database waits out a write backoff; what drives the
        jobs' processes (timeouts, group kills, self-fencing) never does."""
        wake = min(self._last_beat + self._beat_every, self._last_reap_pass + self._beat_every)
        for execution in self.running.values():
            if execution.outcome is not None:
                wake = now  # to be recorded
            if execution.proc is not None and not execution.spawn_recorded:
                wake = min(wake, execution.record_spawn_at)
        idle_capacity = len(self.running) < self.options.concurrency and not self.signals.count
        claiming = idle_capacity and not (self.options.mode == "once" and self.report.claimed)
        watch_fd = None if self._watch is None else self._watch.fileno()
        if claiming:  # a watch that wakes us through its descriptor needs no fast tick
            tick = WATCH_TICK_S if watch_fd is None else LISTEN_TICK_S
            wake = min(wake, now + tick, self._next_claim_at)
        if self.running and self.output.pass_every_s is not None:
            wake = min(wake, self._next_output_copy)
        deadline = max(wake, self._blocked_until)
        fds = [self.signals.wake_fd]
        if watch_fd is not None and claiming and not self._fenced and now >= self._blocked_until:
            fds.append(watch_fd)  # a NOTIFY wakes the worker at once
        for execution in self.running.values():
            deadline = min(deadline, execution.next_wakeup())
            if execution.pidfd is not None:
                fds.append(execution.pidfd)
            elif execution.leader_running:
                deadline = min(deadline, now + NO_PIDFD_TICK_S)
        if self.running and self.timing.hang_threshold_s > 0 and not self._fenced:
            deadline = min(deadline, self._last_beat + self.timing.hang_threshold_s / 2)
        self._guard_groups()
        wait_readable(fds, deadline - now, self.signals.wake_fd)
