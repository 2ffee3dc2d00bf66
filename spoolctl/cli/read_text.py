"""The text of `status` and `list` for people. Light (no click, no
SQLAlchemy): the click verbs (`cli/status.py`, `cli/inspect.py`) and the
lean path (`cli/lean_read.py`) both write it, so both write the same bytes.

Each view fits `width` columns (None: no limit; see `cli/look.py`'s
`line_width`): the columns of free text (commands, errors, reasons, names)
are narrowed and cut with an ellipsis, the others (ids, states, numbers,
ages) never; where the terminal is too narrow even then, the least needed
columns are left out (the last tuple given to `table`). `--wide` gives
None: every cell uncut."""

from __future__ import annotations

import time
from typing import Any

from spoolctl.cli.look import age, fit_line, style, table, wrapped
from spoolctl.services.readings import SUSPENDED, shown_state
from spoolctl.text import shown, shown_argv

STATE_COLORS = {
    "done": "green",
    "dead": "red",
    "running": "cyan",
    "canceled": "yellow",
    "waiting": "blue",
    SUSPENDED: "magenta",
}


def command_text(argv: list[str] | None, damaged: str = "(damaged)") -> str:
    """A job's command as the shell would read it back, escaped (see
    `spoolctl.text.shown_argv`)."""
    return shown_argv(argv) if argv else damaged


NAME_MIN = 8
"""The narrowest a column of names (lanes, workers, hosts) gets."""
TEXT_MIN = 12
"""The narrowest a column of free text (a command, an error) gets."""


def running_text(running: object, suspended: int) -> str:
    """A running count, with how many of them are suspended where any are."""
    return f"{running} ({suspended} suspended)" if suspended else str(running)


def status_text(data: dict[str, Any], now: float, width: int | None = None) -> str:
    counts = {
        **data["counts"],
        "running": running_text(data["counts"].get("running", 0), data.get("suspended", 0)),
    }
    parts = [
        f"{style(shown(k), fg=STATE_COLORS.get(k))} {v}" for k, v in counts.items() if k != "failed"
    ]
    lines = wrapped([*parts, f"(scheduled {data['scheduled']})"], width, "jobs: ", " " * 6)
    if data["queues"]:
        rows = [
            [
                shown(name) + (" (paused)" if q.get("paused") else ""),
                str(q["counts"]["queued"]),
                running_text(q["counts"]["running"], q.get("suspended", 0)),
                str(q["counts"].get("waiting", 0)),
                str(q["scheduled"]),
            ]
            for name, q in sorted(data["queues"].items())
        ]
        headers = ["QUEUE", "QUEUED", "RUNNING", "WAITING", "SCHEDULED"]
        lines += ["", table(headers, rows, width, {0: NAME_MIN}, (4, 3))]
    if data["recent_dead"]:
        rows = [
            [
                str(d["id"]),
                command_text(d["argv"], "?"),
                shown(d["attempts"]),
                shown(d["last_error"] or ""),
                age(d["finished_at"], now),
            ]
            for d in data["recent_dead"]
        ]
        headers = ["DEAD", "COMMAND", "FAILURES", "LAST ERROR", "FINISHED"]
        lines += ["", table(headers, rows, width, {1: TEXT_MIN, 3: TEXT_MIN}, (2, 4, 3))]
    plan = data.get("schedules") or {"count": 0, "next": None}
    if plan["count"]:
        nxt = plan["next"]
        due = "all paused" if nxt is None else f"next: {shown(nxt['name'])} {age(nxt['at'], now)}"
        lines += ["", fit_line(f"schedules: {plan['count']} ({due})", width)]
    workers = data["workers"]
    lines += ["", f"workers: {len(workers)} live"]
    if workers:
        rows = [
            [
                shown(w["id"]),
                shown(w["queue"]),
                shown(w["pid"]),
                jobs_text(w),
                "?" if w["heartbeat_age_s"] is None else f"{w['heartbeat_age_s']:.1f}s",
            ]
            for w in workers
        ]
        headers = ["WORKER", "QUEUE", "PID", "JOBS", "HEARTBEAT"]
        flexible = {0: NAME_MIN, 1: NAME_MIN, 3: NAME_MIN}
        lines.append(table(headers, rows, width, flexible, (2, 4)))
    lines += orphans_text(data["orphans_unconfirmed"], now, width)
    lines += paused_text(data.get("paused_lanes", []), now, width)
    waiting = data.get("waiting_for_limits") or []
    if waiting:
        listed = ", ".join(map(str, waiting))
        waits = f"waiting for a worker that can enforce their limits: job(s) {listed}"
        lines += ["", fit_line(waits, width)]
    return "\n".join(lines)


