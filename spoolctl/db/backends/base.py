"""The seam between spoolctl and a database engine: one driver per backend.

Everything that differs between the embedded SQLite file and a PostgreSQL
server lives behind these protocols, in the packages `sqlite/` and
`postgresql/`, and nowhere else (a test in tests/unit/test_layering.py fails on a
backend check outside this package). A driver is chosen once, from the `--db` value, by
`spoolctl.db.backends.locate`; callers hold a `Queue` made from it
(`spoolctl.db.queue`) and never ask which backend it is. Services stay plain
Core over a Connection; the few statements whose SQL differs are reached
through `backends.statements(conn)`, the connection's backend's module.

Adding a third engine is one new package implementing `Driver` and
`Statements`, registered in `backends/__init__.py`, plus a run of the driver
test suite (tests/process/test_drivers.py) against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import Boolean

Synchronous = Literal["OFF", "NORMAL", "FULL"]
STREAMS = ("stdout", "stderr")


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


@dataclass
class Check:
    """One of `doctor`'s readiness checks: a driver's (`Driver.health_checks`)
    or one every backend shares (`db/health.py`)."""

    id: str
    status: str  # pass | warn | fail | skip
    message: str
    remediation: str | None = None
    blocked_by: str | None = None


class HasTag(ColumnElement[bool]):
    """`tags` (a JSON object stored as text) holds key, or key=value; a damaged
    tags value matches nothing. Each driver module compiles it for its backend."""

    inherit_cache = True
    type = Boolean()

    def __init__(self, tags: ColumnElement[Any], key: str, value: str | None) -> None:
        self.tags = tags
        self.key = key
        self.value = value


class ChangeWatch(Protocol):
    """Tells an idle worker whether the queue may have new work since its
    last look (SQLite's data_version counter, PostgreSQL's LISTEN/NOTIFY)."""

    def changed(self) -> bool: ...

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when work arrives, if any."""
        ...

    def wait_s(self) -> float:
        """How long an idle worker may sleep before its next look when
        nothing wakes it (its descriptor, if any, stays quiet)."""
        ...

    def close(self) -> None: ...


class LeaseGuard(Protocol):
    """A watchdog that kills a worker's job groups when the worker dies or
    falls silent (workers on other machines, or in other PID namespaces of
    one host, cannot check it)."""

    def track(self, pgids: set[int]) -> None: ...

    def renewed(self) -> None: ...

    def close(self) -> None: ...


class OutputWriter(Protocol):
    """How a worker stores what its running attempts print, beyond the files
    the job writes (PostgreSQL: a copy in `output_chunks`, readable from any
    machine; SQLite: the files are the store, nothing more to do)."""

    pass_every_s: float | None
    """How often a worker runs a pass storing its running jobs' new output
    (`behind`, then `copy`); None when there is nothing to store beyond the
    files (no pass, no wake-up for one)."""

    def track(self, attempt_id: int, paths: Mapping[str, str]) -> None: ...

    def forget(self, attempt_id: int) -> None: ...

    def behind(self) -> list[int]:
        """Attempts with output not yet stored (a periodic pass copies them)."""
        ...

    def copy(self, conn: Connection, attempt_ids: Iterable[int], *, final: bool = False) -> None:
        """Store their new output inside the caller's transaction (`final`: in
        the outcome's transaction, everything up to the cap)."""
        ...

    def landed(self) -> None:
        """The transaction that ran `copy` committed."""
        ...

    def failed(self) -> None:
        """It did not: look again where the database stands before the next copy."""
        ...


