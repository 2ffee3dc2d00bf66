"""Typed errors: each knows its contract error code and process exit code.

Layers below the CLI raise these; `cli/render.py` turns them into envelopes in
one place, so an error code is defined exactly once.
"""

from __future__ import annotations

from typing import Any, ClassVar

EXIT_OK = 0
EXIT_USER = 1
EXIT_SAFETY = 2
EXIT_TOOL = 3
EXIT_TRANSIENT = 4
EXIT_CONFLICT = 5
EXIT_JOB_UNSUCCESSFUL = 6

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (also empty results)",
    EXIT_USER: "user input error",
    EXIT_SAFETY: "safety block: refused, confirm with --yes/--force",
    EXIT_TOOL: "tool or environment error",
    EXIT_TRANSIENT: "transient: retry later",
    EXIT_CONFLICT: "conflict: state changed underneath",
    EXIT_JOB_UNSUCCESSFUL: "an awaited job ended without success (wait)",
}
EXIT_WORDS: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_USER: "input",
    EXIT_SAFETY: "safety",
    EXIT_TOOL: "tool",
    EXIT_TRANSIENT: "retry",
    EXIT_CONFLICT: "conflict",
    EXIT_JOB_UNSUCCESSFUL: "job failed",
}
"""One word per exit code, for the token-budgeted `brief`."""


class SpoolError(Exception):
    """Root of every error spoolctl reports on purpose."""

    code: ClassVar[str] = "INTERNAL"
    exit_code: ClassVar[int] = EXIT_TOOL

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail: dict[str, Any] = detail


class InvalidInput(SpoolError):
    code = "INVALID_INPUT"
    exit_code = EXIT_USER


class MissingRequired(SpoolError):
    code = "MISSING_REQUIRED"
    exit_code = EXIT_USER


class NotFound(SpoolError):
    code = "NOT_FOUND"
    exit_code = EXIT_USER


class UnknownCommand(SpoolError):
    code = "UNKNOWN_COMMAND"
    exit_code = EXIT_USER


class UnknownFlag(SpoolError):
    code = "UNKNOWN_FLAG"
    exit_code = EXIT_USER


class SafetyBlock(SpoolError):
    code = "SAFETY_BLOCK"
    exit_code = EXIT_SAFETY


class Internal(SpoolError):
    code = "INTERNAL"
    exit_code = EXIT_TOOL


DB_UNUSABLE_REASONS: dict[str, str] = {
    "not_a_queue": "the file or database is not a spoolctl queue",
    "damaged": "the file is damaged, truncated or not an SQLite database",
    "unreadable": "the file, its folder or the database cannot be read by this user",
    "read_only": "the file, its folder or the database is read-only where a write is needed",
    "not_creatable": "the queue cannot be created there",
    "disk_full": "the disk holding the queue is full",
    "login_refused": "the server refused the login (user, password or authentication method)",
    "no_such_database": "the server has no database of that name",
    "server_too_old": "the server is older than the oldest version spoolctl supports",
    "replaced": "the queue file was deleted or replaced while a worker used it",
    "unusable": "the database answered with an error that makes it unusable",
}
"""Every `detail.reason` of DB_UNUSABLE, with what it means (published by
`capabilities`)."""


class StorageFault(SpoolError):
    """The database file or spool folder, or the database on a server, cannot
    be used: not a queue, damaged, unreadable, read-only, full, or the login
    is refused. An environment error (exit 3), never a bug; `detail.reason`
    is one of DB_UNUSABLE_REASONS."""

    code = "DB_UNUSABLE"
    exit_code = EXIT_TOOL

    def __init__(self, message: str, *, reason: str, **detail: Any) -> None:
        assert reason in DB_UNUSABLE_REASONS, reason
        super().__init__(message, reason=reason, **detail)


class DiskFull(StorageFault):
    """The disk under the database is full: a worker waits for space instead
    of stopping; a one-shot verb reports it like any storage fault."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message, reason="disk_full", **detail)


class NotAQueue(StorageFault):
    """The file is an SQLite database but not a spoolctl queue (no
    alembic_version, no legacy meta table), or a PostgreSQL database holding
    other tables: every verb, `migrate` included, refuses it without writing
    a byte."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message, reason="not_a_queue", **detail)


