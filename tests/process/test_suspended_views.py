"""A suspended job (state `running`, `suspended_at` set) as every view shows
it, on both backends: `list` (its state column reads `suspended`; the JSON
keeps `state: running` and adds `suspended_at` and `suspended`), `list
--state suspended`, `show`, `status` (a suspended count among the running,
the state counts unchanged), `workers`, `metrics` and the web's pages; and
the web's buttons on a running job's page, which write a request for its
worker (a `control_requests` row and a `requested` event) through the same
guard as its other actions, and refuse a job that is not running.

The suspension is written into the queue directly (no worker runs here): a
worker sets `suspended_at` when it delivers a suspend
(`services/control.py`'s `deliver`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from spoolctl.cli.database import driver_of, open_read, open_write
from spoolctl.cli.schemas import DATA_SCHEMAS
from spoolctl.web.access import QueueAccess
from spoolctl.web.app import create_app
from spoolctl.web.common import Settings
from spoolctl.web.request_guard import Guard
from tests.helpers import SUSPENDED_AT, Db, add_job, execute, job, rows, run_as_worker
from tests.populated import run_quiet
from tests.schema_check import errors as schema_errors

pytestmark = pytest.mark.subprocess

PORT = 8765
ACTOR = "web: tester@box (pid 1)"


@pytest.fixture
def steered(db: Db) -> dict[str, int]:
    """Two running jobs of lane `gpu` (one suspended), a queued one, and a
    done job whose stale `suspended_at` means nothing."""
    ids = {
        "suspended": add_job(db, "sleep", "100", lane="gpu"),
        "running": add_job(db, "sleep", "101", lane="gpu"),
        "queued": add_job(db, "true"),
        "done": add_job(db, "true"),
    }
    now = time.time()
    execute(
        db,
        "INSERT INTO workers (id, hostname, pid, queue, started_at, heartbeat_at, state) "
        "VALUES ('w1', 'h', 1, 'gpu', ?, ?, 'running')",
        (now, now),
    )
    run_as_worker(db, ids["suspended"], suspended=True)
    run_as_worker(db, ids["running"], suspended=False)
    execute(
        db,
        "UPDATE jobs SET state = 'done', finished_at = ?, suspended_at = ? WHERE id = ?",
        (now, SUSPENDED_AT, ids["done"]),
    )
    return ids


def answer(db: Db, *args: str) -> dict[str, Any]:
    """A verb's --json data, checked against its published schema."""
    result = run_quiet(*args, "--db", str(db), "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)["data"]
    assert not schema_errors(data, DATA_SCHEMAS[args[0]]), schema_errors(
        data, DATA_SCHEMAS[args[0]]
    )
    return data


def text(db: Db, *args: str) -> str:
    result = run_quiet(*args, "--db", str(db))
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.stdout


def state_column(listing: str) -> dict[int, str]:
    return {int(line.split()[0]): line.split()[1] for line in listing.splitlines()[1:]}


@pytest.mark.both_backends
def test_list_and_show_say_suspended_and_the_json_keeps_running(
    db: Db, steered: dict[str, int]
) -> None:
    ids = steered
    jobs = {j["id"]: j for j in answer(db, "list")["jobs"]}
    assert jobs[ids["suspended"]]["state"] == "running", "contract v2: the state stays"
    assert jobs[ids["suspended"]]["suspended"] is True
    assert jobs[ids["suspended"]]["suspended_at"] == SUSPENDED_AT
    for other in ("running", "queued", "done"):
        assert jobs[ids[other]]["suspended"] is False, other
        assert jobs[ids[other]]["suspended_at"] is None, "a stale value is no suspension"
    states = state_column(text(db, "list"))
    assert states[ids["suspended"]] == "suspended" and states[ids["running"]] == "running"
    assert states[ids["done"]] == "done"

    only = answer(db, "list", "--state", "suspended")["jobs"]
    assert [j["id"] for j in only] == [ids["suspended"]]
    running = answer(db, "list", "--state", "running")["jobs"]
    assert {j["id"] for j in running} == {ids["suspended"], ids["running"]}
    both = answer(db, "list", "--state", "suspended,queued")["jobs"]
    assert {j["id"] for j in both} == {ids["suspended"], ids["queued"]}
    assert state_column(text(db, "list", "--state", "suspended")) == {ids["suspended"]: "suspended"}

    shown = answer(db, "show", str(ids["suspended"]))["job"]
    assert shown["state"] == "running" and shown["suspended_at"] == SUSPENDED_AT
    assert shown["suspended"] is True
    assert answer(db, "show", str(ids["done"]))["job"]["suspended_at"] is None
    page = text(db, "show", str(ids["suspended"]))
    assert page.splitlines()[0].split()[2] == "suspended"
    assert re.search(r"^  suspended since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page, re.M), page
    assert "suspended" not in text(db, "show", str(ids["running"]))


@pytest.mark.both_backends
def test_status_and_workers_count_the_suspended_among_the_running(
    db: Db, steered: dict[str, int]
) -> None:
    ids = steered
    data = answer(db, "status")
    assert data["counts"]["running"] == 2, "the state counts are unchanged"
    assert data["suspended"] == 1
    assert data["queues"]["gpu"]["suspended"] == 1 and data["queues"]["default"]["suspended"] == 0
    (worker,) = data["workers"]
    assert sorted(worker["running_jobs"]) == sorted([ids["suspended"], ids["running"]])
    assert worker["suspended_jobs"] == [ids["suspended"]]
    view = text(db, "status")
    assert "running 2 (1 suspended)" in view
    assert re.search(r"^gpu\s+0\s+2 \(1 suspended\)", view, re.M), view
    assert f"{ids['suspended']} (suspended)" in view

    listed = answer(db, "workers")["workers"][0]
    assert listed["suspended_jobs"] == [ids["suspended"]]
    assert f"{ids['suspended']} (suspended)" in text(db, "workers")


@pytest.mark.both_backends
def test_metrics_count_the_suspended_jobs_per_lane(db: Db, steered: dict[str, int]) -> None:
    result = run_quiet("metrics", "--db", str(db))
    assert result.exit_code == 0, result.stdout + result.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(result.stdout)
        for s in family.samples
    }
    assert samples[("spoolctl_jobs_suspended", (("queue", "gpu"),))] == 1
    assert samples[("spoolctl_jobs_suspended", (("queue", "default"),))] == 0
    assert samples[("spoolctl_jobs", (("queue", "gpu"), ("state", "running")))] == 2


# -- the web -------------------------------------------------------------------------


@pytest.fixture
def web(db: Db) -> Iterator[TestClient]:
    target = str(db)
    access = QueueAccess(
        lambda: open_read(target), lambda: open_write(target), driver_of(target).display
    )
    app = create_app(access, Guard.loopback(PORT), Settings(True, ACTOR))
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False) as client:
        yield client
    access.close()


