"""How much to measure: the default run (about 12 min on 2 cores, plus 8 for
the 5,000-job drains and 6 for the PostgreSQL scenario) and --quick (about 3
min, plus 4 and 2; bench/README.md says how these were found). Interleaved
scenarios run in blocks of A B B A, so each block gives every arm two samples
and two ours/ref pairs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    add_reps: int = 20  # fresh `add`/`status`/`list`/floor samples per side (10 blocks)
    batch_jobs: int = 10_000
    batch_reps: int = 3
    drain_jobs: int = 1_000
    drain_reps: int = 3  # A B B A blocks per file system: 6 drains per side and setup
    long_drain_jobs: int = 5_000  # start-up amortised to under 0.1 ms per job
    long_drain_reps: int = 2  # their own A B B A blocks, ceilings at the same job count
    slow_reps: int = 2  # A B B A blocks of 100 x `sleep 0.1`, 1 and 8 slots (~11 s + 2 s each)
    ceiling_spawns: int = 500  # `true` spawns per ceiling sample
    pickup_samples: int = 30  # per side and file system
    idle_s: float = 10.0
    read_reps: int = 7
    claim_reps: int = 300  # split into 3 alternating rounds
    small_table: int = 1_000
    big_table: int = 100_000
    submit_calls: int = 200  # one-call `add` submissions per loop (submit)
    submit_reps: int = 1  # A B B A blocks of loops: 2 loops per side
    coldstart_samples: int = 20  # per verb and side, and per Python start (coldstart)
    idle_samples: int = 6  # empty drains and idle workers per side (idle)
    contained_jobs: int = 5_000  # one worker's drain, cgroups on / off / ref (contained)
    contained_reps: int = 2  # A B B A blocks per file system
    cpu_drain_jobs: int = 2_000  # the disk's drains for the workers' CPU per job


DEFAULT = Plan()
QUICK = Plan(
    add_reps=6,
    batch_reps=1,
    drain_reps=1,
    long_drain_reps=1,
    slow_reps=1,
    ceiling_spawns=300,
    pickup_samples=10,
    idle_s=4.0,
    read_reps=3,
    claim_reps=90,
    submit_calls=40,
    submit_reps=1,
    coldstart_samples=6,
    idle_samples=2,
    contained_jobs=1_000,
    contained_reps=1,
)
