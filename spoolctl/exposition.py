"""The Prometheus text exposition of a queue's metrics: the snapshot that
`services/metrics.py` reads, as prometheus_client's metric families.

The only module that imports prometheus_client (the optional `metrics`
extra), and only `metrics` and the web's `/metrics` import it, lazily.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from spoolctl.services.metrics import Histogram, MetricsSnapshot

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""text/plain; version=0.0.4: what every Prometheus (and the textfile
collector) reads."""


def render(snapshot: MetricsSnapshot) -> bytes:
    """The snapshot in the text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(snapshot))
    return generate_latest(registry)


class _Snapshot:
    """A collector of one snapshot (a fresh registry per scrape)."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from lane_metrics(self.snapshot)
        yield from worker_metrics(self.snapshot)
        yield from total_metrics(self.snapshot)
        yield from window_metrics(self.snapshot)
        yield from ledger_metrics(self.snapshot)
        yield from schedule_metrics(self.snapshot)
        yield from device_metrics(self.snapshot)


def lane_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "spoolctl_jobs", "Jobs in each state, per lane.", labels=["queue", "state"]
    )
    scheduled = GaugeMetricFamily(
        "spoolctl_jobs_scheduled",
        "Queued jobs not due yet (their run time is in the future).",
        labels=["queue"],
    )
    suspended = GaugeMetricFamily(
        "spoolctl_jobs_suspended",
        "Running jobs whose processes are suspended (counted among the running).",
        labels=["queue"],
    )
    unplaceable = GaugeMetricFamily(
        "spoolctl_jobs_unplaceable",
        "Queued jobs asking for more than any live worker of the lane has "
        "(GPUs, a GPU model, slots, memory): none could ever hold them.",
        labels=["queue"],
    )
    oldest = GaugeMetricFamily(
        "spoolctl_oldest_due_job_age_seconds",
        "How long the lane's longest-waiting due job has been due (0: none waits).",
        labels=["queue"],
    )
    running = GaugeMetricFamily(
        "spoolctl_lane_running_jobs", "Jobs running in the lane.", labels=["queue"]
    )
    paused = GaugeMetricFamily(
        "spoolctl_lane_paused", "1 when the lane is paused, else 0.", labels=["queue"]
    )
    live = GaugeMetricFamily(
        "spoolctl_lane_live_workers",
        "Live workers serving the lane (heartbeat within the reap threshold).",
        labels=["queue"],
    )
    cap = GaugeMetricFamily(
        "spoolctl_lane_slots",
        "The lane's cap on running jobs (the smallest --slots of its "
        "live workers; absent: no cap).",
        labels=["queue"],
    )
    free = GaugeMetricFamily(
        "spoolctl_lane_free_slots",
        "How many more jobs the lane's --slots cap lets run now.",
        labels=["queue"],
    )
    for name, lane in snap.lanes.items():
        for state, count in lane.counts.items():
            jobs.add_metric([name, state], count)
        scheduled.add_metric([name], lane.scheduled)
        suspended.add_metric([name], lane.suspended)
        unplaceable.add_metric([name], lane.unplaceable)
        oldest.add_metric([name], lane.oldest_due_age_s)
        running.add_metric([name], lane.running)
        paused.add_metric([name], 1 if lane.paused else 0)
        live.add_metric([name], lane.live_workers)
        if lane.cap is not None:
            cap.add_metric([name], lane.cap)
            free.add_metric([name], max(0, lane.cap - lane.running))
    yield from (jobs, scheduled, suspended, unplaceable, oldest, running, paused, live, cap, free)


def worker_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    labels = ["worker_id", "queue", "hostname"]
    running = GaugeMetricFamily(
        "spoolctl_worker_running_attempts", "Attempts the live worker runs now.", labels=labels
    )
    concurrency = GaugeMetricFamily(
        "spoolctl_worker_concurrency",
        "Jobs the worker runs at once at most (--concurrency).",
        labels=labels,
    )
    age = GaugeMetricFamily(
        "spoolctl_worker_heartbeat_age_seconds",
        "Seconds since the worker's last heartbeat.",
        labels=labels,
    )
    for worker in snap.workers:
        key = [worker.worker_id, worker.lane, worker.hostname]
        running.add_metric(key, worker.running_attempts)
        concurrency.add_metric(key, worker.concurrency)
        age.add_metric(key, worker.heartbeat_age_s)
    workers = GaugeMetricFamily(
        "spoolctl_workers_live", "Live workers (all lanes).", value=len(snap.workers)
    )
    orphans = GaugeMetricFamily(
        "spoolctl_orphans_unconfirmed",
        "Running jobs of dead workers whose process could not "
        "be confirmed gone (kept running, not requeued).",
        value=snap.orphans_unconfirmed,
    )
    yield from (running, concurrency, age, workers, orphans)


