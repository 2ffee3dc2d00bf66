"""What a running worker writes on stderr: for people, a line as each job
starts and ends (or is reaped), the notice of its containment and of what it
places jobs on, and the notice at the first stop signal; for machines, one
JSON line per record (`work --log-format json`, keys in docs/monitoring.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from spoolctl.cli.read_text import command_text
from spoolctl.cli.render import ProgressLine
from spoolctl.services.outcome import signal_name
from spoolctl.text import shown


def json_lines(record: dict[str, Any]) -> None:
    """One log record as one JSON line on stderr, flushed (a log shipper
    reads lines as they come)."""
    sys.stderr.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
    sys.stderr.flush()


def job_lines(record: dict[str, Any]) -> None:
    """A job's start or end (or a reap) as one line for people on stderr."""
    line = job_line(record)
    if line is not None:
        click.echo(line, err=True)


def job_line(record: dict[str, Any]) -> str | None:
    """The text of one log record (`worker/report.py`'s LogSink): None for
    what a person's log leaves out (containment is said once, by itself)."""
    event, job_id = record.get("event"), record.get("job_id")
    if event == "attempt_started":
        where = f"attempt {record['attempt_no']}"
        if record["error"] is not None:
            return f"job {job_id} {where} could not start: {shown(record['error'])}"
        return f"job {job_id} started ({where}, pid {record['pid']})"
    if event == "attempt_ended":
        took = elapsed(record["duration_s"])
        return f"job {job_id} ended: {ended_how(record)}, after {took} -> {after(record)}"
    if event == "reaped":
        dead = shown(record["dead_worker"])
        return f"job {job_id} reaped from dead worker {dead} -> {record['job_state']}"
    return None


def ended_how(record: dict[str, Any]) -> str:
    """How an attempt ended, in a few words: its exit, or the signal that ended it."""
    result, code, sig = record["result"], record["exit_code"], record["signal"]
    killed = None if sig is None else signal_name(sig)
    if result == "timeout":
        return f"timed out ({killed})" if killed else "timed out"
    if result == "worker_crash":
        return f"stopped by its worker ({killed})" if killed else "stopped by its worker"
    if result == "lost_ownership" and code is None and killed is None:
        return "killed"
    if killed is not None and code is not None and code < 0:
        return f"killed by {killed}"
    if code is not None:
        return f"exit {code}"
    return f"killed by {killed}" if killed else shown(result)


def after(record: dict[str, Any]) -> str:
    """The job's state after the attempt, and what it means for the job."""
    state = record["job_state"]
    if state is None:
        return "taken from this worker (canceled, retried or reaped)"
    if state == "queued" and record["result"] == "worker_crash":
        return "queued (a worker crash: its retries are kept)"
    if state == "queued":
        return "queued for a retry"
    return str(state)


def elapsed(seconds: float | None) -> str:
    """1.2s, 12s, 3m05s, 2h04m."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


SHOWN_COMMAND = 40
"""How much of a job's command the stop notice shows."""
SHOWN_JOBS = 10
"""How many of the jobs it waits for the stop notice names."""


def clearing(
    progress: ProgressLine, tell: Callable[[list[tuple[int, list[str]]]], None]
) -> Callable[[list[tuple[int, list[str]]]], None]:
    """`tell`, on a line of its own: the progress line (if drawn) is cleared
    first and drawn again at its next update."""

    def told(waited: list[tuple[int, list[str]]]) -> None:
        progress.done()
        tell(waited)

    return told


def stopping_notice(waited: list[tuple[int, list[str]]]) -> None:
    """At the first Ctrl-C (or SIGTERM): what the worker waits for, and how
    to stop it now."""
    jobs = ", ".join(f"{job_id} ({short_command(argv)})" for job_id, argv in waited[:SHOWN_JOBS])
    if len(waited) > SHOWN_JOBS:
        jobs += f" and {len(waited) - SHOWN_JOBS} more"
    what = "job" if len(waited) == 1 else f"{len(waited)} jobs"
    them = "it" if len(waited) == 1 else "them"
    click.echo(
        f"stopping: waiting for the running {what} to end: {jobs}\n"
        f"press Ctrl-C again (or send SIGTERM) to kill {them} now; "
        "killed jobs are requeued as a worker crash, their retries kept",
        err=True,
    )


def short_command(argv: list[str]) -> str:
    text = command_text(argv)
    return text if len(text) <= SHOWN_COMMAND else text[: SHOWN_COMMAND - 1] + "…"


def containment_notice(placing: str | None) -> Callable[[Any], None]:
    """Said once, on stderr, as the worker starts: which containment its jobs
    get, and why; then what it places them on (`placing`), where it has GPUs
    or a memory budget."""

    def tell(status: Any) -> None:
        click.echo(status.line(), err=True)
        if placing is not None:
            click.echo(placing, err=True)

    return tell


def with_inventory(
    sink: Callable[[dict[str, Any]], None], inventory: dict[str, Any] | None
) -> Callable[[dict[str, Any]], None]:
    """The JSON log, with an `inventory` record after the `containment` one
    where the worker has GPUs or a memory budget (`inventory`)."""
    if inventory is None:
        return sink

    def logged(record: dict[str, Any]) -> None:
        sink(record)
        if record.get("event") == "containment":
            told = {"event": "inventory", "at": record["at"], "worker_id": record["worker_id"]}
            sink({**told, **inventory})

    return logged
