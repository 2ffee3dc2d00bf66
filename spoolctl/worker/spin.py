"""When a worker waits for its jobs' ends without sleeping at first.

A worker whose jobs exit within a millisecond or two (`true`, `echo`, a
short script) spends each job's life asleep in poll(). Its CPU goes idle,
and the next record, claim and spawn then run more slowly than the same code
run back to back: measured on a 2-core VM, one worker's claim-and-record
pass took 170 us in a tight loop and 236 us after each 0.6 ms asleep
(docs/performance.md, "Waiting for short jobs"). So,
for up to SPIN_S after it spawns, a worker whose last job ended within
SPIN_S looks for the end without sleeping, giving its CPU to any other
runnable process between looks (`wakeup.readable`). A worker whose jobs run longer stops spinning
after the first such job, and one waiting for work never spins.
"""

from __future__ import annotations

import os

SPIN_S = 0.002
"""How long after a spawn a worker may look for an end without sleeping,
and how short the last job must have been for it to: a job of a few
milliseconds or more gains nothing from it."""
CAN_SPIN = hasattr(os, "sched_yield")
"""Without sched_yield a look without sleeping would keep the CPU from
other processes: no spinning then."""


class Spin:
    """How long the worker's next wait may look without sleeping. Times are
    the worker's clock (`Shift.clock`)."""

    def __init__(self, spin_s: float = SPIN_S) -> None:
        self.spin_s = spin_s if CAN_SPIN else 0.0
        self.window_ends = -float("inf")
        """spin_s after the last spawn."""
        self.short = False
        """Whether the last job seen to end lived under spin_s."""

    def ended(self, lived_s: float) -> None:
        """A job's end was seen, lived_s after its pass started it."""
        self.short = lived_s < self.spin_s

    def spawned(self, now: float) -> None:
        self.window_ends = now + self.spin_s

    def spin_s_at(self, now: float) -> float:
        """How long a wait starting now may look without sleeping (0: not at all)."""
        return max(0.0, self.window_ends - now) if self.short else 0.0
