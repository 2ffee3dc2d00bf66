"""What a job needs (`Request`) and what a worker has (`Inventory`), and how
one is fitted into the other (`fit`): the placement's pure rules, shared by
the claim (`services/placement.py`), the views and the checks at submit time.

A worker has slots (`--concurrency`), optionally a memory budget and GPUs,
each known by its UUID. A job asks for `weight` slots, optionally memory and
`gpus` devices: whole, or a 1/k share of one device (`--gpus 0.5`: at most
two such jobs on a device). A device's capacity is DEVICE_UNITS; a 1/k share
holds DEVICE_UNITS // k of it.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

DEVICE_UNITS = 720720
"""A device's capacity in units: divisible by every share 1/k, k = 1 … 16
(the same constant as the CHECK on `devices.held`)."""
MAX_SHARE_DIVISOR = 16
"""The smallest share is 1/16 of a device."""
MAX_GPUS = 64
"""At most this many whole devices per job."""
MAX_WEIGHT = 1024
"""At most this many slots per job (as `work --concurrency`)."""


class BadRequest(ValueError):
    """A request that cannot be: the message names what is wrong."""


@dataclass(frozen=True)
class Device:
    """One GPU as a worker sees it."""

    uuid: str
    index: int
    model: str
    memory_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "memory_bytes": self.memory_bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Device:
        memory = data.get("memory_bytes")
        return cls(
            str(data["uuid"]),
            int(data["index"]),
            str(data.get("model") or "unknown"),
            None if memory is None else int(memory),
        )


def parse_gpus(text: str) -> tuple[int, int]:
    """`--gpus` as (devices, share divisor k): "2" is (2, 1), "0.5" and
    "1/2" are (1, 2), "0" is (0, 1): none. BadRequest names what is wrong."""
    raw = text.strip()
    try:
        value = Fraction(raw)
    except (ValueError, ZeroDivisionError):
        raise BadRequest(
            f"--gpus takes a number of devices (1, 2 …) or a share of one (0.5, 1/3), not {text!r}"
        ) from None
    if value < 0:
        raise BadRequest(f"--gpus cannot be negative, got {text!r}")
    if value == 0:
        return 0, 1
    if value >= 1:
        if value.denominator != 1:
            raise BadRequest(f"--gpus above one must be whole devices, got {text!r}")
        if value > MAX_GPUS:
            raise BadRequest(f"--gpus is at most {MAX_GPUS} devices, got {text!r}")
        return int(value), 1
    if value.numerator != 1 or value.denominator > MAX_SHARE_DIVISOR:
        raise BadRequest(
            f"--gpus below one must be a share that divides one device, 1/k with k at "
            f"most {MAX_SHARE_DIVISOR} (0.5, 0.25, 1/3), got {text!r}"
        )
    return 1, value.denominator


def gpus_text(gpus: int | None, share: int | None) -> str | None:
    """A stored request as `--gpus` takes it ("2", "0.5", "1/3"); None: none."""
    if not gpus:
        return None
    if not share or share == 1:
        return str(gpus)
    exact = 1 / share
    return f"{exact:g}" if Fraction(f"{exact:g}") == Fraction(1, share) else f"1/{share}"


def model_matches(pattern: str, model: str) -> bool:
    """Whether a device's model matches `--gpu-model`: a case-insensitive
    glob (`*A100*`), or without wildcards a substring (`A100`)."""
    pattern, model = pattern.lower(), model.lower()
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(model, pattern)
    return pattern in model


@dataclass(frozen=True)
class Request:
    """What one job needs of a worker."""

    weight: int = 1
    gpus: int = 0
    share: int = 1
    """Each device is held 1/share (1: whole)."""
    gpu_memory_bytes: int | None = None
    gpu_model: str | None = None
    memory_bytes: int | None = None
    """`--memory`: reserved against a worker's budget where it has one."""

    @property
    def units(self) -> int:
        """How much of each of its devices it holds."""
        return DEVICE_UNITS // self.share

    @property
    def plain(self) -> bool:
        """Nothing to place: one slot."""
        return self.weight == 1 and not self.gpus and self.memory_bytes is None

    @classmethod
    def of_row(cls, row: Any) -> Request:
        """The request a job row carries (columns it lacks: none)."""

        def get(name: str) -> Any:
            return getattr(row, name, None)

        gpus = get("gpus") or 0
        return cls(
            weight=int(get("weight") or 1),
            gpus=int(gpus),
            share=int(get("gpu_share") or 1) if gpus else 1,
            gpu_memory_bytes=get("gpu_memory_bytes") if gpus else None,
            gpu_model=get("gpu_model") if gpus else None,
            memory_bytes=get("memory_bytes"),
        )

    def eligible(self, device: Device) -> bool:
        """Whether a device is of the kind this request takes."""
        floor = self.gpu_memory_bytes
        if floor is not None and (device.memory_bytes is None or device.memory_bytes < floor):
            return False
        return self.gpu_model is None or model_matches(self.gpu_model, device.model)

    def as_dict(self) -> dict[str, Any]:
        """The request as views show it."""
        return {
            "weight": self.weight,
            "gpus": gpus_text(self.gpus, self.share),
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpu_model": self.gpu_model,
        }


