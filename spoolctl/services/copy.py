"""Moving a queue up: copy an SQLite queue, history and output included, into
an empty PostgreSQL database.

Guarantees: the source is only read, in one snapshot; the target is written in
one transaction (see `spoolctl.db.copy`) and either ends up holding every row
of every table with its id, the id sequences past every id the source gave
out and the attempts' output, or, on any failure or a dry run, exactly as it
was found. A source with a running job is refused: its worker would go on
writing into the SQLite file after the copy.

Output: each attempt's stdout and stderr files, when they are regular files
inside the source spool's `output` folder, are stored in `output_chunks` by
the worker's own copier (`backends.postgresql.output`), so they follow the worker's rule:
64 KiB chunks, `offset` their byte position, at most `SPOOLCTL_PG_OUTPUT_CAP`
bytes per stream (8 MiB by default), `truncated` 1 on the last chunk kept
when the file was longer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, RowMapping, select

from spoolctl.db import copy as tables_copy
from spoolctl.db import revision
from spoolctl.db.backends import base
from spoolctl.db.backends.base import Driver, OutputWriter
from spoolctl.db.backends.files import open_regular
from spoolctl.db.queue import open_for_read
from spoolctl.db.revision import schema_status
from spoolctl.db.tables import attempts, jobs, output_chunks
from spoolctl.errors import Conflict, InvalidInput
from spoolctl.services.attempt_output import inside
from spoolctl.states import JobState

OUTPUT_BATCH_BYTES = 32 * 1024 * 1024
"""Output files are read and stored together up to about this many bytes."""
MISSING_SHOWN = 100
"""Streams listed by name in the report; all of them are counted."""


@dataclass
class OutputTally:
    """What storing the attempts' output files did."""

    cap_bytes: int
    bytes_stored: int = 0
    chunks: int = 0
    streams_stored: int = 0
    streams_truncated: int = 0
    streams_refused: int = 0
    streams_missing: int = 0
    attempts_missing: set[int] = field(default_factory=set)
    missing: list[dict[str, Any]] = field(default_factory=list)

    def as_data(self) -> dict[str, Any]:
        return {
            "bytes_stored": self.bytes_stored,
            "chunks": self.chunks,
            "cap_bytes": self.cap_bytes,
            "streams_stored": self.streams_stored,
            "streams_truncated": self.streams_truncated,
            "streams_refused": self.streams_refused,
            "streams_missing": self.streams_missing,
            "attempts_missing_output": len(self.attempts_missing),
            "missing": self.missing,
        }


@dataclass(frozen=True)
class CopyReport:
    source: str
    target: str
    dry_run: bool
    revision: str
    tables: dict[str, int]
    next_ids: dict[str, int]
    output: OutputTally


def copy_to_postgres(source: Driver, target: Driver, *, dry_run: bool, cap: int) -> CopyReport:
    """Copy the SQLite queue `source` into the empty PostgreSQL database
    `target` (a dry run rehearses every step, then rolls back)."""
    status = schema_status(source)
    if status is None:
        raise InvalidInput(
            f"there is no queue at {source.display} to copy; name the SQLite queue with --db",
            db=source.display,
        )
    revision.refuse_unless_current(status, source)
    queue = open_for_read(source)
    assert queue is not None  # schema_status found it
    try:
        return queue.read(lambda src: copy_snapshot(src, source, target, dry_run=dry_run, cap=cap))
    finally:
        queue.dispose()


def copy_snapshot(
    src: Connection, source: Driver, target: Driver, *, dry_run: bool, cap: int
) -> CopyReport:
    """The copy of one snapshot of the source."""
    refuse_running(src)
    refuse_dangling(src)
    tally = OutputTally(cap)
    with tables_copy.target_transaction(target, commit=not dry_run) as dst:
        tables_copy.prepare_target(dst, target)
        refuse_out_of_range(src, dst)
        counts = {
            t.name: tables_copy.copy_rows(src, dst, t, target) for t in tables_copy.COPY_ORDER
        }
        tables_copy.advance_sequences(src, dst)
        store_output(src, dst, source.output_root, target.output_writer(), tally)
        tally.chunks, tally.bytes_stored, tally.streams_truncated = tables_copy.output_totals(dst)
        counts[output_chunks.name] = tally.chunks
        ids = tables_copy.next_ids(dst)
    return CopyReport(
        source.display, target.display, dry_run, revision.HEAD_REVISION, counts, ids, tally
    )


