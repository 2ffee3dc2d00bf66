"""One attempt of one job: output files, the process group, and its timeout.

stdout and stderr are files opened before the spawn and handed to the child:
no pipes, nothing buffered in the worker, so output outlives the worker. The
child leads its own session (and process group); a timeout sends SIGTERM to
the whole group, waits up to the grace period, then SIGKILLs the group.

The spawn itself is `spawn.Spawner`'s: os.posix_spawn with setsid, file
actions for stdin (/dev/null) and the two output files, the worker's own
PATH lookup and no descriptor but 0-2 passed on; subprocess.Popen
(`procs.spawn_group`) for a job with a working directory and wherever
posix_spawn cannot do all of that. Either way the job gets the same
environment, signals and descriptors, and `Execution.proc` offers the same
pid/poll/wait, so nothing below the spawn asks which way it went.

An attempt ends with its whole process group: when the leader exits, whatever
it left running in its group gets SIGTERM, the grace period, then SIGKILL,
before the outcome is known, so nothing of attempt N overlaps attempt N+1.
When to stop an attempt and how far its stopping has gone are
`stopping.py`'s (`Timers`, `Escalation`); the signals go out from here.
Every process of the attempt carries SPOOLCTL_ATTEMPT_TOKEN, by which the
reaper finds it should this worker die before recording the leader's pid.
That record (pid, start time, cgroup) is read here and written by
`services/spawn_record.py`.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import Connection

from spoolctl.runner import contained, containment, procs, spawn
from spoolctl.runner.capacity import Place
from spoolctl.runner.stopping import GROUP_KILL_WAIT_S, Escalation, Step, Timers
from spoolctl.services import spawn_record
from spoolctl.services.claimant import Claim
from spoolctl.services.job_defaults import HERE_ENV
from spoolctl.services.outcome import Outcome, signal_name, signal_of
from spoolctl.states import FailureReason

SPAWN_RECORD_DELAY_S = 0.005
"""A job that ends sooner has its pid recorded with its outcome, in one
transaction; a longer one gets it recorded after this delay (by then the
kernel has finished the exec, so reading its start time is cheap), with the
next pass that writes anyway (`SPAWN_RECORD_ALONE_S`)."""
SPAWN_RECORD_ALONE_S = 0.1
"""How long a due spawn record waits for a pass to ride with before it is
written in a transaction of its own. A busy worker's passes come every few
milliseconds, so its records ride along instead of costing a commit each;
until one lands, the attempt token in the job's environment is what lets a
reaper find the job should this worker die (the spawn-window guarantee does
not rest on the record)."""
OUTPUT_DIR_MODE = 0o700
OUTPUT_FILE_MODE = 0o600


def encoded_environment() -> dict[bytes, bytes]:
    """The worker's own environment as bytes, the base of every job's: built
    once per worker instead of encoded anew for every spawn."""
    return dict(os.environb)


def job_environment(
    base: Mapping[bytes, bytes], claim: Claim, worker_id: str, place: Place
) -> dict[bytes, bytes]:
    """The worker's environment, then the job's --env, then spoolctl's own; a
    job added with --here gets the submitter's environment alone instead."""
    env = {} if claim.env.get(HERE_ENV) == "1" else dict(base)
    encode = os.fsencode
    for name, value in claim.env.items():
        env[encode(name)] = encode(value)
    env[b"SPOOLCTL_JOB_ID"] = b"%d" % claim.job_id
    env[b"SPOOLCTL_ATTEMPT"] = b"%d" % claim.attempt_no
    env[b"SPOOLCTL_QUEUE"] = encode(claim.queue)
    env[b"SPOOLCTL_WORKER_ID"] = encode(worker_id)
    env[b"SPOOLCTL_REQUEUES"] = b"%d" % claim.requeues  # --requeue-exit's so far
    env.update(place.environment)  # SPOOLCTL_SLOT
    env[encode(procs.TOKEN_ENV)] = encode(claim.token)
    return env


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exit {returncode}"


