"""The verb that takes jobs that never ran out of the queue: remove."""

from __future__ import annotations

import click

from spoolctl.cli.database import no_job, open_existing_write
from spoolctl.cli.options import JOB_ID, db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.services.remove import remove as remove_jobs


@verb(
    "remove",
    mutates=True,
    destructive="of jobs that never ran (the ledger keeps a removed event for each)",
    idempotent=False,
    examples=("spoolctl remove 42", "spoolctl remove 42 43 --json"),
)
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@db_option
@json_option
def remove(job_ids: tuple[int, ...], db: str | None, as_json: bool) -> int:
    """Delete jobs that never ran (queued or waiting): gone from every view, ledgered.

    Unlike cancel, which keeps a job as canceled, remove deletes it: `list`,
    `status`, `show` and the dashboard no longer know it. The ledger keeps a
    `removed` event for each (`events`; its job id is null, `detail.job_id`
    names the job, with its command, lane and former state).

    Takes queued jobs (due, delayed with --after, or in a paused lane) and
    waiting ones (--after-job). A running job is CONFLICT (stop it with
    `cancel --running --yes`), as is an ended one (`prune` deletes those) and a
    queued one that already ran and waits for its retry (`cancel` it: its
    output stays). Every id is checked first: one bad id and nothing is
    removed.

    Jobs that waited for a removed job (--after-job) are canceled, as cancel
    does (failure reason dependency_failed, parent state `removed`); jobs that
    waited for it with --after-job-any count it as ended.
    """
    queue = open_existing_write(db)
    if queue is None:
        raise no_job(job_ids[0], db)
    now = queue.now()
    done = queue.write(lambda conn: remove_jobs(conn, job_ids, now=now))
    data = {
        "removed": done.removed,
        "count": len(done.removed),
        "dependents_canceled": done.dependents_canceled,
    }
    words = ", ".join(map(str, done.removed))
    text = f"Removed job {words}" if len(done.removed) == 1 else f"Removed jobs {words}"
    if done.dependents_canceled:
        canceled = ", ".join(map(str, done.dependents_canceled))
        text += f"; canceled the jobs that waited for them: {canceled}"
    return emit(Reply(data, text=text), as_json)
