"""`spoolctl metrics` and the web's `/metrics`: the exposition parses with
prometheus_client's own parser and says what the queue holds, on both
backends; the kept totals agree with a fresh count through runs and prunes;
`--output` replaces its file atomically; without the extra the verb says
what to install; a warm scrape reads through indexes only."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from spoolctl.cli.database import driver_of, open_read, open_write
from spoolctl.db.backends.sqlite import make_engine
from spoolctl.errors import install_command
from spoolctl.services import metrics
from spoolctl.services.totals import EndedTotals, full_count
from spoolctl.web.access import QueueAccess
from spoolctl.web.app import create_app
from spoolctl.web.common import Settings
from spoolctl.web.request_guard import Guard
from tests.helpers import Db, add_job, is_postgres, patience, signal_taken, start_worker, wait_for
from tests.populated import run_quiet
from tests.process.test_query_plans import assert_indexed, plans_of

pytestmark = pytest.mark.subprocess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, sorted labels), and every family's type."""
    samples: Samples = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, types


def scrape(db: Db) -> tuple[Samples, dict[str, str]]:
    result = run_quiet("metrics", "--db", str(db))
    assert result.exit_code == 0, result.stdout + result.stderr
    return parse(result.stdout)


def drain(db: Db, *args: str) -> None:
    result = run_quiet("work", "--db", str(db), "--drain", "--json", *args)
    assert result.exit_code == 0, result.stdout + result.stderr


def fresh_totals(db: Db) -> dict[tuple[str, str], int]:
    queue = open_read(str(db))
    assert queue is not None
    try:
        return queue.read(lambda conn: dict(full_count(conn).ended))
    finally:
        queue.dispose()


@pytest.mark.both_backends
def test_the_exposition_says_what_the_queue_holds(db: Db) -> None:
    add_job(db, "true")
    add_job(db, "false", max_retries=0)
    add_job(db, "true", run_at=time.time() + 86400)
    add_job(db, "true", lane="slow")
    drain(db)
    assert run_quiet("pause", "--db", str(db), "slow", "--json").exit_code == 0
    samples, types = scrape(db)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("spoolctl_jobs", queue="default", state="done") == 1
    assert value("spoolctl_jobs", queue="default", state="dead") == 1
    assert value("spoolctl_jobs", queue="default", state="queued") == 1
    assert value("spoolctl_jobs", queue="slow", state="queued") == 1
    assert value("spoolctl_jobs_scheduled", queue="default") == 1
    assert value("spoolctl_jobs_scheduled", queue="slow") == 0
    assert value("spoolctl_lane_paused", queue="slow") == 1
    assert value("spoolctl_lane_paused", queue="default") == 0
    assert value("spoolctl_oldest_due_job_age_seconds", queue="slow") > 0
    assert value("spoolctl_oldest_due_job_age_seconds", queue="default") == 0, "only a future job"
    assert value("spoolctl_lane_live_workers", queue="default") == 0, "the drain has retired"
    assert value("spoolctl_attempts_ended_total", outcome="succeeded", failure_reason="") == 1
    assert (
        value("spoolctl_attempts_ended_total", outcome="failed", failure_reason="process_exit") == 1
    )
    assert value("spoolctl_reaps_total") == 0
    assert value("spoolctl_orphans_unconfirmed") == 0
    assert value("spoolctl_recent_attempt_duration_seconds_bucket", le="+Inf") == 2
    assert value("spoolctl_recent_attempt_duration_seconds_gcount") == 2
    assert value("spoolctl_recent_pickup_latency_seconds_gcount") == 2
    assert types["spoolctl_attempts_ended"] == "counter"
    assert types["spoolctl_recent_attempt_duration_seconds"] == "histogram"
    assert types["spoolctl_jobs"] == "gauge"
    ledger = ("spoolctl_ledger_unnumbered_events", ())
    assert (ledger in samples) is is_postgres(db), "the ledger's lag exists on PostgreSQL only"