class SchemaOutdated(SpoolError):
    code = "SCHEMA_OUTDATED"
    exit_code = EXIT_TOOL


class SchemaTooNew(SpoolError):
    code = "SCHEMA_TOO_NEW"
    exit_code = EXIT_TOOL


class Locked(SpoolError):
    code = "LOCKED"
    exit_code = EXIT_TRANSIENT


class Unreachable(Locked):
    """The database server did not answer, or dropped the connection
    (PostgreSQL): transient (exit 4, retry later) with a code of its own; a
    subclass of Locked because whoever retries a busy lock (a worker's loop)
    retries this too."""

    code = "UNREACHABLE"
    exit_code = EXIT_TRANSIENT


class ExtraMissing(SpoolError):
    """A verb or a `--db` needs an optional part that is not installed
    (`detail.install` is the command that installs it)."""

    code = "EXTRA_MISSING"
    exit_code = EXIT_TOOL

    def __init__(self, message: str, *, extra: str, **detail: Any) -> None:
        install = install_command(extra)
        super().__init__(f"{message}: {install}", extra=extra, install=install, **detail)


def install_command(extra: str) -> str:
    """The command that installs an extra into the environment spoolctl runs
    from (EXTRA_MISSING's hint): `scripts/setup --extra NAME` where that is
    this checkout's own `.venv` (as `./scripts/demo` and `./scripts/setup`
    make it, perhaps without pip), else this interpreter's pip (bootstrapped
    by ensurepip first where the environment has none)."""
    import importlib.util
    import shlex
    import sys
    from pathlib import Path

    checkout = Path(__file__).resolve().parent.parent
    setup = checkout / "scripts" / "setup"
    if setup.is_file() and Path(sys.prefix).resolve() == (checkout / ".venv").resolve():
        here = Path.cwd().resolve() == checkout
        return f"{'./scripts/setup' if here else shlex.quote(str(setup))} --extra {extra}"
    python = shlex.quote(sys.executable)
    install = f"{python} -m pip install 'spoolctl[{extra}]'"
    if importlib.util.find_spec("pip") is None:
        return f"{python} -m ensurepip --default-pip && {install}"
    return install


class WaitTimeout(SpoolError):
    code = "TIMEOUT"
    exit_code = EXIT_TRANSIENT


class Conflict(SpoolError):
    code = "CONFLICT"
    exit_code = EXIT_CONFLICT


class IdempotencyConflict(SpoolError):
    code = "IDEMPOTENCY_CONFLICT"
    exit_code = EXIT_CONFLICT


ERROR_CLASSES: tuple[type[SpoolError], ...] = (
    InvalidInput,
    MissingRequired,
    NotFound,
    UnknownCommand,
    UnknownFlag,
    SafetyBlock,
    Internal,
    SchemaOutdated,
    SchemaTooNew,
    Locked,
    WaitTimeout,
    Conflict,
    IdempotencyConflict,
    StorageFault,
    Unreachable,
    ExtraMissing,
)
"""In the published order: a new code is appended, so a client that knows
the old ones in their order keeps working (docs/design.md)."""

ERROR_CODES: dict[str, int] = {cls.code: cls.exit_code for cls in ERROR_CLASSES}

WARNING_CODES: dict[str, str] = {
    "IDEMPOTENCY_METADATA_DIFFERS": (
        "an active job with this key was reused; only tags/note/schedule differ"
    ),
    "KILL_ASYNC": "the owning worker stops the process group at its next heartbeat",
    "NO_ATTEMPTS_YET": "the job has not run yet",
    "OUTPUT_PATH_REFUSED": "an attempt's recorded output path is outside the spool: not read",
    "DEPENDENCY_FAILED": "add --after-job: a job it waits for already ended dead or canceled",
    "NO_QUEUE": "no queue exists where --db points yet: a read verb's answer is empty",
    "CONFIG_UNKNOWN_KEY": "the config file holds keys this version does not know: ignored",
    "HERE_ENV_SKIPPED": "add --here left out variables a job's env cannot hold",
    "UNPLACEABLE": "the job asks for more than any live worker of its lane has: it waits",
}
