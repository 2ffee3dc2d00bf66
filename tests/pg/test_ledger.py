"""The event ledger on PostgreSQL: ids come from a sequence, and two
transactions commit them in any order, so a reader at `id > cursor` could
skip an event that commits late. Writers take no ledger lock: readers give
committed events their positions (`seq`, shown as `id`) under a lock only
readers take, and read by position (`backends/postgresql/ledger.py`). These
tests hold real transactions open."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy import event as event_api

from spoolctl.config import busy_timeout_s
from spoolctl.db.backends.postgresql.ledger import READER_LOCK_KEY
from spoolctl.db.backends.postgresql.limits import TRANSACTION_TIMEOUT_SINCE, transaction_limit_ms
from spoolctl.db.engine import read_tx, write_tx
from spoolctl.db.queue import Queue, open_for_write
from spoolctl.errors import SpoolError
from spoolctl.services.events import record_event
from spoolctl.services.ledger import Page, ledger_end, read_events, recent_events
from spoolctl.states import EventKind
from tests.helpers import _pg_connect, cli, cli_json, driver_of, execute, rows

pytestmark = pytest.mark.subprocess


@pytest.fixture
def queue(pg_url: str) -> Iterator[Queue]:
    """A PostgreSQL queue with job 1 in it (the events below name it)."""
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    opened = open_for_write(driver_of(pg_url))
    try:
        yield opened
    finally:
        opened.dispose()


def event(conn: Any, n: int, **detail: Any) -> None:
    record_event(conn, 1, EventKind.PAUSED, time.time(), detail={"n": n, **detail})


def page(engine: Engine, since: int, limit: int = 0) -> Page:
    with read_tx(engine) as conn:
        return read_events(conn, since_id=since, limit=limit)


def numbers(found: Page) -> list[int]:
    return [e["detail"]["n"] for e in found.events if e["event"] == "paused"]


def in_thread(fn: Callable[[], None], within_s: float) -> None:
    """Run fn in a thread and fail unless it ends within the time."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised below, in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(within_s)
    assert not thread.is_alive(), f"it was still waiting after {within_s} s"
    if failed:
        raise failed[0]


def test_an_event_that_commits_late_is_read_after_the_others_never_skipped(
    queue: Queue, pg_url: str
) -> None:
    """A draws its id first and commits last; B commits in between and is read
    first. Read by id, the cursor would pass A's id before A commits (and skip
    it for good): by position, A comes after B, read once."""
    engine = queue.engine
    start = page(engine, 0).cursor
    with write_tx(engine) as a:
        event(a, 1)
        in_thread(lambda: _write(engine, 2), within_s=5)  # no lock: B never waits for A
        first = page(engine, start)
        assert numbers(first) == [2], "only the committed event is read"
        assert numbers(page(engine, first.cursor)) == [], "nothing more until A commits"
    second = page(engine, first.cursor)
    assert numbers(second) == [1], "A's event comes after the cursor, not before it"
    assert numbers(page(engine, second.cursor)) == []
    drawn = "SELECT id, detail::json->>'n' AS n FROM job_events WHERE event = 'paused'"
    ids = {r["n"]: r["id"] for r in rows(pg_url, drawn)}
    assert int(ids["1"]) < int(ids["2"]), "A drew the smaller id: `id > cursor` would skip it"
    assert second.events[0]["id"] > first.events[0]["id"] > start


class Abort(Exception):
    """Raised inside a write transaction to roll it back."""


def _write(engine: Engine, n: int, *, abort: bool = False) -> None:
    try:
        with write_tx(engine) as conn:
            event(conn, n)
            if abort:
                raise Abort
    except Abort:
        pass


def test_an_aborted_transactions_event_is_never_read_and_leaves_no_gap(queue: Queue) -> None:
    engine = queue.engine
    start = page(engine, 0).cursor
    _write(engine, 1)
    _write(engine, 2, abort=True)
    with write_tx(engine) as conn:
        event(conn, 3)
        raise_inside = conn.begin_nested()
        event(conn, 4)
        raise_inside.rollback()
    _write(engine, 5)
    found = page(engine, start)
    assert numbers(found) == [1, 3, 5]
    positions = [e["id"] for e in found.events]
    assert positions == list(range(start + 1, start + 4)), "positions follow one another"


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


