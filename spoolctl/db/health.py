"""Readiness probes of the database file and its folder, for `doctor`: each answers one
Check, and a probe that fails reports a failed check, never an exception."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy

from spoolctl.config import busy_timeout_s
from spoolctl.db import revision
from spoolctl.db.engine import peek_uri, read_tx
from spoolctl.errors import NotAQueue, SpoolError

MIN_FREE_BYTES = 1_048_576
"""Below this a worker cannot count on recording an attempt or its output."""


@dataclass
class Check:
    id: str
    status: str  # pass | warn | fail | skip
    message: str
    remediation: str | None = None
    blocked_by: str | None = None


def database_checks(path: Path) -> list[Check]:
    checks = [folder_check(path.parent), space_check(path.parent)]
    if not path.exists():
        checks.append(missing_check(path))
        checks += [Check(n, "skip", "no database yet", blocked_by="database_exists")
                   for n in ("sqlite_open_readwrite", "schema_version", "integrity")]  # fmt: skip
        return checks
    checks.append(Check("database_exists", "pass", str(path)))
    opened = guarded("sqlite_open_readwrite", lambda: opens_read_write(path))
    if opened.status == "fail" and opened.remediation is None:
        opened.remediation = UNOPENABLE_FIX
    checks.append(opened)
    if opened.status == "fail":
        checks += [Check(n, "skip", "cannot open", blocked_by="sqlite_open_readwrite")
                   for n in ("schema_version", "integrity")]  # fmt: skip
    else:
        checks.append(guarded("schema_version", lambda: schema_check(path)))
        checks.append(guarded("integrity", lambda: integrity_check(path)))
    return checks


MIN_POSTGRES_VERSION = 160000
"""PostgreSQL 16: `IS JSON` (tag filters on possibly damaged rows)."""


def postgres_checks(url: str, spool: Path) -> list[Check]:
    """The server answers with a usable version, the schema is current; the
    local spool folder (this machine's output files) is writable with space."""
    checks = [folder_check(spool), space_check(spool)]
    reached = guarded("database_connect", lambda: postgres_connect_check(url))
    checks.append(reached)
    if reached.status == "fail":
        checks.append(Check("schema_version", "skip", "cannot connect",
                            blocked_by="database_connect"))  # fmt: skip
    else:
        checks.append(guarded("schema_version", lambda: schema_check(url)))
    return checks


def postgres_connect_check(url: str) -> Check:
    from spoolctl.db.queue import _postgres_engine

    engine = _postgres_engine(url, write=False, expected=None)
    try:
        with read_tx(engine) as conn:
            number = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            shown = str(conn.exec_driver_sql("SHOW server_version").scalar_one())
    finally:
        engine.dispose()
    if number < MIN_POSTGRES_VERSION:
        return Check("database_connect", "fail", f"PostgreSQL {shown} is older than 16",
                     "use PostgreSQL 16 or newer")  # fmt: skip
    return Check("database_connect", "pass", f"PostgreSQL {shown}")


UNOPENABLE_FIX = (
    "point --db (or SPOOLCTL_DB, config db_path) at the queue; if this file is the queue, "
    "make it readable and writable, or stop its workers and restore it from a backup"
)
"""A file SQLite cannot open (not a database, damaged, unreadable)."""
CREATES_THE_QUEUE = "the first `spoolctl add` or `spoolctl work` creates the queue"
"""What makes a queue where there is none: no other verb creates one, doctor never."""


def missing_check(path: Path) -> Check:
    """No file: the queue does not exist yet, so nothing is ready to use (not
    ready, exit 3, as in 0.4.11); alarming if its WAL is still there."""
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        return Check("database_exists", "fail",
                     f"{path} is missing but its write-ahead log {wal.name} is there: "
                     "the database was deleted or moved underneath",
                     "stop every worker of this queue, then restore the file from a backup "
                     "or move the -wal and -shm files aside")  # fmt: skip
    return Check("database_exists", "fail",
                 f"the queue does not exist yet: there is no database at {path}",
                 f"{CREATES_THE_QUEUE}; or point --db at the queue you meant")  # fmt: skip


def guarded(check_id: str, probe: Callable[[], Check]) -> Check:
    """A probe that fails reports a failed check, never an exception."""
    try:
        return probe()
    except (OSError, sqlite3.Error, sqlalchemy.exc.SQLAlchemyError, SpoolError) as exc:
        shown = (
            f"{exc.code}: {exc.message}"
            if isinstance(exc, SpoolError)
            else f"{type(exc).__name__}: {exc}"
        )
        return Check(check_id, "fail", shown)


def folder_check(folder: Path) -> Check:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_dir() and os.access(probe, os.W_OK | os.X_OK):
        note = "" if probe == folder else f" (will be created under {probe})"
        return Check("spool_directory_writable", "pass", f"{folder} is writable{note}")
    return Check("spool_directory_writable", "fail", f"{probe} is not a writable folder",
                 "choose another --db or fix the folder's permissions")  # fmt: skip


def opens_read_write(path: Path) -> Check:
    """Opens without creating (mode=rw) and reads the schema, taking no lock.

    SQLite quietly opens a file it cannot write read-only, so writability is
    asked of the system too (os.access says no on a read-only mount even to root).
    """
    conn = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=busy_timeout_s())
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    finally:
        conn.close()
    if not os.access(path, os.W_OK):
        return Check("sqlite_open_readwrite", "fail",
                     f"{path} is read-only (its mode, or a read-only file system)",
                     "make it and its folder writable, or remount the disk read-write")  # fmt: skip
    return Check("sqlite_open_readwrite", "pass", "opens read-write")


def space_check(folder: Path) -> Check:
    """Free space where the database and the output are written (the output
    folder may be a mount of its own)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    places = [probe] + [p for p in (folder / "output",) if p.is_dir()]
    free, where = min((shutil.disk_usage(p).free, p) for p in places)
    if free < MIN_FREE_BYTES:
        return Check("disk_space", "fail", f"only {free} bytes free under {where}",
                     "free space on that disk: `spoolctl prune` deletes old output")  # fmt: skip
    return Check("disk_space", "pass", f"{free // 1_048_576} MiB free under {where}")


def integrity_check(path: Path) -> Check:
    """SQLite's quick_check: damaged pages are found before a verb trips on them."""
    conn = sqlite3.connect(peek_uri(path), uri=True, timeout=busy_timeout_s())
    try:
        found = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    finally:
        conn.close()
    if found == ["ok"]:
        return Check("integrity", "pass", "quick_check ok")
    return Check("integrity", "fail", "the file is damaged: " + "; ".join(found)[:500],
                 "stop the workers and restore the queue from a backup")  # fmt: skip


def schema_check(path: Path | str) -> Check:
    from spoolctl.db.queue import schema_status

    found = schema_status(path)
    if found is None:  # an empty file or database: no queue in it yet, as for no file
        return Check("schema_version", "fail",
                     "the queue does not exist yet: the database holds no spoolctl schema",
                     f"{CREATES_THE_QUEUE} (so does `spoolctl migrate`)")  # fmt: skip
    status = found
    if status.is_head:
        return Check("schema_version", "pass", f"at head revision {revision.HEAD_REVISION}")
    try:
        revision.refuse_unless_current(status, path)
    except SpoolError as exc:
        fix = exc.detail.get("command") or (
            "point --db (or SPOOLCTL_DB, config db_path) at a spoolctl queue"
            if isinstance(exc, NotAQueue)
            else "upgrade spoolctl"
        )
        return Check("schema_version", "fail", f"{exc.code}: {exc.message}", str(fix))
    return Check("schema_version", "fail", f"schema is {status.label}")
