"""A worker's capacity: how many attempts it runs at once, the place each
one runs in, and the cap of its lane.

A worker asks its `Capacity` how many jobs it can take (`take`), gives each
attempt it claimed a place (`allocate`: today the lowest free slot, told to
the job as SPOOLCTL_SLOT) and releases the place when the attempt's end is
recorded (`release`). The lane's cap (`work --slots`: at most that many of
the lane's jobs running fleet-wide) is applied by `within_lane_cap`, with the
count the claim reads in its transaction (`services/claim.py`).

A job that needs several places, or specific devices, changes what `take`
counts, what `allocate` picks and what a `Place` carries, and nothing
outside this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spoolctl.services.claim import Claim

SLOT_ENV = b"SPOOLCTL_SLOT"


class NoPlace(RuntimeError):
    """An attempt was given a place while every place was taken: a worker
    claims only what `Capacity.take` says fits, so this is a bug."""


@dataclass(frozen=True)
class Place:
    """Where one attempt runs in its worker: slot `slot` of 0 … N-1, which
    the job reads as SPOOLCTL_SLOT (to pin a GPU or a port)."""

    slot: int
    environment: dict[bytes, bytes] = field(init=False, compare=False, repr=False)
    """What the job's environment gets from its place."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "environment", {SLOT_ENV: b"%d" % self.slot})


class Capacity:
    """A worker's places (`--concurrency` slots, numbered 0 … N-1) and its
    lane's cap (`--slots`, None: no cap)."""

    def __init__(self, slots: int, lane_cap: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a worker needs at least one slot, not {slots}")
        self.slots = slots
        self.lane_cap = lane_cap
        self._places = [Place(slot) for slot in range(slots)]
        self._taken: set[int] = set()

    def take(self, wanted: int | None = None, *, ending: int = 0) -> int:
        """How many jobs this worker can take now (at most `wanted`; None: as
        many as fit): its free slots, counting those of the `ending`
        attempts whose ends are about to be recorded (in the same pass)."""
        free = max(0, self.slots - len(self._taken) + ending)
        return free if wanted is None else min(wanted, free)

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
        """The place claim's attempt runs in: the lowest free slot."""
        for place in self._places:
            if place.slot not in self._taken:
                self._taken.add(place.slot)
                return place
        raise NoPlace(f"all {self.slots} slots are taken (job {claim.job_id})")

    def release(self, place: Place) -> None:
        """The attempt in `place` is over: its slot is free again."""
        self._taken.remove(place.slot)

    def release_all(self) -> None:
        """Every attempt is over (a worker that stops)."""
        self._taken.clear()
