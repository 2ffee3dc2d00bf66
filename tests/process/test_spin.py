"""A worker whose jobs end at once looks for the next end without sleeping
first (`worker/spin.py`), for a bounded time after each spawn, and one whose
job runs longer does not burn its CPU waiting for it; a write that finds
SQLite's lock busy retries without sleeping only at first."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

import psutil
import pytest

from spoolctl.cli.database import open_write
from spoolctl.config import Timing
from spoolctl.db.lean import begin_immediate
from spoolctl.runner import wakeup
from spoolctl.worker import Worker, WorkerOptions
from spoolctl.worker import loop as worker_loop
from spoolctl.worker import settle as worker_settle
from spoolctl.worker.spin import Spin
from tests.helpers import Db, WriteLock, add_job, job, rows, start_worker, wait_for

pytestmark = pytest.mark.timeout(60)


def test_only_a_worker_whose_last_job_was_short_spins_and_only_after_a_spawn() -> None:
    spin = Spin(0.002)
    assert spin.spin_s_at(100.0) == 0.0  # nothing seen yet
    spin.spawned(100.0)
    assert spin.spin_s_at(100.0) == 0.0  # no job has ended: its length is unknown
    spin.ended(0.0005)
    assert spin.spin_s_at(100.0005) == pytest.approx(0.0015)
    assert spin.spin_s_at(100.003) == 0.0  # the window after the spawn is over
    spin.spawned(200.0)
    assert spin.spin_s_at(200.0) == pytest.approx(0.002)
    spin.ended(0.5)  # a long job: no spinning until a short one ends again
    spin.spawned(300.0)
    assert spin.spin_s_at(300.0) == 0.0
    spin.ended(0.001)
    spin.spawned(400.0)
    assert spin.spin_s_at(400.001) == pytest.approx(0.001)


def test_a_spinning_wait_returns_what_is_ready_and_sleeps_once_the_spin_is_over() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"x")
        assert wakeup.readable([read_fd], 1.0, spin_s=0.5) == [read_fd]
        os.read(read_fd, 1)

        threading.Timer(0.02, os.write, (write_fd, b"y")).start()
        began = time.monotonic()
        assert wakeup.readable([read_fd], 5.0, spin_s=1.0) == [read_fd]
        assert time.monotonic() - began < 1.0  # seen while spinning, not at the timeout
        os.read(read_fd, 1)

        began, cpu = time.monotonic(), time.process_time()
        assert wakeup.readable([read_fd], 0.4, spin_s=0.01) == []
        assert time.monotonic() - began >= 0.39  # the whole timeout, spin included
        assert time.process_time() - cpu < 0.2  # asleep after the spin, not spinning
    finally:
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.subprocess
def test_the_worker_spins_only_after_spawning_following_a_short_job(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = [add_job(db, "true") for _ in range(4)]
    long_id = add_job(db, "sleep", "1")
    after = add_job(db, "true")
    waits: list[tuple[list[int], float]] = []
    real = wakeup.wait_readable

    def noting(fds: list[int], timeout_s: float, drain_fd: int, spin_s: float = 0.0) -> Any:
        running = [r[0] for r in rows(db, "SELECT id FROM jobs WHERE state = 'running'")]
        waits.append((running, spin_s))
        return real(fds, timeout_s, drain_fd, spin_s)

    monkeypatch.setattr(worker_loop, "wait_readable", noting)
    window = 0.5  # so that a loaded machine still runs `true` within it
    monkeypatch.setattr(worker_settle, "Spin", lambda: Spin(window))
    queue = open_write(str(db))
    try:
        Worker(queue, WorkerOptions(mode="drain"), Timing(0.2, 1.0, 600.0)).run()
    finally:
        queue.engine.dispose()

    assert all(job(db, i)["state"] == "done" for i in [*short, long_id, after])
    assert all(0.0 <= s <= window + 1e-6 for _, s in waits)  # the clock is time.time()
    first = [s for running, s in waits if running == [short[0]]]
    assert first and all(s == 0.0 for s in first)  # no job had ended yet
    later = [s for running, s in waits if running in ([short[2]], [short[3]])]
    assert any(s > 0 for s in later)  # after short jobs, it spins
    during_long = [s for running, s in waits if running == [long_id]]
    assert len(during_long) >= 2 and during_long[-1] == 0.0  # the spin after its spawn ended
    during_after = [s for running, s in waits if running == [after]]
    assert all(s == 0.0 for s in during_after)  # the job before it was long


@pytest.mark.subprocess
def test_a_worker_waiting_for_a_long_job_after_short_ones_does_not_spin(db: Db) -> None:
    for _ in range(5):
        add_job(db, "true")
    worker = start_worker(db)
    try:
        wait_for(
            lambda: rows(db, "SELECT count(*) FROM jobs WHERE state = 'done'")[0][0] == 5,
            what="the short jobs done",
        )
        long_id = add_job(db, "sleep", "5")
        wait_for(lambda: job(db, long_id)["state"] == "running", what="the long job running")
        time.sleep(0.2)  # past any spin after its spawn
        process = psutil.Process(worker.pid)
        before = process.cpu_times()
        time.sleep(1.5)
        after = process.cpu_times()
        used = (after.user + after.system) - (before.user + before.system)
        assert used < 0.15, f"the worker used {used:.2f} s of CPU in 1.5 s waiting for a job"
    finally:
        worker.kill()
        worker.communicate()


def _hold_write_lock(db: Db, held: threading.Event, release: threading.Event) -> None:
    lock = WriteLock(db)  # made and released in this thread: sqlite3's rule
    held.set()
    release.wait(10)
    lock.release()


@pytest.mark.parametrize("released_after_s", [None, 0.3])
def test_a_busy_write_lock_is_retried_without_sleeping_only_at_first(
    db: Db, released_after_s: float | None
) -> None:
    add_job(db, "true")  # makes the queue
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db, held, release))
    holder.start()
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("PRAGMA busy_timeout=0")
    try:
        assert held.wait(10)
        if released_after_s is not None:
            threading.Timer(released_after_s, release.set).start()
        began, cpu = time.monotonic(), time.thread_time()
        if released_after_s is None:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                begin_immediate(raw, 0.4)
            assert time.monotonic() - began >= 0.39  # the whole timeout
        else:
            begin_immediate(raw, 5.0)
            assert raw.in_transaction
            assert time.monotonic() - began >= released_after_s - 0.01
        assert time.thread_time() - cpu < 0.15  # asleep after the first BUSY_SPIN_S
    finally:
        release.set()
        holder.join()
        raw.close()
