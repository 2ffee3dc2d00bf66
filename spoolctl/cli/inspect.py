"""Read-only verbs: they never take the write lock and never create a queue."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

import click

from spoolctl import validate
from spoolctl.cli.events import event_line
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
from spoolctl.cli.queues import no_job, open_read, warn_no_queue
from spoolctl.cli.render import ProgressLine, Reply, age, emit, local_time, style, table
from spoolctl.errors import EXIT_JOB_UNSUCCESSFUL, EXIT_OK, NotFound, WaitTimeout
from spoolctl.services import dependencies, lanes, query
from spoolctl.services.outcome import exit_label
from spoolctl.states import JobState
from spoolctl.text import shown, shown_argv

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
    reply = Reply(data, text=lambda: status_text(data, now))
    return emit(reply if data is not EMPTY_STATUS else warn_no_queue(reply, db), as_json)


EMPTY_STATUS = empty_status()
"""`status` of a queue that does not exist yet (read-only: never changed)."""


def status_data(db: str | None, limit: int, now: float) -> dict[str, Any]:
    """`now` is this machine's clock; a PostgreSQL queue is judged by its server's."""
    queue = open_read(db)
    if queue is None:
        return EMPTY_STATUS
    now = queue.now()  # the server's on PostgreSQL
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
        [
            shown(p["queue"]),
            age(p["paused_at"], now),
            shown(p["paused_by"]),
            shown(p["reason"] or "")[:50],
        ]
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
    parts = [
        f"{style(shown(k), fg=STATE_COLORS.get(k))} {v}" for k, v in counts.items() if k != "failed"
    ]
    lines = ["jobs: " + "  ".join(parts) + f"  (scheduled {data['scheduled']})"]
    if data["queues"]:
        rows = [
            [shown(name) + (" (paused)" if q.get("paused") else ""), str(q["counts"]["queued"]),
             str(q["counts"]["running"]), str(q["counts"].get("waiting", 0)), str(q["scheduled"])]
            for name, q in sorted(data["queues"].items())
        ]  # fmt: skip
        lines += ["", table(["QUEUE", "QUEUED", "RUNNING", "WAITING", "SCHEDULED"], rows)]
    if data["recent_dead"]:
        rows = [
            [str(d["id"]), command_text(d["argv"], "?")[:50], shown(d["attempts"]),
             shown(d["last_error"] or "")[:40], age(d["finished_at"], now)]
            for d in data["recent_dead"]
        ]  # fmt: skip
        lines += ["", table(["DEAD", "COMMAND", "FAILURES", "LAST ERROR", "FINISHED"], rows)]
    workers = data["workers"]
    lines += ["", f"workers: {len(workers)} live"]
    if workers:
        rows = [
            [shown(w["id"]), shown(w["queue"]), shown(w["pid"]),
             ",".join(map(str, w["running_jobs"])) or "-",
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
        [str(o["job_id"]), "?" if o["pid"] is None else str(o["pid"]),
         shown(o["dead_worker"] or "?"), age(o["since"], now), shown(o["reason"] or "")[:60]]
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
        raise no_job(job_id, db) if queue is None else NotFound(f"no job {job_id}", job_id=job_id)
    return emit(Reply(detail, text=lambda: show_text(detail)), as_json)


def detail_with_dependencies(conn: Any, job_id: int) -> dict[str, Any] | None:
    """`show`'s data plus what the job waits for and what waits for it."""
    detail = query.job_detail(conn, job_id)
    if detail is not None:
        detail["after_jobs"] = dependencies.waits_for(conn, [job_id]).get(job_id, [])
        detail["dependents"] = dependencies.dependents_of(conn, job_id)
    return detail


def show_text(detail: dict[str, Any]) -> str:
    """Every column, the attempts (how many, and apart the failures) and the
    events, each value shown escaped."""
    job = detail["job"]
    state = shown(job["state"])
    lines = [
        f"job {job['id']}  {style(state, fg=STATE_COLORS.get(state), bold=True)}"
        f"  queue {shown(job['queue'])}  priority {shown(job['priority'])}",
        f"  command   {command_text(job['argv'])}",
        f"  created   {local_time(job['created_at'])}",
        f"  next run  {local_time(job['next_run_at'])}",
        f"  attempts  {len(detail['attempts'])}, failures {shown(job['attempts'])}"
        f" (crashes {shown(job['crashes'])}) of max_retries {shown(job['max_retries'])},"
        f" max_crashes {shown(job['max_crashes'])}",
        f"  timeout   {shown(job['timeout_seconds'])}s",
        *job_facts(job),
        *links_text(detail),
    ]
    if detail["attempts"]:
        lines += ["", attempts_table(detail["attempts"])]
    if detail.get("events"):
        lines += ["", style("events:", bold=True)]
        lines += [f"  {event_line(e)}" for e in detail["events"]]
    return "\n".join(lines)


