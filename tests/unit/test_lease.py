"""The lease rule's two sides, as pure functions: a worker fences itself at
half the hang threshold, others requeue its jobs only beyond the whole one,
so there is always half a threshold in which neither copy runs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spoolctl.services.lease import lease_expired, self_fence_due

HANG = 600.0


def test_the_worker_fences_itself_at_half_the_threshold() -> None:
    assert not self_fence_due(1000.0, 1000.0 - 299.9, HANG)
    assert self_fence_due(1000.0, 1000.0 - 300.0, HANG)


def test_others_requeue_only_beyond_the_whole_threshold() -> None:
    assert not lease_expired(1000.0, 1000.0 - 600.0, HANG)
    assert lease_expired(1000.0, 1000.0 - 600.1, HANG)


def test_a_zero_threshold_turns_the_rule_off() -> None:
    assert not self_fence_due(1e9, 0.0, 0.0)
    assert not lease_expired(1e9, 0.0, 0.0)


@given(
    hang=st.floats(min_value=0.01, max_value=1e6),
    last_beat=st.floats(min_value=0, max_value=1e9),
    silent=st.floats(min_value=0, max_value=1e7),
)
def test_whenever_others_may_requeue_the_worker_has_already_fenced_itself(
    hang: float, last_beat: float, silent: float
) -> None:
    now = last_beat + silent
    if lease_expired(now, last_beat, hang):
        assert self_fence_due(now, last_beat, hang)
