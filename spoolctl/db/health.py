"""Readiness probes for `doctor` that every backend shares (a folder, free
space, the schema); each backend's own are in its driver (`health_checks`).
Each answers one Check, and a probe that fails reports a failed check, never
an exception."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import sqlalchemy

from spoolctl.db import revision
from spoolctl.db.backends.base import Check, Driver
from spoolctl.errors import NotAQueue, SpoolError

MIN_FREE_BYTES = 1_048_576
"""Below this a worker cannot count on recording an attempt or its output."""


CREATES_THE_QUEUE = "the first `spoolctl add` or `spoolctl work` creates the queue"
"""What makes a queue where there is none: no other verb creates one, doctor never."""


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
    return Check(
        "spool_directory_writable",
        "fail",
        f"{probe} is not a writable folder",
        "choose another --db or fix the folder's permissions",
    )


def space_check(folder: Path) -> Check:
    """Free space where the database and the output are written (the output
    folder may be a mount of its own)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    places = [probe] + [p for p in (folder / "output",) if p.is_dir()]
    free, where = min((shutil.disk_usage(p).free, p) for p in places)
    if free < MIN_FREE_BYTES:
        return Check(
            "disk_space",
            "fail",
            f"only {free} bytes free under {where}",
            "free space on that disk: `spoolctl prune` deletes old output",
        )
    return Check("disk_space", "pass", f"{free // 1_048_576} MiB free under {where}")


def schema_check(driver: Driver) -> Check:
    found = revision.schema_status(driver)
    if found is None:  # an empty file or database: no queue in it yet, as for no file
        return Check(
            "schema_version",
            "fail",
            "the queue does not exist yet: the database holds no spoolctl schema",
            f"{CREATES_THE_QUEUE} (so does `spoolctl migrate`)",
        )
    status = found
    if status.is_head:
        return Check("schema_version", "pass", f"at head revision {revision.HEAD_REVISION}")
    try:
        revision.refuse_unless_current(status, driver)
    except SpoolError as exc:
        fix = exc.detail.get("command") or (
            "point --db (or SPOOLCTL_DB, config db_path) at a spoolctl queue"
            if isinstance(exc, NotAQueue)
            else "upgrade spoolctl"
        )
        return Check("schema_version", "fail", f"{exc.code}: {exc.message}", str(fix))
    return Check("schema_version", "fail", f"schema is {status.label}")
