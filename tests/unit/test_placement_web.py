"""Placement as the web and `metrics` show it, on both backends: a job's
request, its attempts' host and devices and whether each is still held, a
queued job that no live worker could hold and why (the job page, the
overview's card and list, `spoolctl_jobs_unplaceable`), the GPUs card, each
worker's inventory with its devices' holders, and the device series
(`spoolctl_device_held_share`, `spoolctl_devices`).

The state is made through the services, as a worker would: its
registration with an inventory (`heartbeat.register_worker`), claims
(`claim.claim_up_to`) and an ended attempt (`record_outcomes`)."""

from __future__ import annotations

import html as html_text
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, update
from starlette.testclient import TestClient

from spoolctl.cli.database import driver_of, open_read, open_write
from spoolctl.db.backends.sqlite import make_engine
from spoolctl.db.queue import Queue
from spoolctl.db.tables import jobs
from spoolctl.resources import Device
from spoolctl.runner.capacity import Capacity
from spoolctl.services import claim, heartbeat, metrics
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.outcome import Ending, Outcome, record_outcomes
from spoolctl.services.submit import submit
from spoolctl.web.access import QueueAccess
from spoolctl.web.app import create_app
from spoolctl.web.common import Settings
from spoolctl.web.request_guard import Guard
from tests.helpers import Db, is_postgres
from tests.populated import run_quiet
from tests.process.test_query_plans import assert_indexed, plans_of

GIB = 1 << 30
PORT = 8765
HOSTILE_MODEL = "<i>H100</i>"

pytestmark = pytest.mark.both_backends


def add(queue: Queue, lane: str = "gpu", priority: int = 0, **request: object) -> int:
    def run(conn: Connection) -> int:
        spec = JobSpec(argv=["true"], lane=lane, priority=priority)
        job_id = int(submit(conn, spec, time.time() - 1).job_id)
        if request:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**request))
        return job_id

    return queue.write(run)


class Worker:
    """A registered worker of lane `gpu` on host `a` with two fake GPUs and a
    memory budget, claiming in this process."""

    def __init__(self, queue: Queue) -> None:
        devices = tuple(Device(f"GPU-a-{i}", i, "Fake A100", 80 * GIB) for i in range(2))
        self.queue = queue
        self.capacity = Capacity(8, memory_bytes=64 * GIB, devices=devices, host="a")
        info = heartbeat.WorkerInfo(
            id="w-a",
            hostname="a",
            pid=os.getpid(),
            process_started_at=None,
            boot_id="boot",
            lane="gpu",
            cap=None,
            concurrency=8,
            inventory=self.capacity.inventory,
        )
        queue.write(lambda conn: heartbeat.register_worker(conn, info, time.time()))
        self.claimant = claim.Claimant(
            "w-a",
            os.getpid(),
            "gpu",
            queue.output_root,
            cap=self.capacity,
            inventory=self.capacity.inventory,
        )

    def take(self) -> list[claim.Claim]:
        room = self.capacity.room()
        claims = self.queue.write(
            lambda conn: claim.claim_up_to(conn, self.claimant, room.slots, time.time(), room)
        )
        for c in claims:
            self.capacity.allocate(c)
        return claims

    def end(self, taken: claim.Claim) -> None:
        ending = Ending(
            taken.job_id, taken.attempt_id, taken.attempt_no, Outcome(0, None), holds=True
        )
        self.queue.write(
            lambda conn: record_outcomes(conn, [ending], worker_id="w-a", now=time.time())
        )


