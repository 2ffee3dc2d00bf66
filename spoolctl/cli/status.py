"""`status` and `workers`: the queue at a glance (counts per state and lane,
recent dead jobs, live workers) and its workers in full; both also list the
paused lanes and the orphans kept running because their dead worker's
process may still run. Read-only: they never take the write lock and never
create a queue."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from spoolctl.cli.database import open_read, warn_no_queue
from spoolctl.cli.inspect import STATE_COLORS, command_text
from spoolctl.cli.options import BoundedInt, Seconds, db_option, json_option, verb
from spoolctl.cli.outages import waits_text
from spoolctl.cli.render import age, local_time, style, table
from spoolctl.cli.reply import Reply, emit
from spoolctl.services import lanes, query, schedules
from spoolctl.states import JobState
from spoolctl.text import shown


def empty_status() -> dict[str, Any]:
    return {
        "counts": {s.value: 0 for s in JobState},
        "scheduled": 0,
        "queues": {},
        "recent_dead": [],
        "workers": [],
        "orphans_unconfirmed": [],
        "paused_lanes": [],
        "schedules": {"count": 0, "next": None},
        "waiting_for_limits": [],
    }


@verb(
    "status",
    exclusive=(("watch", "as_json"),),
    examples=("spoolctl status", "spoolctl status --json", "spoolctl status --watch"),
)
@click.option(
    "--limit",
    type=BoundedInt(0, 1000),
    default=10,
    show_default=True,
    help="Recent dead jobs shown (0: all).",
)
@click.option("--watch", is_flag=True, help="Refresh a live view until interrupted (Ctrl-C).")
@click.option(
    "--interval",
    type=Seconds(0, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@db_option
@json_option
def status(limit: int, watch: bool, interval: float, db: str | None, as_json: bool) -> int:
    """Counts per state and lane, dead jobs, live workers."""
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

    def read(conn: Any) -> dict[str, Any]:
        data = with_paused_lanes(
            query.status_summary(conn, now, dead_limit=limit), lanes.paused_lanes(conn)
        )
        data["schedules"] = schedules.summary(conn)
        data["waiting_for_limits"] = query.waiting_for_limits(conn, now)
        return data

    return queue.read(read)


def with_paused_lanes(data: dict[str, Any], paused: list[dict[str, Any]]) -> dict[str, Any]:
    """Adds `paused_lanes` and a `paused` flag on each lane (additive keys)."""
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
            [
                shown(name) + (" (paused)" if q.get("paused") else ""),
                str(q["counts"]["queued"]),
                str(q["counts"]["running"]),
                str(q["counts"].get("waiting", 0)),
                str(q["scheduled"]),
            ]
            for name, q in sorted(data["queues"].items())
        ]
        lines += ["", table(["QUEUE", "QUEUED", "RUNNING", "WAITING", "SCHEDULED"], rows)]
    if data["recent_dead"]:
        rows = [
            [
                str(d["id"]),
                command_text(d["argv"], "?")[:50],
                shown(d["attempts"]),
                shown(d["last_error"] or "")[:40],
                age(d["finished_at"], now),
            ]
            for d in data["recent_dead"]
        ]
        lines += ["", table(["DEAD", "COMMAND", "FAILURES", "LAST ERROR", "FINISHED"], rows)]
    plan = data.get("schedules") or {"count": 0, "next": None}
    if plan["count"]:
        nxt = plan["next"]
        due = "all paused" if nxt is None else f"next: {shown(nxt['name'])} {age(nxt['at'], now)}"
        lines += ["", f"schedules: {plan['count']} ({due})"]
    workers = data["workers"]
    lines += ["", f"workers: {len(workers)} live"]
    if workers:
        rows = [
            [
                shown(w["id"]),
                shown(w["queue"]),
                shown(w["pid"]),
                ",".join(map(str, w["running_jobs"])) or "-",
                "?" if w["heartbeat_age_s"] is None else f"{w['heartbeat_age_s']:.1f}s",
            ]
            for w in workers
        ]
        lines.append(table(["WORKER", "QUEUE", "PID", "JOBS", "HEARTBEAT"], rows))
    lines += orphans_text(data["orphans_unconfirmed"], now)
    lines += paused_text(data.get("paused_lanes", []), now)
    waiting = data.get("waiting_for_limits") or []
    if waiting:
        listed = ", ".join(map(str, waiting))
        lines += ["", f"waiting for a worker that can enforce their limits: job(s) {listed}"]
    return "\n".join(lines)


def orphans_text(orphans: list[dict[str, Any]], now: float) -> list[str]:
    """Jobs kept running because their dead worker's process may still run."""
    if not orphans:
        return []
    rows = [
        [
            str(o["job_id"]),
            "?" if o["pid"] is None else str(o["pid"]),
            shown(o["dead_worker"] or "?"),
            age(o["since"], now),
            shown(o["reason"] or "")[:60],
        ]
        for o in orphans
    ]
    heading = style(f"unconfirmed orphans: {len(orphans)} (kept running, not requeued)", fg="red")
    return ["", heading, table(["JOB", "PID", "DEAD WORKER", "SINCE", "WHY"], rows)]


@verb("workers", examples=("spoolctl workers", "spoolctl workers --all --json"))
@click.option("--all", "include_all", is_flag=True, help="Include stopped and dead workers.")
@db_option
@json_option
def workers(include_all: bool, db: str | None, as_json: bool) -> int:
    """Workers and what they run: lane, lane cap (--slots), jobs, heartbeat age."""
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
    data = {
        "count": len(rows),
        "workers": rows,
        "orphans_unconfirmed": orphans,
        "paused_lanes": paused,
    }
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
        [
            shown(w["id"]),
            shown(w["hostname"]),
            shown(w["pid"]),
            shown(w["queue"]),
            shown(w["slots"] or "-"),
            shown(w["state"]),
            ",".join(map(str, w["running_jobs"])) or "-",
            local_time(w["started_at"]),
            age(w["heartbeat_at"], now),
        ]
        for w in rows
    ]
    headers = ["WORKER", "HOST", "PID", "QUEUE", "SLOTS", "STATE", "JOBS", "STARTED", "HEARTBEAT"]
    return "\n".join([table(headers, lines), *orphans_text(orphans or [], now)])
