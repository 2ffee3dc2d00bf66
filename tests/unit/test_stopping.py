"""When an attempt is stopped and how far its stopping has gone
(`runner/stopping.py`), on a clock the test hands in: the timers stand still
while the attempt is suspended and move on by the span; the escalation goes
first signal, the grace, SIGKILL, and gives up on a group that does not
empty. The signals themselves, through real workers:
tests/process/test_execute.py, test_signals.py, test_control.py."""

from __future__ import annotations

import math
from typing import cast

from spoolctl.runner import containment
from spoolctl.runner.contained import Suspended
from spoolctl.runner.stopping import (
    GROUP_KILL_WAIT_S,
    GROUP_POLL_S,
    TERM_GRACE_S,
    Escalation,
    Step,
    Timers,
)
from spoolctl.services.claim import Claim

T0 = 1000.0


class FrozenCell:
    """Stands in for a frozen cgroup: what `Suspended.release` thaws."""

    def __init__(self) -> None:
        self.thawed = False

    def thaw(self) -> None:
        self.thawed = True


def claim(timeout_s: int, warning: tuple[str, int] | None = None) -> Claim:
    return Claim(1, 1, 1, ["true"], None, {}, timeout_s, "default", "o", "e", warning=warning)


def suspended_at(since: float) -> tuple[Suspended, FrozenCell]:
    cell = FrozenCell()
    return Suspended(0, cast(containment.Cell, cell), None, since, frozen=True), cell


def test_the_timers_start_from_the_claim() -> None:
    timers = Timers.starting(claim(60, ("SIGUSR1", 10)), T0)
    assert (timers.deadline, timers.warn_at) == (T0 + 60, T0 + 50)
    assert timers.next_at() == T0 + 50
    untimed = Timers.starting(claim(0), T0)
    assert (untimed.deadline, untimed.warn_at, untimed.next_at()) == (math.inf,) * 3


def test_the_warning_is_due_once() -> None:
    timers = Timers.starting(claim(60, ("SIGUSR1", 10)), T0)
    assert not timers.warning_due(T0 + 49)
    assert timers.warning_due(T0 + 50)
    timers.warning_sent()
    assert not timers.warning_due(T0 + 55)
    assert timers.next_at() == T0 + 60


def test_the_timers_stand_still_while_suspended_and_move_on_by_the_span() -> None:
    timers = Timers.starting(claim(60, ("SIGUSR1", 10)), T0)
    suspended, cell = suspended_at(T0 + 20)
    timers.stand_still(suspended)
    assert not timers.expired(T0 + 500)
    assert not timers.warning_due(T0 + 500)
    assert timers.next_at() == math.inf
    assert timers.resume(T0 + 120) == 100
    assert cell.thawed and timers.suspended is None
    assert (timers.deadline, timers.warn_at) == (T0 + 160, T0 + 150)
    assert timers.resume(T0 + 130) is None  # not suspended: nothing moves
    assert timers.deadline == T0 + 160


def test_a_killed_attempt_is_let_go_without_moving_its_timers() -> None:
    timers = Timers.starting(claim(60), T0)
    suspended, cell = suspended_at(T0 + 20)
    timers.stand_still(suspended)
    timers.let_go()
    assert cell.thawed and timers.suspended is None
    assert timers.deadline == T0 + 60


def test_first_signal_then_the_grace_then_sigkill() -> None:
    escalation = Escalation()
    assert not escalation.started and escalation.next_at() is None
    escalation.first_sent(T0)
    assert escalation.started
    assert escalation.next_at() == T0 + TERM_GRACE_S
    assert not escalation.kill_due(T0 + TERM_GRACE_S / 2)
    assert escalation.kill_due(T0 + TERM_GRACE_S)
    escalation.killed()
    assert not escalation.kill_due(T0 + 2 * TERM_GRACE_S)
    assert escalation.next_at() is None  # the leader's exit is what comes next


def test_a_group_outliving_its_leader_gets_the_rest_of_the_grace_then_sigkill() -> None:
    escalation = Escalation()
    escalation.first_sent(T0)
    exited = T0 + 1
    escalation.await_group(exited)
    assert escalation.awaiting_group and escalation.next_at() == exited
    assert escalation.group_left(exited) is Step.WAIT
    assert escalation.next_at() == exited + GROUP_POLL_S
    killed = T0 + TERM_GRACE_S
    assert escalation.group_left(killed) is Step.KILL
    escalation.killed()
    assert escalation.group_left(killed + GROUP_KILL_WAIT_S / 2) is Step.WAIT
    assert escalation.group_left(killed + GROUP_KILL_WAIT_S) is Step.GIVE_UP


def test_a_group_left_by_a_killed_leader_is_waited_for_after_its_exit() -> None:
    escalation = Escalation()
    escalation.killed()  # a kill with no first signal before it
    assert escalation.started and not escalation.kill_due(T0 + 3 * TERM_GRACE_S)
    escalation.await_group(T0)
    assert escalation.group_left(T0 + GROUP_KILL_WAIT_S / 2) is Step.WAIT
    assert escalation.group_left(T0 + GROUP_KILL_WAIT_S) is Step.GIVE_UP