def csrf_of(client: TestClient, path: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found is not None, "the page offers a form"
    return found.group(1)


def badge_of(page: str, job_id: int) -> str:
    row = re.search(rf'<tr data-job="{job_id}">(.*?)</tr>', page, re.S)
    assert row is not None, job_id
    found = re.search(r'<span class="badge state-(\w+)">(\w+)</span>', row.group(1))
    assert found is not None
    return found.group(2)


@pytest.mark.both_backends
def test_the_web_shows_a_suspended_job_on_its_pages(
    db: Db, steered: dict[str, int], web: TestClient
) -> None:
    ids = steered
    listing = web.get("/jobs").text
    assert badge_of(listing, ids["suspended"]) == "suspended"
    assert badge_of(listing, ids["running"]) == "running"
    assert badge_of(listing, ids["done"]) == "done"
    only = web.get("/jobs?state=suspended").text
    assert re.findall(r'<tr data-job="(\d+)">', only) == [str(ids["suspended"])]
    overview = web.get("/").text
    count = re.search(r'id="count-suspended".*?<span class="n">(\d+)</span>', overview, re.S)
    assert count is not None and count.group(1) == "1"
    assert '2 <span class="small muted">(1 suspended)</span>' in overview
    page = web.get(f"/jobs/{ids['suspended']}").text
    assert 'class="badge state-suspended">suspended</span>' in page
    assert 'id="suspended-since"' in page
    assert 'data-action="continue"' in page and 'data-action="suspend"' not in page
    assert 'data-action="signal"' in page and 'data-action="cancel"' in page
    other = web.get(f"/jobs/{ids['running']}").text
    assert 'data-action="suspend"' in other and 'data-action="continue"' not in other
    assert all(f'<option value="{s}">SIG{s}</option>' in other for s in ("TERM", "USR1", "HUP"))
    queued = web.get(f"/jobs/{ids['queued']}").text
    assert not any(f'data-action="{a}"' in queued for a in ("suspend", "continue", "signal"))


def requests_of(db: Db, job_id: int) -> list[Any]:
    return rows(
        db,
        "SELECT action, signal, requested_by, settled_at FROM control_requests "
        "WHERE job_id = ? ORDER BY id",
        (job_id,),
    )


def requested_events(db: Db, job_id: int) -> list[dict[str, Any]]:
    found = rows(
        db,
        "SELECT detail FROM job_events WHERE job_id = ? AND event = 'requested' ORDER BY id",
        (job_id,),
    )
    return [json.loads(r["detail"]) for r in found]


@pytest.mark.both_backends
def test_the_web_buttons_write_a_request_for_the_worker(
    db: Db, steered: dict[str, int], web: TestClient
) -> None:
    ids = steered
    csrf = csrf_of(web, f"/jobs/{ids['running']}")
    asked = web.post(f"/jobs/{ids['running']}/suspend", data={"csrf": csrf})
    assert asked.status_code == 303
    assert asked.headers["location"] == f"/jobs/{ids['running']}?done=suspend"
    assert "Suspend requested" in web.get(asked.headers["location"]).text
    sent = web.post(f"/jobs/{ids['running']}/signal", data={"csrf": csrf, "signal": "USR1"})
    assert sent.headers["location"] == f"/jobs/{ids['running']}?done=signal"
    go_on = web.post(f"/jobs/{ids['suspended']}/continue", data={"csrf": csrf, "next": "/"})
    assert go_on.headers["location"] == "/?done=continue"

    by = ACTOR + ", client testclient"
    made = [tuple(r) for r in requests_of(db, ids["running"])]
    assert made == [("suspend", None, by, None), ("signal", "SIGUSR1", by, None)]
    assert [tuple(r) for r in requests_of(db, ids["suspended"])] == [("continue", None, by, None)]
    events = requested_events(db, ids["running"])
    assert [(e["action"], e.get("signal"), e["by"]) for e in events] == [
        ("suspend", None, by),
        ("signal", "SIGUSR1", by),
    ]
    assert job(db, ids["running"])["suspended_at"] is None, "the worker delivers it, not the web"


@pytest.mark.both_backends
def test_the_web_refuses_a_request_the_job_cannot_take(
    db: Db, steered: dict[str, int], web: TestClient
) -> None:
    ids = steered
    csrf = csrf_of(web, f"/jobs/{ids['running']}")
    before = rows(db, "SELECT count(*) AS n FROM job_events")[0]["n"]
    for path, form, status, code in (
        (f"/jobs/{ids['queued']}/suspend", {}, 409, "CONFLICT"),
        (f"/jobs/{ids['done']}/signal", {"signal": "TERM"}, 409, "CONFLICT"),
        (f"/jobs/{ids['suspended']}/suspend", {}, 409, "CONFLICT"),
        (f"/jobs/{ids['running']}/continue", {}, 409, "CONFLICT"),
        (f"/jobs/{ids['running']}/signal", {"signal": "KILL"}, 400, "INVALID_INPUT"),
        (f"/jobs/{ids['running']}/signal", {"signal": "STOP"}, 400, "INVALID_INPUT"),
        (f"/jobs/{ids['running']}/signal", {}, 400, "INVALID_INPUT"),
        ("/jobs/999/suspend", {}, 404, "NOT_FOUND"),
    ):
        refused = web.post(path, data={"csrf": csrf, **form})
        assert refused.status_code == status, (path, form, refused.text)
        assert f"{code}:" in refused.text and "<h1>" in refused.text, "the web's error page"
    cross = web.post(f"/jobs/{ids['running']}/suspend", data={"csrf": "forged"})
    assert cross.status_code == 403
    assert rows(db, "SELECT count(*) AS n FROM control_requests")[0]["n"] == 0
    assert rows(db, "SELECT count(*) AS n FROM job_events")[0]["n"] == before


def test_without_allow_actions_there_is_no_button_and_no_request(
    db: Db, steered: dict[str, int]
) -> None:
    ids = steered
    target = str(db)
    access = QueueAccess(
        lambda: open_read(target), lambda: open_write(target), driver_of(target).display
    )
    app = create_app(access, Guard.loopback(PORT), Settings(False, ACTOR))
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False) as client:
        page = client.get(f"/jobs/{ids['running']}").text
        assert "data-action" not in page
        refused = client.post(f"/jobs/{ids['running']}/suspend", data={"csrf": "x"})
        assert refused.status_code == 403 and "--allow-actions" in refused.text
    access.close()
    assert rows(db, "SELECT count(*) AS n FROM control_requests")[0]["n"] == 0
