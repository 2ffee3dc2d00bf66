"""`output`: what a job's attempt printed, as a framed preview, or with --raw
the bytes as they are (`output --follow` is `follow.py`'s).

Reads go through the queue's output reader (`Queue.output()`): the files, or
on PostgreSQL the copy stored in the database, so they work from any
machine; streams then carry `source`, `stored_bytes` and `stored_truncated`
besides the usual keys. A stream whose row names a path outside the spool's
output folder is not read (warning OUTPUT_PATH_REFUSED).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import click
from sqlalchemy import Connection

from spoolctl.cli.database import no_job, open_read
from spoolctl.cli.events import DEFAULT_IDLE_TIMEOUT_S
from spoolctl.cli.options import JOB_ID, BoundedInt, Duration, db_option, json_option, verb
from spoolctl.cli.render import Reply, emit, style
from spoolctl.config import OUTPUT_CAP_ENV as CAP_ENV
from spoolctl.db.backends.base import OutputReader
from spoolctl.db.queue import Queue
from spoolctl.errors import InvalidInput
from spoolctl.services.attempt_output import STREAMS, AttemptOutput, confine, find_attempt
from spoolctl.text import shown
from spoolctl.validate import MAX_WAIT_S

STREAM_CHOICE = click.Choice(["stdout", "stderr", "both"])


def selected(stream: str) -> tuple[str, ...]:
    return STREAMS if stream == "both" else (stream,)


def open_existing(db: str | None, job_id: int) -> Queue:
    found = open_read(db)
    if found is None:
        raise no_job(job_id, db)
    return found


@verb(
    "output",
    exclusive=(("raw", "as_json"),),
    examples=(
        "spoolctl output 42",
        "spoolctl output 42 --attempt 1 --stream stderr --raw > err.log",
        "spoolctl output 42 --follow",
    ),
)
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--attempt",
    "attempt_no",
    type=BoundedInt(1, None),
    default=None,
    help="Attempt number (default: the latest).",
)
@click.option(
    "--stream", type=STREAM_CHOICE, default="both", show_default=True, help="Which captured stream."
)
@click.option(
    "--raw", is_flag=True, help="Write the bytes unframed (both: stderr's bytes to stderr)."
)
@click.option(
    "--follow",
    is_flag=True,
    help="Stream a running attempt until it ends; a job not started yet: its first"
    " attempt, once it starts.",
)
@click.option(
    "--idle-timeout",
    type=Duration(MAX_WAIT_S),
    default=None,
    help="With --follow: give up after this long with nothing to follow (no attempt"
    f" yet, or the server unreachable); default {DEFAULT_IDLE_TIMEOUT_S}"
    " (as events --follow).",
)
@db_option
@json_option
def output(
    job_id: int,
    attempt_no: int | None,
    stream: str,
    raw: bool,
    follow: bool,
    idle_timeout: float | None,
    db: str | None,
    as_json: bool,
) -> int:
    """A job's captured stdout and stderr: its latest attempt's (or --attempt N's).

    --follow on a job that has no attempt yet waits for its first (a job that
    ends without one answers as without --follow, warning NO_ATTEMPTS_YET);
    after --idle-timeout it gives up with TIMEOUT (exit 4). It rides out a
    server restart or a lost connection (PostgreSQL), going on from the
    bytes it printed; SIGINT or SIGTERM ends it with the control frame
    `interrupted`.
    """
    names = selected(stream)
    if follow:
        from spoolctl.cli.follow import follow_job  # it builds on this module's answer

        bound = DEFAULT_IDLE_TIMEOUT_S if idle_timeout is None else idle_timeout
        return follow_job(db, job_id, attempt_no, names, (as_json, bound, raw))
    if idle_timeout is not None:
        raise InvalidInput("--idle-timeout only applies with --follow", flag="--idle-timeout")
    queue = open_existing(db, job_id)
    found = queue.read(lambda conn: find_attempt(conn, job_id, attempt_no))
    ref = confine(found, queue.output_root)
    if ref.attempt_no is not None and raw:
        return write_raw(queue, ref, names)
    return emit(output_reply(queue, ref, names), as_json)


def output_reply(queue: Queue, ref: AttemptOutput, names: tuple[str, ...]) -> Reply:
    data: dict[str, Any] = {
        "job_id": ref.job_id,
        "attempt_no": ref.attempt_no,
        "attempt_state": ref.state,
        "attempts_total": ref.attempts_total,
    }
    if ref.attempt_no is None:
        reply = Reply(
            {**data, "attempts": [], "streams": {}}, text=f"job {ref.job_id} has not run yet"
        )
        reply.warn("NO_ATTEMPTS_YET", f"job {ref.job_id} has no attempt yet")
        return reply
    reader = queue.output()
    data["streams"] = queue.read(
        lambda conn: {name: reader.preview(conn, ref, name) for name in names}
    )
    reply = Reply(data, text=lambda: output_text(data))
    refuse_outside(queue, reply, ref, data["streams"])
    return reply


def refuse_outside(queue: Queue, reply: Reply, ref: AttemptOutput, streams: dict[str, Any]) -> None:
    """Name each stream left unread because its row points outside the spool
    (a reader of the database's copy reads it wherever the file is)."""
    if not queue.output().reads_local_files:
        return
    for name, path in ref.refused.items():
        if name in streams:
            streams[name]["path"] = path
            reply.warn("OUTPUT_PATH_REFUSED", refusal(ref, name, path))


def refusal(ref: AttemptOutput, name: str, path: str) -> str:
    return (
        f"{name} of job {ref.job_id} attempt {ref.attempt_no} is recorded as {shown(path)}, "
        "outside the spool's output folder: not read"
    )


def output_text(data: dict[str, Any]) -> str:
    """Each stream's header and preview; the preview keeps its newlines and
    tabs, every other control character (escape sequences, \\r) is shown
    escaped: `--raw` writes the bytes as they are."""
    parts = []
    for name, info in data["streams"].items():
        head = f"== {name} of job {data['job_id']} attempt {data['attempt_no']}"
        state = shown(data["attempt_state"])
        parts.append(style(f"{head} ({state}, {info['size_bytes']} bytes) ==", bold=True))
        preview = shown(info["preview"].rstrip("\n"), keep_newlines=True)
        parts.append(preview if not info["missing"] else "(no file)")
        if info["preview_truncated"]:
            parts.append(f"... truncated; `--raw` prints all {info['size_bytes']} bytes")
        if info.get("stored_truncated") and info["source"] == "database":
            parts.append(cut_note(name, info["stored_bytes"], info["path"]))
    return "\n".join(parts)


def cut_note(name: str, stored: int, path: str) -> str:
    return (
        f"... {name} was cut at {stored} bytes in the database ({CAP_ENV});"
        f" the rest is only in the worker's file {shown(path)}"
    )


def write_raw(queue: Queue, ref: AttemptOutput, names: tuple[str, ...]) -> int:
    """Bytes as captured; with both streams, stderr's bytes go to our stderr.
    Says so on stderr when a stream was not read (outside the spool) or its
    stored copy was cut at the cap."""
    reader = queue.output()
    for name in names:
        sink = sys.stderr.buffer if name == "stderr" and len(names) == 2 else sys.stdout.buffer
        if name in ref.refused and reader.reads_local_files:
            click.echo(f"spoolctl: warning: {refusal(ref, name, ref.refused[name])}", err=True)
        facts = queue.read(partial(copy_stream, reader, ref, name, sink))
        sink.flush()
        if facts.get("stored_truncated") and facts["source"] == "database":
            note = cut_note(name, facts["stored_bytes"], ref.recorded_path(name))
            click.echo(f"spoolctl: warning: {note.removeprefix('... ')}", err=True)
    return 0


def copy_stream(
    reader: OutputReader, ref: AttemptOutput, name: str, sink: Any, conn: Connection
) -> dict[str, Any]:
    return reader.copy_to(conn, ref, name, sink)
