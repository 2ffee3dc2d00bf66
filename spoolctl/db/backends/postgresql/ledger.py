"""PostgreSQL's ledger order: positions given by readers, never waited for by writers.

Event ids come from a sequence, drawn when a row is inserted, and concurrent
transactions commit them in any order: a reader at `id > cursor` could pass
an id whose transaction commits later, and skip its event for good. Instead
of serializing every writer (the ledger lock of revisions up to 0004),
readers number the events: `seq`, the position `events` shows as `id` and
reads by.

Before it reads, a reader numbers, in a short transaction of its own under a
lock only readers take (`READER_LOCK_KEY`), every committed event that has
no position yet, in id order, continuing after the highest position ever
given out (`job_events_seq_seq`, moved on by each numbering). It commits,
then reads `seq > cursor` in a fresh transaction. Why nothing is skipped or
repeated:

- A numbering sees only committed events; one still in flight is numbered
  by a later numbering, after it commits, with a larger position. So a
  position is given once (the row then has one; the unique index says so)
  and every position after a reader's cursor is still ahead of it.
- Numberings take turns on the readers' lock, and PostgreSQL makes a
  transaction visible before it releases its locks: whenever one numbering
  is visible, every earlier one is, so a reader sees the positions given so
  far as a whole, never a later numbering without an earlier one.
- Positions are read only after their numbering committed: a reader whose
  numbering is lost (its connection cut before COMMIT) has shown nothing of
  it, and the sequence, moved on outside the transaction, leaves a gap
  rather than giving a number twice.

A writer never waits for any of this: it inserts its event with seq null and
commits (the numbering's row locks are on rows whose writers have finished).
An event appears to readers when its transaction commits, at most as late as
that transaction lasts, which the server settings of the driver bound
(`idle_in_transaction_session_timeout`, and `transaction_timeout` on
PostgreSQL 17 and later). A role that may only read (or a standby) cannot
number: it reads the positions other readers gave.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from spoolctl.db.engine import READ_ONLY_OPTION

READER_LOCK_KEY = 0x5C0_0EAD
"""pg_advisory_xact_lock key of the readers' numbering; no writer takes it."""
NUMBER_BATCH = 5000
"""Events numbered per transaction (a long backlog takes several)."""
LEDGER_OPTION = "spoolctl_ledger_numbering"
"""Connection execution option: the begin hook opens a read-write
transaction even on a read-only verb's engine (numbering writes seq)."""
NUMBER_SQL = """
WITH due AS (
    SELECT array_agg(id ORDER BY id) AS ids FROM (
        SELECT id FROM job_events WHERE seq IS NULL ORDER BY id LIMIT %(batch)s
    ) AS todo
), head AS (
    SELECT coalesce(pg_sequence_last_value('job_events_seq_seq'), 0) AS given
), numbered AS (
    UPDATE job_events AS e SET seq = head.given + d.n
    FROM head, due, unnest(due.ids) WITH ORDINALITY AS d (id, n)
    WHERE e.id = d.id AND e.seq IS NULL
    RETURNING e.seq
)
SELECT setval('job_events_seq_seq', max(seq)), count(*) FROM numbered HAVING count(*) > 0
"""
"""Number up to `batch` events without a position, in id order, after the
highest position given so far; move the sequence to the last one given.
The events are found through the partial index of unnumbered ones and
updated one primary key lookup each (the ids go through an array, whose
length the planner does not guess from stale statistics): never a scan of
the whole table."""
CANNOT_NUMBER = ("42501", "25006")
"""insufficient_privilege, read_only_sql_transaction: read what others numbered."""
NOT_NOW = "55P03"
"""lock_not_available: a writer holds the ledger's table (or readers' numbering
took longer than the busy timeout). A read-only verb answers while the write
lock is held, as on SQLite: this read shows the positions given so far, and
what it could not number appears, numbered, to a later read."""
MAY_NOT_NUMBER = "spoolctl_may_not_number"
"""Connection.info key (the session's): numbering was refused on it once."""