def jobs_text(worker: dict[str, Any]) -> str:
    """The ids of the jobs a worker runs, each suspended one marked so."""
    marked = set(worker.get("suspended_jobs") or ())
    ids = [f"{i} ({SUSPENDED})" if i in marked else str(i) for i in worker["running_jobs"]]
    return ",".join(ids) or "-"


def orphans_text(orphans: list[dict[str, Any]], now: float, width: int | None = None) -> list[str]:
    """Jobs kept running because their dead worker's process may still run."""
    if not orphans:
        return []
    rows = [
        [
            str(o["job_id"]),
            "?" if o["pid"] is None else str(o["pid"]),
            shown(o["dead_worker"] or "?"),
            age(o["since"], now),
            shown(o["reason"] or ""),
        ]
        for o in orphans
    ]
    heading = style(f"unconfirmed orphans: {len(orphans)} (kept running, not requeued)", fg="red")
    headers = ["JOB", "PID", "DEAD WORKER", "SINCE", "WHY"]
    return ["", heading, table(headers, rows, width, {2: NAME_MIN, 4: TEXT_MIN}, (1, 3))]


def paused_text(paused: list[dict[str, Any]], now: float, width: int | None = None) -> list[str]:
    if not paused:
        return []
    rows = [
        [
            shown(p["queue"]),
            age(p["paused_at"], now),
            shown(p["paused_by"]),
            shown(p["reason"] or ""),
        ]
        for p in paused
    ]
    heading = style(f"paused lanes: {len(paused)} (spoolctl resume QUEUE)", fg="yellow")
    flexible = {0: NAME_MIN, 2: NAME_MIN, 3: TEXT_MIN}
    return ["", heading, table(["LANE", "SINCE", "BY", "REASON"], rows, width, flexible, (1, 2))]


def list_text(jobs: list[dict[str, Any]], width: int | None = None) -> str:
    if not jobs:
        return "no jobs"
    now = time.time()
    rows = [
        [
            str(j["id"]),
            style(shown(shown_state(j)), fg=STATE_COLORS.get(shown_state(j))),
            shown(j["queue"]),
            shown(j["priority"]),
            str(j["attempts_total"]),
            shown(j["attempts"]),
            age(j["created_at"], now),
            command_text(j["argv"]),
        ]
        for j in jobs
    ]
    headers = ["ID", "STATE", "QUEUE", "PRI", "ATTEMPTS", "FAILURES", "CREATED", "COMMAND"]
    needs = [needs_cell(j) for j in jobs]
    if any(needs):  # a column only where some job on the page asks for more than a slot
        headers.insert(7, "NEEDS")
        rows = [[*row[:7], cell or "-", row[7]] for row, cell in zip(rows, needs, strict=True)]
        return table(headers, rows, width, {2: NAME_MIN, 8: TEXT_MIN}, (3, 5, 4, 6, 7))
    return table(headers, rows, width, {2: NAME_MIN, 7: TEXT_MIN}, (3, 5, 4, 6))


def needs_cell(job: dict[str, Any]) -> str:
    """A job's request in `list`: its GPUs and weight (`0.5 GPU`, `2 GPU w4`);
    `show` says the rest (model, GPU memory). Empty: one slot, no GPU."""
    parts = []
    if job.get("gpus"):
        parts.append(f"{shown(job['gpus'])} GPU")
    if (job.get("weight") or 1) != 1:
        parts.append(f"w{shown(job['weight'])}")
    return " ".join(parts)
