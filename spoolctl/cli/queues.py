"""Opening the queue a verb names (--db, SPOOLCTL_DB, config file, default)."""

from __future__ import annotations

from spoolctl.config import resolve_db
from spoolctl.db.engine import Synchronous
from spoolctl.db.queue import QueueFile, open_for_read, open_for_write


def open_write(db_flag: str | None, *, synchronous: Synchronous = "NORMAL") -> QueueFile:
    return open_for_write(resolve_db(db_flag).path, synchronous=synchronous)


def open_read(db_flag: str | None) -> QueueFile | None:
    """None when no queue exists there yet: read-only verbs never create one."""
    return open_for_read(resolve_db(db_flag).path)
