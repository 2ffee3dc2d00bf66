"""The claim places jobs that ask for resources (`services/placement.py`):
only what fits is claimed, in claim order; devices are held in the database
under a CHECK, packed, released with the attempt's end; a big job is
reserved for; and the rules of `resources.py` on their own."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from spoolctl.cli.database import open_write
from spoolctl.db.queue import Queue
from spoolctl.db.tables import DEVICE_UNITS, attempts, device_holds, devices, jobs
from spoolctl.resources import (
    BadRequest,
    Device,
    Free,
    Inventory,
    Request,
    gpus_text,
    model_matches,
    parse_gpus,
)
from spoolctl.runner import procs
from spoolctl.runner.capacity import Capacity, Place
from spoolctl.services import claim, placement
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.outcome import Ending, Outcome, record_outcomes
from spoolctl.services.submit import submit
from tests.helpers import Db

GIB = 1 << 30


def fake_devices(
    host: str, n: int, model: str = "Fake A100", memory: int = 80 * GIB
) -> tuple[Device, ...]:
    return tuple(Device(f"GPU-{host}-{i}", i, model, memory) for i in range(n))


@pytest.fixture
def queue(db: Db) -> Iterator[Queue]:
    opened = open_write(str(db))
    yield opened
    opened.engine.dispose()


def add(queue: Queue, priority: int = 0, **request: object) -> int:
    def run(conn: Connection) -> int:
        job_id = int(
            submit(conn, JobSpec(argv=["true"], priority=priority), time.time() - 1).job_id
        )
        if request:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**request))
        return job_id

    return queue.write(run)


class Host:
    """One worker's capacity and claimant on a simulated host."""

    def __init__(
        self, queue: Queue, name: str, gpus: int, slots: int = 8, worker: str = ""
    ) -> None:
        self.queue = queue
        self.capacity = Capacity(slots, devices=fake_devices(name, gpus), host=name)
        self.claimant = claim.Claimant(
            worker or f"w-{name}",
            1,
            "default",
            queue.output_root,
            cap=self.capacity,
            inventory=self.capacity.inventory,
        )
        queue.write(lambda conn: placement.register(conn, self.capacity.inventory, time.time()))
        self.places: dict[int, Place] = {}

    def take(self, wanted: int | None = None) -> list[claim.Claim]:
        room = self.capacity.room()
        want = room.slots if wanted is None else wanted
        claims = self.queue.write(
            lambda conn: claim.claim_up_to(conn, self.claimant, want, time.time(), room)
        )
        for c in claims:
            self.places[c.attempt_id] = self.capacity.allocate(c)
        return claims

    def end(self, *taken: claim.Claim) -> None:
        endings = [
            Ending(c.job_id, c.attempt_id, c.attempt_no, Outcome(0, None), holds=bool(c.devices))
            for c in taken
        ]
        self.queue.write(
            lambda conn: record_outcomes(
                conn, endings, worker_id=self.claimant.worker_id, now=time.time()
            )
        )
        for c in taken:
            self.capacity.release(self.places.pop(c.attempt_id))


def held(queue: Queue) -> dict[str, int]:
    return dict(queue.read(lambda conn: conn.execute(select(devices.c.uuid, devices.c.held)).all()))  # type: ignore[arg-type]


# -- the rules on their own ------------------------------------------------


def test_gpus_are_whole_devices_or_a_share_that_divides_one() -> None:
    assert parse_gpus("2") == (2, 1)
    assert parse_gpus("0.5") == (1, 2)
    assert parse_gpus("1/3") == (1, 3)
    assert parse_gpus("0.25") == (1, 4)
    assert parse_gpus("0") == (0, 1)
    for bad in ("-1", "0.3", "1.5", "2/3", "1/17", "65", "x", ""):
        with pytest.raises(BadRequest, match="--gpus"):
            parse_gpus(bad)
    assert gpus_text(1, 2) == "0.5"
    assert gpus_text(1, 3) == "1/3"
    assert gpus_text(4, 1) == "4"
    assert gpus_text(None, None) is None


def test_a_model_pattern_is_a_glob_or_a_substring() -> None:
    assert model_matches("a100", "NVIDIA A100-SXM4-80GB")
    assert model_matches("*H100*", "NVIDIA H100 80GB HBM3")
    assert not model_matches("H100", "NVIDIA A100-SXM4-80GB")
    assert not model_matches("A100", "NVIDIA A10")


