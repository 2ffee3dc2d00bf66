"""What `add` answers for one job, on either path (the click verb in
`cli/jobs.py`, the lean path in `cli/lean.py`): light, so both write the
same bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spoolctl.cli.reply import Reply
from spoolctl.services.job_defaults import timeout_words
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submission import Submitted
from spoolctl.states import JobState

DEFAULTED_SHOWN = ("timeout_seconds", "max_retries")
"""The attributes `add`'s text on a terminal always shows, with where their
value came from: they decide how long a job may run and how often again."""


def added_reply(
    result: Submitted,
    spec: JobSpec,
    *,
    quiet: bool = False,
    terminal: bool = False,
    defaulted: Mapping[str, str] | None = None,
) -> Reply:
    """quiet: the text is the job's id alone (`add -q`); terminal: stdout is
    a terminal, and the text adds a line with the job's timeout and retries;
    defaulted: of those, the ones no flag gave -> where their value came from
    ("default", or "the queue's default" from the config file)."""
    data: dict[str, Any] = {
        "job_id": result.job_id,
        "state": result.state,
        "deduplicated": result.deduplicated,
        "next_run_at": result.next_run_at,
        "priority": result.priority,
        "queue": result.lane,
        "cwd": result.cwd,
        "env_keys": result.env_keys,
        "after_jobs": list(spec.after_jobs),
        "after_jobs_any": list(spec.after_jobs_any),
    }
    text = f"Added job {result.job_id}"
    reply = Reply(data)
    parents = (*spec.after_jobs, *spec.after_jobs_any)
    if parents and not result.deduplicated:
        text = after_jobs_text(reply, result, spec)
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
    if quiet:
        text = str(result.job_id)
    elif terminal and not result.deduplicated:
        text += "\n" + limits_line(spec, defaulted or {})
    reply.text = text
    return reply


def defaulted(given: set[str], queue_fields: Mapping[str, Any]) -> dict[str, str]:
    """Of the attributes the terminal text shows, those no flag gave (`given`:
    JobSpec attribute names) -> where their value came from."""
    return {
        name: "the queue's default" if name in queue_fields else "the default"
        for name in DEFAULTED_SHOWN
        if name not in given
    }


def limits_line(spec: JobSpec, defaulted: Mapping[str, str]) -> str:
    """`  timeout 5 min (the default; --timeout none: no limit), max retries 3 (the default)`."""

    def source(name: str, hint: str = "") -> str:
        where = defaulted.get(name)
        return f" ({where}{hint})" if where else ""

    timeout = timeout_words(spec.timeout_seconds)
    timeout_hint = "; --timeout none: no limit" if spec.timeout_seconds else ""
    return (
        f"  timeout {timeout}{source('timeout_seconds', timeout_hint)}, "
        f"max retries {spec.max_retries}{source('max_retries')}"
    )


def after_jobs_text(reply: Reply, result: Submitted, spec: JobSpec) -> str:
    named = ", ".join(map(str, (*spec.after_jobs, *spec.after_jobs_any)))
    if result.state == JobState.CANCELED:
        reply.warn(
            "DEPENDENCY_FAILED",
            f"job {result.job_id} was created canceled: a job it waits for ({named}) "
            "already ended dead or canceled",
        )
        return f"Added job {result.job_id}, canceled: a job it waits for already failed"
    if result.state == JobState.WAITING:
        return f"Added job {result.job_id}, waiting for job(s) {named}"
    ended = []  # every job waited for has ended: --after-job ones done, --after-job-any ones anyhow
    if spec.after_jobs:
        ended.append(f"jobs {', '.join(map(str, spec.after_jobs))} are done")
    if spec.after_jobs_any:
        ended.append(f"jobs {', '.join(map(str, spec.after_jobs_any))} have ended")
    return f"Added job {result.job_id} ({'; '.join(ended)})"
