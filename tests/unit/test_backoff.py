"""The retry policy as pure functions, and the timing knobs it is paired with.

The end-to-end proof (a real job failing, its rows 2 s then 4 s apart) is in
tests/process/test_execute.py; here every branch of the arithmetic is pinned down."""

from __future__ import annotations

import pytest

from spoolctl.config import Timing
from spoolctl.errors import InvalidInput
from spoolctl.services.backoff import (
    backoff_seconds,
    crash_budget_exhausted,
    failure_budget_exhausted,
)


def test_backoff_doubles_from_two_seconds_and_caps_at_sixty() -> None:
    assert [backoff_seconds(n) for n in range(1, 9)] == [2, 4, 8, 16, 32, 60, 60, 60]


@pytest.mark.parametrize("attempts", [0, -1])
def test_no_unsuccessful_execution_means_no_delay(attempts: int) -> None:
    assert backoff_seconds(attempts) == 0


def test_backoff_of_a_huge_count_stays_at_the_cap() -> None:
    assert backoff_seconds(10**9) == 60


@pytest.mark.parametrize(
    ("failures", "max_retries", "exhausted"),
    [(1, 0, True), (1, 1, False), (2, 1, True), (3, 3, False), (4, 3, True)],
)
def test_failure_budget(failures: int, max_retries: int, exhausted: bool) -> None:
    assert failure_budget_exhausted(failures, max_retries) is exhausted


@pytest.mark.parametrize(
    ("crashes", "max_crashes", "exhausted"),
    [(1, 0, True), (1, 1, False), (2, 1, True), (1000, None, False)],
)
def test_crash_budget(crashes: int, max_crashes: int | None, exhausted: bool) -> None:
    assert crash_budget_exhausted(crashes, max_crashes) is exhausted


@pytest.mark.parametrize(
    ("heartbeat", "reap", "expected"),
    [(None, None, (5.0, 30.0)), ("10", None, (10.0, 40.0)), ("0.2", "1", (0.2, 1.0))],
)
def test_reap_threshold_defaults_to_four_heartbeats_but_at_least_thirty_seconds(
    monkeypatch: pytest.MonkeyPatch,
    heartbeat: str | None,
    reap: str | None,
    expected: tuple[float, float],
) -> None:
    for name, value in (
        ("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", heartbeat),
        ("SPOOLCTL_TEST_REAP_THRESHOLD", reap),
    ):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("SPOOLCTL_HANG_THRESHOLD", raising=False)
    timing = Timing.from_env()
    assert (timing.heartbeat_interval_s, timing.reap_threshold_s) == expected
    assert timing.hang_threshold_s == 600.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "x"])
def test_bad_knobs_are_invalid_input(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", value)
    with pytest.raises(InvalidInput):
        Timing.from_env()
