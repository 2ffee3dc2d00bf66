"""Stopping a worker from its terminal (Ctrl-Z, SIGTSTP) without stopping
the queue: the worker stops itself only outside a write transaction.

Stopped by the kernel's default action, a worker could be frozen while it
holds the queue's write lock (SQLite's, or PostgreSQL's row locks), and
every other writer would wait for it until it was continued. So while it
runs, SIGTSTP has a handler: outside a write transaction it stops the
process at once (SIGSTOP to itself, which also stops a worker in a process
group no terminal controls, where the kernel would drop a SIGTSTP left to
its default action); inside one it only notes the request, and the stop
comes as the last open write transaction ends, committed or rolled back
(`db.engine.OpenWrites`). SIGCONT (`fg`, `bg`) continues it where it
stopped; nothing else changes. The jobs run in sessions of their own, so
the terminal's Ctrl-Z never reaches them: they go on running while their
worker is stopped.

SIGTTIN and SIGTTOU keep their default action: the worker never reads its
terminal (jobs read /dev/null), and writes to it (progress, `--log-format
json`) only between transactions, where the kernel's stop holds no lock.
A handler would do harm there: a write to the terminal inside a transaction
would get SIGTTOU again each time it was retried.

A signal handler may run between any two bytecodes of the main thread,
the handler itself included: `stop` lets only one stop be under way, and
every request made before a stop begins is served by it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from spoolctl.db.engine import OpenWrites
from spoolctl.runner.wakeup import Signals, counting_signals

STOP_SIGNAL = signal.SIGTSTP


class Suspension:
    """The stop requests received, and those served by a stop."""

    def __init__(self) -> None:
        self.asked = 0
        self.served = 0
        self.stopping = False

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.asked += 1
        if not OpenWrites.count:
            self.stop()

    def stop(self) -> None:
        """Stop now if a request is waiting (never inside a write transaction:
        the caller checks); returns once continued."""
        if self.stopping or self.served >= self.asked:
            return
        self.stopping = True
        try:
            while self.served < self.asked:
                self.served = self.asked
                stop_self()
        finally:
            self.stopping = False


def stop_self() -> None:
    """SIGSTOP this process; returns once it is continued."""
    os.kill(os.getpid(), signal.SIGSTOP)


@contextmanager
def stopping_outside_writes() -> Iterator[Suspension | None]:
    """For the duration, SIGTSTP stops this process only outside a write
    transaction. Left alone (None) where whoever started the worker ignores
    SIGTSTP or has a handler of its own; put back as it was after."""
    if signal.getsignal(STOP_SIGNAL) != signal.SIG_DFL:
        yield None
        return
    suspension = Suspension()
    OpenWrites.after_last = suspension.stop
    previous = signal.signal(STOP_SIGNAL, suspension.on_signal)
    try:
        yield suspension
    finally:
        signal.signal(STOP_SIGNAL, previous)
        OpenWrites.after_last = None


@contextmanager
def worker_signals() -> Iterator[Signals]:
    """A worker's signals while it runs: SIGINT and SIGTERM counted
    (`wakeup.counting_signals`), SIGTSTP handled here."""
    with counting_signals() as signals, stopping_outside_writes():
        yield signals
