"""The dashboard's schedules page: next fire times and last occurrences,
pause and resume only with --allow-actions (ledgered through the same
service as the verbs), what people wrote shown escaped."""

from __future__ import annotations

import json

import pytest

from spoolctl.cli.database import open_write
from spoolctl.services import firing
from tests.helpers import Db, rows
from tests.populated import run_quiet
from tests.process.test_web import IMG, assert_escaped, client_for, csrf_of

pytestmark = [pytest.mark.subprocess, pytest.mark.both_backends]


def schedule(db: Db, *args: str) -> None:
    result = run_quiet(*args[:1], "--db", str(db), "--json", *args[1:])
    assert result.exit_code == 0, result.stdout + result.stderr


def test_the_page_shows_schedules_and_pauses_and_resumes_them(db: Db) -> None:
    schedule(
        db,
        "schedule add",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Asia/Tokyo",
        "--",
        "true",
    )
    schedule(db, "schedule add", "ping", "--every", "1h", "--", "true")
    schedule(db, "schedule pause", "nightly", "--reason", IMG)
    queue = open_write(str(db))
    try:
        now = queue.now()
        queue.write(
            lambda conn: [firing.fire(conn, i, now, None) for i in firing.due_schedules(conn, now)]
        )
    finally:
        queue.engine.dispose()
    with client_for(db) as client:
        page = client.get("/schedules").text
        assert_escaped(page)
        assert "Asia/Tokyo" in page and "0 3 * * *" in page and "every 3600s" in page
        assert 'data-schedule="ping"' in page and "job 1" in page
        assert '<form method="post"' not in page
        refused = client.post("/schedules/ping/pause", data={"csrf": "x"})
        assert refused.status_code == 403
    with client_for(db, actions=True) as client:
        csrf = csrf_of(client, "/schedules")
        paused = client.post("/schedules/ping/pause", data={"csrf": csrf, "reason": "deploy"})
        assert paused.status_code == 303
        assert paused.headers["location"] == "/schedules?done=schedule_pause"
        assert client.post("/schedules/nightly/resume", data={"csrf": csrf}).status_code == 303
        missing = client.post("/schedules/nope/resume", data={"csrf": csrf})
        assert missing.status_code == 404
    found = {
        r["name"]: r["paused_reason"] for r in rows(db, "SELECT name, paused_reason FROM schedules")
    }
    assert found["nightly"] is None and found["ping"].startswith("deploy (web: ")
    events = rows(db, "SELECT event, detail FROM job_events WHERE job_id IS NULL ORDER BY id")
    assert [e for e, _ in events][-2:] == ["schedule_paused", "schedule_resumed"]
    assert json.loads(events[-2][1])["schedule"] == "ping"
