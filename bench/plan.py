"""How much to measure: the default run (~5–10 min on 2 cores) and --quick (~2 min)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    add_reps: int = 20
    batch_jobs: int = 10_000
    batch_reps: int = 3
    drain_jobs: int = 1_000
    drain_reps: int = 3
    pickup_samples: int = 30
    idle_s: float = 10.0
    read_reps: int = 7
    claim_reps: int = 300  # split into 3 alternating rounds
    small_table: int = 1_000
    big_table: int = 100_000
    spawn_reps: int = 300


DEFAULT = Plan()
QUICK = Plan(
    add_reps=8,
    batch_reps=1,
    drain_reps=1,
    pickup_samples=15,
    idle_s=4.0,
    read_reps=3,
    claim_reps=90,
    spawn_reps=100,
)
