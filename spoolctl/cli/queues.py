"""Opening the queue a verb names (--db, SPOOLCTL_DB, config file, default)."""

from __future__ import annotations

from spoolctl.config import resolve_db
from spoolctl.db.engine import Synchronous
from spoolctl.db.queue import QueueFile, Target, open_for_read, open_for_write


def target_of(db_flag: str | None) -> Target:
    """The SQLite file, or the PostgreSQL URL, the verb's --db resolves to."""
    location = resolve_db(db_flag)
    if location.url is not None:
        return location.url
    assert location.path is not None
    return location.path


def open_write(db_flag: str | None, *, synchronous: Synchronous = "NORMAL") -> QueueFile:
    return open_for_write(target_of(db_flag), synchronous=synchronous)


def open_read(db_flag: str | None) -> QueueFile | None:
    """None when no queue exists there yet: read-only verbs never create one."""
    return open_for_read(target_of(db_flag))
