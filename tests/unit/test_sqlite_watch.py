"""SQLite's change watch (spoolctl/db/backends/sqlite/watch.py): when an idle
worker may sleep on the inotify descriptor of the queue's log, when it keeps
the fast tick instead, and that it still works where inotify cannot be had."""

from __future__ import annotations

import os
import select
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from spoolctl.db.backends.sqlite import watch as sqlite_watch
from spoolctl.db.backends.sqlite.watch import (
    POLL_S,
    QUIET_S,
    RECHECK_S,
    RECHECKS,
    DataVersionWatch,
    WalNotifier,
)
from spoolctl.db.queue import open_for_write
from tests.helpers import driver_of


def readable(fd: int, timeout: float = 0.0) -> bool:
    return select.select([fd], [], [], timeout)[0] == [fd]


@contextmanager
def watching(tmp_path: Path) -> Iterator[tuple[DataVersionWatch, Path]]:
    """A queue at head in tmp_path, and a change watch on it."""
    db = tmp_path / "q.db"
    queue = open_for_write(driver_of(str(db)))
    queue.write(lambda conn: None)
    watch = DataVersionWatch(queue.engine, db)
    try:
        yield watch, db
    finally:
        watch.close()
        queue.dispose()


def commit_elsewhere(db: Path) -> None:
    """A commit of another connection (a table of its own)."""
    other = sqlite3.connect(db)
    try:
        other.execute("CREATE TABLE IF NOT EXISTS scratch (x)")
        other.execute("INSERT INTO scratch VALUES (1)")
        other.commit()
    finally:
        other.close()


def settle(watch: DataVersionWatch) -> None:
    """Look until the queue is quiet (its own set-up writes looked at)."""
    for _ in range(100):
        if not watch.changed() and watch.fileno() is not None:
            return
    raise AssertionError("the watch never armed its descriptor on a quiet queue")


def test_the_notifier_sees_writes_and_follows_a_replaced_file(tmp_path: Path) -> None:
    log = tmp_path / "q.db-wal"
    log.write_bytes(b"")
    notifier = WalNotifier(log)
    try:
        fd = notifier.fd
        assert fd is not None
        assert not notifier.drain() and not readable(fd)
        with log.open("ab") as f:
            f.write(b"frame")
        assert readable(fd, 5) and notifier.drain()
        assert not notifier.drain() and not readable(fd), "one drain reads every event"
        log.unlink()  # removed and made again (no one holds it open): the kernel drops the watch
        log.write_bytes(b"")
        assert readable(fd, 5)
        notifier.drain()  # the drop is read, and the watch is set on the new file
        assert notifier.fd is not None
        with log.open("ab") as f:
            f.write(b"frame")
        assert readable(notifier.fd, 5) and notifier.drain()
    finally:
        notifier.close()
    assert notifier.fd is None


def test_a_quiet_queue_arms_the_descriptor_and_a_busy_one_keeps_the_fast_tick(
    tmp_path: Path,
) -> None:
    with watching(tmp_path) as (watch, db):
        settle(watch)
        fd = watch.fileno()
        assert fd is not None and watch.wait_s() == QUIET_S
        commit_elsewhere(db)
        assert readable(fd, 5)
        assert watch.changed(), "the commit is seen once woken"
        # while others write, looks stay one per POLL_S: no descriptor to wake on each write
        assert watch.fileno() is None and watch.wait_s() == POLL_S
        assert not watch.changed() and watch.fileno() == fd and watch.wait_s() == QUIET_S


def test_a_log_written_before_its_commit_shows_is_looked_at_again_soon(tmp_path: Path) -> None:
    """A worker woken by the log's first write may read the counter before
    the commit is whole (SQLite updates its index after the frames, and
    after their sync): it looks again within RECHECK_S, at most RECHECKS
    times, instead of sleeping on the descriptor until the next write. A
    log that goes on being written with no commit showing (a transaction
    too large for its writer's cache spills pages) keeps the fast tick, not
    a wake-up per write; once the writes stop, the descriptor again."""
    with watching(tmp_path) as (watch, _):
        settle(watch)
        real_drain = watch._notifier.drain
        watch._notifier.drain = lambda: True  # type: ignore[method-assign]
        for _ in range(RECHECKS):
            assert not watch.changed()
            assert watch.fileno() is None and watch.wait_s() == RECHECK_S
        for _ in range(3):
            assert not watch.changed()
            assert watch.fileno() is None and watch.wait_s() == POLL_S
        watch._notifier.drain = real_drain  # type: ignore[method-assign]
        assert not watch.changed()
        assert watch.fileno() is not None and watch.wait_s() == QUIET_S


def test_without_inotify_the_counter_is_read_on_the_fast_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_watch, "IN_MODIFY", 0)  # inotify_add_watch refuses an empty mask
    with watching(tmp_path) as (watch, db):
        assert watch._notifier.fd is None
        while watch.changed():
            pass
        assert watch.fileno() is None and watch.wait_s() == POLL_S
        commit_elsewhere(db)
        assert watch.changed()
    inotify = [n for n in _fds() if os.readlink(f"/proc/self/fd/{n}") == "anon_inode:inotify"]
    assert inotify == [], "a refused watch leaves no descriptor open"


def _fds() -> list[str]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        found.append(name)
    return found
