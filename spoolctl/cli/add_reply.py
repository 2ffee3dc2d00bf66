"""What `add` answers for one job, on either path (the click verb in
`cli/jobs.py`, the lean path in `cli/lean.py`): light, so both write the
same bytes."""

from __future__ import annotations

from typing import Any

from spoolctl.cli.reply import Reply
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submission import Submitted
from spoolctl.states import JobState


def added_reply(result: Submitted, spec: JobSpec) -> Reply:
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
