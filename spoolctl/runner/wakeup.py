"""What wakes an idle worker: a signal, a job process ending (its pidfd
becomes readable), or another process committing to the queue (the queue
driver's change watch: `backends.base.ChangeWatch`)."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import FrameType


class StopRequested(BaseException):
    """A stop signal came during a call marked `Signals.interruptible`, or
    while waiting out an outage: the caller ends as it does on a signal.
    Not an Exception, so no `except Exception` on the way swallows it."""


@dataclass
class Signals:
    """SIGINT/SIGTERM received so far, and a pipe that becomes readable on each."""

    count: int = 0
    wake_fd: int = -1
    raising: bool = False
    """True inside `interruptible()`: the next signal raises StopRequested."""

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A blocking call with nothing to clean up (a connection attempt to a
        server that does not answer) is abandoned the moment a stop signal
        comes, instead of after its timeout. A signal that already came
        raises on entry."""
        if self.count:
            raise StopRequested
        self.raising = True
        try:
            yield
        finally:
            self.raising = False


@contextmanager
def counting_signals() -> Iterator[Signals]:
    """Count SIGINT/SIGTERM instead of dying on them, for the duration."""
    state = Signals()
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    state.wake_fd = read_fd

    def handler(_signum: int, _frame: FrameType | None) -> None:
        state.count += 1
        if state.raising:
            state.raising = False
            raise StopRequested

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    old_wakeup = signal.set_wakeup_fd(write_fd)
    try:
        yield state
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, old in previous.items():
            signal.signal(sig, old)
        os.close(read_fd)
        os.close(write_fd)


def readable(fds: list[int], timeout_s: float, spin_s: float = 0.0) -> list[int]:
    """The fds that are readable (or hung up) within timeout_s. poll(), not
    select(): a descriptor numbered 1024 or above is fine.

    spin_s: for up to that long (within timeout_s), look without sleeping,
    giving the CPU to any other runnable process between looks
    (`sched_yield`), and only then sleep for the rest. For an end that is
    due within microseconds (a job that exits at once): the CPU of a process
    asleep in poll() goes idle, and waking it, and the cold caches it then
    runs on, cost more than the wait itself (`worker/spin.py`)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    timeout_s = max(0.0, timeout_s)
    try:
        if spin_s > 0 and timeout_s > 0:
            spun = _spin(poller, min(spin_s, timeout_s))
            if spun is not None:
                return spun
            timeout_s = max(0.0, timeout_s - spin_s)
        return [fd for fd, _event in poller.poll(timeout_s * 1000)]
    except InterruptedError:
        return []


def _spin(poller: select.poll, spin_s: float) -> list[int] | None:
    """What is readable within spin_s, looked at without sleeping; None if nothing."""
    end = time.monotonic() + spin_s
    while True:
        ready = [fd for fd, _event in poller.poll(0)]
        if ready:
            return ready
        if time.monotonic() >= end:
            return None
        if _yield is not None:
            _yield()


_yield = getattr(os, "sched_yield", None)


def wait_readable(fds: list[int], timeout_s: float, drain_fd: int, spin_s: float = 0.0) -> None:
    """Sleep until one of fds is readable or the timeout passes (after
    spin_s of looking without sleeping: `readable`); empty drain_fd."""
    ready = readable(fds, timeout_s, spin_s)
    if drain_fd in ready:
        with suppress(BlockingIOError):
            os.read(drain_fd, 512)
