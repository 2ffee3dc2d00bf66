"""Read-only verbs: they never take the write lock and never create a queue."""

from __future__ import annotations

import time
from typing import Any

import click

from spoolctl.cli.options import JOB_ID, BoundedInt, db_option, json_option, verb
from spoolctl.cli.queues import open_read
from spoolctl.cli.render import Reply, age, emit, local_time, style, table
from spoolctl.errors import NotFound
from spoolctl.services import query
from spoolctl.states import JobState

STATE_COLORS = {"done": "green", "dead": "red", "running": "cyan", "canceled": "yellow"}


def empty_status() -> dict[str, Any]:
    return {
        "counts": {s.value: 0 for s in JobState},
        "scheduled": 0,
        "queues": {},
        "recent_dead": [],
        "workers": [],
    }


@verb(
    "status",
    examples=("spoolctl status", "spoolctl status --json"),
)
@click.option("--limit", type=BoundedInt(0, 1000), default=10, show_default=True,
              help="Recent dead jobs shown (0: all).")  # fmt: skip
@db_option
@json_option
def status(limit: int, db: str | None, as_json: bool) -> int:
    """Counts per state, scheduled jobs, queues, recent dead jobs, live workers."""
    queue = open_read(db)
    now = time.time()
    data = (
        empty_status()
        if queue is None
        else queue.read(lambda conn: query.status_summary(conn, now, dead_limit=limit))
    )
    return emit(Reply(data, text=lambda: status_text(data, now)), as_json)


def status_text(data: dict[str, Any], now: float) -> str:
    counts = data["counts"]
    parts = [f"{style(k, fg=STATE_COLORS.get(k))} {v}" for k, v in counts.items() if k != "failed"]
    lines = ["jobs: " + "  ".join(parts) + f"  (scheduled {data['scheduled']})"]
    if data["queues"]:
        rows = [
            [name, str(q["counts"]["queued"]), str(q["counts"]["running"]), str(q["scheduled"])]
            for name, q in sorted(data["queues"].items())
        ]
        lines += ["", table(["QUEUE", "QUEUED", "RUNNING", "SCHEDULED"], rows)]
    if data["recent_dead"]:
        rows = [
            [str(d["id"]), " ".join(d["command"] or ["?"])[:50], str(d["attempts"]),
             (d["last_error"] or "")[:40], age(d["finished_at"], now)]
            for d in data["recent_dead"]
        ]  # fmt: skip
        lines += ["", table(["DEAD", "COMMAND", "ATTEMPTS", "LAST ERROR", "FINISHED"], rows)]
    workers = data["workers"]
    lines += ["", f"workers: {len(workers)} live"]
    if workers:
        rows = [
            [w["id"], w["queue"], str(w["pid"]), ",".join(map(str, w["running_jobs"])) or "-",
             f"{w['heartbeat_age_s']:.1f}s"]
            for w in workers
        ]  # fmt: skip
        lines.append(table(["WORKER", "QUEUE", "PID", "JOBS", "HEARTBEAT"], rows))
    return "\n".join(lines)


@verb("show", examples=("spoolctl show 42", "spoolctl show 42 --json"))
@click.argument("job_id", type=JOB_ID)
@db_option
@json_option
def show(job_id: int, db: str | None, as_json: bool) -> int:
    """One job with every column, its attempts and its events."""
    queue = open_read(db)
    detail = None if queue is None else queue.read(lambda conn: query.job_detail(conn, job_id))
    if detail is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    return emit(Reply(detail, text=lambda: show_text(detail)), as_json)


def show_text(detail: dict[str, Any]) -> str:
    job = detail["job"]
    argv = job["argv"]
    lines = [
        f"job {job['id']}  {style(job['state'], fg=STATE_COLORS.get(job['state']), bold=True)}"
        f"  queue {job['queue']}  priority {job['priority']}",
        f"  command   {' '.join(argv) if argv else '(damaged)'}",
        f"  created   {local_time(job['created_at'])}",
        f"  next run  {local_time(job['next_run_at'])}",
        f"  attempts  {job['attempts']} (crashes {job['crashes']}) of max_retries "
        f"{job['max_retries']}, max_crashes {job['max_crashes']}",
        f"  timeout   {job['timeout_seconds']}s",
    ]
    for label in ("cwd", "idempotency_key", "note", "last_error"):
        if job.get(label):
            lines.append(f"  {label:<9} {job[label]}")
    if job.get("env"):
        lines.append("  env       " + " ".join(f"{k}={v}" for k, v in job["env"].items()))
    if job.get("tags"):
        lines.append("  tags      " + " ".join(f"{k}={v}" for k, v in job["tags"].items()))
    for problem in job.get("damaged", []):
        lines.append(style(f"  damaged   {problem}", fg="red"))
    if detail["attempts"]:
        rows = [
            [str(a["attempt_no"]), a["state"], a["failure_reason"] or "-",
             "-" if a["exit_code"] is None else str(a["exit_code"]),
             local_time(a["started_at"]), a["worker_id"]]
            for a in detail["attempts"]
        ]  # fmt: skip
        lines += ["", table(["#", "STATE", "REASON", "EXIT", "STARTED", "WORKER"], rows)]
    return "\n".join(lines)
