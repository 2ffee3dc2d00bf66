"""What the views read of placement, light: the devices and who holds them,
each worker's inventory, the devices an attempt still holds, and the queued
jobs no live worker could ever hold, over named statements (written in
`services/statements.py`), so that the click verbs and the lean path of
`status`, `list` and `show` assemble them with the one code below
(`services/placement_reads.py` runs it on an SQLAlchemy connection).

No SQLAlchemy, no dataclasses, as `services/readings.py`. A queue with no
device registered and no job asking for resources pays one read of an
empty table and one of an empty partial index (ix_jobs_requests); the rules
(`resources.py`) are loaded only when a job asks for something and a live
worker serves its lane."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from spoolctl.resources import Inventory, Request


class Reads(Protocol):
    """Runs a named statement (`services/readings.py`'s Reads)."""

    def first(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def all(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]: ...


DEVICE_UNITS = 720720
"""A device's capacity in units (`resources.DEVICE_UNITS`, the CHECK's)."""
REQUESTED = ("weight", "gpus", "memory_bytes")
"""The columns of which a job that asks for resources has one
(`tables.REQUESTED`). Both copies here keep this module free of SQLAlchemy
and dataclasses; tests/unit/test_placement.py holds them equal."""
UNPLACEABLE_LIMIT = 100
"""At most this many unplaceable jobs are named (the count is exact)."""

DEVICE_TOTALS = "device_totals"
"""How many devices are registered, `n`, and the units held of them, `held`."""
DEVICE_ROWS = "device_rows"
"""Every registered device, by host and index."""
DEVICE_HOLDERS = "device_holders"
"""Every hold: device_uuid, job_id, attempt_id, worker_id, units."""
ASKING = "asking"
"""The queued jobs of lane `queue` that ask for resources (ix_jobs_requests),
by id: binds `before` (ANY_TIME)."""
ANY_TIME = 1e300
"""`before` for every queued job, due or not."""
LIVE_INVENTORIES = "live_inventories"
"""The running workers heard from since `since`: id, queue, concurrency, inventory."""
JOB_HOLDS = "job_holds"
"""(attempt_id, device_uuid) of what a job's attempts still hold: binds `job_id`."""
RUNNING_PLACES = "running_places"
"""(job_id, host, devices) of the running attempts of up to CHUNK jobs (`id_0`..)."""


class Unplaceable(NamedTuple):
    """A queued job that no live worker of its lane could hold, even idle."""

    job_id: int
    queue: str
    request: Request
    reason: str

    def as_dict(self) -> dict[str, Any]:
        from spoolctl.resources import gpus_text

        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "gpus": gpus_text(self.request.gpus, self.request.share),
            "weight": self.request.weight,
            "reason": self.reason,
        }


class Unplaceables:
    """The queued jobs no live worker could hold."""

    __slots__ = ("count", "jobs")

    def __init__(self, count: int, jobs: list[Unplaceable]) -> None:
        self.count = count
        """How many there are."""
        self.jobs = jobs
        """The first UNPLACEABLE_LIMIT of them, by id."""


NONE_UNPLACEABLE = Unplaceables(0, [])


# -- devices ----------------------------------------------------------------------


def share(units: object) -> float:
    """Units of a device as a share of it (0 … 1, four places; a sum of them
    is PostgreSQL's numeric, a Decimal)."""
    try:
        whole: int = int(units)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0.0
    return round(whole / DEVICE_UNITS, 4)


def device_totals(run: Reads) -> dict[str, Any]:
    """`count` devices registered, `held` (the sum of their held shares) and
    `free` (the rest)."""
    row = run.first(DEVICE_TOTALS, {}) or {}
    count = int(row.get("n") or 0)
    held = share(row.get("held") or 0)
    return {"count": count, "held": held, "free": round(count - held, 4)}


def device_list(run: Reads) -> list[dict[str, Any]]:
    """Every registered device with what is held of it and by which jobs
    (`held_share`: 0 … 1; `holders`: job id, attempt id, worker, share)."""
    holders: dict[str, list[dict[str, Any]]] = {}
    for h in run.all(DEVICE_HOLDERS, {}):
        holders.setdefault(str(h["device_uuid"]), []).append(
            {
                "job_id": h["job_id"],
                "attempt_id": h["attempt_id"],
                "worker_id": h["worker_id"],
                "share": share(h["units"]),
            }
        )
    return [
        {
            "uuid": r["uuid"],
            "host": r["host"],
            "index": r["idx"],
            "model": r["model"],
            "memory_bytes": r["memory_bytes"],
            "held_share": share(r["held"]),
            "holders": holders.get(str(r["uuid"]), []),
        }
        for r in run.all(DEVICE_ROWS, {})
    ]


# -- workers' inventories ----------------------------------------------------------


def inventory_view(raw: object, slots: object = 1) -> dict[str, Any] | None:
    """A worker row's inventory as views show it (slots, memory_bytes budget,
    host, devices with index, model, memory); None where it registered none
    or the stored value is damaged."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        data = json.loads(raw)
        devices = [
            {
                "uuid": str(d["uuid"]),
                "index": int(d["index"]),
                "model": str(d.get("model") or "unknown"),
                "memory_bytes": d.get("memory_bytes"),
            }
            for d in data.get("devices") or ()
        ]
        return {
            "slots": int(data.get("slots") or (slots if isinstance(slots, int) else 1)),
            "memory_bytes": data.get("memory_bytes"),
            "host": str(data.get("host") or ""),
            "devices": devices,
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def with_holds(workers: list[dict[str, Any]], run: Reads) -> None:
    """Each worker's inventory devices gain `held_share` and `holders` (read
    only where some worker has a device)."""
    shown = [d for w in workers for d in (w.get("inventory") or {}).get("devices", [])]
    if not shown:
        return
    table = {d["uuid"]: d for d in device_list(run)}
    for device in shown:
        known = table.get(device["uuid"], {})
        device["held_share"] = known.get("held_share", 0.0)
        device["holders"] = known.get("holders", [])


# -- attempts ------------------------------------------------------------------------


def device_ids(raw: object) -> list[str]:
    """An attempt's `devices` column (comma-separated UUIDs) as a list."""
    return [u for u in raw.split(",") if u] if isinstance(raw, str) else []


