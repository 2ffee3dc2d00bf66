"""What `metrics` exports, as plain data read in one snapshot (rendered in the
Prometheus exposition by `spoolctl/exposition.py`, the only module that
knows prometheus_client).

Every figure is read from the queue itself, not kept in a process: two
scrapes of two processes at one moment agree, and a restarted scraper loses
nothing. The totals (attempts by outcome and reason, reaps) are counted from
the attempts table, the ledger of every attempt's end: they only grow, except
when `prune` deletes old jobs with their attempts (Prometheus's `rate` and
`increase` take a drop as a counter reset). Each query is served by an index
or bounded by the attempts' primary key (the recent window).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, select

from spoolctl.db.backends import statements
from spoolctl.db.tables import attempts, jobs, lanes, workers
from spoolctl.services import schedules as schedule_facts
from spoolctl.services.placement_reads import device_table
from spoolctl.services.placement_web import unplaceable_by_lane
from spoolctl.services.query import lane_summary, unconfirmed_orphans
from spoolctl.services.totals import EndedTotals
from spoolctl.states import AttemptState, JobState, WorkerState

WINDOW_S = 300.0
"""The recent window the duration and pickup histograms describe."""
WINDOW_ATTEMPTS = 1000
"""At most this many of the newest attempts (by id: a walk of the primary
key) make up the window, so a scrape costs the same at any table size."""
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
PICKUP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Histogram:
    """Cumulative counts per upper bound (the last one +Inf), and the sum."""

    buckets: list[tuple[float, int]]
    count: int
    total: float


@dataclass
class LaneFacts:
    counts: dict[str, int]
    scheduled: int = 0
    oldest_due_age_s: float = 0.0
    paused: bool = False
    live_workers: int = 0
    cap: int | None = None
    """The lane's cap: the smallest `--slots` a live worker of the lane
    declares (None: no cap)."""
    suspended: int = 0
    """Running jobs of the lane that are suspended (counted among the running)."""
    unplaceable: int = 0
    """Queued jobs of the lane that no live worker of it could hold."""

    @property
    def running(self) -> int:
        return self.counts.get(JobState.RUNNING.value, 0)


@dataclass(frozen=True)
class WorkerFacts:
    worker_id: str
    lane: str
    hostname: str
    concurrency: int
    running_attempts: int
    heartbeat_age_s: float


@dataclass(frozen=True)
class DeviceFacts:
    """A registered device and how much of it attempts hold (0 … 1)."""

    host: str
    uuid: str
    index: int
    model: str
    held_share: float


@dataclass
class MetricsSnapshot:
    now: float
    lanes: dict[str, LaneFacts]
    workers: list[WorkerFacts]
    orphans_unconfirmed: int
    attempts_ended: dict[tuple[str, str], int]
    """(outcome, failure_reason or "") -> attempts that ended so."""
    reaps: int
    durations: Histogram
    pickups: Histogram
    ledger_lag: dict[str, Any] | None = None
    window_s: float = WINDOW_S
    schedules: list[tuple[str, float, bool]] = field(default_factory=list)
    """(name, next fire time, paused) of each schedule."""
    devices: list[DeviceFacts] = field(default_factory=list)
    """Every registered device, by host and index."""


def empty_snapshot(now: float) -> MetricsSnapshot:
    """The metrics of a queue that does not exist yet: no lanes, no totals."""
    return MetricsSnapshot(
        now, {}, [], 0, {}, 0, histogram([], DURATION_BUCKETS_S), histogram([], PICKUP_BUCKETS_S)
    )


def collect(
    conn: Connection, now: float, *, live_within_s: float, totals: EndedTotals | None = None
) -> MetricsSnapshot:
    """Everything `metrics` exports, read in the caller's snapshot. A worker
    is live when its row says running and it heartbeated within
    `live_within_s` (the reap threshold): one that died unburied is not.
    `totals` is a long-lived scraper's memo of the ended attempts' count
    (`services/totals.py`); without it they are counted afresh."""
    lane_facts = _lanes(conn, now)
    live = _live_workers(conn, now, live_within_s)
    for worker in live:
        lane = lane_facts.setdefault(worker.lane, LaneFacts(_zero_counts()))
        lane.live_workers += 1
    for name, cap in _lane_caps(conn, now, live_within_s).items():
        lane_facts.setdefault(name, LaneFacts(_zero_counts())).cap = cap
    for name, count in unplaceable_by_lane(conn, now, live_within_s).items():
        lane_facts.setdefault(name, LaneFacts(_zero_counts())).unplaceable = count
    ended = (totals or EndedTotals()).read(conn)
    return MetricsSnapshot(
        now=now,
        lanes=dict(sorted(lane_facts.items())),
        workers=live,
        orphans_unconfirmed=len(unconfirmed_orphans(conn)),
        attempts_ended=ended,
        reaps=ended.get((AttemptState.ABANDONED.value, "worker_crash"), 0),
        durations=histogram(recent_durations(conn, now), DURATION_BUCKETS_S),
        pickups=histogram(recent_pickups(conn, now), PICKUP_BUCKETS_S),
        ledger_lag=statements(conn).ledger_lag(conn),
        schedules=schedule_facts.fire_times(conn),
        devices=_devices(conn),
    )


def _devices(conn: Connection) -> list[DeviceFacts]:
    return [
        DeviceFacts(str(d["host"]), str(d["uuid"]), d["index"], str(d["model"]), d["held_share"])
        for d in device_table(conn)
    ]


def _zero_counts() -> dict[str, int]:
    return {s.value: 0 for s in JobState}


def _lanes(conn: Connection, now: float) -> dict[str, LaneFacts]:
    found = {
        name: LaneFacts(entry["counts"], entry["scheduled"], suspended=entry["suspended"])
        for name, entry in lane_summary(conn, now).items()
    }
    for name in conn.execute(select(lanes.c.queue)).scalars():
        found.setdefault(name, LaneFacts(_zero_counts())).paused = True
    for name, oldest in _oldest_due(conn, now, [n for n, f in found.items() if _due(f)]):
        found[name].oldest_due_age_s = max(0.0, now - float(oldest))
    return found


def _due(facts: LaneFacts) -> bool:
    return facts.counts.get(JobState.QUEUED.value, 0) > facts.scheduled


def _oldest_due(conn: Connection, now: float, names: list[str]) -> list[tuple[str, float]]:
    """Per lane with due jobs, when its longest-waiting due job became due:
    a range of the claim index (state, lane, ...), one lane at a time."""
    found = []
    for name in names:
        oldest = conn.execute(
            select(func.min(jobs.c.next_run_at)).where(
                jobs.c.state == JobState.QUEUED.value,
                jobs.c.queue == name,
                jobs.c.next_run_at <= now,
            )
        ).scalar()
        if oldest is not None:
            found.append((name, float(oldest)))
    return found


def _live_workers(conn: Connection, now: float, live_within_s: float) -> list[WorkerFacts]:
    running: dict[Any, int] = dict(
        conn.execute(
            select(jobs.c.locked_by, func.count())
            .where(jobs.c.state == JobState.RUNNING.value)
            .group_by(jobs.c.locked_by)
        ).all()
    )
    rows = conn.execute(
        select(
            workers.c.id,
            workers.c.queue,
            workers.c.hostname,
            workers.c.concurrency,
            workers.c.heartbeat_at,
        )
        .where(
            workers.c.state == WorkerState.RUNNING.value,
            workers.c.heartbeat_at >= now - live_within_s,
        )
        .order_by(workers.c.id)
    )
    return [
        WorkerFacts(
            str(row.id),
            str(row.queue),
            str(row.hostname),
            int(row.concurrency or 1),
            int(running.get(row.id, 0)),
            max(0.0, now - float(row.heartbeat_at)),
        )
        for row in rows
    ]


def _lane_caps(conn: Connection, now: float, live_within_s: float) -> dict[str, int]:
    """Each capped lane's cap: the smallest `--slots` (column `slots`) of its live workers."""
    rows = conn.execute(
        select(workers.c.queue, func.min(workers.c.slots))
        .where(
            workers.c.state == WorkerState.RUNNING.value,
            workers.c.heartbeat_at >= now - live_within_s,
            workers.c.slots.is_not(None),
        )
        .group_by(workers.c.queue)
    )
    return {str(name): int(cap) for name, cap in rows if cap is not None}


