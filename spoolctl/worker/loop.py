"""The worker's loop: connect and register, then, until its mode says stop,
record what ended, claim what fits, run the periodic duties, and sleep until
a job ends, a signal comes, work arrives or the next duty is due."""

from __future__ import annotations

import time
from collections.abc import Callable

from spoolctl.config import Timing
from spoolctl.db import outage
from spoolctl.db.backends.base import ChangeWatch
from spoolctl.db.engine import read_tx
from spoolctl.db.outage import Reconnecting
from spoolctl.db.queue import Queue
from spoolctl.errors import Locked, Unreachable
from spoolctl.runner import containment
from spoolctl.runner.wakeup import Signals, StopRequested, readable, wait_readable
from spoolctl.services import due, lanes
from spoolctl.states import FailureReason
from spoolctl.worker import duties, lifecycle
from spoolctl.worker.firing import ScheduleFiring
from spoolctl.worker.reaping import Reaping
from spoolctl.worker.report import LogSink, WorkerOptions, WorkReport, default_worker_id
from spoolctl.worker.settle import Settler
from spoolctl.worker.shift import LOCK_SLICE_S, RETRY_FIRST_S, Shift
from spoolctl.worker.steering import Steering
from spoolctl.worker.suspend import worker_signals
from spoolctl.worker.warnings import TimeoutWarnings

