"""What a PostgreSQL worker keeps an ear and an eye on: the server's clock
(liveness times are the server's, not this machine's) and LISTEN/NOTIFY (an
idle worker wakes the moment a job becomes queued)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from spoolctl.db.backends.postgresql.limits import network_bounds
from spoolctl.db.backends.postgresql.url import connect_kwargs
from spoolctl.runner.wakeup import readable

NOTIFY_CHANNEL = "spoolctl_work"
CLOCK_RESAMPLE_S = 5.0
CLOCK_ONLY_OPTION = "spoolctl_clock_only"
POLL_S = 0.5
"""Without notifications an idle worker looks for work this often."""
RELISTEN_S = 5.0
"""A lost LISTEN connection is opened again this often (polling meanwhile)."""


def transaction_pooling() -> bool:
    """SPOOLCTL_PG_TRANSACTION_POOLING=1: the URL is a pooler that hands each
    transaction any server connection (PgBouncer's transaction mode). Then no
    statement is prepared (a prepared statement lives in one server session)
    and nothing LISTENs (a notification reaches whichever client holds that
    session next): workers poll."""
    return os.environ.get("SPOOLCTL_PG_TRANSACTION_POOLING", "0") == "1"


def notifications_enabled() -> bool:
    return os.environ.get("SPOOLCTL_PG_NOTIFY", "1") != "0" and not transaction_pooling()


def server_now(conn: Connection) -> float:
    found: Any = conn.exec_driver_sql("SELECT extract(epoch FROM clock_timestamp())").scalar_one()
    return float(found)


class ServerClock:
    """time.time() corrected to the database server's clock.

    The offset is measured at creation and again every CLOCK_RESAMPLE_S (a
    round trip of its own, timed: the midpoint is taken), so a worker whose
    own clock is minutes off still writes and judges times on the server's
    scale. If the server cannot be reached the last offset is kept."""

    def __init__(self, engine: Engine, local: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._local = local
        self._offset = 0.0
        self._sampled_at = -1e18
        self._lock = threading.Lock()
        self._sample()

    def _sample(self) -> None:
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**{CLOCK_ONLY_OPTION: True})
                before = self._local()
                server = server_now(conn)
                after = self._local()
                conn.rollback()
        except DBAPIError:
            return
        self._offset = server - (before + after) / 2
        self._sampled_at = after

    def __call__(self) -> float:
        now = self._local()
        if now - self._sampled_at > CLOCK_RESAMPLE_S or now < self._sampled_at:
            with self._lock:
                self._sample()
            now = self._local()
        return now + self._offset


class NotifyWatch:
    """An idle worker's ear: LISTEN on a dedicated connection (never pooled,
    never inside a transaction). `changed()` is True when a notification came
    since the last look, or, as a fallback, every POLL_S; `fileno()` lets the
    worker's select() wake the moment one arrives."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Any = None
        self._last_poll = 0.0
        self._last_connect = 0.0
        if notifications_enabled():
            self._listen()

    def _listen(self) -> None:
        """(Re)connect and LISTEN; on failure, poll until the next try."""
        self._last_connect = time.monotonic()
        try:
            import psycopg

            self._conn = psycopg.connect(
                **connect_kwargs(self._url),
                autocommit=True,
                application_name="spoolctl-listen",
                **network_bounds(),
            )
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except Exception:
            self.close()

    def fileno(self) -> int | None:
        return None if self._conn is None else int(self._conn.pgconn.socket)

    def wait_s(self) -> float:
        """Listening: the fallback look (POLL_S; `changed` says "look" every
        4 × POLL_S). Polling: until the next poll is due."""
        if self._conn is not None:
            return POLL_S
        return max(0.0, self._last_poll + POLL_S - time.monotonic())

    def changed(self) -> bool:
        now = time.monotonic()
        if self._conn is not None:
            try:
                ready = readable([self._conn.pgconn.socket], 0)
                got = False
                if ready:
                    self._conn.pgconn.consume_input()
                    while self._conn.pgconn.notifies() is not None:
                        got = True
                if got:
                    self._last_poll = now
                    return True
            except Exception:
                self.close()
                return True
            if now - self._last_poll >= POLL_S * 4:
                self._last_poll = now
                return True
            return False
        if notifications_enabled() and now - self._last_connect >= RELISTEN_S:
            self._listen()  # the connection was lost: listen again, and look now
            return True
        if now - self._last_poll >= POLL_S:
            self._last_poll = now
            return True
        return False

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
