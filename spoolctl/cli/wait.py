"""`wait`: block until every named job has ended, with a progress line for a
person. Read-only: it never takes the write lock and never creates a queue."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import click

from spoolctl.cli.database import no_job, open_read
from spoolctl.cli.options import JOB_ID, Duration, Seconds, db_option, json_option, verb
from spoolctl.cli.render import ProgressLine
from spoolctl.cli.reply import Reply, emit
from spoolctl.errors import EXIT_JOB_UNSUCCESSFUL, EXIT_OK, NotFound, WaitTimeout
from spoolctl.services import query
from spoolctl.states import JobState
from spoolctl.text import shown
from spoolctl.validate import MAX_WAIT_S

WAIT_FINAL = frozenset({JobState.DONE, JobState.DEAD, JobState.CANCELED, JobState.FAILED})


@verb(
    "wait",
    examples=("spoolctl wait 41 42", "spoolctl wait 42 --timeout 10m --json"),
)
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@click.option(
    "--timeout",
    type=Duration(MAX_WAIT_S),
    default=str(MAX_WAIT_S),
    show_default=True,
    help="Give up (TIMEOUT, exit 4) after this long.",
)
@click.option(
    "--poll-interval",
    type=Seconds(0, 3600),
    default=0.2,
    show_default=True,
    help="Seconds between looks at the queue.",
)
@db_option
@json_option
def wait(
    job_ids: tuple[int, ...], timeout: float, poll_interval: float, db: str | None, as_json: bool
) -> int:
    """Block until every job is done, dead or canceled.

    Exit 0 when all are done, 6 when any ended otherwise, 4 (TIMEOUT) when the
    time runs out first. A TIMEOUT's message names the first 10 unfinished
    jobs and how many more; `detail.pending` lists them all and
    `detail.pending_count` counts them.
    """
    ids = sorted(set(job_ids))
    started = time.monotonic()
    deadline = started + timeout
    found = open_read(db)
    progress = ProgressLine(as_json)
    try:
        while True:
            summary = (
                {} if found is None else found.read(lambda conn: query.wait_summary(conn, ids))
            )
            missing = [i for i in ids if i not in summary]
            if missing and found is None:
                raise no_job(missing[0], db)
            if missing:
                raise NotFound(f"no job {missing[0]}", job_ids=missing)
            pending = [i for i in ids if summary[i]["state"] not in WAIT_FINAL]
            if not pending:
                progress.done()
                return emit(wait_reply(summary), as_json)
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"jobs still unfinished after {timeout:g}s: {some_ids(pending)}",
                    pending=pending,
                    pending_count=len(pending),
                )
            progress.update(wait_progress(summary, time.monotonic() - started))
            time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
    finally:
        progress.done()


SHOWN_IDS = 10
"""A message names at most this many ids; `detail` keeps them all."""


def some_ids(ids: list[int]) -> str:
    """The first ids, and how many more: one line a person can read, whatever
    the count (`detail.pending` has every id)."""
    shown_ids = ", ".join(map(str, ids[:SHOWN_IDS]))
    more = len(ids) - SHOWN_IDS
    return f"{shown_ids} and {more:,} more" if more > 0 else shown_ids


def wait_progress(summary: dict[int, dict[str, Any]], elapsed: float) -> str:
    states = Counter(s["state"] for s in summary.values())
    parts = ", ".join(f"{n} {shown(state)}" for state, n in sorted(states.items()))
    return f"waiting for {len(summary)} jobs: {parts} ({elapsed:.0f}s)"


def wait_reply(summary: dict[int, dict[str, Any]]) -> Reply:
    all_done = all(s["state"] == JobState.DONE for s in summary.values())
    data = {"all_succeeded": all_done, "jobs": {str(i): s for i, s in summary.items()}}
    lines = [
        f"job {i}: {shown(s['state'])} (failures {shown(s['attempts'])})"
        for i, s in summary.items()
    ]
    return Reply(
        data, text="\n".join(lines), exit_code=EXIT_OK if all_done else EXIT_JOB_UNSUCCESSFUL
    )
