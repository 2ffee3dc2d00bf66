"""Attempts' output stored in the database (PostgreSQL queues), and read back.

The writer is `OutputCopier` (a worker's), the reader `StoredOutput`
(`output`, `feedback`, the web): PostgreSQL's driver hands them out, and no
caller knows which store it has (`backends.files` is SQLite's).

The worker's local files stay the first copy. On a PostgreSQL queue the
worker also copies what each running attempt appended to its files into
`output_chunks`, a few times a second and once more in the transaction that
records the attempt's outcome, so `output`, `output --follow` and `feedback`
work from any machine, and a reader that sees an attempt ended sees all of
its stored output.

- A chunk holds at most CHUNK_BYTES; `offset` is its byte position in its
  stream, and the chunks of a stream are contiguous from offset 0.
- At most the cap (`SPOOLCTL_PG_OUTPUT_CAP` bytes per attempt and stream, 8 MiB
  by default) is stored. Once a stream goes past it nothing more is stored
  and the last chunk kept carries `truncated = 1` (an empty chunk when the
  cap fell on a chunk's end): the full output is then only in the worker's
  local file.
- Every stream of an attempt whose worker recorded its end has at least one
  chunk: an empty stream is stored as one empty chunk at offset 0, in the
  transaction that records the outcome (`copy-to` does the same). So the
  database holds no copy of a stream of an ended attempt that has no chunk
  at all, and readers say it is missing: dropped by a downgrade told to,
  deleted underneath, its file gone when the attempt ended, or never stored
  (its worker died first, or was spoolctl 0.5.1 or older, which stored no
  empty chunk). A running attempt's stream with none has printed nothing yet.
- The copier's positions advance only after the transaction that stored the
  chunks committed. After a failed one it reads where the database stands
  before copying again, so a failed pass loses nothing and stores nothing twice.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    LargeBinary,
    Text,
    bindparam,
    cast,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY

from spoolctl.config import ENV_VARS
from spoolctl.config import OUTPUT_CAP_ENV as CAP_ENV
from spoolctl.db.backends.base import STREAMS
from spoolctl.db.prepared import Prepared, Sent
from spoolctl.db.tables import attempts, output_chunks
from spoolctl.errors import InvalidInput

CHUNK_BYTES = 65_536
"""The most bytes one `output_chunks` row holds."""
DEFAULT_CAP_BYTES: int = ENV_VARS[CAP_ENV]["default"]
"""8 MiB per attempt and stream."""
MAX_CAP_BYTES: int = ENV_VARS[CAP_ENV]["max"]
"""1 GiB: offsets are 32-bit integers."""
PASS_BUDGET_BYTES = 1 << 20
"""The most bytes of one stream a periodic pass copies (the final pass copies
everything up to the cap), so one pass stays a short transaction."""


ROWS_PER_INSERT = 1000
"""Chunks stored by one statement (`_STORE`): a pass's chunks (two empty
ones for each ended attempt with no output) cost the server one statement,
not one each, and a long final copy is sent in bounded messages."""


def cap_bytes() -> int:
    """`SPOOLCTL_PG_OUTPUT_CAP`: a whole number of bytes from 1 to MAX_CAP_BYTES."""
    raw = os.environ.get(CAP_ENV, "")
    if raw == "":
        return DEFAULT_CAP_BYTES
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_CAP_BYTES):
        raise InvalidInput(
            f"{CAP_ENV} must be a whole number of bytes from 1 to {MAX_CAP_BYTES}, got {raw!r}",
            name=CAP_ENV,
        )
    return int(raw)


# -- writing (the worker) ------------------------------------------------------


@dataclass
class _Stream:
    path: str
    stored: int = 0
    """Bytes of the stream stored so far (the next chunk's offset)."""
    capped: bool = False
    """The cap was reached and flagged: nothing more is stored."""
    present: bool = False
    """Some chunk of the stream is stored (an empty one, at least)."""


@dataclass
class _Attempt:
    streams: dict[str, _Stream]
    unsure: bool = False
    """A pass failed: where the database stands is read before the next one."""


@dataclass
class OutputCopier:
    """Copies running attempts' new output from their local files into
    `output_chunks`, inside transactions the worker opens."""

    cap: int
    pass_every_s: float | None = 0.25
    """How often a worker stores its running jobs' new output."""
    _attempts: dict[int, _Attempt] = field(default_factory=dict)
    _staged: dict[int, dict[str, _Stream]] = field(default_factory=dict)
    _sent: list[tuple[set[int], Sent]] = field(default_factory=list)
    """The last `copy`'s statements and the attempts each stored for, their
    answers read once it landed (in a pipeline they come with the pass's)."""

    def track(self, attempt_id: int, paths: Mapping[str, str]) -> None:
        streams = {name: _Stream(paths[name]) for name in STREAMS}
        self._attempts[attempt_id] = _Attempt(streams)

    def forget(self, attempt_id: int) -> None:
        self._attempts.pop(attempt_id, None)

    def behind(self) -> list[int]:
        """Attempts whose files hold bytes not stored yet (a stat per stream)."""
        return [aid for aid, attempt in self._attempts.items() if _has_news(attempt)]

    def copy(self, conn: Connection, attempt_ids: Iterable[int], *, final: bool = False) -> None:
        """Store the new bytes of these attempts (final: all of them up to the
        cap, else at most PASS_BUDGET_BYTES per stream). The copier advances
        only when the caller reports the commit with `landed()`. A pass with
        nothing new to store sends no statement."""
        wanted = [aid for aid in attempt_ids if aid in self._attempts]
        rows: list[dict[str, Any]] = []
        for aid in wanted:
            attempt = self._attempts[aid]
            staged = {}
            for name, stream in attempt.streams.items():
                start = _stored_stream(conn, aid, name, stream) if attempt.unsure else stream
                if start.capped:
                    staged[name] = start
                    continue
                new_rows, staged[name] = _chunk_rows(aid, name, start, self.cap, final)
                rows += new_rows
            self._staged[aid] = staged
        for first in range(0, len(rows), ROWS_PER_INSERT):
            self._sent.append(_store(conn, rows[first : first + ROWS_PER_INSERT]))

    def landed(self) -> None:
        """The transaction of the last `copy` committed."""
        for ids, sent in self._sent:
            for aid in ids - {int(row.attempt_id) for row in sent.all()}:
                self._staged.pop(aid, None)  # pruned underneath: its chunks could not be stored
                self.forget(aid)
        self._sent.clear()
        for aid, streams in self._staged.items():
            attempt = self._attempts.get(aid)
            if attempt is not None:
                attempt.streams, attempt.unsure = streams, False
        self._staged.clear()

    def failed(self) -> None:
        """The transaction of the last `copy` did not commit (or may not have)."""
        for aid in self._staged:
            if aid in self._attempts:
                self._attempts[aid].unsure = True
        self._staged.clear()
        self._sent.clear()


def _has_news(attempt: _Attempt) -> bool:
    if attempt.unsure:
        return True
    for stream in attempt.streams.values():
        if not stream.capped and _size(stream.path) > stream.stored:
            return True
    return False


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


_COLUMNS = ("attempt_id", "stream", "offset", "data", "truncated")
_TYPES = {
    "attempt_id": BigInteger,
    "stream": Text,
    "offset": Integer,
    "data": LargeBinary,
    "truncated": Integer,
}
_NEW = (
    func.unnest(*(cast(bindparam(f"c_{name}"), ARRAY(_TYPES[name])) for name in _COLUMNS))
    .table_valued(*_COLUMNS)
    .render_derived(name="new")
)
_LIVE = (
    select(attempts.c.id)
    .where(attempts.c.id == _NEW.c.attempt_id)
    .with_for_update(read=True, key_share=True)
    .exists()
)
"""The chunk's attempt, share-locked: a subquery that locks is never turned
into a join, so each attempt is found by its key, one probe a chunk,
whatever the planner believes of the table's size (an `= ANY(ids)` scan
planned while the table was small walked every attempt for each chunk)."""
_STORE = Prepared(
    insert(output_chunks)
    .from_select(_COLUMNS, select(*_NEW.c).where(_LIVE))
    .returning(output_chunks.c.attempt_id)
)
"""Chunks of any number of attempts in one prepared statement (its columns
as arrays), stored only for attempts that still exist: each is
share-locked as its chunks are stored (in attempt order: the rows are
sorted), so no prune deletes one before its chunks commit (a prune that
got there first leaves its chunks out, and the copier forgets it). Row
locks are taken before the foreign keys are checked, at the statement's
end."""


def _store(conn: Connection, rows: list[dict[str, Any]]) -> tuple[set[int], Sent]:
    """Store the chunk rows: the attempts they are for, and the statement,
    which answers with those whose chunks were stored."""
    rows = sorted(rows, key=lambda row: row["attempt_id"])
    params = {f"c_{name}": [row[name] for row in rows] for name in _COLUMNS}
    return {row["attempt_id"] for row in rows}, _STORE.send(conn, params)


def _stored_stream(conn: Connection, attempt_id: int, name: str, stream: _Stream) -> _Stream:
    found = stored_extent(conn, attempt_id, name)
    stored, truncated = found or (0, False)
    return _Stream(stream.path, stored, truncated, present=found is not None)


def _chunk_rows(
    attempt_id: int, name: str, stream: _Stream, cap: int, final: bool
) -> tuple[list[dict[str, Any]], _Stream]:
    """The rows holding the stream's bytes from `stream.stored` on, and where
    the stream stands once they are stored. A final pass over a stream that
    is stored nowhere yet stores at least an empty chunk (none when its file
    cannot be read: that stream's output is missing)."""
    room = max(0, cap - stream.stored)
    span = _read_from(stream.path, stream.stored, room if final else min(room, PASS_BUDGET_BYTES))
    if span is None:
        return [], stream
    data, size = span
    start = stream.stored
    rows = [
        {
            "attempt_id": attempt_id,
            "stream": name,
            "offset": start + i,
            "data": data[i : i + CHUNK_BYTES],
            "truncated": 0,
        }
        for i in range(0, len(data), CHUNK_BYTES)
    ]
    end = start + len(data)
    capped = end >= cap and size > end
    if capped and rows:
        rows[-1]["truncated"] = 1
    elif capped or (final and not rows and not stream.present):
        rows.append(
            {
                "attempt_id": attempt_id,
                "stream": name,
                "offset": end,
                "data": b"",
                "truncated": int(capped),
            }
        )
    return rows, _Stream(stream.path, end, capped, present=stream.present or bool(rows))


def _read_from(path: str, offset: int, budget: int) -> tuple[bytes, int] | None:
    """Up to `budget` bytes of the worker's own file from `offset`, and its size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        parts = []
        position, remaining = offset, min(budget, max(0, size - offset))
        while remaining > 0:
            part = os.pread(fd, remaining, position)
            if not part:
                break
            parts.append(part)
            position += len(part)
            remaining -= len(part)
        return b"".join(parts), size
    finally:
        os.close(fd)


def stored_extent(conn: Connection, attempt_id: int, stream: str) -> tuple[int, bool] | None:
    """(bytes stored, truncated flag) of one stream, as its last chunk says;
    None when no chunk of it is stored."""
    last = conn.execute(
        select(output_chunks.c.offset, func.length(output_chunks.c.data), output_chunks.c.truncated)
        .where(output_chunks.c.attempt_id == attempt_id, output_chunks.c.stream == stream)
        .order_by(output_chunks.c.offset.desc())
        .limit(1)
    ).first()
    if last is None:
        return None
    return int(last[0]) + int(last[1]), bool(last[2])