NO_PIDFD_TICK_S = 0.005
GUARD_FENCE_SHARE = 0.75
"""The lease guard kills a silent worker's jobs at this share of the hang
threshold: a live worker has fenced itself at half of it already."""
HARD_STOP_RECORD_S = 5.0
"""After a second signal, how long the worker tries to record its killed jobs."""
HARD_STOP_ERROR = "worker stopped by a second signal"
"""The error of an attempt a worker's forced stop killed: recorded as a
worker crash (its `max_crashes` budget), never as the job's failure."""
Stopping = Callable[[list[tuple[int, list[str]]]], None]
"""Told once, at the first stop signal, the jobs the worker waits for (job
id and command): `work` says so, and how to force the stop."""


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
        on_log: LogSink | None = None,
        on_containment: Callable[[containment.Status], None] | None = None,
        on_stopping: Stopping | None = None,
    ) -> None:
        worker_id = options.worker_id or default_worker_id()
        self.shift = shift = Shift(
            queue,
            options,
            timing,
            worker_id,
            WorkReport(worker_id),
            queue.driver.output_writer(),
            queue.clock(),
            on_result=on_result,
            log=on_log,
        )
        self.prepare = prepare
        """Makes the schema usable (run before registering; may need the server)."""
        self.on_wait = on_wait
        """Told when the worker starts waiting for the server, and when it got through."""
        self.on_containment = on_containment
        """Told once, as the worker starts to serve, which containment its jobs get
        (without it, a log sink gets it as a `containment` record)."""
        self.on_stopping = on_stopping
        self._told_stopping = False
        self.signals = Signals()
        self.reaping = Reaping(
            shift.engine,
            timing,
            worker_id,
            shift.boot_id,
            shift.hostname,
            shift.clock,
            LOCK_SLICE_S,
            log=on_log,
        )
        self.steering = Steering(shift)
        self.settler = Settler(shift, self.reaping, self.steering)
        self.heartbeat = duties.Heartbeat(shift, self.reaping, self.steering)
        self.fence = duties.LeaseFence(shift)
        self.duties: list[duties.Duty] = [
            duties.SpawnRecords(shift),
            TimeoutWarnings(shift),
            duties.OutputPass(shift),
            duties.ReapPass(shift, self.reaping),
            ScheduleFiring(shift),
        ]
        """Run in this order after each claim pass, while writes may go on."""
        self._watch: ChangeWatch | None = None
        self._look_at = 0.0
        """When the change watch is next asked while the worker runs jobs
        (sooner if its descriptor is readable)."""

    def _tell_containment(self, status: containment.Status) -> None:
        if self.on_containment is not None:
            self.on_containment(status)
        elif self.shift.log is not None:
            self.shift.log(
                {
                    "event": "containment",
                    "at": time.time(),
                    "worker_id": self.shift.worker_id,
                    **status.as_dict(),
                }
            )

    @property
    def worker_id(self) -> str:
        return self.shift.worker_id

    def run(self) -> WorkReport:
        with self.shift.report.timings.wall, worker_signals() as self.signals:
            if self._connect():
                self._serve()
        self.shift.report.stopped_by_signal = self.signals.count > 0
        return self.shift.report

    def _serve(self) -> None:
        shift = self.shift
        self._watch = watch = shift.queue.driver.change_watch(shift.engine)
        hang = shift.timing.hang_threshold_s
        if hang > 0:
            # After the worker's own fence (half the threshold), which records
            # its jobs as worker crashes; before others may requeue (the whole).
            shift.guard = shift.queue.driver.lease_guard(hang * GUARD_FENCE_SHARE)
        try:
            shift.cells = self.reaping.cells = containment.Containment.for_worker(shift.worker_id)
            self.settler.contain(shift.cells)
            self._tell_containment(shift.cells.status)
            try:
                self._loop(watch)
            finally:
                lifecycle.retire(shift)
        finally:
            shift.held.close()
            watch.close()
            if shift.guard is not None:
                shift.guard.close()

    def _connect(self) -> bool:
        """Make the schema usable and register, waiting out a server that
        cannot be reached (`db/outage.py`) for up to options.server_wait_s
        (then `Unreachable`). False when a stop signal ended the wait:
        nothing was registered."""
        server = Reconnecting(self.signals, self.on_wait)

        def attempt() -> None:
            if server.outage is None:
                self.prepare()
            else:  # a try that hangs on a silent server is abandoned on a signal
                with self.signals.interruptible():
                    self.prepare()
            self.heartbeat.identity = self.shift.queue.driver.identity()
            lifecycle.register(self.shift, server.outage, server.try_began)

        try:
            server.call(attempt, patience_s=self.shift.options.server_wait_s)
        except StopRequested:
            return False
        return True

    def _loop(self, watch: ChangeWatch) -> None:
        shift = self.shift
        while True:
            now = shift.clock()
            if self.signals.count >= 2:
                self._hard_stop(now)
                return
            if self.signals.count and not self._told_stopping:
                self._tell_stopping()
            writable = not shift.backoff.blocks(now)
            if writable:
                self.heartbeat.run(now)
            self.fence.run(now)
            ended = shift.ended(now)
            if not shift.backoff.blocks(now):  # a failed heartbeat holds back the rest
                changed = self._changed(now, watch, len(ended))
                steer = changed and bool(shift.running)  # requests may wait for its jobs
                wanted = self._wanted(now, len(ended), changed)
                if ended or wanted:  # a write anyway: the requests are settled in it
                    for claim in self.settler.settle_and_claim(now, ended, wanted, steer=steer):
                        self.settler.start(claim, now)
                    shift.guard_groups()
                elif steer:
                    self.steering.look(now)
                for duty in self.duties:
                    duty.run(now)
            if self._finished(now):
                return
            self._wait(now)

    def _claiming(self) -> bool:
        """Whether this worker would take more work now."""
        shift = self.shift
        once_done = shift.options.mode == "once" and shift.report.claimed > 0
        return not (self.signals.count or once_done)

    def _changed(self, now: float, watch: ChangeWatch, ended: int) -> bool:
        """Whether the queue changed since the last look: the change watch is
        asked at most once a pass (so its readable descriptor is drained),
        where its answer serves: an idle slot with no other reason to claim
        (every such pass), or running jobs, which may have requests waiting
        (when the watch's descriptor is readable or its next look is due)."""
        shift, settler = self.shift, self.settler
        claims = self._claiming() and not shift.fenced and shift.capacity.take(ending=ended) > 0
        if claims and ended == 0 and settler.exhausted:
            pass  # the claim's only reason to look
        elif not shift.running or (now < self._look_at and not _readable(watch)):
            return False
        changed = watch.changed()
        self._look_at = now + watch.wait_s()
        return changed

    def _wanted(self, now: float, ended: int, changed: bool) -> int:
        """How many jobs to try to claim now (0: none); `ended` attempts are
        about to free their slots; `changed`: the queue changed (`_changed`)."""
        shift, settler = self.shift, self.settler
        free = shift.capacity.take(ending=ended)
        if not self._claiming() or shift.fenced or free <= 0:
            return 0
        look = ended > 0 or not settler.exhausted or changed
        if not (look or now >= settler.next_claim_at):
            return 0
        return 1 if shift.options.mode == "once" else free

    def _finished(self, now: float) -> bool:
        shift = self.shift
        mode = shift.options.mode
        if self.signals.count:
            return not shift.running
        if mode == "once":
            return not shift.running and (shift.report.claimed > 0 or self.settler.exhausted)
        if mode == "drain" and not shift.running and self.settler.exhausted:
            try:
                with shift.report.timings.db, read_tx(shift.engine) as conn:
                    settled = due.lane_settled(conn, shift.options.lane, now)
                    paused = lanes.is_paused(conn, shift.options.lane)
            except (Locked, Unreachable):
                return False
            shift.report.drained = settled
            shift.report.paused = paused
            return settled or paused
        return False

    def _tell_stopping(self) -> None:
        """At the first stop signal: what the worker waits for, if anything."""
        self._told_stopping = True
        waited = [(job_id, e.claim.argv) for job_id, e in self.shift.running.items() if not e.lost]
        if waited and self.on_stopping is not None:
            self.on_stopping(waited)

    def _hard_stop(self, now: float) -> None:
        """Kill every running job's group and record each as a worker crash:
        requeued (unless its `max_crashes` is spent) with its retries kept,
        for the job did not fail: its worker was stopped under it."""
        shift = self.shift
        for execution in shift.running.values():
            execution.force_end(FailureReason.WORKER_CRASH, HARD_STOP_ERROR)
        for execution in shift.running.values():
            execution.wait_blocking()
        give_up_at = now + HARD_STOP_RECORD_S
        while shift.running and shift.clock() < give_up_at:  # best effort: else the reaper
            self.settler.settle_and_claim(shift.clock(), shift.ended(shift.clock()), 0)
            if shift.running:
                time.sleep(max(shift.backoff.retry_s, RETRY_FIRST_S))
        shift.forget_running()

    def _wait(self, now: float) -> None:
        """Sleep until a job ends, a signal comes, or the next thing is due.
        What needs the database waits out a write backoff; what drives the
        jobs' processes (timeouts, group kills, self-fencing) never does."""
        shift = self.shift
        wake = min(duty.due_at() for duty in [self.heartbeat, *self.duties])
        if any(e.outcome is not None for e in shift.running.values()):
            wake = now  # to be recorded
        idle = shift.capacity.idle and self._claiming()
        watch = self._watch
        watch_fd = None if watch is None else watch.fileno()
        if idle and watch is not None:  # the watch knows how soon it must look again
            wake = min(wake, now + watch.wait_s(), self.settler.next_claim_at)
        elif shift.running and watch is not None:  # for a request to its jobs
            wake = min(wake, self._look_at)
        deadline = min(shift.db_due(wake), self.fence.due_at())
        fds = [self.signals.wake_fd]
        watching = (idle and not shift.fenced) or bool(shift.running)
        if watch_fd is not None and watching and not shift.backoff.blocks(now):
            fds.append(watch_fd)  # a NOTIFY, or a commit written to SQLite's log
        spin_s = 0.0
        for execution in shift.running.values():
            deadline = min(deadline, execution.next_wakeup())
            if execution.pidfd is not None:
                fds.append(execution.pidfd)
                spin_s = self.settler.spin.spin_s_at(now)  # an end to look for
            elif execution.leader_running:
                deadline = min(deadline, now + NO_PIDFD_TICK_S)
        shift.guard_groups()
        wait_readable(fds, deadline - now, self.signals.wake_fd, spin_s)


def _readable(watch: ChangeWatch) -> bool:
    """Whether the watch's descriptor, if it has one now, is readable."""
    fd = watch.fileno()
    return fd is not None and bool(readable([fd], 0))
