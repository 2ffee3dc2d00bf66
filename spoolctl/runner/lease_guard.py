"""The lease guard: a worker's watchdog that does not need the worker to run.

A worker fences itself (kills its jobs' process groups) when it could not
heartbeat for half of SPOOLCTL_HANG_THRESHOLD, because workers on other
machines requeue its jobs once it has been silent for the whole of it. A
worker that is frozen (SIGSTOP) or killed (SIGKILL) cannot fence itself, and
on another machine no reaper can reach its jobs: their processes would run on
beside the rerun. The same holds for a worker in another PID namespace of
one host (a container sharing an SQLite file). So each worker with a hang
threshold forks this guard when it starts. The guard holds the read end of a pipe and learns from
it which process groups the worker runs and when a heartbeat landed. It
SIGKILLs every group it knows when the pipe closes (the worker died) or when
no heartbeat has landed for its fence interval (the worker is frozen or cut
off: three quarters of the threshold, after the worker's own fence at half),
so the copy on this machine ends before another machine may start one.

The guard ignores SIGINT and SIGTERM (a Ctrl-C to the worker's terminal is
the worker's to handle) and the terminal's stop signals (a Ctrl-Z stops the
worker, not its guard: the guard goes on counting the lease), and holds no
other descriptor of the worker. The one
window left: a worker killed between spawning a job and telling the guard.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from spoolctl.runner.wakeup import readable

RENEWED = b"B\n"


class LeaseGuard:
    """The worker's end: tell the guard what runs and that the lease holds."""

    def __init__(self, fence_after_s: float) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guard
            os.close(write_fd)
            code = 0
            try:
                _guard(read_fd, fence_after_s)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(read_fd)
        self.pid = pid
        self._fd = write_fd
        self._sent: set[int] = set()

    def renewed(self) -> None:
        """A heartbeat landed: the lease runs for another fence interval."""
        self._send(RENEWED)

    def track(self, groups: set[int]) -> None:
        """The process groups this worker runs now (only changes are sent)."""
        started, ended = groups - self._sent, self._sent - groups
        if started or ended:
            lines = [f"+{g}\n" for g in sorted(started)] + [f"-{g}\n" for g in sorted(ended)]
            self._send("".join(lines).encode())
            self._sent = set(groups)

    def close(self) -> None:
        """The worker is done (its jobs are over): the guard exits."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _send(self, data: bytes) -> None:
        if self._fd >= 0:
            # OSError: the guard is gone; the worker's own fence still applies.
            with contextlib.suppress(OSError):
                os.write(self._fd, data)


def _guard(read_fd: int, fence_after_s: float) -> None:
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(number, signal.SIG_IGN)
    _detach_from_worker(read_fd)
    groups: set[int] = set()
    renewed_at = time.monotonic()
    pending = b""
    while True:
        left = renewed_at + fence_after_s - time.monotonic()
        if left <= 0:
            _kill(groups)  # fenced: no heartbeat for the fence interval
            groups.clear()
            left = fence_after_s
        if not readable([read_fd], left):
            continue
        data = os.read(read_fd, 4096)
        if not data:
            _kill(groups)  # the worker died (or finished: nothing left to kill)
            return
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == b"B":
                renewed_at = time.monotonic()
            elif line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))


def _detach_from_worker(keep: int) -> None:
    """Hold none of the worker's descriptors (database sockets, the pipes a
    caller reads the worker's output from): only `keep`, stdio on /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 4096)


def _kill(groups: set[int]) -> None:
    for group in groups:
        with contextlib.suppress(OSError):  # already gone
            os.killpg(group, signal.SIGKILL)