def total_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    ended = CounterMetricFamily(
        "spoolctl_attempts_ended",
        "Attempts that ended, by outcome (the attempt's state) and "
        "failure reason (empty: none), counted from the queue's attempts.",
        labels=["outcome", "failure_reason"],
    )
    for (outcome, reason), count in sorted(snap.attempts_ended.items()):
        ended.add_metric([outcome, reason], count)
    reaps = CounterMetricFamily(
        "spoolctl_reaps",
        "Attempts ended as worker crashes (abandoned, worker_crash): reaped after their "
        "worker died, or given up by a worker that fenced itself.",
        value=snap.reaps,
    )
    yield from (ended, reaps)


def window_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    window = f"over the last {snap.window_s:g} s (at most the newest 1000 attempts)"
    yield _gauge_histogram(
        "spoolctl_recent_attempt_duration_seconds",
        f"How long attempts that ended ran, {window}.",
        snap.durations,
    )
    yield _gauge_histogram(
        "spoolctl_recent_pickup_latency_seconds",
        f"From a job being due to its first attempt's claim, {window}.",
        snap.pickups,
    )


def _gauge_histogram(name: str, documentation: str, found: Histogram) -> Metric:
    buckets = [(_bound(bound), float(count)) for bound, count in found.buckets]
    return GaugeHistogramMetricFamily(name, documentation, buckets=buckets, gsum_value=found.total)


def ledger_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    lag = snap.ledger_lag
    if lag is None:  # SQLite: events are positioned as they commit
        return
    yield GaugeMetricFamily(
        "spoolctl_ledger_unnumbered_events",
        "Events committed without a ledger position yet (PostgreSQL).",
        value=lag["unnumbered"],
    )
    yield GaugeMetricFamily(
        "spoolctl_ledger_lag_seconds",
        "How long the oldest unnumbered event has waited (PostgreSQL).",
        value=lag["behind_s"],
    )
    writer = lag["oldest_writer_s"]
    yield GaugeMetricFamily(
        "spoolctl_ledger_oldest_writer_seconds",
        "How long the longest-open writing transaction has been open (PostgreSQL; 0: none).",
        value=0.0 if writer is None else writer,
    )


def schedule_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    upcoming = GaugeMetricFamily(
        "spoolctl_schedule_next_fire_timestamp_seconds",
        "When the schedule's next fire time falls due (Unix time); a worker fires it then.",
        labels=["schedule"],
    )
    paused = GaugeMetricFamily(
        "spoolctl_schedule_paused", "1 if the schedule is paused, else 0.", labels=["schedule"]
    )
    for name, next_fire_at, is_paused in snap.schedules:
        upcoming.add_metric([name], next_fire_at)
        paused.add_metric([name], 1.0 if is_paused else 0.0)
    yield upcoming
    yield paused


def device_metrics(snap: MetricsSnapshot) -> Iterator[Metric]:
    held = GaugeMetricFamily(
        "spoolctl_device_held_share",
        "How much of the device attempts hold, 0 to 1 (a 1/k share holds 1/k).",
        labels=["host", "uuid", "index", "model"],
    )
    count = GaugeMetricFamily(
        "spoolctl_devices", "Devices (GPUs) registered by the host's workers.", labels=["host"]
    )
    per_host: dict[str, int] = {}
    for device in snap.devices:
        held.add_metric(
            [device.host, device.uuid, str(device.index), device.model], device.held_share
        )
        per_host[device.host] = per_host.get(device.host, 0) + 1
    for host, n in sorted(per_host.items()):
        count.add_metric([host], n)
    yield held
    yield count


def _bound(bound: float) -> str:
    """A bucket's `le` as Prometheus writes it (+Inf for the last)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))
