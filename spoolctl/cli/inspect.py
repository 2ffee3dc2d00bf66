"""Read-only verbs: they never take the write lock and never create a queue."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

import click

from spoolctl import validate
from spoolctl.cli.options import (
    JOB_ID,
    TAG_FILTER,
    BoundedInt,
    Duration,
    QueueName,
    Seconds,
    StateList,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.outages import waits_text
from spoolctl.cli.queues import open_read
from spoolctl.cli.render import ProgressLine, Reply, age, emit, local_time, style, table
from spoolctl.errors import EXIT_JOB_UNSUCCESSFUL, EXIT_OK, NotFound, WaitTimeout
from spoolctl.services import dependencies, lanes, query
from spoolctl.services.outcome import exit_label
from spoolctl.states import JobState

STATE_COLORS = {
    "done": "green", "dead": "red", "running": "cyan", "canceled": "yellow", "waiting": "blue",
}  # fmt: skip
WAIT_FINAL = frozenset({JobState.DONE, JobState.DEAD, JobState.CANCELED, JobState.FAILED})
MAX_WAIT_S = 86_400


def empty_status() -> dict[str, Any]:
    return {
        "counts": {s.value: 0 for s in JobState},
        "scheduled": 0,
        "queues": {},
        "recent_dead": [],
        "workers": [],
        "orphans_unconfirmed": [],
        "paused_lanes": [],
    }


@verb(
    "status",
    exclusive=(("watch", "as_json"),),
    examples=("spoolctl status", "spoolctl status --json", "spoolctl status --watch"),
)
@click.option("--limit", type=BoundedInt(0, 1000), default=10, show_default=True,
              help="Recent dead jobs shown (0: all).")  # fmt: skip
@click.option("--watch", is_flag=True, help="Refresh a live view until interrupted (Ctrl-C).")
@click.option("--interval", type=Seconds(0, 3600), default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")  # fmt: skip
@db_option
@json_option
def status(limit: int, watch: bool, interval: float, db: str | None, as_json: bool) -> int:
    """Counts per state and queue, recent dead jobs, live workers."""
    if watch:
        return watch_status(db, limit, interval)
    now = time.time()
    data = status_data(db, limit, now)
    return emit(Reply(data, text=lambda: status_text(data, now)), as_json)


def status_data(db: str | None, limit: int, now: float) -> dict[str, Any]:
    """`now` is this machine's clock; a PostgreSQL queue is judged by its server's."""
    queue = open_read(db)
    if queue is None:
        return empty_status()
    if queue.is_postgres:
        now = queue.now()
    return queue.read(
        lambda conn: with_paused_lanes(
            query.status_summary(conn, now, dead_limit=limit), lanes.paused_lanes(conn)
        )
    )


def with_paused_lanes(data: dict[str, Any], paused: list[dict[str, Any]]) -> dict[str, Any]:
    """Adds `paused_lanes` and a `paused` flag on each queue (additive keys)."""
    names = {p["queue"] for p in paused}
    for name, entry in data["queues"].items():
        entry["paused"] = name in names
    data["paused_lanes"] = paused
    return data


def paused_text(paused: list[dict[str, Any]], now: float) -> list[str]:
    if not paused:
        return []
    rows = [
        [p["queue"], age(p["paused_at"], now), p["paused_by"], (p["reason"] or "")[:50]]
        for p in paused
    ]
    heading = style(f"paused lanes: {len(paused)} (spoolctl resume QUEUE)", fg="yellow")
    return ["", heading, table(["LANE", "SINCE", "BY", "REASON"], rows)]


def watch_status(db: str | None, limit: int, interval: float) -> int:
    """Redraw the status every `interval` seconds until Ctrl-C (exit 0)."""
    try:
        while True:
            now = time.time()
            view = status_text(status_data(db, limit, now), now)
            if sys.stdout.isatty():
                click.clear()
            click.echo(f"{local_time(now)}  (every {interval:g}s, Ctrl-C to stop)\n{view}\n")
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def status_text(data: dict[str, Any], now: float) -> str:
    counts = data["counts"]
    parts = [f"{style(k, fg=STATE_COLORS.get(k))} {v}" for k, v in counts.items() if k != "failed"]
    lines = ["jobs: " + "  ".join(parts) + f"  (scheduled {data['scheduled']})"]
    if data["queues"]:
        rows = [
            [name + (" (paused)" if q.get("paused") else ""), str(q["counts"]["queued"]),
             str(q["counts"]["running"]), str(q["counts"].get("waiting", 0)), str(q["scheduled"])]
            for name, q in sorted(data["queues"].items())
        ]  # fmt: skip
        lines += ["", table(["QUEUE", "QUEUED", "RUNNING", "WAITING", "SCHEDULED"], rows)]
    if data["recent_dead"]:
        rows = [
            [str(d["id"]), (d["command"] or "?")[:50], str(d["attempts"]),
             (d["last_error"] or "")[:40], age(d["finished_at"], now)]
            for d in data["recent_dead"]
        ]  # fmt: skip
        lines += ["", table(["DEAD", "COMMAND", "ATTEMPTS", "LAST ERROR", "FINISHED"], rows)]
    workers = data["workers"]
    lines += ["", f"workers: {len(workers)} live"]
    if workers:
        rows = [
            [w["id"], w["queue"], str(w["pid"]), ",".join(map(str, w["running_jobs"])) or "-",
             "?" if w["heartbeat_age_s"] is None else f"{w['heartbeat_age_s']:.1f}s"]
            for w in workers
        ]  # fmt: skip
        lines.append(table(["WORKER", "QUEUE", "PID", "JOBS", "HEARTBEAT"], rows))
    lines += orphans_text(data["orphans_unconfirmed"], now)
    lines += paused_text(data.get("paused_lanes", []), now)
    return "\n".join(lines)


def orphans_text(orphans: list[dict[str, Any]], now: float) -> list[str]:
    """Jobs kept running because their dead worker's process may still run."""
    if not orphans:
        return []
    rows = [
        [str(o["job_id"]), "?" if o["pid"] is None else str(o["pid"]), o["dead_worker"] or "?",
         age(o["since"], now), (o["reason"] or "")[:60]]
        for o in orphans
    ]  # fmt: skip
    heading = style(f"unconfirmed orphans: {len(orphans)} (kept running, not requeued)", fg="red")
    return ["", heading, table(["JOB", "PID", "DEAD WORKER", "SINCE", "WHY"], rows)]


