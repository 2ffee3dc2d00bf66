"""Output kept in files: what each attempt's process wrote straight to the
stdout and stderr files under the spool's output folder (SQLite queues, and
every worker's own machine).

A path comes from a database row, so it is treated as untrusted (the caller
confines it to the output folder first, `services.attempt_output.confine`): only
regular files are read (a FIFO or device named by a row would block or
worse), opened non-blocking, and never more than the caller's byte budget at
once.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection

from spoolctl.db.backends.base import AttemptOutput

PREVIEW_BYTES = 65_536


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
        return {
            "path": path,
            "size_bytes": 0,
            "preview": "",
            "preview_truncated": False,
            "missing": True,
        }
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


class FileOutput:
    """The files are the store: a reader of them, and a writer with nothing
    to do beyond what the job's process writes itself."""

    reads_local_files = True
    """A row's path outside the spool is not read (OUTPUT_PATH_REFUSED)."""
    pass_every_s: float | None = None
    """Nothing to store beyond the files: no periodic pass."""

    def preview(self, conn: Connection, ref: AttemptOutput, name: str) -> dict[str, Any]:
        return preview(ref.paths[name])

    def tail(self, conn: Connection, ref: AttemptOutput, name: str, budget: int) -> dict[str, Any]:
        return tail(ref.paths[name], budget)

    def copy_to(self, conn: Connection, ref: AttemptOutput, name: str, sink: Any) -> dict[str, Any]:
        copy_all(ref.paths[name], sink)
        return {}

    def read(
        self, conn: Connection, ref: AttemptOutput, name: str, offset: int, budget: int
    ) -> bytes:
        span = read_span(ref.paths[name], offset, budget)
        return b"" if span is None else span[0]

    def span(
        self, conn: Connection, ref: AttemptOutput, name: str, offset: int, budget: int
    ) -> tuple[bytes, int, bool]:
        found = read_span(ref.paths[name], offset, budget)
        if found is None:
            return b"", 0, True
        data, size = found
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        return data, start, False

    def cut_at_cap(self, conn: Connection, ref: AttemptOutput, name: str) -> bool:
        return False

    def track(self, attempt_id: int, paths: Mapping[str, str]) -> None:
        return None

    def forget(self, attempt_id: int) -> None:
        return None

    def behind(self) -> list[int]:
        return []

    def copy(self, conn: Connection, attempt_ids: Iterable[int], *, final: bool = False) -> None:
        return None

    def landed(self) -> None:
        return None

    def failed(self) -> None:
        return None
