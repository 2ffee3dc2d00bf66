"""Where the claim puts a job that asks for resources, and the device holds.

A job with a request (`resources.Request`: a weight, GPUs, memory) is claimed
by the claim's one-at-a-time walk (`services/claim.py`), which asks `Walk`
whether each due job of the lane fits what the worker has free, in claim
order, skipping those that do not. The devices a job is given are held in
the database in the claim's own transaction: `devices.held` grows by the
hold's units under a CHECK that makes an over-hold impossible, whichever
worker on whichever machine tries, and a `device_holds` row says by whom.

A hold is released when the attempt's end is recorded by its worker
(`services/outcome.py`), or, after a crash, by the reap that confirmed its
processes gone (`services/reaper.py`); a hold whose attempt was ended by
someone else (canceled, reaped) while its worker died too is released by the
sweep once the attempt's processes are gone (`release_lingering`).

Big jobs are not starved: the first due job of the lane that does not fit
now but that this worker could hold is reserved for (`Free.reserve`): what it
needs is withheld from the jobs ranked after it. For a GPU job only the
workers of one host reserve: the live host with enough devices of its kind
that has the most of them free (ties: the host's name), so the rest of the
fleet goes on; for slots and memory every worker that could hold it does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Integer, bindparam, delete, insert, select, update

from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts, device_holds, devices, workers
from spoolctl.resources import DEVICE_UNITS, Free, Inventory, Request
from spoolctl.services import lease, lingering
from spoolctl.states import AttemptState, WorkerState


def register(conn: Connection, inventory: Inventory, now: float) -> None:
    """The worker's devices as rows of `devices` (new ones free; known ones
    keep what they hold and take what this worker saw of them)."""
    if not inventory.devices:
        return
    known = set(
        conn.execute(
            select(devices.c.uuid).where(devices.c.uuid.in_([d.uuid for d in inventory.devices]))
        ).scalars()
    )
    for device in sorted(inventory.devices, key=lambda d: d.uuid):
        seen = {
            "host": inventory.host,
            "idx": device.index,
            "model": device.model,
            "memory_bytes": device.memory_bytes,
            "seen_at": now,
        }
        if device.uuid in known:
            conn.execute(update(devices).where(devices.c.uuid == device.uuid).values(**seen))
        else:
            conn.execute(insert(devices).values(uuid=device.uuid, held=0, **seen))


_FREE_UNITS = Prepared(
    select(devices.c.uuid, devices.c.held)
    .where(devices.c.host == bindparam("b_host"))
    .order_by(devices.c.uuid)
    .with_for_update()
)
_ADD_HELD = Prepared(
    update(devices)
    .where(devices.c.uuid == bindparam("b_uuid"))
    .values(held=devices.c.held + bindparam("b_units", type_=Integer))
)
_INSERT_HOLD = Prepared(
    insert(device_holds).values(
        device_uuid=bindparam("b_uuid"),
        attempt_id=bindparam("b_attempt"),
        job_id=bindparam("b_job"),
        units=bindparam("b_units"),
        worker_id=bindparam("b_worker"),
        held_at=bindparam("b_now"),
    )
)
_HOLDS_OF = Prepared(
    select(device_holds.c.device_uuid, device_holds.c.units).where(
        device_holds.c.attempt_id == bindparam("b_attempt")
    )
)
_DROP_HOLDS = Prepared(
    delete(device_holds).where(device_holds.c.attempt_id == bindparam("b_attempt"))
)
"""Built once: the claim and the record of an end bind values."""


def free_units(conn: Connection, inventory: Inventory) -> dict[str, int]:
    """Each of the inventory's devices' free units, read in the claim's
    transaction with the host's device rows locked until it commits
    (PostgreSQL's way of serialising workers placing on one host; SQLite's
    write lock already does, and SQLite has no FOR UPDATE). Every writer
    of `devices.held` takes its rows in UUID order, so two transactions
    never wait for each other in a circle."""
    mine = {d.uuid for d in inventory.devices}
    if not mine:
        return {}
    rows = _FREE_UNITS.all(conn, {"b_host": inventory.host})
    return {r.uuid: DEVICE_UNITS - int(r.held) for r in rows if r.uuid in mine}


def hold(
    conn: Connection,
    attempt_id: int,
    job_id: int,
    request: Request,
    uuids: tuple[str, ...],
    by: tuple[str, float],
) -> None:
    """The attempt holds `request.units` of each of `uuids`. An integrity
    error (the CHECK) if that would over-hold one: the claim's transaction
    rolls back, nothing is claimed."""
    worker_id, now = by
    for uuid in sorted(uuids):
        _ADD_HELD.execute(conn, {"b_uuid": uuid, "b_units": request.units})
        _INSERT_HOLD.execute(
            conn,
            {
                "b_uuid": uuid,
                "b_attempt": attempt_id,
                "b_job": job_id,
                "b_units": request.units,
                "b_worker": worker_id,
                "b_now": now,
            },
        )


def release(conn: Connection, attempt_ids: Iterable[int]) -> int:
    """Release every hold of these attempts (their processes are gone); how
    many holds went."""
    ids = list(attempt_ids)
    rows = [(r.device_uuid, r.units) for i in ids for r in _HOLDS_OF.all(conn, {"b_attempt": i})]
    for uuid, units in sorted(rows):
        _ADD_HELD.execute(conn, {"b_uuid": uuid, "b_units": -int(units)})
    for attempt_id in ids:
        _DROP_HOLDS.execute(conn, {"b_attempt": attempt_id})
    return len(rows)


@dataclass(frozen=True)
class Here:
    """Who sweeps: its host, and the rules by which a worker elsewhere is
    judged (the reap threshold: alive; the hang threshold: its lease)."""

    host: str
    live_within_s: float
    hang_threshold_s: float


def release_lingering(conn: Connection, now: float, here: Here) -> list[int]:
    """Release the holds of attempts ended by someone else (canceled,
    reaped) whose worker is gone too, once their processes are gone: on this
    host, when `lingering.still_running` finds none (the rule the claim
    follows before a rerun); on another host, when the worker's lease ran
    out (`services/lease.py`: by then its own rule killed its jobs; with
    fencing off, never). Their own worker would have released them with its
    record of the end. The attempts released."""
    alive = (
        select(workers.c.id)
        .where(
            workers.c.state == WorkerState.RUNNING.value,
            workers.c.heartbeat_at >= now - here.live_within_s,
        )
        .scalar_subquery()
    )
    query = (
        select(
            *lingering.PROCESS_COLUMNS,
            attempts.c.finished_at,
            attempts.c.host,
            workers.c.heartbeat_at,
        )
        .distinct()
        .select_from(
            device_holds.join(attempts, attempts.c.id == device_holds.c.attempt_id).outerjoin(
                workers, workers.c.id == device_holds.c.worker_id
            )
        )
        .where(
            attempts.c.state != AttemptState.RUNNING.value,
            device_holds.c.worker_id.not_in(alive),
        )
    )
    gone = [int(a.id) for a in conn.execute(query) if _gone(a, now, here)]
    release(conn, gone)
    return gone


def _gone(attempt: Any, now: float, here: Here) -> bool:
    if attempt.host == here.host:
        return not lingering.still_running(attempt, now)
    last_sign = attempt.heartbeat_at if attempt.heartbeat_at is not None else attempt.finished_at
    return last_sign is not None and lease.lease_expired(now, last_sign, here.hang_threshold_s)


def holds_of(conn: Connection, attempt_ids: Iterable[int]) -> dict[int, list[str]]:
    """Attempt id -> the UUIDs of the devices it still holds."""
    ids = list(attempt_ids)
    held: dict[int, list[str]] = {}
    if not ids:
        return held
    query = (
        select(device_holds.c.attempt_id, device_holds.c.device_uuid)
        .where(device_holds.c.attempt_id.in_(ids))
        .order_by(device_holds.c.id)
    )
    for attempt_id, uuid in conn.execute(query):
        held.setdefault(int(attempt_id), []).append(str(uuid))
    return held


def live_inventories(
    conn: Connection, now: float, threshold_s: float
) -> list[tuple[str, str, Inventory]]:
    """(worker id, lane, inventory) of every worker whose heartbeat is within
    the reap threshold."""
    query = select(workers.c.id, workers.c.queue, workers.c.concurrency, workers.c.inventory).where(
        workers.c.state == WorkerState.RUNNING.value, workers.c.heartbeat_at >= now - threshold_s
    )
    return [(str(r.id), str(r.queue), _inventory(r)) for r in conn.execute(query)]


def _inventory(row: Any) -> Inventory:
    """A worker row's inventory; a damaged one counts as its slots alone."""
    slots = int(row.concurrency or 1)
    try:
        return Inventory.from_json(row.inventory, slots)
    except (ValueError, TypeError, KeyError, AttributeError):
        return Inventory(slots)


