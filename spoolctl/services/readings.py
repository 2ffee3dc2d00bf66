"""What `status`, `list` and `show` read, assembled from named statements.
Light (no SQLAlchemy): the statements are named here and written in
`services/statements.py`; the click verbs run them on their SQLAlchemy
connection (`PreparedStatements`, any backend), the lean path on the
standard library's sqlite3 (`db/lean.py`, the SQL generated for SQLite), and
both assemble the rows with the one code below (the status here, a page
of jobs and one job in `services/job_reads.py`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from spoolctl.db import codec
from spoolctl.db.lean_sql import LISTED
from spoolctl.states import EventKind, JobState

LANE_COUNTS = "lane_counts"
"""Jobs per (state, lane), `n`, and those queued for later, `future`: binds `now`."""
SUSPENDED_COUNTS = "suspended_counts"
"""The suspended jobs (running, `suspended_at` set) per lane, `n`."""
RECENT_DEAD = "recent_dead"
"""The dead jobs, newest finished first: binds `limit`."""
RECENT_DEAD_ALL = "recent_dead_all"
"""Every dead job, newest finished first."""
LAST_ATTEMPT_PATHS = "last_attempt_paths"
"""The output paths of a job's latest attempt: binds `job_id`."""
WORKERS_RUNNING = "workers_running"
"""The running workers, oldest first."""
WORKERS_ALL = "workers_all"
"""Every worker, oldest first."""
WORKER_JOBS = "worker_jobs"
"""The ids of the jobs a worker runs and their `suspended_at`: binds `worker`."""
SERVER_WAITS_RUNNING = "server_waits_running"
"""How the running workers' starts waited for a server (worker_id, detail)."""
SERVER_WAITS_ALL = "server_waits_all"
"""How every worker's start waited for a server (worker_id, detail)."""
ORPHANS = "orphan_flags"
"""The `orphan_unconfirmed` events of running jobs' running attempts."""
PAUSED_LANES = "paused_lanes"
"""Every paused lane by name: queue, paused_at, paused_by, reason."""
SCHEDULE_COUNT = "schedule_count"
"""How many schedules, `n`."""
NEXT_SCHEDULE = "next_schedule"
"""The unpaused schedule due first: name, next_fire_at."""
WAITING_FOR_LIMITS = "waiting_for_limits"
"""Due queued jobs that require their limits enforced, oldest first: binds `now`."""
FIRST_JOB_ID = "first_job_id"
"""The smallest job id, `n`."""
JOB_BY_ID = "job_by_id"
"""One job's row: binds `id`."""
JOB_ATTEMPTS = "job_attempts"
"""A job's attempts in order: binds `job_id`."""
JOB_EVENTS = "job_events"
"""A job's events in order (every column but the ledger's seq): binds `job_id`."""
DEPENDENTS = "dependents"
"""The jobs submitted after one job: binds `job_id`."""
ATTEMPT_COUNTS = "attempt_counts"
"""(job_id, n) of up to CHUNK jobs (`id_0`..: None where unused)."""
WAITS_FOR = "waits_for"
"""(job_id, after_job_id, state) of up to CHUNK jobs (`id_0`..: None where unused)."""

CHUNK = 100
"""Ids per statement of ATTEMPT_COUNTS and WAITS_FOR: a page of `list`'s
default size is one statement each."""
WAITING_FOR_LIMITS_SHOWN = 20
ENDING_EVENTS = (EventKind.FAILED.value, EventKind.TIMED_OUT.value)
STATES = frozenset(s.value for s in JobState)

LIST_FIELDS = (
    "id",
    "state",
    "attempts",
    "crashes",
    "created_at",
    "started_at",
    "finished_at",
    "next_run_at",
    "last_exit_code",
    "last_error",
    *LISTED,
)
"""What `list` shows of a job: its record, then the attributes declared
`listed` (`services/job_spec.py`, as `db/lean_sql.py` keeps them)."""
LIST_COLUMNS = frozenset({*LIST_FIELDS, "argv", "tags", "env", "suspended_at", "gpu_share"})
"""The columns `list` reads: what it shows, what it checks for damage,
whether a running job is suspended, and the share its `gpus` are held in."""
SUSPENDED = "suspended"
"""What views call a running job whose processes are stopped (`suspend`): its
state stays `running` in the JSON; `list --state suspended` finds them."""


