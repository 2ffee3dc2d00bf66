"""SQLite's change watch: `PRAGMA data_version` says whether any other
connection committed since the last look, and an inotify watch on the
queue's write-ahead log wakes an idle worker when one does.

Every commit to a queue in WAL mode writes the `-wal` file beside it, so a
descriptor that turns readable on those writes lets the worker sleep in
`poll` until a commit lands instead of reading the counter every 30 ms: an
idle worker then wakes a few times a second (its fallback tick and duties),
and a submitted job is picked up as soon as its commit is written.

inotify is Linux's (spoolctl is Linux only) and reached through libc with
ctypes, imported only here (a worker's path, never `spoolctl add`'s). Where
it cannot be had (no such call, the user's inotify instances or watches used
up, no `-wal` file) `fileno()` is None and the worker reads the counter on
its fast tick, as before. The watch follows the log's inode: if that file is
removed or replaced (the kernel then says IN_IGNORED), the watch is dropped
and set again on the next look.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

IN_MODIFY = 0x00000002
IN_IGNORED = 0x00008000
_EVENT = struct.Struct("iIII")
"""struct inotify_event without its name: wd, mask, cookie, len."""
_READ_SIZE = 64 * 1024
REARM_S = 5.0
"""Without a watch (none could be set, or the kernel dropped it), how often
setting one is tried again."""


class WalNotifier:
    """A non-blocking inotify descriptor readable once the file at `path`
    was written since the last `drain`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self._libc: Any = None
        self._armed_at = 0.0
        self.arm()

    def arm(self) -> None:
        """Set the watch (again); on any failure there is none (fd None)."""
        self.close()
        self._armed_at = time.monotonic()
        try:
            import ctypes

            if self._libc is None:
                self._libc = ctypes.CDLL(None, use_errno=True)
            fd = int(self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        except (OSError, AttributeError):  # no libc symbol: not Linux
            return
        if fd < 0:
            return
        if self._libc.inotify_add_watch(fd, os.fsencode(self.path), IN_MODIFY) < 0:
            os.close(fd)
            return
        self.fd = fd

    def drain(self) -> bool:
        """Read every event waiting: whether the file was written since the
        last drain. A watch the kernel dropped is set again (and counts as
        written: a look is due)."""
        if self.fd is None:
            if time.monotonic() - self._armed_at >= REARM_S:
                self.arm()
            return False
        dropped = written = False
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                dropped = True
                break
            if not data:
                break
            written = True
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                dropped = dropped or bool(mask & IN_IGNORED)
                offset += _EVENT.size + length
        if dropped:  # the log was removed or replaced: watch the file there now
            self.arm()
        return written

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


POLL_S = 0.03
"""How often the counter is read while the queue is busy, or without inotify."""
QUIET_S = 0.5
"""With the descriptor armed, the fallback look of a quiet queue."""
RECHECK_S = 0.002
"""The log was written but the counter has not moved yet (a commit that is
still being written, or synced, when the worker woke): look again this soon."""
RECHECKS = 10
"""At most this many quick looks in a row; a log still written with no
commit showing (a transaction larger than the writer's cache spills its
pages) is then looked at on the fast tick until a commit shows or the
writes stop."""


class DataVersionWatch:
    """Tells whether any connection committed to the queue since the last
    look. Where inotify is had, a look that found the queue quiet arms the
    descriptor (`fileno`), so an idle worker sleeps until the log is written;
    a look that found a change keeps the fast tick (at most one look every
    POLL_S while others write, as without inotify)."""

    def __init__(self, engine: Engine, path: Path) -> None:
        self._raw: Any = engine.raw_connection()
        self._version: int | None = None
        self._peek()  # opens the file in WAL mode: its -wal file is there now
        self._notifier = WalNotifier(path.with_name(path.name + "-wal"))
        self._wait = POLL_S
        """How soon the next look is due (QUIET_S: the descriptor wakes it)."""
        self._rechecks = 0

    def _peek(self) -> bool:
        try:
            cursor = self._raw.cursor()
            cursor.execute("PRAGMA data_version")
            version = cursor.fetchone()[0]
            cursor.close()
        except Exception:  # a failed peek only means "look properly"
            return True
        changed = bool(version != self._version)
        self._version = version
        return changed

    def changed(self) -> bool:
        written = self._notifier.drain()  # the events first, then the counter: none is missed
        changed = self._peek()
        if changed or not written:
            self._rechecks = 0
            self._wait = POLL_S if changed else QUIET_S
        elif self._rechecks < RECHECKS:  # a commit on its way: look again soon
            self._rechecks += 1
            self._wait = RECHECK_S
        else:  # written again and again, no commit showing (a long transaction spills)
            self._wait = POLL_S
        return changed

    def fileno(self) -> int | None:
        return self._notifier.fd if self._wait == QUIET_S else None

    def wait_s(self) -> float:
        if self._wait == QUIET_S and self._notifier.fd is None:
            return POLL_S
        return self._wait

    def close(self) -> None:
        self._notifier.close()
        self._raw.close()
