"""A worker's capacity: how many jobs it can take, the place (slot) each
attempt gets, its release, and the lane's cap (`runner/capacity.py`)."""

from __future__ import annotations

import pytest

from spoolctl.runner.capacity import Capacity, NoPlace, Place
from spoolctl.services.claim import Claim


def claim(job_id: int) -> Claim:
    return Claim(job_id, job_id, 1, ["true"], None, {}, 60, "default", "out", "err")


def test_places_are_the_lowest_free_slots_in_order() -> None:
    capacity = Capacity(3)
    assert [capacity.allocate(claim(i)).slot for i in range(3)] == [0, 1, 2]


def test_a_released_place_is_reused_lowest_first() -> None:
    capacity = Capacity(4)
    places = [capacity.allocate(claim(i)) for i in range(4)]
    capacity.release(places[2])
    capacity.release(places[0])
    assert capacity.allocate(claim(10)) == Place((0,))
    assert capacity.allocate(claim(11)) == Place((2,))


def test_never_more_places_than_slots() -> None:
    capacity = Capacity(2)
    first = capacity.allocate(claim(1))
    capacity.allocate(claim(2))
    with pytest.raises(NoPlace):
        capacity.allocate(claim(3))
    capacity.release(first)
    assert capacity.allocate(claim(3)) == first
    with pytest.raises(NoPlace):
        capacity.allocate(claim(4))


def test_a_place_is_released_once() -> None:
    capacity = Capacity(1)
    place = capacity.allocate(claim(1))
    capacity.release(place)
    with pytest.raises(NoPlace):
        capacity.release(place)


def test_take_counts_free_slots_and_the_ending_attempts() -> None:
    capacity = Capacity(3)
    assert capacity.take() == 3
    assert capacity.idle
    places = [capacity.allocate(claim(i)) for i in range(3)]
    assert capacity.take() == 0
    assert not capacity.idle
    assert capacity.take(ending=2) == 2  # their ends are recorded in the same pass
    assert capacity.take(1, ending=2) == 1
    capacity.release(places[1])
    assert capacity.take() == 1
    capacity.release_all()
    assert capacity.take() == 3


def test_the_lane_cap_bounds_what_is_claimed() -> None:
    assert Capacity(4).within_lane_cap(4, running=100) == 4  # no cap
    capped = Capacity(4, lane_cap=3)
    assert capped.within_lane_cap(4, running=0) == 3
    assert capped.within_lane_cap(4, running=2) == 1
    assert capped.within_lane_cap(4, running=3) == 0
    assert capped.within_lane_cap(4, running=5) == 0


def test_a_place_gives_the_job_its_slot() -> None:
    assert Place((0,)).environment == {b"SPOOLCTL_SLOT": b"0"}
    assert Place((7,)).environment == {b"SPOOLCTL_SLOT": b"7"}


def test_a_worker_has_at_least_one_slot() -> None:
    with pytest.raises(ValueError):
        Capacity(0)


def test_a_worker_told_gpus_none_hides_every_gpu_from_its_jobs() -> None:
    hidden = Capacity(2, manages_gpus=True).allocate(claim(1)).environment
    assert hidden[b"CUDA_VISIBLE_DEVICES"] == b"" and hidden[b"SPOOLCTL_GPUS"] == b""
    untouched = Capacity(2).allocate(claim(1)).environment  # no --gpus: as before
    assert b"CUDA_VISIBLE_DEVICES" not in untouched
