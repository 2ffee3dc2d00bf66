"""The dashboard shows what a job controls as text (docs/web.md), so that
nothing a submitter wrote can drive the page or pass for something else:
control characters and escape sequences as their escapes, colour codes in
output as nothing, bytes that are not UTF-8 as `\\xXX` (never a replacement
box). A lane says whether a live worker serves it, so that a mistyped lane
does not look like a slow one; attempts and failures are counted apart."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from spoolctl.web.views import output_text
from tests.helpers import add_job, execute, start_worker, wait_for
from tests.process.test_hostile_text import (
    CLIPBOARD,
    ESCAPED,
    HOSTILE,
    OUTPUT,
    PRINTF_FORMAT,
    TITLE,
)
from tests.process.test_web import client_for, drain

pytestmark = [pytest.mark.timeout(120), pytest.mark.subprocess]

RAW_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufffd]"
)
"""What a page must never hold raw: controls but tab and newline, separators,
bidi overrides, and the replacement glyph that stands for an undecodable byte."""
SHOWN_OUTPUT = "red plain\\x1b[2K\\rover\\x08\\x7f \\x9b6n \\xff\\xfe\tend\n"
"""The page's text for tests.process.test_hostile_text.OUTPUT: colour gone, the rest escaped."""


def assert_plain(html: str, what: object) -> None:
    found = RAW_CONTROL.search(html)
    assert found is None, (what, found, html[max(0, found.start() - 60) : found.end() + 60])


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    db = tmp_path_factory.mktemp("webtext") / "spool" / "queue.db"
    shell = add_job(
        db,
        "sh",
        "-c",
        "echo safe\rrm -rf ~",
        note=HOSTILE,
        tags={f"k{TITLE}": HOSTILE},
        env={f"E{CLIPBOARD}": "v"},
    )
    printer = add_job(db, "printf", PRINTF_FORMAT)
    raw = add_job(db, "true", "\udcff")  # the byte ff, not UTF-8
    drain(db)
    execute(db, "UPDATE attempts SET worker_id = ?, error = ?", (f"w{HOSTILE}", HOSTILE))
    execute(
        db,
        "UPDATE jobs SET last_error = ?, idempotency_key = ? WHERE id = ?",
        (HOSTILE, HOSTILE, shell),
    )
    with client_for(db, actions=True) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/").text)
        assert csrf is not None
        paused = client.post(
            "/lanes/default/pause", data={"csrf": csrf.group(1), "reason": HOSTILE}
        )
        assert paused.status_code == 303
    return db, {"shell": shell, "printer": printer, "raw": raw}


@pytest.fixture
def client(hostile: tuple[Path, dict[str, int]]) -> Iterator[TestClient]:
    with client_for(hostile[0]) as found:
        yield found


@pytest.mark.slow
def test_no_page_holds_a_raw_control_character(
    client: TestClient, hostile: tuple[Path, dict[str, int]]
) -> None:
    ids = hostile[1]
    shell = client.get(f"/jobs/{ids['shell']}").text
    for wanted in (
        "sh -c $&#39;echo safe\\rrm -rf ~&#39;",
        ESCAPED,
        f"w{ESCAPED}",
        f"k\\x1b]0;pwned\\x07={ESCAPED}",
        "E\\x1b]52;c;cm0gLXJmIH4=\\x07",
    ):
        assert wanted in shell, wanted
    pages = [
        "/",
        "/?partial=1",
        "/jobs",
        f"/jobs/{ids['shell']}",
        f"/jobs/{ids['printer']}",
        f"/jobs/{ids['shell']}?partial=head",
        f"/jobs/{ids['printer']}?partial=history",
        f"/jobs/{ids['raw']}",
        "/events",
    ]
    for path in pages:
        response = client.get(path)
        assert response.status_code == 200, path
        assert_plain(response.text, path)
    assert ESCAPED[:40] in client.get("/").text, "the pause reason"
    assert "true $&#39;\\xff&#39;</pre>" in client.get(f"/jobs/{ids['raw']}").text
    live = client.get("/events/live", params={"cursor": 0}).json()
    assert_plain(live["html"], "/events/live")


