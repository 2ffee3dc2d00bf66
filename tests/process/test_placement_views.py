"""Who holds what, and what cannot be placed, as every view shows it: a worker
registered with an inventory (two GPUs, slots, a memory budget), jobs that
ask for shares of a GPU placed by the real claim, a job asking for more GPUs
than any live worker has, and an ended attempt whose orphan keeps its hold;
then the real verbs (`show`, `list`, `workers`, `status`, `feedback`,
`doctor`) in subprocesses, their JSON and their text. A queue with no
device and no request shows none of it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, update

from spoolctl.cli.database import open_write
from spoolctl.cli.schemas import DATA_SCHEMAS
from spoolctl.db.queue import Queue
from spoolctl.db.tables import attempts, jobs
from spoolctl.resources import Device
from spoolctl.runner.capacity import Capacity
from spoolctl.services import claim, heartbeat
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests.helpers import Db, Result, cli, cli_json
from tests.schema_check import errors as schema_errors

pytestmark = pytest.mark.both_backends

GIB = 1 << 30
ANSI = re.compile(r"\x1b\[[0-9;]*m")
DEVICES = (Device("GPU-a-0", 0, "Fake A100", 80 * GIB), Device("GPU-a-1", 1, "Fake A100", 80 * GIB))


def add(queue: Queue, **request: object) -> int:
    def run(conn: Connection) -> int:
        job_id = int(submit(conn, JobSpec(argv=["true"]), time.time() - 1).job_id)
        if request:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**request))
        return job_id

    return queue.write(run)


@pytest.fixture
def placed(db: Db) -> Iterator[dict[str, Any]]:
    """Jobs 1 and 2 hold half of GPU-a-0 each (packed onto one device), job 3
    asks for 16 GPUs where the one live worker has 2, job 4 asks for
    nothing and waits in another lane."""
    queue = open_write(str(db))
    capacity = Capacity(4, memory_bytes=8 * GIB, devices=DEVICES, host="a")
    inventory = capacity.inventory
    info = heartbeat.WorkerInfo("w-a", "a", 1, None, "boot", "default", None, 4, None, inventory)
    queue.write(lambda conn: heartbeat.register_worker(conn, info, time.time()))
    half = {"gpus": 1, "gpu_share": 2}
    ids = [add(queue, **half), add(queue, **half), add(queue, gpus=16)]
    ids.append(
        queue.write(
            lambda conn: int(submit(conn, JobSpec(argv=["x"], lane="other"), time.time()).job_id)
        )
    )
    claimant = claim.Claimant(
        "w-a", 1, "default", queue.output_root, cap=capacity, inventory=inventory
    )
    room = capacity.room()
    taken = queue.write(lambda conn: claim.claim_up_to(conn, claimant, 4, time.time(), room))
    assert sorted(c.job_id for c in taken) == ids[:2], "the two shares were placed"
    yield {"ids": ids, "queue": queue}
    queue.engine.dispose()


LIVE = {"SPOOLCTL_TEST_REAP_THRESHOLD": "3600"}
"""The registered worker stays live however slow the machine is (its
heartbeat is never renewed: no process runs here)."""


def text_of(*args: str, db: Db) -> str:
    result = cli(*args, db=db, env=LIVE)
    assert result.exit_code == 0, result.stderr
    return ANSI.sub("", result.stdout)


def json_of(*args: str, db: Db) -> Result:
    """The verb's JSON, checked against its published schema."""
    result = cli_json(*args, db=db, env=LIVE)
    assert result.exit_code == 0, result.stderr
    assert schema_errors(result.data, DATA_SCHEMAS[args[0]]) == [], args
    return result


def test_show_names_each_attempts_host_devices_and_holds(db: Db, placed: dict[str, Any]) -> None:
    first, _, big, _ = placed["ids"]
    data = json_of("show", str(first), db=db).data
    (attempt,) = data["attempts"]
    assert attempt["host"] == "a"
    assert attempt["devices"] == ["GPU-a-0"]
    assert attempt["holds"] == ["GPU-a-0"], "the running attempt holds its device"
    assert data["unplaceable"] is None
    text = text_of("show", str(first), db=db)
    assert "HOST" in text and "attempt 1 devices GPU-a-0 (held)" in text

    data = json_of("show", str(big), db=db).data
    assert data["attempts"] == []
    assert "needs 16 GPU(s); the worker has 2" in data["unplaceable"]
    assert "no live worker of lane 'default' can hold it" in data["unplaceable"]
    text = text_of("show", str(big), db=db)
    assert "unplaceable: no live worker of lane 'default'" in text


