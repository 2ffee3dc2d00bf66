"""`add`: submitting one job from the command line (`batch.py` reads many
from NDJSON with --batch); its job flags come from the declaration of a
job's attributes (`job_flags.py`)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import click
from click.core import ParameterSource

from spoolctl import validate
from spoolctl.cli.add_reply import added_reply, defaulted
from spoolctl.cli.batch import batch_defaults, read_batch
from spoolctl.cli.database import open_write
from spoolctl.cli.job_flags import job_flags, spec_values
from spoolctl.cli.options import db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit, note_created
from spoolctl.db.location import unnamed_new_queue
from spoolctl.db.where import named_db
from spoolctl.errors import InvalidInput, MissingRequired
from spoolctl.services.job_defaults import config_defaults
from spoolctl.services.job_defaults import here_environment as here_env
from spoolctl.services.job_spec import BY_NAME, FIELDS, JobSpec
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
@click.option(
    "--here/--no-here",
    "here",
    default=None,
    help="Run the job in this folder with this shell's whole environment, captured now "
    "(stored in the queue in clear); an explicit --cwd or --env wins. Default: the config "
    "file's defaults.here, else off.",
)
@job_flags()
@click.option(
    "-q",
    "--quiet",
    "quiet",
    is_flag=True,
    help="Print only the job's id (with --batch, the ids, one a line); --json wins.",
)
@db_option
@json_option
def add(
    argv: tuple[str, ...],
    command: str | None,
    batch: str | None,
    here: bool | None,
    after: float | None,
    at: float | None,
    tags: tuple[tuple[str, str], ...],
    env: tuple[tuple[str, str], ...],
    quiet: bool,
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

    A job is killed after 300 s (--timeout 300) unless told otherwise:
    --timeout takes seconds or a duration (90m, 1h30m), and none or 0 means
    no timeout. The `defaults` table of the queue's config file sets the
    default of any job flag (docs/configuration.md); a flag given here wins.
    --cwd must name a folder that exists when the queue is a file on this
    machine (SQLite); on PostgreSQL, whose workers may run elsewhere, it is
    checked where the job runs. -q prints only the job's id.
    """
    local = time.time()
    named = named_db(db)
    queue_wide = config_defaults(named.config)
    given = {name for name in options if _given(name)}
    for name, value in queue_wide.fields.items():
        if BY_NAME[name].key not in given:
            options[BY_NAME[name].key] = value
    here = queue_wide.here if here is None else here
    env_pairs, skipped = dict(env), list[str]()
    if here:
        snapshot, skipped = here_env(os.environ)
        env_pairs = {**snapshot, **env_pairs}  # an explicit --env wins
        if "cwd" not in given:
            options["cwd"] = here_folder()
    check_cwd = named.plain_file() is not None  # a queue on this machine: SQLite
    if batch is not None:
        if argv or command is not None:
            raise InvalidInput("--batch cannot be combined with a command")
        run_at = None if after is None and at is None else (at if at is not None else local + after)  # type: ignore[operator]
        defaults = batch_defaults(options, run_at, tags, tuple(env_pairs.items()))
        layered = {**queue_wide.fields, **defaults.fields}
        if here and "cwd" not in given:
            layered["cwd"] = options["cwd"]
        specs = read_batch(batch, local, dataclasses.replace(defaults, fields=layered))
        if check_cwd:
            for one in specs:
                if one.cwd is not None:
                    validate.existing_dir(one.cwd)
        fresh = unnamed_new_queue(db)
        queue = open_write(db, synchronous="FULL")
        now = queue.now()  # the server's clock on PostgreSQL: a submitter's may be off
        rebased = [rebase(s, local, now) for s in specs]
        ids = queue.write(lambda conn: submit_batch(conn, rebased, now))
        text = "\n".join(map(str, ids)) if quiet else f"Added {len(ids)} jobs"
        reply = Reply({"count": len(ids), "job_ids": ids}, text=text)
        note_created(fresh)
        return emit(warn_skipped(reply, skipped), as_json)
    spec = JobSpec(
        argv=command_argv(argv, command),
        run_at=None if after is None and at is None else (at if at is not None else local + after),  # type: ignore[operator]
        tags=validate.tag_map(dict(tags)),
        env=validate.env_map(env_pairs),
        **spec_values(options),
    ).check()
    if check_cwd and spec.cwd is not None:
        validate.existing_dir(spec.cwd)
    fresh = unnamed_new_queue(db)
    queue = open_write(db, synchronous="FULL")
    now = queue.now()  # the server's clock on PostgreSQL: a submitter's may be off
    spec = rebase(spec, local, now)
    result = queue.write(lambda conn: submit(conn, spec, now))
    reply = added_reply(
        result,
        spec,
        quiet=quiet,
        terminal=sys.stdout.isatty(),
        defaulted=defaulted({f.name for f in FIELDS if f.key in given}, queue_wide.fields),
    )
    note_created(fresh)
    return emit(warn_skipped(reply, skipped), as_json)


def _given(name: str) -> bool:
    return click.get_current_context().get_parameter_source(name) is ParameterSource.COMMANDLINE


def here_folder() -> str:
    """The submitter's folder for --here, by the rule of --cwd."""
    try:
        return validate.cwd(os.getcwd())
    except FileNotFoundError:
        raise InvalidInput("--here: the current folder no longer exists", field="cwd") from None


def warn_skipped(reply: Reply, skipped: list[str]) -> Reply:
    """--here left out variables a job's env cannot hold: say which."""
    if skipped:
        reply.warn(
            "HERE_ENV_SKIPPED",
            f"--here left out {len(skipped)} variable(s) a job's env cannot hold "
            f"(over {validate.ENV_VALUE_MAX} characters, or not UTF-8): {', '.join(skipped)}",
        )
    return reply


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