def test_shares_pack_onto_a_shared_device_before_a_fresh_one() -> None:
    inventory = Inventory(8, devices=fake_devices("h", 2), host="h")
    free = Free(8, units={d.uuid: DEVICE_UNITS for d in inventory.devices})
    half = Request(gpus=1, share=2)
    quarter = Request(gpus=1, share=4)
    assert free.fit(half, inventory) == ("GPU-h-0",)
    assert free.fit(quarter, inventory) == ("GPU-h-0",)  # the shared one, not GPU-h-1
    assert free.fit(quarter, inventory) == ("GPU-h-0",)
    assert free.fit(quarter, inventory) == ("GPU-h-1",)  # GPU-h-0 is full
    assert free.fit(Request(gpus=2), inventory) is None  # no whole device left
    assert free.slots == 4


def test_what_no_worker_could_hold_is_said() -> None:
    inventory = Inventory(4, memory_bytes=8 * GIB, devices=fake_devices("h", 2), host="h")
    assert inventory.cannot_hold(Request(gpus=2)) is None
    assert "needs 16 GPU(s)" in str(inventory.cannot_hold(Request(gpus=16)))
    assert "model 'H100'" in str(inventory.cannot_hold(Request(gpus=1, gpu_model="H100")))
    assert "slots" in str(inventory.cannot_hold(Request(weight=5)))
    assert "memory" in str(inventory.cannot_hold(Request(memory_bytes=9 * GIB)))
    assert Inventory.from_json(inventory.as_json()) == inventory


# -- the claim -----------------------------------------------------------------


@pytest.mark.both_backends
def test_weights_fill_slots_in_claim_order_and_skip_what_does_not_fit(queue: Queue) -> None:
    host = Host(queue, "a", gpus=0, slots=4)
    heavy = add(queue, priority=9, weight=3)
    plain = [add(queue, priority=5) for _ in range(3)]
    got = host.take()
    # the weight-3 job first, then one plain job in the slot left
    assert [c.job_id for c in got] == [heavy, plain[0]]
    assert host.capacity.room().slots == 0
    assert [p.slots for p in host.places.values()] == [(0, 1, 2), (3,)]


@pytest.mark.both_backends
def test_devices_are_held_in_the_database_and_released_with_the_end(queue: Queue) -> None:
    host = Host(queue, "a", gpus=2)
    two = add(queue, priority=3, gpus=2)
    one = add(queue, priority=2, gpus=1)
    got = host.take()
    assert [c.job_id for c in got] == [two]  # the 1-GPU job waits: both are held
    assert set(got[0].devices) == {"GPU-a-0", "GPU-a-1"}
    assert held(queue) == {"GPU-a-0": DEVICE_UNITS, "GPU-a-1": DEVICE_UNITS}
    row = queue.read(lambda conn: conn.execute(select(attempts.c.host, attempts.c.devices)).one())
    assert row.host == "a" and set(row.devices.split(",")) == {"GPU-a-0", "GPU-a-1"}
    env = host.places[got[0].attempt_id].environment
    assert env[b"SPOOLCTL_GPUS"] == ",".join(got[0].devices).encode()
    assert sorted(env[b"CUDA_VISIBLE_DEVICES"].split(b",")) == [b"0", b"1"]
    host.end(*got)
    assert held(queue) == {"GPU-a-0": 0, "GPU-a-1": 0}
    assert queue.read(lambda conn: conn.execute(select(device_holds)).all()) == []
    again = host.take()
    assert [c.job_id for c in again] == [one]


@pytest.mark.both_backends
def test_two_workers_on_one_host_never_over_hold_a_device(queue: Queue) -> None:
    first = Host(queue, "a", gpus=1, worker="w1")
    second = Host(queue, "a", gpus=1, worker="w2")  # the same device, seen by both
    jobs_ = [add(queue, gpus=1, gpu_share=2) for _ in range(3)]
    assert len(first.take()) == 2
    assert second.take() == []  # the device is held whole by the first's two halves
    assert held(queue) == {"GPU-a-0": DEVICE_UNITS}
    assert jobs_


