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
from spoolctl.cli.look import age, fit_line, line_width, local_time, table
from spoolctl.cli.options import BoundedInt, Seconds, db_option, json_option, verb
from spoolctl.cli.outages import waits_text
from spoolctl.cli.read_text import NAME_MIN, jobs_text, orphans_text, paused_text, status_text
from spoolctl.cli.render import wide_option
from spoolctl.cli.reply import Reply, emit
from spoolctl.config import Timing
from spoolctl.services import lanes, query, readings
from spoolctl.services.statements import reads
from spoolctl.states import JobState
from spoolctl.text import shown, size_text


def empty_status() -> dict[str, Any]:
    return {
        "counts": {s.value: 0 for s in JobState},
        "scheduled": 0,
        "suspended": 0,
        "queues": {},
        "recent_dead": [],
        "workers": [],
        "orphans_unconfirmed": [],
        "paused_lanes": [],
        "schedules": {"count": 0, "next": None},
        "waiting_for_limits": [],
        "devices": {"count": 0, "held": 0.0, "free": 0.0},
        "unplaceable": {"count": 0, "jobs": []},
    }


@verb(
    "status",
    for_people=("watch", "interval", "wide"),
    exclusive=(("watch", "as_json"),),
    examples=(
        "spoolctl status",
        "spoolctl status --json",
        "spoolctl status --watch",
        "spoolctl status --wide",
    ),
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
@wide_option
@db_option
@json_option
def status(
    limit: int, watch: bool, interval: float, wide: bool, db: str | None, as_json: bool
) -> int:
    """Counts per state and lane, dead jobs, live workers.

    The text fits the terminal (COLUMNS, else its width; a pipe or a file:
    no limit): commands, errors and names are cut with an ellipsis (…),
    never ids, states or numbers; --wide shows every cell uncut. Colour only
    on a terminal, and never where NO_COLOR is set (non-empty).
    """
    if watch:
        return watch_status(db, limit, interval, wide)
    now = time.time()
    data = status_data(db, limit, now)
    reply = Reply(data, text=lambda: status_text(data, now, line_width(wide)))
    return emit(reply if data is not EMPTY_STATUS else warn_no_queue(reply, db), as_json)


EMPTY_STATUS = empty_status()
"""`status` of a queue that does not exist yet (read-only: never changed)."""


def status_data(db: str | None, limit: int, now: float) -> dict[str, Any]:
    """`now` is this machine's clock; a PostgreSQL queue is judged by its server's."""
    queue = open_read(db)
    if queue is None:
        return EMPTY_STATUS
    now = queue.now()  # the server's on PostgreSQL
    live = Timing.from_env().reap_threshold_s
    return queue.read(lambda conn: readings.status_data(reads(conn), now, limit, live))


def watch_status(db: str | None, limit: int, interval: float, wide: bool = False) -> int:
    """Redraw the status every `interval` seconds until Ctrl-C (exit 0), each
    time as wide as the terminal is then."""
    try:
        while True:
            now = time.time()
            view = status_text(status_data(db, limit, now), now, line_width(wide))
            if sys.stdout.isatty():
                click.clear()
            click.echo(f"{local_time(now)}  (every {interval:g}s, Ctrl-C to stop)\n{view}\n")
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


@verb(
    "workers",
    for_people=("wide",),
    examples=("spoolctl workers", "spoolctl workers --all --json"),
)
@click.option("--all", "include_all", is_flag=True, help="Include stopped and dead workers.")
@wide_option
@db_option
@json_option
def workers(include_all: bool, wide: bool, db: str | None, as_json: bool) -> int:
    """Workers and what they run: lane, lane cap (--slots), jobs, start, heartbeat.

    Times are shown as ages (the timestamps are in --json). The text fits
    the terminal as `status`'s does (--wide: uncut).
    """
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
    width = line_width(wide)
    reply = Reply(
        data,
        text=lambda: "\n".join(
            [
                workers_text(rows, now, orphans, width),
                *waits_text(rows),
                *paused_text(paused, now, width),
            ]
        ),
    )
    return emit(reply if found is not None else warn_no_queue(reply, db), as_json)


def workers_text(
    rows: list[dict[str, Any]],
    now: float,
    orphans: list[dict[str, Any]] | None = None,
    width: int | None = None,
) -> str:
    """The workers' table (their start and heartbeat as ages; the times
    themselves are in --json) and the orphans kept running."""
    if not rows:
        return "\n".join(["no workers", *orphans_text(orphans or [], now, width)])
    lines = [
        [
            shown(w["id"]),
            shown(w["hostname"]),
            shown(w["pid"]),
            shown(w["queue"]),
            shown(w["slots"] or "-"),
            shown(w["state"]),
            jobs_text(w),
            age(w["started_at"], now),
            age(w["heartbeat_at"], now),
        ]
        for w in rows
    ]
    headers = ["WORKER", "HOST", "PID", "QUEUE", "SLOTS", "STATE", "JOBS", "STARTED", "HEARTBEAT"]
    flexible = {0: NAME_MIN, 1: NAME_MIN // 2, 3: NAME_MIN, 6: NAME_MIN // 2}
    lines_ = table(headers, lines, width, flexible, (1, 4, 7, 2, 6))
    has = [line for w in rows for line in inventory_text(w, width)]
    return "\n".join([lines_, *has, *orphans_text(orphans or [], now, width)])


def inventory_text(worker: dict[str, Any], width: int | None = None) -> list[str]:
    """What a worker has to place jobs on, where it registered more than its
    slots: its memory budget and each GPU with its holders (`GPUs: 0 A100
    (held 0.5 by job 12, 13), 1 A100 (free)`)."""
    inventory = worker.get("inventory") or {}
    parts = []
    if inventory.get("memory_bytes") is not None:
        parts.append(f"memory budget {size_text(inventory['memory_bytes'])}")
    if inventory.get("devices"):
        parts.append("GPUs: " + ", ".join(device_text(d) for d in inventory["devices"]))
    if not parts:
        return []
    return [fit_line(f"  {shown(worker['id'])}: {'; '.join(parts)}", width)]


def device_text(device: dict[str, Any]) -> str:
    """One GPU: its index and model, and what is held of it by which jobs."""
    held = device.get("held_share") or 0
    jobs = ", ".join(dict.fromkeys(str(h["job_id"]) for h in device.get("holders") or ()))
    holds = (
        f"held {held:g} by job {jobs}" if held and jobs else f"held {held:g}" if held else "free"
    )
    return f"{device['index']} {shown(device['model'])} ({holds})"