class Reads(Protocol):
    """Runs a named statement inside its holder's read transaction."""

    def first(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def all(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]: ...


class ListShape(NamedTuple):
    """Which filters a `list` statement has: one statement per shape
    (`list_name`), each filter a bind (`state`, `lane`, `priority_min`,
    `limit`)."""

    state: bool = False
    lane: bool = False
    priority: bool = False
    limited: bool = False


LIST_SHAPES = tuple(
    ListShape(s, q, p, n)
    for s in (False, True)
    for q in (False, True)
    for p in (False, True)
    for n in (False, True)
)


def list_name(shape: ListShape) -> str:
    parts = [("state", shape.state), ("lane", shape.lane), ("priority", shape.priority)]
    named = "_".join(["list", *(word for word, on in parts if on)])
    return f"{named}_limit" if shape.limited else named


# -- one job's row ---------------------------------------------------------------


def decode_job(job: dict[str, Any]) -> dict[str, Any]:
    """A job row (by column) as plain data; a damaged JSON column is reported
    in `damaged`."""
    damaged: list[str] = []
    loaders: dict[str, Callable[[Any], Any]] = {
        "argv": codec.load_argv,
        "tags": codec.load_str_map,
        "env": codec.load_str_map,
        "requeue_exits": codec.load_codes,
    }
    for name, loader in loaders.items():
        if name not in job:
            continue
        try:
            job[name] = loader(job[name])
        except codec.DamagedValue as exc:
            damaged.append(f"{name}: {exc}")
            job[name] = None
    if job["state"] not in STATES:
        damaged.append(f"state: unknown value {job['state']!r}")
    if damaged:
        job["damaged"] = damaged
    if "suspended_at" in job:
        job["suspended_at"] = suspended_since(job)
        job["suspended"] = job["suspended_at"] is not None
    if "weight" in job:
        job["weight"] = job["weight"] or 1
    if isinstance(job.get("gpus"), int):
        job["gpus"] = gpus_shown(job["gpus"], job.get("gpu_share"))
    return job


def gpus_shown(devices: int, share: Any) -> str | None:
    """A job's `gpus` as `--gpus` takes it ("2", "0.5", "1/3"; None: none).
    resources is imported only for a job that asks for GPUs."""
    if not devices:
        return None
    from spoolctl.resources import gpus_text

    return gpus_text(devices, share if isinstance(share, int) else None)


def suspended_since(job: Mapping[str, Any]) -> float | None:
    """When the job's running attempt was suspended; None unless it is now
    (the claim clears the column, so only a running job's value counts)."""
    at = job.get("suspended_at")
    if job.get("state") != JobState.RUNNING.value or not isinstance(at, int | float):
        return None
    return None if isinstance(at, bool) else float(at)


def shown_state(job: Mapping[str, Any]) -> Any:
    """The state a view prints: `suspended` for a suspended running job."""
    return SUSPENDED if job.get("suspended") else job.get("state")


def event_detail(raw: str | None) -> dict[str, Any]:
    """An event's detail as an object ({} when damaged or not an object)."""
    value = codec.load_detail(raw)
    return value if isinstance(value, dict) else {}


# -- status ----------------------------------------------------------------------


def lane_summary(run: Reads, now: float) -> dict[str, dict[str, Any]]:
    """Every lane that holds a job, finished ones included: its count in each
    state, its scheduled count and how many of its running jobs are suspended."""
    summary: dict[str, dict[str, Any]] = {}
    for row in run.all(LANE_COUNTS, {"now": now}):
        entry = summary.setdefault(row["queue"], _empty_lane())
        entry["counts"][row["state"]] = row["n"]
        if row["state"] == JobState.QUEUED.value:
            entry["scheduled"] = int(row["future"] or 0)
    for row in run.all(SUSPENDED_COUNTS, {}):
        summary.setdefault(row["queue"], _empty_lane())["suspended"] = int(row["n"])
    return summary


def _empty_lane() -> dict[str, Any]:
    """A lane's entry before its counts: `suspended` counts among the running."""
    return {"counts": {s.value: 0 for s in JobState}, "scheduled": 0, "suspended": 0}


def recent_dead(run: Reads, limit: int) -> list[dict[str, Any]]:
    rows = run.all(RECENT_DEAD, {"limit": limit}) if limit else run.all(RECENT_DEAD_ALL, {})
    result = []
    for row in rows:
        last = run.first(LAST_ATTEMPT_PATHS, {"job_id": row["id"]})
        try:
            argv = codec.load_argv(row["argv"])
        except codec.DamagedValue:
            argv = None
        result.append(
            {
                "id": row["id"],
                "command": None if argv is None else " ".join(argv),
                "argv": argv,
                "attempts": row["attempts"],
                "crashes": row["crashes"],
                "last_error": row["last_error"],
                "finished_at": row["finished_at"],
                "stdout_path": last["stdout_path"] if last else None,
                "stderr_path": last["stderr_path"] if last else None,
            }
        )
    return result


def live_workers(run: Reads, now: float, *, include_all: bool = False) -> list[dict[str, Any]]:
    result = []
    waits = server_waits(run, include_all=include_all)
    for row in run.all(WORKERS_ALL if include_all else WORKERS_RUNNING, {}):
        jobs = run.all(WORKER_JOBS, {"worker": row["id"]})
        running = [r["id"] for r in jobs]
        suspended = [
            r["id"] for r in jobs if suspended_since({**r, "state": "running"}) is not None
        ]
        entry = {**row, "heartbeat_age_s": None, "running_jobs": running}
        entry["suspended_jobs"] = suspended
        entry["waited_for_server"] = waits.get(row["id"])
        if isinstance(row["heartbeat_at"], int | float):
            entry["heartbeat_age_s"] = round(max(0.0, now - row["heartbeat_at"]), 3)
        else:
            entry["damaged"] = [f"heartbeat_at: not a number {row['heartbeat_at']!r:.80}"]
        result.append(entry)
    return result


def server_waits(run: Reads, *, include_all: bool) -> dict[str, dict[str, Any]]:
    """Per worker id: how its start waited for an unreachable server
    (`waited_s`, `failed_tries`, `error`), from the event its registration
    wrote (at its started_at, so a later worker reusing the id does not
    inherit it)."""
    found = {}
    for row in run.all(SERVER_WAITS_ALL if include_all else SERVER_WAITS_RUNNING, {}):
        detail = event_detail(row["detail"])
        found[row["worker_id"]] = {k: detail.get(k) for k in ("waited_s", "failed_tries", "error")}
    return found


def unconfirmed_orphans(run: Reads) -> list[dict[str, Any]]:
    """Running jobs whose current attempt is flagged `orphan_unconfirmed`: their
    worker is gone, but a process of the attempt may still run, so the job is
    not requeued until it is confirmed gone. Oldest flag first."""
    found: dict[int, dict[str, Any]] = {}
    for row in run.all(ORPHANS, {}):
        detail = event_detail(row["detail"])
        job_id, attempt_id = row["job_id"], row["attempt_id"]
        if detail.get("attempt_id") != attempt_id:
            continue  # a flag of an earlier attempt
        since = found[job_id]["since"] if job_id in found else row["at"]
        found[job_id] = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "pid": _int_or_none(detail.get("pid")),
            "reason": _str_or_none(detail.get("reason")),
            "dead_worker": _str_or_none(detail.get("dead_worker")),
            "since": since,
        }
    return list(found.values())


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def status_summary(run: Reads, now: float, *, dead_limit: int = 10) -> dict[str, Any]:
    """The totals are the sums of the per-lane counts: the jobs table is read
    once, through the claim index (see lane_summary)."""
    by_lane = lane_summary(run, now)
    counts = {s.value: 0 for s in JobState}
    for entry in by_lane.values():
        for state, count in entry["counts"].items():
            counts[state] = counts.get(state, 0) + count
    return {
        "counts": counts,
        "scheduled": sum(entry["scheduled"] for entry in by_lane.values()),
        "suspended": sum(entry["suspended"] for entry in by_lane.values()),
        "queues": by_lane,
        "recent_dead": recent_dead(run, dead_limit),
        "workers": live_workers(run, now),
        "orphans_unconfirmed": unconfirmed_orphans(run),
    }