@pytest.mark.both_backends
def test_the_database_refuses_an_over_hold(queue: Queue) -> None:
    Host(queue, "a", gpus=1)
    job_id = add(queue)

    def over(conn: Connection) -> None:
        conn.execute(update(devices).values(held=DEVICE_UNITS // 2 + DEVICE_UNITS // 2 + 1))

    with pytest.raises(IntegrityError):
        queue.write(over)
    assert held(queue) == {"GPU-a-0": 0}
    assert job_id


@pytest.mark.both_backends
def test_a_big_job_is_reserved_for_while_small_ones_keep_coming(queue: Queue) -> None:
    host = Host(queue, "a", gpus=4)
    smalls = [add(queue, priority=5, gpus=1) for _ in range(2)]
    first = host.take()
    assert [c.job_id for c in first] == smalls
    big = add(queue, priority=3, gpus=4)
    later = [add(queue, priority=1, gpus=1) for _ in range(4)]
    # the 4-GPU job cannot start (2 are held); the later 1-GPU jobs must not
    # take the 2 free devices it needs
    assert host.take() == []
    host.end(first[0])
    assert host.take() == []
    host.end(first[1])
    got = host.take()
    assert [c.job_id for c in got][:1] == [big]
    assert later


@pytest.mark.both_backends
def test_a_worker_without_gpus_reaches_plain_jobs_behind_many_gpu_jobs(queue: Queue) -> None:
    host = Host(queue, "cpu", gpus=0, slots=2)
    for _ in range(100):  # more than the walk passes over (claim.MAX_PASSED)
        add(queue, priority=5, gpus=1)
    plain = add(queue, priority=1)
    assert [c.job_id for c in host.take()] == [plain]


@pytest.mark.both_backends
def test_one_job_wanted_may_take_several_slots(queue: Queue) -> None:
    """`work --once` wants one job, not one slot: a weight-3 job is it."""
    host = Host(queue, "a", gpus=0, slots=4)
    heavy = add(queue, priority=9, weight=3)
    add(queue, priority=5)
    assert [c.job_id for c in host.take(1)] == [heavy]


def _end_elsewhere(queue: Queue, taken: claim.Claim, pid: int, started_at: float | None) -> None:
    """The attempt was canceled by someone else; its process is `pid`."""

    def run(conn: Connection) -> None:
        conn.execute(
            update(attempts)
            .where(attempts.c.id == taken.attempt_id)
            .values(
                state="canceled", job_pid=pid, job_started_at=started_at, finished_at=time.time()
            )
        )

    queue.write(run)


@pytest.mark.both_backends
def test_the_sweep_releases_a_hold_only_once_its_processes_are_gone(queue: Queue) -> None:
    here = placement.Here("a", live_within_s=30, hang_threshold_s=60)
    host = Host(queue, "a", gpus=1)
    add(queue, gpus=1)
    (taken,) = host.take()
    # its worker is gone (no live row) and a live process still carries it
    me = procs.self_identity()
    _end_elsewhere(queue, taken, me.pid, me.started_at)
    assert queue.write(lambda conn: placement.release_lingering(conn, time.time(), here)) == []
    assert held(queue) == {"GPU-a-0": DEVICE_UNITS}
    # the process is gone: its pid is another process's now (started later)
    _end_elsewhere(queue, taken, me.pid, (me.started_at or 0.0) - 1000.0)
    swept = queue.write(lambda conn: placement.release_lingering(conn, time.time(), here))
    assert swept == [taken.attempt_id]
    assert held(queue) == {"GPU-a-0": 0}


@pytest.mark.both_backends
def test_another_hosts_hold_is_released_once_its_workers_lease_ran_out(queue: Queue) -> None:
    host = Host(queue, "b", gpus=1)
    add(queue, gpus=1)
    (taken,) = host.take()
    _end_elsewhere(queue, taken, 1, 0.0)  # a pid that means nothing on this machine
    finished = time.time()
    here = placement.Here("a", live_within_s=30, hang_threshold_s=60)
    assert queue.write(lambda conn: placement.release_lingering(conn, finished, here)) == []
    later = finished + 61  # beyond the hang threshold: its own rule killed its jobs
    swept = queue.write(lambda conn: placement.release_lingering(conn, later, here))
    assert swept == [taken.attempt_id]
    assert held(queue) == {"GPU-b-0": 0}


def test_the_light_views_copy_the_schemas_constants() -> None:
    from spoolctl.db import tables
    from spoolctl.resources import DEVICE_UNITS as UNITS
    from spoolctl.services import placement_views

    assert placement_views.DEVICE_UNITS == UNITS == tables.DEVICE_UNITS
    assert placement_views.REQUESTED == tables.REQUESTED
