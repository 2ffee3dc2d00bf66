"""`doctor`'s checks of an SQLite queue: its folder, its disk, the file, its
schema and its pages. A probe that fails reports a failed check, never an
exception."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from spoolctl.config import busy_timeout_s
from spoolctl.db.backends.base import Check, Driver
from spoolctl.db.backends.sqlite.engine import peek_uri
from spoolctl.db.health import CREATES_THE_QUEUE, folder_check, guarded, schema_check, space_check

UNOPENABLE_FIX = (
    "point --db (or SPOOLCTL_DB, config db_path) at the queue; if this file is the queue, "
    "make it readable and writable, or stop its workers and restore it from a backup"
)
"""A file SQLite cannot open (not a database, damaged, unreadable)."""


def database_checks(path: Path, driver: Driver) -> list[Check]:
    """The checks of the queue file at path (`driver`'s, for the schema's)."""
    checks = [folder_check(path.parent), space_check(path.parent)]
    if not path.exists():
        checks.append(missing_check(path))
        checks += [
            Check(n, "skip", "no database yet", blocked_by="database_exists")
            for n in ("sqlite_open_readwrite", "schema_version", "integrity")
        ]
        return checks
    checks.append(Check("database_exists", "pass", str(path)))
    opened = guarded("sqlite_open_readwrite", lambda: opens_read_write(path))
    if opened.status == "fail" and opened.remediation is None:
        opened.remediation = UNOPENABLE_FIX
    checks.append(opened)
    if opened.status == "fail":
        checks += [
            Check(n, "skip", "cannot open", blocked_by="sqlite_open_readwrite")
            for n in ("schema_version", "integrity")
        ]
    else:
        checks.append(guarded("schema_version", lambda: schema_check(driver)))
        checks.append(guarded("integrity", lambda: integrity_check(path)))
    return checks


def missing_check(path: Path) -> Check:
    """No file: the queue does not exist yet, so nothing is ready to use (not
    ready, exit 3, as in 0.4.11); alarming if its WAL is still there."""
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        return Check(
            "database_exists",
            "fail",
            f"{path} is missing but its write-ahead log {wal.name} is there: "
            "the database was deleted or moved underneath",
            "stop every worker of this queue, then restore the file from a backup "
            "or move the -wal and -shm files aside",
        )
    return Check(
        "database_exists",
        "fail",
        f"the queue does not exist yet: there is no database at {path}",
        f"{CREATES_THE_QUEUE}; or point --db at the queue you meant",
    )


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
        return Check(
            "sqlite_open_readwrite",
            "fail",
            f"{path} is read-only (its mode, or a read-only file system)",
            "make it and its folder writable, or remount the disk read-write",
        )
    return Check("sqlite_open_readwrite", "pass", "opens read-write")


def integrity_check(path: Path) -> Check:
    """SQLite's quick_check: damaged pages are found before a verb trips on them."""
    conn = sqlite3.connect(peek_uri(path), uri=True, timeout=busy_timeout_s())
    try:
        found = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    finally:
        conn.close()
    if found == ["ok"]:
        return Check("integrity", "pass", "quick_check ok")
    return Check(
        "integrity",
        "fail",
        "the file is damaged: " + "; ".join(found)[:500],
        "stop the workers and restore the queue from a backup",
    )
