"""`add`: submitting one job from the command line (`batch.py` reads many
from NDJSON with --batch)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from spoolctl import validate
from spoolctl.cli.batch import batch_defaults, read_batch
from spoolctl.cli.database import open_write
from spoolctl.cli.options import (
    ENV_PAIR,
    JOB_ID,
    TAG_PAIR,
    BoundedInt,
    Duration,
    QueueName,
    Rule,
    Timestamp,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.render import Reply, emit
from spoolctl.errors import InvalidInput, MissingRequired
from spoolctl.services.submit import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_QUEUE,
    DEFAULT_TIMEOUT_S,
    JobSpec,
    Submitted,
    submit,
    submit_batch,
)
from spoolctl.states import JobState

F = TypeVar("F", bound=Callable[..., Any])

TIMEOUT = Rule("timeout", validate.timeout_seconds, {"min": 1, "max": validate.MAX_TIMEOUT_S})
KEY = Rule("key", validate.idempotency_key, validate.LIMITS["key"])
NOTE = Rule("note", validate.note, validate.LIMITS["note"])
CWD = Rule("path", validate.cwd, validate.LIMITS["cwd"])
MEMORY = Rule("size", validate.memory_size, validate.LIMITS["memory_bytes"])
CPUS = Rule("cpus", validate.cpus, validate.LIMITS["cpus"])


TIMEOUT_FLAG = click.option(
    "--timeout",
    "timeout_seconds",
    type=TIMEOUT,
    default=str(DEFAULT_TIMEOUT_S),
    show_default=True,
    help="Seconds (or a duration) before the job's process group is killed.",
)
MAX_RETRIES_FLAG = click.option(
    "--max-retries",
    type=BoundedInt(0, None),
    default=DEFAULT_MAX_RETRIES,
    show_default=True,
    help="Job-owned failures retried before dead.",
)
MAX_CRASHES_FLAG = click.option(
    "--max-crashes",
    type=BoundedInt(0, None),
    default=None,
    help="Worker crashes tolerated before dead (default: unbounded).",
)
PRIORITY_FLAG = click.option(
    "--priority",
    type=BoundedInt(validate.INT32_MIN, validate.INT32_MAX),
    default=0,
    show_default=True,
    help="Higher runs first.",
)
QUEUE_FLAG = click.option(
    "--queue",
    type=QueueName(),
    default=DEFAULT_QUEUE,
    show_default=True,
    help="The lane the job waits in.",
)
AFTER_FLAG = click.option(
    "--after", type=Duration(), default=None, help="Run no sooner than this from now."
)
AT_FLAG = click.option("--at", type=Timestamp(), default=None, help="Run no sooner than this time.")
KEY_FLAG = click.option(
    "--key", "idempotency_key", type=KEY, default=None, help="Idempotency key among active jobs."
)
TAG_FLAG = click.option(
    "--tag", "tags", type=TAG_PAIR, multiple=True, help="K=V label (repeatable)."
)
NOTE_FLAG = click.option("--note", type=NOTE, default=None, help="Free text for people.")
CWD_FLAG = click.option("--cwd", type=CWD, default=None, help="Working directory of the job.")
ENV_FLAG = click.option(
    "--env",
    "env",
    type=ENV_PAIR,
    multiple=True,
    help="K=V added to the job's environment (repeatable).",
)
MEMORY_FLAG = click.option(
    "--memory",
    "memory_bytes",
    type=MEMORY,
    default=None,
    help="Memory limit of each attempt (512M, 2G) through its cgroup; over it, OOM-killed.",
)
CPUS_FLAG = click.option(
    "--cpus", type=CPUS, default=None, help="CPU limit of each attempt (0.5, 2) through its cgroup."
)
REQUIRE_LIMITS_FLAG = click.option(
    "--require-limits",
    is_flag=True,
    default=False,
    help="Only a worker that can enforce --memory/--cpus claims the job.",
)

JOB_FLAGS = (
    TIMEOUT_FLAG,
    MAX_RETRIES_FLAG,
    MAX_CRASHES_FLAG,
    PRIORITY_FLAG,
    QUEUE_FLAG,
    TAG_FLAG,
    NOTE_FLAG,
    CWD_FLAG,
    ENV_FLAG,
    MEMORY_FLAG,
    CPUS_FLAG,
    REQUIRE_LIMITS_FLAG,
)
"""The job flags of `add` that `schedule add` takes too (its occurrences'
job flags): one definition, so a flag added here reaches both."""


def job_flags(fn: F) -> F:
    """Apply JOB_FLAGS to a command, in their order."""
    for flag in reversed(JOB_FLAGS):
        fn = flag(fn)
    return fn


@verb(
    "add",
    exclusive=(("after", "at"), ("command", "batch")),
    mutates=True,
    idempotent="when --key is supplied",
    examples=(
        "spoolctl add -- make test",
        "spoolctl add --timeout 10m --max-retries 5 -c 'curl -fsS https://example.org'",
        "spoolctl add --key nightly --after 1h -- ./nightly.sh",
    ),
    context_settings={"allow_interspersed_args": False},
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option("-c", "--command", "command", default=None, help="A shell string, run as sh -c.")
@click.option(
    "--batch",
    default=None,
    help="NDJSON file of jobs ('-' for stdin); all or none. Job flags given with it are "
    "every line's defaults.",
)
@TIMEOUT_FLAG
@MAX_RETRIES_FLAG
@MAX_CRASHES_FLAG
@PRIORITY_FLAG
@QUEUE_FLAG
@AFTER_FLAG
@AT_FLAG
@KEY_FLAG
@TAG_FLAG
@NOTE_FLAG
@CWD_FLAG
@ENV_FLAG
@click.option(
    "--after-job",
    "after_jobs",
    type=JOB_ID,
    multiple=True,
    help="Claimable only once this job is done (repeatable); canceled if it fails.",
)
@click.option(
    "--after-job-any",
    "after_jobs_any",
    type=JOB_ID,
    multiple=True,
    help="Claimable only once this job ended, done, dead or canceled (repeatable); "
    "its failure never cancels this one.",
)
@MEMORY_FLAG
@CPUS_FLAG
@REQUIRE_LIMITS_FLAG
@db_option
@json_option
def add(
    argv: tuple[str, ...],
    command: str | None,
    batch: str | None,
    after: float | None,
    at: float | None,
    tags: tuple[tuple[str, str], ...],
    env: tuple[tuple[str, str], ...],
    db: str | None,
    as_json: bool,
    **options: Any,
) -> int:
    """Submit a command to the queue.

    Give the command after `--` (run as is, never through a shell) or as a
    shell string with -c. The job is durable once this returns. With
    --after-job it waits until those jobs are done (--after-job-any: until
    they ended, however); batch lines can name earlier lines ("after_jobs":
    ["@1"], "after_jobs_any": ["@2"]).
    """
    local = time.time()
    if batch is not None:
        if argv or command is not None:
            raise InvalidInput("--batch cannot be combined with a command")
        run_at = None if after is None and at is None else (at if at is not None else local + after)  # type: ignore[operator]
        defaults = batch_defaults(options, run_at, tags, env)
        specs = read_batch(batch, local, defaults)
        queue = open_write(db, synchronous="FULL")
        now = queue.now()  # the server's clock on PostgreSQL: a submitter's may be off
        rebased = [rebase(s, local, now) for s in specs]
        ids = queue.write(lambda conn: submit_batch(conn, rebased, now))
        return emit(
            Reply({"count": len(ids), "job_ids": ids}, text=f"Added {len(ids)} jobs"), as_json
        )
    spec = JobSpec(
        argv=command_argv(argv, command),
        run_at=None if after is None and at is None else (at if at is not None else local + after),  # type: ignore[operator]
        tags=validate.tag_map(dict(tags)),
        env=validate.env_map(dict(env)),
        **options,
    )
    queue = open_write(db, synchronous="FULL")
    now = queue.now()  # the server's clock on PostgreSQL: a submitter's may be off
    spec = rebase(spec, local, now)
    result = queue.write(lambda conn: submit(conn, spec, now))
    return emit(added_reply(result, spec), as_json)


def rebase(spec: JobSpec, local: float, now: float) -> JobSpec:
    """A spec whose run_at was read against the local clock, on `now`'s scale."""
    if spec.run_at is None or now == local:
        return spec
    return dataclasses.replace(spec, run_at=spec.run_at + (now - local))