@pytest.fixture
def placed(db: Db) -> Iterator[dict[str, int]]:
    """A done job whose device was released; a half and a whole GPU job
    holding GPU-a-0 (half) and GPU-a-1; two queued jobs no worker could
    hold (16 GPUs, a model nobody has); a queued weighted job; a 4-GPU job
    in a lane no worker serves (not unplaceable: a worker may join)."""
    queue = open_write(str(db))
    try:
        worker = Worker(queue)
        ids = {"done": add(queue, gpus=1)}
        (first,) = worker.take()
        worker.end(first)
        ids["half"] = add(queue, priority=2, gpus=1, gpu_share=2)
        ids["whole"] = add(queue, priority=1, gpus=1)
        assert sorted(c.job_id for c in worker.take()) == [ids["half"], ids["whole"]]
        ids["big"] = add(queue, gpus=16)
        ids["model"] = add(queue, gpus=1, gpu_model=HOSTILE_MODEL, gpu_memory_bytes=40 * GIB)
        ids["heavy"] = add(queue, weight=3)
        ids["plain"] = add(queue)
        ids["elsewhere"] = add(queue, lane="cpu", gpus=4)
        yield ids
    finally:
        queue.dispose()


@pytest.fixture
def web(db: Db) -> Iterator[TestClient]:
    target = str(db)
    access = QueueAccess(
        lambda: open_read(target), lambda: open_write(target), driver_of(target).display
    )
    app = create_app(access, Guard.loopback(PORT), Settings(False, "web: tester"))
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False) as client:
        yield client


def text_of(html: str) -> str:
    """A page's text, tags dropped and blanks folded."""
    return " ".join(html_text.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def part(html: str, marker: str) -> str:
    """The element that `marker` (an attribute) opens, up to its row's or block's end."""
    start = html.index(marker)
    return html[start : html.index("</td>", start)]


def test_the_job_page_shows_the_request_host_devices_and_their_holds(
    placed: dict[str, int], web: TestClient
) -> None:
    half = web.get(f"/jobs/{placed['half']}").text
    assert re.search(r'id="request-gpus">0\.5\b', half), half
    assert 'id="unplaceable"' not in half
    cell = text_of(part(half, 'class="devices"'))
    assert "GPU-a-0 GPU 0, Fake A100 held" in cell, cell
    assert "<th>Host</th>" in half and "<td>a</td>" in half
    done = text_of(part(web.get(f"/jobs/{placed['done']}").text, 'class="devices"'))
    assert "GPU-a-0" in done and "released" in done and "held" not in done.replace("released", "")
    heavy = web.get(f"/jobs/{placed['heavy']}").text
    assert 'id="request-weight">3 slots' in heavy and "request-gpus" not in heavy
    plain = web.get(f"/jobs/{placed['plain']}").text
    assert "request-weight" not in plain and "Devices</th>" not in plain


def test_a_queued_job_no_worker_could_hold_says_why_on_its_page(
    placed: dict[str, int], web: TestClient
) -> None:
    big = web.get(f"/jobs/{placed['big']}").text
    banner = text_of(
        big[big.index('id="unplaceable"') : big.index("</p>", big.index('id="unplaceable"'))]
    )
    assert "Cannot be placed: no live worker of lane 'gpu' can hold it" in banner, banner
    assert "needs 16 GPU(s); the worker has 2" in banner
    assert 'badge state-unplaceable">unplaceable' in big
    model = web.get(f"/jobs/{placed['model']}").text
    assert "&lt;i&gt;H100&lt;/i&gt;" in model and HOSTILE_MODEL not in model
    assert 'id="request-gpus">1' in model and "at least 40G each" in model
    elsewhere = web.get(f"/jobs/{placed['elsewhere']}").text
    assert 'id="unplaceable"' not in elsewhere, "a lane without a live worker is not judged"


def test_the_overview_shows_gpus_unplaceable_jobs_and_each_workers_devices(
    placed: dict[str, int], web: TestClient
) -> None:
    page = web.get("/").text
    gpus = text_of(
        page[page.index('id="count-gpus"') : page.index("</div>", page.index('id="count-gpus"'))]
    )
    assert gpus.endswith("> 2 GPUs 1.5 held · 0.5 free · 0 idle"), gpus
    stuck = page[page.index('id="count-unplaceable"') :]
    assert re.match(r'id="count-unplaceable"[^>]*>\s*<span class="n">2</span>', stuck), stuck[:200]
    listed = re.findall(r'<tr data-job="(\d+)">', page[page.index('<section id="unplaceable">') :])
    assert listed[:2] == [str(placed["big"]), str(placed["model"])]
    assert "needs 16 GPU(s); the worker has 2" in page
    inventory = text_of(part(page, 'class="inventory" data-worker="w-a"'))
    assert "8 slots, memory budget 64G" in inventory, inventory
    assert f"GPU 0 Fake A100, 80G GPU-a-0 held 0.5: #{placed['half']} (0.5)" in inventory
    assert f"GPU 1 Fake A100, 80G GPU-a-1 held 1: #{placed['whole']} (1)" in inventory


def test_without_devices_or_unplaceable_jobs_the_overview_has_no_such_cards(
    db: Db, web: TestClient
) -> None:
    queue = open_write(str(db))
    try:
        add(queue, lane="default")
    finally:
        queue.dispose()
    page = web.get("/").text
    assert "count-gpus" not in page and "count-unplaceable" not in page
    assert 'id="unplaceable"' not in page and "<th>Inventory</th>" not in page


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def device_key(index: int) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"host": "a", "uuid": f"GPU-a-{index}", "index": str(index), "model": "Fake A100"}
    return "spoolctl_device_held_share", tuple(sorted(labels.items()))


