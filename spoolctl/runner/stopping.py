"""How an attempt is brought to its end: its timers and its escalation.

`Timers` hold when the attempt is due to be stopped: its deadline and the
warning before it, on the attempt's own running time, which stands still
while `suspend` holds it stopped. `Escalation` holds how far its stopping
has gone: a first signal, then after the grace period SIGKILL, and after
the leader's exit the wait for the rest of its process group. Both keep
times and decide; `supervise.Execution` sends the signals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from spoolctl.runner import contained
from spoolctl.services.claimant import Claim

TERM_GRACE_S = 5.0
"""How long an attempt has after its first signal before SIGKILL."""
GROUP_KILL_WAIT_S = 5.0
"""After SIGKILL, how long a group may take to empty before the outcome is
recorded anyway (what is left then is zombies or stuck in the kernel)."""
GROUP_POLL_S = 0.02
"""How often a group whose leader has exited is looked at until it is empty."""


@dataclass
class Timers:
    """The timers on an attempt's running time: its deadline (`add
    --timeout`; inf: none) and when `add --signal-before-timeout`'s signal
    is due (inf: none, or sent). While `suspend` holds the attempt stopped
    (`suspended`) both stand still; when it continues they move on by the
    time it stood still, which is not counted against its timeout."""

    deadline: float = math.inf
    warn_at: float = math.inf
    suspended: contained.Suspended | None = None

    @classmethod
    def starting(cls, claim: Claim, now: float) -> Timers:
        """The timers of the claimed attempt, started now."""
        timeout_s = claim.timeout_seconds
        deadline = now + timeout_s if timeout_s else math.inf  # 0: no timeout
        warn_at = math.inf if claim.warning is None else deadline - claim.warning[1]
        return cls(deadline, warn_at)

    def warning_due(self, now: float) -> bool:
        return self.suspended is None and now >= self.warn_at

    def warning_sent(self) -> None:
        self.warn_at = math.inf

    def expired(self, now: float) -> bool:
        return self.suspended is None and now >= self.deadline

    def stand_still(self, suspended: contained.Suspended) -> None:
        """The attempt was just stopped (`contained.Suspended.stop`)."""
        self.suspended = suspended

    def resume(self, now: float) -> float | None:
        """Continue a suspended attempt; the timers move on by the time it
        stood still, which is returned (None: it was not suspended)."""
        if self.suspended is None:
            return None
        span = self.suspended.release(now)
        self.suspended = None
        self.deadline += span
        self.warn_at += span  # inf stays inf: no warning, or sent
        return span

    def let_go(self) -> None:
        """Continue a suspended attempt that has just been killed (frozen or
        stopped, its killed tasks exit only once let go); its timers no
        longer matter."""
        if self.suspended is not None:
            self.suspended.release()
            self.suspended = None

    def next_at(self) -> float:
        """When a timer runs out next (inf: none runs while it stands still)."""
        if self.suspended is not None:
            return math.inf
        return min(self.deadline, self.warn_at)


class Step(Enum):
    """What to do with a group that outlives its leader, looked at now."""

    WAIT = "wait"
    """Its grace is not over: look again in GROUP_POLL_S."""
    KILL = "kill"
    """Its grace is over: SIGKILL it, then wait GROUP_KILL_WAIT_S more."""
    GIVE_UP = "give up"
    """Killed and still not empty: what is left is zombies or processes
    stuck in the kernel, so the end is recorded anyway."""


@dataclass
class Escalation:
    """Stopping an attempt: a first signal (SIGTERM, or the one a cancel
    chose), TERM_GRACE_S for it to take effect, then SIGKILL. An attempt
    ends only with its leader's whole process group: what the leader leaves
    running gets a SIGTERM of its own unless the attempt was already being
    stopped, the same grace and SIGKILL, and GROUP_KILL_WAIT_S after the
    SIGKILL the end is recorded whatever is left."""

    first_sent_at: float | None = None
    kill_sent: bool = False
    group_ends_at: float | None = None
    """While the leader's group outlives it: when the group gets SIGKILL,
    or once it has, when it is given up."""
    group_check_at: float = 0.0
    """While the leader's group outlives it: when it is looked at next."""

    @property
    def started(self) -> bool:
        """Whether the attempt is being stopped (a first signal or SIGKILL
        went out)."""
        return self.first_sent_at is not None or self.kill_sent

    def first_sent(self, now: float) -> None:
        self.first_sent_at = now

    def killed(self) -> None:
        self.kill_sent = True

    def kill_due(self, now: float) -> bool:
        """Whether the first signal's grace is over and SIGKILL not sent yet."""
        return (
            self.first_sent_at is not None
            and not self.kill_sent
            and now >= self.first_sent_at + TERM_GRACE_S
        )

    @property
    def awaiting_group(self) -> bool:
        """Whether the leader has exited and its group is waited for."""
        return self.group_ends_at is not None

    def await_group(self, now: float) -> None:
        """The leader has exited leaving its group signalled: wait for the
        group until its first signal's grace is over, or GROUP_KILL_WAIT_S
        from now where it was killed already; look at it at once."""
        if self.kill_sent:
            self.group_ends_at = now + GROUP_KILL_WAIT_S
        else:
            assert self.first_sent_at is not None
            self.group_ends_at = self.first_sent_at + TERM_GRACE_S
        self.group_check_at = now

    def group_left(self, now: float) -> Step:
        """The group waited for is not empty yet: what to do with it now."""
        assert self.group_ends_at is not None
        if now < self.group_ends_at:
            self.group_check_at = now + GROUP_POLL_S
            return Step.WAIT
        if not self.kill_sent:
            self.group_ends_at = now + GROUP_KILL_WAIT_S
            self.group_check_at = now + GROUP_POLL_S
            return Step.KILL
        return Step.GIVE_UP

    def next_at(self) -> float | None:
        """When the escalation has something to do next; None: nothing
        (not started, or the leader was killed and its exit is waited for)."""
        if self.group_ends_at is not None:
            return self.group_check_at
        if self.first_sent_at is not None and not self.kill_sent:
            return self.first_sent_at + TERM_GRACE_S
        return None
