"""`add`: submitting one job from the command line (`batch.py` reads many
from NDJSON with --batch); its job flags come from the declaration of a
job's attributes (`job_flags.py`)."""

from __future__ import annotations

import time
from typing import Any

import click

from spoolctl import validate
from spoolctl.cli.add_reply import added_reply
from spoolctl.cli.batch import batch_defaults, read_batch
from spoolctl.cli.database import open_write
from spoolctl.cli.job_flags import job_flags, spec_values
from spoolctl.cli.options import db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit, note_created
from spoolctl.db.location import unnamed_new_queue
from spoolctl.errors import InvalidInput, MissingRequired
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit, submit_batch


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
@job_flags()
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
        fresh = unnamed_new_queue(db)
        queue = open_write(db, synchronous="FULL")
        now = queue.now()  # the server's clock on PostgreSQL: a submitter's may be off
        rebased = [rebase(s, local, now) for s in specs]
        ids = queue.write(lambda conn: submit_batch(conn, rebased, now))
        note_created(fresh)
        return emit(
            Reply({"count": len(ids), "job_ids": ids}, text=f"Added {len(ids)} jobs"), as_json
        )
    spec = JobSpec(
        argv=command_argv(argv, command),
        run_at=None if after is None and at is None else (at if at is not None else local + after),  # type: ignore[operator]
        tags=validate.tag_map(dict(tags)),
        env=validate.env_map(dict(env)),
        **spec_values(options),
    )
    fresh = unnamed_new_queue(db)
    queue = open_write(db, synchronous="FULL")
    now = queue.now()  # the server's clock on PostgreSQL: a submitter's may be off
    spec = rebase(spec, local, now)
    result = queue.write(lambda conn: submit(conn, spec, now))
    note_created(fresh)
    return emit(added_reply(result, spec), as_json)


def rebase(spec: JobSpec, local: float, now: float) -> JobSpec:
    """A spec whose run_at was read against the local clock, on `now`'s scale."""
    if spec.run_at is None or now == local:
        return spec
    return spec._replace(run_at=spec.run_at + (now - local))


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
