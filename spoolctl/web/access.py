"""The queue a dashboard shows: opened once and kept, so that every request
shares one engine and its pool. How to open it is handed in by the CLI verb
(`--db`, SPOOLCTL_DB, the config file), which owns that resolution."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from spoolctl.db.queue import Queue

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from spoolctl.db.backends.base import OutputReader

T = TypeVar("T")


class QueueAccess:
    """Reads through a read-only opening (none until the queue exists: a
    dashboard never creates one by looking), writes through a write opening
    made on the first action."""

    def __init__(
        self,
        open_read: Callable[[], Queue | None],
        open_write: Callable[[], Queue],
        display: str,
    ) -> None:
        self._open_read = open_read
        self._open_write = open_write
        self.display = display
        """How pages name the queue (a URL's password masked)."""
        self._reader: Queue | None = None
        self._writer: Queue | None = None
        self._lock = threading.Lock()

    def reader(self) -> Queue | None:
        with self._lock:
            if self._reader is None:
                self._reader = self._open_read()
            return self._reader

    def writer(self) -> Queue:
        with self._lock:
            if self._writer is None:
                self._writer = self._open_write()
            return self._writer

    def read(self, fn: Callable[[Connection], T], empty: T) -> T:
        """fn in one read snapshot; `empty` while there is no queue yet."""
        queue = self.reader()
        return empty if queue is None else queue.read(fn)

    def read_ledger(self, fn: Callable[[Connection], T], empty: T) -> T:
        """fn, which reads the event ledger, as `Queue.read_ledger` runs it
        (one connection, each read in its own transaction); `empty` while
        there is no queue yet."""
        queue = self.reader()
        return empty if queue is None else queue.read_ledger(fn)

    def write(self, fn: Callable[[Connection, float], T]) -> T:
        """fn(conn, now) in one write transaction, `now` read from the clock
        the queue judges times by (the server's on PostgreSQL), as the verbs do."""
        queue = self.writer()
        now = queue.now()
        return queue.write(lambda conn: fn(conn, now))

    def now(self) -> float:
        queue = self.reader()
        return time.time() if queue is None else queue.now()

    def output(self) -> OutputReader | None:
        """Where attempts' output is read from; None while there is no queue."""
        queue = self.reader()
        return None if queue is None else queue.output()

    @property
    def output_root(self) -> Path | None:
        queue = self.reader()
        return None if queue is None else queue.output_root

    def close(self) -> None:
        with self._lock:
            for queue in (self._reader, self._writer):
                if queue is not None:
                    queue.dispose()
            self._reader = self._writer = None
