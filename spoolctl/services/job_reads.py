"""What `list` and `show` read, assembled from the named statements of
`services/readings.py`. Light (no SQLAlchemy): the click verbs and the lean
path both assemble a page of jobs and one job with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spoolctl.db import codec
from spoolctl.services import placement_views
from spoolctl.services.readings import (
    ATTEMPT_COUNTS,
    CHUNK,
    DEPENDENTS,
    ENDING_EVENTS,
    FIRST_JOB_ID,
    JOB_ATTEMPTS,
    JOB_BY_ID,
    JOB_EVENTS,
    LIST_FIELDS,
    WAITS_FOR,
    ListShape,
    Reads,
    decode_job,
    list_name,
    suspended_since,
)

# -- list ------------------------------------------------------------------------


def chunks(ids: Sequence[int]) -> list[dict[str, Any]]:
    """The binds of ATTEMPT_COUNTS and WAITS_FOR over ids, CHUNK at a time."""
    found = []
    for start in range(0, len(ids), CHUNK):
        part: list[int | None] = list(ids[start : start + CHUNK])
        part += [None] * (CHUNK - len(part))
        found.append({f"id_{i}": value for i, value in enumerate(part)})
    return found


def attempt_counts(run: Reads, job_ids: Sequence[int]) -> dict[int, int]:
    """How many attempts each of these jobs has had; a job with none is absent."""
    return {
        int(row["job_id"]): int(row["n"])
        for binds in chunks(job_ids)
        for row in run.all(ATTEMPT_COUNTS, binds)
    }


def waits_for(run: Reads, job_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """For each job, the jobs it was submitted after, with their states."""
    found: dict[int, list[dict[str, Any]]] = {}
    for binds in chunks(job_ids):
        for row in run.all(WAITS_FOR, binds):
            found.setdefault(int(row["job_id"]), []).append(
                {"job_id": int(row["after_job_id"]), "state": row["state"]}
            )
    return found


def running_places(run: Reads, job_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Job id -> `host` and `devices` (GPU UUIDs) of its running attempt."""
    return {
        int(r["job_id"]): {"host": r["host"], "devices": placement_views.device_ids(r["devices"])}
        for binds in (chunks(job_ids) if job_ids else [])
        for r in run.all(placement_views.RUNNING_PLACES, binds)
    }


def list_entry(row: dict[str, Any]) -> dict[str, Any]:
    """A job as `list` shows it: env values are left out (only key names);
    `suspended_at` and `suspended` say whether a running job is suspended."""
    job = decode_job(row)
    entry = {name: job[name] for name in LIST_FIELDS}
    entry["env_keys"] = sorted(job["env"] or {})
    entry["suspended_at"] = suspended_since(job)
    entry["suspended"] = entry["suspended_at"] is not None
    if "damaged" in job:
        entry["damaged"] = job["damaged"]
    return entry


def paginated(
    found: list[dict[str, Any]], limit: int, first_id: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A page of `list` from the rows found with one extra (more matched than
    `limit` when it came), and its pagination: `cursor` is the oldest id
    shown (0 when none), `first_id` the oldest id in the queue."""
    page = found[:limit] if limit else found
    pagination = {
        "cursor": page[-1]["id"] if page else 0,
        "first_id": first_id,
        "limit": limit,
        "truncated": len(found) > len(page),
    }
    return page, pagination


def first_job_id(run: Reads) -> int | None:
    row = run.first(FIRST_JOB_ID, {})
    return None if row is None else row["n"]


def list_binds(
    state: str | None, lane: str | None, priority_min: int | None, limit: int
) -> tuple[str, dict[str, Any]]:
    """The `list` statement for these filters and its binds (one row more
    than `limit`, to tell whether more matched)."""
    shape = ListShape(state is not None, lane is not None, priority_min is not None, limit > 0)
    binds = {"state": state, "lane": lane, "priority_min": priority_min, "limit": limit + 1}
    return list_name(shape), binds


def list_page(
    run: Reads, state: str | None, lane: str | None, priority_min: int | None, limit: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One page of `list` by the filters a named statement serves."""
    name, binds = list_binds(state, lane, priority_min, limit)
    found = [list_entry(row) for row in run.all(name, binds)]
    return paginated(found, limit, first_job_id(run))


def with_waits(run: Reads, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job with the ids it waits for and its number of attempts
    (`attempts_total`; `attempts` counts failures, as in 0.4.11)."""
    ids = [j["id"] for j in jobs]
    waits = waits_for(run, ids)
    counts = attempt_counts(run, ids)
    running = [j["id"] for j in jobs if j["state"] == "running"]
    places = running_places(run, running)
    for job in jobs:
        job["after_jobs"] = [p["job_id"] for p in waits.get(job["id"], [])]
        job["attempts_total"] = counts.get(job["id"], 0)
        place = places.get(job["id"], {})
        job["host"] = place.get("host")
        job["devices"] = place.get("devices", [])
    return jobs


# -- show ------------------------------------------------------------------------


def attempt_signals(events: list[dict[str, Any]]) -> dict[int, int]:
    """attempt number -> the signal that ended it, read from the ledger: the
    `failed`/`timed_out` event's detail is the one place it is kept (a timed-out
    attempt's exit_code is null). Events written before it was kept, or damaged
    ones, name no signal."""
    found: dict[int, int] = {}
    for event in events:
        detail = event["detail"]
        if event["event"] in ENDING_EVENTS and isinstance(detail, dict):
            number, signal = detail.get("attempt"), detail.get("signal")
            if type(number) is int and type(signal) is int:
                found[number] = signal
    return found


def job_detail(run: Reads, job_id: int) -> dict[str, Any] | None:
    """The job with every column, its attempts and its events."""
    row = run.first(JOB_BY_ID, {"id": job_id})
    if row is None:
        return None
    attempts = run.all(JOB_ATTEMPTS, {"job_id": job_id})
    events = [
        {**e, "detail": codec.load_detail(e["detail"])}
        for e in run.all(JOB_EVENTS, {"job_id": job_id})
    ]
    signals = attempt_signals(events)
    holds = placement_views.job_holds(run, job_id) if attempts else {}
    return {
        "job": decode_job(row),
        "attempts": [
            {
                **a,
                "signal": signals.get(a["attempt_no"]),
                "devices": placement_views.device_ids(a.get("devices")),
                "holds": holds.get(a["id"], []),
            }
            for a in attempts
        ],
        "events": events,
    }


def dependents_of(run: Reads, job_id: int) -> list[int]:
    return [int(r["job_id"]) for r in run.all(DEPENDENTS, {"job_id": job_id})]


def show_data(run: Reads, job_id: int, now: float, live_within_s: float) -> dict[str, Any] | None:
    """`show`'s answer: the job in full, what it waits for and what waits for
    it, and why no worker heard from within `live_within_s` could hold it
    (`unplaceable`: a queued job's, else null)."""
    detail = job_detail(run, job_id)
    if detail is not None:
        detail["after_jobs"] = waits_for(run, [job_id]).get(job_id, [])
        detail["dependents"] = dependents_of(run, job_id)
        job = detail["job"]
        detail["unplaceable"] = placement_views.unplaceable_reason(run, job, now, live_within_s)
    return detail


def list_data(
    run: Reads, state: str | None, lane: str | None, priority_min: int | None, limit: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`list`'s page, each job with what it waits for and its attempts, and
    its pagination."""
    jobs, pagination = list_page(run, state, lane, priority_min, limit)
    return with_waits(run, jobs), pagination