class Walk:
    """One claim's view of what a worker has free, asked job by job in claim
    order (`take`), with the reservation for the first big job it meets."""

    def __init__(
        self,
        conn: Connection,
        inventory: Inventory,
        free: Free,
        *,
        lane: str,
        now: float,
        threshold_s: float,
    ) -> None:
        self.conn, self.inventory, self.free = conn, inventory, free
        self.lane, self.now, self.threshold_s = lane, now, threshold_s
        self.reserved_for: int | None = None
        """The job this walk reserved for (at most one per claim)."""
        self._fleet: tuple[list[Inventory], dict[str, int]] | None = None
        """The lane's live inventories and every device's free units, read
        once per walk, the first time a GPU job does not fit."""
        self._chosen: dict[Request, str | None] = {}

    @property
    def full(self) -> bool:
        """No slot is left for any job."""
        return self.free.slots <= 0

    def take(self, job_id: int, request: Request) -> tuple[str, ...] | None:
        """The devices the job gets if it fits (() for none), taken from what
        is free; None: not now (skip it), after reserving for it where it is
        the first job met that this worker should reserve for."""
        placed = self.free.fit(request, self.inventory)
        if placed is not None:
            return placed
        if self.reserved_for is None and self._reserves_for(request):
            self.reserved_for = job_id
            self.free.reserve(request, self.inventory)
        return None

    def _reserves_for(self, request: Request) -> bool:
        if self.inventory.cannot_hold(request) is not None:
            return False
        if not request.gpus:
            return True
        if request not in self._chosen:
            self._chosen[request] = self._chosen_host(request)
        return self._chosen[request] == self.inventory.host

    def _read_fleet(self) -> tuple[list[Inventory], dict[str, int]]:
        if self._fleet is None:
            live = live_inventories(self.conn, self.now, self.threshold_s)
            lane = [self.inventory, *(inv for _, queue, inv in live if queue == self.lane)]
            free = {
                r.uuid: DEVICE_UNITS - int(r.held)
                for r in self.conn.execute(select(devices.c.uuid, devices.c.held))
            }
            self._fleet = (lane, free)
        return self._fleet

    def _chosen_host(self, request: Request) -> str | None:
        """The live host that reserves for a GPU job: of those with enough
        devices of its kind, the one with most of them free (ties: name)."""
        lane, free = self._read_fleet()
        by_host: dict[str, dict[str, Any]] = {}
        for inventory in lane:
            if inventory.cannot_hold(request) is not None:
                continue
            for device in inventory.devices:
                if request.eligible(device):
                    by_host.setdefault(inventory.host, {})[device.uuid] = device
        if not by_host:
            return None

        def room(host: str) -> tuple[int, str]:
            best = sorted((free.get(u, 0) for u in by_host[host]), reverse=True)
            return (-sum(best[: request.gpus]), host)

        return min(by_host, key=room)
