"""Retry policy: pure functions of counts and limits, so tests need no sleeping."""

from __future__ import annotations

BACKOFF_BASE_S = 2.0
BACKOFF_CAP_S = 60.0


def backoff_seconds(attempts: int) -> float:
    """Delay before the next try after `attempts` unsuccessful executions.

    min(60, 2 * 2**(attempts-1)): 2, 4, 8, 16, 32, 60, 60, ... seconds; used for
    job-owned failures and crash redeliveries alike.
    """
    if attempts <= 0:
        return 0.0
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(attempts - 1, 16))


def failure_budget_exhausted(failures: int, max_retries: int) -> bool:
    """Job-owned failures beyond max_retries dead-letter (max_retries=1: 2 runs)."""
    return failures > max_retries


def crash_budget_exhausted(crashes: int, max_crashes: int | None) -> bool:
    """None is unbounded; 0 dead-letters on the first crash, 1 on the second."""
    return max_crashes is not None and crashes > max_crashes