@verb("show", examples=("spoolctl show 42", "spoolctl show 42 --json"))
@click.argument("job_id", type=JOB_ID)
@db_option
@json_option
def show(job_id: int, db: str | None, as_json: bool) -> int:
    """One job with every column, its attempts and its events."""
    queue = open_read(db)
    detail = (
        None if queue is None else queue.read(lambda conn: detail_with_dependencies(conn, job_id))
    )
    if detail is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    return emit(Reply(detail, text=lambda: show_text(detail)), as_json)


def detail_with_dependencies(conn: Any, job_id: int) -> dict[str, Any] | None:
    """`show`'s data plus what the job waits for and what waits for it."""
    detail = query.job_detail(conn, job_id)
    if detail is not None:
        detail["after_jobs"] = dependencies.waits_for(conn, [job_id]).get(job_id, [])
        detail["dependents"] = dependencies.dependents_of(conn, job_id)
    return detail


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
    if detail.get("after_jobs"):
        waits = ", ".join(f"{p['job_id']} ({p['state']})" for p in detail["after_jobs"])
        lines.append(f"  after     {waits}")
    if detail.get("dependents"):
        lines.append("  before    " + ", ".join(map(str, detail["dependents"])))
    if detail["attempts"]:
        rows = [
            [str(a["attempt_no"]), a["state"], a["failure_reason"] or "-",
             exit_label(a["exit_code"], a.get("signal")) or "-",
             local_time(a["started_at"]), a["worker_id"]]
            for a in detail["attempts"]
        ]  # fmt: skip
        lines += ["", table(["#", "STATE", "REASON", "EXIT", "STARTED", "WORKER"], rows)]
    return "\n".join(lines)


@verb(
    "list",
    examples=("spoolctl list --state dead", "spoolctl list --queue gpu --tag team=ml --json"),
)
@click.option("--state", type=StateList([s.value for s in JobState]), default=None,
              help="Only jobs in these states (comma-separated).")  # fmt: skip
@click.option("--waiting", is_flag=True,
              help="Only jobs waiting for other jobs (same as --state waiting).")  # fmt: skip
@click.option("--queue", type=QueueName(), default=None, help="Only jobs of this queue.")
@click.option("--tag", "tags", type=TAG_FILTER, multiple=True,
              help="Only jobs with tag K=V, or K alone (any value); all must match.")  # fmt: skip
@click.option("--priority-min", type=BoundedInt(validate.INT32_MIN, validate.INT32_MAX),
              default=None, help="Only jobs with at least this priority.")  # fmt: skip
@click.option("--limit", type=BoundedInt(0, 1000), default=100, show_default=True,
              help="Most jobs shown (0: all).")  # fmt: skip
@db_option
@json_option
def list_jobs(
    state: tuple[str, ...] | None,
    waiting: bool,
    queue: str | None,
    tags: tuple[tuple[str, str | None], ...],
    priority_min: int | None,
    limit: int,
    db: str | None,
    as_json: bool,
) -> int:
    """Jobs, newest first; env values are never shown here (see `show`)."""
    if waiting:
        state = (JobState.WAITING.value,)
    where = query.JobFilter(state, queue, tags, priority_min, limit)
    found = open_read(db)
    empty = {"cursor": 0, "first_id": None, "limit": limit, "truncated": False}
    jobs, pagination = (
        ([], empty) if found is None else found.read(lambda conn: page_with_waits(conn, where))
    )
    data = {"count": len(jobs), "jobs": jobs}
    return emit(Reply(data, text=lambda: list_text(jobs), meta={"pagination": pagination}), as_json)