def paused_lanes(run: Reads) -> list[dict[str, Any]]:
    """Every paused lane: queue (its name), paused_at, paused_by, reason."""
    return run.all(PAUSED_LANES, {})


def schedule_summary(run: Reads) -> dict[str, Any]:
    """How many schedules, and the next one due."""
    count = run.first(SCHEDULE_COUNT, {})
    row = run.first(NEXT_SCHEDULE, {})
    nxt = None if row is None else {"name": row["name"], "at": row["next_fire_at"]}
    return {"count": int((count or {}).get("n") or 0), "next": nxt}


def waiting_for_limits(run: Reads, now: float) -> list[int]:
    """Due queued jobs that require their --memory/--cpus to be enforced
    (--require-limits), oldest first, at most WAITING_FOR_LIMITS_SHOWN."""
    return [int(r["id"]) for r in run.all(WAITING_FOR_LIMITS, {"now": now})]


def status_data(run: Reads, now: float, dead_limit: int) -> dict[str, Any]:
    """`status`'s answer: the summary, the paused lanes (and a `paused` flag
    on each lane), the schedules and the jobs waiting for limits."""
    data = status_summary(run, now, dead_limit=dead_limit)
    paused = paused_lanes(run)
    names = {p["queue"] for p in paused}
    for name, entry in data["queues"].items():
        entry["paused"] = name in names
    data["paused_lanes"] = paused
    data["schedules"] = schedule_summary(run)
    data["waiting_for_limits"] = waiting_for_limits(run, now)
    return data
