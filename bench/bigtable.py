"""Build a queue file holding N jobs in a realistic mix of states, fast.

The first job is added and run by the implementation's own CLI, so its job,
attempt and event rows are exactly what that implementation writes. Those rows
are then copied N-1 times with executemany, varying state and times:

- 90 % done, 5 % dead (one failed attempt), 3 % queued but scheduled a day
  ahead, 2 % canceled (never ran);
- plus one queued job that is due now, at the end, so a claim finds work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fixtures import DAY_S, Impl, closing_db, insert_rows, run_cli, seed, select_rows


def build(impl: Impl, db: Path, cwd: Path, total: int) -> None:
    seed(impl, db, cwd)
    run_cli(impl, "work", "--db", str(db), "--once", "--json", cwd=cwd)
    now = time.time()
    with closing_db(db) as conn:
        job = select_rows(conn, "SELECT * FROM jobs ORDER BY id LIMIT 1")[0]
        attempt = select_rows(conn, "SELECT * FROM attempts WHERE job_id = ?", (job["id"],))[0]
        events = select_rows(
            conn, "SELECT * FROM job_events WHERE job_id = ? ORDER BY id", (job["id"],)
        )
        jobs, attempts, ledger = [], [], []
        for i in range(1, total):
            job_id = int(job["id"]) + i
            created = now - (total - i) * 0.5
            state = "queued" if i == total - 1 else _state_for(i)
            row = _job_row(job, job_id, state, created, now)
            jobs.append(row)
            if state in ("done", "dead"):
                attempts.append(_attempt_row(attempt, job_id, state, created))
            ledger.extend(_events_for(events, job_id, state, created))
        insert_rows(conn, "jobs", jobs)
        insert_rows(conn, "attempts", attempts)
        insert_rows(conn, "job_events", ledger)
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _state_for(i: int) -> str:
    bucket = i % 100
    if bucket < 90:
        return "done"
    if bucket < 95:
        return "dead"
    if bucket < 98:
        return "scheduled"
    return "canceled"


def _job_row(
    template: dict[str, Any], job_id: int, state: str, created: float, now: float
) -> dict[str, Any]:
    row = {**template, "id": job_id, "created_at": created, "next_run_at": created}
    if state == "done":
        row.update(started_at=created + 0.1, finished_at=created + 0.2)
        return row
    row.update(locked_by=None, locked_pid=None, locked_at=None, heartbeat_at=None)
    if state == "dead":
        row.update(
            state="dead",
            attempts=4,
            started_at=created + 0.1,
            finished_at=created + 0.2,
            last_exit_code=1,
            last_error="exited with status 1",
        )
        if "last_failure_reason" in row:
            row["last_failure_reason"] = "process_exit"
        return row
    row.update(started_at=None, finished_at=None, last_exit_code=None, last_error=None, attempts=0)
    if "last_failure_reason" in row:
        row["last_failure_reason"] = None
    if state == "canceled":
        row.update(state="canceled", finished_at=created + 0.2)
    elif state == "scheduled":
        row.update(state="queued", next_run_at=now + DAY_S)
    else:
        row.update(state="queued", next_run_at=now - 1)
    return row


def _attempt_row(
    template: dict[str, Any], job_id: int, state: str, created: float
) -> dict[str, Any]:
    old = f"/{template['job_id']}/{template['attempt_no']}/"
    new = f"/{job_id}/1/"
    row = {k: v for k, v in template.items() if k != "id"}
    row.update(
        job_id=job_id,
        attempt_no=1,
        started_at=created + 0.1,
        finished_at=created + 0.2,
        stdout_path=str(template["stdout_path"]).replace(old, new),
        stderr_path=str(template["stderr_path"]).replace(old, new),
    )
    if state == "dead":
        row.update(state="failed", exit_code=1, failure_reason="process_exit")
    return row


EVENTS_BY_STATE = {
    "done": None,  # every event of the template run
    "dead": ("added", "claimed", "failed", "dead"),
    "scheduled": ("added",),
    "queued": ("added",),
    "canceled": ("added", "canceled"),
}


def _events_for(
    template: list[dict[str, Any]], job_id: int, state: str, created: float
) -> list[dict[str, Any]]:
    names = EVENTS_BY_STATE[state]
    base = {k: v for k, v in template[0].items() if k != "id"}
    if names is None:
        rows = [{k: v for k, v in e.items() if k != "id"} for e in template]
    else:
        rows = [{**base, "event": name} for name in names]
    for n, row in enumerate(rows):
        row.update(job_id=job_id, at=created + 0.05 * n)
    return rows