def refuse_running(src: Connection) -> None:
    """A running job's worker keeps writing into the SQLite file: stop it first."""
    running = [
        int(row[0])
        for row in src.execute(
            select(jobs.c.id).where(jobs.c.state == JobState.RUNNING).order_by(jobs.c.id)
        )
    ]
    if running:
        shown = ", ".join(map(str, running[:20])) + (" ..." if len(running) > 20 else "")
        raise Conflict(
            f"{len(running)} job(s) are running in the source queue ({shown}); stop its "
            "workers (let them finish) before copying. Nothing was written",
            running_job_ids=running[:100],
        )


def refuse_dangling(src: Connection) -> None:
    dangling = tables_copy.dangling_references(src)
    if dangling:
        listed = ", ".join(f"{name} {n}" for name, n in sorted(dangling.items()))
        raise InvalidInput(
            f"the source queue has rows that name rows it does not have ({listed}); "
            "PostgreSQL would refuse them. Nothing was written",
            dangling=dangling,
        )


def refuse_out_of_range(src: Connection, dst: Connection) -> None:
    found = tables_copy.out_of_range(src, dst)
    if found:
        listed = "; ".join(f"{f['table']}.{f['column']} of {f['rows']}" for f in found)
        raise InvalidInput(
            f"the source holds integers too large for the target's columns ({listed}); "
            "nothing was written",
            out_of_range=found,
        )


def store_output(
    src: Connection, dst: Connection, output_root: Path, writer: OutputWriter, tally: OutputTally
) -> None:
    """Store every attempt's output files as chunks (streams the source
    already stores chunks of are left as copied)."""
    stored = tables_copy.streams_with_chunks(src)
    query = select(
        attempts.c.id,
        attempts.c.job_id,
        attempts.c.attempt_no,
        attempts.c.stdout_path,
        attempts.c.stderr_path,
    ).order_by(attempts.c.id)
    rows = src.execute(query).mappings()
    batch = OutputBatch(dst, writer)
    while page := rows.fetchmany(tables_copy.BATCH_ROWS):
        for row in page:
            found = {
                name: ("", 0)
                if (row["id"], name) in stored
                else readable(row, name, output_root, tally)
                for name in base.STREAMS
            }
            size = sum(min(size, tally.cap_bytes) for _, size in found.values())
            batch.add(int(row["id"]), {name: path for name, (path, _) in found.items()}, size)
    batch.flush()


class OutputBatch:
    """Attempts whose files are read and stored together, about
    OUTPUT_BATCH_BYTES at a time."""

    def __init__(self, dst: Connection, copier: OutputWriter) -> None:
        self.dst, self.copier = dst, copier
        self.attempt_ids: list[int] = []
        self.size = 0

    def add(self, attempt_id: int, paths: dict[str, str], size: int) -> None:
        if not any(paths.values()):
            return
        self.copier.track(attempt_id, paths)
        self.attempt_ids.append(attempt_id)
        self.size += size
        if self.size >= OUTPUT_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        self.copier.copy(self.dst, self.attempt_ids, final=True)
        self.copier.landed()
        for attempt_id in self.attempt_ids:
            self.copier.forget(attempt_id)
        self.attempt_ids, self.size = [], 0


def readable(
    attempt: RowMapping, stream: str, output_root: Path, tally: OutputTally
) -> tuple[str, int]:
    """The stream's file and its size when it is a regular file inside the
    source spool's output folder, else ("", 0) (counted as refused or missing)."""
    path = str(attempt[f"{stream}_path"] or "")
    if path and not inside(path, output_root):
        tally.streams_refused += 1
        return "", 0
    fd = open_regular(path)
    if fd is not None:
        size = os.fstat(fd).st_size
        os.close(fd)
        tally.streams_stored += 1
        return path, size
    tally.streams_missing += 1
    tally.attempts_missing.add(int(attempt["id"]))
    if len(tally.missing) < MISSING_SHOWN:
        tally.missing.append(
            {
                "job_id": attempt["job_id"],
                "attempt_no": attempt["attempt_no"],
                "stream": stream,
                "path": path,
            }
        )
    return "", 0
