"""What the web and `metrics` read of placement beyond `placement_reads`: one
job's request, its attempts' devices and whether they are still held, and
why it cannot be placed; the unplaceable jobs counted per lane; the workers'
inventories with who holds each device.

The rule for unplaceable is `placement_views`' (one for every view): a
queued job that asks for resources, in a lane with live workers none of
which could hold it even idle (a lane without a live worker is not counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, select

from spoolctl.db.tables import devices
from spoolctl.resources import Request, gpus_text, parse_gpus
from spoolctl.services import placement_views
from spoolctl.services.placement import holds_of
from spoolctl.services.placement_reads import device_table, unplaceable
from spoolctl.services.statements import reads


def unplaceable_by_lane(conn: Connection, now: float, threshold_s: float) -> dict[str, int]:
    """How many queued jobs of each lane no live worker of it could hold
    (lanes without one are not read: none of their jobs is counted)."""
    found = placement_views.unplaceable_by_lane(reads(conn), now, threshold_s, limit=0)
    return {lane: lane_found.count for lane, lane_found in found.items()}


def stored_request(job: Mapping[str, Any]) -> Request | None:
    """The request of a job as the views read it (`gpus` as `--gpus` takes
    it: "2", "0.5"), or as its row stores it (None: a damaged row's)."""
    row = dict(job)
    try:
        if isinstance(row.get("gpus"), str):
            row["gpus"], row["gpu_share"] = parse_gpus(row["gpus"])
        return Request.of_row(SimpleNamespace(**row))
    except (ValueError, TypeError):
        return None


def request_of(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """A job's request as its page shows it (None: it asks for one slot only,
    or the row is damaged). `memory_bytes` is left out: the page shows it as
    the job's memory."""
    request = stored_request(job)
    if request is None or (request.weight == 1 and not request.gpus):
        return None
    return {
        "weight": request.weight,
        "gpus": gpus_text(request.gpus, request.share),
        "gpu_memory_bytes": request.gpu_memory_bytes,
        "gpu_model": request.gpu_model,
    }


def job_placement(
    conn: Connection,
    job: Mapping[str, Any],
    attempts: Sequence[Mapping[str, Any]],
    now: float,
    threshold_s: float,
) -> dict[str, Any]:
    """One job's request, the devices each attempt still holds (attempt id ->
    UUIDs), the registered devices its attempts name (UUID -> host, index,
    model), and why it cannot be placed (a queued job only; None: it can,
    or no live worker serves its lane)."""
    held = holds_of(conn, [int(a["id"]) for a in attempts])
    named = [u for a in attempts for u in a.get("devices") or ()]
    reason = None
    if stored_request(job) is not None:  # a damaged row's request reads as none
        reason = placement_views.unplaceable_reason(reads(conn), job, now, threshold_s)
    return {
        "request": request_of(job),
        "held": held,
        "named": devices_named(conn, named),
        "unplaceable": reason,
    }


def devices_named(conn: Connection, uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The registered devices among these UUIDs: host, index and model."""
    wanted = sorted(set(uuids))
    if not wanted:
        return {}
    query = select(devices.c.uuid, devices.c.host, devices.c.idx, devices.c.model).where(
        devices.c.uuid.in_(wanted)
    )
    return {
        str(r.uuid): {"host": r.host, "index": int(r.idx), "model": r.model}
        for r in conn.execute(query)
    }


def inventory_of(shown: Any) -> dict[str, Any] | None:
    """A worker's inventory as its entry carries it
    (`placement_views.inventory_view`: None where it registered none or the
    stored value is damaged), kept only where it has more than slots."""
    if not isinstance(shown, Mapping):
        return None
    if not shown.get("devices") and shown.get("memory_bytes") is None:
        return None
    return dict(shown)


def with_holders(
    inventory: dict[str, Any] | None, table: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The inventory's devices, each with its held share and holders from
    `placement_reads.device_table` (a device not registered: nothing held)."""
    if inventory is None or "devices" not in inventory:
        return inventory
    by_uuid = {str(d["uuid"]): d for d in table}
    shown = []
    for device in inventory["devices"]:
        row = by_uuid.get(str(device["uuid"]), {})
        shown.append(
            {**device, "held_share": row.get("held_share", 0.0), "holders": row.get("holders", [])}
        )
    return {**inventory, "devices": shown}


def gpu_totals(table: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The overview's GPU card: devices registered, the sum of their held
    shares, what is free of them, and how many are wholly free (None: no
    device is registered)."""
    if not table:
        return None
    held = round(sum(float(d["held_share"]) for d in table), 4)
    return {
        "devices": len(table),
        "held": held,
        "free": round(len(table) - held, 4),
        "idle": sum(1 for d in table if not d["holders"] and float(d["held_share"]) == 0),
    }


def overview(
    conn: Connection, workers: list[dict[str, Any]], now: float, threshold_s: float
) -> dict[str, Any]:
    """The web overview's part: the GPU card (None: no device registered),
    the unplaceable jobs (an exact count, the first ones named), and each
    worker's inventory with who holds each of its devices
    (`inventory_shown`, set on each worker's entry)."""
    table = device_table(conn)
    for worker in workers:
        found = inventory_of(worker.get("inventory"))
        worker["inventory_shown"] = with_holders(found, table)
    stuck = unplaceable(conn, now, threshold_s)
    return {
        "gpus": gpu_totals(table),
        "unplaceable": {"count": stuck.count, "jobs": [job.as_dict() for job in stuck.jobs]},
    }
