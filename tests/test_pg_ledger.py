"""The event ledger on PostgreSQL: ids come from a sequence, and two
transactions could commit them out of order, so a reader at `id > cursor`
could skip an event that commits late. Inserting an event takes a
transaction-level lock first: the later transaction waits, so ids commit in
the order they are drawn. These tests hold real transactions open."""

from __future__ import annotations

import threading
import time

import pytest

from spoolctl.db.engine import read_tx, write_tx
from spoolctl.db.queue import open_for_write
from spoolctl.services.events import record_event
from spoolctl.services.ledger import read_events
from spoolctl.states import EventKind
from tests.helpers import cli, driver_of

pytestmark = pytest.mark.subprocess


def test_an_event_drawn_later_cannot_commit_before_an_earlier_one(pg_url: str) -> None:
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    queue = open_for_write(driver_of(pg_url))
    engine = queue.engine
    second_done = threading.Event()
    ids: dict[str, int] = {}

    def second() -> None:
        with write_tx(engine) as conn:
            record_event(conn, 1, EventKind.PAUSED, time.time(), detail={"n": 2})
        second_done.set()

    try:
        with write_tx(engine) as first:
            record_event(first, 1, EventKind.PAUSED, time.time(), detail={"n": 1})
            with read_tx(engine) as peek:
                before = read_events(peek, since_id=0).cursor
            thread = threading.Thread(target=second)
            thread.start()
            assert not second_done.wait(1.0), "a second event committed while the first was open"
        thread.join(10)
        assert second_done.is_set()
        with read_tx(engine) as conn:
            page = read_events(conn, since_id=before)
        ids = {e["detail"]["n"]: e["id"] for e in page.events if e["event"] == "paused"}
    finally:
        queue.dispose()
    assert ids[1] < ids[2], "ids commit in the order they were drawn"


def test_a_follower_sees_every_event_of_concurrent_writers(pg_url: str) -> None:
    """Four writers, 50 events each, while a reader pages with `id > cursor`:
    the reader ends with every event, each exactly once."""
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    queue = open_for_write(driver_of(pg_url))
    engine = queue.engine
    writers_done = threading.Event()

    def write(n: int) -> None:
        for i in range(50):
            with write_tx(engine) as conn:
                record_event(conn, 1, EventKind.PAUSED, time.time(), detail={"w": n, "i": i})

    try:
        with read_tx(engine) as conn:
            cursor = read_events(conn, since_id=0).cursor
        threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        seen: list[tuple[int, int]] = []
        while True:
            finished = writers_done.is_set()
            with read_tx(engine) as conn:
                page = read_events(conn, since_id=cursor)
            seen += [(e["detail"]["w"], e["detail"]["i"]) for e in page.events]
            cursor = page.cursor
            if finished:
                break
            if not any(t.is_alive() for t in threads):
                writers_done.set()  # one more page after the last commit
    finally:
        for t in threads:
            t.join(30)
        queue.dispose()
    assert sorted(seen) == sorted((w, i) for w in range(4) for i in range(50))
    assert len(seen) == len(set(seen)) == 200
