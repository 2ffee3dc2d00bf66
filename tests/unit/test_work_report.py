"""A worker's report stays bounded however long the worker lives: counts are
kept as attempts end, and only the newest attempts that did not succeed are
listed, with how many older ones are not."""

from __future__ import annotations

from spoolctl.cli.work import report_data, report_text
from spoolctl.worker import AttemptResult, WorkReport
from spoolctl.worker.report import UNSUCCESSFUL_KEPT


def _fill(report: WorkReport, successes: int, failures: int) -> None:
    for job in range(successes):
        report.add(AttemptResult(job, 1, "succeeded", "done"))
    for job in range(failures):
        report.add(AttemptResult(100_000 + job, 2, "process_exit", "queued"))


def test_a_long_drain_keeps_counts_and_only_the_newest_failures() -> None:
    report = WorkReport("w")
    extra = 37
    _fill(report, successes=5000, failures=UNSUCCESSFUL_KEPT + extra)
    assert report.executed == 5000 + UNSUCCESSFUL_KEPT + extra
    assert report.succeeded == 5000
    assert len(report.unsuccessful) == UNSUCCESSFUL_KEPT
    assert report.unlisted == extra
    # the newest are kept: the first `extra` failures are the ones dropped
    assert report.unsuccessful[0].job_id == 100_000 + extra
    assert report.last == AttemptResult(
        100_000 + UNSUCCESSFUL_KEPT + extra - 1, 2, "process_exit", "queued"
    )

    text = report_text(report, "drain").splitlines()
    assert text[0] == f"({extra} earlier attempts that did not succeed are not listed)"
    assert text[1] == f"job {100_000 + extra} attempt 2: process_exit -> queued"
    assert len(text) == 1 + UNSUCCESSFUL_KEPT + 1
    total = 5000 + UNSUCCESSFUL_KEPT + extra
    assert text[-1] == f"drained: {total} attempts, 5000 succeeded"
    assert report_data(report, "drain")["executed"] == total


def test_a_short_report_lists_every_failure_and_nothing_unlisted() -> None:
    report = WorkReport("w")
    report.add(AttemptResult(1, 1, "succeeded", "done"))
    report.add(AttemptResult(2, 1, "timeout", "dead"))
    assert report.unlisted == 0
    assert report_text(report, "loop").splitlines() == [
        "job 2 attempt 1: timeout -> dead",
        "stopped: 2 attempts, 1 succeeded",
    ]


def test_once_reports_the_last_attempt_whatever_its_result() -> None:
    report = WorkReport("w")
    assert report_data(report, "once") == {"claimed": False}
    assert report_text(report, "once") == "nothing to run"
    report.add(AttemptResult(7, 3, "succeeded", "done"))
    assert report_data(report, "once") == {
        "claimed": True,
        "job_id": 7,
        "attempt_no": 3,
        "result": "succeeded",
        "job_state": "done",
    }
    assert report_text(report, "once") == "job 7 attempt 3: succeeded -> done"
