"""Round trips per job on PostgreSQL, counted on the wire by the relay of
devtools/pgwire.py: how often a worker waits for
the server. A worker with one free slot records a job's end and claims the
next in one wait, the job's last output stored beside them: its pass is the
BEGIN with its settings and the pass's statements together, and the COMMIT."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from devtools.pgwire import Relay, Session
from spoolctl.db import revision
from spoolctl.db.backends import statements
from spoolctl.db.engine import write_tx
from spoolctl.db.prepared import Prepared
from spoolctl.db.queue import open_for_write
from spoolctl.db.tables import lanes
from spoolctl.runner.supervise import SPAWN_RECORD_ALONE_S
from tests.helpers import cli, driver_of

PASS_ROUND_TRIPS = 2
"""The pipeline (BEGIN with the settings and the revision check, then the
output, outcome and claim statements), COMMIT. One by one they were five."""


QUIET = {
    "SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "3600",
    "SPOOLCTL_TEST_REAP_THRESHOLD": "14400",
    "SPOOLCTL_HANG_THRESHOLD": "0",
}
"""No heartbeat, and so no reap scan inside a pass but the first, falls
inside a drain however slow the machine (a pass scans for stale jobs once per
heartbeat interval); with no lease, nothing is fenced for the missing beats."""

QUIET_FLAGS = ("--poll-interval", "3600")
"""A worker checks for due schedules once per poll interval, as it starts
and then on a clock (`ScheduleFiring`): a drain slower than a second (a
loaded machine) would have more checks the longer it ran. With an hour, it
checks once per drain. (The poll interval only paces the look for new
work of a worker that found none; a drain ends at its first such look.)"""

PIPELINE_FLUSH = "H"
"""A Flush message: psycopg sends one only in pipeline mode, to read answers
before the Sync, and only the worker's pass (`Settler.settle_and_claim`)
pipelines. So the sessions that sent one are the held connection the passes
run on (`HeldConnection`); spawn records of their own, heartbeats, output
passes and the drain's end check run on the engine's pool."""


def relayed(url: str, relay: Relay) -> str:
    """url with the relay in place of the server, in the clear (the relay
    reads the protocol)."""
    parsed = make_url(url)
    moved = parsed.set(
        host=relay.host, port=relay.port, query={**parsed.query, "sslmode": "disable"}
    )
    return moved.render_as_string(hide_password=False)


@dataclass(frozen=True)
class Drain:
    """What one drain's worker waited for, on the connection of its passes
    and on its other connections; and the longest any of its jobs ran, from
    its spawn to its end being recorded (the log's `duration_s`)."""

    passes: int
    others: int
    longest_s: float


def drained_round_trips(url: str, relay: Relay, jobs: int, folder: Path) -> Drain:
    """Adds `jobs` jobs directly, then drains them with one relayed worker of
    one slot."""
    folder.mkdir()
    batch = folder / f"jobs-{jobs}.ndjson"
    batch.write_text((json.dumps({"argv": ["true"]}) + "\n") * jobs)
    added = cli("add", "--batch", str(batch), db=url, json=True)
    assert added.exit_code == 0, added.stderr
    opened = len(relay.sessions)
    work = cli(
        "work",
        "--drain",
        "--concurrency",
        "1",
        *QUIET_FLAGS,
        "--log-format",
        "json",
        db=relayed(url, relay),
        json=True,
        env=QUIET,
    )
    assert work.exit_code == 0, work.stderr
    assert work.data["executed"] == jobs
    sessions = relay.sessions[opened:]
    assert sessions and not any(session.opaque for session in sessions)
    passing = [s for s in sessions if s.client_messages[PIPELINE_FLUSH]]
    assert len(passing) == 1, [dict(s.client_messages) for s in sessions]
    others = [s for s in sessions if s not in passing]
    ended = [r["duration_s"] for r in log_records(work.stderr) if r["event"] == "attempt_ended"]
    assert len(ended) == jobs, work.stderr
    return Drain(_trips(passing), _trips(others), max(ended))


def log_records(stderr: str) -> list[dict[str, Any]]:
    """The JSON lines of `work --log-format json` (stderr may hold other lines)."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def _trips(sessions: Iterable[Session]) -> int:
    return sum(session.round_trips for session in sessions)


@pytest.mark.subprocess
def test_a_pass_records_an_end_and_claims_the_next_in_one_wait(pg_url: str, tmp_path: Path) -> None:
    """Two drains, of 10 and 70 jobs: what the 60 more cost is per job, the
    worker's start and end (connections, registration, LISTEN) cancelled out.

    Counted on the connection of the passes, exactly: one pass a job (the
    end of one and the claim of the next; the drain's first claim and its
    last look are its own), however late each end is seen. What a loaded
    machine adds is on the pool's connections, and only this: a job not yet
    seen ended `SPAWN_RECORD_ALONE_S` after its spawn (`true` too, on a
    saturated machine) has its spawn recorded in a transaction of its own
    (`SpawnRecords`). That cannot happen to a job whose end was recorded
    sooner, so where every job's was, the other connections cost the same
    in both drains: nothing but the passes costs a round trip per job."""
    assert cli("migrate", db=pg_url, json=True).exit_code == 0
    parsed = make_url(pg_url)
    assert parsed.host is not None and parsed.port is not None
    with Relay(parsed.host, parsed.port) as relay:
        few = drained_round_trips(pg_url, relay, 10, tmp_path / "few")
        many = drained_round_trips(pg_url, relay, 70, tmp_path / "many")
    assert many.passes - few.passes == PASS_ROUND_TRIPS * 60, (few, many)
    if max(few.longest_s, many.longest_s) < SPAWN_RECORD_ALONE_S:
        assert many.others == few.others, (few, many)


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
