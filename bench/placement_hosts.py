"""Simulated GPU hosts driving the real claim in-process, for the placement
benchmarks (`placement_cost.py`, `placement_run.py`).

Each `Host` is one worker as `spoolctl work` has it: a `Capacity` with
declared devices, a `Claimant`, and a `workers` row (with its inventory and
its devices registered, as a worker's start does), so the claim's
reservation sees the other hosts as live. It claims with the real
`claim_up_to` and records ends with the real `record_outcomes`, each in its
own write transaction, at a `now` the caller chooses (a virtual clock)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, update

from spoolctl.cli.database import open_write
from spoolctl.db.queue import Queue
from spoolctl.db.tables import jobs, workers
from spoolctl.resources import Device
from spoolctl.runner.capacity import Capacity, Place
from spoolctl.services import claim
from spoolctl.services.heartbeat import WorkerInfo, register_worker
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.outcome import Ending, Outcome, record_outcomes
from spoolctl.services.submit import submit_batch

GIB = 1 << 30


def devices_of(host: str, count: int, model: str = "Fake A100") -> tuple[Device, ...]:
    return tuple(Device(f"GPU-{host}-{i}", i, model, 80 * GIB) for i in range(count))


def open_queue(folder: Path) -> Queue:
    """A new SQLite queue in `folder` (created with its schema)."""
    folder.mkdir(parents=True, exist_ok=True)
    return open_write(str(folder / "queue.db"))


def add_jobs(queue: Queue, requests: Sequence[dict[str, Any]], now: float) -> list[int]:
    """One `true` job per request (its columns: weight, gpus, gpu_share …),
    due at `now`, in order; an empty request is a plain job."""

    def run(conn: Connection) -> list[int]:
        ids = submit_batch(conn, [JobSpec(argv=["true"]) for _ in requests], now)
        for job_id, request in zip(ids, requests, strict=True):
            if request:
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(**request))
        return ids

    return queue.write(run)


class Host:
    """One worker on a simulated host: its capacity, claimant and places."""

    def __init__(
        self, queue: Queue, name: str, *, slots: int, gpus: int, now: float, live_s: float = 30.0
    ) -> None:
        self.queue, self.name = queue, name
        self.capacity = Capacity(slots, devices=devices_of(name, gpus) if gpus else (), host=name)
        inventory = self.capacity.inventory
        self.worker_id = f"w-{name}"
        self.claimant = claim.Claimant(
            self.worker_id,
            os.getpid(),
            "default",
            Path(str(queue.output_root)),
            cap=self.capacity,
            inventory=inventory,
            live_within_s=live_s,
        )
        info = WorkerInfo(
            self.worker_id,
            name,
            os.getpid(),
            None,
            "boot",
            "default",
            None,
            slots,
            inventory=inventory,
        )
        queue.write(lambda conn: register_worker(conn, info, now))
        self.places: dict[int, tuple[claim.Claim, Place]] = {}

    def beat(self, now: float) -> None:
        """The worker's heartbeat at `now` (it stays live for the others)."""
        query = update(workers).where(workers.c.id == self.worker_id).values(heartbeat_at=now)
        self.queue.write(lambda conn: conn.execute(query))

    def claim(self, now: float) -> list[claim.Claim]:
        """One claim of as many jobs as fit what is free, as a worker's pass."""
        room = self.capacity.room()
        if room.slots <= 0:
            return []
        want = self.capacity.take()
        got = self.queue.write(lambda conn: claim.claim_up_to(conn, self.claimant, want, now, room))
        for c in got:
            self.places[c.attempt_id] = (c, self.capacity.allocate(c))
        return got

    def end(self, attempt_ids: Sequence[int], now: float) -> None:
        """Record the ends of these attempts (succeeded) and free their places."""
        taken = [self.places.pop(a) for a in attempt_ids]
        endings = [
            Ending(c.job_id, c.attempt_id, c.attempt_no, Outcome(0, None), holds=bool(c.devices))
            for c, _ in taken
        ]
        self.queue.write(
            lambda conn: record_outcomes(conn, endings, worker_id=self.worker_id, now=now)
        )
        for _, place in taken:
            self.capacity.release(place)
