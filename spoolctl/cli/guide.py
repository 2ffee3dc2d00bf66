"""The workflow guide of `robot-docs guide`: prose for programs, kept as data.

Verb names and flags quoted here are checked against the click tree by a test,
so the guide cannot recommend a flag that does not exist.
"""

from __future__ import annotations

from typing import Any

# The six sections of 0.4.11's guide, in its order, each with at least as many
# bullets: programs written for it may index them.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Discover the contract",
        (
            "Pass --json to every verb: stdout then holds exactly one JSON envelope with keys "
            "ok, tool_version, data, meta, warnings, commands, errors.",
            "ok is true iff errors is empty; data is null on failure; read errors[0].code, never "
            "the message text.",
            "Exit codes: 0 success, 1 input error, 2 safety block (repeat with --yes or --force "
            "if you mean it), 3 tool or environment, 4 transient (retry later), 5 conflict, "
            "6 an awaited job ended without success.",
            "Options are never abbreviated; an unknown flag is UNKNOWN_FLAG with "
            "detail.did_you_mean.",
            "spoolctl capabilities --json, schema --json and brief --json describe every verb, "
            "flag, bound and data shape; config-show --json says which queue file is used.",
        ),
    ),
    (
        "Check local readiness",
        (
            "spoolctl doctor --json checks readiness without changing anything.",
            "doctor exits 3 with ok:true and data.ready false when not ready: read data.ready.",
            "Each failed check carries its remediation; SCHEMA_OUTDATED means run "
            "spoolctl migrate.",
        ),
    ),
    (
        "Submit and observe work",
        (
            "spoolctl add --json -- PROGRAM ARGS... runs the argv as is; add -c 'shell string' "
            "runs it through sh -c.",
            "Use --key K to make a submission idempotent among active jobs: a repeat returns the "
            "same job_id with deduplicated true.",
            "For many jobs write NDJSON (one object per line with argv or cmd) and run "
            "add --batch FILE: all lines are validated first, "
            "then inserted together or not at all.",
            "--timeout, --max-retries and --max-crashes bound each job; --after or --at delay it; "
            "--queue and --priority order it.",
            "spoolctl work --drain runs jobs of one lane (--queue) until nothing is due, "
            "then exits; work --once runs at most one job.",
            "A long-lived worker is spoolctl work; stop it with SIGINT or SIGTERM (the running job "
            "finishes and is recorded).",
            "Execution is at least once: a job can run again after a worker crash, so make "
            "commands safe to repeat.",
            "add --after-job ID (repeatable) makes a job wait until those jobs are done; in a "
            'batch, "after_jobs": ["@1"] names the job of an earlier line. If one ends dead '
            "or canceled, the waiting job is canceled with failure reason dependency_failed.",
        ),
    ),
    (
        "Get a verdict in one call",
        (
            "spoolctl feedback ID --json gives one verdict with output tails and data.remediation, "
            "the next command to run (null when the job succeeded).",
            "Read data.terminal first, then data.succeeded: null succeeded means still in flight.",
            "spoolctl wait IDS --timeout 10m --json blocks until the jobs finish: exit 0 all done, "
            "6 some did not, 4 TIMEOUT.",
            "spoolctl output ID --stream stderr --raw prints captured bytes; --attempt N picks an "
            "older attempt; --follow streams a running one.",
        ),
    ),
    (
        "Handle conflicts and safety",
        (
            "Reuse --key only with the same command: a different one is IDEMPOTENCY_CONFLICT.",
            "A dead job (budget exhausted) stays dead until spoolctl retry ID; a running job needs "
            "retry --force.",
            "spoolctl cancel ID stops a queued job; cancel ID --running --yes also stops a running "
            "one (warning KILL_ASYNC: its worker stops it at the next heartbeat).",
            "spoolctl prune --older-than 7d --dry-run shows what prune --yes would delete.",
            "spoolctl pause QUEUE --reason TEXT stops claims from a lane (running jobs finish, add "
            "still queues); spoolctl resume QUEUE undoes it. Both are idempotent: read "
            "data.changed.",
            "retry ID --with-dependents also restores the jobs canceled because ID failed.",
            "spoolctl signal ID --signal USR1, suspend ID and continue ID steer a running job "
            "through its worker and wait until it delivered (CONFLICT, exit 5, if the job is "
            "not running or its attempt ended first); update ID... --priority N changes queued "
            "or waiting jobs, all or none.",
            "A done job runs again only with spoolctl retry ID --again (plain retry of a done job "
            "is CONFLICT, exit 5); spoolctl remove ID... deletes queued or waiting jobs that never "
            "ran (a removed event in the ledger; bad ids change nothing).",
        ),
    ),
    (
        "Stream and page safely",
        (
            "spoolctl events --since-id CURSOR --wait --json long-polls the ledger; pass "
            "meta.pagination.cursor back as --since-id next time.",
            "spoolctl events --follow --json prints the events to come (after --since-id N if "
            "given) as NDJSON frames and ends with a control frame; bound it with --max-events "
            "or --idle-timeout.",
            "spoolctl list --json --limit 50 pages newest first; meta.pagination.truncated says "
            "whether more matched.",
            "status, list, show and workers are read-only and never block workers.",
        ),
    ),
)


def guide_sections() -> list[dict[str, Any]]:
    return [{"title": title, "bullets": list(bullets)} for title, bullets in SECTIONS]
