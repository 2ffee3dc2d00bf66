"""`output --follow`: a running attempt's bytes as they arrive, until it ends.

A job with no attempt yet is waited for, up to --idle-timeout. Every read
rides out a server's outages (`db/outage.py`) and printing goes on from the
bytes already printed; with --json the stream of frames ends with one
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

from spoolctl.cli.outages import outage_notice
from spoolctl.cli.output import open_existing, output_reply
from spoolctl.cli.render import emit, write_json
from spoolctl.config import OUTPUT_CAP_ENV as CAP_ENV
from spoolctl.config import Timing
from spoolctl.db.outage import Reconnecting
from spoolctl.db.queue import Queue
from spoolctl.errors import SpoolError, WaitTimeout
from spoolctl.runner.wakeup import StopRequested, counting_signals
from spoolctl.services.attempt_output import AttemptOutput, confine, find_attempt
from spoolctl.services.query import get_job_row
from spoolctl.states import TERMINAL_JOB_STATES, AttemptState
from spoolctl.text import shown

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
