"""What a verb answers, as one JSON envelope (contract version 2) or as text
for people, and its errors in the contract's words. Light (no click, no
SQLAlchemy): the lean path (`cli/lean.py`) answers through it too, so both
paths write the same bytes."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from spoolctl import __version__
from spoolctl.config import CONFIG_UNKNOWN_KEY, unknown_keys_message
from spoolctl.db.codec import json_text
from spoolctl.db.where import take_unknown_keys
from spoolctl.errors import (
    Conflict,
    ExtraMissing,
    IdempotencyConflict,
    Internal,
    InvalidInput,
    Locked,
    MissingRequired,
    NotFound,
    SchemaOutdated,
    SchemaTooNew,
    SpoolError,
    StorageFault,
    UnknownCommand,
    UnknownFlag,
    Unreachable,
    WaitTimeout,
)
from spoolctl.text import shown

CONTRACT_VERSION = "2"
_STARTED = time.monotonic()


class Reply:
    """What a verb answers: data for --json, text for people, and its exit
    code (a plain class: the lean path loads no dataclasses)."""

    __slots__ = ("data", "exit_code", "meta", "text", "warnings")

    def __init__(
        self,
        data: Any,
        text: str | Callable[[], str] | None = None,
        warnings: list[dict[str, str]] | None = None,
        exit_code: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.data = data
        self.text = text
        self.warnings = [] if warnings is None else warnings
        self.exit_code = exit_code
        self.meta = {} if meta is None else meta

    def warn(self, code: str, message: str) -> None:
        self.warnings.append({"code": code, "message": message})


def canonical_json(value: Any) -> str:
    return json_text(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def envelope(
    data: Any,
    *,
    errors: list[dict[str, Any]] | None = None,
    warnings: list[dict[str, str]] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import hashlib  # JSON answers only: text mode leaves these unloaded
    from datetime import UTC, datetime

    errors = errors or []
    payload = None if errors else data
    return {
        "ok": not errors,
        "tool_version": __version__,
        "data": payload,
        "meta": {
            "request_id": random_uuid_hex(),
            "ts_iso": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "elapsed_ms": int((time.monotonic() - _STARTED) * 1000),
            "contract_version": CONTRACT_VERSION,
            "data_hash": hashlib.sha256(canonical_json(payload).encode()).hexdigest(),
            **(meta or {}),
        },
        "warnings": warnings or [],
        "commands": [],
        "errors": errors,
    }


def random_uuid_hex() -> str:
    """A random (version 4) UUID's 32 hex digits, as `uuid.uuid4().hex`
    writes them, without loading uuid (whose import of platform costs a
    short-lived process more than the rest of its answer)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    return raw.hex()


LINE_BREAKS_IN_JSON = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
"""Characters JSON may leave raw but line-splitting readers (Python's
splitlines, some terminals) take for a line break: escaped, so an envelope is
always one line. The parsed value is the same."""