def number_events(conn: Connection) -> int:
    """Inside the caller's transaction: take the readers' lock, number what is
    due; how many were numbered. The caller commits before reading."""
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": READER_LOCK_KEY})
    row = conn.exec_driver_sql(NUMBER_SQL, {"batch": NUMBER_BATCH}).first()
    return 0 if row is None else int(row[1])


@contextmanager
def ledger_reader(conn: Connection) -> Iterator[Connection]:
    """A connection whose transaction sees every event committed before it
    opened numbered: numberings, each committed, then a fresh read-only
    transaction to read in. On conn itself when it has no transaction open
    (`Queue.read_ledger`); else on a second connection of its engine (the
    caller's snapshot began before the numbering and would not see it)."""
    if not conn.in_transaction():
        with _numbered_then_read(conn) as reader:
            yield reader
        return
    with conn.engine.connect() as own, _numbered_then_read(own) as reader:
        yield reader


@contextmanager
def _numbered_then_read(own: Connection) -> Iterator[Connection]:
    own.execution_options(**{LEDGER_OPTION: True, READ_ONLY_OPTION: False})
    while not own.info.get(MAY_NOT_NUMBER) and _numbered_a_batch(own):
        pass
    own.execution_options(**{LEDGER_OPTION: False, READ_ONLY_OPTION: True})
    with own.begin():
        yield own


def _numbered_a_batch(own: Connection) -> bool:
    """One numbering transaction; True when a full batch was numbered (more may
    wait). A role without the right to number reads what others numbered."""
    try:
        with own.begin():
            return number_events(own) == NUMBER_BATCH
    except DBAPIError as exc:
        state = getattr(exc.orig, "sqlstate", None)
        if state in CANNOT_NUMBER:
            own.info[MAY_NOT_NUMBER] = True  # not again on this session: no error per poll
            return False
        if state == NOT_NOW:
            return False
        raise


def unnumbered(conn: Connection) -> tuple[int, float | None]:
    """Events committed without a position yet, and the oldest one's `at`
    (None when there are none): what the next reader will number."""
    row = conn.exec_driver_sql("SELECT count(*), min(at) FROM job_events WHERE seq IS NULL").one()
    return int(row[0]), None if row[1] is None else float(row[1])


def oldest_writer(conn: Connection) -> tuple[float, str, str] | None:
    """The longest-open transaction that has written something in this
    database (its events appear only when it commits): its age in seconds,
    application name and state; None when there is none."""
    row = conn.exec_driver_sql(
        "SELECT extract(epoch FROM clock_timestamp() - xact_start), application_name, state "
        "FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_xid IS NOT NULL AND pid <> pg_backend_pid() "
        "ORDER BY xact_start LIMIT 1"
    ).first()
    if row is None or row[0] is None:
        return None
    return float(row[0]), str(row[1] or ""), str(row[2] or "")


def ledger_lag(conn: Connection) -> dict[str, Any]:
    """How far the ledger's positions are behind the writers (what `doctor`'s
    ledger_lag check reports, and `metrics` exports): `unnumbered` events
    committed without a position yet, `behind_s` how long the oldest of them
    has waited, `oldest_writer_s` how long the longest-open writing
    transaction has been open (None when there is none)."""
    waiting, oldest_at = unnumbered(conn)
    now = float(conn.exec_driver_sql("SELECT extract(epoch FROM clock_timestamp())").scalar_one())
    writer = oldest_writer(conn)
    return {
        "unnumbered": waiting,
        "behind_s": 0.0 if oldest_at is None else max(0.0, now - oldest_at),
        "oldest_writer_s": None if writer is None else writer[0],
        "oldest_writer_app": None if writer is None else writer[1],
        "oldest_writer_state": None if writer is None else writer[2],
    }