def page_with_waits(
    conn: Any, where: query.JobFilter
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A page of `list`, each job with the ids it waits for (one query)."""
    jobs, pagination = query.list_page(conn, where)
    waits = dependencies.waits_for(conn, [j["id"] for j in jobs])
    for job in jobs:
        job["after_jobs"] = [p["job_id"] for p in waits.get(job["id"], [])]
    return jobs, pagination


def list_text(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "no jobs"
    now = time.time()
    rows = [
        [str(j["id"]), style(j["state"], fg=STATE_COLORS.get(j["state"])), j["queue"],
         str(j["priority"]), str(j["attempts"]), age(j["created_at"], now),
         " ".join(j["argv"] or ["(damaged)"])[:60]]
        for j in jobs
    ]  # fmt: skip
    return table(["ID", "STATE", "QUEUE", "PRI", "ATTEMPTS", "CREATED", "COMMAND"], rows)


@verb("workers", examples=("spoolctl workers", "spoolctl workers --all --json"))
@click.option("--all", "include_all", is_flag=True, help="Include stopped and dead workers.")
@db_option
@json_option
def workers(include_all: bool, db: str | None, as_json: bool) -> int:
    """Workers with their queue, slots, running jobs and heartbeat age."""
    found = open_read(db)
    now = time.time() if found is None else found.now()
    rows, orphans, paused = (
        ([], [], [])
        if found is None
        else found.read(
            lambda conn: (
                query.live_workers(conn, now, include_all=include_all),
                query.unconfirmed_orphans(conn),
                lanes.paused_lanes(conn),
            )
        )
    )
    names = {p["queue"] for p in paused}
    for row in rows:
        row["lane_paused"] = row["queue"] in names
    data = {"count": len(rows), "workers": rows, "orphans_unconfirmed": orphans,
            "paused_lanes": paused}  # fmt: skip
    return emit(
        Reply(
            data,
            text=lambda: "\n".join(
                [workers_text(rows, now, orphans), *waits_text(rows), *paused_text(paused, now)]
            ),
        ),
        as_json,
    )


def workers_text(
    rows: list[dict[str, Any]], now: float, orphans: list[dict[str, Any]] | None = None
) -> str:
    if not rows:
        return "\n".join(["no workers", *orphans_text(orphans or [], now)])
    lines = [
        [w["id"], w["hostname"], str(w["pid"]), w["queue"], str(w["slots"] or "-"), w["state"],
         ",".join(map(str, w["running_jobs"])) or "-", local_time(w["started_at"]),
         age(w["heartbeat_at"], now)]
        for w in rows
    ]  # fmt: skip
    headers = ["WORKER", "HOST", "PID", "QUEUE", "SLOTS", "STATE", "JOBS", "STARTED", "HEARTBEAT"]
    return "\n".join([table(headers, lines), *orphans_text(orphans or [], now)])


@verb(
    "wait",
    examples=("spoolctl wait 41 42", "spoolctl wait 42 --timeout 10m --json"),
)
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@click.option("--timeout", type=Duration(MAX_WAIT_S), default=str(MAX_WAIT_S), show_default=True,
              help="Give up (TIMEOUT, exit 4) after this long.")  # fmt: skip
@click.option("--poll-interval", type=Seconds(0, 3600), default=0.2, show_default=True,
              help="Seconds between looks at the queue.")  # fmt: skip
@db_option
@json_option
def wait(
    job_ids: tuple[int, ...], timeout: float, poll_interval: float, db: str | None, as_json: bool
) -> int:
    """Block until every job is done, dead or canceled.

    Exit 0 when all are done, 6 when any ended otherwise, 4 (TIMEOUT) when the
    time runs out first.
    """
    ids = sorted(set(job_ids))
    started = time.monotonic()
    deadline = started + timeout
    found = open_read(db)
    progress = ProgressLine(as_json)
    try:
        while True:
            summary = (
                {} if found is None else found.read(lambda conn: query.wait_summary(conn, ids))
            )
            missing = [i for i in ids if i not in summary]
            if missing:
                raise NotFound(f"no job {missing[0]}", job_ids=missing)
            pending = [i for i in ids if summary[i]["state"] not in WAIT_FINAL]
            if not pending:
                progress.done()
                return emit(wait_reply(summary), as_json)
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"jobs still unfinished after {timeout:g}s: {pending}", pending=pending
                )
            progress.update(wait_progress(summary, time.monotonic() - started))
            time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    finally:
        progress.done()


def wait_progress(summary: dict[int, dict[str, Any]], elapsed: float) -> str:
    states = Counter(s["state"] for s in summary.values())
    parts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return f"waiting for {len(summary)} jobs: {parts} ({elapsed:.0f}s)"


def wait_reply(summary: dict[int, dict[str, Any]]) -> Reply:
    all_done = all(s["state"] == JobState.DONE for s in summary.values())
    data = {"all_succeeded": all_done, "jobs": {str(i): s for i, s in summary.items()}}
    lines = [f"job {i}: {s['state']} (attempts {s['attempts']})" for i, s in summary.items()]
    return Reply(
        data, text="\n".join(lines), exit_code=EXIT_OK if all_done else EXIT_JOB_UNSUCCESSFUL
    )
