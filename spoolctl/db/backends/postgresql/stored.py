"""Reading the output a PostgreSQL queue stores in `output_chunks` (see
`postgresql/output.py` for how it is written and what a stream with no chunk
means), from any machine: `StoredOutput` is the driver's output reader."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from spoolctl.db.backends import files
from spoolctl.db.backends.base import AttemptOutput
from spoolctl.db.backends.postgresql.output import CHUNK_BYTES, PASS_BUDGET_BYTES, stored_extent
from spoolctl.db.tables import output_chunks
from spoolctl.states import AttemptState

# -- reading (any machine) -----------------------------------------------------


@dataclass(frozen=True)
class StoredSpan:
    """Stored bytes of one stream of one attempt."""

    data: bytes
    start: int
    """Where `data` begins in the stream."""
    stored: int
    """Bytes of the stream stored in all."""
    truncated: bool
    """The cap cut the stored copy: the stream went on past `stored`."""
    present: bool = True
    """Some chunk of the stream is stored (see the module's docstring for
    what none means)."""


def read_stored(
    conn: Connection, attempt_id: int, stream: str, start: int, budget: int
) -> StoredSpan:
    """Up to `budget` stored bytes from `start` (negative: that many bytes
    before the end of what is stored)."""
    found = stored_extent(conn, attempt_id, stream)
    if found is None:
        return StoredSpan(b"", 0, 0, truncated=False, present=False)
    stored, truncated = found
    begin = max(0, stored + start) if start < 0 else min(start, stored)
    end = min(stored, begin + budget)
    rows = conn.execute(
        select(output_chunks.c.offset, output_chunks.c.data)
        .where(
            output_chunks.c.attempt_id == attempt_id,
            output_chunks.c.stream == stream,
            output_chunks.c.offset > begin - CHUNK_BYTES,  # no chunk is longer
            output_chunks.c.offset < end,
        )
        .order_by(output_chunks.c.offset)
    )
    buffer = bytearray()
    for offset, data in rows:
        low, high = max(begin, offset), min(end, offset + len(data))
        if high > low:
            buffer += data[low - offset : high - offset]
    return StoredSpan(bytes(buffer), begin, stored, truncated)


def iter_stored(
    conn: Connection, attempt_id: int, stream: str, batch: int = PASS_BUDGET_BYTES
) -> Iterator[bytes]:
    """All stored bytes of a stream, in pieces of at most `batch` bytes."""
    offset = 0
    while True:
        span = read_stored(conn, attempt_id, stream, offset, batch)
        if not span.data:
            return
        yield span.data
        offset += len(span.data)


# -- the reader of `output`, `feedback` and the web ------------------------------

MATCH_PROBE_BYTES = 4096
"""Bytes compared where the stored copy ends before a local file is read instead."""


def stored_missing(ref: AttemptOutput, span: StoredSpan) -> bool:
    """Whether the stored copy of a stream is gone: every stream of an ended
    attempt keeps at least one chunk (see the module's docstring), while a
    running attempt's stream with none has printed nothing yet."""
    return not span.present and ref.state != AttemptState.RUNNING


def stored_facts(span: StoredSpan, from_file: bool) -> dict[str, Any]:
    """Keys a stream gets from the stored copy, besides the usual ones."""
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
    probe = read_stored(conn, ref.attempt_id, name, -MATCH_PROBE_BYTES, MATCH_PROBE_BYTES)
    local = files.read_span(path, probe.start, len(probe.data))
    return local is not None and local[1] > span.stored and local[0] == probe.data


class StoredOutput:
    """Reads the copy in the database, so output reads the same from any
    machine. This machine's file of a stream is read instead only when the
    stored copy was cut at the cap and the file, inside this machine's spool,
    is longer and holds the same bytes where the stored copy ends. A stream
    of an ended attempt with nothing stored is `missing`, as a missing file
    is on SQLite (never read from this machine's file instead: nothing stored
    is left to tell that file is the attempt's own)."""

    reads_local_files = False
    """A row's path outside this machine's spool does not stop a read."""

    def preview(self, conn: Connection, ref: AttemptOutput, name: str) -> dict[str, Any]:
        found = self._span(conn, ref, name, 0, files.PREVIEW_BYTES)
        data, size, span, from_file = found
        return {
            "path": ref.recorded_path(name),
            "size_bytes": size,
            "preview": data.decode("utf-8", errors="replace"),
            "preview_truncated": size > len(data),
            "missing": stored_missing(ref, span),
            **stored_facts(span, from_file),
        }

    def tail(self, conn: Connection, ref: AttemptOutput, name: str, budget: int) -> dict[str, Any]:
        data, size, span, from_file = self._span(conn, ref, name, -budget, budget)
        return {
            "path": ref.recorded_path(name),
            "size_bytes": size,
            "tail": data.decode("utf-8", errors="replace"),
            "truncated": size > len(data),
            "missing": stored_missing(ref, span),
            **stored_facts(span, from_file),
        }

    def _span(
        self, conn: Connection, ref: AttemptOutput, name: str, start: int, budget: int
    ) -> tuple[bytes, int, StoredSpan, bool]:
        span = read_stored(conn, ref.attempt_id, name, start, budget)
        from_file = fuller_local_copy(conn, ref, name, span)
        if from_file:
            data, size = files.read_span(ref.paths[name], start, budget) or (b"", 0)
            return data, size, span, True
        return span.data, span.stored, span, False

    def copy_to(self, conn: Connection, ref: AttemptOutput, name: str, sink: Any) -> dict[str, Any]:
        span = read_stored(conn, ref.attempt_id, name, 0, 0)
        from_file = fuller_local_copy(conn, ref, name, span)
        if from_file:
            files.copy_all(ref.paths[name], sink)
        else:
            for data in iter_stored(conn, ref.attempt_id, name):
                sink.write(data)
        return stored_facts(span, from_file)

    def read(
        self, conn: Connection, ref: AttemptOutput, name: str, offset: int, budget: int
    ) -> bytes:
        return read_stored(conn, ref.attempt_id, name, offset, budget).data

    def span(
        self, conn: Connection, ref: AttemptOutput, name: str, offset: int, budget: int
    ) -> tuple[bytes, int, bool]:
        found = read_stored(conn, ref.attempt_id, name, offset, budget)
        return found.data, found.start, stored_missing(ref, found)

    def cut_at_cap(self, conn: Connection, ref: AttemptOutput, name: str) -> bool:
        found = stored_extent(conn, ref.attempt_id, name)
        return found is not None and found[1]
