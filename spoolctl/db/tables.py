"""The schema: the single definition of every table, column and index.

alembic revisions in `migrations/` create and evolve it; a test checks that the
migrated DDL matches these definitions. Timestamps are float epoch seconds.
JSON values (argv, tags, env, detail) are stored as TEXT and decoded by
`spoolctl.db.codec`, so a damaged row is reported rather than followed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
    UniqueConstraint,
    or_,
    text,
)

from spoolctl.resources import DEVICE_UNITS
from spoolctl.states import (
    AttemptState,
    CatchUp,
    ControlAction,
    ControlResult,
    FailureReason,
    JobState,
    OccurrenceOutcome,
    Overlap,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""The tables below, without the one index that names PostgreSQL: reach the
whole schema as `metadata` (see `__getattr__`)."""

Int = Integer().with_variant(BigInteger(), "postgresql")
"""Every integer column: SQLite's INTEGER is 64-bit, PostgreSQL's is not, so
there it is BIGINT (timeouts, budgets and ids take the same range on both)."""

NEEDS_LIMITS_WHERE = "require_limits = 1"
REQUESTED = ("weight", "gpus", "memory_bytes")
"""A job the claim places (`services/placement.py`) has one of these: it asks
for more than one slot, for GPUs, or for memory."""
REQUESTS_WHERE = " OR ".join(f"{column} IS NOT NULL" for column in REQUESTED)
"""`REQUESTED` as the partial index's text; `asks_for_resources` writes the
same test, so that SQLite sees the index covers it."""


def asks_for_resources(table: Any) -> Any:
    """The test of `REQUESTS_WHERE` on `table` (the jobs table or an alias)."""
    return or_(*(table.c[column].is_not(None) for column in REQUESTED))


ACTIVE_KEY_WHERE = "idempotency_key IS NOT NULL AND state IN ('queued', 'running', 'waiting')"
"""An idempotency key is unique among unfinished jobs, waiting ones included."""


def _one_of(column: str, values: type[StrEnum], *, nullable: bool = False) -> CheckConstraint:
    """A named CHECK that the column holds one of the vocabulary's values."""
    listed = ", ".join(f"'{v.value}'" for v in values)
    sql = f"{column} IN ({listed})"
    return CheckConstraint(f"{column} IS NULL OR {sql}" if nullable else sql, name=column)


