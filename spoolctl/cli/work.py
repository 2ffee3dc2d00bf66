"""`work`: run jobs of one lane until told to stop (or once, or to drain)."""

from __future__ import annotations

import gc
import sys
from typing import Any

import click

from spoolctl.cli.database import open_write
from spoolctl.cli.options import (
    BoundedInt,
    BoundedText,
    QueueName,
    Rule,
    Seconds,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.outages import outage_notice
from spoolctl.cli.render import ProgressLine
from spoolctl.cli.reply import Reply, emit
from spoolctl.cli.work_lines import (
    clearing,
    containment_notice,
    job_lines,
    json_lines,
    stopping_notice,
    with_inventory,
)
from spoolctl.config import Timing
from spoolctl.db.engine import RevisionMismatch
from spoolctl.db.outage import ONE_SHOT_WAIT_S
from spoolctl.db.queue import diagnose, prepare
from spoolctl.resources import Device
from spoolctl.runner import gpus
from spoolctl.validate import LIMITS, memory_size
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
        "spoolctl work --gpus all --memory 64G --concurrency 8",
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
    "--gpus",
    "gpu_spec",
    type=Rule("gpus", gpus.read_spec, {"grammar": gpus.SPEC_GRAMMAR, "max_length": gpus.SPEC_MAX}),
    default=None,
    help="GPUs to place jobs on: all (found through NVML, within CUDA_VISIBLE_DEVICES), none, "
    "or NVML indexes and UUIDs (0,1). Without it jobs' environment is left as it is.",
)
@click.option(
    "--memory",
    "memory_budget",
    type=Rule("size", memory_size, LIMITS["memory_bytes"]),
    default=None,
    help="Memory budget (64G): jobs' --memory is reserved against it.",
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
    gpu_spec: gpus.Spec | None,
    memory_budget: int | None,
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

    --gpus finds GPUs through NVML (the gpu extra: nvidia-ml-py). A job then
    sees CUDA_VISIBLE_DEVICES naming exactly the devices it was given (none:
    empty) and SPOOLCTL_GPUS their UUIDs (docs/operations.md).
    """
    timing = Timing.from_env()
    mode: Mode = "once" if once else "drain" if drain else "loop"
    devices = gpus.find(gpu_spec)
    queue_file = open_write(db)
    options = WorkerOptions(
        lane=queue,
        mode=mode,
        cap=slots,
        worker_id=worker_id,
        poll_interval_s=poll_interval,
        concurrency=concurrency,
        server_wait_s=None if mode == "loop" else ONE_SHOT_WAIT_S,
        gpus=devices,
        manages_gpus=gpu_spec is not None,
        memory_bytes=memory_budget,
    )
    inventory = inventory_data(options, looked=gpu_spec is not None)
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
        on_log=with_inventory(json_lines, inventory)
        if log_format == "json"
        else job_lines
        if text_log
        else None,
        on_containment=None
        if as_json or log_format == "json"
        else containment_notice(gpus.summary(devices, memory_budget, looked=gpu_spec is not None)),
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
    data = report_data(report, mode)
    if inventory is not None:
        data["inventory"] = inventory
    return emit(Reply(data, text=lambda: report_text(report, mode)), as_json)


def inventory_data(options: WorkerOptions, *, looked: bool) -> dict[str, Any] | None:
    """What a worker given --gpus (`looked`) or --memory places jobs on (its
    `--json` report's and its JSON log's `inventory`); None: neither."""
    devices: tuple[Device, ...] = options.gpus
    if not looked and options.memory_bytes is None:
        return None
    return {
        "slots": options.concurrency,
        "memory_bytes": options.memory_bytes,
        "gpus": len(devices),
        "devices": [d.as_dict() for d in devices],
    }


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
