"""Captured output of attempts: which files, and reading them safely.

A path comes from a database row, so it is treated as untrusted: only a path
whose real location (symlinks resolved) lies inside the spool's output folder
is read at all (a row edited to name another file must not disclose it), only
regular files are read (a FIFO or device named by a row would block or worse),
opened non-blocking, and never more than the caller's byte budget at once.

On a PostgreSQL queue the database holds each attempt's output (see
`output_store`), so it can be read from any machine: the `stored_*` functions
read it there. This machine's file of the stream is read instead only when
the stored copy was cut at the cap and the file, inside this machine's spool,
is longer and holds the same bytes where the stored copy ends. A stream of
an ended attempt with nothing stored is `missing`, as a missing file is on
SQLite (never read from this machine's file instead: nothing stored is left to
tell that file is the attempt's own).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, func, select

from spoolctl.db.tables import attempts
from spoolctl.errors import NotFound
from spoolctl.services import output_store
from spoolctl.services.output_store import StoredSpan
from spoolctl.services.query import get_job_row
from spoolctl.states import AttemptState

STREAMS = ("stdout", "stderr")
PREVIEW_BYTES = 65_536
MATCH_PROBE_BYTES = 4096
"""Bytes compared where the stored copy ends before a local file is read instead."""


@dataclass(frozen=True)
class AttemptOutput:
    """One attempt's row as far as its output is concerned."""

    job_id: int
    attempt_no: int | None
    state: str | None
    attempts_total: int
    paths: dict[str, str]
    row: dict[str, Any]
    refused: dict[str, str] = field(default_factory=dict)
    """Streams whose row path lies outside the output folder: never read."""

    @property
    def attempt_id(self) -> int:
        return int(self.row["id"])

    def recorded_path(self, name: str) -> str:
        """The stream's path as its row records it (the worker's machine's)."""
        return self.refused.get(name) or self.paths[name]


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


def open_regular(path: str) -> int | None:
    """A read-only descriptor on a regular file, or None (missing or not a file)."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_span(path: str, offset: int, budget: int) -> tuple[bytes, int] | None:
    """Up to `budget` bytes from `offset` (negative: from the end), and the size."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        os.lseek(fd, start, os.SEEK_SET)
        chunks = []
        remaining = budget
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def preview(path: str, budget: int = PREVIEW_BYTES) -> dict[str, Any]:
    """The head of a stream for the `output` envelope."""
    span = read_span(path, 0, budget)
    if span is None:
        return {"path": path, "size_bytes": 0, "preview": "", "preview_truncated": False,
                "missing": True}  # fmt: skip
    data, size = span
    return {
        "path": path,
        "size_bytes": size,
        "preview": data.decode("utf-8", errors="replace"),
        "preview_truncated": size > len(data),
        "missing": False,
    }


def tail(path: str, budget: int) -> dict[str, Any]:
    """The last `budget` bytes of a stream for `feedback`."""
    span = read_span(path, -budget, budget)
    if span is None:
        return {"path": path, "size_bytes": 0, "tail": "", "truncated": False, "missing": True}
    data, size = span
    return {
        "path": path,
        "size_bytes": size,
        "tail": data.decode("utf-8", errors="replace"),
        "truncated": size > len(data),
        "missing": False,
    }


def copy_all(path: str, sink: Any, chunk: int = PREVIEW_BYTES) -> int:
    """Write a whole stream's bytes to a binary sink; returns bytes written."""
    offset = 0
    while True:
        span = read_span(path, offset, chunk)
        if span is None or not span[0]:
            return offset
        sink.write(span[0])
        offset += len(span[0])


# -- PostgreSQL: the copy stored in the database -------------------------------


def stored_missing(ref: AttemptOutput, span: StoredSpan) -> bool:
    """Whether the stored copy of a stream is gone: every stream of an ended
    attempt keeps at least one chunk (see `output_store`), while a running
    attempt's stream with none has printed nothing yet."""
    return not span.present and ref.state != AttemptState.RUNNING


def stored_facts(span: StoredSpan, from_file: bool) -> dict[str, Any]:
    """Keys a stream gets on a PostgreSQL queue, besides the usual ones."""
    return {
        "source": "file" if from_file else "database",
        "stored_bytes": span.stored,
        "stored_truncated": span.truncated,
    }


def fuller_local_copy(conn: Connection, ref: AttemptOutput, name: str, span: StoredSpan) -> bool:
    """Whether this machine's file of a stream whose stored copy was cut at
    the cap holds more, and the same bytes where the stored copy ends (so a
    stale file of another queue is never shown)."""
    path = ref.paths[name]  # blank when outside this machine's spool
    if not (span.truncated and path):
        return False
    probe = output_store.read_stored(
        conn, ref.attempt_id, name, -MATCH_PROBE_BYTES, MATCH_PROBE_BYTES
    )
    local = read_span(path, probe.start, len(probe.data))
    return local is not None and local[1] > span.stored and local[0] == probe.data


def stored_preview(
    conn: Connection, ref: AttemptOutput, name: str, budget: int = PREVIEW_BYTES
) -> dict[str, Any]:
    """`preview` of a stream on a PostgreSQL queue."""
    span = output_store.read_stored(conn, ref.attempt_id, name, 0, budget)
    from_file = fuller_local_copy(conn, ref, name, span)
    data, size = (span.data, span.stored)
    if from_file:
        data, size = read_span(ref.paths[name], 0, budget) or (b"", 0)
    return {
        "path": ref.recorded_path(name),
        "size_bytes": size,
        "preview": data.decode("utf-8", errors="replace"),
        "preview_truncated": size > len(data),
        "missing": stored_missing(ref, span),
        **stored_facts(span, from_file),
    }


def stored_tail(conn: Connection, ref: AttemptOutput, name: str, budget: int) -> dict[str, Any]:
    """`tail` of a stream on a PostgreSQL queue."""
    span = output_store.read_stored(conn, ref.attempt_id, name, -budget, budget)
    from_file = fuller_local_copy(conn, ref, name, span)
    data, size = (span.data, span.stored)
    if from_file:
        data, size = read_span(ref.paths[name], -budget, budget) or (b"", 0)
    return {
        "path": ref.recorded_path(name),
        "size_bytes": size,
        "tail": data.decode("utf-8", errors="replace"),
        "truncated": size > len(data),
        "missing": stored_missing(ref, span),
        **stored_facts(span, from_file),
    }


def copy_stored(conn: Connection, ref: AttemptOutput, name: str, sink: Any) -> dict[str, Any]:
    """Write a whole stream's bytes to a binary sink (PostgreSQL queues);
    returns `stored_facts` of the stream."""
    span = output_store.read_stored(conn, ref.attempt_id, name, 0, 0)
    from_file = fuller_local_copy(conn, ref, name, span)
    if from_file:
        copy_all(ref.paths[name], sink)
    else:
        for data in output_store.iter_stored(conn, ref.attempt_id, name):
            sink.write(data)
    return stored_facts(span, from_file)
