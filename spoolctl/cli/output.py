"""`output`: what a job's attempt printed, as a framed preview, or with --raw
the bytes as they are; with --follow, a running attempt's bytes as they
arrive, until it ends.

Reads go through the queue's output reader (`Queue.output()`): the files, or
on PostgreSQL the copy stored in the database, so they work from any
machine; streams then carry `source`, `stored_bytes` and `stored_truncated`
besides the usual keys. A stream whose row names a path outside the spool's
output folder is not read (warning OUTPUT_PATH_REFUSED).

`--follow` waits for a job with no attempt yet, up to --idle-timeout. Every
read rides out a server's outages (`db/outage.py`) and printing goes on from
the bytes already printed; with --json the stream of frames ends with one
control frame (`end`, or `error` when the server stayed out of reach).
"""

from __future__ import annotations

import codecs
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeVar

import click
from sqlalchemy import Connection

from spoolctl.cli.database import no_job, open_read
from spoolctl.cli.events import DEFAULT_IDLE_TIMEOUT_S
from spoolctl.cli.options import JOB_ID, BoundedInt, Duration, db_option, json_option, verb
from spoolctl.cli.outages import outage_notice
from spoolctl.cli.render import style
from spoolctl.cli.reply import Reply, emit, write_json
from spoolctl.config import OUTPUT_CAP_ENV as CAP_ENV
from spoolctl.config import Timing
from spoolctl.db.backends.base import OutputReader
from spoolctl.db.outage import Reconnecting
from spoolctl.db.queue import Queue
from spoolctl.errors import InvalidInput, SpoolError, WaitTimeout
from spoolctl.runner.wakeup import StopRequested, counting_signals
from spoolctl.services.attempt_output import STREAMS, AttemptOutput, confine, find_attempt
from spoolctl.services.query import get_job_row
from spoolctl.states import TERMINAL_JOB_STATES, AttemptState
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


FOLLOW_POLL_S = 0.1
FOLLOW_CHUNK = 65_536
ChunkReader = Callable[[str, int], bytes]
"""The next bytes of a stream from an offset (empty: none yet)."""
T = TypeVar("T")


class Reading(Protocol):
    """Runs one read of the database (for the follower: through outages)."""

    def __call__(self, fn: Callable[[], T]) -> T: ...


def follow_job(
    db: str | None,
    job_id: int,
    attempt_no: int | None,
    names: tuple[str, ...],
    mode: tuple[bool, float, bool],
) -> int:
    """`output --follow`. mode: (as_json, idle timeout, raw)."""
    with counting_signals() as signals:
        follower = OutputFollower(db, job_id, names, mode, Reconnecting(signals, outage_notice()))
        try:
            return follower.run(attempt_no)
        except StopRequested:
            return end_follow(mode[0], "interrupted", follower.state, set())


class OutputFollower:
    """Follows one job's output through a server's outages (`db/outage.py`):
    every read is tried again until the idle timeout passes, and printing
    goes on from the byte offsets already printed."""

    def __init__(
        self,
        db: str | None,
        job_id: int,
        names: tuple[str, ...],
        mode: tuple[bool, float, bool],
        server: Reconnecting,
    ) -> None:
        self.db = db
        self.job_id = job_id
        self.names = names
        self.as_json, self.idle_timeout, raw = mode
        self.printer = FollowPrinter(self.as_json, raw, two_streams=len(names) == 2)
        self.server = server
        self.state: str | None = None
        """The followed attempt's state, as last read."""

    def run(self, attempt_no: int | None) -> int:
        deadline = time.monotonic() + self.idle_timeout
        queue = self.server.call(
            partial(self._read, lambda: open_existing(self.db, self.job_id)), give_up_at=deadline
        )
        ref = self._attempt(queue, attempt_no, deadline)
        if ref.attempt_no is None:
            return emit(output_reply(queue, ref, self.names), self.as_json)
        try:
            return self._stream(queue, ref)
        except SpoolError as exc:  # frames are out: end the stream with a frame
            return error_follow(self.as_json, exc, self.state)

    def _read(self, fn: Callable[[], T]) -> T:
        """A read of the database; a stop signal cuts it short (it prints
        nothing, so nothing is left half-written)."""
        with self.server.signals.interruptible():
            return fn()

    def _call(self, fn: Callable[[], T]) -> T:
        """A read, tried again for up to the idle timeout into an outage."""
        return self.server.call(partial(self._read, fn), patience_s=self.idle_timeout)

    def _attempt(self, queue: Queue, attempt_no: int | None, deadline: float) -> AttemptOutput:
        """The attempt to follow, once there is one: a job with none yet is
        waited for until it has one or ends without one (then the returned
        ref has no attempt), at most until the deadline (then TIMEOUT)."""
        look = partial(attempt_or_end, self.job_id, attempt_no)
        while True:
            found, state = self.server.call(
                partial(self._read, lambda: queue.read(look)), give_up_at=deadline
            )
            if found.attempt_no is not None or state in TERMINAL_JOB_STATES:
                return confine(found, queue.output_root)
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"job {self.job_id} has not started within {self.idle_timeout:g}s"
                    " (--idle-timeout)",
                    job_id=self.job_id,
                    state=state,
                )
            self.server.pause(FOLLOW_POLL_S)

    def _stream(self, queue: Queue, ref: AttemptOutput) -> int:
        """Print new bytes as they arrive until the attempt is no longer running.

        Bounded: a running attempt ends by itself, by its timeout, or by a
        reap; if its owner falls silent for longer than the reap threshold
        (counted from the end of an outage this follower saw, when the
        owner could not heartbeat either), following stops with reason
        `owner_silent` instead of waiting for a reaper that may never come.
        """
        offsets = dict.fromkeys(self.names, 0)
        silent_after = Timing.from_env().reap_threshold_s
        clock = queue.clock()  # heartbeats are stamped by the server's clock on PostgreSQL
        cut: set[str] = set()
        read = output_reader(queue, ref, cut, self._call)
        heard_from = -math.inf
        while True:
            outages = self.server.outages
            self.state, heartbeat = self._call(
                lambda: queue.read(lambda conn: attempt_liveness(conn, ref))
            )
            pump(read, offsets, self.printer)
            if self.server.outages != outages:
                heard_from = clock()
            if self.state != AttemptState.RUNNING:
                return end_follow(self.as_json, "attempt_ended", self.state, cut)
            if heartbeat is not None and clock() - max(heartbeat, heard_from) > silent_after:
                return end_follow(self.as_json, "owner_silent", self.state, cut)
            self.server.pause(FOLLOW_POLL_S)


