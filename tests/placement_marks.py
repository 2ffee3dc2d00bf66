"""What the placement tests' jobs write, and the sweep that reads it.

Each job is a tiny `sh -c` (`MARK`) that stamps its start, sleeps a moment,
stamps its end and writes one marker file per attempt,
`<folder>/<job id>.<attempt>`: the devices it saw (SPOOLCTL_GPUS and
CUDA_VISIBLE_DEVICES, "unset" where the variable is not set at all), its
attempt, and the two stamps (`date +%s.%N`, the machine's clock, the same in
every PID namespace). The job's own interval lies inside its attempt's hold
(devices are held from the claim to the recorded end), so a sweep of these
intervals that finds a device over its share has found an over-hold.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, update

from spoolctl.db.queue import Queue
from spoolctl.db.tables import jobs
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit

MARK = r"""
s=$(date +%s.%N)
sleep "$2"
e=$(date +%s.%N)
printf '%s|%s|%s|%s|%s\n' "${SPOOLCTL_GPUS-unset}" "${CUDA_VISIBLE_DEVICES-unset}" \
  "$SPOOLCTL_ATTEMPT" "$s" "$e" > "$1/.$SPOOLCTL_JOB_ID.$SPOOLCTL_ATTEMPT"
mv "$1/.$SPOOLCTL_JOB_ID.$SPOOLCTL_ATTEMPT" "$1/$SPOOLCTL_JOB_ID.$SPOOLCTL_ATTEMPT"
"""


def mark_argv(folder: Path, sleep_s: float) -> list[str]:
    """The argv of a job that writes its marker into `folder`."""
    return ["sh", "-c", MARK, "job", str(folder), f"{sleep_s:g}"]


@dataclass(frozen=True)
class Mark:
    """One attempt as its job saw it."""

    job_id: int
    attempt: int
    gpus: tuple[str, ...] | None
    """SPOOLCTL_GPUS split on commas (None: not set)."""
    visible: tuple[str, ...] | None
    """CUDA_VISIBLE_DEVICES split on commas (None: not set)."""
    start: float
    end: float


def _split(text: str) -> tuple[str, ...] | None:
    if text == "unset":
        return None
    return tuple(part for part in text.split(",") if part)


def marks(folder: Path) -> list[Mark]:
    """Every marker in `folder`, by job id and attempt."""
    found = []
    for path in folder.iterdir():
        if path.name.startswith("."):
            continue
        job_id, attempt = (int(p) for p in path.name.split("."))
        gpus, visible, _, start, end = path.read_text().strip().split("|")
        found.append(Mark(job_id, attempt, _split(gpus), _split(visible), float(start), float(end)))
    return sorted(found, key=lambda m: (m.job_id, m.attempt))


def peak(intervals: Iterable[tuple[float, float, Fraction]]) -> Fraction:
    """The largest sum of amounts held at one instant: each interval holds its
    amount from its start to its end (an end and a start at the same instant
    do not overlap)."""
    points = []
    for start, end, amount in intervals:
        points += [(start, 1, amount), (end, 0, -amount)]
    load, top = Fraction(0), Fraction(0)
    for _, _, change in sorted(points, key=lambda p: (p[0], p[1])):
        load += change
        top = max(top, load)
    return top


def peaks_by_key(held: Iterable[tuple[str, float, float, Fraction]]) -> dict[str, Fraction]:
    """`peak` of each key's intervals (a device's UUID)."""
    by_key: dict[str, list[tuple[float, float, Fraction]]] = defaultdict(list)
    for key, start, end, amount in held:
        by_key[key].append((start, end, amount))
    return {key: peak(intervals) for key, intervals in by_key.items()}


def add_with_request(queue: Queue, argv: list[str], request: dict[str, Any]) -> int:
    """Submit one job carrying `request` (its columns: weight, gpus,
    gpu_share, gpu_memory_bytes, gpu_model) in one transaction, so no worker
    ever sees it without its request."""

    def run(conn: Connection) -> int:
        job_id = int(submit(conn, JobSpec(argv=argv, timeout_seconds=300), time.time()).job_id)
        if request:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**request))
        return job_id

    return queue.write(run)
