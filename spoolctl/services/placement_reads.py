"""What the views read of placement: the devices and who holds them, and the
queued jobs no live worker could ever hold (`status`, `show`, `workers`,
`feedback`, `doctor`, the web and `metrics` all read these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, literal_column, or_, select

from spoolctl.db.tables import DEVICE_UNITS, device_holds, devices, jobs
from spoolctl.resources import Inventory, Request, gpus_text
from spoolctl.services.placement import live_inventories
from spoolctl.states import JobState

UNPLACEABLE_LIMIT = 100
"""At most this many unplaceable jobs are named (the count is exact)."""


@dataclass(frozen=True)
class Unplaceable:
    """A queued job that no live worker of its lane could hold, even idle."""

    job_id: int
    queue: str
    request: Request
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "gpus": gpus_text(self.request.gpus, self.request.share),
            "weight": self.request.weight,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Unplaceables:
    count: int
    """How many there are."""
    jobs: list[Unplaceable]
    """The first UNPLACEABLE_LIMIT of them, by id."""


def _asking() -> Any:
    """Queued jobs that ask for resources (the partial index ix_jobs_requests)."""
    return select(
        jobs.c.id,
        jobs.c.queue,
        jobs.c.weight,
        jobs.c.gpus,
        jobs.c.gpu_share,
        jobs.c.gpu_memory_bytes,
        jobs.c.gpu_model,
        jobs.c.memory_bytes,
    ).where(
        jobs.c.state == literal_column(f"'{JobState.QUEUED.value}'"),
        or_(jobs.c.weight.is_not(None), jobs.c.gpus.is_not(None), jobs.c.memory_bytes.is_not(None)),
    )


def unplaceable(conn: Connection, now: float, threshold_s: float) -> Unplaceables:
    """The queued jobs that ask for resources no live worker of their lane
    has (16 GPUs where the largest has 8, a model nobody has). A lane with
    no live worker at all is not counted: a worker may join, and `status`
    says no worker serves it."""
    by_lane: dict[str, list[Inventory]] = {}
    for _, lane, inventory in live_inventories(conn, now, threshold_s):
        by_lane.setdefault(lane, []).append(inventory)
    if not by_lane:
        return Unplaceables(0, [])
    found: list[Unplaceable] = []
    count = 0
    for row in conn.execute(_asking().order_by(jobs.c.id)):
        serving = by_lane.get(row.queue)
        if not serving:
            continue
        request = Request.of_row(row)
        reasons = [inventory.cannot_hold(request) for inventory in serving]
        if any(reason is None for reason in reasons):
            continue
        count += 1
        if len(found) < UNPLACEABLE_LIMIT:
            largest = max(serving, key=lambda inv: (len(inv.devices), inv.slots))
            why = largest.cannot_hold(request) or reasons[0] or ""
            found.append(
                Unplaceable(
                    int(row.id),
                    str(row.queue),
                    request,
                    f"no live worker of lane {row.queue!r} can hold it: {why}",
                )
            )
    return Unplaceables(count, found)


def device_table(conn: Connection) -> list[dict[str, Any]]:
    """Every registered device with what is held of it and by which jobs
    (`held_share`: 0 … 1; `holders`: job id, attempt id, worker, share)."""
    holders: dict[str, list[dict[str, Any]]] = {}
    query = select(
        device_holds.c.device_uuid,
        device_holds.c.job_id,
        device_holds.c.attempt_id,
        device_holds.c.worker_id,
        device_holds.c.units,
    ).order_by(device_holds.c.id)
    for uuid, job_id, attempt_id, worker_id, units in conn.execute(query):
        holders.setdefault(str(uuid), []).append(
            {
                "job_id": int(job_id),
                "attempt_id": int(attempt_id),
                "worker_id": str(worker_id),
                "share": round(int(units) / DEVICE_UNITS, 4),
            }
        )
    rows = conn.execute(select(devices).order_by(devices.c.host, devices.c.idx)).all()
    return [
        {
            "uuid": r.uuid,
            "host": r.host,
            "index": int(r.idx),
            "model": r.model,
            "memory_bytes": r.memory_bytes,
            "held_share": round(int(r.held) / DEVICE_UNITS, 4),
            "holders": holders.get(str(r.uuid), []),
        }
        for r in rows
    ]