def attempt_or_end(
    job_id: int, attempt_no: int | None, conn: Any
) -> tuple[AttemptOutput, str | None]:
    """The job's attempt (or the latest) and the job's state, in one snapshot."""
    found = find_attempt(conn, job_id, attempt_no)
    job = get_job_row(conn, job_id)
    return found, None if job is None else job.state


def output_reader(queue: Queue, ref: AttemptOutput, cut: set[str], through: Reading) -> ChunkReader:
    """Reads the queue's output (a database copy is stored by the time its
    attempt is seen ended, so the last poll gets all of it). Streams whose
    stored copy was cut at the cap are added to `cut`. Each read goes
    `through` the caller (which rides out outages)."""
    reader = queue.output()

    def read_chunk(conn: Connection, name: str, offset: int) -> bytes:
        data = reader.read(conn, ref, name, offset, FOLLOW_CHUNK)
        if not data and reader.cut_at_cap(conn, ref, name):
            cut.add(name)
        return data

    def read(name: str, offset: int) -> bytes:
        return through(lambda: queue.read(lambda conn: read_chunk(conn, name, offset)))

    return read


def attempt_liveness(conn: Any, ref: AttemptOutput) -> tuple[str | None, float | None]:
    latest = find_attempt(conn, ref.job_id, ref.attempt_no)
    job = get_job_row(conn, ref.job_id)
    return latest.state, None if job is None else job.heartbeat_at


def pump(read: ChunkReader, offsets: dict[str, int], printer: FollowPrinter) -> None:
    for name in offsets:
        while chunk := read(name, offsets[name]):
            printer.write(name, offsets[name], chunk)
            offsets[name] += len(chunk)


class FollowPrinter:
    """Where followed bytes go: NDJSON frames with --json; the bytes as they
    are with --raw; otherwise text for a person, every control character a
    job wrote shown escaped but newline and tab (an escape sequence reaches
    the terminal as text, never as a command), decoded as it comes so a
    character split between two reads stays whole. With both streams,
    stderr's go to stderr."""

    def __init__(self, as_json: bool, raw: bool, *, two_streams: bool) -> None:
        self.as_json, self.raw, self.two_streams = as_json, raw, two_streams
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def write(self, name: str, offset: int, chunk: bytes) -> None:
        if self.as_json:
            text = chunk.decode("utf-8", errors="replace")
            write_json({"stream": name, "offset": offset, "text": text})
            return
        sink = sys.stderr.buffer if name == "stderr" and self.two_streams else sys.stdout.buffer
        if not self.raw:
            decoder = self._decoders.setdefault(name, UTF8_AS_IS(errors="surrogateescape"))
            chunk = shown(decoder.decode(chunk), keep_newlines=True).encode()
        sink.write(chunk)
        sink.flush()


UTF8_AS_IS = codecs.getincrementaldecoder("utf-8")


def error_follow(as_json: bool, exc: SpoolError, state: str | None) -> int:
    """The stream ends on an error (a server unreachable for longer than the
    idle timeout): a control frame of type `error`; the error's exit code."""
    if as_json:
        control = {"type": "error", "reason": exc.code, "message": exc.message}
        write_json({"control": {**control, "attempt_state": state}})
    else:
        click.echo(f"spoolctl: output ended: {exc.code}: {exc.message}", err=True)
    return exc.exit_code


def end_follow(as_json: bool, reason: str, state: str | None, cut: set[str]) -> int:
    """The end frame; on PostgreSQL it names the streams whose stored copy
    was cut at the cap (`stored_truncated`)."""
    if as_json:
        control: dict[str, Any] = {"type": "end", "reason": reason, "attempt_state": state}
        if cut:
            control["stored_truncated"] = sorted(cut)
        write_json({"control": control})
    else:
        click.echo(f"spoolctl: output ended: {reason} (attempt {state})", err=True)
        for name in sorted(cut):
            click.echo(
                f"spoolctl: warning: {name} was cut at the cap in the database"
                f" ({CAP_ENV}); the rest is only in the worker's file",
                err=True,
            )
    return 0