@dataclass
class Execution:
    """A running attempt, advanced by `poll` from the worker's loop: its
    process and cgroup, and its outcome; when and how it is stopped is its
    `timers`' and its `escalation`'s (`runner/stopping.py`)."""

    claim: Claim
    place: Place
    """Where it runs in its worker (`runner.capacity`): its slot."""
    proc: spawn.Process | None = None
    started_at: float = 0.0
    timers: Timers = field(default_factory=Timers)
    escalation: Escalation = field(default_factory=Escalation)
    timed_out: bool = False
    forced: FailureReason | None = None
    forced_error: str | None = None
    spawn_error: str | None = None
    pidfd: int | None = None
    spawn_recorded: bool = False
    returncode: int | None = None
    """The leader's exit status, once it has exited."""
    outcome: Outcome | None = None
    cell: containment.Cell | None = None
    """The attempt's cgroup, where the worker contains its jobs."""
    usage: containment.Usage | None = None
    """What the cgroup measured, once the attempt is over."""
    lost: bool = False
    """The database no longer gives this attempt to its worker (canceled
    while running): it is being stopped, and its end changes nothing there."""
    warned_at: float | None = None
    """When `add --signal-before-timeout`'s signal was sent: its `warned`
    event is written with the worker's next write (`worker/warnings.py`)."""
    warning_recorded: bool = False

    def start(
        self,
        base_env: Mapping[bytes, bytes],
        worker_id: str,
        now: float,
        spawner: spawn.Spawner | None = None,
        cells: containment.Containment | None = None,
    ) -> None:
        """Open the output files and spawn; a failure is kept as the outcome.
        base_env: the worker's environment, encoded once (`encoded_environment`);
        spawner: the process's own (`spawn.shared`) unless given; cells: the
        worker's containment (None: process groups only)."""
        self.started_at = now
        self.timers = Timers.starting(self.claim, now)
        starter = spawner if spawner is not None else spawn.shared()
        cell = None if cells is None else cells.cell(self.claim.attempt_id, self.claim.limits)
        try:
            out, err = open_output(self.claim.stdout_path, self.claim.stderr_path)
            with out, err, contained.joined(cell) as inside:
                self.proc = starter.start(
                    self.claim.argv,
                    cwd=self.claim.cwd,
                    env=job_environment(base_env, self.claim, worker_id, self.place),
                    stdout=out,
                    stderr=err,
                )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self.spawn_error = f"spawn failed: {exc}"
            contained.kept(cell, False, self.claim)
            return
        self.cell = contained.kept(cell, inside, self.claim)
        self.pidfd = _pidfd(self.proc.pid)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def poll(self, now: float) -> Outcome | None:
        """The outcome once the attempt is over (its leader exited and nothing
        is left in its process group); drives the timeout and group kills."""
        if self.outcome is not None:
            return self.outcome
        if self.proc is None:
            self.outcome = Outcome(None, FailureReason.SPAWN_FAILED, self.spawn_error)
            return self.outcome
        if self.returncode is None:
            self.returncode = self.proc.poll()
            if self.returncode is None:
                self._enforce_timeout(now)
                return None
            self._close_pidfd()
            self._leader_exited(now)
        if self.escalation.awaiting_group and not self._group_ended(now):
            return None
        self._close_cell(0.0)
        self.outcome = contained.measured(self._outcome(self.returncode), self.cell, self.usage)
        return self.outcome

    @property
    def leader_running(self) -> bool:
        return self.proc is not None and self.returncode is None

    def _leader_exited(self, now: float) -> None:
        """SIGTERM what the leader left running, each process once
        (`contained.signal_attempt`: its cgroup, else its group; in the
        common case it finds nothing); a timeout's or a cancel's first
        signal already went out."""
        assert self.proc is not None
        if not self.escalation.started:
            if not contained.signal_attempt(self.proc.pid, self.cell, signal.SIGTERM):
                return
            self.escalation.first_sent(now)
            self.resume(now)  # what is left of a suspended attempt sees its TERM
        self.escalation.await_group(now)

    def _group_ended(self, now: float) -> bool:
        """Whether the leader's group is over: empty, or given up after SIGKILL."""
        assert self.proc is not None
        if not contained.left_running(self.proc.pid, self.cell):
            return True
        step = self.escalation.group_left(now)
        if step is Step.KILL:
            self.kill_now()
        return step is Step.GIVE_UP

    def _outcome(self, returncode: int) -> Outcome:
        """A timed-out attempt has no exit code (null, as in 0.4.11), only the
        signal that stopped it; every other outcome keeps the leader's code."""
        ended_by = signal_of(returncode)
        if self.forced is not None:
            return Outcome(returncode, self.forced, self.forced_error, ended_by)
        if self.timed_out:
            error = f"timed out after {self.claim.timeout_seconds}s"
            return Outcome(None, FailureReason.TIMEOUT, error, ended_by)
        if returncode == 0:
            return Outcome(0, None, None)
        return Outcome(returncode, FailureReason.PROCESS_EXIT, describe_exit(returncode), ended_by)

    def _enforce_timeout(self, now: float) -> None:
        if self.escalation.started:
            if self.escalation.kill_due(now):
                self.kill_now()
            return
        if self.timers.warning_due(now):
            self._warn(now)
        if self.timers.expired(now):
            self.timed_out = True
            self.terminate(now)

    def _warn(self, now: float) -> None:
        """`add --signal-before-timeout`: its signal to the whole attempt, once."""
        assert self.proc is not None and self.claim.warning is not None
        self.timers.warning_sent()
        self.warned_at = now
        sig = signal.Signals[self.claim.warning[0]]
        contained.signal_attempt(self.proc.pid, self.cell, sig, self.claim.token)

    def terminate(self, now: float, first: int = signal.SIGTERM) -> None:
        """Send `first` (SIGTERM unless a cancel chose another) to the group;
        poll() SIGKILLs it after the grace period. A suspended attempt is
        continued after the signal, so that it sees it."""
        if self.proc is not None and not self.escalation.started:
            self.escalation.first_sent(now)
            contained.signal_attempt(self.proc.pid, self.cell, first)
            self.resume(now)

    def send(self, sig: int) -> bool:
        """sig to every process of the attempt (`signal`); whether any got it."""
        if not self.leader_running:
            return False
        assert self.proc is not None
        return contained.signal_attempt(self.proc.pid, self.cell, sig, self.claim.token)

    def suspend(self, now: float) -> bool:
        """Stop every process of the attempt (`contained.Suspended`); its
        timers stand still until `resume`. False if it was not running, or
        is suspended or being stopped already."""
        if not self.leader_running or self.timers.suspended is not None or self.escalation.started:
            return False
        assert self.proc is not None
        suspended = contained.Suspended.stop(self.proc.pid, self.cell, self.claim.token, now)
        self.timers.stand_still(suspended)
        return True

    def resume(self, now: float) -> float | None:
        """Continue a suspended attempt; its timers move on by the time it
        stood still, which is returned (None: it was not suspended)."""
        return self.timers.resume(now)

    def kill_now(self) -> None:
        """SIGKILL the group, and the whole cgroup where the attempt has one
        (which no setsid() leaves)."""
        if self.proc is not None:
            procs.signal_group(self.proc.pid, signal.SIGKILL)
            if self.cell is not None:
                self.cell.kill()
            self.timers.let_go()
            self.escalation.killed()

    def force_end(self, reason: FailureReason, error: str) -> None:
        """Kill the group now and report `reason` as the outcome (hard shutdown)."""
        self.forced = reason
        self.forced_error = error
        self.kill_now()

    def next_wakeup(self) -> float:
        if self.outcome is not None:
            return math.inf  # over: only its record is pending
        due = self.escalation.next_at()
        return self.timers.next_at() if due is None else due

    def wait_blocking(self) -> None:
        """Reap the leader after a kill (it cannot ignore SIGKILL) and give the
        rest of its group a bounded time to go."""
        if self.proc is not None:
            self.proc.wait()
            procs.wait_group_gone(self.proc.pid, GROUP_KILL_WAIT_S)
        self._close_cell(GROUP_KILL_WAIT_S)
        self._close_pidfd()

    def _close_cell(self, wait_s: float) -> None:
        """Keep what the cgroup measured, then kill what is left in it and remove it."""
        usage = contained.close(self.cell, wait_s)
        if usage is not None:
            self.usage = usage

    def _close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def open_output(stdout_path: str, stderr_path: str) -> tuple[BinaryIO, BinaryIO]:
    """Open an attempt's two output files for append (created 0600). Their
    folders are made (0700: output may hold secrets) only when an open finds
    one missing, so the common case costs two opens and no mkdir or stat.
    Tried three times: `prune` may remove a folder it has just emptied
    between our mkdir and open."""
    for _ in range(2):
        try:
            return _open_both(stdout_path, stderr_path)
        except FileNotFoundError:
            for path in (stdout_path, stderr_path):
                _make_private_dirs(Path(path).parent)
    return _open_both(stdout_path, stderr_path)