@pytest.mark.both_backends
def test_each_schedule_shows_its_next_fire_time_and_whether_it_is_paused(db: Db) -> None:
    add_job(db, "true")
    for args in (("nightly", "--cron", "0 3 * * *"), ("hourly", "--every", "1h")):
        added = run_quiet("schedule", "add", "--db", str(db), "--json", *args, "--", "true")
        assert added.exit_code == 0, added.stdout + added.stderr
    assert run_quiet("schedule", "pause", "--db", str(db), "hourly").exit_code == 0
    listed = run_quiet("schedule", "list", "--db", str(db), "--json")
    expected = {s["name"]: s for s in json.loads(listed.stdout)["data"]["schedules"]}
    samples, types = scrape(db)
    assert types["spoolctl_schedule_next_fire_timestamp_seconds"] == "gauge"
    nightly = samples[("spoolctl_schedule_next_fire_timestamp_seconds", (("schedule", "nightly"),))]
    assert nightly == pytest.approx(expected["nightly"]["next_fire_at"])
    assert time.time() < nightly <= time.time() + 86400
    assert samples[("spoolctl_schedule_paused", (("schedule", "nightly"),))] == 0
    assert samples[("spoolctl_schedule_paused", (("schedule", "hourly"),))] == 1


def test_live_workers_their_attempts_and_free_slots(db: Path) -> None:
    add_job(db, "sleep", "30", lane="gpu")
    worker = start_worker(db, "--queue", "gpu", "--slots", "3")
    try:
        wait_for(
            lambda: scrape(db)[0].get(("spoolctl_lane_running_jobs", (("queue", "gpu"),))),
            timeout=20,
            what="the job to run",
        )
        samples, _ = scrape(db)
        gpu = (("queue", "gpu"),)
        assert samples[("spoolctl_lane_live_workers", gpu)] == 1
        assert samples[("spoolctl_lane_slots", gpu)] == 3
        assert samples[("spoolctl_lane_free_slots", gpu)] == 2
        assert samples[("spoolctl_workers_live", ())] == 1
        running = {k: v for k, v in samples.items() if k[0] == "spoolctl_worker_running_attempts"}
        assert list(running.values()) == [1], running
    finally:
        signal_taken(worker, signal.SIGTERM)
        worker.send_signal(signal.SIGTERM)  # the second signal kills the job's group
        worker.communicate(timeout=patience(30))


@pytest.mark.both_backends
def test_kept_totals_agree_with_a_fresh_count_through_runs_and_prunes(db: Db) -> None:
    kept = EndedTotals()

    def read() -> dict[tuple[str, str], int]:
        queue = open_read(str(db))
        assert queue is not None
        try:
            return queue.read(kept.read)
        finally:
            queue.dispose()

    add_job(db, "true")
    add_job(db, "false", max_retries=1)
    drain(db)
    assert read() == fresh_totals(db) == {("succeeded", ""): 1, ("failed", "process_exit"): 2}
    slow = add_job(db, "sleep", "1")
    worker = start_worker(db, "--drain")
    queue = open_read(str(db))
    assert queue is not None
    try:
        wait_for(
            lambda: (
                queue.read(lambda c: metrics.collect(c, time.time(), live_within_s=30))
                .lanes["default"]
                .running
            ),
            timeout=20,
            what="the job to run",
        )
    finally:
        queue.dispose()
    assert read() == fresh_totals(db), "a running attempt is not counted yet"
    worker.communicate(timeout=patience(30))
    assert read() == fresh_totals(db) == {("succeeded", ""): 2, ("failed", "process_exit"): 2}
    assert slow
    result = run_quiet("prune", "--db", str(db), "--older-than", "0", "--state", "dead", "--yes")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert read() == fresh_totals(db) == {("succeeded", ""): 2}, "pruned attempts are gone"


