"""Which attempt's output a verb reads, and which of its files may be read.

A path comes from a database row, so it is treated as untrusted: only a path
whose real location (symlinks resolved) lies inside the spool's output folder
is read at all (a row edited to name another file must not disclose it).
Reading is the queue's output reader's (`Queue.output()`: the files, or the
database's copy on PostgreSQL).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from sqlalchemy import Connection, func, select

from spoolctl.db.backends.base import STREAMS, AttemptOutput
from spoolctl.db.tables import attempts
from spoolctl.errors import NotFound
from spoolctl.services.query import get_job_row

__all__ = ["STREAMS", "AttemptOutput", "confine", "find_attempt", "inside"]


def inside(path: str, output_root: Path) -> bool:
    """Whether path's real location is strictly inside output_root."""
    root = os.path.realpath(output_root)
    real = os.path.realpath(path)
    return real != root and os.path.commonpath([root, real]) == root


def confine(ref: AttemptOutput, output_root: Path) -> AttemptOutput:
    """The same attempt with every path outside output_root blanked: a blank
    path reads as a missing file, and the row's path is kept in `refused`."""
    refused = {n: p for n, p in ref.paths.items() if p and not inside(p, output_root)}
    paths = {n: ("" if n in refused else p) for n, p in ref.paths.items()}
    return dataclasses.replace(ref, paths=paths, refused=refused)


def find_attempt(conn: Connection, job_id: int, attempt_no: int | None) -> AttemptOutput:
    """The given attempt, or the latest; attempt_no None when the job never ran."""
    if get_job_row(conn, job_id) is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    total = int(
        conn.execute(
            select(func.count()).select_from(attempts).where(attempts.c.job_id == job_id)
        ).scalar_one()
    )
    query = select(attempts).where(attempts.c.job_id == job_id)
    if attempt_no is None:
        query = query.order_by(attempts.c.attempt_no.desc()).limit(1)
    else:
        query = query.where(attempts.c.attempt_no == attempt_no)
    row = conn.execute(query).mappings().first()
    if row is None:
        if attempt_no is not None:
            raise NotFound(f"job {job_id} has no attempt {attempt_no}", job_id=job_id)
        return AttemptOutput(job_id, None, None, total, {}, {})
    paths = {"stdout": row["stdout_path"], "stderr": row["stderr_path"]}
    return AttemptOutput(job_id, row["attempt_no"], row["state"], total, paths, dict(row))