def job_holds(run: Reads, job_id: int) -> dict[int, list[str]]:
    """Attempt id -> the UUIDs of the devices it still holds."""
    held: dict[int, list[str]] = {}
    for row in run.all(JOB_HOLDS, {"job_id": job_id}):
        held.setdefault(int(row["attempt_id"]), []).append(str(row["device_uuid"]))
    return held


# -- unplaceable jobs ---------------------------------------------------------------


def _live_by_lane(run: Reads, now: float, threshold_s: float) -> dict[str, list[dict[str, Any]]]:
    """The rows of the live workers (id, queue, concurrency, inventory), per lane."""
    by_lane: dict[str, list[dict[str, Any]]] = {}
    for row in run.all(LIVE_INVENTORIES, {"since": now - threshold_s}):
        by_lane.setdefault(str(row["queue"]), []).append(row)
    return by_lane


def _inventories(rows: list[dict[str, Any]]) -> list[Inventory]:
    """Those workers' inventories (a damaged one: its slots alone); the rules
    are loaded only here, where some job of their lane asks for resources."""
    from spoolctl.resources import Inventory

    found = []
    for row in rows:
        slots = int(row["concurrency"] or 1)
        try:
            found.append(Inventory.from_json(row["inventory"], slots))
        except (ValueError, TypeError, KeyError, AttributeError):
            found.append(Inventory(slots))
    return found


def _judged(row: Mapping[str, Any], serving: list[Inventory]) -> Unplaceable | None:
    from spoolctl.resources import Request

    request = Request.of_row(_Row(row))
    reasons = [inventory.cannot_hold(request) for inventory in serving]
    if any(reason is None for reason in reasons):
        return None
    largest = max(serving, key=lambda inv: (len(inv.devices), inv.slots))
    why = largest.cannot_hold(request) or reasons[0] or ""
    lane = str(row["queue"])
    reason = f"no live worker of lane {lane!r} can hold it: {why}"
    return Unplaceable(int(row["id"]), lane, request, reason)


class _Row:
    """A row by column as `Request.of_row` reads one (attributes)."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        self.__dict__.update(row)


def unplaceable_by_lane(
    run: Reads, now: float, threshold_s: float, *, limit: int = UNPLACEABLE_LIMIT
) -> dict[str, Unplaceables]:
    """Each lane's queued jobs that ask for resources no live worker of the
    lane has (16 GPUs where the largest has 8, a model nobody has), the
    first `limit` named. Lanes without a live worker are not read: a worker
    may join, and `status` says no worker serves them."""
    found: dict[str, Unplaceables] = {}
    for lane, live in sorted(_live_by_lane(run, now, threshold_s).items()):
        asking = run.all(ASKING, {"queue": lane, "before": ANY_TIME})
        serving = _inventories(live) if asking else []
        judged = [j for row in asking if (j := _judged(row, serving)) is not None]
        if judged:
            found[lane] = Unplaceables(len(judged), judged[:limit])
    return found


def unplaceable_of(run: Reads, now: float, threshold_s: float) -> Unplaceables:
    """The queued jobs no live worker of their lane could hold, in every
    lane (`unplaceable_by_lane`), the first UNPLACEABLE_LIMIT by id named."""
    lanes = unplaceable_by_lane(run, now, threshold_s).values()
    named = sorted((u for found in lanes for u in found.jobs), key=lambda u: u.job_id)
    return Unplaceables(sum(found.count for found in lanes), named[:UNPLACEABLE_LIMIT])


def unplaceable_summary(run: Reads, now: float, threshold_s: float) -> dict[str, Any]:
    """`status`'s `unplaceable`: {count, jobs: [job_id, queue, gpus, weight, reason]}."""
    found = unplaceable_of(run, now, threshold_s)
    return {"count": found.count, "jobs": [u.as_dict() for u in found.jobs]}


def unplaceable_reason(
    run: Reads, job: Mapping[str, Any], now: float, threshold_s: float
) -> str | None:
    """Why no live worker could hold this queued job (None: one could, it
    asks for nothing, or no live worker serves its lane)."""
    asks = any(job.get(c) is not None for c in REQUESTED)
    if job.get("state") != "queued" or not asks:
        return None
    live = _live_by_lane(run, now, threshold_s).get(str(job.get("queue")))
    judged = _judged(job, _inventories(live)) if live else None
    return None if judged is None else judged.reason