def test_output_replaces_its_file_in_one_rename(db: Path, tmp_path: Path) -> None:
    add_job(db, "true")
    target = tmp_path / "textfile" / "spoolctl.prom"
    target.parent.mkdir()
    target.write_text("old\n")
    result = run_quiet("metrics", "--db", str(db), "--output", str(target), "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.envelope["data"]["output"] == str(target)
    assert result.envelope["data"]["exposition"] is None
    samples, _ = parse(target.read_text())
    assert samples[("spoolctl_jobs", (("queue", "default"), ("state", "queued")))] == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["spoolctl.prom"], "no temp file left"
    missing = tmp_path / "nowhere" / "x.prom"
    refused = run_quiet("metrics", "--db", str(db), "--output", str(missing), "--json")
    assert refused.exit_code == 1
    assert refused.envelope["errors"][0]["code"] == "INVALID_INPUT"
    assert not missing.parent.exists()


def test_without_the_extra_the_verb_and_the_page_name_the_install(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_job(db, "true")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "spoolctl.exposition", raising=False)
    result = run_quiet("metrics", "--db", str(db), "--json")
    assert result.exit_code == 3
    error = result.envelope["errors"][0]
    assert error["code"] == "EXTRA_MISSING"
    assert error["detail"]["install"] == install_command("metrics")
    with client_for(db, Guard.loopback(8765)) as client:
        page = client.get("/metrics")
    assert page.status_code == 501 and "spoolctl[metrics]" in page.text


def client_for(db: Db, guard: Guard) -> TestClient:
    target = str(db)
    access = QueueAccess(
        lambda: open_read(target), lambda: open_write(target), driver_of(target).display
    )
    app = create_app(access, guard, Settings(False, "web: tester"))
    return TestClient(app, base_url=f"http://127.0.0.1:{guard.port}", follow_redirects=False)


def test_the_web_serves_the_same_behind_its_token(db: Path) -> None:
    add_job(db, "true")
    drain(db)
    token = "m" * 24
    with client_for(db, Guard(8765, token)) as client:
        assert client.get("/metrics").status_code == 401
        page = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
        again = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    served, _ = parse(page.text)
    printed, _ = scrape(db)
    key = ("spoolctl_attempts_ended_total", (("failure_reason", ""), ("outcome", "succeeded")))
    assert served[key] == printed[key] == parse(again.text)[0][key] == 1
    assert served[("spoolctl_jobs", (("queue", "default"), ("state", "done")))] == 1


def test_a_warm_scrape_reads_through_indexes_only(db: Path) -> None:
    """The first scrape of a process counts the attempts table once (its one
    scan); every later one reads the new attempts by the primary key, the
    jobs through the claim index, the window by the primary key's end."""
    for n in range(3):
        add_job(db, "true", lane=f"q{n}")
    add_job(db, "true", lane="q0", run_at=time.time() + 3600)
    for n in range(3):
        drain(db, "--queue", f"q{n}")
    add_job(db, "true", lane="q1")
    kept = EndedTotals()
    engine = make_engine(db, write=True, busy_timeout_s=5)
    try:

        def scrape_once(conn: Any) -> None:
            metrics.collect(conn, time.time(), live_within_s=30, totals=kept)

        full_count = "GROUP BY attempts.state, attempts.failure_reason"
        cold = [" ".join(sql.split()) for sql, _ in plans_of(engine, scrape_once)]
        assert sum(full_count in sql for sql in cold) == 1, cold
        warm = plans_of(engine, scrape_once)
        assert not [sql for sql, _ in warm if full_count in " ".join(sql.split())]
        assert_indexed(warm)
    finally:
        engine.dispose()


def test_the_output_file_mode_is_readable_by_another_user(db: Path, tmp_path: Path) -> None:
    """node_exporter runs as its own user: the file is not left 0600 by mkstemp."""
    target = tmp_path / "m.prom"
    old = os.umask(0o077)
    try:
        assert run_quiet("metrics", "--db", str(db), "--output", str(target)).exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
