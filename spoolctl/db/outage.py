"""Riding out a database server that does not answer (PostgreSQL).

A worker started while the server cannot be reached (refused, down, a host
name that does not resolve yet) and a follower (`events --follow`, `output
--follow`) whose server restarts or drops the connection try again instead
of giving up: RETRY_FIRST_S after the first failed try, doubling up to
RETRY_MAX_S between tries, for as long as the caller's bound allows (none for
a worker's loop; ONE_SHOT_WAIT_S for `work --once` and `--drain`; a
follower's idle timeout). Only `Unreachable` is waited out: a login the
server refuses or a database that does not exist is an answer, not an
outage. A server that takes no writes (a standby, a database set
read-only) is waited out too: the PostgreSQL driver's error for it is
DB_UNUSABLE to a one-shot verb and an `Unreachable` to whoever waits, since
a failover or an operator ends it without any change on this side. A stop
signal ends the wait at once (`StopRequested`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from spoolctl.errors import Unreachable
from spoolctl.runner.wakeup import Signals, StopRequested, wait_readable

T = TypeVar("T")

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
"""The wait between two tries: 0.5 s, doubling, at most 10 s."""
ONE_SHOT_WAIT_S = 60.0
"""How long `work --once` and `work --drain` wait for a server that does not
answer before they exit 4 like any one-shot verb: long enough for a restart
or a failover, short enough for a script."""


def retry_delay_s(failures: int) -> float:
    """Seconds to wait after `failures` tries in a row failed (1 or more):
    min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (failures - 1))."""
    exponent = min(max(failures, 1) - 1, 16)
    return float(min(RETRY_MAX_S, RETRY_FIRST_S * 2**exponent))


@dataclass
class Outage:
    """One stretch of tries that found the server unreachable, as one process
    saw it (monotonic times)."""

    began: float
    """When the first failed try started."""
    failures: int
    error: str
    """The last failure's message (the password masked, as in every error)."""
    ended: float | None = None
    """When the try that got through started; None while it lasts."""

    def waited_s(self, now: float) -> float:
        return max(0.0, (self.ended if self.ended is not None else now) - self.began)


OutageListener = Callable[[Outage], None]
"""Told when an outage begins and when it ends (`ended` set), once each."""


class Reconnecting:
    """Runs calls that need the database server through its outages.

    `call(fn)` returns what fn returns; when fn raises `Unreachable` it waits
    (retry_delay_s, or until a stop signal: StopRequested) and calls fn again,
    until fn gets through or the bound passes (then the last `Unreachable` is
    raised). fn must be safe to repeat, and decides itself what of it a stop
    signal may cut short (`Signals.interruptible`)."""

    def __init__(
        self,
        signals: Signals,
        on_change: OutageListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.signals = signals
        self.on_change = on_change
        self.clock = clock
        self._sleep = sleep or self._until_signal
        self.outage: Outage | None = None
        """The outage in progress, if any."""
        self.last: Outage | None = None
        """The last outage that ended."""
        self.outages = 0
        """How many outages ended so far: a caller sees one passed by its change."""
        self.try_began = 0.0
        """When the try in progress (or the last one) started."""

    def call(
        self,
        fn: Callable[[], T],
        *,
        give_up_at: float | None = None,
        patience_s: float | None = None,
    ) -> T:
        """fn(), tried again while the server is unreachable: until the
        monotonic time give_up_at, or for patience_s into an outage (None:
        no bound)."""
        while True:
            if self.signals.count:
                raise StopRequested
            tried_at = self.try_began = self.clock()
            try:
                result = fn()
            except Unreachable as exc:
                delay = self._failed(exc, tried_at)
                until = self._bound(give_up_at, patience_s)
                now = self.clock()
                if until is not None and now >= until:
                    raise
                self.pause(delay if until is None else min(delay, until - now))
                continue
            self._recovered(tried_at)
            return result

    def _failed(self, exc: Unreachable, tried_at: float) -> float:
        if self.outage is None:
            self.outage = Outage(began=tried_at, failures=1, error=exc.message)
            if self.on_change is not None:
                self.on_change(self.outage)
        else:
            self.outage.failures += 1
            self.outage.error = exc.message
        return retry_delay_s(self.outage.failures)

    def _bound(self, give_up_at: float | None, patience_s: float | None) -> float | None:
        assert self.outage is not None
        bounds = [] if give_up_at is None else [give_up_at]
        if patience_s is not None:
            bounds.append(self.outage.began + patience_s)
        return min(bounds) if bounds else None

    def _recovered(self, tried_at: float) -> None:
        outage, self.outage = self.outage, None
        if outage is None:
            return
        outage.ended = tried_at
        self.last = outage
        self.outages += 1
        if self.on_change is not None:
            self.on_change(outage)

    def pause(self, seconds: float) -> None:
        """Sleep (between tries, or a poll interval); a stop signal ends the
        wait at once with StopRequested."""
        self._sleep(seconds)
        if self.signals.count:
            raise StopRequested

    def _until_signal(self, seconds: float) -> None:
        wait_readable([self.signals.wake_fd], seconds, self.signals.wake_fd)
