"""Round trips per job on PostgreSQL, counted on the wire by the relay that
bench/pgcount.py reads too (devtools/pgwire.py): how often a worker waits for
the server. A worker with one free slot records a job's end and claims the
next in one wait, the job's last output stored beside them: its pass is the
BEGIN with its settings and the pass's statements together, and the COMMIT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from devtools.pgwire import Relay
from spoolctl.db import revision
from spoolctl.db.backends import statements
from spoolctl.db.engine import write_tx
from spoolctl.db.prepared import Prepared
from spoolctl.db.queue import open_for_write
from spoolctl.db.tables import lanes
from tests.helpers import cli, driver_of

PASS_ROUND_TRIPS = 2
"""The pipeline (BEGIN with the settings and the revision check, then the
output, outcome and claim statements), COMMIT. One by one they were five."""


QUIET = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "30", "SPOOLCTL_TEST_REAP_THRESHOLD": "120"}
"""No heartbeat (and so no reap scan) falls inside a drain: only passes are counted."""


def relayed(url: str, relay: Relay) -> str:
    """url with the relay in place of the server, in the clear (the relay
    reads the protocol)."""
    parsed = make_url(url)
    moved = parsed.set(host=relay.host, port=relay.port,
                       query={**parsed.query, "sslmode": "disable"})  # fmt: skip
    return moved.render_as_string(hide_password=False)


def drained_round_trips(url: str, relay: Relay, jobs: int, folder: Path) -> int:
    """Adds `jobs` jobs directly, then drains them with one relayed worker of
    one slot: the round trips of that worker's connections."""
    folder.mkdir()
    batch = folder / f"jobs-{jobs}.ndjson"
    batch.write_text((json.dumps({"argv": ["true"]}) + "\n") * jobs)
    added = cli("add", "--batch", str(batch), db=url, json=True)
    assert added.exit_code == 0, added.stderr
    opened = len(relay.sessions)
    work = cli("work", "--drain", "--concurrency", "1", db=relayed(url, relay), json=True,
               env=QUIET)  # fmt: skip
    assert work.exit_code == 0, work.stderr
    assert work.data["executed"] == jobs
    sessions = relay.sessions[opened:]
    assert sessions and not any(session.opaque for session in sessions)
    return sum(session.round_trips for session in sessions)


@pytest.mark.subprocess
def test_a_pass_records_an_end_and_claims_the_next_in_one_wait(pg_url: str, tmp_path: Path) -> None:
    """Two drains, of 10 and 70 jobs: what the 60 more cost is per job, the
    worker's start and end (connections, registration, LISTEN) cancelled out."""
    assert cli("migrate", db=pg_url, json=True).exit_code == 0
    parsed = make_url(pg_url)
    assert parsed.host is not None and parsed.port is not None
    measured = []
    with Relay(parsed.host, parsed.port) as relay:
        # A `true` that outlives 0.1 s on a loaded machine has its spawn
        # recorded in a transaction of its own (`SpawnRecords`): round trips
        # that only add. So a second pair of drains is counted where the
        # first came out high, and the lower of the two is judged.
        for pair in range(2):
            few = drained_round_trips(pg_url, relay, 10, tmp_path / f"few{pair}")
            many = drained_round_trips(pg_url, relay, 70, tmp_path / f"many{pair}")
            measured.append((many - few) / 60)
            if measured[-1] <= PASS_ROUND_TRIPS + 0.1:
                break
    per_job = min(measured)
    assert PASS_ROUND_TRIPS - 0.1 <= per_job <= PASS_ROUND_TRIPS + 0.1, measured


def test_in_a_pipeline_only_prepared_statements_wait(pg_url: str) -> None:
    """Inside the driver's pipeline a `Prepared.send` is answered at the next
    read, a statement SQLAlchemy runs at once (with rows, as outside), and an
    error of a sent statement fails the transaction at that read."""
    driver = driver_of(pg_url)
    open_for_write(driver).write(lambda conn: None)  # a queue at head
    engine = driver.engine(write=True, expected_revision=revision.HEAD_REVISION)
    pause = Prepared(
        insert(lanes)
        .values(queue=bindparam("b_queue"), paused_at=1.0, paused_by="t")
        .returning(lanes.c.queue)
    )
    try:
        with write_tx(engine) as conn, statements(conn).pipeline(conn) as gathered:
            assert gathered
            sent = pause.send(conn, {"b_queue": "a"})
            counted = conn.execute(select(func.count()).select_from(lanes)).scalar_one()
            assert counted == 1  # the sent insert was answered first, in order
            assert [row.queue for row in sent.all()] == ["a"]
        with (
            pytest.raises(IntegrityError),
            write_tx(engine) as conn,
            statements(conn).pipeline(conn),
        ):
            pause.send(conn, {"b_queue": "b"})
            pause.send(conn, {"b_queue": "b"})  # the same lane twice
            conn.execute(select(func.count()).select_from(lanes)).scalar_one()
        with write_tx(engine) as conn:
            queues = conn.execute(select(lanes.c.queue)).scalars().all()
        assert queues == ["a"]  # nothing of the failed transaction
    finally:
        engine.dispose()