def test_an_ended_attempt_whose_orphan_keeps_its_hold_says_so(
    db: Db, placed: dict[str, Any]
) -> None:
    queue: Queue = placed["queue"]
    second = placed["ids"][1]
    queue.write(
        lambda conn: conn.execute(
            update(attempts).where(attempts.c.job_id == second).values(state="canceled")
        )
    )
    (attempt,) = json_of("show", str(second), db=db).data["attempts"]
    assert attempt["state"] == "canceled" and attempt["holds"] == ["GPU-a-0"]
    text = text_of("show", str(second), db=db)
    assert "attempt 1 devices GPU-a-0 (still held: orphan not confirmed gone)" in text


def test_list_shows_where_running_jobs_run(db: Db, placed: dict[str, Any]) -> None:
    first, second, big, plain_job = placed["ids"]
    found = {j["id"]: j for j in json_of("list", db=db).data["jobs"]}
    assert found[first]["devices"] == ["GPU-a-0"] and found[first]["host"] == "a"
    assert found[second]["devices"] == ["GPU-a-0"]
    assert found[big]["devices"] == [] and found[big]["host"] is None
    assert found[plain_job]["devices"] == []
    wide = text_of("list", "--wide", db=db)
    assert "DEVICES" in wide.splitlines()[0]
    assert "DEVICES" not in text_of("list", "--state", "queued", "--wide", db=db)


def test_workers_show_their_inventory_and_who_holds_each_gpu(
    db: Db, placed: dict[str, Any]
) -> None:
    first, second = placed["ids"][:2]
    (worker,) = json_of("workers", db=db).data["workers"]
    inventory = worker["inventory"]
    assert inventory["slots"] == 4 and inventory["memory_bytes"] == 8 * GIB
    assert inventory["host"] == "a"
    gpu0, gpu1 = inventory["devices"]
    assert (gpu0["uuid"], gpu0["index"], gpu0["model"]) == ("GPU-a-0", 0, "Fake A100")
    assert gpu0["memory_bytes"] == 80 * GIB
    assert gpu0["held_share"] == 1.0
    assert [h["job_id"] for h in gpu0["holders"]] == [first, second]
    assert [h["share"] for h in gpu0["holders"]] == [0.5, 0.5]
    assert gpu1["held_share"] == 0.0 and gpu1["holders"] == []
    text = text_of("workers", "--wide", db=db)
    assert (
        f"w-a: memory budget 8G; GPUs: 0 Fake A100 (held 1 by job {first}, {second}),"
        " 1 Fake A100 (free)"
    ) in text


def test_status_counts_held_gpus_and_names_the_unplaceable(db: Db, placed: dict[str, Any]) -> None:
    big = placed["ids"][2]
    data = json_of("status", db=db).data
    assert data["devices"] == {"count": 2, "held": 1.0, "free": 1.0}
    assert data["unplaceable"]["count"] == 1
    (job,) = data["unplaceable"]["jobs"]
    assert (job["job_id"], job["queue"], job["gpus"], job["weight"]) == (big, "default", "16", 1)
    assert job["reason"].endswith("needs 16 GPU(s); the worker has 2")
    assert data["workers"][0]["inventory"]["devices"][0]["held_share"] == 1.0
    text = text_of("status", "--wide", db=db)
    assert "GPUs: 1 of 2 held" in text
    assert (
        f"unplaceable: 1 job (job {big}: no live worker of lane 'default' can hold it:"
        " needs 16 GPU(s); the worker has 2)"
    ) in text


def test_feedback_and_doctor_name_the_unplaceable_job(db: Db, placed: dict[str, Any]) -> None:
    first, _, big, _ = placed["ids"]
    result = json_of("feedback", str(big), db=db)
    assert "needs 16 GPU(s)" in result.data["unplaceable"]
    assert "UNPLACEABLE" in [w["code"] for w in result.envelope["warnings"]]
    assert "unplaceable: no live worker" in text_of("feedback", str(big), db=db)
    assert json_of("feedback", str(first), db=db).data["unplaceable"] is None

    checks = {c["id"]: c for c in json_of("doctor", db=db).data["checks"]}
    check = checks["unplaceable"]
    assert check["status"] == "warn"
    assert f"job {big}: no live worker of lane 'default'" in check["message"]


def test_a_queue_without_devices_or_requests_shows_none_of_it(db: Db) -> None:
    queue = open_write(str(db))
    try:
        job_id = add(queue)
    finally:
        queue.engine.dispose()
    data = json_of("status", db=db).data
    assert data["devices"] == {"count": 0, "held": 0.0, "free": 0.0}
    assert data["unplaceable"] == {"count": 0, "jobs": []}
    text = text_of("status", db=db)
    assert "GPUs:" not in text and "unplaceable" not in text
    assert json_of("show", str(job_id), db=db).data["unplaceable"] is None
    checks = {c["id"]: c for c in json_of("doctor", db=db).data["checks"]}
    assert checks["unplaceable"]["status"] == "pass"
