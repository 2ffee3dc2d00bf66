"""The views' layout (`cli/look.py`, `cli/read_text.py`): tables fit the width
they are given by cutting their free-text cells with an ellipsis, pad by
display width (so a coloured cell or a wide character keeps the columns in
line), and `line_width` reads --wide, COLUMNS and the terminal in that
order; `show` prints what the job's state makes meaningful."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest

from spoolctl.cli import inspect, look, read_text
from spoolctl.text import size_text

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LONG = ["sh", "-c", "echo " + "a fairly long command line that goes on " * 5]
NOW = time.time()


def plain(text: str) -> str:
    return ANSI.sub("", text)


def widths(text: str) -> list[int]:
    return [look.width_of(line) for line in text.splitlines()]


def job(job_id: int, state: str, argv: list[str], queue: str = "default") -> dict[str, Any]:
    return {
        "id": job_id,
        "state": state,
        "queue": queue,
        "priority": 0,
        "attempts_total": 1,
        "attempts": 0,
        "created_at": NOW - 90,
        "argv": argv,
    }


JOBS = [
    job(12345, "canceled", LONG),
    job(2, "done", ["true"]),
    job(3, "dead", ["echo", "日本語のコマンドと長い説明" * 4], queue="a-long-lane-name-for-ml"),
]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def colour(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout a terminal, NO_COLOR unset (in the test's body: pytest's
    capture puts its own stdout back between a fixture and the test)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(look.sys, "stdout", Tty())


def starts(line: str, headers: list[str]) -> list[int]:
    return [line.index(h) for h in headers]


@pytest.mark.parametrize("width", [80, 40, 200])
def test_a_list_fits_the_width_and_cuts_the_command_with_an_ellipsis(width: int) -> None:
    text = read_text.list_text(JOBS, width)
    assert max(widths(text)) <= width
    assert "…" in text
    assert LONG[2] not in text  # cut
    wide = read_text.list_text(JOBS, None)
    assert LONG[2] in wide and "…" not in wide
    if width == 80:
        assert max(widths(text)) == 80, "the command takes the room there is"


@pytest.mark.parametrize(
    ("width", "headings"),
    [
        (80, "ID STATE QUEUE PRI ATTEMPTS FAILURES CREATED COMMAND"),
        (60, "ID STATE QUEUE ATTEMPTS CREATED COMMAND"),
        (40, "ID STATE QUEUE COMMAND"),
        (20, "ID STATE QUEUE COMMAND"),
    ],
)
def test_a_narrow_width_leaves_columns_out_but_keeps_ids_and_states_whole(
    width: int, headings: str
) -> None:
    lines = read_text.list_text(JOBS, width).splitlines()
    assert lines[0].split() == headings.split()
    rows = [line.split()[:2] for line in lines[1:]]
    assert rows == [["12345", "canceled"], ["2", "done"], ["3", "dead"]]
    command = lines[1].split("  ")[-1]
    assert command.endswith("…") and look.width_of(command) >= read_text.TEXT_MIN


def test_headings_align_with_their_columns_with_colour_on_and_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    colour(monkeypatch)
    coloured = read_text.list_text(JOBS, 80)
    assert "\x1b[" in coloured
    monkeypatch.setenv("NO_COLOR", "1")
    uncoloured = read_text.list_text(JOBS, 80)
    assert "\x1b[" not in uncoloured
    assert plain(coloured) == uncoloured
    lines = uncoloured.splitlines()
    headers = ["ID", "STATE", "QUEUE", "PRI", "ATTEMPTS", "FAILURES", "CREATED", "COMMAND"]
    at = starts(lines[0], headers)
    for line in lines[1:]:
        for start in at[1:]:
            assert line[start - 2 : start] == "  " and line[start] != " ", (line, start)
    assert max(widths(coloured)) <= 80


def test_no_color_takes_any_non_empty_value(monkeypatch: pytest.MonkeyPatch) -> None:
    colour(monkeypatch)
    monkeypatch.setenv("NO_COLOR", "")
    assert look.style("dead", fg="red") != "dead"
    for value in ("1", "0", "false", "yes"):
        monkeypatch.setenv("NO_COLOR", value)
        assert look.style("dead", fg="red") == "dead"


def test_display_width_counts_styles_as_nothing_and_wide_characters_as_two() -> None:
    assert look.width_of(look.styled("dead", fg="red", bold=True)) == 4
    assert look.width_of("日本") == 4
    assert look.width_of("e\u0301") == 1  # a combining accent
    assert look.clip("日本語", 4) == "日…"
    assert look.clip("abcdef", 6) == "abcdef"
    assert look.clip("abcdef", 5) == "abcd…"
    assert look.clip("abcdef", 5, "...") == "ab..."
    assert look.clip("abcdef", 0) == ""
    assert look.padded(look.styled("ok", fg="green"), 4).endswith("ok\x1b[0m  ")


@pytest.mark.parametrize("limit", [10, 30, 45, 60, 200])
def test_fitted_narrows_the_widest_flexible_column_first_down_to_its_floor(limit: int) -> None:
    natural = [5, 40, 3, 20]
    out = look.fitted(natural, limit, {1: 8, 3: 6})
    assert out[0] == 5 and out[2] == 3
    assert all(low <= w <= n for w, n, low in zip(out, natural, [5, 8, 3, 6], strict=True))
    line = sum(out) + 2 * 3
    if limit >= 5 + 8 + 3 + 6 + 6:
        assert line == min(limit, sum(natural) + 6)
    else:
        assert out == [5, 8, 3, 6]
    if 8 < out[1] < natural[1] and 6 < out[3] < natural[3]:
        assert abs(out[1] - out[3]) <= 1, "the widest came down first, to a common level"


def test_a_status_fits_with_its_dead_jobs_workers_orphans_and_paused_lanes() -> None:
    reason = "the worker's host stopped answering and its process may still be running"
    data: dict[str, Any] = {
        "counts": {"queued": 100000, "running": 12, "done": 1234567, "failed": 0, "dead": 4321},
        "scheduled": 7,
        "queues": {
            "a-rather-long-lane-name-for-testing-widths": {
                "counts": {"queued": 1, "running": 0},
                "scheduled": 0,
            }
        },
        "recent_dead": [
            {
                "id": 4,
                "argv": LONG,
                "attempts": 3,
                "last_error": "timed out after 300s (killed by the default 5 min timeout)",
                "finished_at": NOW - 30,
            }
        ],
        "workers": [
            {
                "id": "build-host-with-a-long-name-4242-0f3c9a",
                "queue": "default",
                "pid": 4242,
                "running_jobs": [1, 2, 3, 4, 5, 6, 7, 8],
                "heartbeat_age_s": 0.4,
            }
        ],
        "orphans_unconfirmed": [
            {"job_id": 8, "pid": 77, "dead_worker": "w9" * 20, "since": NOW - 5, "reason": reason}
        ],
        "paused_lanes": [
            {
                "queue": "other",
                "paused_at": NOW - 60,
                "paused_by": "ops@" + "x" * 40,
                "reason": reason,
            }
        ],
        "schedules": {"count": 1, "next": {"name": "n" * 90, "at": NOW + 60}},
        "waiting_for_limits": list(range(1, 60)),
    }
    for width in (80, 60):
        text = read_text.status_text(data, NOW, width)
        assert max(widths(text)) <= width, text
        assert "…" in text
    wide = read_text.status_text(data, NOW, None)
    assert LONG[2] in wide and reason in wide and "n" * 90 in wide
    assert "…" not in wide
    assert wide.splitlines()[0].startswith("jobs: queued 100000  running 12")


def test_line_width_reads_wide_then_columns_then_the_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(look.sys, "stdout", io.StringIO())
    monkeypatch.delenv("COLUMNS", raising=False)
    assert look.line_width() is None, "not a terminal: no limit"
    monkeypatch.setenv("COLUMNS", "72")
    assert look.line_width() == 72
    assert look.line_width(wide=True) is None
    for bad in ("0", "-5", "wide", ""):
        monkeypatch.setenv("COLUMNS", bad)
        assert look.line_width() is None


def test_the_ellipsis_is_ascii_where_stdout_cannot_encode_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(look.sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert look.ellipsis() == "..."
    monkeypatch.setattr(look.sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert look.ellipsis() == "…"


def show_detail(state: str, **columns: Any) -> dict[str, Any]:
    job_row = {
        "id": 7,
        "state": state,
        "queue": "default",
        "priority": 0,
        "argv": ["make", "build"],
        "created_at": NOW - 600,
        "next_run_at": NOW - 600,
        "started_at": None,
        "finished_at": None,
        "attempts": 0,
        "crashes": 0,
        "max_retries": 3,
        "max_crashes": None,
        "timeout_seconds": 300,
        "memory_bytes": None,
        "cpus": None,
        **columns,
    }
    return {"job": job_row, "attempts": [], "events": []}


def test_show_prints_what_the_state_makes_meaningful() -> None:
    queued = inspect.show_text(show_detail("queued"))
    assert "next run" in queued and "max_crashes" not in queued and "None" not in queued
    running = inspect.show_text(show_detail("running", started_at=NOW - 5))
    assert "next run" not in running and "  started   " in running
    for state in ("done", "dead", "canceled"):
        ended = inspect.show_text(show_detail(state, started_at=NOW - 5, finished_at=NOW - 1))
        assert "next run" not in ended and "  finished  " in ended, state
        assert "None" not in ended
    capped = inspect.show_text(show_detail("dead", max_crashes=2))
    assert "of max_retries 3, max_crashes 2" in capped


def test_show_prints_memory_and_cpus_in_the_units_add_reads() -> None:
    text = inspect.show_text(show_detail("queued", memory_bytes=512 << 20, cpus=0.5))
    assert "  memory    512M" in text and "  cpus      0.5" in text
    assert [size_text(n) for n in (1 << 20, 1536 << 20, 2 << 30, (1 << 20) + 1)] == [
        "1M",
        "1536M",
        "2G",
        "1048577",
    ]
    assert size_text(None) == "None" and size_text("x") == "x"
