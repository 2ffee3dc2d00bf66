"""The vocabulary of the queue: job and attempt states, failure reasons, events.

Published in this order by `capabilities`; the database stores the values.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # part of the contract for compatibility; never written
    DEAD = "dead"
    CANCELED = "canceled"
    WAITING = "waiting"
    """Waits for the jobs it was submitted after (`add --after-job`) to be done;
    never claimable, so the claim query never sees it."""


TERMINAL_JOB_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.DEAD, JobState.CANCELED})
ACTIVE_JOB_STATES = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.WAITING})


class AttemptState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    ABANDONED = "abandoned"
    CANCELED = "canceled"
    REQUEUED = "requeued"
    """It exited with one of its job's `--requeue-exit` codes (a checkpoint):
    the job went back to the queue without spending its retry budget."""


class FailureReason(StrEnum):
    PROCESS_EXIT = "process_exit"
    TIMEOUT = "timeout"
    SPAWN_FAILED = "spawn_failed"
    WORKER_CRASH = "worker_crash"
    CANCELED = "canceled"
    UNKNOWN = "unknown"
    DEPENDENCY_FAILED = "dependency_failed"
    """A job it waited for ended dead or canceled (on the job only, never on
    an attempt: the job never ran)."""
    OOM_KILLED = "oom_killed"
    """The kernel's OOM killer ended the attempt in its cgroup (over the job's
    --memory limit): a job-owned failure, retried like an exit."""
    REQUEUE_EXIT = "requeue_exit"
    """The attempt exited with a `--requeue-exit` code: requeued, its retry
    budget kept (bounded by `--max-requeues`)."""


class EventKind(StrEnum):
    ADDED = "added"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REAPED = "reaped"
    DEAD = "dead"
    RETRIED = "retried"
    CANCELED = "canceled"
    ORPHAN_UNCONFIRMED = "orphan_unconfirmed"
    """A dead worker's job whose process could not be confirmed gone: it stays
    running (and is looked at again) instead of starting a second copy."""
    PAUSED = "paused"
    """A lane was paused (job_id is null; detail names the queue)."""
    RESUMED = "resumed"
    """A lane was resumed (job_id is null; detail names the queue)."""
    DEPENDENCY_FAILED = "dependency_failed"
    """A waiting job was canceled because a job it waited for ended dead or
    canceled; detail names that parent."""
    WAITED_FOR_SERVER = "waited_for_server"
    """A worker started while the database server could not be reached and
    waited for it (job_id is null; worker_id names the worker; detail has
    its lane as `queue`, waited_s, failed_tries and the last error)."""
    SCHEDULE_ADDED = "schedule_added"
    """A schedule was added or replaced (job_id null; detail names it)."""
    SCHEDULE_FIRED = "schedule_fired"
    """A schedule's fire time became a job (job_id is that job; detail has
    the schedule and the fire time, as `slot`)."""
    SCHEDULE_SKIPPED = "schedule_skipped"
    """A schedule's fire time(s) made no job: the previous occurrence was
    still active (overlap skip), or catch-up left missed fire times out
    (job_id null)."""
    SCHEDULE_PAUSED = "schedule_paused"
    SCHEDULE_RESUMED = "schedule_resumed"
    SCHEDULE_REMOVED = "schedule_removed"
    LIMITS_NOT_ENFORCED = "limits_not_enforced"
    """A job with --memory or --cpus was claimed by a worker that cannot
    enforce them (no cgroup, or no such controller): it runs without them;
    detail names the attempt, the limits and why."""
    REMOVED = "removed"
    """A queued or waiting job that never ran was removed (`spoolctl remove`):
    its row is gone, so job_id is null and detail names the job (`job_id`,
    `from`, `queue`, `created_at`, `argv`)."""
    REQUESTED = "requested"
    """Someone asked the running attempt's worker to act on it (`signal`,
    `suspend`, `continue`): detail has the `request_id`, the `action`, the
    `signal` where it is one, the `attempt_id` and `by` where known."""
    SIGNALED = "signaled"
    """The owning worker settled a `signal` request and sent the signal to
    every process of the attempt (detail: `request_id`, `attempt_id`,
    `signal`)."""
    SUSPENDED = "suspended"
    """The owning worker settled a `suspend` request and stopped every
    process of the attempt: its cgroup frozen, else SIGSTOP to its group
    (detail: `request_id`, `attempt_id`)."""
    CONTINUED = "continued"
    """The owning worker let a suspended attempt go on (detail: `request_id`,
    `attempt_id`, `suspended_s`: how long it was stopped, not counted
    against its timeout)."""
    WARNED = "warned"
    """The worker sent the job's `--signal-before-timeout` signal, once, that
    long before its timeout (detail: `attempt`, its number; `signal`,
    `before_s`)."""
    REQUEUED = "requeued"
    """The attempt exited with a `--requeue-exit` code and the job went back
    to the queue, its retry budget kept (detail: `attempt`, its number;
    `exit_code`, `requeues`)."""
    UPDATED = "updated"
    """A queued or waiting job was changed (`spoolctl update`): detail's
    `changes` maps each field to its `[old, new]` value."""


class ControlAction(StrEnum):
    """What a control request asks of a running attempt's worker."""

    SIGNAL = "signal"
    SUSPEND = "suspend"
    CONTINUE = "continue"


class ControlResult(StrEnum):
    """How a control request was settled (null while it waits)."""

    DELIVERED = "delivered"
    ATTEMPT_ENDED = "attempt_ended"
    """The attempt ended before its worker acted: nothing was delivered."""


class Overlap(StrEnum):
    SKIP = "skip"
    ALLOW = "allow"


class CatchUp(StrEnum):
    LATEST = "latest"
    NONE = "none"
    ALL = "all"


class OccurrenceOutcome(StrEnum):
    FIRED = "fired"
    SKIPPED = "skipped"
    RUN = "run"
    """`schedule run`: one occurrence now, outside the fire times."""


class WorkerState(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    DEAD = "dead"