def command_argv(argv: tuple[str, ...], command: str | None) -> list[str]:
    if command is not None and argv:
        raise InvalidInput("give the command either with -c or after --, not both")
    if command is not None:
        return validate.shell_string(command)
    if not argv:
        raise MissingRequired("no command given: use `add -- PROGRAM ARGS...` or `add -c STRING`")
    explicit = click.get_current_context().meta.get("explicit_boundary", False)
    if not explicit and any(token.startswith("-") for token in argv):
        raise InvalidInput(
            "a flag-looking token in the command without an explicit `--`: "
            "write `spoolctl add [options] -- PROGRAM ARGS...`",
            argv=list(argv),
        )
    return validate.argv(list(argv))


def added_reply(result: Submitted, spec: JobSpec) -> Reply:
    data: dict[str, Any] = {
        "job_id": result.job_id,
        "state": result.state,
        "deduplicated": result.deduplicated,
        "next_run_at": result.next_run_at,
        "priority": result.priority,
        "queue": result.queue,
        "cwd": result.cwd,
        "env_keys": result.env_keys,
        "after_jobs": list(spec.after_jobs),
        "after_jobs_any": list(spec.after_jobs_any),
    }
    text = f"Added job {result.job_id}"
    reply = Reply(data)
    parents = (*spec.after_jobs, *spec.after_jobs_any)
    if parents and not result.deduplicated:
        text = after_jobs_text(reply, result, parents)
    if spec.idempotency_key is not None:
        data["idempotency"] = {
            "key": spec.idempotency_key,
            "metadata_differs": bool(result.metadata_differences),
            "metadata_differences": result.metadata_differences,
        }
    if result.deduplicated:
        text = f"Job {result.job_id} is already {result.state} under key {spec.idempotency_key!r}"
        if result.metadata_differences:
            reply.warn(
                "IDEMPOTENCY_METADATA_DIFFERS",
                f"job {result.job_id} kept its {', '.join(result.metadata_differences)}",
            )
    reply.text = text
    return reply


def after_jobs_text(reply: Reply, result: Submitted, after: tuple[int, ...]) -> str:
    named = ", ".join(map(str, after))
    if result.state == JobState.CANCELED:
        reply.warn(
            "DEPENDENCY_FAILED",
            f"job {result.job_id} was created canceled: a job it waits for ({named}) "
            "already ended dead or canceled",
        )
        return f"Added job {result.job_id}, canceled: a job it waits for already failed"
    if result.state == JobState.WAITING:
        return f"Added job {result.job_id}, waiting for job(s) {named}"
    return f"Added job {result.job_id} (jobs {named} are done)"
