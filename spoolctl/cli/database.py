"""Opening the queue's database a verb names (--db, SPOOLCTL_DB, config file,
default): the `Queue` of `db/queue.py`, for reading or writing, and the
answers a verb gives where no database exists there yet."""

from __future__ import annotations

from spoolctl.cli.reply import Reply
from spoolctl.db.backends.base import Driver, Synchronous
from spoolctl.db.location import resolve_db
from spoolctl.db.queue import Queue, open_for_read, open_for_write
from spoolctl.errors import NotFound

NO_QUEUE = "NO_QUEUE"


def driver_of(db_flag: str | None) -> Driver:
    """The driver of the queue the verb's --db resolves to."""
    return resolve_db(db_flag).driver


def open_write(db_flag: str | None, *, synchronous: Synchronous = "NORMAL") -> Queue:
    return open_for_write(driver_of(db_flag), synchronous=synchronous)


def open_read(db_flag: str | None) -> Queue | None:
    """None when no queue exists there yet: read-only verbs never create one."""
    return open_for_read(driver_of(db_flag))


def open_existing_write(db_flag: str | None) -> Queue | None:
    """The queue for a change to something in it (a job, a schedule), opened
    for writing; None where no queue exists: none is created for it."""
    found = open_read(db_flag)
    if found is None:
        return None
    found.dispose()
    return open_write(db_flag)


def nowhere(db_flag: str | None) -> str:
    """Where the verb looked and found no queue, in words that fit a message."""
    return f"no queue exists at {resolve_db(db_flag).display} yet"


def warn_no_queue(reply: Reply, db_flag: str | None) -> Reply:
    """An empty answer from a queue that does not exist says so (a mistyped
    --db would otherwise look like an empty queue)."""
    reply.warn(
        NO_QUEUE,
        f"{nowhere(db_flag)}: the answer is empty; the first `spoolctl add` or "
        "`spoolctl work` creates it (check --db, SPOOLCTL_DB or config db_path)",
    )
    return reply


def no_job(job_id: int, db_flag: str | None) -> NotFound:
    """NOT_FOUND for a job asked of a queue that does not exist."""
    return NotFound(f"no job {job_id}: {nowhere(db_flag)}", job_id=job_id)


def no_schedule(name: str, db_flag: str | None) -> NotFound:
    """NOT_FOUND for a schedule asked of a queue that does not exist."""
    return NotFound(f"no schedule named {name!r}: {nowhere(db_flag)}", name=name)
