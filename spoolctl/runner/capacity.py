"""A worker's capacity: what it has (`resources.Inventory`: slots, a memory
budget, GPUs), the place each running attempt holds of it, and the cap of
its lane.

A worker asks its `Capacity` how many jobs it can take (`take`) and what it
has free (`room`, which the claim fits each job's request into), gives each
attempt it claimed a place (`allocate`: the lowest free slots, as many as the
job's weight, and the devices the claim gave it) and releases the place when
the attempt's end is recorded (`release`). The devices themselves are held
in the database, where every worker on a host sees them
(`services/placement.py`); this object counts only what is the worker's
alone. The lane's cap (`work --slots`: at most that many of the lane's jobs
running fleet-wide) is applied by `within_lane_cap`, with the count the claim
reads in its transaction (`services/claim.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spoolctl.resources import Device, Free, Inventory

if TYPE_CHECKING:
    from spoolctl.services.claimant import Claim

SLOT_ENV = b"SPOOLCTL_SLOT"
GPU_ENV = (b"CUDA_VISIBLE_DEVICES", b"NVIDIA_VISIBLE_DEVICES")
"""Name the attempt's devices by NVML index (the rest hidden)."""
GPU_ORDER_ENV = (b"CUDA_DEVICE_ORDER", b"PCI_BUS_ID")
"""CUDA numbers devices as NVML does (by PCI bus) only when told."""
GPU_UUIDS_ENV = b"SPOOLCTL_GPUS"


class NoPlace(RuntimeError):
    """An attempt was given a place while its slots were taken, or a place
    was released twice: a worker claims only what `Capacity.room` says fits
    and releases each place once, so this is a bug."""


@dataclass(frozen=True)
class Place:
    """Where one attempt runs in its worker: `slots` of 0 … N-1 (the first
    is SPOOLCTL_SLOT, to pin a port), the memory it reserved and the GPUs it
    was given (`devices`, of a worker that has any: the job sees exactly
    those)."""

    slots: tuple[int, ...]
    memory_bytes: int | None = None
    devices: tuple[Device, ...] = ()
    gpu_worker: bool = False
    """The worker has GPUs: the job's environment names its own (or none)."""
    environment: dict[bytes, bytes] = field(init=False, compare=False, repr=False)
    """What the job's environment gets from its place."""

    @property
    def slot(self) -> int:
        return self.slots[0]

    def __post_init__(self) -> None:
        env = {SLOT_ENV: b"%d" % self.slot}
        if self.gpu_worker:
            indexes = ",".join(str(d.index) for d in self.devices).encode()
            env.update({name: indexes for name in GPU_ENV})
            env[GPU_ORDER_ENV[0]] = GPU_ORDER_ENV[1]
            env[GPU_UUIDS_ENV] = ",".join(d.uuid for d in self.devices).encode()
        object.__setattr__(self, "environment", env)


class Capacity:
    """A worker's inventory, the places its running attempts hold, and its
    lane's cap (`--slots`, None: no cap)."""

    def __init__(
        self,
        slots: int,
        lane_cap: int | None = None,
        *,
        memory_bytes: int | None = None,
        devices: Iterable[Device] = (),
        host: str = "",
        manages_gpus: bool = False,
    ) -> None:
        if slots < 1:
            raise ValueError(f"a worker needs at least one slot, not {slots}")
        self.inventory = Inventory(slots, memory_bytes, tuple(devices), host)
        self.lane_cap = lane_cap
        self._devices = {d.uuid: d for d in self.inventory.devices}
        self._manages_gpus = manages_gpus or bool(self._devices)
        """Its jobs' environments name their GPUs (`work --gpus`, even `none`)."""
        self._taken: dict[int, Place] = {}
        """Slot -> the place holding it."""
        self._places: list[Place] = []

    @property
    def slots(self) -> int:
        return self.inventory.slots

    def take(self, wanted: int | None = None, *, ending: int = 0) -> int:
        """How many jobs of one slot this worker can take now (at most
        `wanted`; None: as many as fit): its free slots, counting those of
        the `ending` attempts whose ends are about to be recorded (in the same
        pass) as one each. The claim fits each job into `room`."""
        free = max(0, self.slots - len(self._taken) + ending)
        return free if wanted is None else min(wanted, free)

    def room(self, ending: Iterable[Place] = ()) -> Free:
        """What is free for the claim, counting what the `ending` places
        hold as free (their ends are recorded in the same pass). The devices'
        free units are the database's to say (`placement.free_units`)."""
        over = list(ending)
        held = [p for p in self._places if p not in over]
        slots = self.slots - sum(len(p.slots) for p in held)
        budget = self.inventory.memory_bytes
        if budget is not None:
            budget -= sum(p.memory_bytes or 0 for p in held)
        return Free(slots, budget)

    @property
    def idle(self) -> bool:
        """Some slot is free."""
        return len(self._taken) < self.slots

    def within_lane_cap(self, wanted: int, running: int) -> int:
        """How many of `wanted` jobs the lane's cap lets this worker claim
        while `running` jobs of the lane run fleet-wide (the claim counts
        them under the lane's lock, `Statements.before_cap_count`)."""
        if self.lane_cap is None:
            return wanted
        return max(0, min(wanted, self.lane_cap - running))

    def allocate(self, claim: Claim) -> Place:
        """The place claim's attempt runs in: the lowest free slots, as many
        as its weight, and the devices the claim gave it."""
        weight = claim.request.weight
        free = [slot for slot in range(self.slots) if slot not in self._taken][:weight]
        if len(free) < weight:
            raise NoPlace(
                f"job {claim.job_id} needs {weight} slot(s); "
                f"{self.slots - len(self._taken)} of {self.slots} are free"
            )
        place = Place(
            tuple(free),
            claim.request.memory_bytes,
            tuple(self._devices[uuid] for uuid in claim.devices if uuid in self._devices),
            gpu_worker=self._manages_gpus,
        )
        for slot in free:
            self._taken[slot] = place
        self._places.append(place)
        return place

    def release(self, place: Place) -> None:
        """The attempt in `place` is over: its slots are free again (NoPlace:
        it holds none)."""
        if place not in self._places:
            raise NoPlace(f"slots {place.slots} were released already")
        for slot in place.slots:
            self._taken.pop(slot, None)
        self._places.remove(place)

    def release_all(self) -> None:
        """Every attempt is over (a worker that stops)."""
        self._taken.clear()
        self._places.clear()