class OutputReader(Protocol):
    """How `output`, `feedback` and the web read an attempt's streams: from
    the files (SQLite) or from the copy in the database (PostgreSQL), with
    one vocabulary (`size_bytes`, `missing`, ...; the stored copy adds
    `source`, `stored_bytes`, `stored_truncated`)."""

    reads_local_files: bool
    """True when it reads the files a row names (so a path outside the spool
    leaves a stream unread), False when it reads a copy in the database."""

    def preview(self, conn: Connection, ref: AttemptOutput, name: str) -> dict[str, Any]: ...

    def tail(
        self, conn: Connection, ref: AttemptOutput, name: str, budget: int
    ) -> dict[str, Any]: ...

    def copy_to(self, conn: Connection, ref: AttemptOutput, name: str, sink: Any) -> dict[str, Any]:
        """Every byte of the stream to sink (`--raw`); the facts `preview` gives."""
        ...

    def read(
        self, conn: Connection, ref: AttemptOutput, name: str, offset: int, budget: int
    ) -> bytes:
        """Up to budget bytes from offset (negative: from the end); empty when
        there are none (yet)."""
        ...

    def span(
        self, conn: Connection, ref: AttemptOutput, name: str, offset: int, budget: int
    ) -> tuple[bytes, int, bool]:
        """Like `read`, with where the bytes start in the stream and whether
        the stream is missing."""
        ...

    def cut_at_cap(self, conn: Connection, ref: AttemptOutput, name: str) -> bool:
        """The stored copy stops short of the file (PostgreSQL's cap)."""
        ...


class Statements(Protocol):
    """The statements whose SQL differs, for one backend (module-level
    functions of its driver module, reached through `backends.statements`)."""

    def event_position(self) -> ColumnElement[int]:
        """The column the ledger is read in order of, shown as each event's
        `id` and compared with a cursor: one that no transaction committing
        later can give a smaller value than an event a reader already saw
        (SQLite: the id; PostgreSQL: `seq`, given by readers)."""
        ...

    def ledger_reader(self, conn: Connection) -> AbstractContextManager[Connection]:
        """A connection in a read transaction that sees every event committed
        so far at its position: conn itself, in its own transaction or, when
        it has none open (`Queue.read_ledger`), in a read snapshot opened here.
        PostgreSQL first runs the readers' numbering (`postgresql/ledger.py`),
        on conn when it has no transaction open, else on a second connection
        of its engine. Writers never wait on it."""
        ...

    def writes_in_with(self) -> bool:
        """Whether one statement may write several tables, its writes inside
        a WITH (PostgreSQL): a claim then takes its jobs, creates their
        attempts and writes their events in one round trip."""
        ...

    def pipeline(self, conn: Connection) -> AbstractContextManager[bool]:
        """Statements run inside are answered together, where the backend can
        (PostgreSQL's pipeline mode, yielding True): each `Prepared.send` goes
        out without waiting for the answer to the one before, and the first
        read of any one's rows waits for all of them in one round trip. An
        error surfaces at that read, the transaction failed. SQLite yields
        False: each statement runs as it is sent, in process."""
        ...

    def before_cap_count(self, conn: Connection, lane: str) -> None:
        """Before a claim counts a capped lane's running jobs against its cap
        (`--slots`): claimants of one lane count one at a time."""
        ...

    def upsert(self, conn: Connection, table: Table, values: dict[str, Any], key: str) -> None:
        """Insert a row, or update the one with the same primary key."""
        ...

    def table_names(self, conn: Connection) -> set[str]:
        """The tables the database holds (its own catalogue excluded)."""
        ...

    def legacy_version(self, conn: Connection, tables: set[str]) -> int | None:
        """The original spoolctl's schema_version, where this backend can hold
        one of its files (the original only ever wrote SQLite)."""
        ...

    def check_references(self, conn: Connection) -> None:
        """Before a migration commits: refuse a dangling reference."""
        ...

    def translate_errors(self, engine: Engine) -> AbstractContextManager[None]:
        """Driver errors become the contract's (see Driver.translate_errors)."""
        ...

    def ledger_lag(self, conn: Connection) -> dict[str, Any] | None:
        """How far the ledger's positions are behind its writers (PostgreSQL:
        `unnumbered`, `behind_s`, `oldest_writer_s`, as `doctor` reports it);
        None where events are positioned as they commit (SQLite)."""
        ...


class Backend(Protocol):
    """A driver module as the registry (`backends/__init__.py`) reaches it,
    once a `--db` value chose it."""

    def parse_url(self, text: str, source: str, shown: str) -> str:
        """The location a URL of this backend's schemes names (`shown`: the
        URL as messages may show it); INVALID_INPUT naming what is wrong."""
        ...

    def located(self, location: str, base: Path, source: str) -> Driver:
        """The driver of a location: `parse_url`'s, or a path (relative to
        `base`) for the backend of paths."""
        ...