jobs = Table(
    "jobs",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("argv", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("queue", String(64), nullable=False, server_default="default"),
    Column("priority", Int, nullable=False, server_default="0"),
    Column("next_run_at", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("attempts", Int, nullable=False, server_default="0"),
    Column("crashes", Int, nullable=False, server_default="0"),
    Column("max_retries", Int, nullable=False, server_default="3"),
    Column("max_crashes", Int),
    Column("timeout_seconds", Int, nullable=False, server_default="300"),
    Column("idempotency_key", Text),
    Column("tags", Text, nullable=False, server_default="{}"),
    Column("note", Text),
    Column("cwd", Text),
    Column("env", Text, nullable=False, server_default="{}"),
    Column("locked_by", Text),
    Column("locked_pid", Int),
    Column("locked_at", Float),
    Column("heartbeat_at", Float),
    Column("last_exit_code", Int),
    Column("last_error", Text),
    Column("last_failure_reason", String(32)),
    Column("memory_bytes", Int),
    Column("cpus", Float),
    Column("require_limits", Int),
    Column("suspended_at", Float),
    Column("signal_before_timeout", String(16)),
    Column("signal_before_timeout_s", Int),
    Column("requeue_exits", Text),
    Column("max_requeues", Int),
    Column("requeues", Int, nullable=False, server_default="0"),
    Column("weight", Int),
    Column("gpus", Int),
    Column("gpu_share", Int),
    Column("gpu_memory_bytes", Int),
    Column("gpu_model", Text),
    _one_of("state", JobState),
    _one_of("last_failure_reason", FailureReason, nullable=True),
    sqlite_autoincrement=True,
)

Index(
    "ix_jobs_claim",
    jobs.c.state,
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.next_run_at,
    jobs.c.id,
)
Index("ix_jobs_state_heartbeat", jobs.c.state, jobs.c.heartbeat_at)
Index("ix_jobs_state_finished", jobs.c.state, jobs.c.finished_at)
Index("ix_jobs_state_id", jobs.c.state, jobs.c.id)
Index("ix_jobs_queue_id", jobs.c.queue, jobs.c.id)
"""Steering (0009): `suspended_at` is when the running attempt was suspended
(null: it runs; the claim clears it, so only a running job's counts);
`signal_before_timeout` (a name such as SIGUSR1) is sent
`signal_before_timeout_s` seconds before the timeout; `requeue_exits` is the
JSON list of `--requeue-exit` codes, `max_requeues` their bound (null: the
default) and `requeues` how many times the job went back to the queue so.

Resources (0010): what the job needs of a worker (`resources.Request`):
`weight` slots (null: one), `gpus` devices (null: none), each whole or, with
`gpu_share` k, a 1/k share of one device; only devices with at least
`gpu_memory_bytes` of memory whose model matches `gpu_model`. With
`memory_bytes` (its --memory), a job with any of them is placed by the claim
(`REQUESTS_WHERE`)."""

attempts = Table(
    "attempts",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("job_id", Int, ForeignKey("jobs.id"), nullable=False),
    Column("attempt_no", Int, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("worker_pid", Int, nullable=False),
    Column("state", String(16), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float),
    Column("exit_code", Int),
    Column("error", Text),
    Column("failure_reason", String(32)),
    Column("stdout_path", Text, nullable=False),
    Column("stderr_path", Text, nullable=False),
    Column("job_pid", Int),
    Column("job_pgid", Int),
    Column("job_started_at", Float),
    Column("cgroup", Text),
    Column("peak_memory_bytes", Int),
    Column("cpu_time_s", Float),
    Column("host", Text),
    Column("devices", Text),
    UniqueConstraint("job_id", "attempt_no"),
    _one_of("state", AttemptState),
    _one_of("failure_reason", FailureReason, nullable=True),
    sqlite_autoincrement=True,
)

workers = Table(
    "workers",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Int, nullable=False),
    Column("process_started_at", Float),
    Column("boot_id", Text),
    Column("queue", String(64), nullable=False),
    Column("slots", Int),
    Column("concurrency", Int, nullable=False, server_default="1"),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("stopped_at", Float),
    Column("state", String(16), nullable=False),
    Column("jobs_run", Int, nullable=False, server_default="0"),
    Column("pid_space", Text),  # procs.pid_space: where `pid` names this worker (0008)
    Column("inventory", Text),  # resources.Inventory as JSON: what it has to place jobs on (0010)
)
Index("ix_workers_state_heartbeat", workers.c.state, workers.c.heartbeat_at)

job_events = Table(
    "job_events",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("job_id", Int, ForeignKey("jobs.id")),  # null: a lane event (paused, resumed)
    Column("at", Float, nullable=False),
    Column("event", String(32), nullable=False),
    Column("worker_id", Text),
    Column("detail", Text),
    Column("seq", Int),
    sqlite_autoincrement=True,
)
"""`seq` is the event's place in the ledger on PostgreSQL, given by a reader
after the event committed (`backends/postgresql/ledger.py`); `id` is that
place on SQLite, whose single writer commits ids in order (`seq` stays null)."""
Index("ix_job_events_job_id", job_events.c.job_id, job_events.c.id)
LEDGER_SEQUENCE = Sequence("job_events_seq_seq", metadata=_metadata)
"""Where PostgreSQL's readers draw `seq` from (SQLite has no sequences)."""

control_requests = Table(
    "control_requests",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("job_id", Int, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt_id", Int, ForeignKey("attempts.id", ondelete="CASCADE"), nullable=False),
    Column("action", String(16), nullable=False),
    Column("signal", String(16)),
    Column("requested_at", Float, nullable=False),
    Column("requested_by", Text),
    Column("settled_at", Float),
    Column("result", String(16)),
    _one_of("action", ControlAction),
    _one_of("result", ControlResult, nullable=True),
)
"""A request to a running attempt's worker (`signal`, `suspend`, `continue`),
from any process that reaches the queue. The worker that owns the attempt
settles it (`delivered`); a requester that finds the attempt ended first
settles it `attempt_ended`. Whoever settles it first, by a conditional update
of the null `settled_at`, decides: a request is acted on at most once."""
Index("ix_control_requests_attempt_id", control_requests.c.attempt_id, control_requests.c.id)
Index("ix_control_requests_job_id", control_requests.c.job_id)

devices = Table(
    "devices",
    _metadata,
    Column("uuid", String(96), primary_key=True),
    Column("host", Text, nullable=False),
    Column("idx", Int, nullable=False),
    Column("model", Text, nullable=False),
    Column("memory_bytes", Int),
    Column("held", Int, nullable=False, server_default="0"),
    Column("seen_at", Float, nullable=False),
    CheckConstraint(f"held >= 0 AND held <= {DEVICE_UNITS}", name="held"),
)
"""Every GPU a worker registered, known by its UUID (unique across the
fleet), with the host, NVML index, model and memory it was seen with.
`held` is the units of it held by attempts (a whole device is DEVICE_UNITS,
a 1/k share DEVICE_UNITS / k): the CHECK makes an over-hold impossible,
whichever worker on whichever machine tries; `device_holds` says by whom."""

device_holds = Table(
    "device_holds",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("device_uuid", String(96), ForeignKey("devices.uuid"), nullable=False),
    Column("attempt_id", Int, ForeignKey("attempts.id"), nullable=False),
    Column("job_id", Int, nullable=False),
    Column("units", Int, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("held_at", Float, nullable=False),
    UniqueConstraint("device_uuid", "attempt_id"),
    CheckConstraint(f"units > 0 AND units <= {DEVICE_UNITS}", name="units"),
)
"""Who holds what of a device: written with the claim that places the
attempt, adding its units to `devices.held` in the same transaction, and
deleted (subtracting them) when the attempt's end is recorded by its worker,
or, after a crash, only once the reaper confirmed its processes gone."""
Index("ix_device_holds_attempt_id", device_holds.c.attempt_id)

lanes = Table(
    "lanes",
    _metadata,
    Column("queue", String(64), primary_key=True),
    Column("paused_at", Float, nullable=False),
    Column("paused_by", Text, nullable=False),
    Column("reason", Text),
)
"""A row means the lane is paused: workers claim nothing from it (one primary
key lookup inside the claim transaction). Resuming deletes the row."""

job_dependencies = Table(
    "job_dependencies",
    _metadata,
    Column("job_id", Int, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("after_job_id", Int, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("any_end", Int, nullable=False, server_default="0"),
)
"""job_id waits until after_job_id is done (any_end 1, `--after-job-any`:
until it ended in any way, done, dead or canceled). Rows go with either job when it
is pruned (a pruned parent had finished, so nothing waits on it any more)."""
Index("ix_job_dependencies_after_job_id", job_dependencies.c.after_job_id)

output_chunks = Table(
    "output_chunks",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("attempt_id", Int, ForeignKey("attempts.id", ondelete="CASCADE"), nullable=False),
    Column("stream", String(8), nullable=False),
    Column("offset", Int, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("truncated", Int, nullable=False, server_default="0"),
    UniqueConstraint("attempt_id", "stream", "offset"),
)
"""An attempt's output stored in the database as it is produced, in bounded
chunks (PostgreSQL queues: readable from any machine). `offset` is the
chunk's byte position in its stream; `truncated` 1 marks the last chunk kept
once the per-attempt cap was reached. The worker's local files stay the
first copy; SQLite queues read those and store no chunks."""

schedules = Table(
    "schedules",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False),
    Column("cron", Text),
    Column("every_s", Float),
    Column("timezone", Text, nullable=False),
    Column("overlap", String(8), nullable=False),
    Column("catch_up", String(8), nullable=False),
    Column("anchor_at", Float, nullable=False),
    Column("job", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("next_fire_at", Float, nullable=False),
    Column("paused_at", Float),
    Column("paused_reason", Text),
    Column("last_job_id", Int),
    Column("last_slot_at", Float),
    UniqueConstraint("name"),
    _one_of("overlap", Overlap),
    _one_of("catch_up", CatchUp),
    CheckConstraint("(cron IS NULL) <> (every_s IS NULL)", name="cron_or_every"),
)
"""A recurring job (`schedule add`): a cron expression in a named zone, or
every `every_s` seconds from `anchor_at`. `job` is the JSON of the job flags
each occurrence is submitted with. `next_fire_at` is the next fire time; any
worker fires a schedule once it is due (one range scan of the index below).
`last_slot_at` is the latest fire time reached (the columns keep the older
word "slot")."""
Index("ix_schedules_next_fire_at", schedules.c.next_fire_at)

schedule_occurrences = Table(
    "schedule_occurrences",
    _metadata,
    Column("id", Int, primary_key=True, autoincrement=True),
    Column("schedule_id", Int, ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
    Column("slot_at", Float, nullable=False),
    Column("at", Float, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("job_id", Int, ForeignKey("jobs.id", ondelete="SET NULL")),
    UniqueConstraint("schedule_id", "slot_at"),
    _one_of("outcome", OccurrenceOutcome),
)
"""One row per fire time a schedule reached (`slot_at`): its job (fired, or
`schedule run`) or the record that it was skipped. The unique (schedule_id,
slot_at) is what makes a second job for one fire time impossible, whichever
process or machine tries; the firing transaction inserts this row, the job
and the schedule's next fire time together."""


def _with_partial_indexes() -> MetaData:
    """The whole schema: the tables plus the partial unique index on active
    idempotency keys, the partial index of jobs that require their limits,
    and PostgreSQL's two ledger indexes. Their
    `postgresql_where` makes SQLAlchemy import its whole PostgreSQL dialect
    (about 25 ms), which no verb needs to read or write rows: only DDL and
    schema comparisons (migrations, tests) use the index objects, so they are
    attached on the first access to `metadata`."""
    if "uq_jobs_active_key" not in {index.name for index in jobs.indexes}:
        Index(
            "uq_jobs_active_key",
            jobs.c.idempotency_key,
            unique=True,
            sqlite_where=text(ACTIVE_KEY_WHERE),
            postgresql_where=text(ACTIVE_KEY_WHERE),
        )
        # Jobs that only a worker able to enforce their limits may claim (the
        # claim's check, `status`'s list): partial, empty in the common case.
        Index(
            "ix_jobs_needs_limits",
            jobs.c.require_limits,
            jobs.c.state,
            sqlite_where=text(NEEDS_LIMITS_WHERE),
            postgresql_where=text(NEEDS_LIMITS_WHERE),
        )
        # Queued jobs the claim places: the claim's test that none is due in
        # its lane reads this index only (empty without requests). `state`
        # leads, as in ix_jobs_claim, and `next_run_at` follows `queue`: the
        # one more bound term makes SQLite's planner choose it.
        Index(
            "ix_jobs_requests",
            jobs.c.state,
            jobs.c.queue,
            jobs.c.next_run_at,
            sqlite_where=text(f"state = 'queued' AND ({REQUESTS_WHERE})"),
            postgresql_where=text(f"state = 'queued' AND ({REQUESTS_WHERE})"),
        )
        # PostgreSQL's ledger positions: unique, and the events still without
        # one found without a scan. Each index leaves out the other's rows, so
        # a writer's insert adds an entry to one of them only. SQLite reads by
        # id and keeps seq null.
        positioned, unpositioned = text("seq IS NOT NULL"), text("seq IS NULL")
        only_on(
            "postgresql",
            Index("uq_job_events_seq", job_events.c.seq, unique=True, postgresql_where=positioned),
        )
        only_on(
            "postgresql",
            Index("ix_job_events_unsequenced", job_events.c.id, postgresql_where=unpositioned),
        )
    return _metadata


ONLY_ON = "spoolctl_only_on"
"""Index.info key: the one backend the index exists on (migrations/env.py
compares it with the database only there)."""


def only_on(dialect: str, index: Index) -> Index:
    index.info[ONLY_ON] = dialect
    return index.ddl_if(dialect=dialect)


def __getattr__(name: str) -> Any:
    if name == "metadata":
        return _with_partial_indexes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