def test_metrics_export_each_devices_held_share_and_the_unplaceable_jobs(
    db: Db, placed: dict[str, int], web: TestClient
) -> None:
    result = run_quiet("metrics", "--db", str(db))
    assert result.exit_code == 0, result.stdout + result.stderr
    found = samples(result.stdout)
    assert found[device_key(0)] == 0.5
    assert found[device_key(1)] == 1.0
    assert found[("spoolctl_devices", (("host", "a"),))] == 2
    assert found[("spoolctl_jobs_unplaceable", (("queue", "gpu"),))] == 2
    assert found.get(("spoolctl_jobs_unplaceable", (("queue", "cpu"),)), 0) == 0
    served = samples(web.get("/metrics").text)
    assert {k: v for k, v in served.items() if "device" in k[0] or "unplaceable" in k[0]} == {
        k: v for k, v in found.items() if "device" in k[0] or "unplaceable" in k[0]
    }


def test_metrics_after_the_holds_are_released_say_the_devices_are_free(
    db: Db, placed: dict[str, int]
) -> None:
    queue = open_write(str(db))
    try:
        queue.write(
            lambda conn: conn.execute(
                update(jobs)
                .where(jobs.c.id.in_([placed["big"], placed["model"]]))
                .values(gpus=1, gpu_model=None)
            )
        )
    finally:
        queue.dispose()
    found = samples(run_quiet("metrics", "--db", str(db)).stdout)
    assert found[("spoolctl_jobs_unplaceable", (("queue", "gpu"),))] == 0
    assert found[device_key(0)] == 0.5, "the holds stay until their attempts end"


@pytest.mark.sqlite_only("reads SQLite's query plans")
def test_a_scrape_with_devices_and_requests_reads_through_indexes(
    db: Db, placed: dict[str, int]
) -> None:
    assert not is_postgres(db)
    engine = make_engine(db, write=True, busy_timeout_s=5)
    try:

        def scrape(conn: Any) -> None:
            metrics.collect(conn, time.time(), live_within_s=30)

        plans = plans_of(engine, scrape)
        asking = [p for sql, p in plans if "gpus IS NOT NULL" in " ".join(sql.split())]
        assert asking, "the unplaceable jobs were not read"
        assert all(  # the partial index of requests alone, not every queued job of the lane
            p[0]
            == "SEARCH jobs USING INDEX ix_jobs_requests (state=? AND queue=? AND next_run_at<?)"
            for p in asking
        ), asking
        assert_indexed(plans)
    finally:
        engine.dispose()
