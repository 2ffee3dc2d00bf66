"""Weights with a real worker: a job of `--weight N` takes N of the worker's
slots, so the weights of the jobs running at one instant never pass
`--concurrency`. Each job writes its start and end (tests/placement_marks.py)
and the sweep of those intervals finds the largest sum of weights running at
once. SQLite alone: placing by weight is the claim's, proven on both
backends in-process (unit/test_placement.py); this is the worker's side."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

from tests.helpers import Db, add_job, cli, execute, rows
from tests.placement_marks import mark_argv, marks, peak

pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.timeout(120)]

SLOTS = 4
JOB_S = 0.4
"""Long enough that a worker's claims overlap its running jobs."""


def test_running_weights_never_pass_the_workers_slots(db: Db, tmp_path: Path) -> None:
    folder = tmp_path / "marks"
    folder.mkdir()
    rng = random.Random(4)
    weights = {add_job(db, *mark_argv(folder, JOB_S)): rng.choice((1, 2, 3)) for _ in range(30)}
    for job_id, weight in weights.items():
        execute(db, "UPDATE jobs SET weight = ? WHERE id = ?", (weight, job_id))

    result = cli(
        "work", "--drain", "--concurrency", str(SLOTS), "--poll-interval", "0.1", db=db, json=True
    )
    assert result.exit_code == 0, result.stdout + result.stderr

    states = rows(db, "SELECT id, state FROM jobs ORDER BY id")
    assert [r["state"] for r in states] == ["done"] * len(weights)
    tries = rows(db, "SELECT job_id, count(*) AS n FROM attempts GROUP BY job_id ORDER BY job_id")
    assert [(r["job_id"], r["n"]) for r in tries] == [(j, 1) for j in sorted(weights)]
    seen = marks(folder)
    assert sorted((m.job_id, m.attempt) for m in seen) == [(j, 1) for j in sorted(weights)]
    top = peak((m.start, m.end, Fraction(weights[m.job_id])) for m in seen)
    assert top <= SLOTS, f"weights of {top} ran at once on {SLOTS} slots"
    assert top > 1, "no two jobs ever overlapped: the sweep proved nothing"
