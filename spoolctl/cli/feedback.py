"""`feedback`: one verdict on a job: how it ended, the tail of each of its
streams (read as `output` reads them), and the commands to run next."""

from __future__ import annotations

from typing import Any

import click

from spoolctl.cli.options import JOB_ID, BoundedInt, db_option, json_option, verb
from spoolctl.cli.output import STREAM_CHOICE, open_existing, refuse_outside, selected
from spoolctl.cli.render import style
from spoolctl.cli.reply import Reply, emit
from spoolctl.config import Timing
from spoolctl.db.queue import Queue
from spoolctl.db.where import named_db
from spoolctl.errors import InvalidInput
from spoolctl.services import placement_views
from spoolctl.services.attempt_output import STREAMS, AttemptOutput, confine, find_attempt
from spoolctl.services.dependencies import FAILED_PARENT_STATES, waits_for
from spoolctl.services.job_defaults import config_defaults, timeout_words
from spoolctl.services.job_spec import DEFAULT_TIMEOUT_S
from spoolctl.services.query import decode_job, get_job_row
from spoolctl.services.statements import reads
from spoolctl.states import TERMINAL_JOB_STATES, FailureReason, JobState
from spoolctl.text import shown


@verb(
    "feedback",
    examples=(
        "spoolctl feedback 42",
        "spoolctl feedback 42 --tail-bytes 500 --stream stderr --json",
    ),
)
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--tail-bytes",
    type=BoundedInt(1, 65_536),
    default=2048,
    show_default=True,
    help="Bytes shown from the end of each stream.",
)
@click.option(
    "--stream", type=STREAM_CHOICE, default="both", show_default=True, help="Which captured stream."
)
@db_option
@json_option
def feedback(job_id: int, tail_bytes: int, stream: str, db: str | None, as_json: bool) -> int:
    """One verdict on a job: how it ended, the tail of its output, what to run next."""
    queue = open_existing(db, job_id)
    now = queue.now()
    job, found, after_jobs, unplaceable = queue.read(lambda conn: feedback_facts(conn, job_id, now))
    ref = confine(found, queue.output_root)
    data = verdict(job, ref, now)
    data["after_jobs"] = after_jobs
    data["unplaceable"] = unplaceable
    if data["failure_reason"] == FailureReason.DEPENDENCY_FAILED:
        data["remediation"] = dependency_remediation(job_id, after_jobs)
    # JSON always carries both streams (as 0.4.11 did); --stream picks what text shows
    data["streams"] = tails(queue, ref, tail_bytes)
    picked = selected(stream)
    note = timeout_note(job, data["failure_reason"], queue_fields(db))
    reply = Reply(data, text=lambda: feedback_text(data, picked, note))
    refuse_outside(queue, reply, ref, data["streams"])
    if ref.attempt_no is None:
        reply.warn("NO_ATTEMPTS_YET", f"job {job_id} has no attempt yet")
    if unplaceable is not None:
        reply.warn("UNPLACEABLE", f"job {job_id} cannot be placed: {unplaceable}")
    return emit(reply, as_json)


def queue_fields(db: str | None) -> dict[str, Any] | None:
    """The queue's `defaults` from its config file (None where it has a bad one:
    `add` says what is wrong with it; a verdict does not need it)."""
    named = named_db(db)
    try:
        return config_defaults(named.config).fields
    except InvalidInput:
        return None


def timeout_note(
    job: dict[str, Any], reason: str | None, queue_wide: dict[str, Any] | None
) -> str | None:
    """For a job killed by the timeout it was given by default (the queue's
    `defaults`, else 300 s): say so, and how to give another. Judged by the
    value: a job that asked for exactly that timeout reads the same advice."""
    seconds = job.get("timeout_seconds")
    if reason != FailureReason.TIMEOUT or not isinstance(seconds, int):
        return None
    configured = (queue_wide or {}).get("timeout_seconds")
    if configured is not None and seconds == configured:
        whose = "the queue's default"
    elif configured is None and seconds == DEFAULT_TIMEOUT_S:
        whose = "the default"
    else:
        return None
    return (
        f"killed by {whose} {timeout_words(seconds)} timeout; "
        "use --timeout (e.g. --timeout 1h or none)"
    )


def tails(queue: Queue, ref: AttemptOutput, budget: int) -> dict[str, dict[str, Any]]:
    if ref.attempt_no is None:
        return {name: NOT_RUN_TAIL.copy() for name in STREAMS}
    reader = queue.output()
    return queue.read(lambda conn: {name: reader.tail(conn, ref, name, budget) for name in STREAMS})