def write_json(obj: Any) -> None:
    text = json.dumps(obj, ensure_ascii=False, default=str).translate(LINE_BREAKS_IN_JSON)
    text = json_text(text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def emit(reply: Reply, as_json: bool) -> int:
    for path, keys in take_unknown_keys():
        reply.warn(CONFIG_UNKNOWN_KEY, unknown_keys_message(path, keys))
    if as_json:
        write_json(envelope(reply.data, warnings=reply.warnings, meta=reply.meta))
        return reply.exit_code
    text = reply.text() if callable(reply.text) else reply.text
    if text:
        echo(text)
    for warning in reply.warnings:
        message = shown(str(warning["message"]))
        echo(f"spoolctl: warning: {warning['code']}: {message}", err=True)
    return reply.exit_code


def error_object(exc: SpoolError, verb: str | None = None) -> dict[str, Any]:
    """One error: code, message, exit code and detail; `remediation` (the next
    step, as text mode's hint says it) and, for unknown verbs and flags,
    `did_you_mean`, where 0.4.11 put them."""
    found = {
        "code": exc.code,
        "message": exc.message,
        "exit_code": exc.exit_code,
        "detail": exc.detail,
        "remediation": error_hint(exc, verb) or "follow the message: it names the next step",
    }
    if exc.code in (UnknownFlag.code, UnknownCommand.code) or "did_you_mean" in exc.detail:
        found["did_you_mean"] = exc.detail.get("did_you_mean")
    return found


# What to do next, per error code, for people (text mode only; the JSON
# envelope is unchanged). Templates are tried in order and the first whose
# fields ({verb} and the error's detail keys) are all known is used. A code
# whose messages already name the next step (SAFETY_BLOCK names its flag) has
# no entry.
HINTS: dict[str, tuple[str, ...]] = {
    InvalidInput.code: (
        "run 'spoolctl {verb} --help' for accepted values and examples",
        "run 'spoolctl VERB --help' for accepted values and examples",
    ),
    MissingRequired.code: (
        "run 'spoolctl {verb} --help' for its usage and examples",
        "run 'spoolctl --help' for the verbs, 'spoolctl VERB --help' for one verb",
    ),
    NotFound.code: (
        "run 'spoolctl schedule list' for the schedules in this queue{name:.0}; "
        "'spoolctl config-show' says which queue file is used",
        "run 'spoolctl list' for the jobs in this queue; "
        "'spoolctl config-show' says which queue file is used",
    ),
    UnknownCommand.code: ("run 'spoolctl --help' for the list of verbs",),
    UnknownFlag.code: (
        "run 'spoolctl {verb} --help' for its flags",
        "run 'spoolctl VERB --help' for its flags",
    ),
    Internal.code: (
        "run 'spoolctl doctor' to check the queue file and spool folder; "
        "if it finds nothing wrong, please report this as a bug",
    ),
    SchemaOutdated.code: ("run 'spoolctl migrate' (it writes a backup first)",),
    SchemaTooNew.code: ("upgrade spoolctl; 'spoolctl migrate --status' shows the file's revision",),
    Locked.code: ("retry in a moment; SPOOLCTL_BUSY_TIMEOUT=SECONDS waits longer for the lock",),
    Unreachable.code: (
        "check that the server runs and this machine can reach it, then retry; "
        "'spoolctl doctor' checks the connection",
    ),
    ExtraMissing.code: ("install it with: {install}",),
    f"{StorageFault.code}:not_a_queue": (
        "point --db (or SPOOLCTL_DB, config db_path) at a spoolctl queue; "
        "'spoolctl config-show' says which one is used",
    ),
    f"{StorageFault.code}:damaged": (
        "stop the workers and restore the queue from a backup (migrate writes one beside it); "
        "'spoolctl doctor' runs an integrity check",
    ),
    f"{StorageFault.code}:unreadable": (
        "check the permissions of the file and its folder for this user",
    ),
    f"{StorageFault.code}:read_only": (
        # a server's (its detail names the database): a standby or a read-only one
        "point --db at the primary, or name every server in it with "
        "target_session_attrs=read-write so that the one taking writes is chosen{database:.0}",
        "make the file and its folder writable for this user, or remount the disk read-write",
    ),
    f"{StorageFault.code}:not_creatable": (
        "choose a --db whose folder can be created and written by this user",
    ),
    f"{StorageFault.code}:disk_full": (
        "free space on that disk: 'spoolctl prune' deletes old output",
    ),
    f"{StorageFault.code}:login_refused": (
        "check the user name and password in the URL (percent-encode reserved characters) "
        "and the server's pg_hba.conf",
    ),
    f"{StorageFault.code}:no_such_database": (
        "create the database first (createdb NAME), or fix the name in the URL",
    ),
    StorageFault.code: ("run 'spoolctl doctor' for what is wrong with the queue",),
    WaitTimeout.code: (
        "'spoolctl workers' shows whether job {job_id}'s worker still beats; a worker "
        "started on the queue reaps a dead one{request_id!s:.0}",
        "job {job_id} is still {state}: follow it again with a longer --idle-timeout, "
        "or see why with 'spoolctl show {job_id}'",
        "the jobs keep running: wait again with a longer --timeout, "
        "or watch them with 'spoolctl status --watch'",
    ),
    Conflict.code: (
        "run 'spoolctl show {job_id}' for its state and history",
        "pick another --worker-id; 'spoolctl workers' shows who holds {worker_id}",
    ),
    IdempotencyConflict.code: (
        "use another --key, or let job {job_id} finish first: 'spoolctl wait {job_id}'",
    ),
}


def error_hint(exc: SpoolError, verb: str | None) -> str | None:
    """The next step for a person, or None when the message already says it."""
    fields = {**exc.detail, **({"verb": verb} if verb else {})}
    reason = exc.detail.get("reason")
    templates = HINTS.get(f"{exc.code}:{reason}", ()) + HINTS.get(exc.code, ())
    for template in templates:
        try:
            hint = template.format_map(fields)
        except (KeyError, IndexError, AttributeError):
            continue
        commands = re.findall(r"'(spoolctl [^']*)'", hint)
        if any(command in exc.message for command in commands):
            return None
        return hint
    return None


def emit_error(exc: SpoolError, as_json: bool, verb: str | None = None) -> int:
    """JSON: one envelope. Text: `spoolctl: CODE: message` on one line, then
    an indented `hint:` line with what to do next (naming `verb`'s help where
    that helps), when there is one."""
    take_unknown_keys()  # the error is the answer
    if as_json:
        write_json(envelope(None, errors=[error_object(exc, verb)]))
        return exc.exit_code
    echo(f"spoolctl: {exc.code}: {shown(exc.message)}", err=True)
    hint = error_hint(exc, verb)
    if hint:
        echo(f"  hint: {shown(hint)}", err=True)
    return exc.exit_code


ANSI_STYLE = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")


def note_created(path: Path | None) -> None:
    """The one stderr line of an `add` that made a new queue where nothing
    named one (no --db, SPOOLCTL_DB or db_path), so it is not a surprise."""
    if path is not None and path.exists():
        echo(f"spoolctl: created a new queue at {path}", err=True)


def echo(text: str, *, err: bool = False) -> None:
    """One line to stdout (or stderr), flushed; styles removed where the
    stream is not a terminal (as click.echo does, which this stands for)."""
    stream: IO[str] = sys.stderr if err else sys.stdout
    if not stream.isatty():
        text = ANSI_STYLE.sub("", text)
    stream.write(text + "\n")
    stream.flush()
