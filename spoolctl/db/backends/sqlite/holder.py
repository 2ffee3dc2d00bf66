"""Who holds an SQLite queue's write lock, found without taking it, and
fencing that holder when it is a stopped worker.

A worker frozen inside a write transaction (`kill -STOP`; a Ctrl-Z waits for
the transaction's end, `worker/suspend.py`) keeps the write lock, and every
writer waits behind it, reapers included: a reap pass, which fences hung
workers, needs the lock itself. So a writer that has waited a while
(`engine.LockWait`) looks here for the holder:

- SQLite's locks are POSIX locks, which /proc/locks lists with the pid of
  their holder as this process sees it (0, or absent, where it cannot): in
  WAL mode the write lock is byte 120 of the `-shm` file (the bytes up to
  128 lock its checkpoint, recovery, read marks and opening); in
  rollback-journal mode (a file not yet switched to WAL) it is the database
  file's reserved, pending or exclusive lock. A write lock (WRITE) on one of
  those bytes names the process in the way.
- It is fenced (SIGKILLed, only while its pid and start time still name it,
  then confirmed gone) only when all of these hold, which make it what a
  reap pass calls hung (`runner/liveness.py`): it is not this process; its command
  line carries spoolctl's marker; its pid and start time match a row of
  this queue's `workers` table for this machine (read without the lock: in
  WAL mode readers are not blocked); it is stopped (state T); and that row's
  heartbeat is older than the hang threshold (`SPOOLCTL_HANG_THRESHOLD`; 0
  fences nothing). Its lock goes with it, its transaction was never
  committed, and the jobs it had claimed are reaped the usual way.
- Anything else (an `sqlite3` shell in a transaction, a worker that runs, a
  process this user cannot look at) is never touched: the writer waits out
  its busy timeout and fails LOCKED, its error naming the holder's pid and
  why it was left alone (`detail.lock_holder`).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from spoolctl.config import Timing, local_clock
from spoolctl.errors import InvalidInput
from spoolctl.runner import procs

PROC_LOCKS = Path("/proc/locks")
WAL_LOCK_BYTES = (120, 128)
"""The `-shm` file's lock bytes: WAL_WRITE_LOCK (120) to the DMS lock (128)."""
PENDING_BYTE = 0x40000000
DB_LOCK_BYTES = (PENDING_BYTE, PENDING_BYTE + 2 + 510 - 1)
"""The database file's pending, reserved and shared bytes."""
FENCE_WAIT_S = 5.0
"""How long a SIGKILLed holder may take to be gone."""


@dataclass(frozen=True)
class Holder:
    """The process holding the write lock, and what was done about it."""

    pid: int
    why: str
    """Why it was left alone (empty once fenced)."""
    fenced: bool = False
    fenceable_in_s: float | None = None
    """A stopped worker whose heartbeat is younger than the hang threshold:
    fenceable once this much more time has passed, if it stays so."""

    def as_detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {"pid": self.pid, "fenced": self.fenced, "why": self.why}
        if self.fenceable_in_s is not None:
            detail["fenceable_in_s"] = round(self.fenceable_in_s, 1)
        return detail


def look(raw: sqlite3.Connection, db_path: Path) -> Holder | None:
    """Find the write lock's holder and fence it if it is a stopped worker
    of this queue silent beyond the hang threshold; None when no other
    process visible from here holds it. raw: a connection to the queue with
    no transaction open (it reads the workers table)."""
    me = os.getpid()
    pids = [pid for pid in write_lock_holders(db_path) if pid != me]
    judged = [_judge(raw, pid) for pid in pids]
    for holder in judged:
        if holder.fenced:
            return holder
    pending = [h for h in judged if h.fenceable_in_s is not None]
    found = pending or judged
    return found[0] if found else None


def write_lock_holders(db_path: Path, listing: str | None = None) -> list[int]:
    """The pids (as this process sees them) holding a write lock on the lock
    bytes of the queue's `-shm` file or of the file itself; listing: the
    text of /proc/locks (read when None). Empty where there is no such list."""
    ranges: dict[tuple[int, int, int], tuple[int, int]] = {}
    for suffix, span in (("-shm", WAL_LOCK_BYTES), ("", DB_LOCK_BYTES)):
        try:
            info = os.stat(f"{db_path}{suffix}")
        except OSError:
            continue
        ranges[(os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)] = span
    if not ranges:
        return []
    if listing is None:
        try:
            listing = PROC_LOCKS.read_text()
        except OSError:
            return []
    found: list[int] = []
    for line in listing.splitlines():
        lock = _parse(line)
        if lock is None or lock[0] <= 0 or lock[0] in found:
            continue
        pid, file, start, end = lock
        first_last = ranges.get(file)
        if first_last is not None and start <= first_last[1] and end >= first_last[0]:
            found.append(pid)
    return found