class Writers:
    """Six writers of 40 transactions each (a fifth of them rolled back, one to
    three events in each) and one transaction open until `finish`, each on an
    engine of its own; `committed` is every (writer, n) that committed."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.committed: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self.long_open = threading.Event()
        self.stop_long = threading.Event()
        self.threads = [threading.Thread(target=self.writer, args=(w,)) for w in range(1, 7)]
        self.long = threading.Thread(target=self.long_writer)

    def start(self) -> None:
        self.long.start()
        assert self.long_open.wait(10)
        for t in self.threads:
            t.start()

    def writing(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def finish(self) -> None:
        self.stop_long.set()
        for t in [*self.threads, self.long]:
            t.join(30)

    def writer(self, w: int) -> None:
        chance = random.Random(w)
        own = open_for_write(self.queue.driver)  # an engine each: no wait for the pool
        try:
            for i in range(40):
                aborted = chance.random() < 0.2
                written = [(w, w * 1000 + i * 10 + p) for p in range(chance.randint(1, 3))]
                try:
                    with write_tx(own.engine) as conn:
                        for _, n in written:
                            event(conn, n, w=w)
                        if aborted:
                            raise Abort
                except Abort:
                    continue
                with self.lock:
                    self.committed.update(written)
        finally:
            own.dispose()

    def long_writer(self) -> None:
        own = open_for_write(self.queue.driver)
        try:
            with write_tx(own.engine) as conn:
                event(conn, 99_000, w=99)
                self.long_open.set()
                self.stop_long.wait(20)
                event(conn, 99_001, w=99)
        finally:
            own.dispose()
        with self.lock:
            self.committed.update({(99, 99_000), (99, 99_001)})


def test_followers_see_every_committed_event_of_concurrent_writers_once(queue: Queue) -> None:
    """Writers commit, roll back and hold one transaction open through most
    of the run, several events per transaction; two followers page with
    small limits. Each ends with every committed event exactly once, in
    positions that follow one another without a hole."""
    engine = queue.engine
    start = page(engine, 0).cursor
    writers = Writers(queue)
    writers.start()
    seen: list[list[dict[str, Any]]] = [[], []]
    cursors = [start, start]
    try:
        finishing = False
        while True:
            for f in (0, 1):
                found = page(engine, cursors[f], limit=7 + f * 6)
                seen[f] += found.events
                cursors[f] = found.cursor
            if finishing and all(not page(engine, c).events for c in cursors):
                break
            if not writers.writing():
                writers.finish()
                finishing = True
    finally:
        writers.finish()
    for events in seen:
        got = [(e["detail"]["w"], e["detail"]["n"]) for e in events]
        assert len(got) == len(set(got)), "an event was read twice"
        assert set(got) == writers.committed, "an event was skipped (or an aborted one read)"
        positions = [e["id"] for e in events]
        assert positions == list(range(start + 1, start + 1 + len(positions)))
    longs = [e["id"] for e in seen[0] if e["detail"]["w"] == 99]
    assert longs == sorted(longs) and longs[0] > seen[0][0]["id"], "it was read once it committed"


def test_no_writer_waits_for_a_reader_holding_the_readers_lock(pg_url: str) -> None:
    """With the readers' lock held (and a busy timeout of 1 s, so a wait would
    fail the verb): submitting, claiming, running and recording outcomes all
    go ahead at once. A reader that cannot number within its busy timeout
    answers with the positions given so far (none yet: nothing was read
    before), and reads everything, in order and dense, once it can."""
    env = {"SPOOLCTL_BUSY_TIMEOUT": "1"}
    assert cli("add", "--", "true", db=pg_url, env=env).exit_code == 0
    with _pg_connect(pg_url) as holder, holder.transaction():
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (READER_LOCK_KEY,))
        for _ in range(3):
            assert cli("add", "--", "true", db=pg_url, env=env).exit_code == 0
        worked = cli("work", "--drain", "--concurrency", "2", db=pg_url, env=env)
        assert worked.exit_code == 0, worked.stderr
        assert cli("pause", "default", db=pg_url, env=env).exit_code == 0
        meanwhile = cli_json("events", db=pg_url, env=env)
        assert meanwhile.exit_code == 0, meanwhile.stdout
        assert meanwhile.data["events"] == [], "only numbered events are read"
    assert {r["state"] for r in rows(pg_url, "SELECT state FROM jobs")} == {"done"}
    read = cli_json("events", "--limit", "0", db=pg_url)
    assert read.exit_code == 0
    kinds = [e["event"] for e in read.data["events"]]
    assert kinds.count("added") == 4 and kinds[-1] == "paused"
    assert [e["id"] for e in read.data["events"]] == list(range(1, len(kinds) + 1))


def test_ledger_end_and_recent_events_read_positions(queue: Queue) -> None:
    engine = queue.engine
    for n in range(5):
        _write(engine, n)
    with read_tx(engine) as conn:
        end = ledger_end(conn)
        newest = recent_events(conn, limit=3)
        older = recent_events(conn, limit=10, before_id=newest[-1]["id"])
    assert [e["id"] for e in newest] == [end, end - 1, end - 2]
    assert [e["id"] for e in older] == list(range(end - 3, 0, -1))
    assert set(newest[0]) == {"id", "job_id", "at", "event", "worker_id", "detail"}
    with write_tx(engine) as conn:
        event(conn, 9)
        assert page(engine, end).events == [], "an open transaction's event is not read yet"
    assert numbers(page(engine, end)) == [9]


def test_the_upgrade_keeps_every_cursor_and_positions_continue(pg_url: str) -> None:
    """Events written at 0004 keep their ids as positions; the newest was
    deleted (as prune does), and no new position reuses its id."""
    assert cli("migrate", "--to", "0004_output_chunks", db=pg_url).exit_code == 0
    for n in range(3):
        execute(
            pg_url,
            "INSERT INTO jobs (argv, state, next_run_at, created_at) "
            "VALUES ('[\"true\"]', 'queued', 1, 1)",
        )
        execute(
            pg_url, "INSERT INTO job_events (job_id, at, event) VALUES (?, 1, 'added')", (n + 1,)
        )
    top = rows(pg_url, "SELECT max(id) AS m FROM job_events")[0]["m"]
    execute(pg_url, "DELETE FROM job_events WHERE id = ?", (top,))
    execute(pg_url, "DELETE FROM jobs WHERE id = 3")
    before = rows(pg_url, "SELECT id FROM job_events ORDER BY id")
    assert cli("migrate", db=pg_url).exit_code == 0
    after = rows(pg_url, "SELECT id, seq FROM job_events ORDER BY id")
    assert [(r["id"], r["seq"]) for r in after] == [(r["id"], r["id"]) for r in before]
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    read = cli_json("events", "--since-id", str(before[-1]["id"]), db=pg_url)
    assert [e["id"] for e in read.data["events"]] == [top + 1]


def test_doctor_shows_the_ledgers_lag(pg_url: str) -> None:
    for _ in range(2):
        assert cli("add", "--", "true", db=pg_url).exit_code == 0

    def lag() -> dict[str, Any]:
        checks = cli_json("doctor", db=pg_url).data["checks"]
        return next(c for c in checks if c["id"] == "ledger_lag")

    before = lag()
    assert before["status"] == "pass"
    assert before["message"].startswith("2 event(s) committed without a position yet")
    assert cli("events", db=pg_url).exit_code == 0
    assert lag()["message"].startswith("0 event(s) committed without a position yet")
    with _pg_connect(pg_url) as writer, writer.transaction():
        writer.execute("INSERT INTO lanes (queue, paused_at, paused_by) VALUES ('x', 1, 'me')")
        assert "oldest writing transaction open" in lag()["message"]


def test_a_role_that_may_only_read_reads_what_readers_numbered(pg_url: str) -> None:
    for _ in range(2):
        assert cli("add", "--", "true", db=pg_url).exit_code == 0
    assert cli("events", db=pg_url).exit_code == 0  # a reader numbers both
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    name = f"reader_{random.randrange(10**6)}"
    execute(pg_url, f"CREATE ROLE {name} LOGIN PASSWORD 'pw'")
    try:
        execute(pg_url, f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}")
        execute(pg_url, f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO {name}")
        url = _as_role(pg_url, name)
        read = cli_json("events", db=url)
        assert read.exit_code == 0, read.stdout + read.stderr
        assert [e["event"] for e in read.data["events"]] == ["added", "added"]
        assert cli_json("events", db=pg_url).data["count"] == 3
        assert cli_json("events", db=url).data["count"] == 3
    finally:
        execute(pg_url, f"DROP OWNED BY {name}")
        execute(pg_url, f"DROP ROLE {name}")


def _as_role(url: str, role: str) -> str:
    """The URL with another login (password `pw`)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(username=role, password="pw").render_as_string(hide_password=False)