class FileBackend(Backend, Protocol):
    """The backend of a path (`backends.FILE_BACKEND`)."""

    def at(self, path: Path) -> Driver:
        """The driver of the file at path (the default queue, tests)."""
        ...


class ConninfoBackend(Backend, Protocol):
    """The backend of a libpq connection string (`backends.CONNINFO_BACKEND`)."""

    def parse_conninfo(self, text: str, source: str, shown: str) -> str:
        """The location a connection string names, as `parse_url` gives one."""
        ...


class Driver(Protocol):
    """One queue's backend: where it is and how to use it."""

    name: str
    """`sqlite` or `postgresql`: for people and `capabilities`, never for branching."""
    kind_of_database: str
    """How messages call it: "an SQLite database", "a PostgreSQL database"."""
    backup_note: str
    """What `migrate` says about backups where it takes none."""
    shared: bool
    """Workers on several machines may share it (what `copy-to` moves a
    queue to); False for a file that one machine's processes use."""

    @property
    def display(self) -> str:
        """How output names the queue (a URL's password masked)."""
        ...

    @property
    def spool(self) -> Path:
        """The folder this machine's workers keep output files in."""
        ...

    @property
    def output_root(self) -> Path: ...

    def redact(self, text: str) -> str:
        """text with the location's secrets removed (driver errors may echo a
        connection string)."""
        ...

    def may_hold_a_queue(self) -> bool:
        """False when there is certainly no queue (no file, or an empty one):
        read verbs answer empty without opening anything."""
        ...

    def ensure(self) -> None:
        """Make what a writer needs before the engine opens it (SQLite: the
        spool folder 0700 and the file 0600)."""
        ...

    def engine(
        self,
        *,
        write: bool,
        expected_revision: str | None,
        synchronous: Synchronous = "NORMAL",
        lock_wait_s: float | None = None,
    ) -> Engine:
        """An engine whose write transactions take the backend's write lock
        (BEGIN IMMEDIATE / row locks bounded by lock_wait_s, default the busy
        timeout) and, with expected_revision, re-check the schema revision
        inside every transaction."""
        ...

    def peek_engine(self) -> Engine:
        """A read-only engine that creates, changes and removes nothing: for
        looking at a database before deciding to use it."""
        ...

    def migration_engine(self) -> Engine:
        """A write engine for schema changes: no revision check, long lock
        waits (another migrate), references checked at commit, not per row."""
        ...

    def translate_errors(self, engine: Engine) -> AbstractContextManager[None]:
        """Driver errors become the contract's: Locked, Unreachable,
        StorageFault (DB_UNUSABLE with a reason), DiskFull, InvalidInput."""
        ...

    def clock(self, engine: Engine) -> Callable[[], float]:
        """The clock liveness times are written and judged by: this machine's
        for a file only it uses, the server's for a fleet."""
        ...

    def change_watch(self, engine: Engine) -> ChangeWatch: ...

    def lease_guard(self, fence_after_s: float) -> LeaseGuard | None:
        """The watchdog a worker forks, since reapers on other machines or in
        other PID namespaces cannot check it (None where every reaper could)."""
        ...

    def identity(self) -> object | None:
        """What must stay the same while a worker runs (the file's device and
        inode): a change means the queue was replaced underneath."""
        ...

    def output_writer(self) -> OutputWriter: ...

    def output_reader(self) -> OutputReader: ...

    def lock_for_migration(self, conn: Connection) -> None:
        """Serialize racing migrations (inside the migration's transaction)."""
        ...

    def take_backup(self, label: str) -> Path | None:
        """A consistent copy before a schema change, or None where the
        operator backs up (pg_dump)."""
        ...

    def after_migration(self, engine: Engine) -> None:
        """What follows a committed schema change (SQLite: WAL mode)."""
        ...

    def health_checks(self) -> list[Check]:
        """`doctor`'s checks of this backend: the database and its folder."""
        ...