@pytest.mark.slow
def test_output_shows_colour_codes_as_nothing_and_other_escapes_as_text(
    client: TestClient, hostile: tuple[Path, dict[str, int]]
) -> None:
    printer = hostile[1]["printer"]
    page = client.get(f"/jobs/{printer}").text
    stdout = re.search(r'<pre class="stream" id="stdout"[^>]*>(.*?)</pre>', page, re.S)
    assert stdout is not None and stdout.group(1) == SHOWN_OUTPUT
    chunk = client.get(f"/jobs/{printer}/output", params={"stream": "stdout", "offset": 0}).json()
    assert chunk["text"] == SHOWN_OUTPUT
    assert chunk["offset"] == len(OUTPUT), "offsets count the bytes the job wrote"


def test_a_colour_code_split_between_reads_is_dropped_whole() -> None:
    data = b"a\x1b[1;3"
    text, used = output_text(data, final=False)
    assert (text, used) == ("a", 1), "held back for the next read"
    rest, used_rest = output_text(data[used:] + b"1mred\x1b", final=False)
    assert (rest, used_rest) == ("red", 10)
    end, _ = output_text(b"\x1b", final=True)
    assert end == "\\x1b", "a stream that ended with ESC shows it"
    long = b"\x1b[" + b"1;" * 40
    assert output_text(long, final=False) == ("\\x1b[" + "1;" * 40, len(long))


def lane_status(html: str, lane: str) -> str:
    row = re.search(rf'<tr data-lane="{re.escape(lane)}">(.*?)</tr>', html, re.S)
    assert row is not None, lane
    badge = re.search(r'<span class="badge ([\w-]+)"[^>]*>([^<]*)</span>', row.group(1))
    assert badge is not None, row.group(1)
    return f"{badge.group(1)}: {badge.group(2)}"


def test_a_lane_says_whether_a_live_worker_serves_it(tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    add_job(db, "true", lane="orphaned")
    add_job(db, "true", lane="later", run_at=time.time() + 3600)
    add_job(db, "true", lane="stale")
    add_job(db, "true")
    drain(db)  # the default lane's job, done: then moved to a lane of its own
    execute(db, "UPDATE jobs SET queue = 'finished' WHERE queue = 'default'")
    execute(
        db,
        "INSERT INTO workers (id, hostname, pid, queue, started_at, heartbeat_at, state) "
        "VALUES ('gone', 'h', 1, 'stale', 0, 0, 'running')",
    )
    add_job(db, "true", lane="served")  # a lane is listed once it holds a job
    worker = start_worker(db, "--queue", "served")
    try:
        with client_for(db) as client:
            page = wait_for(
                lambda: (text := client.get("/").text) and "claiming" in text and text,
                what="the served lane's live worker",
            )
            assert lane_status(page, "served") == "state-done: claiming"
            assert lane_status(page, "orphaned") == "lane-unserved: no live worker"
            assert lane_status(page, "stale") == "lane-unserved: no live worker"
            assert lane_status(page, "later") == "lane-idle: no worker"
            assert lane_status(page, "finished") == "lane-idle: no worker"
            orphaned = re.search(r'<tr data-lane="orphaned">(.*?)</tr>', page, re.S)
            assert orphaned is not None and "1 due" in orphaned.group(1)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)


def test_the_job_list_counts_attempts_and_failures_apart(tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    once = add_job(db, "true")
    twice = add_job(db, "false", max_retries=1)
    drain(db)
    with client_for(db) as client:
        listed = client.get("/jobs").text
        cells = {
            int(job): re.findall(r'<td class="num">(\d+)</td>', row)
            for job, row in re.findall(r'<tr data-job="(\d+)">(.*?)</tr>', listed, re.S)
        }
        assert cells == {once: ["0", "1", "0"], twice: ["0", "2", "2"]}, "PRI, ATTEMPTS, FAILURES"
        head = client.get(f"/jobs/{twice}?partial=head").text
        assert "<dt>Attempts</dt><dd>2</dd>" in head
        assert "<dt>Failures</dt><dd>2 of max_retries 1" in head