TOTAL = "SELECT setting FROM pg_settings WHERE name = 'transaction_timeout'"
"""PostgreSQL 17+: the session's bound on a transaction's length, in ms."""


def test_the_server_ends_a_transaction_of_ours_left_open_and_its_event_never_shows(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction frozen half-way (its process stopped, its network cut)
    would keep its events from readers for as long as it stays open: the
    driver's session settings make the server end it (here after 1 s: a
    quarter of a 4 s hang threshold). Migrations are not bounded by a total."""
    monkeypatch.setenv("SPOOLCTL_HANG_THRESHOLD", "4")
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    queue = open_for_write(driver_of(pg_url))
    try:
        engine = queue.engine
        start = page(engine, 0).cursor
        with write_tx(engine) as conn:
            shown = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
            version = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            bounded = [TOTAL] if version >= TRANSACTION_TIMEOUT_SINCE else []
            totals = [conn.exec_driver_sql(sql).scalar() for sql in bounded]
        assert shown == "1s"
        assert totals == ([str(transaction_limit_ms(busy_timeout_s()))] if bounded else [])
        with pytest.raises(SpoolError), write_tx(engine) as conn:
            event(conn, 1)
            time.sleep(2.5)
        assert page(engine, start).events == []
        _write(engine, 2)
        assert numbers(page(engine, start)) == [2]
    finally:
        queue.dispose()
    migrating = driver_of(pg_url).migration_engine()
    try:
        with write_tx(migrating) as conn:
            if bounded:
                assert conn.exec_driver_sql(TOTAL).scalar() == "0"
            assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
    finally:
        migrating.dispose()


def test_a_ledger_read_through_the_queue_holds_one_connection(queue: Queue) -> None:
    """`events` and the web read through `Queue.read_ledger`: the numbering and
    the read share one pooled connection, so readers in many threads (the
    web's) cannot all hold one and wait for a second."""
    held, most = [0], [0]

    def checkout(*_: Any) -> None:
        held[0] += 1
        most[0] = max(most[0], held[0])

    def checkin(*_: Any) -> None:
        held[0] -= 1

    _write(queue.engine, 1)
    event_api.listen(queue.engine, "checkout", checkout)
    event_api.listen(queue.engine, "checkin", checkin)
    found = queue.read_ledger(lambda conn: read_events(conn, since_id=0))
    end = queue.read_ledger(ledger_end)
    newest = queue.read_ledger(lambda conn: recent_events(conn, limit=1))
    assert numbers(found) == [1] and end == found.cursor == newest[0]["id"]
    assert most[0] == 1
    with read_tx(queue.engine) as conn:
        assert read_events(conn, since_id=0).cursor == end  # inside a snapshot: a second one
    assert most[0] == 2


def test_readers_numbering_at_once_give_each_position_once(queue: Queue) -> None:
    """Three followers in threads of their own, each on its own engine,
    number and read while the writers write: each sees every committed event
    once, all see the same positions, and no position is given twice."""
    start = page(queue.engine, 0).cursor
    writers = Writers(queue)
    seen: dict[int, list[tuple[int, int, int]]] = {f: [] for f in range(3)}
    done = threading.Event()

    def follow(f: int) -> None:
        own = open_for_write(queue.driver)
        cursor = start
        try:
            while True:
                finished = done.is_set()
                found = own.read_ledger(partial(read_events, since_id=cursor, limit=9))
                seen[f] += [(e["id"], e["detail"]["w"], e["detail"]["n"]) for e in found.events]
                cursor = found.cursor
                if finished and not found.events:
                    return
        finally:
            own.dispose()

    followers = [threading.Thread(target=follow, args=(f,)) for f in range(3)]
    writers.start()
    for t in followers:
        t.start()
    try:
        while writers.writing():
            time.sleep(0.05)
    finally:
        writers.finish()
        done.set()
        for t in followers:
            t.join(60)
    assert seen[0] == seen[1] == seen[2], "every reader sees the same positions"
    assert {(w, n) for _, w, n in seen[0]} == writers.committed
    positions = [p for p, _, _ in seen[0]]
    assert positions == list(range(start + 1, start + 1 + len(positions)))
    assert len(positions) == len(writers.committed)