def _window(conn: Connection) -> Any:
    """The newest WINDOW_ATTEMPTS attempts, as a subquery: a range of the
    primary key from its end (ids leave no gaps but for rolled-back ones)."""
    newest = conn.execute(select(func.max(attempts.c.id))).scalar()
    floor = (0 if newest is None else int(newest)) - WINDOW_ATTEMPTS
    return (
        select(
            attempts.c.id,
            attempts.c.job_id,
            attempts.c.attempt_no,
            attempts.c.state,
            attempts.c.started_at,
            attempts.c.finished_at,
        )
        .where(attempts.c.id > floor)
        .subquery("recent")
    )


def recent_durations(conn: Connection, now: float) -> list[float]:
    """How long each attempt that ended in the window ran."""
    recent = _window(conn)
    rows = conn.execute(
        select(recent.c.started_at, recent.c.finished_at).where(
            recent.c.state != AttemptState.RUNNING.value,
            recent.c.finished_at >= now - WINDOW_S,
        )
    )
    return [max(0.0, float(end) - float(start)) for start, end in rows]


def recent_pickups(conn: Connection, now: float) -> list[float]:
    """For first attempts started in the window, the wait from when the job
    became due (its next_run_at) to its claim. Only jobs that ran once and
    were not put back since: a retry or a requeue moves next_run_at."""
    recent = _window(conn)
    later = attempts.alias("later")
    rows = conn.execute(
        select(recent.c.started_at, jobs.c.next_run_at)
        .join(jobs, jobs.c.id == recent.c.job_id)
        .where(
            recent.c.attempt_no == 1,
            recent.c.started_at >= now - WINDOW_S,
            jobs.c.state.not_in([JobState.QUEUED.value, JobState.WAITING.value]),
            ~select(later.c.id)
            .where(later.c.job_id == recent.c.job_id, later.c.attempt_no == 2)
            .exists(),
        )
    )
    return [max(0.0, float(start) - float(due)) for start, due in rows]


def histogram(values: list[float], bounds: tuple[float, ...]) -> Histogram:
    """Cumulative bucket counts of values for each upper bound, then +Inf."""
    ordered = sorted(values)
    buckets, i = [], 0
    for bound in bounds:
        while i < len(ordered) and ordered[i] <= bound:
            i += 1
        buckets.append((bound, i))
    buckets.append((float("inf"), len(ordered)))
    return Histogram(buckets, len(ordered), sum(ordered))
