"""`work`'s line per job start and end for people (`cli/work.py`): how an
attempt ended in a few words, and where its job went. The worker that
writes them: tests/process/test_worker_voice.py."""

from __future__ import annotations

from typing import Any

import pytest

from spoolctl.cli.work_lines import elapsed, job_line, short_command


def ended(**fields: Any) -> dict[str, Any]:
    record = {
        "event": "attempt_ended",
        "job_id": 7,
        "attempt_no": 1,
        "result": "succeeded",
        "exit_code": 0,
        "signal": None,
        "duration_s": 1.25,
        "job_state": "done",
    }
    return {**record, **fields}


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({}, "job 7 ended: exit 0, after 1.2s -> done"),
        (
            {"result": "process_exit", "exit_code": 3, "job_state": "queued"},
            "job 7 ended: exit 3, after 1.2s -> queued for a retry",
        ),
        (
            {"result": "process_exit", "exit_code": -9, "signal": 9, "job_state": "dead"},
            "job 7 ended: killed by SIGKILL, after 1.2s -> dead",
        ),
        (
            {"result": "timeout", "exit_code": None, "signal": 15, "duration_s": 300.0},
            "job 7 ended: timed out (SIGTERM), after 5m00s -> done",
        ),
        (
            {"result": "worker_crash", "exit_code": -9, "signal": 9, "job_state": "queued"},
            "job 7 ended: stopped by its worker (SIGKILL), after 1.2s"
            " -> queued (a worker crash: its retries are kept)",
        ),
        (
            {"result": "lost_ownership", "exit_code": None, "job_state": None},
            "job 7 ended: killed, after 1.2s"
            " -> taken from this worker (canceled, retried or reaped)",
        ),
    ],
)
def test_an_end_is_one_line(fields: dict[str, Any], line: str) -> None:
    assert job_line(ended(**fields)) == line


def test_a_start_is_one_line_and_containment_is_left_out() -> None:
    started = {"event": "attempt_started", "job_id": 7, "attempt_no": 2, "pid": 42, "error": None}
    assert job_line(started) == "job 7 started (attempt 2, pid 42)"
    failed = {**started, "error": "spawn failed: \x1b[31mno such file"}
    assert (
        job_line(failed) == "job 7 attempt 2 could not start: spawn failed: \\x1b[31mno such file"
    )
    assert job_line({"event": "containment", "mode": "none"}) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.04, "0.0s"), (9.96, "10.0s"), (12.7, "12s"), (185, "3m05s"), (7440, "2h04m")],
)
def test_elapsed_is_short(seconds: float | None, text: str) -> None:
    assert elapsed(seconds) == text


def test_a_long_command_is_cut_with_an_ellipsis() -> None:
    shown = short_command(["sh", "-c", "x" * 100])
    assert len(shown) == 40 and shown.endswith("…")
    assert short_command(["echo", "hi\rthere"]) == "echo $'hi\\rthere'"