def job_facts(job: dict[str, Any]) -> list[str]:
    """The optional columns, env and tags as K=V, and what is damaged."""
    lines = [
        f"  {label:<9} {shown(job[label])}"
        for label in ("cwd", "idempotency_key", "note", "last_error")
        if job.get(label)
    ]
    for label in ("env", "tags"):
        if job.get(label):
            pairs = " ".join(f"{shown(k)}={shown(v)}" for k, v in job[label].items())
            lines.append(f"  {label:<9} {pairs}")
    for problem in job.get("damaged", []):
        lines.append(style(f"  damaged   {shown(problem)}", fg="red"))
    return lines


def links_text(detail: dict[str, Any]) -> list[str]:
    """The jobs this one waits for, and those that wait for it."""
    lines = []
    if detail.get("after_jobs"):
        waits = ", ".join(f"{p['job_id']} ({shown(p['state'])})" for p in detail["after_jobs"])
        lines.append(f"  after     {waits}")
    if detail.get("dependents"):
        lines.append("  before    " + ", ".join(map(str, detail["dependents"])))
    return lines


def attempts_table(attempts: list[dict[str, Any]]) -> str:
    rows = [
        [str(a["attempt_no"]), shown(a["state"]), shown(a["failure_reason"] or "-"),
         shown(exit_label(a["exit_code"], a.get("signal")) or "-"),
         local_time(a["started_at"]), shown(a["worker_id"])]
        for a in attempts
    ]  # fmt: skip
    return table(["#", "STATE", "REASON", "EXIT", "STARTED", "WORKER"], rows)


def command_text(argv: list[str] | None, damaged: str = "(damaged)") -> str:
    """A job's command as the shell would read it back, escaped (see
    `spoolctl.text.shown_argv`)."""
    return shown_argv(argv) if argv else damaged


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
    reply = Reply(data, text=lambda: list_text(jobs), meta={"pagination": pagination})
    return emit(reply if found is not None else warn_no_queue(reply, db), as_json)


def page_with_waits(
    conn: Any, where: query.JobFilter
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A page of `list`, each job with the ids it waits for and its number of
    attempts (`attempts_total`; `attempts` counts failures, as in 0.4.11): one
    indexed query each for the page."""
    jobs, pagination = query.list_page(conn, where)
    ids = [j["id"] for j in jobs]
    waits = dependencies.waits_for(conn, ids)
    counts = query.attempt_counts(conn, ids)
    for job in jobs:
        job["after_jobs"] = [p["job_id"] for p in waits.get(job["id"], [])]
        job["attempts_total"] = counts.get(job["id"], 0)
    return jobs, pagination


def list_text(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "no jobs"
    now = time.time()
    rows = [
        [str(j["id"]), style(shown(j["state"]), fg=STATE_COLORS.get(j["state"])),
         shown(j["queue"]), shown(j["priority"]), str(j["attempts_total"]), shown(j["attempts"]),
         age(j["created_at"], now), command_text(j["argv"])[:60]]
        for j in jobs
    ]  # fmt: skip
    headers = ["ID", "STATE", "QUEUE", "PRI", "ATTEMPTS", "FAILURES", "CREATED", "COMMAND"]
    return table(headers, rows)


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
    reply = Reply(
        data,
        text=lambda: "\n".join(
            [workers_text(rows, now, orphans), *waits_text(rows), *paused_text(paused, now)]
        ),
    )
    return emit(reply if found is not None else warn_no_queue(reply, db), as_json)


def workers_text(
    rows: list[dict[str, Any]], now: float, orphans: list[dict[str, Any]] | None = None
) -> str:
    if not rows:
        return "\n".join(["no workers", *orphans_text(orphans or [], now)])
    lines = [
        [shown(w["id"]), shown(w["hostname"]), shown(w["pid"]), shown(w["queue"]),
         shown(w["slots"] or "-"), shown(w["state"]),
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
            if missing and found is None:
                raise no_job(missing[0], db)
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
    parts = ", ".join(f"{n} {shown(state)}" for state, n in sorted(states.items()))
    return f"waiting for {len(summary)} jobs: {parts} ({elapsed:.0f}s)"


def wait_reply(summary: dict[int, dict[str, Any]]) -> Reply:
    all_done = all(s["state"] == JobState.DONE for s in summary.values())
    data = {"all_succeeded": all_done, "jobs": {str(i): s for i, s in summary.items()}}
    lines = [
        f"job {i}: {shown(s['state'])} (failures {shown(s['attempts'])})"
        for i, s in summary.items()
    ]
    return Reply(
        data, text="\n".join(lines), exit_code=EXIT_OK if all_done else EXIT_JOB_UNSUCCESSFUL
    )