PLAIN = Request()


@dataclass(frozen=True)
class Inventory:
    """What one worker has to place jobs on."""

    slots: int
    memory_bytes: int | None = None
    """Its memory budget (None: none, memory is not counted)."""
    devices: tuple[Device, ...] = ()
    host: str = ""

    def as_json(self) -> str:
        return json.dumps(
            {
                "slots": self.slots,
                "memory_bytes": self.memory_bytes,
                "devices": [d.as_dict() for d in self.devices],
                "host": self.host,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None, slots: int = 1) -> Inventory:
        """A worker row's inventory (None, or an older worker's: its slots only)."""
        if not text:
            return cls(slots)
        data = json.loads(text)
        return cls(
            int(data.get("slots") or slots),
            data.get("memory_bytes"),
            tuple(Device.from_dict(d) for d in data.get("devices") or ()),
            str(data.get("host") or ""),
        )

    def cannot_hold(self, request: Request) -> str | None:
        """Why this worker could never run the job, even idle (None: it could)."""
        if request.weight > self.slots:
            return f"needs {request.weight} slots; the worker has {self.slots}"
        if (
            request.memory_bytes is not None
            and self.memory_bytes is not None
            and request.memory_bytes > self.memory_bytes
        ):
            return (
                f"needs {request.memory_bytes} bytes of memory; the budget is {self.memory_bytes}"
            )
        if request.gpus:
            kind = [d for d in self.devices if request.eligible(d)]
            if len(kind) < request.gpus:
                return f"needs {request.gpus} GPU(s){_kind(request)}; the worker has {len(kind)}"
        return None


def _kind(request: Request) -> str:
    parts = []
    if request.gpu_model:
        parts.append(f"model {request.gpu_model!r}")
    if request.gpu_memory_bytes is not None:
        parts.append(f"at least {request.gpu_memory_bytes} bytes of memory")
    return f" ({', '.join(parts)})" if parts else ""


@dataclass
class Free:
    """What a worker has free at one moment: slots, memory and each device's
    free units (read from the database: other workers on the host hold
    some). Fitting a request takes from it."""

    slots: int
    memory_bytes: int | None = None
    """None: no budget."""
    units: dict[str, int] = field(default_factory=dict)
    """Device UUID -> free units."""

    def fit(self, request: Request, inventory: Inventory) -> tuple[str, ...] | None:
        """The devices the request gets if it fits now (() for none), taking
        them from what is free; None: it does not fit, and nothing is taken."""
        if request.weight > self.slots:
            return None
        memory = request.memory_bytes
        if memory is not None and self.memory_bytes is not None and memory > self.memory_bytes:
            return None
        chosen = self._devices(request, inventory) if request.gpus else ()
        if chosen is None:
            return None
        self.take(request, chosen)
        return chosen

    def take(self, request: Request, devices: tuple[str, ...]) -> None:
        """Count `request` on `devices` as taken (a fit, or a reservation)."""
        self.slots -= request.weight
        if request.memory_bytes is not None and self.memory_bytes is not None:
            self.memory_bytes -= request.memory_bytes
        for uuid in devices:
            self.units[uuid] = self.units.get(uuid, 0) - request.units

    def _devices(self, request: Request, inventory: Inventory) -> tuple[str, ...] | None:
        """Whole devices: the free ones, lowest index first. A share: a device
        already shared with the least room that still fits it, before a
        fresh one (packing)."""
        kind = [d for d in inventory.devices if request.eligible(d)]
        need = request.units
        if request.share == 1:
            whole = [d.uuid for d in kind if self.units.get(d.uuid, 0) >= DEVICE_UNITS]
            return tuple(whole[: request.gpus]) if len(whole) >= request.gpus else None
        roomy = [d for d in kind if self.units.get(d.uuid, 0) >= need]
        if not roomy:
            return None
        best = min(roomy, key=lambda d: (self.units[d.uuid], d.index))
        return (best.uuid,)

    def reserve(self, request: Request, inventory: Inventory) -> None:
        """Withhold from lower-ranked jobs what `request` needs here: its slots
        and memory, and the eligible devices it would take (those with the most
        free first), so smaller jobs use only what it cannot."""
        devices: tuple[str, ...] = ()
        if request.gpus:
            kind = [d for d in inventory.devices if request.eligible(d)]
            kind.sort(key=lambda d: (-self.units.get(d.uuid, 0), d.index))
            devices = tuple(d.uuid for d in kind[: request.gpus])
        self.take(request, devices)
