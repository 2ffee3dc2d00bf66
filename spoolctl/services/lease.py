"""The lease rule: how long a worker that cannot be checked is trusted.

A worker whose process cannot be probed from here (another hostname: the
machine was renamed, a container shares the spool, or later a worker on
another machine) holds its jobs on a lease that its heartbeats renew. Both
sides of the rule live here, so they can never disagree:

- the worker itself: once it has not managed to heartbeat for half the hang
  threshold, it kills its own jobs' process groups and claims nothing until a
  heartbeat lands again (it fences itself);
- everyone else: once its heartbeat is older than the whole hang threshold,
  its jobs may be requeued without probing or killing anything.

Between the two there is always half a threshold in which the worker's jobs
are dead and nobody has started them again, so two copies never overlap
(unless the worker was frozen, e.g. SIGSTOP, and could not run its own rule).
A hang threshold of 0 turns fencing, and so the lease rule, off.
"""

from __future__ import annotations


def self_fence_due(now: float, last_beat: float, hang_threshold_s: float) -> bool:
    """Whether a worker whose last heartbeat landed at `last_beat` must kill its
    jobs and stop claiming."""
    return hang_threshold_s > 0 and now - last_beat >= hang_threshold_s / 2


def lease_expired(now: float, heartbeat_at: float, hang_threshold_s: float) -> bool:
    """Whether another worker may requeue the jobs of a worker it cannot probe,
    whose newest heartbeat is `heartbeat_at`."""
    return hang_threshold_s > 0 and now - heartbeat_at > hang_threshold_s
