"""Verbs that change jobs by hand: retry, cancel, prune."""

from __future__ import annotations

import functools
import signal
from dataclasses import asdict

import click

from spoolctl.cli.database import no_job, open_existing_write, open_read, open_write
from spoolctl.cli.options import (
    JOB_ID,
    Duration,
    StateList,
    _Validated,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.reply import Reply, emit
from spoolctl.db.queue import Queue
from spoolctl.errors import SafetyBlock
from spoolctl.runner.stopping import TERM_GRACE_S
from spoolctl.services import prune as pruning
from spoolctl.services.cancel import GRACEFUL, signal_number
from spoolctl.services.cancel import cancel as cancel_job
from spoolctl.services.deadletter import requeue
from spoolctl.states import JobState

KILL_ASYNC = "the owning worker kills the job's process group at its next heartbeat"


def existing_queue(db: str | None, job_id: int) -> Queue:
    """The queue for a change to one job; a missing queue is not created for it."""
    queue = open_existing_write(db)
    if queue is None:
        raise no_job(job_id, db)
    return queue


class SignalName(_Validated):
    """A signal by name (TERM, SIGTERM) or number (15)."""

    name = "signal"

    def check(self, value: str) -> int:
        return signal_number(value)


def stop_async(first: int) -> str:
    """What the owning worker does to a canceled running job, and when."""
    if first == signal.SIGKILL:
        return KILL_ASYNC
    name = signal.Signals(first).name
    return (
        f"the owning worker sends {name} to the job's process group at its next heartbeat, "
        f"then SIGKILL after {TERM_GRACE_S:g} s"
    )


@verb(
    "retry",
    mutates=True,
    destructive="only with --force on running jobs",
    idempotent=False,
    examples=(
        "spoolctl retry 42",
        "spoolctl retry 42 --force",
        "spoolctl retry 42 --with-dependents",
        "spoolctl retry 42 --again",
    ),
)
@click.argument("job_id", type=JOB_ID)
@click.option("--force", is_flag=True, help="Also retry a running job (its attempt is canceled).")
@click.option(
    "--with-dependents",
    is_flag=True,
    help="Also restore the jobs canceled because this one failed (transitively).",
)
@click.option(
    "--again",
    is_flag=True,
    help="Also re-run a done job, as a new attempt of the same job (without it, retry of a "
    "done job is CONFLICT, as in 0.4.11).",
)
@db_option
@json_option
def retry(
    job_id: int, force: bool, with_dependents: bool, again: bool, db: str | None, as_json: bool
) -> int:
    """Requeue an ended job (dead, failed or canceled) with a fresh budget, history kept.

    A job submitted with --after-job goes back to waiting while a job it waits
    for is not done yet.

    A done job runs again only with --again (without it, CONFLICT, exit 5, as
    in 0.4.11, which scripts may rely on): it is queued as a new attempt of the
    same job, with a fresh budget. Its earlier attempts, their output and its
    events stay; `show`, `output --attempt N` and `events` show every run,
    and the `retried` event's detail says `again`. Jobs that waited for it
    have already run and are left as they are.
    """
    queue = existing_queue(db, job_id)
    now = queue.now()
    done = queue.write(
        lambda conn: requeue(
            conn, job_id, force=force, now=now, with_dependents=with_dependents, again=again
        )
    )
    previous = done.previous_state
    data = {"job_id": job_id, "state": done.state, "previous_state": previous}
    if with_dependents:
        data["restored"] = done.restored
    now_word = "requeued" if done.state == JobState.QUEUED else done.state
    text = f"Job {job_id} {now_word} (was {previous})"
    if done.restored:
        text += (
            f"; restored {len(done.restored)} dependent(s): {', '.join(map(str, done.restored))}"
        )
    reply = Reply(data, text=text)
    if previous == JobState.RUNNING:
        reply.warn("KILL_ASYNC", KILL_ASYNC)
    return emit(reply, as_json)


@verb(
    "cancel",
    exclusive=(("now", "signal_name"),),
    mutates=True,
    destructive="only with --running",
    idempotent=False,
    examples=(
        "spoolctl cancel 42",
        "spoolctl cancel 42 --running --yes",
        "spoolctl cancel 42 --running --yes --now",
    ),
)
@click.argument("job_id", type=JOB_ID)
@click.option("--running", is_flag=True, help="Also cancel a running job (needs --yes).")
@click.option("--yes", "-y", "yes", is_flag=True, help="Confirm stopping a running job.")
@click.option(
    "--signal",
    "signal_name",
    type=SignalName(),
    default=None,
    help="The first signal a running job's group gets (default TERM); KILL follows after 5 s.",
)
@click.option("--now", is_flag=True, help="SIGKILL a running job's group at once, no grace.")
@db_option
@json_option
def cancel(
    job_id: int,
    running: bool,
    yes: bool,
    signal_name: int | None,
    now: bool,
    db: str | None,
    as_json: bool,
) -> int:
    """Cancel a queued or waiting job; with --running --yes also a running one.

    A running job is stopped by its worker at its next heartbeat as a
    timeout stops it: SIGTERM to the job's process group, up to 5 s of
    grace, then SIGKILL. --signal chooses the first signal (a name such as
    INT or HUP, or a number); --now sends SIGKILL at once. Jobs waiting for
    it are canceled too (failure reason dependency_failed).
    """
    first = signal.SIGKILL if now else signal_name or GRACEFUL
    queue = existing_queue(db, job_id)
    at = queue.now()
    done = queue.write(
        lambda conn: cancel_job(
            conn, job_id, running_ok=running and yes, now=at, first_signal=first
        )
    )
    reply = Reply(asdict(done), text=f"Job {job_id} canceled")
    if done.was_running:
        reply.warn("KILL_ASYNC", stop_async(first))
    return emit(reply, as_json)


@verb(
    "prune",
    exclusive=(("yes", "dry_run"),),
    mutates=True,
    destructive=True,
    examples=(
        "spoolctl prune --older-than 7d --dry-run",
        "spoolctl prune --older-than 30d --state done --yes",
    ),
)
@click.option(
    "--older-than",
    type=Duration(),
    required=True,
    help="Only jobs that finished at least this long ago.",
)
@click.option(
    "--state",
    "states",
    type=StateList([s.value for s in pruning.PRUNABLE]),
    default="done",
    show_default=True,
    help="Terminal states to prune, comma-separated.",
)
@click.option("--dry-run", is_flag=True, help="Report what would be deleted; change nothing.")
@click.option("--yes", "-y", "yes", is_flag=True, help="Confirm the deletion.")
@db_option
@json_option
def prune(
    older_than: float,
    states: tuple[str, ...],
    dry_run: bool,
    yes: bool,
    db: str | None,
    as_json: bool,
) -> int:
    """Delete old finished jobs: output files first, then attempts, events and jobs.

    Never deletes a file outside the spool's output folder, whatever a row says.
    Past schedule occurrences whose job is gone go too (each schedule's latest
    one stays). A job whose attempt still holds a device (an orphan not
    confirmed gone) is kept, named in held_jobs.
    """
    if not (dry_run or yes):
        raise SafetyBlock("prune deletes jobs and output: add --dry-run to look or --yes to delete")
    report = pruning.PruneReport()
    existing = open_read(db)
    if existing is not None:
        queue = existing if dry_run else open_write(db)
        run_prune(queue, states, queue.now() - older_than, report, dry_run=dry_run)
    data = {**asdict(report), "dry_run": dry_run}
    data.update(actual=not dry_run, irreversible=not dry_run)
    verb_word = "would delete" if dry_run else "deleted"
    text = (
        f"{verb_word} {report.deleted_jobs} jobs, {report.deleted_attempts} attempts, "
        f"{report.deleted_events} events, {report.freed_bytes} bytes of output"
    )
    if report.deleted_output_chunks:  # output stored in the database (PostgreSQL)
        text += (
            f"; {report.deleted_output_chunks} chunks ({report.deleted_output_bytes} bytes)"
            " of output stored in the database"
        )
    if report.deleted_occurrences:
        text += f"; {report.deleted_occurrences} past schedule occurrences"
    if report.held_jobs:  # an orphan not confirmed gone keeps its device, and its job
        kept = ", ".join(map(str, report.held_jobs))
        text += f"; kept job(s) {kept}: an attempt still holds a device"
    return emit(Reply(data, text=text), as_json)


def run_prune(
    queue: Queue,
    states: tuple[str, ...],
    cutoff: float,
    report: pruning.PruneReport,
    *,
    dry_run: bool,
) -> None:
    """A dry run reads one snapshot; a real one deletes batch after batch, each
    in its own short write transaction."""
    root = queue.output_root
    if dry_run:
        queue.read(lambda conn: pruning.survey(conn, states, cutoff, root, report))
        return
    while batch := queue.write(lambda conn: pruning.prune_batch(conn, states, cutoff, report)):
        pruning.remove_output(batch, root, report, dry_run=False)
    after: int | None = 0  # then the occurrences the jobs' deletes left without a job
    while after is not None:
        batch_after = functools.partial(
            pruning.prune_occurrences, cutoff=cutoff, after_id=after, report=report
        )
        after = queue.write(batch_after)