def _open_both(stdout_path: str, stderr_path: str) -> tuple[BinaryIO, BinaryIO]:
    out = _open_private(stdout_path)
    try:
        return out, _open_private(stderr_path)
    except BaseException:
        out.close()
        raise


def _open_private(path: str) -> BinaryIO:
    """Open for append, created 0600 whatever the umask (output may hold
    secrets; the umask only takes bits away)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, OUTPUT_FILE_MODE)
    try:
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def _make_private_dirs(folder: Path) -> None:
    """Create folder (and missing parents) 0700; an existing one is fine."""
    try:
        os.mkdir(folder, OUTPUT_DIR_MODE)
    except FileExistsError:
        return
    except FileNotFoundError:
        _make_private_dirs(folder.parent)
        with suppress(FileExistsError):
            os.mkdir(folder, OUTPUT_DIR_MODE)


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when pid exits (Linux 5.3+)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:
        return None
    return fd


def record_spawns(conn: Connection, executions: list[Execution]) -> None:
    """`record_spawn` for each whose leader has not been waited for, with the
    start time read now. A leader this worker has reaped is gone (its pid may
    already name another process): its attempt gets nothing here, and its
    pid is written with its outcome, on the ended attempt."""
    for execution in executions:
        pid = execution.pid
        if pid is None or execution.returncode is not None:
            continue
        record_spawn(conn, execution, procs.process_start_time(pid))


def record_spawn(conn: Connection, execution: Execution, started_at: float | None) -> None:
    """Store the job's pid, group and start time on its attempt
    (`spawn_record.record`), so a reaper can later kill an orphaned group
    after checking it is still the same process. Never a pid without its
    start time (`started_at` None: nothing is written): a reaper could
    neither confirm such a pid gone nor tell it from a process that took the
    number since."""
    if execution.proc is None or started_at is None:
        return
    cgroup = None if execution.cell is None else execution.cell.path
    spawn_record.record(conn, execution.claim.attempt_id, execution.proc.pid, started_at, cgroup)