def _parse(line: str) -> tuple[int, tuple[int, int, int], int, float] | None:
    """(pid, (major, minor, inode), first byte, last byte) of a held POSIX
    or open-file-description WRITE lock in one line of /proc/locks, e.g.
    `1: POSIX  ADVISORY  WRITE 4242 fe:00:2147843 120 120`; None for
    anything else (a waiter's `->` line, a read lock, flock, a lease)."""
    fields = line.split()
    if len(fields) < 8 or fields[1] not in ("POSIX", "OFDLCK") or fields[3] != "WRITE":
        return None
    try:
        major, minor, inode = fields[5].split(":")
        file = (int(major, 16), int(minor, 16), int(inode))
        end = float("inf") if fields[7] == "EOF" else int(fields[7])
        return int(fields[4]), file, int(fields[6]), end
    except ValueError:
        return None


def _judge(raw: sqlite3.Connection, pid: int) -> Holder:
    hang_s = _hang_threshold_s()
    if hang_s <= 0:
        return Holder(pid, "fencing is off (SPOOLCTL_HANG_THRESHOLD is 0)")
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            started, status = proc.create_time(), proc.status()
            command = " ".join(proc.cmdline())
    except psutil.Error:
        return Holder(pid, "this process cannot look at it")
    if procs.WORKER_MARKER not in command:
        return Holder(pid, "not a spoolctl worker")
    beat_at = _heartbeat_of(raw, pid, started)
    if beat_at is None:
        return Holder(pid, "not a worker of this queue on this machine")
    if status != psutil.STATUS_STOPPED:
        return Holder(pid, f"a worker of this queue that is not stopped ({status})")
    silent_s = local_clock()() - beat_at
    if silent_s <= hang_s:
        silent = f"{max(silent_s, 0.0):.1f}s"
        why = f"a stopped worker, silent {silent}, not yet the hang threshold's {hang_s:g}s"
        return Holder(pid, why, fenceable_in_s=min(hang_s - silent_s, hang_s))
    identity = procs.ProcessIdentity(pid, started)
    if _stopped(pid) and procs.kill_process_if_same(identity, procs.WORKER_MARKER, FENCE_WAIT_S):
        return Holder(pid, "", fenced=True)
    return Holder(pid, "a stopped worker that could not be fenced")


def _hang_threshold_s() -> float:
    try:
        return Timing.from_env().hang_threshold_s
    except InvalidInput:
        return 0.0  # the worker refuses to start with it; fence nothing


def _heartbeat_of(raw: sqlite3.Connection, pid: int, started: float) -> float | None:
    """The newest heartbeat of the queue's worker rows that name this very
    process (pid and start time) where its pid means it: this machine, and
    from revision 0008 on this pid space (`procs.pid_space`, as a reap pass
    judges, `liveness.probeable`). None when no row does or the table
    cannot be read."""
    try:
        cursor = raw.execute("SELECT * FROM workers WHERE pid = ?", (pid,))
        names = [column[0] for column in cursor.description]
        found = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
    except sqlite3.Error:
        return None
    beats = [
        float(row["heartbeat_at"])
        for row in found
        if _here(row)
        and row["process_started_at"] is not None
        and abs(float(row["process_started_at"]) - started) <= procs.START_TIME_TOLERANCE_S
        and row["heartbeat_at"] is not None
    ]
    return max(beats) if beats else None


def _here(row: dict[str, Any]) -> bool:
    """The row's worker ran where this process's pids mean what they meant to it."""
    if row["hostname"] != procs.hostname() or row["boot_id"] not in (None, procs.boot_id()):
        return False
    if "pid_space" not in row:
        return True  # a schema before revision 0008: host name and boot tell it
    space = procs.pid_space()
    return space is not None and row["pid_space"] == space


def _stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False