def feedback_facts(
    conn: Any, job_id: int, now: float
) -> tuple[dict[str, Any], AttemptOutput, list[dict[str, Any]], str | None]:
    """The job, its latest attempt, what it waits for, and why no live
    worker could hold it (None: one could, or it is not queued)."""
    ref = find_attempt(conn, job_id, None)
    row = get_job_row(conn, job_id)
    assert row is not None  # find_attempt raised NotFound otherwise
    job = decode_job(row)
    live = Timing.from_env().reap_threshold_s
    why = placement_views.unplaceable_reason(reads(conn), job, now, live)
    return job, ref, waits_for(conn, [job_id]).get(job_id, []), why


def dependency_remediation(job_id: int, after_jobs: list[dict[str, Any]]) -> str:
    """A job canceled because a job it waited for failed: look at that one and
    retry it with its dependents."""
    failed = [p["job_id"] for p in after_jobs if p["state"] in FAILED_PARENT_STATES]
    if not failed:
        return f"spoolctl show {job_id}; spoolctl retry {job_id}"
    return f"spoolctl feedback {failed[0]}; spoolctl retry {failed[0]} --with-dependents"


def verdict(job: dict[str, Any], ref: AttemptOutput, now: float) -> dict[str, Any]:
    state = job["state"]
    terminal = state in TERMINAL_JOB_STATES
    attempt = ref.row
    started, finished = attempt.get("started_at"), attempt.get("finished_at")
    return {
        "job_id": job["id"],
        "state": state,
        "terminal": terminal,
        "succeeded": (state == JobState.DONE) if terminal else None,
        "exit_code": attempt["exit_code"] if attempt else job["last_exit_code"],
        "failure_reason": (attempt.get("failure_reason") if attempt else None)
        or job["last_failure_reason"],
        "last_error": job["last_error"],
        "attempts": job["attempts"],
        "attempts_total": ref.attempts_total,
        "latest_attempt_no": ref.attempt_no,
        "duration_seconds": None if started is None else round((finished or now) - started, 3),
        "remediation": remediation(job["id"], state, ref.attempt_no is not None),
    }


def remediation(job_id: int, state: str, has_attempt: bool) -> str | None:
    """The next commands to run, or None when the job succeeded."""
    if state == JobState.DONE:
        return None
    if state in (JobState.QUEUED, JobState.RUNNING, JobState.WAITING):
        return f"spoolctl wait {job_id} && spoolctl feedback {job_id}"
    read = f"spoolctl output {job_id} --stream stderr" if has_attempt else f"spoolctl show {job_id}"
    return f"{read}; spoolctl retry {job_id}"


NOT_RUN_TAIL: dict[str, Any] = {
    "path": None,
    "size_bytes": 0,
    "tail": "",
    "truncated": False,
    "missing": True,
}


def feedback_text(
    data: dict[str, Any],
    picked: tuple[str, ...] = ("stdout", "stderr"),
    note: str | None = None,
) -> str:
    verdict_word = {True: "succeeded", False: "did not succeed", None: "not finished"}
    lines = [
        f"job {data['job_id']}: {shown(data['state'])} ({verdict_word[data['succeeded']]})",
        f"  exit code {'-' if data['exit_code'] is None else data['exit_code']}"
        f"  reason {shown(data['failure_reason'] or '-')}"
        f"  attempts {data['attempts_total']}  failures {shown(data['attempts'])}"
        f"  duration {data['duration_seconds']}s",
    ]
    if data["last_error"]:
        lines.append(f"  last error: {shown(data['last_error'])}")
    if note:
        lines.append(f"  {note}")
    if data.get("after_jobs"):
        waits = ", ".join(f"{p['job_id']} ({shown(p['state'])})" for p in data["after_jobs"])
        lines.append(f"  after jobs: {waits}")
    if data.get("unplaceable"):
        lines.append(style(f"  unplaceable: {shown(data['unplaceable'])}", fg="yellow"))
    for name, info in data["streams"].items():
        if info["tail"] and name in picked:
            lines += [
                style(f"-- {name} (last {len(info['tail'])} chars) --", bold=True),
                shown(info["tail"].rstrip("\n"), keep_newlines=True),
            ]
    if data["remediation"]:
        lines.append(f"next: {data['remediation']}")
    return "\n".join(lines)
