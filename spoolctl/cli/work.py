"""`work`: run jobs of one lane until told to stop (or once, or to drain)."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from spoolctl.cli.database import open_write
from spoolctl.cli.options import (
    BoundedInt,
    BoundedText,
    QueueName,
    Seconds,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.outages import outage_notice
from spoolctl.cli.read_text import command_text
from spoolctl.cli.render import ProgressLine
from spoolctl.cli.reply import Reply, emit
from spoolctl.config import Timing
from spoolctl.db.engine import RevisionMismatch
from spoolctl.db.outage import ONE_SHOT_WAIT_S
from spoolctl.db.queue import diagnose, prepare
from spoolctl.services.outcome import signal_name
from spoolctl.text import shown
from spoolctl.worker import AttemptResult, Mode, Worker, WorkerOptions, WorkReport

MAX_CONCURRENCY = 256


@verb(
    "work",
    for_people=("quiet", "verbose"),
    exclusive=(("once", "drain"), ("quiet", "verbose")),
    mutates=True,
    idempotent=False,
    examples=(
        "spoolctl work",
        "spoolctl work --drain --concurrency 4",
        "spoolctl work --queue gpu --slots 1",
    ),
)
@click.option("--once", is_flag=True, help="Run at most one job, then exit.")
@click.option("--drain", is_flag=True, help="Run until the lane is settled, then exit.")
@click.option(
    "--queue",
    type=QueueName(),
    default="default",
    show_default=True,
    help="The one lane this worker serves.",
)
@click.option(
    "--slots",
    type=BoundedInt(1, None),
    default=None,
    help="The lane's cap: running jobs of the lane across all workers.",
)
@click.option(
    "--worker-id",
    type=BoundedText("worker id", 256),
    default=None,
    help="Name of this worker (default: host-pid-random).",
)
@click.option(
    "--poll-interval",
    type=Seconds(0, 3600),
    default=1.0,
    show_default=True,
    help="Longest idle wait between full claim attempts; new jobs wake it sooner.",
)
@click.option(
    "--concurrency",
    type=BoundedInt(1, MAX_CONCURRENCY),
    default=1,
    show_default=True,
    help="Jobs this one worker process runs at once.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line on stderr for each attempt's start and end and each reap.",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="No line per job start and end on a terminal (the report lists failures only).",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="A line per job start and end on stderr even when it is not a terminal.",
)
@db_option
@json_option
def work(
    once: bool,
    drain: bool,
    queue: str,
    slots: int | None,
    worker_id: str | None,
    poll_interval: float,
    concurrency: int,
    log_format: str,
    quiet: bool,
    verbose: bool,
    db: str | None,
    as_json: bool,
) -> int:
    """Claim and run jobs of one lane.

    Without --once or --drain it runs until SIGINT/SIGTERM (Ctrl-C): the
    first signal lets running jobs finish and be recorded, and says on
    stderr which jobs it waits for; a second kills their process groups and
    requeues each job as a worker crash (counted against --max-crashes, not
    its retries). Before each claim the worker reaps jobs of workers that
    died.

    When stderr is a terminal, the worker writes one line on stderr as each
    job starts and one as it ends (its id, its exit or how it ended, the
    time it took, and the job's state after); --quiet leaves them out,
    --verbose writes them when stderr is not a terminal too (a pipe, a log
    file). The report at the end lists the attempts that did not succeed.

    A PostgreSQL server that cannot be reached when the worker starts is
    waited for, trying again after 0.5 s, doubling to 10 s between tries:
    without end, or up to 60 s with --once or --drain (then UNREACHABLE,
    exit 4). A refused login or a missing database is not waited for
    (DB_UNUSABLE, exit 3).
    """
    timing = Timing.from_env()
    mode: Mode = "once" if once else "drain" if drain else "loop"
    queue_file = open_write(db)
    options = WorkerOptions(
        lane=queue,
        mode=mode,
        cap=slots,
        worker_id=worker_id,
        poll_interval_s=poll_interval,
        concurrency=concurrency,
        server_wait_s=None if mode == "loop" else ONE_SHOT_WAIT_S,
    )
    text_log = log_format == "text" and (verbose or (not quiet and sys.stderr.isatty()))
    progress = ProgressLine(as_json or mode != "drain" or log_format == "json" or text_log)
    worker = Worker(
        queue_file,
        options,
        timing,
        on_result=(lambda report: progress.update(drain_progress(report)))
        if progress.active
        else None,
        prepare=lambda: prepare(queue_file.driver),
        on_wait=outage_notice(),
        on_log=json_lines if log_format == "json" else job_lines if text_log else None,
        on_containment=None if as_json or log_format == "json" else containment_notice,
        on_stopping=None if log_format == "json" else clearing(progress, stopping_notice),
    )
    # A worker lives long: collect cycles again, but never rescan what import made.
    gc.freeze()
    gc.enable()
    try:
        report = worker.run()
    except RevisionMismatch:
        diagnose(queue_file.driver)
        raise
    finally:
        progress.done()
    return emit(Reply(report_data(report, mode), text=lambda: report_text(report, mode)), as_json)


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


def containment_notice(status: Any) -> None:
    """Said once, on stderr, as the worker starts: which containment its jobs
    get, and why."""
    click.echo(status.line(), err=True)


def report_data(report: WorkReport, mode: str) -> dict[str, Any]:
    executed = report.executed
    if mode == "once":
        last = report.last
        if last is None:
            return {"claimed": False}
        return {
            "claimed": True,
            "job_id": last.job_id,
            "attempt_no": last.attempt_no,
            "result": last.result,
            "job_state": last.job_state,
        }
    data: dict[str, Any] = {"executed": executed, "worker_id": report.worker_id}
    if mode == "drain":
        data["drained"] = report.drained
        data["paused"] = report.paused
    else:
        data["stopped"] = True
    data["stopped_by_signal"] = report.stopped_by_signal
    data["timings"] = timings_data(report)
    return data


def timings_data(report: WorkReport) -> dict[str, Any]:
    """Where the worker's time went (worker/report.py's WorkTimings), in
    seconds, over the `jobs` attempts it started: what a benchmark splits
    per job."""
    timings = report.timings
    return {
        "db_s": round(timings.db.total_s, 6),
        "spawn_s": round(timings.spawn.total_s, 6),
        "wall_s": round(timings.wall.total_s, 6),
        "jobs": report.claimed,
    }


def attempts(count: int) -> str:
    return f"{count} attempt" + ("" if count == 1 else "s")


def drain_progress(report: WorkReport) -> str:
    summary = ", ".join(f"{n} {label}" for label, n in report.tally.most_common())
    return f"draining: {attempts(report.executed)} ({summary})"


def report_text(report: WorkReport, mode: str) -> str:
    """One line per attempt that did not succeed (the newest UNSUCCESSFUL_KEPT,
    and how many older ones are not listed), then a summary line."""
    if mode == "once":
        return "nothing to run" if report.last is None else _result_line(report.last)
    lines = []
    if report.unlisted:
        n = report.unlisted
        were = "attempt that did not succeed is" if n == 1 else "attempts that did not succeed are"
        lines.append(f"({n} earlier {were} not listed)")
    lines += [_result_line(r) for r in report.unsuccessful]
    verb = "drained" if mode == "drain" else "stopped"
    if report.paused and not report.drained:
        verb = "lane paused (spoolctl resume to go on); stopped"
    lines.append(f"{verb}: {attempts(report.executed)}, {report.succeeded} succeeded")
    return "\n".join(lines)


def _result_line(r: AttemptResult) -> str:
    return f"job {r.job_id} attempt {r.attempt_no}: {r.result} -> {r.job_state or '-'}"
